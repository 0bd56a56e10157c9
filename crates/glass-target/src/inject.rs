//! Changing a stopped process from outside, for `glass trace`: its memory is written
//! through `/proc/PID/mem` (which may write read-only code pages, as a debugger's
//! breakpoints do: the same effect as mprotect around the write, without changing the
//! mapping's permissions), and functions of its own are called in a stopped thread.
//!
//! In a running process (`glass trace --pid`) the rules are those of a process that
//! must survive glass: system calls are made through the process's own `mmap` and
//! `munmap` (a `syscall` written at the thread's pc would be run by any other thread
//! returning from the same system call in that shared code), nothing is single-stepped,
//! and every injected call returns to a landing that restores the thread by itself (see
//! [`StoppedProcess::call`] and [`landing_code`]): a glass killed at any instant leaves
//! each thread where it was, with all its registers. A thread stopped in an interrupted
//! system call is put in the form the kernel gives it when it restarts the call
//! ([`resumable`]), so the call is restarted exactly once. The launch mode's process has
//! one thread, glass's own child stopped at its entry: there a `syscall` is written at
//! its pc and stepped over.
//!
//! Launch mode stops the new program at its ELF entry point: by then the dynamic loader
//! has mapped every library and run their constructors (the probe runtime's among them),
//! and not one instruction of the program itself has run.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::time::Duration;
#[cfg(target_arch = "x86_64")]
use std::time::Instant;

use crate::launch::spawn_paused_with_env;
use crate::TargetError;

#[cfg(target_arch = "aarch64")]
mod aarch64;
#[cfg(target_arch = "aarch64")]
use aarch64 as arch;
#[cfg(target_arch = "aarch64")]
pub use aarch64::landing_code;
#[cfg(target_arch = "x86_64")]
mod x86_64;
#[cfg(target_arch = "x86_64")]
use x86_64 as arch;

/// The landing's code (see the architecture's `landing_code`), for this machine.
pub fn landing_bytes() -> Vec<u8> {
    #[cfg(target_arch = "x86_64")]
    return landing_code(xstate_kind());
    #[cfg(target_arch = "aarch64")]
    return landing_code();
}
#[cfg(target_arch = "x86_64")]
pub use x86_64::{landing_code, resumable, xstate_kind, XstateKind};

/// A process with a thread stopped under ptrace, which runs what glass injects.
pub struct StoppedProcess {
    pid: i32,
    /// The thread that runs injected system calls and calls.
    tid: i32,
    mem: File,
    /// Nothing left to let go when dropped (detached, killed, or held by someone else).
    detached: bool,
    /// A running process's own `mmap` and `munmap`, through which its system calls are
    /// made (see [`StoppedProcess::use_libc`]); None: the launch mode's single thread,
    /// whose system calls run at its instruction pointer.
    libc: Option<LibcCalls>,
    /// Where injected calls return to: the landing (see [`landing_code`]), or 0 before
    /// one is mapped (the call returns to address 0, and its SIGSEGV ends it).
    landing: std::cell::Cell<u64>,
    /// An injected call was left under way (it did not return in time): the thread must
    /// not be given another one; it restores itself when the call returns.
    busy: std::cell::Cell<bool>,
    /// AArch64: the thread's registers after a landing restored it (see
    /// `aarch64::StoppedProcess::call`): it sits at a system call stop, where ptrace
    /// shows x7 as the stop's marker rather than its value.
    #[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
    after_landing: std::cell::RefCell<Option<arch::Saved>>,
    /// The process's other threads, seized by glass and running (see
    /// [`StoppedProcess::answer_peers_during_calls`]), and those they created meanwhile.
    peers: std::cell::RefCell<Peers>,
}

/// Threads whose ptrace stops an injected call answers while it runs.
#[derive(Default)]
struct Peers {
    running: Vec<i32>,
    /// Created by a peer during a call (seized with it): the attachment must learn of
    /// them.
    new: Vec<i32>,
}

/// The addresses of a process's own `mmap` and `munmap`.
#[derive(Clone, Copy, Debug)]
pub struct LibcCalls {
    pub mmap: u64,
    pub munmap: u64,
}

/// An argument of an injected call.
pub enum CallArg<'a> {
    Value(u64),
    /// Bytes copied below the thread's stack pointer; the call gets their address.
    Bytes(&'a [u8]),
}

use crate::attach::{errno, ptrace};

fn wait_stop(pid: i32) -> Result<i32, TargetError> {
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes the status word.
        let got = unsafe { libc::waitpid(pid, &mut status, libc::__WALL) };
        if got < 0 {
            if errno() == libc::EINTR {
                continue;
            }
            return Err(TargetError::Io(io::Error::last_os_error()));
        }
        if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
            return Err(TargetError::Exec(
                format!("pid {pid}"),
                io::Error::other(format!(
                    "the program ended before it started ({})",
                    shell_status(status)
                )),
            ));
        }
        return Ok(status);
    }
}

/// A wait status as a shell reports it: the exit code, or 128 + the signal.
pub fn shell_status(status: i32) -> i32 {
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else if libc::WIFSIGNALED(status) {
        128 + libc::WTERMSIG(status)
    } else {
        -1
    }
}

/// The program's entry point from its auxiliary vector.
fn entry_point(pid: i32) -> io::Result<u64> {
    let auxv = std::fs::read(format!("/proc/{pid}/auxv"))?;
    auxv.chunks_exact(16)
        .map(|pair| {
            (
                u64::from_ne_bytes(pair[..8].try_into().unwrap()),
                u64::from_ne_bytes(pair[8..].try_into().unwrap()),
            )
        })
        .find(|&(key, _)| key == libc::AT_ENTRY)
        .map(|(_, value)| value)
        .ok_or_else(|| io::Error::other("no AT_ENTRY in the auxiliary vector"))
}

impl StoppedProcess {
    /// Starts `argv` with `env` added and stops it at its entry point.
    pub fn launch_to_entry(argv: &[String], env: &[(String, String)]) -> Result<Self, TargetError> {
        let child = spawn_paused_with_env(argv, env)?;
        let pid = child.pid;
        if let Err(code) = ptrace(
            libc::PTRACE_SEIZE,
            pid,
            0,
            libc::PTRACE_O_TRACEEXEC as usize,
        ) {
            child.abandon();
            return Err(TargetError::Attach(pid, code));
        }
        child.release()?;
        // The exec stop.
        loop {
            let status = wait_stop(pid)?;
            if status >> 8 == (libc::SIGTRAP | (libc::PTRACE_EVENT_EXEC << 8)) {
                break;
            }
            let signal = if (status >> 16) == 0 {
                libc::WSTOPSIG(status)
            } else {
                0
            };
            let _ = ptrace(libc::PTRACE_CONT, pid, 0, signal as usize);
        }
        let mem = File::options()
            .read(true)
            .write(true)
            .open(format!("/proc/{pid}/mem"))
            .map_err(TargetError::Io)?;
        let process = StoppedProcess {
            pid,
            tid: pid,
            mem,
            detached: false,
            libc: None,
            landing: std::cell::Cell::new(0),
            busy: std::cell::Cell::new(false),
            after_landing: Default::default(),
            peers: Default::default(),
        };
        let entry = entry_point(pid).map_err(TargetError::Io)?;
        let original = process
            .read(entry, arch::BREAKPOINT.len())
            .map_err(TargetError::Io)?;
        process
            .write(entry, arch::BREAKPOINT)
            .map_err(TargetError::Io)?;
        ptrace(libc::PTRACE_CONT, pid, 0, 0).map_err(|e| TargetError::Attach(pid, e))?;
        loop {
            let status = wait_stop(pid)?;
            if libc::WIFSTOPPED(status) && libc::WSTOPSIG(status) == libc::SIGTRAP {
                let mut regs = process.registers().map_err(TargetError::Io)?;
                if arch::pc(&regs) == entry + arch::PC_AFTER_BREAKPOINT {
                    process.write(entry, &original).map_err(TargetError::Io)?;
                    arch::set_pc(&mut regs, entry);
                    process.set_registers(&regs).map_err(TargetError::Io)?;
                    return Ok(process);
                }
            }
            // Anything else before the entry (a signal the loader got) goes on to it.
            let signal = if (status >> 16) == 0 {
                libc::WSTOPSIG(status)
            } else {
                0
            };
            let _ = ptrace(libc::PTRACE_CONT, pid, 0, signal as usize);
        }
    }

    /// A process whose thread `tid` someone else (an [`crate::attach::Attachment`])
    /// holds stopped, and lets go.
    pub fn for_thread(pid: i32, tid: i32) -> io::Result<Self> {
        let mem = File::options()
            .read(true)
            .write(true)
            .open(format!("/proc/{pid}/mem"))?;
        Ok(StoppedProcess {
            pid,
            tid,
            mem,
            detached: true,
            libc: None,
            landing: std::cell::Cell::new(0),
            busy: std::cell::Cell::new(false),
            after_landing: Default::default(),
            peers: Default::default(),
        })
    }

    /// Has this process make its system calls through its own `mmap` and `munmap`
    /// (injected calls) instead of a `syscall` written at the thread's instruction
    /// pointer: in a running process that code is shared with threads that run on, and
    /// one returning from the same system call would execute the written bytes.
    pub fn use_libc(&mut self, calls: LibcCalls) {
        self.libc = Some(calls);
    }

    /// While an injected call runs, answers the ptrace stops of `tids`, threads glass
    /// holds seized but lets run: a signal they are to receive is delivered, a clone
    /// they report is let go on. Otherwise a thread stopped, say, in a signal's delivery
    /// while it held an allocator lock the call needs would hold up the call until it
    /// timed out (the injected dlopen did, now and then, in a process whose threads take
    /// signals and make threads).
    pub fn answer_peers_during_calls(&self, tids: &[i32]) {
        let mut peers = self.peers.borrow_mut();
        peers.running = tids.iter().copied().filter(|&t| t != self.tid).collect();
    }

    /// The threads the peers created during calls, which the attachment must hold too.
    pub fn take_new_peers(&self) -> Vec<i32> {
        std::mem::take(&mut self.peers.borrow_mut().new)
    }

    /// Answers each peer's pending ptrace stop (see
    /// [`StoppedProcess::answer_peers_during_calls`]).
    fn answer_peers(&self) {
        let mut peers = self.peers.borrow_mut();
        let mut index = 0;
        while index < peers.running.len() {
            let tid = peers.running[index];
            index += 1;
            // Looked at first, not taken: a thread's end is the attachment's to reap.
            // SAFETY: waitid writes the siginfo.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            let peeked = unsafe {
                libc::waitid(
                    libc::P_PID,
                    tid as libc::id_t,
                    &mut info,
                    libc::WSTOPPED | libc::WEXITED | libc::WNOHANG | libc::WNOWAIT | libc::__WALL,
                )
            };
            // SAFETY: si_pid is set by a waitid that found a child (0 otherwise).
            if peeked != 0 || unsafe { info.si_pid() } == 0 {
                continue;
            }
            if info.si_code != libc::CLD_TRAPPED {
                index -= 1;
                peers.running.remove(index);
                continue;
            }
            let mut status = 0;
            // SAFETY: waitpid writes the status word.
            let got = unsafe { libc::waitpid(tid, &mut status, libc::__WALL | libc::WNOHANG) };
            if got != tid || !libc::WIFSTOPPED(status) {
                continue;
            }
            if let Some(new_tid) = crate::attach::cloned(tid, status) {
                peers.running.push(new_tid);
                peers.new.push(new_tid);
            }
            let signal = crate::attach::signal_of_stop(status) as usize;
            let _ = ptrace(libc::PTRACE_CONT, tid, 0, signal);
        }
    }

    /// Where injected calls return to (0: none yet).
    pub fn landing(&self) -> u64 {
        self.landing.get()
    }

    /// Uses the landing page a previous attach left in the process (see
    /// [`StoppedProcess::map_landing`]) if `at` still holds glass's landing code.
    pub fn reuse_landing(&self, at: u64) -> bool {
        let code = landing_bytes();
        let same = at != 0 && self.read(at, code.len()).is_ok_and(|bytes| bytes == code);
        if same {
            self.landing.set(at);
        }
        same
    }

    /// Writes the landing of injected calls at `at`: bytes of an executable mapping that
    /// no code of the process reaches (past the end of its file's executable segment, in
    /// the mapping's last page), so that not even the first injected call has to return
    /// to a place that kills the thread if glass dies. The bytes stay (the page was
    /// already a private copy of the file's, or becomes one): a later attach reuses them.
    pub fn place_landing(&self, at: u64) -> io::Result<()> {
        self.write(at, &landing_bytes())?;
        self.landing.set(at);
        Ok(())
    }

    /// Maps a page for the landing of injected calls and writes its code there; returns
    /// its address. The page stays mapped for the life of the process (a later attach
    /// finds it through the probe runtime and reuses it): unmapping it would need a call
    /// that returns through it.
    pub fn map_landing(&self) -> io::Result<u64> {
        let at = self.map_anonymous(4096, libc::PROT_READ | libc::PROT_EXEC)?;
        let code = landing_bytes();
        if let Err(e) = self.write(at, &code) {
            self.unmap(at, 4096);
            return Err(e);
        }
        self.landing.set(at);
        Ok(at)
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    pub fn tid(&self) -> i32 {
        self.tid
    }

    pub fn read(&self, address: u64, len: usize) -> io::Result<Vec<u8>> {
        let mut buffer = vec![0; len];
        self.mem.read_exact_at(&mut buffer, address)?;
        Ok(buffer)
    }

    pub fn write(&self, address: u64, bytes: &[u8]) -> io::Result<()> {
        self.mem.write_all_at(bytes, address)
    }

    pub fn read_u64(&self, address: u64) -> io::Result<u64> {
        let mut word = [0; 8];
        self.mem.read_exact_at(&mut word, address)?;
        Ok(u64::from_le_bytes(word))
    }

    /// Maps `len` bytes of anonymous private memory with `prot` anywhere in the process.
    pub fn map_anonymous(&self, len: u64, prot: i32) -> io::Result<u64> {
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        let at = self.mmap(0, len, prot, flags)?;
        if at < 0 {
            return Err(io::Error::from_raw_os_error(-at as i32));
        }
        Ok(at as u64)
    }

    /// `mmap` of anonymous memory in the process: the address, or a negative errno.
    fn mmap(&self, address: u64, len: u64, prot: i32, flags: i32) -> io::Result<i64> {
        let args = [address, len, prot as u64, flags as u64, u64::MAX, 0];
        let Some(calls) = self.libc else {
            return self.syscall_at_pc(libc::SYS_mmap as u64, args);
        };
        let values: Vec<CallArg> = args.into_iter().map(CallArg::Value).collect();
        let at = self.call(calls.mmap, &values, CALL_LIMIT)?;
        // The C library's mmap says MAP_FAILED and leaves the reason in errno.
        Ok(if at == u64::MAX {
            -(libc::ENOMEM as i64)
        } else {
            at as i64
        })
    }

    /// Unmaps what [`StoppedProcess::map_anonymous`] (or anything else) mapped; best
    /// effort, for clean-up.
    pub fn unmap(&self, address: u64, len: u64) {
        match self.libc {
            Some(calls) => {
                let _ = self.call(
                    calls.munmap,
                    &[CallArg::Value(address), CallArg::Value(len)],
                    CALL_LIMIT,
                );
            }
            None => {
                let _ = self.syscall_at_pc(libc::SYS_munmap as u64, [address, len, 0, 0, 0, 0]);
            }
        }
    }
}

impl StoppedProcess {
    /// Resumes the thread running an injected call (`request`: PTRACE_CONT, or
    /// PTRACE_SYSCALL to see its system calls, with `signal` delivered) and waits for its
    /// next stop, answering the peers' stops in between: the wait status of a ptrace stop,
    /// None for another status to go on from, or how the call ended (the process gone,
    /// or `deadline` passed: the thread is then interrupted where it is).
    fn resume_in_call(
        &self,
        request: libc::c_uint,
        signal: usize,
        first: &mut bool,
        deadline: std::time::Instant,
    ) -> Result<Option<i32>, CallEnd> {
        use std::time::Instant;
        ptrace(request, self.tid, 0, signal)
            .map_err(|e| CallEnd::Faulted(io::Error::from_raw_os_error(e)))?;
        if std::mem::take(first) {
            crate::test_hook(match self.landing.get() {
                0 => "inject-bootstrap",
                _ => "inject-call",
            });
        }
        // Waits in short slices, answering the peers' stops between them.
        let status = loop {
            let slice = (Instant::now() + PEER_ANSWER).min(deadline);
            match crate::attach::wait_thread(self.tid, slice).map_err(CallEnd::Faulted)? {
                Some(status) => break Some(status),
                None if Instant::now() >= deadline => break None,
                None => self.answer_peers(),
            }
        };
        let Some(status) = status else {
            let _ = ptrace(libc::PTRACE_INTERRUPT, self.tid, 0, 0);
            let _ = crate::attach::wait_thread(self.tid, Instant::now() + Duration::from_secs(5));
            return Err(CallEnd::TimedOut(io::Error::other(
                "the injected call did not return in time",
            )));
        };
        if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
            return Err(CallEnd::Ended(io::Error::other(format!(
                "the process ended during the injected call ({})",
                shell_status(status)
            ))));
        }
        Ok(libc::WIFSTOPPED(status).then_some(status))
    }

    /// Maps `len` bytes of read+execute memory within `reach` bytes of every address
    /// in `[low, high)` (x86-64's rel32: 2 GiB; AArch64's B: 128 MiB), from the nearest
    /// free gap in the process's address space.
    pub fn map_code_near(&self, low: u64, high: u64, len: u64, reach: u64) -> io::Result<u64> {
        // A margin for the trampolines' own length.
        let reach = reach - (1 << 20);
        let len = len.div_ceil(4096) * 4096;
        let maps = std::fs::read_to_string(format!("/proc/{}/maps", self.pid))?;
        let mut used: Vec<(u64, u64)> = maps
            .lines()
            .filter_map(|line| {
                let range = line.split_whitespace().next()?;
                let (start, end) = range.split_once('-')?;
                Some((
                    u64::from_str_radix(start, 16).ok()?,
                    u64::from_str_radix(end, 16).ok()?,
                ))
            })
            .collect();
        used.sort_unstable();
        // Candidate starts: just below each mapping and just above it, nearest first.
        let mut candidates: Vec<u64> = used
            .iter()
            .flat_map(|&(start, end)| [start.saturating_sub(len), end])
            .filter(|&c| c >= 0x10000 && c % 4096 == 0)
            .filter(|&c| c + len <= low + reach && c + reach >= high)
            .collect();
        candidates.sort_by_key(|&c| c.abs_diff(low));
        for candidate in candidates {
            let free = used
                .iter()
                .all(|&(start, end)| candidate + len <= start || candidate >= end);
            if !free {
                continue;
            }
            let result = self.mmap(
                candidate,
                len,
                libc::PROT_READ | libc::PROT_EXEC,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            )?;
            if result == candidate as i64 {
                return Ok(candidate);
            }
        }
        Err(io::Error::other(format!(
            "no free address range within {} MiB of {low:#x}",
            (reach + (1 << 20)) >> 20
        )))
    }

    /// Lets the process run on, untraced.
    pub fn detach(mut self) -> io::Result<()> {
        self.detached = true;
        ptrace(libc::PTRACE_DETACH, self.pid, 0, 0).map_err(io::Error::from_raw_os_error)?;
        Ok(())
    }

    /// Ends a process glass could not set up: it must not run half-patched.
    pub fn kill(mut self) {
        self.detached = true;
        // SAFETY: our own child.
        unsafe { libc::kill(self.pid, libc::SIGKILL) };
        let mut status = 0;
        // SAFETY: reaping our child.
        unsafe { libc::waitpid(self.pid, &mut status, libc::__WALL) };
    }
}

impl Drop for StoppedProcess {
    fn drop(&mut self) {
        if !self.detached {
            let _ = ptrace(libc::PTRACE_DETACH, self.pid, 0, 0);
        }
    }
}

/// How an injected call ended without returning.
enum CallEnd {
    /// It faulted, or ptrace failed: the thread's registers are put back.
    Faulted(io::Error),
    /// It did not return in time: the thread is stopped inside it.
    TimedOut(io::Error),
    /// The process is gone.
    Ended(io::Error),
}

impl CallEnd {
    fn into_error(self) -> io::Error {
        match self {
            CallEnd::Faulted(e) | CallEnd::TimedOut(e) | CallEnd::Ended(e) => e,
        }
    }
}

/// How often an injected call's wait answers the peers' stops.
const PEER_ANSWER: Duration = Duration::from_millis(2);

/// Longest a system call made through the C library may take.
const CALL_LIMIT: Duration = Duration::from_secs(10);
