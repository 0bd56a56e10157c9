//! Python frames, the part that can wait (the ptrace backend): finding a process's
//! CPython interpreter, and naming the frames the sample path read
//! (`glass_target::python`) after the thread runs again — each code object's qualified
//! name, file and first line read once (cached by its address, written once as a
//! `PyCode` record), each frame's line from the code's location table
//! (`co_linetable`, PEP 626's format, the same in 3.11 to 3.13), then a `PyStack`
//! record after its sample.
//!
//! The interpreter is the `_PyRuntime` symbol of the python executable (Debian's
//! static build) or of libpython (pyenv's shared builds); its version is `Py_Version`
//! (3.11 and later), else the file's name. A launched program maps libpython only
//! after its exec, so a process is looked at again at its first ticks, then now and
//! then.

use std::collections::HashMap;
use std::path::Path;

use glass_format::{PyCode, PyFrame, PyStack};
use glass_target::procfs;
use glass_target::ptrace::{ProcessTarget, SampleHeader};
use glass_target::python::{PyLayout, PyProcess, PyRawFrame, PyRead, DEBUG_OFFSETS_LEN};
use object::{Object, ObjectSegment, ObjectSymbol};

use crate::recorder::Recorder;

/// Ticks a process is looked at every tick (its loader maps libpython meanwhile), then
/// every [`LATER_EVERY`] ticks.
const EARLY_TRIES: u32 = 50;
const LATER_EVERY: u64 = 64;
/// Longest string (names, file names) and location table read from a code object.
const MAX_STRING: u64 = 4096;
const MAX_LINETABLE: u64 = 1 << 20;

/// An ELF file's interpreter symbols (per path, parsed once).
#[derive(Clone)]
struct Symbols {
    runtime: Option<u64>,
    py_version: Option<u64>,
    segments: Vec<(u64, u64, u64)>,
}

struct Code {
    id: u32,
    first_line: i64,
    linetable: Vec<u8>,
    /// Where its instructions start (`co_code_adaptive`).
    instructions: u64,
    /// What tells it from another code object made at its address later.
    signature: [u64; 5],
    /// The tick it was last found the same.
    checked: u64,
}

/// A code object's name, qualified name, file, location table and first line.
fn signature(head: &[u8], layout: &PyLayout) -> [u64; 5] {
    let word = |at: u64| u64::from_le_bytes(head[at as usize..at as usize + 8].try_into().unwrap());
    let at = layout.code_firstlineno as usize;
    [
        word(layout.code_name),
        word(layout.code_qualname),
        word(layout.code_filename),
        word(layout.code_linetable),
        u64::from(u32::from_le_bytes(head[at..at + 4].try_into().unwrap())),
    ]
}

enum State {
    Looking {
        tries: u32,
    },
    Found {
        layout: Box<PyLayout>,
        codes: HashMap<u64, Code>,
    },
    /// Python, but its frames cannot be read (the reason is in `Python::refused`).
    Refused,
}

/// What the summary says about Python frames.
#[derive(Default)]
pub struct Python {
    states: HashMap<i32, State>,
    files: HashMap<String, Symbols>,
    next_id: u32,
    /// "3.11 (/usr/bin/python3.11)" of each interpreter found.
    pub found: Vec<String>,
    /// Why a Python process's frames were not read.
    pub refused: Vec<String>,
    /// Samples of threads Python knew, with frames read, and those whose chain failed.
    pub samples: u64,
    pub with_frames: u64,
    pub failed: u64,
    /// Time the thread was held stopped to read its chain, over the samples read.
    pub read_ns: u64,
    stack: Vec<PyFrame>,
}

impl Python {
    /// Looks for interpreters in processes not yet known to have one (after the tick,
    /// the target running).
    pub fn look(&mut self, target: &mut ProcessTarget, ticks: u64) {
        for pid in target.pids() {
            let state = self
                .states
                .entry(pid)
                .or_insert(State::Looking { tries: 0 });
            let State::Looking { tries } = state else {
                continue;
            };
            *tries += 1;
            if *tries > EARLY_TRIES && !ticks.is_multiple_of(LATER_EVERY) {
                continue;
            }
            match find(pid, &mut self.files) {
                Ok(None) => {}
                Ok(Some((runtime, layout, what))) => {
                    self.found.push(what);
                    target.set_python(pid, Some(PyProcess::new(runtime, layout)));
                    *state = State::Found {
                        layout: Box::new(layout),
                        codes: HashMap::new(),
                    };
                }
                Err(why) => {
                    if !self.refused.contains(&why) {
                        self.refused.push(why);
                    }
                    *state = State::Refused;
                }
            }
        }
    }

    /// The process was replaced (exec) or ended: what was known of it no longer holds.
    pub fn forget(&mut self, target: &mut ProcessTarget, pid: i32) {
        self.states.remove(&pid);
        target.set_python(pid, None);
    }

    /// Names a sample's Python frames and writes them (after its sample).
    pub fn write(
        &mut self,
        sink: &mut Recorder,
        sample: &SampleHeader,
        frames: &[PyRawFrame],
    ) -> std::io::Result<()> {
        self.read_ns += u64::from(sample.py_ns);
        match sample.py_read {
            PyRead::None => return Ok(()),
            PyRead::Failed => {
                self.samples += 1;
                self.failed += 1;
                return Ok(());
            }
            PyRead::Read => self.samples += 1,
        }
        if frames.is_empty() {
            return Ok(());
        }
        let Some(State::Found { layout, codes }) = self.states.get_mut(&sample.pid) else {
            return Ok(());
        };
        let layout = &**layout;
        let mut stack = std::mem::take(&mut self.stack);
        stack.clear();
        let memory = Memory(sample.pid);
        let tick = sink.ticks();
        for frame in frames {
            // A code object freed and another made at its address (imports' code is
            // freed once run): the cache holds a code only while its header is the
            // same, checked once a tick.
            if let Some(code) = codes.get_mut(&frame.code) {
                if code.checked != tick {
                    let same = memory
                        .read(frame.code, layout.code_code_adaptive)
                        .is_some_and(|head| signature(&head, layout) == code.signature);
                    if same {
                        code.checked = tick;
                    } else {
                        codes.remove(&frame.code);
                    }
                }
            }
            let code = match codes.get(&frame.code) {
                Some(code) => code,
                None => {
                    let id = self.next_id;
                    let Some((code, record)) = read_code(&memory, layout, frame.code, id) else {
                        // Freed meanwhile, or not a code object: this sample's frames
                        // are not trusted.
                        self.failed += 1;
                        self.stack = stack;
                        return Ok(());
                    };
                    self.next_id += 1;
                    let code = Code {
                        checked: tick,
                        ..code
                    };
                    sink.py_code(&PyCode {
                        pid: sample.pid as u32,
                        ..record
                    })?;
                    codes.entry(frame.code).or_insert(code)
                }
            };
            let unit = frame.instr.saturating_sub(code.instructions) / 2;
            let line = if frame.instr < code.instructions {
                code.first_line
            } else {
                line_at(&code.linetable, code.first_line, unit).unwrap_or(0)
            };
            stack.push(PyFrame {
                code: code.id,
                line: line.clamp(0, u32::MAX as i64) as u32,
                entry: frame.entry,
            });
        }
        self.with_frames += 1;
        let result = sink.py_stack(&PyStack {
            time_ns: sample.time_ns,
            pid: sample.pid as u32,
            tid: sample.tid as u32,
            frames: std::mem::take(&mut stack),
        });
        self.stack = stack;
        result
    }

    /// The summary's line, if the recording met Python.
    pub fn note(&self) -> Option<String> {
        let mut parts = Vec::new();
        if !self.found.is_empty() {
            parts.push(format!(
                "Python {}: frames read in {} of {} samples of its threads ({} failed), adding {:.1} us a sample to the stopped time",
                self.found.join(", "),
                self.with_frames,
                self.samples,
                self.failed,
                self.read_ns as f64 / self.samples.max(1) as f64 / 1e3
            ));
        }
        parts.extend(self.refused.iter().cloned());
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

/// Whether the target is a Python program (python itself launched, a script whose `#!`
/// names python, or a process that maps python or libpython), so that the automatic
/// backend is ptrace: the perf backend never stops the target, and the frame chain
/// cannot be read consistently while the interpreter runs on.
pub fn is_python_target(args: &crate::RecordOptions) -> bool {
    let is_python = |name: &str| {
        let name = name.rsplit('/').next().unwrap_or("");
        name.starts_with("python") || name.starts_with("libpython")
    };
    if let Some(pid) = args.pid {
        return procfs::executable_mappings(pid)
            .is_ok_and(|maps| maps.iter().any(|m| is_python(&m.path)));
    }
    let Some(program) = args.command.first() else {
        return false;
    };
    let path = if program.contains('/') {
        Some(std::path::PathBuf::from(program))
    } else {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join(program))
                .find(|p| p.is_file())
        })
    };
    let Some(path) = path else {
        return false;
    };
    if is_python(&path.to_string_lossy()) {
        return true;
    }
    // A script: its `#!` line.
    let mut head = [0u8; 128];
    let n = std::fs::File::open(&path)
        .and_then(|mut f| std::io::Read::read(&mut f, &mut head))
        .unwrap_or(0);
    let first = head[..n].split(|&b| b == b'\n').next().unwrap_or(&[]);
    first.starts_with(b"#!") && String::from_utf8_lossy(first).contains("python")
}

/// The process's interpreter: `_PyRuntime`'s address, the layout of its version, and
/// what to call it. `Ok(None)`: no interpreter (yet); `Err`: Python that cannot be read.
fn find(
    pid: i32,
    files: &mut HashMap<String, Symbols>,
) -> Result<Option<(u64, PyLayout, String)>, String> {
    let Ok(mappings) = procfs::executable_mappings(pid) else {
        return Ok(None);
    };
    let mut stripped = None;
    for mapping in &mappings {
        let name = mapping.path.rsplit('/').next().unwrap_or("");
        if !(name.starts_with("python") || name.starts_with("libpython")) || mapping.deleted {
            continue;
        }
        let symbols = match files.get(&mapping.path) {
            Some(symbols) => symbols.clone(),
            None => {
                let symbols = read_symbols(Path::new(&mapping.path));
                files.insert(mapping.path.clone(), symbols.clone());
                symbols
            }
        };
        let Some(runtime) = symbols.runtime else {
            stripped.get_or_insert_with(|| mapping.path.clone());
            continue;
        };
        let Some(bias) = procfs::load_bias(mapping, &symbols.segments) else {
            continue;
        };
        let version = symbols
            .py_version
            .and_then(|at| Memory(pid).word(bias.wrapping_add(at)))
            .map(|hex| (((hex >> 24) & 0xff) as u8, ((hex >> 16) & 0xff) as u8))
            .or_else(|| version_from_name(name));
        let Some((major, minor)) = version else {
            return Err(format!(
                "{}: no Python version found (no Py_Version, a name without one): Python frames not read",
                mapping.path
            ));
        };
        let runtime = bias.wrapping_add(runtime);
        // 3.13 and later say where their fields are (`_Py_DebugOffsets`, the first
        // bytes of `_PyRuntime`); 3.11 and 3.12 have the table.
        let layout = PyLayout::of(major, minor).copied().or_else(|| {
            Memory(pid)
                .read(runtime, DEBUG_OFFSETS_LEN as u64)
                .and_then(|bytes| PyLayout::from_debug_offsets(&bytes))
        });
        return match layout {
            Some(layout) => Ok(Some((
                runtime,
                layout,
                format!("{major}.{minor} ({})", mapping.path),
            ))),
            None => Err(format!(
                "Python {major}.{minor} ({}): glass reads the frames of 3.11, 3.12 and 3.13 only",
                mapping.path
            )),
        };
    }
    // The executable is python without the symbol: libpython may be mapped later, so
    // this is only the answer once the process has been looked at for a while.
    match stripped {
        Some(path) if mappings.iter().any(|m| m.path.contains("libpython")) => Err(format!(
            "{path}: no _PyRuntime symbol (a stripped or unknown Python build): Python frames not read"
        )),
        Some(path) if !path.contains("libpython") && !links_libpython(&path) => Err(format!(
            "{path}: no _PyRuntime symbol (a stripped or unknown Python build): Python frames not read"
        )),
        _ => Ok(None),
    }
}

/// Whether an executable links libpython (so `_PyRuntime` is there once it is mapped).
fn links_libpython(path: &str) -> bool {
    let Ok(data) = std::fs::read(path) else {
        return false;
    };
    let Ok(file) = object::File::parse(&*data) else {
        return false;
    };
    file.dynamic_symbols()
        .any(|s| s.is_undefined() && matches!(s.name(), Ok("_PyRuntime" | "Py_BytesMain")))
}

fn version_from_name(name: &str) -> Option<(u8, u8)> {
    let rest = name
        .strip_prefix("lib")
        .unwrap_or(name)
        .strip_prefix("python")?;
    let (major, rest) = rest.split_once('.')?;
    let minor: String = rest.chars().take_while(char::is_ascii_digit).collect();
    Some((major.parse().ok()?, minor.parse().ok()?))
}

fn read_symbols(path: &Path) -> Symbols {
    let mut symbols = Symbols {
        runtime: None,
        py_version: None,
        segments: Vec::new(),
    };
    let Ok(data) = std::fs::read(path) else {
        return symbols;
    };
    let Ok(file) = object::File::parse(&*data) else {
        return symbols;
    };
    symbols.segments = file
        .segments()
        .map(|s| (s.file_range().0, s.address(), s.file_range().1))
        .collect();
    for symbol in file.dynamic_symbols().chain(file.symbols()) {
        if !symbol.is_definition() {
            continue;
        }
        match symbol.name() {
            Ok("_PyRuntime") => symbols.runtime = Some(symbol.address()),
            Ok("Py_Version") => symbols.py_version = Some(symbol.address()),
            _ => {}
        }
    }
    symbols
}

/// A process's memory, read after it resumed.
struct Memory(i32);

impl Memory {
    fn read(&self, address: u64, len: u64) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; len as usize];
        (address != 0 && glass_mem::process::read_process(self.0, address, &mut buf).is_ok())
            .then_some(buf)
    }

    fn word(&self, address: u64) -> Option<u64> {
        let bytes = self.read(address, 8)?;
        Some(u64::from_le_bytes(bytes.try_into().ok()?))
    }

    /// A `str` object's text (compact strings: every `str` a code object names).
    fn unicode(&self, object: u64, layout: &PyLayout) -> Option<String> {
        let head = self.read(object, layout.ascii_size)?;
        let length = u64::from_le_bytes(head[0x10..0x18].try_into().ok()?);
        let state = u32::from_le_bytes(head[0x20..0x24].try_into().ok()?);
        let (kind, compact, ascii) = (
            (state >> 2) & 7,
            state & (1 << 5) != 0,
            state & (1 << 6) != 0,
        );
        if !compact || length > MAX_STRING {
            return None;
        }
        if ascii {
            let bytes = self.read(object + layout.ascii_size, length)?;
            return Some(String::from_utf8_lossy(&bytes).into_owned());
        }
        let bytes = self.read(object + layout.compact_size, length * u64::from(kind))?;
        let chars: Option<String> = match kind {
            1 => Some(bytes.iter().map(|&b| char::from(b)).collect()),
            2 => Some(
                bytes
                    .chunks_exact(2)
                    .map(|c| char::from_u32(u16::from_le_bytes([c[0], c[1]]).into()).unwrap_or('?'))
                    .collect(),
            ),
            4 => Some(
                bytes
                    .chunks_exact(4)
                    .map(|c| {
                        char::from_u32(u32::from_le_bytes([c[0], c[1], c[2], c[3]])).unwrap_or('?')
                    })
                    .collect(),
            ),
            _ => None,
        };
        chars
    }

    /// A `bytes` object's contents.
    fn bytes(&self, object: u64, limit: u64) -> Option<Vec<u8>> {
        let size = self.word(object + 0x10)?;
        if size > limit {
            return None;
        }
        self.read(object + 0x20, size)
    }
}

/// A code object's names and location table.
fn read_code(memory: &Memory, layout: &PyLayout, address: u64, id: u32) -> Option<(Code, PyCode)> {
    let head = memory.read(address, layout.code_code_adaptive)?;
    let word = |at: u64| u64::from_le_bytes(head[at as usize..at as usize + 8].try_into().unwrap());
    let at = layout.code_firstlineno as usize;
    let first_line = i32::from_le_bytes(head[at..at + 4].try_into().ok()?) as i64;
    let name = memory
        .unicode(word(layout.code_qualname), layout)
        .or_else(|| memory.unicode(word(layout.code_name), layout))?;
    let file = memory.unicode(word(layout.code_filename), layout)?;
    let linetable = memory
        .bytes(word(layout.code_linetable), MAX_LINETABLE)
        .unwrap_or_default();
    Some((
        Code {
            id,
            first_line,
            linetable,
            instructions: address + layout.code_code_adaptive,
            signature: signature(&head, layout),
            checked: 0,
        },
        PyCode {
            pid: 0,
            id,
            name,
            file,
            first_line: first_line.clamp(0, u32::MAX as i64) as u32,
        },
    ))
}

/// The line of code unit `unit`, from a 3.11-3.13 location table: entries of a first
/// byte (1, then a 4-bit kind, then length - 1 in code units) and the kind's varints
/// (CPython's `Objects/locations.md`).
pub fn line_at(table: &[u8], first_line: i64, unit: u64) -> Option<i64> {
    let mut at = 0;
    let mut line = first_line;
    let mut start = 0u64;
    loop {
        let head = *table.get(at)?;
        at += 1;
        let kind = (head >> 3) & 15;
        let length = u64::from(head & 7) + 1;
        let delta = match kind {
            15 => None,
            14 | 13 => {
                let raw = varint(table, &mut at)?;
                let delta = if raw & 1 != 0 {
                    -((raw >> 1) as i64)
                } else {
                    (raw >> 1) as i64
                };
                if kind == 14 {
                    for _ in 0..3 {
                        varint(table, &mut at)?;
                    }
                }
                Some(delta)
            }
            // One-line forms: the column and end column, a byte each.
            10..=12 => {
                at += 2;
                Some(i64::from(kind) - 10)
            }
            // Short forms: one byte of columns.
            _ => {
                at += 1;
                Some(0)
            }
        };
        if let Some(delta) = delta {
            line += delta;
        }
        start += length;
        if unit < start {
            return delta.map(|_| line);
        }
    }
}

/// The location table's varint: 6 bits a byte, low first, bit 6 set when more follow.
fn varint(table: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    let mut shift = 0;
    loop {
        let byte = *table.get(*at)?;
        *at += 1;
        value |= u64::from(byte & 63) << shift;
        if byte & 64 == 0 || shift >= 60 {
            return Some(value);
        }
        shift += 6;
    }
}
