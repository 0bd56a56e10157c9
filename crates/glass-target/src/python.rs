//! CPython's frame chain, read from a thread the ptrace backend holds stopped (3.11,
//! 3.12 and 3.13): the sample path's part of Python frames. Only pointers are read here (the
//! code object and the instruction of each frame); names and lines are read by the
//! recorder after the thread runs again (`glass-record`'s `python`).
//!
//! Why offsets from a table of our own: CPython 3.11 and 3.12 publish no layout of
//! their runtime structures (3.13's `_Py_DebugOffsets` is the first), and a stripped
//! interpreter (Debian's `/usr/bin/python3.11`) has no debug info to read them from.
//! The numbers are those of CPython's headers for each version (`Include/internal/
//! pycore_runtime.h`, `pycore_interp.h`, `cpython/pystate.h`, `pycore_frame.h`) in a
//! release (non-`Py_DEBUG`) x86-64 build; `tests/python.rs` checks them against the
//! DWARF of pyenv's debug-info builds where present. py-spy does the same for the same
//! reason. 3.13 publishes its offsets (`_Py_DebugOffsets` at the start of `_PyRuntime`),
//! and they are read from there ([`PyLayout::from_debug_offsets`]); 3.13 keeps no
//! `_PyCFrame` (the thread state points at its current frame).
//!
//! The chain: `_PyRuntime.interpreters.head` → each interpreter's `threads.head` → the
//! `PyThreadState` whose `native_thread_id` is the sampled thread's id (cached per
//! thread, checked at each read) → `cframe->current_frame` → each
//! `_PyInterpreterFrame` by `previous`. One `_PyEval_EvalFrameDefault` call runs the
//! frames from the one it entered to the innermost: 3.11 marks that entered frame with
//! `is_entry`; 3.12 puts a shim frame owned by the C stack (`FRAME_OWNED_BY_CSTACK`)
//! below it, which is dropped here.

use std::collections::HashMap;

use glass_unwind::RemoteMemory;

/// Where the fields the chain needs sit, for one CPython version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PyLayout {
    pub version: (u8, u8),
    pub runtime_interpreters_head: u64,
    pub interp_next: u64,
    pub interp_threads_head: u64,
    pub tstate_next: u64,
    pub tstate_native_thread_id: u64,
    /// Where the thread state points to its `_PyCFrame` (3.11, 3.12), or to its
    /// current frame itself (3.13: `cframe_current_frame` None).
    pub tstate_cframe: u64,
    pub cframe_current_frame: Option<u64>,
    pub frame_code: u64,
    pub frame_previous: u64,
    pub frame_prev_instr: u64,
    pub frame_owner: u64,
    /// 3.11 only.
    pub frame_is_entry: Option<u64>,
    /// 3.12: the owner value of the C stack's shim frame.
    pub cstack_owner: Option<u8>,
    /// `PyCodeObject`: what the recorder reads to name a frame.
    pub code_name: u64,
    pub code_qualname: u64,
    pub code_filename: u64,
    pub code_firstlineno: u64,
    pub code_linetable: u64,
    pub code_code_adaptive: u64,
    /// `sizeof(PyASCIIObject)` and `sizeof(PyCompactUnicodeObject)`: where a compact
    /// string's characters start.
    pub ascii_size: u64,
    pub compact_size: u64,
}

/// CPython 3.11 (3.11.0 to 3.11.x share the layout).
pub const PY311: PyLayout = PyLayout {
    version: (3, 11),
    runtime_interpreters_head: 0x28,
    interp_next: 0x0,
    interp_threads_head: 0x10,
    tstate_next: 0x8,
    tstate_native_thread_id: 0xa0,
    tstate_cframe: 0x38,
    cframe_current_frame: Some(0x8),
    frame_code: 0x20,
    frame_previous: 0x30,
    frame_prev_instr: 0x38,
    frame_owner: 0x45,
    frame_is_entry: Some(0x44),
    cstack_owner: None,
    code_name: 0x78,
    code_qualname: 0x80,
    code_filename: 0x70,
    code_firstlineno: 0x48,
    code_linetable: 0x88,
    code_code_adaptive: 0xb8,
    ascii_size: 48,
    compact_size: 72,
};

/// CPython 3.12.
pub const PY312: PyLayout = PyLayout {
    version: (3, 12),
    runtime_interpreters_head: 0x28,
    interp_next: 0x0,
    interp_threads_head: 0x48,
    tstate_next: 0x8,
    tstate_native_thread_id: 0x90,
    tstate_cframe: 0x38,
    cframe_current_frame: Some(0x0),
    frame_code: 0x0,
    frame_previous: 0x8,
    frame_prev_instr: 0x38,
    frame_owner: 0x46,
    frame_is_entry: None,
    cstack_owner: Some(3),
    code_name: 0x78,
    code_qualname: 0x80,
    code_filename: 0x70,
    code_firstlineno: 0x44,
    code_linetable: 0x88,
    code_code_adaptive: 0xc0,
    ascii_size: 40,
    compact_size: 56,
};

impl PyLayout {
    /// The layout of a CPython version, if glass knows it.
    pub fn of(major: u8, minor: u8) -> Option<&'static PyLayout> {
        match (major, minor) {
            (3, 11) => Some(&PY311),
            (3, 12) => Some(&PY312),
            _ => None,
        }
    }

    /// The layout 3.13's `_Py_DebugOffsets` gives (the first bytes of `_PyRuntime`:
    /// `bytes`, at least [`DEBUG_OFFSETS_LEN`]), if they are 3.13's: the interpreter
    /// says where its fields are, and glass reads no table of its own. The struct's own
    /// layout is 3.13's (`Include/internal/pycore_runtime.h`); a later version changes
    /// it, so only 3.13 is read. Strings keep 3.12's layout (3.13 does not publish it).
    pub fn from_debug_offsets(bytes: &[u8]) -> Option<PyLayout> {
        if bytes.len() < DEBUG_OFFSETS_LEN || &bytes[..8] != b"xdebugpy" {
            return None;
        }
        let at = |offset: u64| word(bytes, offset);
        let version = at(8);
        // Free-threaded builds lay out objects differently.
        if (version >> 16) != 0x030d || at(16) != 0 {
            return None;
        }
        Some(PyLayout {
            version: (3, 13),
            runtime_interpreters_head: at(40),
            interp_next: at(64),
            interp_threads_head: at(72),
            tstate_next: at(168),
            tstate_native_thread_id: at(200),
            tstate_cframe: at(184),
            cframe_current_frame: None,
            frame_code: at(240),
            frame_previous: at(232),
            frame_prev_instr: at(248),
            frame_owner: at(264),
            frame_is_entry: None,
            cstack_owner: Some(3),
            code_name: at(288),
            code_qualname: at(296),
            code_filename: at(280),
            code_firstlineno: at(312),
            code_linetable: at(304),
            code_code_adaptive: at(344),
            ascii_size: PY312.ascii_size,
            compact_size: PY312.compact_size,
        })
        .filter(|l| {
            // Sane offsets only: each is read into a buffer of that size.
            [
                l.tstate_native_thread_id,
                l.tstate_cframe,
                l.frame_owner,
                l.code_code_adaptive,
            ]
            .iter()
            .all(|&o| o < 4096)
        })
    }

    /// The bytes of a frame read at once (every field the walk needs).
    fn frame_len(&self) -> usize {
        (self.frame_owner.max(self.frame_is_entry.unwrap_or(0)) + 1) as usize
    }

    fn tstate_len(&self) -> usize {
        (self.tstate_native_thread_id.max(self.tstate_cframe) + 8) as usize
    }
}

/// One Python frame as read while the thread was stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PyRawFrame {
    /// The `PyCodeObject`.
    pub code: u64,
    /// The last instruction the frame began (`prev_instr`), in the code's own bytes.
    pub instr: u64,
    /// The frame a `_PyEval_EvalFrameDefault` call entered (see the module's page).
    pub entry: bool,
}

/// What reading a thread's chain gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PyRead {
    /// Not a Python process, or no thread state for this thread (a thread Python does
    /// not know, or one not yet or no longer running Python).
    #[default]
    None,
    /// The frames were read (possibly none: the thread ran no Python code).
    Read,
    /// The chain could not be read (memory unreadable, a cycle, too deep).
    Failed,
}

/// A Python process's interpreter, for the sample path.
#[derive(Debug, Clone)]
pub struct PyProcess {
    /// The address of `_PyRuntime` in the process.
    pub runtime: u64,
    pub layout: PyLayout,
    /// Thread id -> its `PyThreadState`, as last found.
    tstates: HashMap<i32, u64>,
    scratch: Vec<u8>,
}

/// The bytes of `_Py_DebugOffsets` glass reads (to the end of the code object's).
pub const DEBUG_OFFSETS_LEN: usize = 352;

/// Frames read at most per sample: deeper chains are cut (and counted as failed).
pub const MAX_PY_DEPTH: usize = 1024;
const MAX_INTERPRETERS: usize = 64;
const PAGE: u64 = 4096;
const MAX_THREAD_STATES: usize = 4096;

fn word(bytes: &[u8], at: u64) -> u64 {
    let at = at as usize;
    u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
}

impl PyProcess {
    pub fn new(runtime: u64, layout: PyLayout) -> PyProcess {
        PyProcess {
            runtime,
            layout,
            tstates: HashMap::new(),
            scratch: Vec::with_capacity(256),
        }
    }

    fn read_word(memory: &mut dyn RemoteMemory, address: u64) -> Option<u64> {
        let mut buf = [0u8; 8];
        (address != 0 && memory.read(address, &mut buf) == 8).then(|| u64::from_le_bytes(buf))
    }

    /// The thread state's `cframe` if `tstate` is `tid`'s.
    fn cframe_of(&mut self, memory: &mut dyn RemoteMemory, tstate: u64, tid: i32) -> Option<u64> {
        let len = self.layout.tstate_len();
        self.scratch.resize(len, 0);
        if memory.read(tstate, &mut self.scratch) != len {
            return None;
        }
        let native = word(&self.scratch, self.layout.tstate_native_thread_id);
        (native == tid as u64).then(|| word(&self.scratch, self.layout.tstate_cframe))
    }

    /// Walks every interpreter's thread states, caching each thread's.
    fn find_tstates(&mut self, memory: &mut dyn RemoteMemory) -> Option<()> {
        let l = self.layout;
        self.tstates.clear();
        let mut interp = Self::read_word(memory, self.runtime + l.runtime_interpreters_head)?;
        let mut seen = 0;
        for _ in 0..MAX_INTERPRETERS {
            if interp == 0 {
                break;
            }
            let mut tstate = Self::read_word(memory, interp + l.interp_threads_head)?;
            while tstate != 0 && seen < MAX_THREAD_STATES {
                seen += 1;
                let native = Self::read_word(memory, tstate + l.tstate_native_thread_id)?;
                self.tstates.insert(native as i32, tstate);
                tstate = Self::read_word(memory, tstate + l.tstate_next)?;
            }
            interp = Self::read_word(memory, interp + l.interp_next)?;
        }
        Some(())
    }

    /// Reads thread `tid`'s frames, innermost first, onto `out`.
    pub fn read_chain(
        &mut self,
        memory: &mut dyn RemoteMemory,
        tid: i32,
        out: &mut Vec<PyRawFrame>,
    ) -> PyRead {
        let cached = self.tstates.get(&tid).copied();
        let cframe = match cached.and_then(|t| self.cframe_of(memory, t, tid)) {
            Some(cframe) => cframe,
            None => {
                if self.find_tstates(memory).is_none() {
                    return PyRead::Failed;
                }
                match self.tstates.get(&tid).copied() {
                    Some(tstate) => match self.cframe_of(memory, tstate, tid) {
                        Some(cframe) => cframe,
                        None => return PyRead::Failed,
                    },
                    None => return PyRead::None,
                }
            }
        };
        if cframe == 0 {
            return PyRead::Read;
        }
        let l = self.layout;
        let mut frame = match l.cframe_current_frame {
            Some(at) => match Self::read_word(memory, cframe + at) {
                Some(frame) => frame,
                None => return PyRead::Failed,
            },
            None => cframe,
        };
        let first = out.len();
        let len = l.frame_len() as u64;
        // A thread's frames sit one after another in its data stack, callers below:
        // one read from the page a frame starts in up to its end holds the callers
        // that share that page, so a chain costs a read or two, not one per frame.
        let mut window = 0..0u64;
        while frame != 0 {
            if out.len() - first >= MAX_PY_DEPTH {
                out.truncate(first);
                return PyRead::Failed;
            }
            if !(window.start <= frame && frame + len <= window.end) {
                let start = (frame & !(PAGE - 1)).min(frame);
                let end = frame.saturating_add(len);
                self.scratch.resize((end - start) as usize, 0);
                if memory.read(start, &mut self.scratch) != self.scratch.len() {
                    out.truncate(first);
                    return PyRead::Failed;
                }
                window = start..end;
            }
            let at = frame - window.start;
            let field = |offset: u64| word(&self.scratch, at + offset);
            let owner = self.scratch[(at + l.frame_owner) as usize];
            let previous = field(l.frame_previous);
            if l.cstack_owner == Some(owner) {
                // The shim below the frame a `_PyEval_EvalFrameDefault` call entered.
                if let Some(last) = out[first..].last_mut() {
                    last.entry = true;
                }
            } else {
                out.push(PyRawFrame {
                    code: field(l.frame_code),
                    instr: field(l.frame_prev_instr),
                    entry: l
                        .frame_is_entry
                        .is_some_and(|e| self.scratch[(at + e) as usize] != 0),
                });
            }
            frame = previous;
        }
        PyRead::Read
    }
}
