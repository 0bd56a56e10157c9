//! The ptrace backend: sample a Linux process (every thread, and every child it forks)
//! by stopping each thread with `PTRACE_INTERRUPT`, copying its registers and stack, and
//! resuming it at once.
//!
//! Threads are attached with `PTRACE_SEIZE`, which does not stop them, and with
//! `TRACECLONE`/`TRACEFORK`/`TRACEVFORK`/`TRACEEXEC` so that threads and processes that
//! appear later are attached by the kernel before they run their first instruction.
//! Everything else ptrace reports (signals, group-stops, exits, execs) is handled here
//! so that the target behaves exactly as it would untraced: signals are re-delivered,
//! job-control stops stay stopped (`PTRACE_LISTEN`), exits are noticed.
//!
//! The stop bound: glass's own `PTRACE_INTERRUPT` cannot be undone by another process,
//! but the kernel releases every tracee of a tracer that dies. So each tick is marked in
//! a [`StopMark`] shared with glass's guardian (from just before the first interrupt to
//! after the last resume), and a tick waits for its threads to stop at most half the
//! bound (50 ms by default, GLASS_STOP_BOUND_MS): a tick ends within the bound by
//! design, and a glass that does not end one (stopped by SIGSTOP or Ctrl-Z, stalled) is
//! SIGKILLed by the guardian once the bound has passed, which lets the threads run.
//! Between ticks glass holds nothing of its own; a thread that needs its tracer then
//! (a signal, a clone, an exec) waits for glass to serve it.
//!
//! Raw libc calls rather than nix's wrappers: nix's `Signal` cannot carry real-time
//! signals, and a profiler must re-deliver every signal it intercepts.

use std::collections::HashMap;
use std::io;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use glass_unwind::{walk_frame_pointers, RemoteMemory, StackWindow, UnwindRegs};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

use crate::python::{PyProcess, PyRawFrame, PyRead};
use crate::regs;
use crate::stop_mark::StopMark;
use crate::TargetError;

const OPTIONS: libc::c_int = libc::PTRACE_O_TRACECLONE
    | libc::PTRACE_O_TRACEFORK
    | libc::PTRACE_O_TRACEVFORK
    | libc::PTRACE_O_TRACEEXEC;

/// A thread that does not stop within this time is skipped for this tick (counted as a
/// lost sample); its stop is handled whenever it arrives. With a stop mark, at most half
/// the stop bound (see [`ProcessTarget::set_stop_mark`]).
const STOP_TIMEOUT: Duration = Duration::from_millis(250);
/// How long to poll for a stop before sleeping until one is reported.
const SPIN_BUDGET: Duration = Duration::from_micros(30);

/// Something that happened to the target, for the recording.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetEvent {
    ThreadStarted {
        pid: i32,
        tid: i32,
    },
    ThreadExited {
        pid: i32,
        tid: i32,
    },
    ProcessForked {
        parent: i32,
        child: i32,
    },
    /// The process replaced its program: its earlier mappings are gone.
    ProcessExec {
        pid: i32,
    },
    /// `status` as a shell reports it: the exit code, or 128 + the killing signal.
    ProcessExited {
        pid: i32,
        status: i32,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RunState {
    /// Attached by the kernel; its first stop has not been seen yet.
    Starting,
    Running,
    /// In a job-control stop (SIGSTOP and friends), held there with PTRACE_LISTEN.
    GroupStopped,
}

struct ThreadState {
    pid: i32,
    run: RunState,
    window: StackWindow,
    /// Bytes of stack to copy in [`Capture::StackCopy`], learned from unwinding.
    stack_copy: usize,
}

impl ThreadState {
    fn new(pid: i32, run: RunState) -> Self {
        ThreadState {
            pid,
            run,
            window: StackWindow::new(),
            stack_copy: DEFAULT_STACK_COPY,
        }
    }
}

/// One sampled thread of a tick; its frames are `frames[first..first + count]` of the
/// tick's arena.
#[derive(Debug, Clone, Copy)]
pub struct SampleHeader {
    pub pid: i32,
    pub tid: i32,
    /// Since the sampler's clock origin.
    pub time_ns: u64,
    pub stopped_ns: u32,
    pub truncated: bool,
    pub in_syscall: bool,
    pub regs: UnwindRegs,
    /// Walked frames: `frames[first..first + count]` of the tick.
    pub first: usize,
    pub count: usize,
    /// Copied stack from `regs.sp`: `stack[stack_first..stack_first + stack_len]`.
    pub stack_first: usize,
    pub stack_len: usize,
    /// Python frames: `py_frames[py_first..py_first + py_count]` of the tick.
    pub py_first: usize,
    pub py_count: usize,
    pub py_read: PyRead,
    /// Of `stopped_ns`, the time reading the Python frames took.
    pub py_ns: u32,
    /// Frame-pointer walks: the words at the stack pointer and above it.
    pub top: [Option<u64>; 2],
}

/// What a tick keeps of each stopped thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capture {
    /// Walk the frame-pointer chain while the thread is stopped; keep the addresses.
    FramePointers { max_depth: usize },
    /// Copy the registers and the top of the stack; unwinding happens after resume.
    StackCopy,
}

/// The stack copied per thread at first, and the most a copy grows to.
pub const DEFAULT_STACK_COPY: usize = 16 << 10;
pub const MAX_STACK_COPY: usize = 256 << 10;

/// The samples of one tick. Reused from tick to tick so the sample path does not
/// allocate once the buffers have grown.
#[derive(Default)]
pub struct Tick {
    pub samples: Vec<SampleHeader>,
    pub frames: Vec<u64>,
    pub stack: Vec<u8>,
    pub py_frames: Vec<PyRawFrame>,
    /// From the first interrupt to the last resume: the time some thread of the target
    /// was stopped by this tick.
    pub stopped_ns: u64,
    /// Threads that did not stop in time or could not be read.
    pub lost: u32,
}

impl Tick {
    pub fn frames_of(&self, sample: &SampleHeader) -> &[u64] {
        &self.frames[sample.first..sample.first + sample.count]
    }

    pub fn stack_of(&self, sample: &SampleHeader) -> &[u8] {
        &self.stack[sample.stack_first..sample.stack_first + sample.stack_len]
    }

    pub fn python_of(&self, sample: &SampleHeader) -> &[PyRawFrame] {
        &self.py_frames[sample.py_first..sample.py_first + sample.py_count]
    }
}

/// Reads a process's memory with one `process_vm_readv` per request, split into
/// page-sized pieces so that a read running into an unmapped page still returns every
/// byte before it.
struct ProcessMemory {
    pid: i32,
}

impl RemoteMemory for ProcessMemory {
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> usize {
        const PAGE: u64 = 4096;
        const MAX_PIECES: usize = 256;
        let mut remote = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; MAX_PIECES];
        let mut pieces = 0;
        let mut at = addr;
        let end = addr.saturating_add(buf.len() as u64);
        while at < end && pieces < MAX_PIECES {
            let piece_end = ((at / PAGE) + 1).saturating_mul(PAGE).min(end);
            remote[pieces] = libc::iovec {
                iov_base: at as *mut libc::c_void,
                iov_len: (piece_end - at) as usize,
            };
            pieces += 1;
            at = piece_end;
        }
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: (at - addr) as usize,
        };
        // SAFETY: `local` covers memory we own; the remote side is checked by the kernel.
        let n = unsafe {
            libc::process_vm_readv(
                self.pid,
                &local,
                1,
                remote.as_ptr(),
                pieces as libc::c_ulong,
                0,
            )
        };
        n.max(0) as usize
    }
}

/// A traced process tree.
pub struct ProcessTarget {
    /// The process glass launched or attached to first.
    pub leader: i32,
    threads: HashMap<i32, ThreadState>,
    /// Events with the instant they were observed.
    events: Vec<(Instant, TargetEvent)>,
    /// SIGCHLD as a file descriptor: ptrace reports arrive as SIGCHLD, so waiting for
    /// a stop with a timeout is a poll on this descriptor.
    sigchld: SignalFd,
    /// Threads interrupted by the current tick, with the instant of the interrupt.
    awaiting: HashMap<i32, Instant>,
    leader_status: Option<i32>,
    detached: bool,
    cpus: usize,
    /// The most a thread's stack copy grows to.
    stack_limit: usize,
    /// Says to the guardian when a tick began holding threads stopped (see
    /// [`ProcessTarget::set_stop_mark`]).
    stop_mark: Option<StopMark>,
    /// How long a tick waits for its threads to stop.
    stop_wait: Duration,
    /// Ticks taken so far, and GLASS_TEST_STOP_IN_SAMPLE=N (tests only): at tick N glass
    /// stops itself (SIGSTOP) as soon as a thread is stopped, so that a test finds glass
    /// stopped inside a sample by construction.
    ticks: u64,
    stop_in_sample: Option<u64>,
    /// Per process, its CPython interpreter: each stopped thread's Python frames are
    /// read before it resumes.
    python: HashMap<i32, PyProcess>,
}

fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn ptrace_raw(request: libc::c_uint, tid: i32, data: usize) -> Result<(), i32> {
    // SAFETY: requests used here take an integer `data` and no addresses.
    let result = unsafe {
        libc::ptrace(
            request,
            tid,
            std::ptr::null_mut::<libc::c_void>(),
            data as *mut libc::c_void,
        )
    };
    if result < 0 {
        Err(errno())
    } else {
        Ok(())
    }
}

fn resume(tid: i32, signal: i32) {
    // ESRCH means the thread died meanwhile; its exit is reported separately.
    let _ = ptrace_raw(libc::PTRACE_CONT, tid, signal as usize);
}

fn event_message(tid: i32) -> Option<i32> {
    let mut message: libc::c_ulong = 0;
    // SAFETY: GETEVENTMSG writes one c_ulong to `message`.
    let result = unsafe {
        libc::ptrace(
            libc::PTRACE_GETEVENTMSG,
            tid,
            std::ptr::null_mut::<libc::c_void>(),
            &mut message as *mut libc::c_ulong,
        )
    };
    (result >= 0).then_some(message as i32)
}

/// Blocks SIGCHLD in the calling thread (and threads it starts later) and returns a
/// descriptor that reads it. Must run before any other thread of glass starts.
fn sigchld_fd() -> io::Result<SignalFd> {
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGCHLD);
    mask.thread_block().map_err(io::Error::from)?;
    SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
        .map_err(io::Error::from)
}

fn seize(tid: i32) -> Result<(), i32> {
    // SAFETY: PTRACE_SEIZE takes the options in `data`.
    let result = unsafe {
        libc::ptrace(
            libc::PTRACE_SEIZE,
            tid,
            std::ptr::null_mut::<libc::c_void>(),
            OPTIONS as usize as *mut libc::c_void,
        )
    };
    if result < 0 {
        Err(errno())
    } else {
        Ok(())
    }
}

impl ProcessTarget {
    fn empty(leader: i32) -> io::Result<Self> {
        Ok(ProcessTarget {
            leader,
            threads: HashMap::new(),
            events: Vec::new(),
            sigchld: sigchld_fd()?,
            awaiting: HashMap::new(),
            leader_status: None,
            detached: false,
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            stack_limit: MAX_STACK_COPY,
            stop_mark: None,
            stop_wait: STOP_TIMEOUT,
            ticks: 0,
            stop_in_sample: std::env::var("GLASS_TEST_STOP_IN_SAMPLE")
                .ok()
                .and_then(|n| n.parse().ok()),
            python: HashMap::new(),
        })
    }

    /// Starts `argv` under the tracer. The new process is attached before it runs its
    /// first instruction of the new program.
    pub fn launch(argv: &[String]) -> Result<Self, TargetError> {
        let child = crate::launch::spawn_paused(argv)?;
        let mut target = Self::empty(child.pid).map_err(TargetError::Io)?;
        if let Err(code) = seize(child.pid) {
            let pid = child.pid;
            child.abandon();
            target.detached = true;
            return Err(TargetError::Attach(pid, code));
        }
        target
            .threads
            .insert(child.pid, ThreadState::new(child.pid, RunState::Running));
        if let Err(error) = child.release() {
            target.wait_for_exit_of_leader();
            return Err(error);
        }
        // Handle the exec stop now, so the first tick finds the new program running.
        let deadline = Instant::now() + Duration::from_secs(10);
        while target.events.is_empty() && target.leader_status.is_none() {
            let Some((tid, status)) = target.next_status(deadline) else {
                break;
            };
            if let Some(stopped) = target.on_status(tid, status) {
                resume(stopped, 0);
            }
        }
        target
            .events
            .retain(|(_, e)| !matches!(e, TargetEvent::ProcessExec { .. }));
        Ok(target)
    }

    /// Attaches to every thread of a running process without stopping it.
    pub fn attach(pid: i32) -> Result<Self, TargetError> {
        if pid <= 0 || !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            return Err(TargetError::NoSuchProcess(pid));
        }
        let mut target = Self::empty(pid).map_err(TargetError::Io)?;
        // Threads can appear while we attach: list again until no new one shows up.
        loop {
            let tids =
                crate::procfs::thread_ids(pid).map_err(|_| TargetError::NoSuchProcess(pid))?;
            let mut new = 0;
            for tid in tids {
                if target.threads.contains_key(&tid) {
                    continue;
                }
                match seize(tid) {
                    Ok(()) => {}
                    Err(libc::ESRCH) if tid != pid => continue,
                    Err(libc::ESRCH) => return Err(TargetError::NoSuchProcess(pid)),
                    // On its way out: no thread to sample.
                    Err(libc::EPERM) if tid != pid && crate::attach::exiting(pid, tid) => continue,
                    Err(libc::EPERM) => match crate::attach::tracer_of(pid, tid) {
                        // Created meanwhile by a thread seized already: the kernel seized
                        // it (TRACECLONE), and its clone event brings it in.
                        Some(tracer) if tid != pid && tracer == std::process::id() as i32 => {
                            continue
                        }
                        Some(tracer) if tracer > 0 && tracer != std::process::id() as i32 => {
                            return Err(TargetError::TracedBy(
                                pid,
                                tracer,
                                crate::attach::process_name(tracer),
                            ))
                        }
                        _ => return Err(TargetError::Attach(pid, libc::EPERM)),
                    },
                    Err(code) => return Err(TargetError::Attach(pid, code)),
                }
                new += 1;
                target
                    .threads
                    .insert(tid, ThreadState::new(pid, RunState::Running));
            }
            if new == 0 {
                break;
            }
        }
        Ok(target)
    }

    /// After a failed exec: reap the child so it does not linger.
    fn wait_for_exit_of_leader(&mut self) {
        while self.leader_status.is_none() && !self.threads.is_empty() {
            if !self.wait_once(Some(Duration::from_secs(5))) {
                break;
            }
        }
        self.detached = true;
    }

    /// The descriptor that becomes readable when the target has something to report;
    /// then call [`ProcessTarget::handle_reports`].
    pub fn report_fd(&self) -> i32 {
        self.sigchld.as_raw_fd()
    }

    /// Handles every report the kernel has queued, without blocking.
    pub fn handle_reports(&mut self) {
        while self.sigchld.read_signal().ok().flatten().is_some() {}
        while let Some((tid, status)) = wait_nohang() {
            if let Some(stopped) = self.on_status(tid, status) {
                // An interrupt stop nobody waits for any more (a tick gave up on it).
                resume(stopped, 0);
            }
        }
    }

    fn emit(&mut self, event: TargetEvent) {
        self.events.push((Instant::now(), event));
    }

    pub fn take_events(&mut self) -> std::vec::Drain<'_, (Instant, TargetEvent)> {
        self.events.drain(..)
    }

    /// Processes still traced.
    pub fn pids(&self) -> Vec<i32> {
        let mut pids: Vec<i32> = self.threads.values().map(|t| t.pid).collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// Threads currently traced, as (pid, tid).
    pub fn threads(&self) -> Vec<(i32, i32)> {
        self.threads.iter().map(|(&tid, t)| (t.pid, tid)).collect()
    }

    /// The most any thread's stack copy may grow to (`--stack-size`; default
    /// [`MAX_STACK_COPY`]).
    pub fn set_stack_limit(&mut self, bytes: usize) {
        self.stack_limit = bytes.max(64);
    }

    /// Unwinding a copied stack of `tid` needed `bytes` of it: copy that much (and a
    /// little more) from now on, up to the stack limit.
    pub fn want_stack_copy(&mut self, tid: i32, bytes: usize) {
        if let Some(thread) = self.threads.get_mut(&tid) {
            let wanted = (bytes + 4096).next_multiple_of(4096).min(self.stack_limit);
            thread.stack_copy = thread.stack_copy.max(wanted);
        }
    }

    /// Marks every tick in `mark` (shared with glass's guardian, which kills a glass that
    /// holds threads stopped for longer than `bound`: the kernel then releases them), and
    /// keeps ticks within the bound by design: a tick waits for its threads to stop at
    /// most half of it (a thread in an uninterruptible sleep stops only when the sleep
    /// ends; it is counted as a lost sample and resumed whenever its stop arrives).
    pub fn set_stop_mark(&mut self, mark: StopMark, bound: Duration) {
        self.stop_mark = Some(mark);
        self.stop_wait = STOP_TIMEOUT.min(bound / 2);
    }

    /// Reads `pid`'s Python frames at each sample from now on (None: no longer).
    pub fn set_python(&mut self, pid: i32, python: Option<PyProcess>) {
        match python {
            Some(python) => self.python.insert(pid, python),
            None => self.python.remove(&pid),
        };
    }

    /// The first process's exit status, once it has exited.
    pub fn leader_status(&self) -> Option<i32> {
        self.leader_status
    }

    /// Samples every running thread once: interrupt all, and as each one stops copy its
    /// registers and stack, walk its frame pointers, and resume it.
    pub fn sample(&mut self, tick: &mut Tick, origin: Instant, capture: Capture) {
        tick.samples.clear();
        tick.frames.clear();
        tick.stack.clear();
        tick.py_frames.clear();
        tick.lost = 0;
        tick.stopped_ns = 0;
        self.awaiting.clear();
        self.ticks += 1;
        let mut stop_here = self.stop_in_sample == Some(self.ticks);
        if let Some(mark) = &self.stop_mark {
            mark.begin();
        }
        let first_interrupt = Instant::now();
        for (&tid, thread) in &self.threads {
            if thread.run == RunState::Running && ptrace_raw(libc::PTRACE_INTERRUPT, tid, 0).is_ok()
            {
                self.awaiting.insert(tid, Instant::now());
            }
        }
        let mut last_resume = first_interrupt;
        let deadline = first_interrupt + self.stop_wait;
        while !self.awaiting.is_empty() {
            let Some((tid, status)) = self.next_status(deadline) else {
                tick.lost += self.awaiting.len() as u32;
                self.awaiting.clear();
                break;
            };
            let Some(tid) = self.on_status(tid, status) else {
                continue;
            };
            let Some(interrupted_at) = self.awaiting.remove(&tid) else {
                resume(tid, 0);
                continue;
            };
            if std::mem::take(&mut stop_here) {
                // SAFETY: raising a signal at ourselves (the test hook above).
                unsafe { libc::raise(libc::SIGSTOP) };
            }
            let Some(thread) = self.threads.get_mut(&tid) else {
                resume(tid, 0);
                continue;
            };
            let stopped_at = Instant::now();
            match regs::read(tid) {
                Ok(registers) => {
                    let mut memory = ProcessMemory { pid: thread.pid };
                    let first = tick.frames.len();
                    let stack_first = tick.stack.len();
                    let mut truncated = false;
                    let mut top = [None; 2];
                    match capture {
                        Capture::FramePointers { max_depth } => {
                            thread.window.fill(&mut memory, registers.unwind.sp);
                            let end = walk_frame_pointers(
                                registers.unwind,
                                &mut thread.window,
                                &mut memory,
                                max_depth,
                                &mut tick.frames,
                            );
                            truncated = end.is_truncated();
                            // The stack pointer's words, for a leaf without a frame
                            // (read from the window the walk filled: no more reads).
                            top = [
                                thread.window.word(&mut memory, registers.unwind.sp),
                                thread.window.word(&mut memory, registers.unwind.sp + 8),
                            ];
                        }
                        Capture::StackCopy => {
                            tick.stack
                                .resize(stack_first + thread.stack_copy.min(self.stack_limit), 0);
                            let got =
                                memory.read(registers.unwind.sp, &mut tick.stack[stack_first..]);
                            tick.stack.truncate(stack_first + got);
                        }
                    }
                    let py_first = tick.py_frames.len();
                    let (py_read, py_ns) = match self.python.get_mut(&thread.pid) {
                        Some(python) => {
                            let began = Instant::now();
                            let read = python.read_chain(&mut memory, tid, &mut tick.py_frames);
                            (read, began.elapsed().as_nanos() as u32)
                        }
                        None => (PyRead::None, 0),
                    };
                    resume(tid, 0);
                    let resumed = Instant::now();
                    thread.window.finish();
                    last_resume = resumed;
                    tick.samples.push(SampleHeader {
                        pid: thread.pid,
                        tid,
                        time_ns: stopped_at.duration_since(origin).as_nanos() as u64,
                        stopped_ns: resumed
                            .duration_since(interrupted_at)
                            .as_nanos()
                            .min(u32::MAX as u128) as u32,
                        truncated,
                        in_syscall: registers.in_syscall,
                        regs: registers.unwind,
                        first,
                        count: tick.frames.len() - first,
                        stack_first,
                        stack_len: tick.stack.len() - stack_first,
                        py_first,
                        py_count: tick.py_frames.len() - py_first,
                        py_read,
                        py_ns,
                        top,
                    });
                }
                Err(_) => {
                    resume(tid, 0);
                    last_resume = Instant::now();
                    tick.lost += 1;
                }
            }
        }
        if let Some(mark) = &self.stop_mark {
            mark.end();
        }
        tick.stopped_ns = last_resume
            .saturating_duration_since(first_interrupt)
            .as_nanos() as u64;
    }

    /// The next report, waiting until `deadline`.
    ///
    /// Polls without sleeping for the first [`SPIN_BUDGET`] when every awaited thread
    /// can have a core of its own: a stop then arrives within tens of microseconds, and
    /// waking from a sleep would add about as much again to the time the target stays
    /// stopped (measured here, one thread: p50 40 us sleeping, 24 us polling). When the
    /// target has more threads than free cores, an awaited thread may be queued behind
    /// the sampler itself, and spinning would only delay its stop.
    fn next_status(&mut self, deadline: Instant) -> Option<(i32, i32)> {
        let spin = self.awaiting.len() < self.cpus;
        let spin_until = Instant::now() + if spin { SPIN_BUDGET } else { Duration::ZERO };
        loop {
            if let Some(report) = wait_nohang() {
                return Some(report);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            if now < spin_until {
                std::hint::spin_loop();
                continue;
            }
            self.wait_for_sigchld(deadline - now);
        }
    }

    /// Waits for one report and handles it; false on timeout.
    fn wait_once(&mut self, timeout: Option<Duration>) -> bool {
        let deadline = Instant::now() + timeout.unwrap_or(Duration::from_secs(3600));
        match self.next_status(deadline) {
            Some((tid, status)) => {
                if let Some(stopped) = self.on_status(tid, status) {
                    resume(stopped, 0);
                }
                true
            }
            None => false,
        }
    }

    fn wait_for_sigchld(&mut self, timeout: Duration) {
        let mut fds = [libc::pollfd {
            fd: self.sigchld.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(fds.as_mut_ptr(), 1, ms) };
        while self.sigchld.read_signal().ok().flatten().is_some() {}
    }

    /// Handles one wait status. Returns the thread id when it is an interrupt stop of a
    /// running thread (left stopped for the caller); everything else is handled here
    /// and the thread resumed.
    fn on_status(&mut self, tid: i32, status: i32) -> Option<i32> {
        if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
            let code = if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                128 + libc::WTERMSIG(status)
            };
            self.thread_gone(tid, code);
            return None;
        }
        if !libc::WIFSTOPPED(status) {
            return None;
        }
        let signal = libc::WSTOPSIG(status);
        let event = (status >> 16) & 0xff;
        match event {
            0 => {
                // Signal-delivery stop: deliver the signal as if we were not here.
                if !self.threads.contains_key(&tid) {
                    self.adopt(tid);
                }
                resume(tid, signal);
                None
            }
            libc::PTRACE_EVENT_STOP => {
                let Some(thread) = self.threads.get_mut(&tid) else {
                    // A new thread's first stop, reported before its creator's event.
                    self.adopt(tid);
                    resume(tid, 0);
                    return None;
                };
                match thread.run {
                    RunState::Starting => {
                        thread.run = RunState::Running;
                        resume(tid, 0);
                        None
                    }
                    _ if signal == libc::SIGTRAP => {
                        thread.run = RunState::Running;
                        Some(tid)
                    }
                    _ => {
                        // A job-control stop: keep it stopped, but keep hearing about it.
                        thread.run = RunState::GroupStopped;
                        self.awaiting.remove(&tid);
                        let _ = ptrace_raw(libc::PTRACE_LISTEN, tid, 0);
                        None
                    }
                }
            }
            libc::PTRACE_EVENT_CLONE | libc::PTRACE_EVENT_FORK | libc::PTRACE_EVENT_VFORK => {
                let parent_pid = self.threads.get(&tid).map(|t| t.pid).unwrap_or(tid);
                if let Some(new_tid) = event_message(tid) {
                    let is_thread = event == libc::PTRACE_EVENT_CLONE
                        && crate::procfs::thread_group_of(new_tid) != Some(new_tid);
                    let pid = if is_thread { parent_pid } else { new_tid };
                    let state = self
                        .threads
                        .entry(new_tid)
                        .or_insert(ThreadState::new(pid, RunState::Starting));
                    state.pid = pid;
                    if is_thread {
                        self.emit(TargetEvent::ThreadStarted { pid, tid: new_tid });
                    } else {
                        self.emit(TargetEvent::ProcessForked {
                            parent: parent_pid,
                            child: new_tid,
                        });
                    }
                }
                resume(tid, 0);
                None
            }
            libc::PTRACE_EVENT_EXEC => {
                // After exec the process has one thread, whose id is the process id; the
                // other threads are gone without (reliably) reporting it.
                let pid = self.threads.get(&tid).map(|t| t.pid).unwrap_or(tid);
                let former = event_message(tid).unwrap_or(tid);
                self.threads
                    .retain(|&other, t| t.pid != pid || other == tid);
                if former != tid {
                    self.emit(TargetEvent::ThreadExited { pid, tid: former });
                }
                if let Some(thread) = self.threads.get_mut(&tid) {
                    thread.window = StackWindow::new();
                    thread.run = RunState::Running;
                } else {
                    self.adopt(tid);
                }
                self.emit(TargetEvent::ProcessExec { pid });
                resume(tid, 0);
                None
            }
            _ => {
                resume(tid, 0);
                None
            }
        }
    }

    /// A thread the kernel attached whose creation we have not seen yet.
    fn adopt(&mut self, tid: i32) {
        let pid = crate::procfs::thread_group_of(tid).unwrap_or(tid);
        self.threads
            .insert(tid, ThreadState::new(pid, RunState::Running));
        if pid == tid {
            self.emit(TargetEvent::ProcessForked {
                parent: 0,
                child: tid,
            });
        } else {
            self.emit(TargetEvent::ThreadStarted { pid, tid });
        }
    }

    fn thread_gone(&mut self, tid: i32, status: i32) {
        self.awaiting.remove(&tid);
        let Some(thread) = self.threads.remove(&tid) else {
            return;
        };
        let pid = thread.pid;
        if tid == pid {
            // The thread group leader reports last: the whole process is gone.
            self.threads.retain(|_, t| t.pid != pid);
            self.emit(TargetEvent::ProcessExited { pid, status });
            if pid == self.leader {
                self.leader_status = Some(status);
            }
        } else {
            self.emit(TargetEvent::ThreadExited { pid, tid });
        }
    }

    /// Lets every thread go: stops each one, detaches it (re-delivering any signal it
    /// was about to receive) and lets it run on untraced.
    pub fn detach(&mut self) {
        if self.detached {
            return;
        }
        self.detached = true;
        self.awaiting.clear();
        let tids: Vec<i32> = self.threads.keys().copied().collect();
        for &tid in &tids {
            match self.threads.get(&tid).map(|t| t.run) {
                Some(RunState::GroupStopped) => {
                    // Detaching from the listening state leaves it in its job-control stop.
                    let _ = ptrace_raw(libc::PTRACE_DETACH, tid, 0);
                    self.threads.remove(&tid);
                }
                Some(_) => {
                    let _ = ptrace_raw(libc::PTRACE_INTERRUPT, tid, 0);
                }
                None => {}
            }
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        while !self.threads.is_empty() {
            let Some((tid, status)) = self.next_status(deadline) else {
                break;
            };
            if libc::WIFSTOPPED(status) {
                let event = (status >> 16) & 0xff;
                let signal = if event == 0 {
                    libc::WSTOPSIG(status)
                } else {
                    0
                };
                if matches!(
                    event,
                    libc::PTRACE_EVENT_CLONE | libc::PTRACE_EVENT_FORK | libc::PTRACE_EVENT_VFORK
                ) {
                    // The new thread or child is attached too: it must be let go as well.
                    if let Some(new_tid) = event_message(tid) {
                        self.threads
                            .entry(new_tid)
                            .or_insert(ThreadState::new(new_tid, RunState::Starting));
                    }
                }
                let _ = ptrace_raw(libc::PTRACE_DETACH, tid, signal as usize);
                self.threads.remove(&tid);
            } else {
                self.on_status(tid, status);
            }
        }
        // Anything left did not stop in time (it is exiting, or stuck in the kernel);
        // the kernel detaches it when glass exits.
    }
}

impl Drop for ProcessTarget {
    fn drop(&mut self) {
        self.detach();
    }
}

fn wait_nohang() -> Option<(i32, i32)> {
    let mut status = 0;
    // SAFETY: waitpid writes the status word.
    let tid = unsafe { libc::waitpid(-1, &mut status, libc::__WALL | libc::WNOHANG) };
    (tid > 0).then_some((tid, status))
}
