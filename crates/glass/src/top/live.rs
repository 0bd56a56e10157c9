//! The live side of `glass top`: the recorder's [`Output`] that hands every record to the
//! view thread (and, with `-o`, to the file as well), and the model that thread keeps.
//!
//! The model is `glass report`'s top table kept up to date instead of built once: the
//! records arrive in time order, so each process's module map is simply the mappings
//! seen so far (replaced at an exec, copied at a fork) rather than the time-indexed
//! `ModuleTimeline` a finished recording needs. Addresses are named by
//! `glass_symbols::Symbolizer` as the report names them, behind a cache per (module,
//! address) holding the interned functions, so a sample costs a few hash lookups once its
//! addresses were seen. The table is recomputed from the samples of the sliding window at
//! each refresh (a window holds at most seconds of samples).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io;
use std::rc::Rc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Instant;

use glass_format::{
    Backend, JitMap, Meta, Module, Process, ProcessKind, Snapshot, Summary, Thread, ThreadExit,
    SAMPLE_FIRMWARE, SAMPLE_HALTED,
};
use glass_record::recorder::{Output, Progress};
use glass_record::Notes;
use glass_report::{FIRMWARE_FRAME, HALTED_FRAME, UNKNOWN_FRAME};
use glass_symbols::{ModuleRef, Symbolizer};

/// What the recording thread tells the view thread.
pub enum Message {
    Meta(Meta),
    Process(Process),
    Module(Module),
    Thread(Thread),
    Sample(Sample),
    Progress(Progress),
    Note {
        warning: bool,
        text: String,
    },
    /// The recording is over: why, and whether the view stays up until the user quits
    /// (the target ended or the duration elapsed) or closes at once (a failure, a signal).
    Ended {
        text: String,
        linger: bool,
    },
}

pub struct Sample {
    pub time_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub flags: u8,
    /// `frames[0]` is the instruction pointer.
    pub frames: Box<[u64]>,
}

/// The recorder's output: every record goes to the view thread; with `-o`, to the file
/// first (its write errors end the recording as in `glass record`). Runs on the sampling
/// thread after the target has its CPU back; sending never waits (an unbounded channel).
pub struct LiveOutput<'a> {
    pub to_view: Sender<Message>,
    pub file: Option<Box<dyn Output + 'a>>,
    /// The target's pid once known (a launched command's, which `q` ends).
    pub target_pid: Arc<AtomicU32>,
}

impl LiveOutput<'_> {
    fn send(&self, message: Message) {
        // The view may have closed (the user quit): the recording ends by itself.
        let _ = self.to_view.send(message);
    }
}

impl Output for LiveOutput<'_> {
    fn meta(&mut self, meta: &Meta) -> io::Result<()> {
        if let Some(file) = &mut self.file {
            file.meta(meta)?;
        }
        self.target_pid.store(meta.target_pid, Ordering::SeqCst);
        self.send(Message::Meta(meta.clone()));
        Ok(())
    }
    fn process(&mut self, process: &Process) -> io::Result<()> {
        if let Some(file) = &mut self.file {
            file.process(process)?;
        }
        self.send(Message::Process(process.clone()));
        Ok(())
    }
    fn module(&mut self, module: &Module) -> io::Result<()> {
        if let Some(file) = &mut self.file {
            file.module(module)?;
        }
        self.send(Message::Module(module.clone()));
        Ok(())
    }
    fn thread(&mut self, thread: &Thread) -> io::Result<()> {
        if let Some(file) = &mut self.file {
            file.thread(thread)?;
        }
        self.send(Message::Thread(thread.clone()));
        Ok(())
    }
    fn thread_exit(&mut self, exit: &ThreadExit) -> io::Result<()> {
        match &mut self.file {
            Some(file) => file.thread_exit(exit),
            None => Ok(()),
        }
    }
    fn sample(
        &mut self,
        time_ns: u64,
        pid: u32,
        tid: u32,
        stopped_ns: u32,
        flags: u8,
        frames: &[u64],
    ) -> io::Result<()> {
        if let Some(file) = &mut self.file {
            file.sample(time_ns, pid, tid, stopped_ns, flags, frames)?;
        }
        self.send(Message::Sample(Sample {
            time_ns,
            pid,
            tid,
            flags,
            frames: frames.into(),
        }));
        Ok(())
    }
    fn snapshot(&mut self, snapshot: &Snapshot) -> io::Result<()> {
        // `glass top` refuses --capture raw: nothing to show of these.
        match &mut self.file {
            Some(file) => file.snapshot(snapshot),
            None => Ok(()),
        }
    }
    fn summary(&mut self, summary: &Summary) -> io::Result<()> {
        match &mut self.file {
            Some(file) => file.summary(summary),
            None => Ok(()),
        }
    }
    fn jit_map(&mut self, map: &JitMap) -> io::Result<()> {
        match &mut self.file {
            Some(file) => file.jit_map(map),
            None => Ok(()),
        }
    }
    fn end(&mut self) -> io::Result<()> {
        match &mut self.file {
            Some(file) => file.end(),
            None => Ok(()),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match &mut self.file {
            Some(file) => file.flush(),
            None => Ok(()),
        }
    }
    fn progress(&mut self, progress: &Progress) {
        self.send(Message::Progress(*progress));
    }
}

/// A note as glass prints it on stderr.
pub fn note_line(warning: bool, text: &str) -> String {
    match warning {
        true => format!("glass: warning: {text}"),
        false => format!("glass: {text}"),
    }
}

/// The recording's notes, shown by the view (which prints them on stderr when no
/// screen is up, and again after it closes).
pub struct LiveNotes {
    pub to_view: Sender<Message>,
    pub quiet: bool,
}

impl Notes for LiveNotes {
    fn warn(&mut self, text: &str) {
        let _ = self.to_view.send(Message::Note {
            warning: true,
            text: text.to_string(),
        });
    }

    fn figure(&mut self, text: &str) {
        if !self.quiet {
            let _ = self.to_view.send(Message::Note {
                warning: false,
                text: text.to_string(),
            });
        }
    }
}

pub type FunctionId = u32;

pub struct Function {
    pub name: String,
    /// The module's file name (empty for glass's own frames).
    pub module: String,
}

/// One sample of the window, symbolized.
#[derive(Clone)]
struct WindowSample {
    time_ns: u64,
    tid: u32,
    /// The innermost function that was not inlined (None for a sample without frames).
    self_function: Option<FunctionId>,
    /// Every function on the stack, once.
    functions: Box<[FunctionId]>,
}

/// How the table splits the samples by thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadView {
    /// All threads together.
    All,
    /// One row per thread and function, shares of all samples.
    Split,
    /// This thread alone, shares of its samples.
    One(u32),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortKey {
    SelfShare,
    Total,
    Name,
}

impl SortKey {
    pub fn name(self) -> &'static str {
        match self {
            SortKey::SelfShare => "self",
            SortKey::Total => "total",
            SortKey::Name => "name",
        }
    }
}

pub struct Row {
    pub thread: Option<u32>,
    pub function: FunctionId,
    pub self_samples: u64,
    pub total_samples: u64,
}

/// The window's table and what the header shows.
pub struct Table {
    pub rows: Vec<Row>,
    /// Samples the shares are of.
    pub samples: u64,
    /// Samples in the window, all threads.
    pub window_samples: u64,
    /// The window's span so far (shorter than the window at the start).
    pub span_ns: u64,
    pub stopped_mean_ns: u64,
    pub stopped_max_ns: u64,
    pub stopped_total_ns: u64,
    pub lost: u64,
    pub missed_deadlines: u64,
}

/// The window as it was when the user paused the view.
struct Frozen {
    samples: VecDeque<WindowSample>,
    ticks: VecDeque<(u64, u64)>,
    now_ns: u64,
    progress: Progress,
}

pub struct Live {
    pub meta: Option<Meta>,
    frozen: Option<Frozen>,
    window_ns: u64,
    symbolizer: Symbolizer,
    pub functions: Vec<Function>,
    function_ids: HashMap<(String, String), FunctionId>,
    modules: Vec<Module>,
    /// Per process, its mappings (indexes into `modules`) sorted by start.
    spaces: HashMap<u32, Vec<usize>>,
    /// (module, address, is a return address) -> its functions, outermost first.
    names: HashMap<(usize, u64, bool), Rc<[FunctionId]>>,
    samples: VecDeque<WindowSample>,
    /// (time, how long the target was stopped) per tick.
    ticks: VecDeque<(u64, u64)>,
    pub thread_names: BTreeMap<u32, String>,
    progress: Progress,
    /// The latest time a record carried, and when it arrived: the window's end moves on
    /// with the clock between records.
    latest_ns: u64,
    latest_at: Instant,
    /// The first time a record carried: the window's span counts from there (a VM's
    /// recording starts its clock before the guest has booted).
    first_ns: Option<u64>,
    ended: bool,
    unknown: FunctionId,
    kernel_symbols: Option<glass_format::KernelSymbols>,
    halted: FunctionId,
    firmware: FunctionId,
}

impl Live {
    pub fn new(window_ns: u64) -> Self {
        let mut live = Live {
            meta: None,
            frozen: None,
            window_ns,
            symbolizer: Symbolizer::new(),
            functions: Vec::new(),
            function_ids: HashMap::new(),
            modules: Vec::new(),
            spaces: HashMap::new(),
            names: HashMap::new(),
            samples: VecDeque::new(),
            ticks: VecDeque::new(),
            thread_names: BTreeMap::new(),
            progress: Progress::default(),
            latest_ns: 0,
            latest_at: Instant::now(),
            first_ns: None,
            ended: false,
            unknown: 0,
            kernel_symbols: None,
            halted: 0,
            firmware: 0,
        };
        live.unknown = live.function(UNKNOWN_FRAME, "");
        live.halted = live.function(HALTED_FRAME, "");
        live.firmware = live.function(FIRMWARE_FRAME, "");
        live
    }

    fn function(&mut self, name: &str, module: &str) -> FunctionId {
        // By name and module (the report's top table merges by name alone): the
        // `main` of a program and of the one its child execs are two rows here, as are
        // two static functions of one name in different files.
        let key = (name.to_string(), module.to_string());
        if let Some(&id) = self.function_ids.get(&key) {
            return id;
        }
        let id = self.functions.len() as FunctionId;
        self.functions.push(Function {
            name: key.0.clone(),
            module: key.1.clone(),
        });
        self.function_ids.insert(key, id);
        id
    }

    /// The recording is over: the window stops moving.
    pub fn end(&mut self) {
        if !self.ended {
            self.latest_ns = self.now_ns();
            self.ended = true;
        }
    }

    pub fn now_ns(&self) -> u64 {
        if self.ended {
            self.latest_ns
        } else {
            self.latest_ns + self.latest_at.elapsed().as_nanos() as u64
        }
    }

    fn saw_time(&mut self, time_ns: u64) {
        self.first_ns.get_or_insert(time_ns);
        if time_ns > self.latest_ns {
            self.latest_ns = time_ns;
            self.latest_at = Instant::now();
        }
    }

    pub fn handle(&mut self, message: Message) {
        match message {
            Message::Meta(meta) => {
                self.latest_at = Instant::now();
                self.meta = Some(meta);
            }
            Message::Process(process) => match process.kind {
                ProcessKind::Forked => {
                    let inherited = self
                        .spaces
                        .get(&process.parent_pid)
                        .cloned()
                        .unwrap_or_default();
                    self.spaces.insert(process.pid, inherited);
                }
                ProcessKind::Exec | ProcessKind::Attached => {
                    self.spaces.insert(process.pid, Vec::new());
                }
            },
            Message::Module(module) => self.add_module(module),
            Message::Thread(thread) => {
                self.thread_names.insert(thread.tid, thread.name);
            }
            Message::Sample(sample) => self.add_sample(&sample),
            Message::Progress(progress) => {
                self.saw_time(progress.time_ns);
                if let Some(stopped) = progress.tick_stopped_ns {
                    self.ticks.push_back((progress.time_ns, stopped));
                }
                self.progress = progress;
            }
            Message::Note { .. } | Message::Ended { .. } => {}
        }
    }

    fn add_module(&mut self, module: Module) {
        self.symbolizer.note_module(module.pid, &module.path);
        let index = self.modules.len();
        let (pid, start, end) = (module.pid, module.start, module.end);
        self.modules.push(module);
        let modules = &self.modules;
        let space = self.spaces.entry(pid).or_default();
        // An unmapped and reused range: the older mapping gives way.
        space.retain(|&m| modules[m].end <= start || modules[m].start >= end);
        let at = space.partition_point(|&m| modules[m].start < start);
        space.insert(at, index);
    }

    fn module_of(&self, pid: u32, address: u64) -> Option<usize> {
        let space = self.spaces.get(&pid)?;
        let at = space.partition_point(|&m| self.modules[m].start <= address);
        let index = *space.get(at.checked_sub(1)?)?;
        (address < self.modules[index].end).then_some(index)
    }

    /// The functions at `address` of process `pid`, outermost first.
    fn name(&mut self, pid: u32, address: u64, is_return: bool) -> Rc<[FunctionId]> {
        if glass_format::is_kernel_address(address) {
            return self.kernel_name(address, is_return);
        }
        let Some(module) = self.module_of(pid, address) else {
            return Rc::from([self.unknown]);
        };
        if let Some(ids) = self.names.get(&(module, address, is_return)) {
            return ids.clone();
        }
        let m = &self.modules[module];
        let module_ref = ModuleRef {
            path: &m.path,
            build_id: &m.build_id,
            start: m.start,
            file_offset: m.file_offset,
        };
        let frames = self
            .symbolizer
            .symbolize_in(pid, &module_ref, address, is_return);
        let ids: Rc<[FunctionId]> = frames
            .iter()
            .map(|frame| self.function(&frame.function, &frame.module))
            .collect();
        self.names.insert((module, address, is_return), ids.clone());
        ids
    }

    /// A kernel frame (the perf backend's callchain), named from /proc/kallsyms, read
    /// once at the first one.
    fn kernel_name(&mut self, address: u64, is_return: bool) -> Rc<[FunctionId]> {
        let lookup = if is_return {
            address.saturating_sub(1)
        } else {
            address
        };
        let kernel = self
            .kernel_symbols
            .get_or_insert_with(glass_target::perf::all_kernel_symbols);
        let id = match kernel.find(lookup) {
            Some(symbol) => {
                let name = glass_report::kernel_frame_name(symbol);
                self.function(&name, glass_report::KERNEL_MODULE)
            }
            None => self.unknown,
        };
        Rc::from([id])
    }

    fn add_sample(&mut self, sample: &Sample) {
        self.saw_time(sample.time_ns);
        let mut functions = Vec::with_capacity(sample.frames.len() + 1);
        let mut self_function = None;
        if sample.flags & SAMPLE_FIRMWARE != 0 {
            // A vCPU still in its firmware runs no code of the image.
            self_function = Some(self.firmware);
            functions.push(self.firmware);
        } else {
            for (index, &address) in sample.frames.iter().enumerate() {
                let ids = self.name(sample.pid, address, index > 0);
                if index == 0 {
                    // Self time goes to the innermost function that was not inlined.
                    self_function = ids.first().copied();
                }
                functions.extend_from_slice(&ids);
            }
        }
        if sample.flags & SAMPLE_HALTED != 0 {
            self_function = Some(self.halted);
            functions.push(self.halted);
        }
        // A truncated stack counts for the functions it holds, as in the report.
        functions.sort_unstable();
        functions.dedup();
        self.samples.push_back(WindowSample {
            time_ns: sample.time_ns,
            tid: sample.tid,
            self_function,
            functions: functions.into(),
        });
        self.prune();
    }

    fn window_start(&self) -> u64 {
        self.now_ns().saturating_sub(self.window_ns)
    }

    /// Drops what fell out of the window.
    fn prune(&mut self) {
        let start = self.window_start();
        while self.samples.front().is_some_and(|s| s.time_ns < start) {
            self.samples.pop_front();
        }
        while self.ticks.front().is_some_and(|&(t, _)| t < start) {
            self.ticks.pop_front();
        }
    }

    /// From now on the table shows the window as it is now (sorting and thread views
    /// still apply to it), while the samples that arrive keep the live window going.
    pub fn freeze(&mut self) {
        self.prune();
        self.frozen = Some(Frozen {
            samples: self.samples.clone(),
            ticks: self.ticks.clone(),
            now_ns: self.now_ns(),
            progress: self.progress,
        });
    }

    /// The table shows the live window again.
    pub fn thaw(&mut self) {
        self.frozen = None;
    }

    /// The window the table shows: samples, ticks, its end, the counts.
    fn shown(
        &self,
    ) -> (
        &VecDeque<WindowSample>,
        &VecDeque<(u64, u64)>,
        u64,
        Progress,
    ) {
        let now_ns = self.now_ns();
        match &self.frozen {
            Some(f) => (&f.samples, &f.ticks, f.now_ns, f.progress),
            None => (&self.samples, &self.ticks, now_ns, self.progress),
        }
    }

    /// Threads with samples in the window shown, in tid order.
    pub fn threads(&mut self) -> Vec<u32> {
        self.prune();
        let (samples, ..) = self.shown();
        let mut tids: Vec<u32> = samples.iter().map(|s| s.tid).collect();
        tids.sort_unstable();
        tids.dedup();
        tids
    }

    pub fn thread_label(&self, tid: u32) -> String {
        match self.thread_names.get(&tid) {
            Some(name) => format!("{name}/{tid}"),
            None => format!("thread/{tid}"),
        }
    }

    pub fn is_perf(&self) -> bool {
        self.meta
            .as_ref()
            .is_some_and(|m| m.backend == Backend::Perf)
    }

    /// The window's table, `view` and `sort` as the user chose.
    pub fn table(&mut self, view: ThreadView, sort: SortKey) -> Table {
        self.prune();
        let (window, ticks, now_ns, progress) = self.shown();
        let mut counts: HashMap<(Option<u32>, FunctionId), (u64, u64)> = HashMap::new();
        let mut samples = 0;
        for sample in window {
            let thread = match view {
                ThreadView::All => None,
                ThreadView::Split => Some(sample.tid),
                ThreadView::One(tid) if tid == sample.tid => Some(tid),
                ThreadView::One(_) => continue,
            };
            samples += 1;
            if let Some(function) = sample.self_function {
                counts.entry((thread, function)).or_default().0 += 1;
            }
            for &function in sample.functions.iter() {
                counts.entry((thread, function)).or_default().1 += 1;
            }
        }
        let mut rows: Vec<Row> = counts
            .into_iter()
            .map(|((thread, function), (self_samples, total_samples))| Row {
                thread,
                function,
                self_samples,
                total_samples,
            })
            .collect();
        let name = |row: &Row| self.functions[row.function as usize].name.as_str();
        rows.sort_by(|a, b| {
            let by_name = name(a).cmp(name(b)).then(a.thread.cmp(&b.thread));
            match sort {
                SortKey::SelfShare => (b.self_samples, b.total_samples)
                    .cmp(&(a.self_samples, a.total_samples))
                    .then(by_name),
                SortKey::Total => (b.total_samples, b.self_samples)
                    .cmp(&(a.total_samples, a.self_samples))
                    .then(by_name),
                SortKey::Name => by_name,
            }
        });
        let stopped_total_ns: u64 = ticks.iter().map(|&(_, s)| s).sum();
        let table = Table {
            rows: Vec::new(),
            samples,
            window_samples: window.len() as u64,
            span_ns: now_ns
                .saturating_sub(self.first_ns.unwrap_or(0))
                .min(self.window_ns),
            stopped_mean_ns: stopped_total_ns
                .checked_div(ticks.len() as u64)
                .unwrap_or(0),
            stopped_max_ns: ticks.iter().map(|&(_, s)| s).max().unwrap_or(0),
            stopped_total_ns,
            lost: progress.lost,
            missed_deadlines: progress.missed_deadlines,
        };
        Table { rows, ..table }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(time_s: u64, tid: u32, flags: u8) -> Message {
        Message::Sample(Sample {
            time_ns: time_s * 1_000_000_000,
            pid: 7,
            tid,
            flags,
            frames: vec![0x1000, 0x2000].into(),
        })
    }

    /// (self, total) of a function's row.
    fn row(live: &Live, table: &Table, name: &str, thread: Option<u32>) -> Option<(u64, u64)> {
        table
            .rows
            .iter()
            .find(|r| live.functions[r.function as usize].name == name && r.thread == thread)
            .map(|r| (r.self_samples, r.total_samples))
    }

    /// The window keeps the last seconds only; halted samples count for [halted];
    /// thread views split and filter; a frozen table keeps its window while samples go on.
    #[test]
    fn window_threads_and_freezing() {
        // Half a second off the samples' times: no sample sits on the window's edge.
        let mut live = Live::new(4_500_000_000);
        // No module maps the addresses: every frame is [unknown].
        for second in 0..10 {
            live.handle(sample(second, 1, 0));
            live.handle(sample(second, 2, SAMPLE_HALTED));
        }
        live.end();
        let table = live.table(ThreadView::All, SortKey::SelfShare);
        // Seconds 5..=9 of the 0..=9 seen (the window ends at the last): 5 per thread.
        assert_eq!(table.samples, 10);
        assert_eq!(row(&live, &table, HALTED_FRAME, None), Some((5, 5)));
        assert_eq!(row(&live, &table, UNKNOWN_FRAME, None), Some((5, 10)));
        let split = live.table(ThreadView::Split, SortKey::Name);
        assert_eq!(row(&live, &split, UNKNOWN_FRAME, Some(1)), Some((5, 5)));
        assert_eq!(row(&live, &split, HALTED_FRAME, Some(2)), Some((5, 5)));
        assert_eq!(row(&live, &split, HALTED_FRAME, Some(1)), None);
        let one = live.table(ThreadView::One(2), SortKey::Total);
        assert_eq!(one.samples, 5);
        assert_eq!(live.threads(), [1, 2]);
        live.freeze();
        live.handle(sample(9, 3, 0));
        assert_eq!(live.table(ThreadView::All, SortKey::Total).samples, 10);
        assert_eq!(live.threads(), [1, 2]);
        live.thaw();
        assert_eq!(live.table(ThreadView::All, SortKey::Total).samples, 11);
    }
}
