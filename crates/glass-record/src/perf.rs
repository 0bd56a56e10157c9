//! The perf_event backend's loop: drain the kernel's rings whenever they have records,
//! and hand each sample's registers and stack copy to the sink for unwinding. glass
//! never stops the target here, so there is no tick and no stopped time to measure.
//!
//! The rings are emptied by a thread of their own ([`Drain`]) that only copies bytes out
//! and gives the space back; the recorder parses and unwinds the copies on the main
//! thread. Unwinding is cheap per sample (glass used ~6% of a CPU recording `node` at
//! 999 Hz) but not per module: `node` is a 99 MB binary whose 2.7 MB of `.eh_frame`
//! take the recorder ~140 ms to load (warm page cache), while a 1 MiB ring held 60 ms
//! of samples; rings drained by that same thread overflowed meanwhile (5-7% of a 499 Hz
//! run lost). A sample waits in glass's memory instead, bounded by [`MAX_QUEUED`].

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use glass_format::{Arch, Backend, ProcessKind};
use glass_target::launch::spawn_paused;
use glass_target::perf::{self as kernel, PerfConfig, PerfRecord, PerfSampler};
use glass_target::procfs::{self, Mapping};
use glass_target::TargetError;
use glass_unwind::UnwindRegs;
use nix::sys::signalfd::SignalFd;

use super::driver::{drive, Clock, Gathered, Sampler};
use super::event::Event;
use super::recorder::Recorder as Sink;
use super::{finish, unwind_name, Outcome};
use crate::{CaptureMode, Recorded, Result};

/// How the end of the target is noticed: our own child is reaped with waitpid; a
/// process we did not start is watched through a pidfd.
enum Watch {
    Child {
        pid: i32,
        status: Option<i32>,
    },
    Attached {
        pid: i32,
        pidfd: OwnedFd,
        exited: bool,
    },
}

impl Watch {
    fn fd(&self, sigchld: &SignalFd) -> i32 {
        match self {
            Watch::Child { .. } => sigchld.as_raw_fd(),
            Watch::Attached { pidfd, .. } => pidfd.as_raw_fd(),
        }
    }

    fn poll(&mut self, sigchld: &SignalFd) {
        match self {
            Watch::Child { pid, status } => {
                while sigchld.read_signal().ok().flatten().is_some() {}
                let mut raw = 0;
                // SAFETY: waitpid on our own child.
                if unsafe { libc::waitpid(*pid, &mut raw, libc::WNOHANG) } == *pid {
                    *status = Some(if libc::WIFEXITED(raw) {
                        libc::WEXITSTATUS(raw)
                    } else {
                        128 + libc::WTERMSIG(raw)
                    });
                }
            }
            Watch::Attached { pid, exited, .. } => {
                *exited = !std::path::Path::new(&format!("/proc/{pid}")).exists();
            }
        }
    }

    fn ended(&self) -> bool {
        match self {
            Watch::Child { status, .. } => status.is_some(),
            Watch::Attached { exited, .. } => *exited,
        }
    }

    fn exit_status(&self) -> Option<i32> {
        match self {
            Watch::Child { status, .. } => *status,
            Watch::Attached { .. } => None,
        }
    }
}

fn sigchld_fd() -> std::io::Result<SignalFd> {
    use nix::sys::signal::{SigSet, Signal};
    use nix::sys::signalfd::SfdFlags;
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGCHLD);
    mask.thread_block()?;
    Ok(SignalFd::with_flags(
        &mask,
        SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC,
    )?)
}

pub fn record(
    sink: Sink,
    stop_signals: &SignalFd,
) -> std::result::Result<Result<Recorded>, TargetError> {
    let args = sink.args;
    let sigchld = sigchld_fd().map_err(TargetError::Io)?;
    let stack_size = args.stack_size.unwrap_or(16384);
    if stack_size > 65528 {
        return Err(TargetError::BadInput(format!(
            "--stack-size {stack_size}: the perf backend copies at most 65528 bytes per sample"
        )));
    }
    let mut kernel_off = kernel_off(args);
    let config = |enable_on_exec, kernel: bool| PerfConfig {
        ring_bytes: args.ring_kib.map(|kib| kib as usize * 1024),
        kernel,
        off_cpu: kernel && args.off_cpu,
        ..PerfConfig::new(args.frequency, stack_size, enable_on_exec)
    };
    // Kernel sampling is refused to users perf_event_paranoid holds back: the recording
    // goes on with user stacks, and says why.
    let mut open = |tids: &[i32], enable_on_exec| {
        if kernel_off.is_none() {
            match PerfSampler::open_with(tids, &config(enable_on_exec, true)) {
                Err(TargetError::Attach(_, libc::EACCES | libc::EPERM)) => {
                    kernel_off = Some(kernel_refusal());
                }
                other => return other,
            }
        }
        PerfSampler::open_with(tids, &config(enable_on_exec, false))
    };
    let (sampler, watch, leader) = match args.pid {
        Some(pid) => attach(pid, &mut open)?,
        None => launch(&args.command, &mut open)?,
    };
    if let Some(cpu) = args.sampler_cpu {
        super::pin_to_cpu(cpu).map_err(TargetError::Io)?;
    }
    let rings = sampler.ring_info.clone();
    let mut sink = sink;
    let layout = sampler.layout;
    let switch_ids = sampler.switch_ids.clone();
    let drain = Drain::start(sampler).map_err(TargetError::Io)?;
    say_what_is_recorded(&mut sink, &kernel_off, &rings, stack_size, drain.realtime);
    let mut backend = PerfBackend {
        drain,
        decoder: Decoder {
            layout,
            switch_ids,
            kernel: Vec::with_capacity(128),
            blocked: HashMap::new(),
            switches: Vec::new(),
        },
        watch,
        sigchld,
        leader,
        origin_mono_ns: super::monotonic_now_ns().saturating_sub(sink.now_ns()),
    };
    let outcome = match backend.run(&mut sink, stop_signals) {
        Ok(outcome) => outcome,
        Err(error) => Outcome::WriteFailed(error),
    };
    let sampler = backend.drain.stop();
    let _ = backend.gather_records(&mut sink);
    // Threads still blocked when the recording ends were blocked until then.
    let now = sink.now_ns();
    let _ = backend.decoder.end_blocks(&mut sink, now);
    let exit_status = backend.watch.exit_status();
    // The sampler's descriptors close here: the target is no longer sampled.
    drop(sampler);
    drop(backend);
    Ok(finish(sink, outcome, exit_status, Backend::Perf))
}

/// Why kernel stacks are not recorded, if they are not: `--no-kernel`, `--capture raw`,
/// or a kallsyms this user may not read. Else they are, where permitted and nameable.
fn kernel_off(args: &crate::RecordOptions) -> Option<String> {
    match args.kernel {
        Some(false) => Some("--no-kernel".to_string()),
        _ if args.capture == CaptureMode::Raw => {
            Some("--capture raw keeps no kernel frames".to_string())
        }
        // kallsyms hides addresses from users who may not sample the kernel either:
        // the refusal is what they need to know.
        _ => glass_target::perf::kallsyms_hidden().map(|hidden| {
            // SAFETY: geteuid has no preconditions.
            if unsafe { libc::geteuid() } != 0 && paranoid() > 1 {
                kernel_refusal()
            } else {
                hidden
            }
        }),
    }
}

/// The sampler, the target's watch and its leader, for `--pid`: every thread of a
/// running process, sampled from now on.
fn attach(
    pid: i32,
    open: &mut impl FnMut(&[i32], bool) -> std::result::Result<PerfSampler, TargetError>,
) -> std::result::Result<(PerfSampler, Watch, i32), TargetError> {
    if pid <= 0 || !std::path::Path::new(&format!("/proc/{pid}")).exists() {
        return Err(TargetError::NoSuchProcess(pid));
    }
    // A kernel thread has no program (perf would accept it and never sample);
    // a process this user may not inspect has an unreadable one.
    if let Err(error) = std::fs::read_link(format!("/proc/{pid}/exe")) {
        let code = error
            .raw_os_error()
            .filter(|&c| c != libc::ENOENT)
            .unwrap_or(libc::EPERM);
        return Err(TargetError::Attach(pid, code));
    }
    let tids = procfs::thread_ids(pid).map_err(|_| TargetError::NoSuchProcess(pid))?;
    let sampler = open(&tids, false)?;
    // SAFETY: pidfd_open has no memory arguments.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(TargetError::NoSuchProcess(pid));
    }
    // SAFETY: a fresh descriptor we own.
    let pidfd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    sampler.enable();
    Ok((
        sampler,
        Watch::Attached {
            pid,
            pidfd,
            exited: false,
        },
        pid,
    ))
}

/// The same for a program glass starts: sampling is enabled by its exec.
fn launch(
    command: &[String],
    open: &mut impl FnMut(&[i32], bool) -> std::result::Result<PerfSampler, TargetError>,
) -> std::result::Result<(PerfSampler, Watch, i32), TargetError> {
    let child = spawn_paused(command)?;
    let pid = child.pid;
    let sampler = match open(&[pid], true) {
        Ok(sampler) => sampler,
        Err(error) => {
            child.abandon();
            return Err(error);
        }
    };
    if let Err(error) = child.release() {
        let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
        return Err(error);
    }
    Ok((sampler, Watch::Child { pid, status: None }, pid))
}

/// What the recording will hold, said once: kernel stacks (and why not), the rings.
fn say_what_is_recorded(
    sink: &mut Sink,
    kernel_off: &Option<String>,
    rings: &glass_target::perf::RingInfo,
    stack_size: u32,
    realtime: bool,
) {
    let args = sink.args;
    sink.kernel_stacks_recorded(match kernel_off {
        None => Ok(()),
        Some(why) => Err(why.clone()),
    });
    if let Some(why) = kernel_off {
        if args.kernel == Some(true) || args.off_cpu {
            let what = if args.off_cpu {
                "kernel stacks and off-CPU time are"
            } else {
                "kernel stacks are"
            };
            sink.notes.warn(&format!("{what} not recorded: {why}"));
        }
    }
    if let Some(limit) = &rings.limited_by {
        sink.notes.warn(&format!(
            "perf rings limited to {} KiB per CPU ({} KiB wanted for {} Hz with {} byte stacks) by {limit}: samples may be lost",
            rings.bytes / 1024,
            rings.wanted / 1024,
            args.frequency,
            stack_size
        ));
    }
    sink.notes.figure(&format!(
        "perf rings: {} x {} KiB, wake-up every {} KiB{}",
        rings.rings,
        rings.bytes / 1024,
        rings.watermark.div_ceil(1024),
        if realtime {
            ", drained by a SCHED_FIFO thread"
        } else {
            ""
        }
    ));
}

/// Copied records waiting for the recorder, at most: beyond it the drain thread leaves
/// the rings alone and the kernel drops (and counts) what does not fit.
const MAX_QUEUED: usize = 512 << 20;

/// The thread that empties the rings: it waits for a ring's watermark (or a stop), copies
/// everything waiting into a buffer, hands the buffer to the main thread and wakes it.
/// It runs at SCHED_FIFO where glass may (root): a loaded machine then cannot keep it
/// from the rings longer than they hold.
struct Drain {
    thread: Option<JoinHandle<PerfSampler>>,
    full: mpsc::Receiver<Vec<u8>>,
    empty: mpsc::Sender<Vec<u8>>,
    /// Written by the drain thread when it handed over a buffer.
    ready: OwnedFd,
    /// Written by the main thread to end the drain.
    stop: OwnedFd,
    queued: Arc<AtomicUsize>,
    /// Whether the thread got its real-time priority.
    pub realtime: bool,
}

fn eventfd() -> std::io::Result<OwnedFd> {
    // SAFETY: creates a descriptor we own.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn signal(fd: &OwnedFd) {
    let one = 1u64;
    // SAFETY: writes 8 bytes to our eventfd.
    unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
}

fn clear(fd: &OwnedFd) {
    let mut count = 0u64;
    // SAFETY: reads 8 bytes from our eventfd.
    unsafe { libc::read(fd.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
}

impl Drain {
    fn start(mut sampler: PerfSampler) -> std::io::Result<Drain> {
        let (full_tx, full) = mpsc::channel::<Vec<u8>>();
        let (empty, empty_rx) = mpsc::channel::<Vec<u8>>();
        let ready = eventfd()?;
        let stop = eventfd()?;
        let queued = Arc::new(AtomicUsize::new(0));
        let (ready_fd, stop_fd) = (ready.as_raw_fd(), stop.as_raw_fd());
        let thread_queued = queued.clone();
        // A test hook: a drain made slow on purpose shows what the rings' size buys.
        let pause = std::env::var("GLASS_PERF_DRAIN_PAUSE_MS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .map(Duration::from_millis);
        let (realtime_tx, realtime_rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("glass-drain".into())
            .spawn(move || {
                let param = libc::sched_param { sched_priority: 1 };
                // SAFETY: sets this thread's own policy.
                let realtime =
                    unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } == 0;
                let _ = realtime_tx.send(realtime);
                let mut fds: Vec<libc::pollfd> = sampler
                    .fds()
                    .into_iter()
                    .chain([stop_fd])
                    .map(|fd| libc::pollfd {
                        fd,
                        events: libc::POLLIN,
                        revents: 0,
                    })
                    .collect();
                let ready = ready_fd;
                let hand_over = |sampler: &mut PerfSampler| {
                    if thread_queued.load(Ordering::Relaxed) >= MAX_QUEUED {
                        return;
                    }
                    let mut buffer = empty_rx.try_recv().unwrap_or_default();
                    buffer.clear();
                    let n = sampler.drain_raw(&mut buffer);
                    if n > 0 {
                        thread_queued.fetch_add(n, Ordering::Relaxed);
                        if full_tx.send(buffer).is_ok() {
                            let one = 1u64;
                            // SAFETY: writes 8 bytes to the main thread's eventfd.
                            unsafe { libc::write(ready, (&one as *const u64).cast(), 8) };
                        }
                    }
                };
                loop {
                    for fd in &mut fds {
                        fd.revents = 0;
                    }
                    // The timeout also catches records below the watermark at the end of
                    // a quiet stretch.
                    // SAFETY: valid pollfds.
                    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 100) };
                    if fds.last().is_some_and(|fd| fd.revents != 0) {
                        break;
                    }
                    hand_over(&mut sampler);
                    if let Some(pause) = pause {
                        std::thread::sleep(pause);
                    }
                }
                sampler.disable();
                hand_over(&mut sampler);
                sampler
            })?;
        Ok(Drain {
            thread: Some(thread),
            full,
            empty,
            ready,
            stop,
            queued,
            realtime: realtime_rx.recv().unwrap_or(false),
        })
    }

    /// Hands each copied buffer to `each`, then back to the drain thread for reuse.
    fn take(&mut self, each: &mut dyn FnMut(&[u8]) -> std::io::Result<()>) -> std::io::Result<()> {
        clear(&self.ready);
        while let Ok(buffer) = self.full.try_recv() {
            self.queued.fetch_sub(buffer.len(), Ordering::Relaxed);
            let result = each(&buffer);
            let _ = self.empty.send(buffer);
            result?;
        }
        Ok(())
    }

    /// Ends the drain (the events are disabled and the rings emptied a last time) and
    /// returns the sampler, whose descriptors close when it is dropped.
    fn stop(&mut self) -> Option<PerfSampler> {
        signal(&self.stop);
        self.thread.take().and_then(|t| t.join().ok())
    }
}

/// The perf backend under the shared loop: no clock of glass's (the kernel samples);
/// each turn drains the rings.
struct PerfBackend {
    drain: Drain,
    decoder: Decoder,
    watch: Watch,
    sigchld: SignalFd,
    leader: i32,
    /// CLOCK_MONOTONIC at the sink's origin: perf stamps samples on that clock.
    origin_mono_ns: u64,
}

impl PerfBackend {
    fn run(&mut self, sink: &mut Sink, stop_signals: &SignalFd) -> std::io::Result<Outcome> {
        let args = sink.args;
        sink.write_meta(
            Backend::Perf,
            Arch::host(),
            unwind_name(args.unwind),
            self.leader,
        )?;
        let attached = args.pid.is_some();
        // A launched command has not exec'd its program yet when the recording starts:
        // its mappings arrive as MMAP2 records after the exec.
        sink.handle(Event::process(
            self.leader,
            0,
            ProcessKind::Attached,
            0,
            attached,
        ))?;
        if attached {
            for tid in procfs::thread_ids(self.leader).unwrap_or_default() {
                sink.handle(Event::thread(self.leader, tid))?;
            }
        }
        let duration = args.duration;
        sink.sampling_began();
        let outcome = drive(
            self,
            sink,
            Some(stop_signals),
            Clock::None(std::time::Duration::from_millis(100)),
            duration,
        );
        sink.sampling_ended();
        outcome
    }

    /// Handles every record the drain thread copied out so far.
    fn gather_records(&mut self, sink: &mut Sink) -> std::io::Result<()> {
        let origin = self.origin_mono_ns;
        let decoder = &mut self.decoder;
        self.drain.take(&mut |bytes| {
            let mut result = Ok(());
            kernel::records(bytes, decoder.layout, &mut |record| {
                if result.is_ok() {
                    result = decoder.handle(sink, origin, record);
                }
            });
            result?;
            decoder.match_switches(sink)
        })
    }
}

impl<'a> Sampler<Sink<'a>> for PerfBackend {
    fn fds(&self) -> Vec<i32> {
        vec![self.drain.ready.as_raw_fd(), self.watch.fd(&self.sigchld)]
    }

    fn gather(&mut self, sink: &mut Sink<'a>) -> std::io::Result<Gathered> {
        self.gather_records(sink)?;
        self.watch.poll(&self.sigchld);
        Ok(Gathered::ended_if(self.watch.ended()))
    }

    fn housekeeping(&mut self, sink: &mut Sink<'a>) -> std::io::Result<()> {
        sink.flush()
    }
}

fn paranoid() -> i32 {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(2)
}

/// Why the kernel refused kernel sampling, in the user's terms.
fn kernel_refusal() -> String {
    let paranoid = paranoid();
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    format!(
        "perf_event_paranoid is {paranoid} and glass runs as {} (kernel sampling needs paranoid 1 or lower, CAP_PERFMON or root)",
        if root { "root without CAP_PERFMON" } else { "a user" }
    )
}

/// What turns the rings' records into the recorder's events: the layout they were
/// opened with, the kernel frames of the sample at hand, and (`--off-cpu`) the threads
/// blocked now with the stacks they blocked in.
struct Decoder {
    layout: kernel::Layout,
    switch_ids: Vec<u64>,
    kernel: Vec<u64>,
    blocked: HashMap<i32, Blocked>,
    /// This buffer's switch-related events, matched in time order once it is read
    /// (a thread leaves one CPU and comes back on another: another ring).
    switches: Vec<Switch>,
}

/// A thread blocked since `since`, where (the frames) and whether the switch was a
/// preemption (a runnable thread waiting for a CPU is not blocked).
struct Blocked {
    pid: i32,
    since: u64,
    flags: u8,
    frames: Vec<u64>,
    preempted: bool,
}

enum SwitchKind {
    /// The switch event's sample: the stack the thread leaves the CPU with.
    Sample {
        flags: u8,
        frames: Vec<u64>,
    },
    Out {
        preempted: bool,
    },
    In,
}

struct Switch {
    time_ns: u64,
    pid: i32,
    tid: i32,
    kind: SwitchKind,
}

impl Decoder {
    fn handle(
        &mut self,
        sink: &mut Sink,
        origin_mono_ns: u64,
        record: PerfRecord<'_>,
    ) -> std::io::Result<()> {
        if let PerfRecord::Sample {
            id,
            pid,
            tid,
            time_ns,
            callchain,
            ip,
            sp,
            fp,
            stack,
        } = record
        {
            let (pid, tid) = (pid as i32, tid as i32);
            if !sink.knows_thread(tid) {
                sink.handle(Event::thread(pid, tid))?;
            }
            self.kernel.clear();
            self.kernel.extend(kernel::kernel_frames(callchain));
            let time_ns = time_ns.saturating_sub(origin_mono_ns);
            let regs = UnwindRegs::new(ip, sp, fp);
            if self.switch_ids.contains(&id) {
                let mut frames = Vec::new();
                let flags = sink.unwind_blocked(pid, regs, stack, &self.kernel, &mut frames);
                self.switches.push(Switch {
                    time_ns,
                    pid,
                    tid,
                    kind: SwitchKind::Sample { flags, frames },
                });
                return Ok(());
            }
            sink.stack_sample_with_kernel(pid, tid, time_ns, 0, 0, regs, stack, &self.kernel)?;
            sink.tick(0);
            return Ok(());
        }
        if let PerfRecord::Switch {
            time_ns,
            pid,
            tid,
            out,
            preempted,
        } = record
        {
            self.switches.push(Switch {
                time_ns: time_ns.saturating_sub(origin_mono_ns),
                pid: pid as i32,
                tid: tid as i32,
                kind: if out {
                    SwitchKind::Out { preempted }
                } else {
                    SwitchKind::In
                },
            });
            return Ok(());
        }
        handle(sink, origin_mono_ns, record)
    }

    /// Pairs each thread's switch out (its stack, and whether it was preempted) with
    /// its switch back in: the time between is an off-CPU sample, if it blocked.
    fn match_switches(&mut self, sink: &mut Sink) -> std::io::Result<()> {
        let mut switches = std::mem::take(&mut self.switches);
        switches.sort_by_key(|s| s.time_ns);
        for switch in switches.drain(..) {
            match switch.kind {
                SwitchKind::Sample { flags, frames } => {
                    let preempted = self
                        .blocked
                        .get(&switch.tid)
                        .is_some_and(|b| b.frames.is_empty() && b.preempted);
                    self.blocked.insert(
                        switch.tid,
                        Blocked {
                            pid: switch.pid,
                            since: switch.time_ns,
                            flags,
                            frames,
                            preempted,
                        },
                    );
                }
                SwitchKind::Out { preempted } => match self.blocked.get_mut(&switch.tid) {
                    // The sample and the record of one switch come in either order.
                    Some(blocked) => blocked.preempted = preempted,
                    None => {
                        self.blocked.insert(
                            switch.tid,
                            Blocked {
                                pid: switch.pid,
                                since: switch.time_ns,
                                flags: 0,
                                frames: Vec::new(),
                                preempted,
                            },
                        );
                    }
                },
                SwitchKind::In => {
                    if let Some(blocked) = self.blocked.remove(&switch.tid) {
                        self.end_block(sink, switch.tid, blocked, switch.time_ns)?;
                    }
                }
            }
        }
        self.switches = switches;
        Ok(())
    }

    fn end_block(
        &mut self,
        sink: &mut Sink,
        tid: i32,
        blocked: Blocked,
        until: u64,
    ) -> std::io::Result<()> {
        if blocked.preempted || blocked.frames.is_empty() {
            return Ok(());
        }
        let ns = until.saturating_sub(blocked.since);
        sink.off_cpu_sample(
            blocked.pid,
            tid,
            blocked.since,
            ns,
            blocked.flags,
            &blocked.frames,
        )
    }

    /// Threads still blocked when the recording ends: blocked until `now`.
    fn end_blocks(&mut self, sink: &mut Sink, now: u64) -> std::io::Result<()> {
        let mut blocked: Vec<(i32, Blocked)> = self.blocked.drain().collect();
        blocked.sort_by_key(|(tid, _)| *tid);
        for (tid, block) in blocked {
            self.end_block(sink, tid, block, now)?;
        }
        Ok(())
    }
}

fn handle(sink: &mut Sink, origin_mono_ns: u64, record: PerfRecord<'_>) -> std::io::Result<()> {
    match record {
        // Taken apart by the decoder.
        PerfRecord::Sample { .. } | PerfRecord::Switch { .. } => {}
        PerfRecord::Mmap {
            time_ns,
            pid,
            start,
            len,
            file_offset,
            executable,
            path,
        } => {
            if executable {
                let mapping = Mapping {
                    start,
                    end: start + len,
                    file_offset,
                    path: if path.is_empty() || path.starts_with("//anon") {
                        "[anon]".into()
                    } else {
                        path.to_string()
                    },
                    deleted: false,
                };
                sink.handle(Event::Mapping {
                    pid: pid as i32,
                    mapping,
                    time_ns: time_ns.saturating_sub(origin_mono_ns),
                })?;
            }
        }
        PerfRecord::Comm {
            time_ns,
            pid,
            tid,
            exec,
            name,
        } => {
            if exec {
                let time_ns = time_ns.saturating_sub(origin_mono_ns);
                sink.handle(Event::process(
                    pid as i32,
                    0,
                    ProcessKind::Exec,
                    time_ns,
                    false,
                ))?;
            }
            sink.handle(Event::Thread {
                pid: pid as i32,
                tid: tid as i32,
                name: Some(name.to_string()),
            })?;
        }
        PerfRecord::Fork {
            time_ns,
            pid,
            parent_pid,
            tid,
        } => {
            if pid != parent_pid {
                let time_ns = time_ns.saturating_sub(origin_mono_ns);
                sink.handle(Event::process(
                    pid as i32,
                    parent_pid as i32,
                    ProcessKind::Forked,
                    time_ns,
                    false,
                ))?;
            }
            sink.handle(Event::thread(pid as i32, tid as i32))?;
        }
        PerfRecord::Exit { time_ns, pid, tid } => {
            sink.handle(Event::ThreadExit {
                pid: pid as i32,
                tid: tid as i32,
                time_ns: time_ns.saturating_sub(origin_mono_ns),
            })?;
            if pid == tid {
                sink.handle(Event::ProcessExit { pid: pid as i32 })?;
            }
        }
        PerfRecord::Lost {
            pid, tid, count, ..
        } => sink.lost_by(pid as i32, tid as i32, count),
    }
    Ok(())
}
