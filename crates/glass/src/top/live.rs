//! The live side of `glass top`: the recorder's [`Output`] that hands every record to the
//! view thread (and, with `-o`, to the file as well), and the model that thread keeps.
//!
//! The model is the report's own: glass-report's `LiveModel` appends each sample to the
//! same `Model` `glass report` builds (named, cut and weighed as there, off-CPU samples
//! included), with each process's module map as seen so far, and drops the samples that
//! fell out of the sliding window. What a stack counts for in the table (its self
//! function, its functions once) is worked out once per distinct stack; the table is
//! recomputed from the window's samples at each refresh (a window holds at most seconds
//! of samples).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io;
use std::rc::Rc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Instant;

use glass_format::{
    Backend, GuestRam, GuestTask, JitMap, KernelSymbols, Meta, Module, Process, PyCode, PyFrame,
    PyStack, Snapshot, Summary, Thread, ThreadExit, ThreadLost,
};
use glass_record::recorder::{Output, Progress};
use glass_record::Notes;
use glass_report::model::{FrameKind, SampleIn, StackIndex, StringIndex};
use glass_report::LiveModel;

/// What the recording thread tells the view thread.
pub enum Message {
    Meta(Meta),
    Process(Process),
    Module(Module),
    Thread(Thread),
    GuestTask(GuestTask),
    Sample(Sample),
    /// A Python code object the Python frames of later samples name.
    PyCode(PyCode),
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
    /// An off-CPU sample's blocked nanoseconds.
    pub stopped_ns: u32,
    pub flags: u8,
    /// `frames[0]` is the instruction pointer.
    pub frames: Box<[u64]>,
    /// Its Python frames (innermost first), if it has any.
    pub python: Box<[PyFrame]>,
}

/// The recorder's output: every record goes to the view thread; with `-o`, to the file
/// first (its write errors end the recording as in `glass record`). Runs on the sampling
/// thread after the target has its CPU back; sending never waits (an unbounded channel).
pub struct LiveOutput<'a> {
    pub to_view: Sender<Message>,
    pub file: Option<Box<dyn Output + 'a>>,
    /// The target's pid once known (a launched command's, which `q` ends).
    pub target_pid: Arc<AtomicU32>,
    /// The last sample, held until what follows it is known: its Python frames come
    /// after it (the view appends a sample whole).
    pub held: Option<Sample>,
}

impl LiveOutput<'_> {
    /// A record only the file takes (the view does not show it).
    fn write_file(
        &mut self,
        write: impl FnOnce(&mut dyn Output) -> io::Result<()>,
    ) -> io::Result<()> {
        match &mut self.file {
            Some(file) => write(file.as_mut()),
            None => Ok(()),
        }
    }

    fn send(&mut self, message: Message) {
        self.release();
        // The view may have closed (the user quit): the recording ends by itself.
        let _ = self.to_view.send(message);
    }

    /// Sends the held sample.
    fn release(&mut self) {
        if let Some(sample) = self.held.take() {
            let _ = self.to_view.send(Message::Sample(sample));
        }
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
    fn guest_task(&mut self, task: &GuestTask) -> io::Result<()> {
        if let Some(file) = &mut self.file {
            file.guest_task(task)?;
        }
        self.send(Message::GuestTask(task.clone()));
        Ok(())
    }
    fn thread_exit(&mut self, exit: &ThreadExit) -> io::Result<()> {
        self.write_file(|file| file.thread_exit(exit))
    }
    fn guest_ram(&mut self, ram: &GuestRam) -> io::Result<()> {
        self.write_file(|file| file.guest_ram(ram))
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
        self.release();
        self.held = Some(Sample {
            time_ns,
            pid,
            tid,
            stopped_ns,
            flags,
            frames: frames.into(),
            python: Box::default(),
        });
        Ok(())
    }
    fn snapshot(&mut self, snapshot: &Snapshot) -> io::Result<()> {
        // `glass top` refuses --capture raw: nothing to show of these.
        self.write_file(|file| file.snapshot(snapshot))
    }
    fn summary(&mut self, summary: &Summary) -> io::Result<()> {
        self.write_file(|file| file.summary(summary))
    }
    fn jit_map(&mut self, map: &JitMap) -> io::Result<()> {
        self.write_file(|file| file.jit_map(map))
    }
    fn end(&mut self) -> io::Result<()> {
        self.release();
        self.write_file(|file| file.end())
    }
    fn flush(&mut self) -> io::Result<()> {
        self.release();
        self.write_file(|file| file.flush())
    }
    fn progress(&mut self, progress: &Progress) {
        self.send(Message::Progress(*progress));
    }
    fn py_code(&mut self, code: &PyCode) -> io::Result<()> {
        self.write_file(|file| file.py_code(code))?;
        // Not `send`: the held sample's frames may name it.
        let _ = self.to_view.send(Message::PyCode(code.clone()));
        Ok(())
    }
    fn py_stack(&mut self, stack: &PyStack) -> io::Result<()> {
        self.write_file(|file| file.py_stack(stack))?;
        if let Some(held) = &mut self.held {
            if (held.tid, held.time_ns) == (stack.tid, stack.time_ns) {
                held.python = stack.frames.clone().into();
            }
        }
        self.release();
        Ok(())
    }
    fn thread_lost(&mut self, lost: &ThreadLost) -> io::Result<()> {
        self.write_file(|file| file.thread_lost(lost))
    }
    fn kernel_symbols(&mut self, symbols: &KernelSymbols) -> io::Result<()> {
        self.write_file(|file| file.kernel_symbols(symbols))
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
    /// Samples the shares are of (an off-CPU sample counts its blocked time in
    /// sampling periods, as in the report).
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

/// A sample of the window: its thread and its row of the model's stack table.
#[derive(Clone, Copy)]
struct WindowSample {
    /// The thread (a VM guest's: its row in the model, one per vCPU and guest task).
    tid: u32,
    stack: Option<StackIndex>,
    weight: u64,
}

/// The window as it was when the user paused the view.
struct Frozen {
    samples: Vec<WindowSample>,
    ticks: VecDeque<(u64, u64)>,
    now_ns: u64,
    progress: Progress,
}

/// What a stack counts for in the table.
struct Counted {
    /// The innermost function that was not inlined (None for a stack without one).
    self_function: Option<FunctionId>,
    /// Every function on the stack, once.
    functions: Box<[FunctionId]>,
}

/// Appends past this many samples since the last prune drop the old ones (the table
/// prunes as well): the window's memory stays that of its samples.
const PRUNE_EVERY: u32 = 4096;

pub struct Live {
    pub meta: Option<Meta>,
    frozen: Option<Frozen>,
    window_ns: u64,
    /// The report's sample model, appended to as records arrive (glass-report's
    /// `LiveModel`), holding the window's samples.
    model: LiveModel,
    pub functions: Vec<Function>,
    function_ids: HashMap<(StringIndex, StringIndex), FunctionId>,
    /// What each stack of the model counts for, worked out once per stack.
    counted: HashMap<Option<StackIndex>, Rc<Counted>>,
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
    since_prune: u32,
}

impl Live {
    pub fn new(window_ns: u64) -> Self {
        Live {
            meta: None,
            frozen: None,
            window_ns,
            model: LiveModel::new(Box::new(glass_target::perf::all_kernel_symbols)),
            functions: Vec::new(),
            function_ids: HashMap::new(),
            counted: HashMap::new(),
            ticks: VecDeque::new(),
            thread_names: BTreeMap::new(),
            progress: Progress::default(),
            latest_ns: 0,
            latest_at: Instant::now(),
            first_ns: None,
            ended: false,
            since_prune: 0,
        }
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
                self.model.meta(&meta);
                self.meta = Some(meta);
            }
            Message::Process(process) => self.model.process(&process),
            Message::Module(module) => self.model.module(module),
            Message::PyCode(code) => self.model.py_code(code),
            Message::Thread(thread) => {
                self.model.thread(thread.tid, &thread.name);
                self.thread_names.insert(thread.tid, thread.name);
            }
            Message::GuestTask(task) => self.model.guest_task(task),
            Message::Sample(sample) => {
                self.saw_time(sample.time_ns);
                self.model.sample(&SampleIn {
                    time_ns: sample.time_ns,
                    pid: sample.pid,
                    tid: sample.tid,
                    stopped_ns: sample.stopped_ns,
                    flags: sample.flags,
                    frames: &sample.frames,
                    guest_user: None,
                    python: &sample.python,
                });
                self.since_prune += 1;
                if self.since_prune >= PRUNE_EVERY {
                    self.prune();
                }
            }
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

    fn window_start(&self) -> u64 {
        self.now_ns().saturating_sub(self.window_ns)
    }

    /// Drops what fell out of the window.
    fn prune(&mut self) {
        let start = self.window_start();
        self.model.prune(start);
        while self.ticks.front().is_some_and(|&(t, _)| t < start) {
            self.ticks.pop_front();
        }
        self.since_prune = 0;
    }

    /// The samples of the live window.
    fn window(&self) -> Vec<WindowSample> {
        // A guest's vCPU runs many guest tasks (`--guest-btf`): each its own thread row.
        let by_row = self.is_guest();
        self.model
            .model
            .threads
            .iter()
            .enumerate()
            .flat_map(|(row, thread)| {
                let tid = if by_row { row as u32 } else { thread.tid };
                thread.samples.iter().map(move |s| WindowSample {
                    tid,
                    stack: s.stack,
                    weight: s.weight,
                })
            })
            .collect()
    }

    /// From now on the table shows the window as it is now (sorting and thread views
    /// still apply to it), while the samples that arrive keep the live window going.
    pub fn freeze(&mut self) {
        self.prune();
        self.frozen = Some(Frozen {
            samples: self.window(),
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
    fn shown(&self) -> (Vec<WindowSample>, VecDeque<(u64, u64)>, u64, Progress) {
        match &self.frozen {
            Some(f) => (f.samples.clone(), f.ticks.clone(), f.now_ns, f.progress),
            None => (
                self.window(),
                self.ticks.clone(),
                self.now_ns(),
                self.progress,
            ),
        }
    }

    /// Threads with samples in the window shown, in tid order.
    pub fn threads(&mut self) -> Vec<u32> {
        self.prune();
        let (samples, ..) = self.shown();
        let mut tids: Vec<u32> = samples.iter().map(|s| s.tid).collect();
        tids.sort_unstable();
        tids.dedup();
        if self.is_guest() {
            let rows = &self.model.model.threads;
            tids.sort_by_cached_key(|&row| (rows[row as usize].tid, self.thread_label(row)));
        }
        tids
    }

    pub fn thread_label(&self, tid: u32) -> String {
        if self.is_guest() {
            if let Some(row) = self.model.model.threads.get(tid as usize) {
                return format!("{}/{}", self.model.model.string(row.name), row.tid);
            }
        }
        match self.thread_names.get(&tid) {
            Some(name) => format!("{name}/{tid}"),
            None => format!("thread/{tid}"),
        }
    }

    fn is_guest(&self) -> bool {
        self.meta.as_ref().is_some_and(|m| m.backend.is_guest())
    }

    pub fn is_perf(&self) -> bool {
        self.meta
            .as_ref()
            .is_some_and(|m| m.backend == Backend::Perf)
    }

    fn function(&mut self, name: StringIndex, module: StringIndex) -> FunctionId {
        // By name and module (the report's top table merges by name alone): the
        // `main` of a program and of the one its child execs are two rows here, as are
        // two static functions of one name in different files.
        if let Some(&id) = self.function_ids.get(&(name, module)) {
            return id;
        }
        let id = self.functions.len() as FunctionId;
        let strings = &self.model.model.strings;
        self.functions.push(Function {
            name: strings.get(name).to_string(),
            module: strings.get(module).to_string(),
        });
        self.function_ids.insert((name, module), id);
        id
    }

    /// What a stack counts for, as the report's top table counts it: self time to the
    /// innermost frame that was not inlined, totals once per function, `[truncated]`
    /// in neither.
    fn counted(&mut self, stack: Option<StackIndex>) -> Rc<Counted> {
        if let Some(counted) = self.counted.get(&stack) {
            return counted.clone();
        }
        let mut frames = Vec::new();
        self.model.model.stack_frames(stack, &mut frames);
        let no_module = self.model.model.strings.len() as StringIndex;
        let mut keys = Vec::with_capacity(frames.len());
        let mut self_key = None;
        for &frame in &frames {
            let model = &self.model.model;
            let row = &model.frames[frame as usize];
            if row.kind == FrameKind::Truncated {
                continue;
            }
            let module = model.module_of(frame).map_or(no_module, |m| m.name);
            if row.inline_depth == 0 {
                self_key = Some((row.function, module));
            }
            keys.push((row.function, module));
        }
        // Glass's own frames have no module: an empty name.
        let empty = self.model.model.strings.intern("");
        let id = |live: &mut Live, (name, module): (StringIndex, StringIndex)| {
            live.function(name, if module == no_module { empty } else { module })
        };
        let self_function = self_key.map(|key| id(self, key));
        let mut functions: Vec<FunctionId> = keys.into_iter().map(|key| id(self, key)).collect();
        functions.sort_unstable();
        functions.dedup();
        let counted = Rc::new(Counted {
            self_function,
            functions: functions.into(),
        });
        self.counted.insert(stack, counted.clone());
        counted
    }

    /// The window's table, `view` and `sort` as the user chose.
    pub fn table(&mut self, view: ThreadView, sort: SortKey) -> Table {
        self.prune();
        let (window, ticks, now_ns, progress) = self.shown();
        let mut counts: HashMap<(Option<u32>, FunctionId), (u64, u64)> = HashMap::new();
        let mut samples = 0;
        for sample in &window {
            let thread = match view {
                ThreadView::All => None,
                ThreadView::Split => Some(sample.tid),
                ThreadView::One(tid) if tid == sample.tid => Some(tid),
                ThreadView::One(_) => continue,
            };
            samples += sample.weight;
            let counted = self.counted(sample.stack);
            if let Some(function) = counted.self_function {
                counts.entry((thread, function)).or_default().0 += sample.weight;
            }
            for &function in counted.functions.iter() {
                counts.entry((thread, function)).or_default().1 += sample.weight;
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
        Table {
            rows,
            samples,
            window_samples: window.iter().map(|s| s.weight).sum(),
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
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use glass_format::SAMPLE_HALTED;
    use glass_report::{HALTED_FRAME, UNKNOWN_FRAME};

    fn sample(time_s: u64, tid: u32, flags: u8) -> Message {
        Message::Sample(Sample {
            time_ns: time_s * 1_000_000_000,
            pid: 7,
            tid,
            stopped_ns: 0,
            flags,
            frames: vec![0x1000, 0x2000].into(),
            python: Box::default(),
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
