//! The perf_event backend's loop: drain the kernel's rings whenever they have records,
//! and hand each sample's registers and stack copy to the sink for unwinding. glass
//! never stops the target here, so there is no tick and no stopped time to measure.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use glass_format::{Arch, Backend, ProcessKind};
use glass_target::launch::spawn_paused;
use glass_target::perf::{PerfRecord, PerfSampler};
use glass_target::procfs::{self, Mapping};
use glass_target::TargetError;
use glass_unwind::UnwindRegs;
use nix::sys::signalfd::SignalFd;

use super::driver::{drive, Clock, Gathered, Sampler};
use super::event::Event;
use super::recorder::Recorder as Sink;
use super::{finish, unwind_name, Outcome};
use crate::{Recorded, Result};

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
    let (sampler, watch, leader) = match args.pid {
        Some(pid) => {
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
            let sampler = PerfSampler::open(&tids, args.frequency, stack_size, false)?;
            // SAFETY: pidfd_open has no memory arguments.
            let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
            if fd < 0 {
                return Err(TargetError::NoSuchProcess(pid));
            }
            // SAFETY: a fresh descriptor we own.
            let pidfd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
            sampler.enable();
            (
                sampler,
                Watch::Attached {
                    pid,
                    pidfd,
                    exited: false,
                },
                pid,
            )
        }
        None => {
            let child = spawn_paused(&args.command)?;
            let pid = child.pid;
            let sampler = match PerfSampler::open(&[pid], args.frequency, stack_size, true) {
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
            (sampler, Watch::Child { pid, status: None }, pid)
        }
    };
    if let Some(cpu) = args.sampler_cpu {
        super::pin_to_cpu(cpu).map_err(TargetError::Io)?;
    }
    let mut backend = PerfBackend {
        sampler,
        watch,
        sigchld,
        leader,
        origin_mono_ns: super::monotonic_now_ns().saturating_sub(sink.now_ns()),
    };
    let mut sink = sink;
    let outcome = match backend.run(&mut sink, stop_signals) {
        Ok(outcome) => outcome,
        Err(error) => Outcome::WriteFailed(error),
    };
    backend.sampler.disable();
    let _ = backend.drain(&mut sink);
    let exit_status = backend.watch.exit_status();
    // The sampler's descriptors close here: the target is no longer sampled.
    drop(backend);
    Ok(finish(sink, outcome, exit_status, Backend::Perf))
}

/// The perf backend under the shared loop: no clock of glass's (the kernel samples);
/// each turn drains the rings.
struct PerfBackend {
    sampler: PerfSampler,
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
        drive(
            self,
            sink,
            Some(stop_signals),
            Clock::None(std::time::Duration::from_millis(100)),
            duration,
        )
    }

    /// Takes every record out of the rings.
    fn drain(&mut self, sink: &mut Sink) -> std::io::Result<()> {
        let mut result = Ok(());
        let origin = self.origin_mono_ns;
        self.sampler.drain(&mut |record| {
            if result.is_ok() {
                result = handle(sink, origin, record);
            }
        });
        result
    }
}

impl<'a> Sampler<Sink<'a>> for PerfBackend {
    fn fds(&self) -> Vec<i32> {
        let mut fds = self.sampler.fds();
        fds.push(self.watch.fd(&self.sigchld));
        fds
    }

    fn gather(&mut self, sink: &mut Sink<'a>) -> std::io::Result<Gathered> {
        self.drain(sink)?;
        self.watch.poll(&self.sigchld);
        Ok(Gathered::ended_if(self.watch.ended()))
    }

    fn housekeeping(&mut self, sink: &mut Sink<'a>) -> std::io::Result<()> {
        sink.flush()
    }
}

fn handle(sink: &mut Sink, origin_mono_ns: u64, record: PerfRecord<'_>) -> std::io::Result<()> {
    match record {
        PerfRecord::Sample {
            pid,
            tid,
            time_ns,
            ip,
            sp,
            fp,
            stack,
        } => {
            let (pid, tid) = (pid as i32, tid as i32);
            if !sink.knows_thread(tid) {
                sink.handle(Event::thread(pid, tid))?;
            }
            sink.handle(Event::Stack {
                pid,
                tid,
                time_ns: time_ns.saturating_sub(origin_mono_ns),
                stopped_ns: 0,
                flags: 0,
                regs: UnwindRegs::new(ip, sp, fp),
                stack,
            })?;
            sink.tick(0);
        }
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
        PerfRecord::Lost { count } => sink.lost += count,
    }
    Ok(())
}
