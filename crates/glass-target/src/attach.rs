//! Holding every thread of a running process, for `glass trace --pid`: seize them all
//! (threads that appear meanwhile included, through PTRACE_O_TRACECLONE; another
//! tracer named), stop one or all of them, and let them all go again, each with the
//! signal it was about to receive. Nothing here single-steps: a thread whose tracer
//! dies during a step is killed by the kernel.
//!
//! Unlike the sampling backend ([`crate::ptrace`]), this holds the threads only for the
//! short windows in which glass changes the process (attach and detach); in between,
//! glass is not the process's tracer at all, so the target's signals and clones cost it
//! nothing and a glass that dies leaves nothing held.

use std::collections::BTreeMap;
use std::io;
use std::time::{Duration, Instant};

use crate::TargetError;

pub(crate) fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// One ptrace request; the errno on failure.
pub(crate) fn ptrace(
    request: libc::c_uint,
    tid: i32,
    addr: usize,
    data: usize,
) -> Result<i64, i32> {
    // SAFETY: requests whose addr/data are plain values or point at our own buffers.
    let result = unsafe {
        libc::ptrace(
            request,
            tid,
            addr as *mut libc::c_void,
            data as *mut libc::c_void,
        )
    };
    if result < 0 {
        Err(errno())
    } else {
        Ok(result)
    }
}

/// A thread's registers (x86-64: PTRACE_GETREGS; used by injection and tracing only).
#[cfg(target_arch = "x86_64")]
pub fn registers(tid: i32) -> io::Result<libc::user_regs_struct> {
    // SAFETY: PTRACE_GETREGS fills the struct.
    let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
    ptrace(libc::PTRACE_GETREGS, tid, 0, &mut regs as *mut _ as usize)
        .map_err(io::Error::from_raw_os_error)?;
    Ok(regs)
}

#[cfg(target_arch = "x86_64")]
pub fn set_registers(tid: i32, regs: &libc::user_regs_struct) -> io::Result<()> {
    ptrace(libc::PTRACE_SETREGS, tid, 0, regs as *const _ as usize)
        .map_err(io::Error::from_raw_os_error)?;
    Ok(())
}

/// A thread's general registers (AArch64: PTRACE_GETREGSET of NT_PRSTATUS).
#[cfg(target_arch = "aarch64")]
pub fn registers(tid: i32) -> io::Result<libc::user_regs_struct> {
    // SAFETY: PTRACE_GETREGSET fills at most iov_len bytes of the struct.
    let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
    let mut iov = libc::iovec {
        iov_base: &mut regs as *mut _ as *mut libc::c_void,
        iov_len: std::mem::size_of::<libc::user_regs_struct>(),
    };
    ptrace(
        libc::PTRACE_GETREGSET,
        tid,
        libc::NT_PRSTATUS as usize,
        &mut iov as *mut _ as usize,
    )
    .map_err(io::Error::from_raw_os_error)?;
    Ok(regs)
}

#[cfg(target_arch = "aarch64")]
pub fn set_registers(tid: i32, regs: &libc::user_regs_struct) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: regs as *const _ as *mut libc::c_void,
        iov_len: std::mem::size_of::<libc::user_regs_struct>(),
    };
    ptrace(
        libc::PTRACE_SETREGSET,
        tid,
        libc::NT_PRSTATUS as usize,
        &mut iov as *mut _ as usize,
    )
    .map_err(io::Error::from_raw_os_error)?;
    Ok(())
}

/// The next wait status of one thread, or None by the deadline. Sleeps until the
/// kernel's SIGCHLD for a tracee's stop (blocked in the calling thread and taken with
/// sigtimedwait), rather than polling: on a machine with few cores a polling glass
/// competes with the very threads it waits for.
pub fn wait_thread(tid: i32, deadline: Instant) -> io::Result<Option<i32>> {
    // SAFETY: signal-mask calls on this thread's own mask with valid sets.
    let mut chld: libc::sigset_t = unsafe { std::mem::zeroed() };
    unsafe {
        libc::sigemptyset(&mut chld);
        libc::sigaddset(&mut chld, libc::SIGCHLD);
        libc::pthread_sigmask(libc::SIG_BLOCK, &chld, std::ptr::null_mut());
    }
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes the status word.
        let got = unsafe { libc::waitpid(tid, &mut status, libc::__WALL | libc::WNOHANG) };
        if got == tid {
            return Ok(Some(status));
        }
        if got < 0 && errno() != libc::EINTR {
            return Err(io::Error::last_os_error());
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(None);
        }
        // Wake at least every 10 ms: a SIGCHLD taken by another wait (for another
        // thread) is not sent twice.
        let wait = (deadline - now).min(Duration::from_millis(10));
        let timeout = libc::timespec {
            tv_sec: wait.as_secs() as libc::time_t,
            tv_nsec: wait.subsec_nanos() as libc::c_long,
        };
        // SAFETY: waits for a blocked signal with a valid set and timeout.
        unsafe { libc::sigtimedwait(&chld, std::ptr::null_mut(), &timeout) };
    }
}

/// The tracer of thread `tid` of `pid` (0: none), from its status file.
/// The thread a ptrace stop of `tid` (wait status `status`) reports created, if it is a
/// clone event.
pub(crate) fn cloned(tid: i32, status: i32) -> Option<i32> {
    if (status >> 16) & 0xff != libc::PTRACE_EVENT_CLONE {
        return None;
    }
    let mut new_tid: libc::c_ulong = 0;
    ptrace(
        libc::PTRACE_GETEVENTMSG,
        tid,
        0,
        &mut new_tid as *mut _ as usize,
    )
    .ok()
    .map(|_| new_tid as i32)
}

/// The signal a stopped thread is to get when resumed: a signal-delivery stop's own;
/// none after an event stop (a clone, a new thread's first stop, a group stop) or a
/// system-call stop.
pub(crate) fn signal_of_stop(status: i32) -> i32 {
    match libc::WSTOPSIG(status) {
        stop if (status >> 16) & 0xff == 0 && stop & 0x80 == 0 => stop,
        _ => 0,
    }
}

pub(crate) fn tracer_of(pid: i32, tid: i32) -> Option<i32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("TracerPid:"))
        .and_then(|value| value.trim().parse().ok())
}

/// Whether thread `tid` of `pid` is gone or exiting (a zombie or dead task).
pub(crate) fn exiting(pid: i32, tid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X" || state == "x"),
        Err(_) => true,
    }
}

pub(crate) fn process_name(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|name| name.trim().to_string())
        .unwrap_or_else(|_| "gone".to_string())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Running,
    /// Stopped; the signal it was about to receive when it stopped (0: none), passed on
    /// when it is let go.
    Stopped(i32),
}

/// Every thread of one process, seized.
pub struct Attachment {
    pid: i32,
    threads: BTreeMap<i32, State>,
    released: bool,
    /// Held while every thread is stopped (from stop_all to release).
    boost: Option<Boost>,
}

/// Clones are reported (their threads seized at once); system-call stops, which only an
/// injected call asks for, are marked apart from a real SIGTRAP.
const OPTIONS: usize = (libc::PTRACE_O_TRACECLONE | libc::PTRACE_O_TRACESYSGOOD) as usize;

impl Attachment {
    /// Seizes every thread of `pid` without stopping any.
    pub fn seize(pid: i32) -> Result<Self, TargetError> {
        if pid <= 0 || !std::path::Path::new(&format!("/proc/{pid}/task")).exists() {
            return Err(TargetError::NoSuchProcess(pid));
        }
        let mut attachment = Attachment {
            pid,
            threads: BTreeMap::new(),
            released: false,
            boost: None,
        };
        // Threads can appear while we seize: list again until no new one shows up (the
        // ones seized so far report their clones from then on).
        loop {
            let tids =
                crate::procfs::thread_ids(pid).map_err(|_| TargetError::NoSuchProcess(pid))?;
            let mut new = 0;
            for tid in tids {
                if attachment.threads.contains_key(&tid) {
                    continue;
                }
                match ptrace(libc::PTRACE_SEIZE, tid, 0, OPTIONS) {
                    Ok(_) => {}
                    Err(libc::ESRCH) if tid != pid => continue,
                    Err(libc::ESRCH) => return Err(TargetError::NoSuchProcess(pid)),
                    // A thread on its way out cannot be seized any more: it is no
                    // thread to hold.
                    Err(libc::EPERM) if tid != pid && exiting(pid, tid) => continue,
                    Err(libc::EPERM) => match tracer_of(pid, tid) {
                        // Created meanwhile by a thread seized already: seized with it
                        // (PTRACE_O_TRACECLONE), and it stops on its own as it starts.
                        Some(tracer) if tracer == std::process::id() as i32 => {}
                        Some(tracer) if tracer > 0 => {
                            return Err(TargetError::TracedBy(pid, tracer, process_name(tracer)))
                        }
                        _ => return Err(TargetError::Attach(pid, libc::EPERM)),
                    },
                    Err(code) => return Err(TargetError::Attach(pid, code)),
                }
                new += 1;
                attachment.threads.insert(tid, State::Running);
            }
            if new == 0 {
                break;
            }
        }
        Ok(attachment)
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    pub fn tids(&self) -> Vec<i32> {
        self.threads.keys().copied().collect()
    }

    /// Holds threads someone else saw created (seized with their parent): they run.
    pub fn adopt(&mut self, tids: &[i32]) {
        for &tid in tids {
            self.threads.entry(tid).or_insert(State::Running);
        }
    }

    pub fn is_stopped(&self, tid: i32) -> bool {
        matches!(self.threads.get(&tid), Some(State::Stopped(_)))
    }

    /// Stops one thread; false if it is gone.
    pub fn stop(&mut self, tid: i32) -> Result<bool, TargetError> {
        if self.threads.get(&tid) != Some(&State::Running) {
            return Ok(self.threads.contains_key(&tid));
        }
        let _ = ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0);
        self.await_stops(&[tid], Instant::now() + Duration::from_secs(5))?;
        Ok(self.is_stopped(tid))
    }

    /// Stops every thread, including threads created meanwhile.
    pub fn stop_all(&mut self) -> Result<(), TargetError> {
        if self.boost.is_none() {
            self.boost = Some(Boost::new());
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let running: Vec<i32> = self
                .threads
                .iter()
                .filter(|(_, s)| **s == State::Running)
                .map(|(t, _)| *t)
                .collect();
            if running.is_empty() {
                break;
            }
            for &tid in &running {
                let _ = ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0);
            }
            self.await_stops(&running, deadline)?;
        }
        if self.threads.is_empty() || !self.threads.contains_key(&self.pid) {
            return Err(TargetError::NoSuchProcess(self.pid));
        }
        Ok(())
    }

    /// Waits until each of `tids` has stopped or gone, noting clones on the way.
    fn await_stops(&mut self, tids: &[i32], deadline: Instant) -> Result<(), TargetError> {
        for &tid in tids {
            while self.threads.get(&tid) == Some(&State::Running) {
                let status = match wait_thread(tid, deadline) {
                    Ok(status) => status,
                    // A thread whose end was already taken by another wait (a peer's,
                    // during an injected call) is not glass's to wait for any more, and
                    // it is gone: not an error. Only a live thread that is not glass's
                    // tracee is one.
                    Err(e) if e.raw_os_error() == Some(libc::ECHILD) && exiting(self.pid, tid) => {
                        self.threads.remove(&tid);
                        break;
                    }
                    Err(e) if e.raw_os_error() == Some(libc::ECHILD) => {
                        return Err(TargetError::NotTracee(e))
                    }
                    Err(e) => return Err(TargetError::Io(e)),
                };
                let Some(status) = status else {
                    // A thread that does not stop (exiting, or stuck in the kernel) is
                    // left alone: the kernel lets it go when glass detaches or exits.
                    return Err(TargetError::TimedOut(format!(
                        "thread {tid} of pid {} did not stop within 5 s",
                        self.pid
                    )));
                };
                self.note(tid, status);
            }
        }
        Ok(())
    }

    /// Takes a wait status of `tid` into account.
    pub fn note(&mut self, tid: i32, status: i32) {
        if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
            self.threads.remove(&tid);
            return;
        }
        if !libc::WIFSTOPPED(status) {
            return;
        }
        if let Some(new_tid) = cloned(tid, status) {
            // Seized already: it reports a stop of its own when it starts.
            self.threads.entry(new_tid).or_insert(State::Running);
        }
        self.threads
            .insert(tid, State::Stopped(signal_of_stop(status)));
    }

    /// Lets one stopped thread run (it stays seized).
    pub fn resume(&mut self, tid: i32) {
        if let Some(State::Stopped(signal)) = self.threads.get(&tid).copied() {
            let _ = ptrace(libc::PTRACE_CONT, tid, 0, signal as usize);
            self.threads.insert(tid, State::Running);
        }
    }

    /// Lets every stopped thread but `keep` run on, still seized (a later
    /// [`Attachment::stop_all`] stops them again).
    pub fn resume_all_but(&mut self, keep: i32) {
        for tid in self.tids() {
            if tid != keep {
                self.resume(tid);
            }
        }
        self.boost = None;
    }

    /// Lets every thread but `keep` go (see [`Attachment::release`]); `keep` stays
    /// stopped and seized.
    pub fn release_all_but(&mut self, keep: i32) {
        let kept = self.threads.remove(&keep);
        self.release();
        self.released = false;
        if let Some(state) = kept {
            self.threads.insert(keep, state);
        }
    }

    /// Lets every thread go, each with the signal it was about to receive.
    pub fn release(&mut self) {
        if self.released {
            return;
        }
        self.released = true;
        let _boost = self.boost.take().unwrap_or_else(Boost::new);
        let threads: Vec<(i32, State)> = self.threads.iter().map(|(t, s)| (*t, *s)).collect();
        for (tid, state) in threads {
            match state {
                State::Stopped(signal) => {
                    let _ = ptrace(libc::PTRACE_DETACH, tid, 0, signal as usize);
                }
                State::Running => {
                    // Detaching needs a stopped thread.
                    let _ = ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0);
                    let deadline = Instant::now() + Duration::from_secs(2);
                    if let Ok(Some(status)) = wait_thread(tid, deadline) {
                        self.note(tid, status);
                        if let Some(State::Stopped(signal)) = self.threads.get(&tid) {
                            let _ = ptrace(libc::PTRACE_DETACH, tid, 0, *signal as usize);
                        }
                    }
                }
            }
        }
        // Threads that reported a clone during the release are seized too.
        let late: Vec<i32> = self
            .threads
            .iter()
            .filter(|(_, s)| **s == State::Running)
            .map(|(t, _)| *t)
            .collect();
        for tid in late {
            let deadline = Instant::now() + Duration::from_millis(500);
            if let Ok(Some(status)) = wait_thread(tid, deadline) {
                if libc::WIFSTOPPED(status) {
                    let _ = ptrace(libc::PTRACE_DETACH, tid, 0, 0);
                }
            }
        }
        self.threads.clear();
    }
}

/// Real-time priority for glass while the target's threads are stopped, where it may
/// have it (root): on a machine with fewer free cores than busy threads, a thread let go
/// (or one not yet stopped) would otherwise preempt glass for a scheduler tick while the
/// others stay stopped. glass never spins meanwhile (waits sleep), so it cannot starve
/// the threads it waits for.
struct Boost(Option<(i32, libc::sched_param)>);

impl Boost {
    fn new() -> Self {
        // SAFETY: reading and setting this thread's own scheduling policy.
        unsafe {
            let mut previous: libc::sched_param = std::mem::zeroed();
            let policy = libc::sched_getscheduler(0);
            if policy < 0 || libc::sched_getparam(0, &mut previous) != 0 {
                return Boost(None);
            }
            let fifo = libc::sched_param { sched_priority: 1 };
            if libc::sched_setscheduler(0, libc::SCHED_FIFO, &fifo) != 0 {
                return Boost(None);
            }
            Boost(Some((policy, previous)))
        }
    }
}

impl Drop for Boost {
    fn drop(&mut self) {
        if let Some((policy, previous)) = self.0 {
            // SAFETY: restoring what Boost::new read.
            unsafe { libc::sched_setscheduler(0, policy, &previous) };
        }
    }
}

impl Drop for Attachment {
    fn drop(&mut self) {
        self.release();
    }
}
