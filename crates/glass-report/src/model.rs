//! The interned, timed profile every format is a view of (after the design of
//! `fxprof-processed-profile`): a string table; a module table; a frame table (module,
//! address, function, inline depth, category); a stack table (a prefix tree: frame and
//! parent); and per thread its samples in time order, each with a time, a weight and a
//! stack. A `glass trace` recording becomes the same tables, with one sample per call
//! (weight 1 call, cost its self time) plus the open and close events of every call.
//!
//! Built once from a [`Recording`]: samples, guest samples and raw snapshots (unwound as
//! for every report), symbolized by [`Symbolizer`].

use std::collections::HashMap;

// Interning hashes a few small keys per frame of every sample: FxHash, not SipHash (the
// keys are the recording's own, not an attacker's).
use rustc_hash::FxHashMap;

use glass_format::{
    is_kernel_address, Recording, SAMPLE_FIRMWARE, SAMPLE_HALTED, SAMPLE_OFF_CPU, SAMPLE_STACK_CUT,
    SAMPLE_TRUNCATED,
};
use glass_symbols::{ModuleRef, Symbolizer};

use crate::calltrace::CallTrace;
use crate::modules::ModuleTimeline;
use crate::UNKNOWN_FRAME;

/// The interpreter's function whose frames a sample's Python frames replace.
const PYTHON_EVAL: &str = "_PyEval_EvalFrameDefault";

/// Every how many samples the report looks for the modules to prepare (see
/// `Symbolizer::prepare`): a module missed is prepared when first met, in turn.
const PREPARE_STRIDE: usize = 8;
use crate::{
    DEEPER_FRAME, FIRMWARE_FRAME, HALTED_FRAME, KERNEL_MODULE, MAX_DEPTH, OFF_CPU_FRAME,
    TRUNCATED_FRAME,
};

pub type StringIndex = u32;
pub type ModuleIndex = u32;
pub type FrameIndex = u32;
pub type StackIndex = u32;

/// Every distinct string once.
#[derive(Debug, Default, Clone)]
pub struct StringTable {
    strings: Vec<String>,
    index: FxHashMap<String, StringIndex>,
}

impl StringTable {
    pub fn intern(&mut self, text: &str) -> StringIndex {
        if let Some(&index) = self.index.get(text) {
            return index;
        }
        let index = self.strings.len() as StringIndex;
        self.strings.push(text.to_string());
        self.index.insert(text.to_string(), index);
        index
    }

    pub fn get(&self, index: StringIndex) -> &str {
        &self.strings[index as usize]
    }

    pub fn len(&self) -> usize {
        self.strings.len()
    }

    pub fn is_empty(&self) -> bool {
        self.strings.is_empty()
    }
}

/// What a frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// Code in a known module (symbolized, or `module+0xoffset`).
    Code,
    /// An address in no known module (`[unknown]`).
    Unknown,
    /// The root of a stack whose walk ended early (`[truncated]`).
    Truncated,
    /// The leaf of a vCPU sampled halted (`[halted]`).
    Halted,
    /// The only frame of a vCPU sampled in its firmware (`[firmware]`).
    Firmware,
    /// The root of a stack where a thread blocked (`[off-cpu]`).
    OffCpu,
    /// Every frame deeper than [`MAX_DEPTH`] (`[deeper than 1024 frames]`).
    Deeper,
}

/// Where a frame's code runs, for the Firefox Profiler's categories.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Category {
    User,
    Kernel,
    /// A VM guest's code.
    Guest,
    /// A guest vCPU halted in its idle loop.
    GuestHalted,
    /// A guest vCPU before it ran the image.
    GuestFirmware,
    /// Code generated at run time (anonymous executable memory, perf maps, jitdump).
    Jit,
    /// Frames glass adds (`[truncated]`, `[unknown]`).
    Other,
    /// Time blocked (`[off-cpu]` and the stacks under it).
    OffCpu,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleRow {
    /// The path as mapped (or a pseudo-name such as `[vdso]`).
    pub path: StringIndex,
    /// The file name, as the tables show it.
    pub name: StringIndex,
    pub build_id: Vec<u8>,
    pub start: u64,
    pub end: u64,
    pub file_offset: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FrameRow {
    pub kind: FrameKind,
    pub module: Option<ModuleIndex>,
    /// The address looked up: the instruction for the innermost frame, the call
    /// instruction (return address - 1) for the others; 0 for glass's own frames.
    pub address: u64,
    pub function: StringIndex,
    /// 0 for the function the address is in, n for the n-th function inlined into it.
    pub inline_depth: u32,
    pub category: Category,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StackRow {
    pub frame: FrameIndex,
    /// The caller's stack; None at the root.
    pub parent: Option<StackIndex>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SampleRow {
    /// Nanoseconds since the recording started (cycles for a trace without a cycle
    /// rate: see [`Model::unit`]).
    pub time: u64,
    /// None for a sample without frames.
    pub stack: Option<StackIndex>,
    /// Samples (or, for a trace, calls) this row stands for.
    pub weight: u64,
    /// Time this row stands for: samples × the sampling period, or a call's self time.
    pub cost: u64,
}

/// A call's start or end on its thread's timeline (traces only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    pub time: u64,
    pub open: bool,
    pub frame: FrameIndex,
}

#[derive(Debug, Clone)]
pub struct ThreadRow {
    pub pid: u32,
    pub tid: u32,
    /// The program the thread ran (a thread that execs gets one row per program).
    pub process: StringIndex,
    pub name: StringIndex,
    /// In time order.
    pub samples: Vec<SampleRow>,
    /// Open and close events, properly nested (traces only).
    pub events: Vec<Event>,
}

/// What the samples are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Stacks sampled at a rate (`glass record`).
    Samples,
    /// Every call of the traced functions (`glass trace`).
    Calls,
}

/// The unit of times and costs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Nanoseconds,
    /// A trace whose cycle rate is unknown.
    Cycles,
}

#[derive(Debug, Clone, Default)]
pub struct ModelOptions {
    /// Keep only this thread.
    pub tid: Option<u32>,
    /// Leave out samples of halted (idle) VM guest vCPUs.
    pub no_idle: bool,
}

#[derive(Debug)]
pub struct Model {
    pub source: Source,
    pub unit: Unit,
    pub strings: StringTable,
    pub modules: Vec<ModuleRow>,
    pub frames: Vec<FrameRow>,
    pub stacks: Vec<StackRow>,
    pub threads: Vec<ThreadRow>,
    /// The time one sample stands for (1e9 / frequency); 0 for traces.
    pub period: u64,
    /// When the recording started (ns since the Unix epoch; 0 when unknown).
    pub start_unix_ns: u64,
    /// The latest sample or event time.
    pub end: u64,
    /// Samples (or calls) included.
    pub samples: u64,
    /// Samples whose stack walk ended early.
    pub truncated_samples: u64,
    /// Of those: the walk needed more stack than was copied (SAMPLE_STACK_CUT), or it
    /// reached the depth limit; the rest met code that keeps no frame.
    pub truncated_cut: u64,
    pub truncated_at_depth: u64,
    /// The recorder's depth limit (`--max-depth`; 0 when unknown).
    pub recorded_max_depth: usize,
    /// Nanoseconds of the off-CPU samples (`--off-cpu`), and the sample weight they make.
    pub off_cpu_ns: u64,
    pub off_cpu_weight: u64,
    /// The module of each function, the first seen (for the top table).
    pub function_modules: HashMap<String, String>,
    pub warnings: Vec<String>,
    /// The calls, for the trace-only formats.
    pub calls: Option<CallTrace>,
    module_index: FxHashMap<(StringIndex, Vec<u8>, u64, u64, u64), ModuleIndex>,
    frame_index: FxHashMap<FrameRow, FrameIndex>,
    stack_index: FxHashMap<StackRow, StackIndex>,
}

/// A sample as a recorder writes it, for [`Model::add_sample`].
pub struct SampleIn<'a> {
    pub time_ns: u64,
    pub pid: u32,
    pub tid: u32,
    /// For an off-CPU sample, the nanoseconds it was blocked.
    pub stopped_ns: u32,
    pub flags: u8,
    /// Innermost first.
    pub frames: &'a [u64],
    /// A VM guest's sample in the user space of one of the guest's processes: its
    /// frames below the kernel's half are shown as this one (`[user] comm`).
    pub guest_user: Option<&'a str>,
    /// The Python frames read with it (innermost first; names in [`Namer::py_codes`]):
    /// they replace the interpreter's `_PyEval_EvalFrameDefault` frames.
    pub python: &'a [glass_format::PyFrame],
}

/// What names the frames of the samples appended to a model: the symbolizer, and the
/// frames each (module, address) was named as, so that an address costs a lookup once.
pub struct Namer {
    pub symbolizer: Symbolizer,
    guest: bool,
    /// The caller's module key -> its row.
    module_rows: FxHashMap<usize, ModuleIndex>,
    /// (module key, pid, address, is a return address) -> its frames, outermost first.
    resolved: FxHashMap<(usize, u32, u64, bool), Vec<FrameIndex>>,
    kernel_module: Option<ModuleIndex>,
    /// Per thread, the blocked time already turned into whole samples: an off-CPU
    /// sample weighs its time in sampling periods, carried so short blocks add up.
    off_cpu_carry: HashMap<u32, u64>,
    thread_rows: FxHashMap<(u32, u32, StringIndex), usize>,
    /// A sample's frames while it is appended (reused).
    frames: Vec<FrameIndex>,
    /// (pid, id) -> the Python code object a Python frame names.
    pub py_codes: FxHashMap<(u32, u32), glass_format::PyCode>,
}

impl Namer {
    pub fn new(meta: Option<&glass_format::Meta>) -> Namer {
        Namer {
            symbolizer: Symbolizer::new(),
            guest: meta.is_some_and(|m| m.backend.is_guest()),
            module_rows: FxHashMap::default(),
            resolved: FxHashMap::default(),
            kernel_module: None,
            off_cpu_carry: HashMap::new(),
            thread_rows: FxHashMap::default(),
            frames: Vec::with_capacity(64),
            py_codes: FxHashMap::default(),
        }
    }

    /// The recording's meta came (the live view learns it after the first records).
    pub fn set_meta(&mut self, meta: &glass_format::Meta) {
        self.guest = meta.backend.is_guest();
    }

    /// The samples are a VM guest's.
    pub(crate) fn is_guest(&self) -> bool {
        self.guest
    }

    fn code_category(&self, path: &str, address: u64) -> Category {
        if self.guest {
            Category::Guest
        } else if address >= 0xffff_8000_0000_0000 {
            Category::Kernel
        } else if is_jit(path) {
            Category::Jit
        } else {
            Category::User
        }
    }
}

/// The name a process or thread had last (threads often name themselves after start).
fn last_names(recording: &Recording) -> (HashMap<u32, String>, HashMap<u32, String>) {
    let mut processes = HashMap::new();
    for process in &recording.processes {
        if !process.name.is_empty() {
            processes.insert(process.pid, process.name.clone());
        }
    }
    let mut threads = HashMap::new();
    for thread in &recording.threads {
        if !thread.name.is_empty() {
            threads.insert(thread.tid, thread.name.clone());
        }
    }
    (processes, threads)
}

/// Code made at run time lives in anonymous memory or is named by a perf map or jitdump.
fn is_jit(path: &str) -> bool {
    glass_symbols::is_anonymous(path)
        || path.starts_with("[jit")
        || path.starts_with("memfd:")
        || (path.contains("perf-") && path.ends_with(".map"))
        || (path.contains("jit-") && path.ends_with(".dump"))
}

impl Model {
    pub(crate) fn empty(source: Source, unit: Unit) -> Model {
        Model {
            source,
            unit,
            strings: StringTable::default(),
            modules: Vec::new(),
            frames: Vec::new(),
            stacks: Vec::new(),
            threads: Vec::new(),
            period: 0,
            start_unix_ns: 0,
            end: 0,
            samples: 0,
            truncated_samples: 0,
            truncated_cut: 0,
            truncated_at_depth: 0,
            recorded_max_depth: 0,
            off_cpu_ns: 0,
            off_cpu_weight: 0,
            function_modules: HashMap::new(),
            warnings: Vec::new(),
            calls: None,
            module_index: FxHashMap::default(),
            frame_index: FxHashMap::default(),
            stack_index: FxHashMap::default(),
        }
    }

    pub fn string(&self, index: StringIndex) -> &str {
        self.strings.get(index)
    }

    /// The function name of a frame.
    pub fn function(&self, frame: FrameIndex) -> &str {
        self.strings.get(self.frames[frame as usize].function)
    }

    /// The frames of a stack, root first.
    pub fn stack_frames(&self, stack: Option<StackIndex>, into: &mut Vec<FrameIndex>) {
        into.clear();
        let mut next = stack;
        while let Some(index) = next {
            let row = self.stacks[index as usize];
            into.push(row.frame);
            next = row.parent;
        }
        into.reverse();
    }

    pub fn intern_frame(&mut self, row: FrameRow) -> FrameIndex {
        if let Some(&index) = self.frame_index.get(&row) {
            return index;
        }
        let index = self.frames.len() as FrameIndex;
        self.frames.push(row);
        self.frame_index.insert(row, index);
        index
    }

    pub fn intern_stack(&mut self, parent: Option<StackIndex>, frame: FrameIndex) -> StackIndex {
        let row = StackRow { frame, parent };
        if let Some(&index) = self.stack_index.get(&row) {
            return index;
        }
        let index = self.stacks.len() as StackIndex;
        self.stacks.push(row);
        self.stack_index.insert(row, index);
        index
    }

    fn intern_module(&mut self, module: &glass_format::Module) -> ModuleIndex {
        let path = self.strings.intern(&module.path);
        let key = (
            path,
            module.build_id.clone(),
            module.start,
            module.end,
            module.file_offset,
        );
        if let Some(&index) = self.module_index.get(&key) {
            return index;
        }
        let name = module.path.rsplit('/').next().unwrap_or(&module.path);
        let name = self.strings.intern(name);
        let index = self.modules.len() as ModuleIndex;
        self.modules.push(ModuleRow {
            path,
            name,
            build_id: module.build_id.clone(),
            start: module.start,
            end: module.end,
            file_offset: module.file_offset,
        });
        self.module_index.insert(key, index);
        index
    }

    pub(crate) fn special_frame(
        &mut self,
        kind: FrameKind,
        name: &str,
        category: Category,
    ) -> FrameIndex {
        let function = self.strings.intern(name);
        self.intern_frame(FrameRow {
            kind,
            module: None,
            address: 0,
            function,
            inline_depth: 0,
            category,
        })
    }

    /// The model of a sampled recording (`glass record`), built once: modules found by
    /// the recording's timeline, the symbol indexes the samples need built first on all
    /// cores, then every sample appended as [`LiveModel`](crate::live::LiveModel)
    /// appends them one by one.
    pub fn build(recording: &Recording, options: &ModelOptions) -> Model {
        let mut model = Model::empty(Source::Samples, Unit::Nanoseconds);
        model.set_meta(recording.meta.as_ref());
        let timeline = ModuleTimeline::new(recording);
        let mut namer = Namer::new(recording.meta.as_ref());
        // JIT code: the copies of the JIT files the recorder kept name it; else the
        // files themselves (the jitdump files runtimes map are among the modules).
        for map in &recording.jit_maps {
            namer
                .symbolizer
                .add_jit_bytes(map.pid, &map.name, map.text.clone().into_bytes());
        }
        for module in &recording.modules {
            namer.symbolizer.note_module(module.pid, &module.path);
        }
        for code in &recording.py_codes {
            namer.py_codes.insert((code.pid, code.id), code.clone());
        }
        let py_stacks: FxHashMap<(u32, u64), &[glass_format::PyFrame]> = recording
            .py_stacks
            .iter()
            .map(|s| ((s.tid, s.time_ns), &s.frames[..]))
            .collect();
        let (process_names, thread_names) = last_names(recording);
        let guest_tasks = crate::guest_tasks::GuestTasks::new(recording);
        // The process name at each exec: a sample is named after the program it ran.
        let mut exec_names: HashMap<u32, Vec<(u64, String)>> = HashMap::new();
        for process in &recording.processes {
            exec_names
                .entry(process.pid)
                .or_default()
                .push((process.time_ns, process.name.clone()));
        }
        let mut module_at: FxHashMap<(u32, Option<u64>, u64), Option<&glass_format::Module>> =
            FxHashMap::default();
        let unwound = crate::raw::unwind_snapshots(recording);
        let kernel =
            (!recording.kernel_symbols.symbols.is_empty()).then_some(&recording.kernel_symbols);
        // The modules the samples run in (every few samples find the ones that matter),
        // so that the symbol indexes a first report builds are built on all cores.
        let mut touched: FxHashMap<*const glass_format::Module, ModuleRef> = FxHashMap::default();
        for sample in recording
            .samples
            .iter()
            .chain(&unwound)
            .step_by(PREPARE_STRIDE)
        {
            if options.tid.is_some_and(|tid| tid != sample.tid)
                || sample.flags & SAMPLE_FIRMWARE != 0
            {
                continue;
            }
            let epoch = timeline.epoch(sample.pid, sample.time_ns);
            let named_by_kernel = |a: u64| kernel.is_some() && is_kernel_address(a);
            for &address in sample.frames.iter().filter(|&&a| !named_by_kernel(a)) {
                let module = *module_at
                    .entry((sample.pid, epoch, address))
                    .or_insert_with(|| timeline.find(sample.pid, sample.time_ns, address));
                if let Some(module) = module {
                    touched.entry(module).or_insert_with(|| ModuleRef {
                        path: &module.path,
                        build_id: &module.build_id,
                        start: module.start,
                        file_offset: module.file_offset,
                    });
                }
            }
        }
        namer.symbolizer.prepare(touched.into_values());
        for sample in recording.samples.iter().chain(&unwound) {
            if options.tid.is_some_and(|tid| tid != sample.tid)
                || (options.no_idle && sample.flags & SAMPLE_HALTED != 0)
            {
                continue;
            }
            let process = exec_names
                .get(&sample.pid)
                .and_then(|names| {
                    names
                        .iter()
                        .rev()
                        .find(|(t, _)| *t <= sample.time_ns)
                        .or(names.first())
                })
                .map(|(_, name)| name.clone())
                .filter(|name| !name.is_empty())
                .or_else(|| process_names.get(&sample.pid).cloned())
                .unwrap_or_else(|| format!("pid {}", sample.pid));
            let mut thread_name = thread_names
                .get(&sample.tid)
                .map_or("thread", String::as_str)
                .to_string();
            let task = guest_tasks.at(sample.pid, sample.tid, sample.time_ns);
            let guest_user = task.and_then(crate::guest_tasks::user_frame);
            let process = match task {
                Some(task) => {
                    thread_name = crate::guest_tasks::thread_label(&thread_name, task);
                    crate::guest_tasks::process_label(task)
                }
                None => process,
            };
            let epoch = timeline.epoch(sample.pid, sample.time_ns);
            // A guest process's user addresses are in its own modules (--guest-root).
            let user_space = task.and_then(glass_format::GuestTask::user_space);
            // The mappings in force depend only on the process and its epoch: each
            // address of an address space is looked up once.
            let mut module_of = |address: u64| {
                let (pid, epoch) = match user_space {
                    Some(space) if !is_kernel_address(address) => (space, None),
                    _ => (sample.pid, epoch),
                };
                module_at
                    .entry((pid, epoch, address))
                    .or_insert_with(|| timeline.find(pid, sample.time_ns, address))
                    .map(|m| (m as *const glass_format::Module as usize, m))
            };
            model.add_sample(
                &mut namer,
                &SampleIn {
                    time_ns: sample.time_ns,
                    pid: sample.pid,
                    tid: sample.tid,
                    stopped_ns: sample.stopped_ns,
                    flags: sample.flags,
                    frames: &sample.frames,
                    guest_user: guest_user.as_deref(),
                    python: py_stacks
                        .get(&(sample.tid, sample.time_ns))
                        .copied()
                        .unwrap_or(&[]),
                },
                &process,
                &thread_name,
                kernel,
                &mut module_of,
            );
        }
        for thread in &mut model.threads {
            thread.samples.sort_by_key(|s| s.time);
        }
        model.warnings = std::mem::take(&mut namer.symbolizer.warnings);
        model
    }

    /// Puts a sample's Python frames in place of the interpreter's frames (`frames`:
    /// outermost first): each `_PyEval_EvalFrameDefault` call ran the Python frames
    /// from the innermost up to the one it entered, so the innermost call gets the
    /// innermost run, and so on out; runs beyond the native calls found (a walk that
    /// stopped early) go to the outermost. No interpreter frame: the Python frames are
    /// left out rather than placed where they did not run.
    fn interleave_python(
        &mut self,
        namer: &Namer,
        sample: &SampleIn,
        frames: &mut Vec<FrameIndex>,
    ) {
        let evals: Vec<usize> = (0..frames.len())
            .filter(|&i| {
                let row = &self.frames[frames[i] as usize];
                row.kind == FrameKind::Code && self.strings.get(row.function) == PYTHON_EVAL
            })
            .collect();
        let Some(&outermost) = evals.first() else {
            return;
        };
        // Runs, innermost first, each innermost frame first.
        let mut runs: Vec<&[glass_format::PyFrame]> = Vec::new();
        let mut start = 0;
        for (i, frame) in sample.python.iter().enumerate() {
            if frame.entry {
                runs.push(&sample.python[start..=i]);
                start = i + 1;
            }
        }
        if start < sample.python.len() {
            runs.push(&sample.python[start..]);
        }
        let module = self.frames[frames[outermost] as usize].module;
        // Eval frame position -> the runs it gets (innermost eval: the first run).
        let mut given: FxHashMap<usize, Vec<&[glass_format::PyFrame]>> = FxHashMap::default();
        for (n, run) in runs.into_iter().enumerate() {
            let at = evals
                .len()
                .checked_sub(n + 1)
                .map_or(outermost, |i| evals[i]);
            given.entry(at).or_default().push(run);
        }
        let mut out = Vec::with_capacity(frames.len() + sample.python.len());
        for (i, &frame) in frames.iter().enumerate() {
            let Some(runs) = given.get(&i) else {
                out.push(frame);
                continue;
            };
            // Outermost first: the last run first, each run from its entered frame.
            for run in runs.iter().rev() {
                for py in run.iter().rev() {
                    let name = match namer.py_codes.get(&(sample.pid, py.code)) {
                        Some(code) => {
                            let file = code.file.rsplit('/').next().unwrap_or(&code.file);
                            (
                                format!("{} ({file}:{})", code.name, code.first_line),
                                file.to_string(),
                            )
                        }
                        None => ("[python]".to_string(), "[python]".to_string()),
                    };
                    if !self.function_modules.contains_key(&name.0) {
                        self.function_modules.insert(name.0.clone(), name.1);
                    }
                    let function = self.strings.intern(&name.0);
                    out.push(self.intern_frame(FrameRow {
                        kind: FrameKind::Code,
                        module,
                        address: u64::from(py.code),
                        function,
                        inline_depth: 0,
                        category: Category::User,
                    }));
                }
            }
        }
        *frames = out;
    }

    /// The sampling period and start time a recording's meta gives.
    pub(crate) fn set_meta(&mut self, meta: Option<&glass_format::Meta>) {
        self.period = meta
            .map(|m| m.frequency_hz)
            .filter(|&hz| hz > 0)
            .map_or(0, |hz| 1_000_000_000 / u64::from(hz));
        self.start_unix_ns = meta.map_or(0, |m| m.start_unix_ns);
        self.recorded_max_depth = meta.map_or(0, |m| m.max_depth as usize);
    }

    /// Appends one sample: its frames named (kernel frames from `kernel`, the others in
    /// the module `module_of` finds for them, each distinct address once), glass's own
    /// frames added, the stack cut at [`MAX_DEPTH`](crate::MAX_DEPTH), an off-CPU sample
    /// weighed by its blocked time. `module_of` returns a module with a key that stays
    /// the module's while the model lives. Returns the thread row it went to.
    pub(crate) fn add_sample<'m>(
        &mut self,
        namer: &mut Namer,
        sample: &SampleIn,
        process: &str,
        thread_name: &str,
        kernel: Option<&glass_format::KernelSymbols>,
        module_of: &mut dyn FnMut(u64) -> Option<(usize, &'m glass_format::Module)>,
    ) -> usize {
        let mut frames = std::mem::take(&mut namer.frames);
        frames.clear();
        let process = self.strings.intern(process);
        let thread_name = self.strings.intern(thread_name);
        let off_cpu = sample.flags & SAMPLE_OFF_CPU != 0;
        if off_cpu {
            frames.push(self.special_frame(FrameKind::OffCpu, OFF_CPU_FRAME, Category::OffCpu));
        }
        if sample.flags & SAMPLE_TRUNCATED != 0 {
            self.truncated_samples += 1;
            if sample.flags & SAMPLE_STACK_CUT != 0 {
                self.truncated_cut += 1;
            } else if self.recorded_max_depth > 0 && sample.frames.len() >= self.recorded_max_depth
            {
                self.truncated_at_depth += 1;
            }
            frames.push(self.special_frame(FrameKind::Truncated, TRUNCATED_FRAME, Category::Other));
        }
        // A vCPU still in its firmware runs no code of the image: its addresses
        // name nothing.
        let addresses = if sample.flags & SAMPLE_FIRMWARE != 0 {
            frames.push(self.special_frame(
                FrameKind::Firmware,
                FIRMWARE_FRAME,
                Category::GuestFirmware,
            ));
            &[][..]
        } else {
            sample.frames
        };
        // Outermost frame first.
        for (index, &address) in addresses.iter().enumerate().rev() {
            let is_return = index > 0;
            let lookup = if is_return {
                address.saturating_sub(1)
            } else {
                address
            };
            // A guest process's code is named where its binary was given (--guest-root).
            if let Some(user) = sample.guest_user.filter(|_| !is_kernel_address(address)) {
                if module_of(address).is_none() {
                    frames.push(self.special_frame(FrameKind::Unknown, user, Category::User));
                    continue;
                }
            }
            let symbol = kernel
                .filter(|_| is_kernel_address(address))
                .and_then(|kernel| kernel.find(lookup));
            if let Some(symbol) = symbol {
                frames.push(self.kernel_frame(namer, symbol, lookup));
                continue;
            }
            match module_of(address) {
                Some(found) => self.push_module_frames(
                    namer,
                    &mut frames,
                    sample.pid,
                    found,
                    address,
                    is_return,
                ),
                None => {
                    let function = self.strings.intern(UNKNOWN_FRAME);
                    frames.push(self.intern_frame(FrameRow {
                        kind: FrameKind::Unknown,
                        module: None,
                        address,
                        function,
                        inline_depth: 0,
                        category: Category::Other,
                    }));
                }
            }
        }
        if !sample.python.is_empty() {
            self.interleave_python(namer, sample, &mut frames);
        }
        if sample.flags & SAMPLE_HALTED != 0 {
            frames.push(self.special_frame(FrameKind::Halted, HALTED_FRAME, Category::GuestHalted));
        }
        if frames.len() > MAX_DEPTH {
            frames.truncate(MAX_DEPTH);
            frames.push(self.special_frame(FrameKind::Deeper, DEEPER_FRAME, Category::Other));
        }
        let mut stack = None;
        for &frame in &frames {
            stack = Some(self.intern_stack(stack, frame));
        }
        namer.frames = frames;
        let row = self.thread_row(namer, sample, process, thread_name);
        let (weight, cost) = self.weigh(namer, sample, off_cpu);
        self.threads[row].samples.push(SampleRow {
            time: sample.time_ns,
            stack,
            weight,
            cost,
        });
        self.end = self.end.max(sample.time_ns);
        self.samples += 1;
        row
    }

    /// A kernel frame, named from the kernel's symbols (its module the kernel's).
    fn kernel_frame(
        &mut self,
        namer: &mut Namer,
        symbol: &glass_format::KernelSymbol,
        lookup: u64,
    ) -> FrameIndex {
        let module = match namer.kernel_module {
            Some(module) => module,
            None => {
                let module = self.intern_module(&glass_format::Module {
                    time_ns: 0,
                    pid: 0,
                    start: 0xffff_8000_0000_0000,
                    end: u64::MAX,
                    file_offset: 0,
                    build_id: Vec::new(),
                    path: KERNEL_MODULE.into(),
                });
                namer.kernel_module = Some(module);
                module
            }
        };
        let name = crate::kernel_frame_name(symbol);
        if !self.function_modules.contains_key(&name) {
            self.function_modules
                .insert(name.clone(), KERNEL_MODULE.to_string());
        }
        let function = self.strings.intern(&name);
        self.intern_frame(FrameRow {
            kind: FrameKind::Code,
            module: Some(module),
            address: lookup,
            function,
            inline_depth: 0,
            category: Category::Kernel,
        })
    }

    /// The frames of an address in a module (`found`: its key and the module), its
    /// inlined functions among them, innermost last.
    fn push_module_frames(
        &mut self,
        namer: &mut Namer,
        frames: &mut Vec<FrameIndex>,
        pid: u32,
        found: (usize, &glass_format::Module),
        address: u64,
        is_return: bool,
    ) {
        let (key, module) = found;
        let lookup = if is_return {
            address.saturating_sub(1)
        } else {
            address
        };
        // An address of a module is symbolized and interned once (per process: its JIT
        // files name anonymous code).
        let cache_key = (key, pid, address, is_return);
        if let Some(cached) = namer.resolved.get(&cache_key) {
            frames.extend_from_slice(cached);
            return;
        }
        let first = frames.len();
        let module_ref = ModuleRef {
            path: &module.path,
            build_id: &module.build_id,
            start: module.start,
            file_offset: module.file_offset,
        };
        let module_index = match namer.module_rows.get(&key) {
            Some(&index) => index,
            None => {
                let index = self.intern_module(module);
                namer.module_rows.insert(key, index);
                index
            }
        };
        let category = namer.code_category(&module.path, address);
        // Anonymous code is named from the process's perf map or jitdump.
        let symbolized = namer
            .symbolizer
            .symbolize_in(pid, &module_ref, address, is_return);
        for (depth, frame) in symbolized.iter().enumerate() {
            if !self.function_modules.contains_key(&frame.function) {
                self.function_modules
                    .insert(frame.function.clone(), frame.module.clone());
            }
            let function = self.strings.intern(&frame.function);
            frames.push(self.intern_frame(FrameRow {
                kind: FrameKind::Code,
                module: Some(module_index),
                address: lookup,
                function,
                inline_depth: if frame.inlined { depth as u32 } else { 0 },
                category,
            }));
        }
        namer.resolved.insert(cache_key, frames[first..].to_vec());
    }

    /// The row of the sample's thread (of its process, as named), made on its first.
    fn thread_row(
        &mut self,
        namer: &mut Namer,
        sample: &SampleIn,
        process: StringIndex,
        thread_name: StringIndex,
    ) -> usize {
        *namer
            .thread_rows
            .entry((sample.pid, sample.tid, process))
            .or_insert_with(|| {
                self.threads.push(ThreadRow {
                    pid: sample.pid,
                    tid: sample.tid,
                    process,
                    name: thread_name,
                    samples: Vec::new(),
                    events: Vec::new(),
                });
                self.threads.len() - 1
            })
    }

    /// A sample's weight (periods) and cost (ns): one period on the CPU; off it, the
    /// periods its blocked time makes up, the remainder carried to the thread's next.
    fn weigh(&mut self, namer: &mut Namer, sample: &SampleIn, off_cpu: bool) -> (u64, u64) {
        if !off_cpu {
            return (1, self.period);
        }
        let blocked = u64::from(sample.stopped_ns);
        let carry = namer.off_cpu_carry.entry(sample.tid).or_insert(0);
        let period = self.period.max(1);
        let weight = (*carry + blocked) / period - *carry / period;
        *carry += blocked;
        self.off_cpu_ns += blocked;
        self.off_cpu_weight += weight;
        (weight, blocked)
    }

    /// The model of a `glass trace` recording: one sample per call at its start (weight
    /// 1, cost its self time), and each call's open and close events.
    pub fn from_trace(recording: &Recording, trace: CallTrace) -> Model {
        let unit = if trace.tsc_hz == 0 {
            Unit::Cycles
        } else {
            Unit::Nanoseconds
        };
        let mut model = Model::empty(Source::Calls, unit);
        model.start_unix_ns = recording.meta.as_ref().map_or(0, |m| m.start_unix_ns);
        let time = |cycles: u64| -> u64 {
            let since = cycles.saturating_sub(trace.first);
            if trace.tsc_hz == 0 {
                since
            } else {
                trace.ns(since).round() as u64
            }
        };
        let function_frames = model.trace_function_frames(recording);
        let unknown = model.special_frame(FrameKind::Unknown, UNKNOWN_FRAME, Category::Other);
        model.trace_threads(recording, &trace.threads);
        let mut call_stacks: Vec<StackIndex> = Vec::with_capacity(trace.calls.len());
        // Per thread, the calls still open (their ends are pending events).
        let mut open: Vec<Vec<usize>> = vec![Vec::new(); trace.threads.len()];
        for (index, call) in trace.calls.iter().enumerate() {
            let frame = function_frames
                .get(&call.function)
                .copied()
                .unwrap_or(unknown);
            let parent = call.parent.map(|p| call_stacks[p]);
            // Calls deeper than the bound are all the one frame below it; only the
            // first of them opens and closes it on the timeline.
            let depth = call.depth as usize;
            let (frame, stack) = match depth.cmp(&MAX_DEPTH) {
                std::cmp::Ordering::Less => (frame, model.intern_stack(parent, frame)),
                std::cmp::Ordering::Equal => {
                    // (Made at the first such call: other traces' tables stay as they were.)
                    let deeper =
                        model.special_frame(FrameKind::Deeper, DEEPER_FRAME, Category::Other);
                    (deeper, model.intern_stack(parent, deeper))
                }
                std::cmp::Ordering::Greater => {
                    let stack = parent.unwrap_or_default();
                    (model.stacks[stack as usize].frame, stack)
                }
            };
            call_stacks.push(stack);
            let thread = &mut model.threads[call.thread];
            // Calls come in entry order: the ones open that are not this call's
            // ancestors ended before it began.
            let pending = &mut open[call.thread];
            while let Some(&top) = pending.last() {
                if Some(top) == call.parent {
                    break;
                }
                pending.pop();
                if trace.calls[top].depth as usize <= MAX_DEPTH {
                    thread.events.push(Event {
                        time: time(trace.calls[top].end),
                        open: false,
                        frame: model.stacks[call_stacks[top] as usize].frame,
                    });
                }
            }
            if depth <= MAX_DEPTH {
                thread.events.push(Event {
                    time: time(call.start),
                    open: true,
                    frame,
                });
            }
            pending.push(index);
            let cost = if trace.tsc_hz == 0 {
                call.self_cycles()
            } else {
                trace.ns(call.self_cycles()).round() as u64
            };
            thread.samples.push(SampleRow {
                time: time(call.start),
                stack: Some(stack),
                weight: 1,
                cost,
            });
            model.samples += 1;
            model.end = model.end.max(time(call.end));
        }
        for (thread, pending) in open.iter_mut().enumerate() {
            while let Some(top) = pending.pop() {
                if trace.calls[top].depth as usize > MAX_DEPTH {
                    continue;
                }
                model.threads[thread].events.push(Event {
                    time: time(trace.calls[top].end),
                    open: false,
                    frame: model.stacks[call_stacks[top] as usize].frame,
                });
            }
        }
        model.clamp_event_times();
        model.calls = Some(trace);
        model
    }

    /// One frame per traced function: its module, entry address and name; by id.
    fn trace_function_frames(&mut self, recording: &Recording) -> HashMap<u32, FrameIndex> {
        let mut function_frames: HashMap<u32, FrameIndex> = HashMap::new();
        for function in &recording.trace_functions {
            let name = self.strings.intern(&function.name);
            let path = self.strings.intern(&function.module);
            let module_name = function
                .module
                .rsplit('/')
                .next()
                .unwrap_or(&function.module)
                .to_string();
            let module = match self.modules.iter().position(|m| m.path == path) {
                Some(index) => index as ModuleIndex,
                None => {
                    let name = self.strings.intern(&module_name);
                    self.modules.push(ModuleRow {
                        path,
                        name,
                        build_id: Vec::new(),
                        start: 0,
                        end: 0,
                        file_offset: 0,
                    });
                    (self.modules.len() - 1) as ModuleIndex
                }
            };
            self.function_modules
                .entry(function.name.clone())
                .or_insert(module_name);
            let frame = self.intern_frame(FrameRow {
                kind: FrameKind::Code,
                module: Some(module),
                address: function.address,
                function: name,
                inline_depth: 0,
                category: if is_jit(&function.module) {
                    Category::Jit
                } else {
                    Category::User
                },
            });
            function_frames.insert(function.id, frame);
        }
        function_frames
    }

    /// A row for each traced thread, named as the recording last named it and its
    /// process (else the command's name, else its pid).
    fn trace_threads(&mut self, recording: &Recording, threads: &[(u32, u32)]) {
        let (process_names, thread_names) = last_names(recording);
        let command = crate::calltrace::target_command(recording);
        let command = command
            .split(' ')
            .next()
            .filter(|c| !c.is_empty())
            .map(|c| c.rsplit('/').next().unwrap_or(c).to_string());
        for &(pid, tid) in threads {
            let process = process_names
                .get(&pid)
                .cloned()
                .or_else(|| command.clone())
                .unwrap_or_else(|| format!("pid {pid}"));
            let process = self.strings.intern(&process);
            let name = self
                .strings
                .intern(thread_names.get(&tid).map_or("thread", String::as_str));
            self.threads.push(ThreadRow {
                pid,
                tid,
                process,
                name,
                samples: Vec::new(),
                events: Vec::new(),
            });
        }
    }

    /// A close never precedes its own open, nor a close the open of a later call: times
    /// rounded backwards are clamped.
    fn clamp_event_times(&mut self) {
        for thread in &mut self.threads {
            let mut last = 0;
            for event in &mut thread.events {
                event.time = event.time.max(last);
                last = event.time;
            }
        }
    }

    /// Distinct (thread id, name) pairs, in tid order.
    pub fn thread_names(&self) -> Vec<(u32, String)> {
        // By id and name: a VM guest's vCPU is one thread per guest task it ran.
        let mut threads: Vec<(u32, String)> = self
            .threads
            .iter()
            .map(|thread| (thread.tid, self.string(thread.name).to_string()))
            .collect();
        threads.sort();
        threads.dedup();
        threads
    }

    /// The module row of a frame.
    pub fn module_of(&self, frame: FrameIndex) -> Option<&ModuleRow> {
        self.frames[frame as usize]
            .module
            .map(|m| &self.modules[m as usize])
    }
}
