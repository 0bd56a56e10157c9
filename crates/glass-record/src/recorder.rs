//! Everything a recording does after a sample is taken, whatever backend took it: the
//! sink backends hand their events to. It composes one part per concern, each in a
//! module of its own: each process's module map and unwind tables (`modules`), the
//! walks over stack copies and the compaction of `--capture raw` (`walk`), the
//! threads met (`threads`), the kernel frames to name at the end (`kernel`),
//! off-CPU time (`off_cpu`), the JIT files and vDSOs to keep (`jit`), what became
//! of Python frames (`python`), and the cost statistics (`cost`); the sink writes
//! the records ([`Output`]) and flushes them. Nothing here runs while the target is
//! stopped.

mod cost;
mod jit;
mod kernel;
mod modules;
mod off_cpu;
mod output;
mod python;
mod threads;
mod walk;

use std::io;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use glass_format::{
    Arch, Backend, GuestRam, Meta, Process, ProcessKind, PyCode, PyStack, Snapshot, Summary,
    Thread, ThreadExit, ThreadLost,
};
use glass_target::procfs::{self, Mapping};
use glass_unwind::orc::OrcTable;
use glass_unwind::UnwindRegs;

use crate::event::Event;
use crate::{CaptureMode, Notes, RecordOptions};
use cost::Cost;
use jit::JitFiles;
use kernel::KernelFrames;
use modules::ModuleMaps;
use off_cpu::OffCpuTime;
pub use output::{Output, Progress};
use python::PythonFrames;
use threads::Threads;
use walk::{StackCopy, StackWalker};

/// Written samples reach the file at least this often (checked after each sample, so
/// after the target runs again): a glass killed mid-recording loses at most this much
/// plus one tick (the backends' idle waits flush too).
const FLUSH_PERIOD: Duration = Duration::from_millis(250);

/// The sink. Its public fields are what every backend reads, given to [`Recorder::new`]
/// and never set after; what backends tell it goes through its methods.
pub struct Recorder<'a> {
    pub args: &'a RecordOptions,
    /// Where warnings and figures go (the CLI prints them on stderr).
    pub notes: &'a mut dyn Notes,
    /// The instant sample times count from.
    pub origin: Instant,
    /// The longest one stop of the target may last before the guardian frees it
    /// (GLASS_STOP_BOUND_MS; see `crate::stop_bound`).
    pub stop_bound: Duration,
    writer: Box<dyn Output + 'a>,
    modules: ModuleMaps,
    walker: StackWalker,
    threads: Threads,
    kernel: KernelFrames,
    off_cpu: OffCpuTime,
    jit: JitFiles,
    python: PythonFrames,
    cost: Cost,
    /// The samples are of host processes: module maps may be refreshed from /proc, and
    /// JIT files and vDSOs read there (not for VM guests).
    use_proc: bool,
    /// The current sample's frames (reused buffer).
    frames: Vec<u64>,
    /// When the file was last flushed, in ns since the origin: compared with each
    /// sample's own time, so that no sample reads the clock for it (in a Xen PV dom0
    /// every clock read is a system call).
    last_flush_ns: u64,
    /// The output file's name until the target is reached, and the path it then takes
    /// ([`Recorder::name_output_when_started`]).
    pending_name: Option<(PathBuf, PathBuf)>,
}

impl<'a> Recorder<'a> {
    pub fn new(
        args: &'a RecordOptions,
        writer: Box<dyn Output + 'a>,
        notes: &'a mut dyn Notes,
        stop_bound: Duration,
    ) -> Self {
        Recorder {
            args,
            notes,
            origin: Instant::now(),
            stop_bound,
            writer,
            modules: ModuleMaps::new(args.unwind),
            walker: StackWalker::new(args.unwind, args.max_depth as usize),
            threads: Threads::default(),
            kernel: KernelFrames::default(),
            off_cpu: OffCpuTime::default(),
            jit: JitFiles::default(),
            python: PythonFrames::default(),
            cost: Cost::default(),
            use_proc: true,
            frames: Vec::with_capacity(args.max_depth as usize + 1),
            last_flush_ns: 0,
            pending_name: None,
        }
    }

    /// Renames the file the records go to, `from`, to `to` when the Meta record is
    /// written: the target is reached, and this run's recording takes the path.
    pub fn name_output_when_started(&mut self, from: PathBuf, to: PathBuf) {
        self.pending_name = Some((from, to));
    }

    /// The samples are not of host processes: module maps come only from the caller.
    pub fn without_proc(&mut self) {
        self.use_proc = false;
    }

    /// The sampling loop starts (after the set-up: launch, attach, perf events).
    pub fn sampling_began(&mut self) {
        self.cost.sampling_began(self.now_ns());
    }

    /// The sampling loop ended (the duration elapsed, the target exited, ...).
    pub fn sampling_ended(&mut self) {
        self.cost.sampling_ended(self.now_ns());
    }

    /// When the sampling loop began and ended, in ns since the origin.
    pub fn sampling_window(&self) -> (Option<u64>, Option<u64>) {
        self.cost.sampling_window()
    }

    pub fn now_ns(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    pub fn ns_since_origin(&self, instant: Instant) -> u64 {
        instant.saturating_duration_since(self.origin).as_nanos() as u64
    }

    pub fn write_meta(
        &mut self,
        backend: Backend,
        arch: Arch,
        unwind: &str,
        target_pid: i32,
    ) -> io::Result<()> {
        // The wall-clock time of the origin sample times count from (the backend may have
        // spent a while connecting before it writes the meta): start + time is when a
        // sample was taken.
        let start_unix_ns = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| (d.as_nanos() as u64).saturating_sub(self.now_ns()))
            .unwrap_or(0);
        if let Some((from, to)) = self.pending_name.take() {
            std::fs::rename(&from, &to)?;
        }
        self.modules.set_arch(arch);
        let capture = match self.args.capture {
            CaptureMode::Frames => "frames",
            CaptureMode::Raw => "raw",
        };
        self.writer.meta(&Meta {
            start_unix_ns,
            backend,
            arch,
            unwind: unwind.into(),
            frequency_hz: self.args.frequency,
            max_depth: self.args.max_depth,
            target_pid: target_pid as u32,
            command: self.args.command.clone(),
            hostname: std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_default(),
            glass_version: env!("CARGO_PKG_VERSION").into(),
            capture: capture.into(),
        })
    }

    /// Consumes one event of a backend. For a [`Event::Stack`] sample, returns how many
    /// bytes of stack the unwinder wanted, so the backend can copy enough next time
    /// (0 otherwise).
    pub fn handle(&mut self, event: Event) -> io::Result<usize> {
        match event {
            Event::Process {
                pid,
                parent,
                kind,
                time_ns,
                name,
                read_maps,
            } => {
                let name = name.unwrap_or_else(|| procfs::thread_name(pid, pid));
                self.process_named(pid, parent, kind, time_ns, read_maps, name)?;
            }
            Event::Mapping {
                pid,
                mapping,
                time_ns,
            } => self.add_mapping(pid, mapping, time_ns)?,
            Event::Thread { pid, tid, name } => match name {
                Some(name) => self.thread_name(pid, tid, name)?,
                None => self.thread(pid, tid)?,
            },
            Event::ThreadExit { pid, tid, time_ns } => self.thread_exit(pid, tid, time_ns)?,
            Event::GuestTask(task) => self.writer.guest_task(&task)?,
            Event::ProcessExit { pid } => self.modules.forget(pid),
            Event::Frames {
                pid,
                tid,
                time_ns,
                stopped_ns,
                flags,
                frames,
            } => self.frames_sample(pid, tid, time_ns, stopped_ns, flags, frames)?,
            Event::Stack {
                pid,
                tid,
                time_ns,
                stopped_ns,
                flags,
                regs,
                stack,
                other_stacks,
                space,
            } => {
                let copy = StackCopy {
                    regs,
                    bytes: stack,
                    other: other_stacks,
                    space,
                };
                return self.stack_sample(pid, tid, time_ns, stopped_ns, flags, &copy, &[]);
            }
        }
        Ok(0)
    }

    /// A process appears, named. For an attached or exec'd process with `read_maps`,
    /// its mappings are read from /proc now; otherwise they arrive as mapping events.
    fn process_named(
        &mut self,
        pid: i32,
        parent: i32,
        kind: ProcessKind,
        time_ns: u64,
        read_maps: bool,
        name: String,
    ) -> io::Result<()> {
        self.threads.process_seen(pid);
        self.writer.process(&Process {
            time_ns,
            pid: pid as u32,
            parent_pid: parent.max(0) as u32,
            kind,
            name,
        })?;
        self.modules.process_appears(pid, parent, kind);
        if kind != ProcessKind::Forked {
            self.threads.process_replaced(pid);
            if read_maps {
                self.refresh_modules(pid, time_ns)?;
            }
        }
        Ok(())
    }

    /// Re-reads /proc/PID/maps and records the mappings the file does not have yet.
    fn refresh_modules(&mut self, pid: i32, time_ns: u64) -> io::Result<()> {
        let Ok(current) = procfs::executable_mappings(pid) else {
            return Ok(());
        };
        self.modules.refreshing(pid);
        for mapping in current {
            self.add_mapping(pid, mapping, time_ns)?;
        }
        Ok(())
    }

    /// Records one executable mapping (if new) and loads its unwind tables.
    fn add_mapping(&mut self, pid: i32, mapping: Mapping, time_ns: u64) -> io::Result<()> {
        if self.modules.has(pid, &mapping) {
            return Ok(());
        }
        self.jit.mapped(pid, &mapping, self.use_proc);
        self.modules.add(pid, mapping, time_ns, &mut *self.writer)
    }

    /// Re-reads the module map (rate limited) when a sample holds an address outside
    /// every known mapping: that is how code mapped after the start (the libraries the
    /// dynamic loader maps, dlopen, a JIT) gets into the recording.
    fn check_modules(&mut self, pid: i32, frames: &[u64]) -> io::Result<()> {
        if self.use_proc && self.modules.wants_refresh(pid, frames) {
            self.refresh_modules(pid, self.now_ns())?;
        }
        Ok(())
    }

    fn thread(&mut self, pid: i32, tid: i32) -> io::Result<()> {
        self.threads.seen(tid);
        self.thread_name(pid, tid, procfs::thread_name(pid, tid))
    }

    fn thread_name(&mut self, pid: i32, tid: i32, name: String) -> io::Result<()> {
        if !self.threads.is_new_name(tid, &name) {
            return Ok(());
        }
        self.writer.thread(&Thread {
            time_ns: self.now_ns(),
            pid: pid as u32,
            tid: tid as u32,
            name: name.clone(),
        })?;
        self.threads.named(tid, name);
        Ok(())
    }

    /// How many threads have samples (of all those seen).
    pub fn threads_sampled(&self) -> u32 {
        self.threads.sampled_count()
    }

    pub fn knows_thread(&self, tid: i32) -> bool {
        self.threads.is_named(tid)
    }

    /// Threads often name themselves after they start: write names that changed.
    pub fn refresh_thread_names(&mut self, threads: &[(i32, i32)]) -> io::Result<()> {
        for &(pid, tid) in threads {
            self.thread_name(pid, tid, procfs::thread_name(pid, tid))?;
        }
        Ok(())
    }

    fn thread_exit(&mut self, pid: i32, tid: i32, time_ns: u64) -> io::Result<()> {
        self.writer.thread_exit(&ThreadExit {
            time_ns,
            pid: pid as u32,
            tid: tid as u32,
        })
    }

    /// The kernel dropped `count` samples, said with `tid`'s next record.
    pub fn lost_by(&mut self, pid: i32, tid: i32, count: u64) {
        self.cost.lost(count);
        self.threads.lost_by(pid, tid, count);
    }

    /// Samples lost that no thread is told for (a thread that could not be stopped or
    /// read in time).
    pub fn samples_lost(&mut self, count: u64) {
        self.cost.lost(count);
    }

    /// Samples lost per thread, most first: (pid, tid, thread name, count).
    pub fn lost_by_thread(&self) -> Vec<(i32, i32, String, u64)> {
        self.threads.lost_by_thread()
    }

    /// The sampling loop missed `count` ticks' deadlines (it woke too late to take them).
    pub fn deadlines_missed(&mut self, count: u64) {
        self.cost.missed_deadlines(count);
    }

    pub fn tick(&mut self, stopped_ns: u64) {
        let now = self.now_ns();
        self.tick_at(stopped_ns, now);
    }

    /// [`Recorder::tick`] for a caller that knows the time (ns since the origin) the
    /// stop ended: one clock read fewer per sample.
    pub fn tick_at(&mut self, stopped_ns: u64, time_ns: u64) {
        self.cost.tick(stopped_ns);
        self.progress_at(Some(stopped_ns), time_ns);
    }

    /// Ticks so far: a backend's clock for what it checks once a tick.
    pub fn ticks(&self) -> u64 {
        self.cost.ticks()
    }

    fn progress(&mut self, tick_stopped_ns: Option<u64>) {
        let now = self.now_ns();
        self.progress_at(tick_stopped_ns, now);
    }

    fn progress_at(&mut self, tick_stopped_ns: Option<u64>, time_ns: u64) {
        let progress = self.cost.progress(tick_stopped_ns, time_ns);
        self.writer.progress(&progress);
    }

    /// A Python code object (before the first Python frames that name it).
    pub fn py_code(&mut self, code: &PyCode) -> io::Result<()> {
        self.writer.py_code(code)
    }

    /// The Python frames of the sample just written.
    pub fn py_stack(&mut self, stack: &PyStack) -> io::Result<()> {
        self.writer.py_stack(stack)
    }

    /// The ptrace backend's line on what became of Python frames (None: no Python met,
    /// or not asked), for the recording's figures.
    pub fn python_frames_outcome(&mut self, outcome: Option<String>) {
        self.python.set_outcome(outcome);
    }

    /// What became of Python frames, for the recording's figures.
    pub fn python_outcome(&self) -> Option<String> {
        self.python.outcome()
    }

    /// x86-64, a frame-pointer walk made while the thread was stopped (`frames`): a
    /// sample in a function without a frame (yet) has its caller skipped by the chain;
    /// it is taken from the return address at the stack pointer (`top`: the words at
    /// `regs.sp` and above), as for a stack copy's walk.
    pub fn recover_leaf_caller(
        &mut self,
        pid: i32,
        regs: UnwindRegs,
        top: [Option<u64>; 2],
        frames: &mut Vec<u64>,
    ) -> io::Result<()> {
        if self.modules.arch() != Arch::X86_64 || frames.is_empty() {
            return Ok(());
        }
        self.check_modules(pid, frames)?;
        let space = self.modules.space(pid);
        self.walker.recover_leaf_caller(space, regs, top, frames);
        Ok(())
    }

    /// A sample already unwound (the frame-pointer walk in the stopped window).
    fn frames_sample(
        &mut self,
        pid: i32,
        tid: i32,
        time_ns: u64,
        stopped_ns: u32,
        flags: u8,
        frames: &[u64],
    ) -> io::Result<()> {
        self.check_modules(pid, frames)?;
        self.writer
            .sample(time_ns, pid as u32, tid as u32, stopped_ns, flags, frames)?;
        self.cost.sample();
        self.threads.sampled(tid);
        self.flush_if_due(time_ns)
    }

    /// A sample holding registers and a copy of the stack from `regs.sp`, with the
    /// kernel's frames of the sample (innermost first), which go before the user frames
    /// (`--capture raw` keeps none). Unwinds it (or, with `--capture raw`, compacts and
    /// stores it). Returns how many bytes of stack the unwinder wanted, so the backend
    /// can copy enough next time.
    #[allow(clippy::too_many_arguments)]
    pub fn stack_sample_with_kernel(
        &mut self,
        pid: i32,
        tid: i32,
        time_ns: u64,
        stopped_ns: u32,
        state_flags: u8,
        regs: UnwindRegs,
        stack: &[u8],
        kernel: &[u64],
    ) -> io::Result<usize> {
        let copy = StackCopy {
            regs,
            bytes: stack,
            other: &[],
            space: None,
        };
        self.stack_sample(pid, tid, time_ns, stopped_ns, state_flags, &copy, kernel)
    }

    /// [`Recorder::stack_sample_with_kernel`] for any stack copy.
    #[allow(clippy::too_many_arguments)]
    fn stack_sample(
        &mut self,
        pid: i32,
        tid: i32,
        time_ns: u64,
        stopped_ns: u32,
        state_flags: u8,
        copy: &StackCopy,
        kernel: &[u64],
    ) -> io::Result<usize> {
        let mut frames = std::mem::take(&mut self.frames);
        frames.clear();
        if self.args.capture == CaptureMode::Frames {
            self.kernel.note(kernel);
            frames.extend_from_slice(kernel);
        }
        let (truncated, wanted) = self.walk(pid, copy, &mut frames);
        let flags = state_flags | truncated;
        let result = match self.args.capture {
            CaptureMode::Frames => {
                self.frames_sample(pid, tid, time_ns, stopped_ns, flags, &frames)
            }
            CaptureMode::Raw => {
                self.raw_sample(pid, tid, time_ns, stopped_ns, state_flags, copy, &frames)
            }
        };
        self.frames = frames;
        result.map(|()| wanted)
    }

    /// Unwinds `copy` (a sample of `pid`) after whatever `frames` holds; returns the
    /// sample's truncation flags and how many bytes of stack the walk wanted.
    fn walk(&mut self, pid: i32, copy: &StackCopy, frames: &mut Vec<u64>) -> (u8, usize) {
        let arch = self.modules.arch();
        let space = self.modules.space(copy.space.unwrap_or(pid));
        self.walker.walk(space, arch, copy, frames)
    }

    /// Unwinds a stack of `pid` in place while its target is stopped, reading it a word
    /// at a time (`read_word`), into `frames` (cleared first); returns the sample's
    /// truncation flags. The frames are then recorded as a [`Event::Frames`] sample once
    /// the target runs again.
    pub fn walk_live(
        &mut self,
        pid: i32,
        regs: UnwindRegs,
        read_word: &mut dyn FnMut(u64) -> Option<u64>,
        frames: &mut Vec<u64>,
    ) -> u8 {
        frames.clear();
        let arch = self.modules.arch();
        let space = self.modules.space(pid);
        self.walker.walk_live(space, arch, regs, read_word, frames)
    }

    /// A walk in place made only to warm the caches for the next stop's
    /// ([`walk::StackWalker::warm`]): the target runs, nothing is recorded.
    pub fn warm_live(
        &mut self,
        pid: i32,
        regs: UnwindRegs,
        read_word: &mut dyn FnMut(u64) -> Option<u64>,
    ) {
        let arch = self.modules.arch();
        let space = self.modules.space(pid);
        self.walker.warm(space, arch, regs, read_word);
    }

    /// Whether in-place walks followed frame records or CFI, and why (None if none
    /// were made with `--unwind auto`).
    pub fn in_place_walks_figure(&self) -> Option<String> {
        self.walker.frame_records_figure()
    }

    /// Walks made in place ([`Recorder::walk_live`]) that met memory they could not read.
    pub fn live_walks_unreadable(&self) -> u64 {
        self.walker.live_walks_unreadable()
    }

    /// Records where a VM guest's RAM is read from.
    pub fn guest_ram(&mut self, ram: &GuestRam) -> io::Result<()> {
        self.writer.guest_ram(ram)
    }

    /// A Linux guest kernel's ORC tables (with its modules' where read): the kernel pcs
    /// they cover are walked with them from here on.
    pub fn walk_guest_kernel_with(&mut self, table: OrcTable) {
        self.walker.walk_guest_kernel_with(table);
    }

    /// Walks that wanted stack memory outside every copy (another stack than the one
    /// copied): cut, though not by the copy's length.
    pub fn walks_outside_copies(&self) -> u64 {
        self.walker.walks_outside_copies()
    }

    /// Warns now and keeps the warning in the recording, for every report to repeat.
    pub fn warn_kept(&mut self, warning: &str) -> io::Result<()> {
        self.notes.warn(warning);
        self.writer.note(warning)
    }

    /// Samples that held kernel frames.
    pub fn kernel_samples(&self) -> u64 {
        self.kernel.samples()
    }

    /// perf backend: kernel stacks are recorded, or why not (said in the recording's
    /// figures).
    pub fn kernel_stacks_recorded(&mut self, recorded: Result<(), String>) {
        self.kernel.set_recorded(recorded);
    }

    /// Whether kernel stacks were recorded (with how many samples held kernel frames),
    /// or why not; None where the backend does not say.
    pub fn kernel_stacks(&self) -> Option<Result<u64, String>> {
        self.kernel.recorded()
    }

    /// Unwinds a blocked thread's stack (kernel frames first) into `frames`, for an
    /// off-CPU sample written when the block's length is known; returns the flags.
    pub fn unwind_blocked(
        &mut self,
        pid: i32,
        regs: UnwindRegs,
        stack: &[u8],
        kernel: &[u64],
        frames: &mut Vec<u64>,
    ) -> u8 {
        frames.clear();
        self.kernel.note(kernel);
        frames.extend_from_slice(kernel);
        let copy = StackCopy {
            regs,
            bytes: stack,
            other: &[],
            space: None,
        };
        let (truncated, _) = self.walk(pid, &copy, frames);
        glass_format::SAMPLE_OFF_CPU | truncated
    }

    /// An off-CPU sample: `frames` blocked for `blocked_ns` from `time_ns` (written as
    /// several samples when that does not fit the record's 32-bit field).
    pub fn off_cpu_sample(
        &mut self,
        pid: i32,
        tid: i32,
        time_ns: u64,
        blocked_ns: u64,
        flags: u8,
        frames: &[u64],
    ) -> io::Result<()> {
        for (at, part) in OffCpuTime::parts(time_ns, blocked_ns) {
            self.frames_sample(pid, tid, at, part, flags, frames)?;
            self.off_cpu.written(part);
        }
        Ok(())
    }

    /// Off-CPU samples written, and the time they stand for.
    pub fn off_cpu(&self) -> (u64, u64) {
        self.off_cpu.counts()
    }

    /// A `--capture raw` sample: the registers and the compacted stack (`frames`, the
    /// unwind just made, tells which modules the stack touches).
    #[allow(clippy::too_many_arguments)]
    fn raw_sample(
        &mut self,
        pid: i32,
        tid: i32,
        time_ns: u64,
        stopped_ns: u32,
        state_flags: u8,
        copy: &StackCopy,
        frames: &[u64],
    ) -> io::Result<()> {
        // The unwind above only told which modules the stack touches.
        self.check_modules(pid, frames)?;
        let regs = copy.regs;
        let stack = self
            .walker
            .compact(self.modules.space(pid), regs, copy.bytes);
        let written = self.writer.snapshot(&Snapshot {
            time_ns,
            pid: pid as u32,
            tid: tid as u32,
            stopped_ns,
            flags: state_flags,
            ip: regs.ip,
            sp: regs.sp,
            fp: regs.fp,
            lr: regs.lr,
            stack,
        });
        self.cost.sample();
        self.threads.sampled(tid);
        written.and_then(|()| self.flush_if_due(time_ns))
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.last_flush_ns = self.now_ns();
        self.progress(None);
        self.writer.flush()
    }

    /// Flushes when a flush period has passed by the time of the sample just written.
    fn flush_if_due(&mut self, time_ns: u64) -> io::Result<()> {
        if time_ns.saturating_sub(self.last_flush_ns) >= FLUSH_PERIOD.as_nanos() as u64 {
            self.flush()?;
        }
        Ok(())
    }

    pub fn summary(&self, exit_status: Option<i32>) -> Summary {
        Summary {
            duration_ns: self.now_ns(),
            threads: self.threads.seen_count(),
            processes: self.threads.process_count(),
            exit_status: exit_status.unwrap_or(-1),
            ..self.cost.summary()
        }
    }

    /// Writes the copies of the JIT files, the summary and the end marker.
    pub fn finish(&mut self, summary: &Summary) -> io::Result<()> {
        if self.use_proc {
            self.jit
                .keep(&mut *self.writer, &self.threads.processes())?;
        }
        self.kernel.write_symbols(&mut *self.writer)?;
        for (pid, tid, _, count) in self.lost_by_thread() {
            self.writer.thread_lost(&ThreadLost {
                pid: pid as u32,
                tid: tid as u32,
                count,
            })?;
        }
        self.writer.summary(summary)?;
        self.writer.end()
    }
}

#[cfg(test)]
mod tests;
