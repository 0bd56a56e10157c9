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
use std::time::{Duration, Instant};

use crate::launch::spawn_paused_with_env;
use crate::TargetError;

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
            peers: Default::default(),
        };
        let entry = entry_point(pid).map_err(TargetError::Io)?;
        let original = process.read(entry, 1).map_err(TargetError::Io)?;
        process.write(entry, &[0xcc]).map_err(TargetError::Io)?;
        ptrace(libc::PTRACE_CONT, pid, 0, 0).map_err(|e| TargetError::Attach(pid, e))?;
        loop {
            let status = wait_stop(pid)?;
            if libc::WIFSTOPPED(status) && libc::WSTOPSIG(status) == libc::SIGTRAP {
                let mut regs = process.registers().map_err(TargetError::Io)?;
                if regs.rip == entry + 1 {
                    process.write(entry, &original).map_err(TargetError::Io)?;
                    regs.rip = entry;
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
        let code = landing_code(xstate_kind());
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
        self.write(at, &landing_code(xstate_kind()))?;
        self.landing.set(at);
        Ok(())
    }

    /// Maps a page for the landing of injected calls and writes its code there; returns
    /// its address. The page stays mapped for the life of the process (a later attach
    /// finds it through the probe runtime and reuses it): unmapping it would need a call
    /// that returns through it.
    pub fn map_landing(&self) -> io::Result<u64> {
        let at = self.map_anonymous(4096, libc::PROT_READ | libc::PROT_EXEC)?;
        let code = landing_code(xstate_kind());
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

    fn registers(&self) -> io::Result<libc::user_regs_struct> {
        crate::attach::registers(self.tid)
    }

    fn set_registers(&self, regs: &libc::user_regs_struct) -> io::Result<()> {
        crate::attach::set_registers(self.tid, regs)
    }

    /// Runs one system call by writing `syscall` at the thread's instruction pointer and
    /// stepping over it; returns its result (negative: -errno). Only for the launch
    /// mode's process, whose only thread is this one: in a running process another
    /// thread could execute the written bytes.
    fn syscall_at_pc(&self, number: u64, args: [u64; 6]) -> io::Result<i64> {
        let saved = self.registers()?;
        let at = saved.rip;
        let code = self.read(at, 2)?;
        self.write(at, &[0x0f, 0x05])?;
        let mut regs = saved;
        regs.rax = number;
        regs.orig_rax = u64::MAX;
        regs.rdi = args[0];
        regs.rsi = args[1];
        regs.rdx = args[2];
        regs.r10 = args[3];
        regs.r8 = args[4];
        regs.r9 = args[5];
        let run = self.set_registers(&regs).and_then(|()| {
            ptrace(libc::PTRACE_SINGLESTEP, self.tid, 0, 0)
                .map_err(io::Error::from_raw_os_error)?;
            loop {
                let status = wait_stop(self.tid).map_err(|e| io::Error::other(e.to_string()))?;
                if libc::WIFSTOPPED(status)
                    && (status >> 16) == 0
                    && libc::WSTOPSIG(status) == libc::SIGTRAP
                {
                    break;
                }
                // A signal arrived instead of the step: keep it pending for later.
                ptrace(libc::PTRACE_SINGLESTEP, self.tid, 0, 0)
                    .map_err(io::Error::from_raw_os_error)?;
            }
            Ok(self.registers()?.rax as i64)
        });
        self.write(at, &code)?;
        self.set_registers(&saved)?;
        run
    }

    /// Calls `function` in the stopped thread with up to six integer arguments, as if
    /// the thread had called it where it stopped (below its red zone, stack aligned),
    /// and returns its result, with the thread's registers (general, x87/SSE/AVX) as
    /// they were. Signals that arrive during the call are delivered to it.
    ///
    /// The call returns to the landing (see [`landing_code`]) with the thread's state
    /// saved just above its return address; glass, watching the thread's system calls,
    /// stops it at the landing's `getpid` and puts its registers back itself. A glass
    /// that dies during the call leaves a thread that finishes the call, restores its
    /// own state at the landing and runs on as if nothing had happened. Before a landing
    /// exists (the first call in a process maps it) the call returns to address 0.
    ///
    /// Gives up after `limit`: with a landing the thread is left to finish the call on
    /// its own (it restores itself when it returns) and takes no other call; without
    /// one its registers are put back, the call's frames abandoned.
    pub fn call(&self, function: u64, args: &[CallArg], limit: Duration) -> io::Result<u64> {
        if self.busy.get() {
            return Err(io::Error::other(
                "the thread is still in an injected call that did not return",
            ));
        }
        let original = resumable(self.registers()?);
        let landing = self.landing.get();
        let xstate = match landing {
            0 => None,
            _ => Some(read_xstate(self.tid, xstate_kind())?),
        };
        let mut regs = original;
        // Past the red zone of whatever the thread was running.
        let mut sp = (original.rsp - 128) & !15;
        let mut values = Vec::new();
        for arg in args {
            match arg {
                CallArg::Value(v) => values.push(*v),
                CallArg::Bytes(bytes) => {
                    sp = (sp - bytes.len() as u64) & !15;
                    self.write(sp, bytes)?;
                    values.push(sp);
                }
            }
        }
        if let Some(xstate) = &xstate {
            sp = (sp - (CONTEXT_XSTATE + xstate.len()) as u64) & !63;
            self.write(sp, &landing_context(&original, xstate))?;
        }
        let registers = [
            &mut regs.rdi,
            &mut regs.rsi,
            &mut regs.rdx,
            &mut regs.rcx,
            &mut regs.r8,
            &mut regs.r9,
        ];
        for (register, value) in registers.into_iter().zip(values) {
            *register = value;
        }
        // The return address; at a function's first instruction rsp + 8 is 16-byte
        // aligned, and the landing finds its context at rsp once the call returned.
        sp -= 8;
        self.write(sp, &landing.to_le_bytes())?;
        regs.rsp = sp;
        regs.rip = function;
        regs.rax = 0;
        regs.orig_rax = u64::MAX;
        regs.eflags &= !TRAP_FLAG;
        self.set_registers(&regs)?;
        let outcome = self.run_call(landing, Instant::now() + limit);
        if matches!(outcome, Err(CallEnd::TimedOut(_))) && landing != 0 {
            self.busy.set(true);
        } else if !matches!(outcome, Err(CallEnd::Ended(_))) {
            self.set_registers(&original)?;
            if let Some(xstate) = &xstate {
                write_xstate(self.tid, xstate_kind(), xstate)?;
            }
        }
        outcome.map_err(CallEnd::into_error)
    }

    /// Runs the thread until the call it was set up for returns: its result.
    fn run_call(&self, landing: u64, deadline: Instant) -> Result<u64, CallEnd> {
        // With a landing, every system call stops the thread (at its entry and exit):
        // the landing's is how glass learns that the call returned.
        let request = match landing {
            0 => libc::PTRACE_CONT,
            _ => libc::PTRACE_SYSCALL,
        };
        let io = CallEnd::Faulted;
        let mut signal = 0;
        let mut first = true;
        loop {
            ptrace(request, self.tid, 0, signal)
                .map_err(|e| io(io::Error::from_raw_os_error(e)))?;
            if std::mem::take(&mut first) {
                crate::test_hook(match landing {
                    0 => "inject-bootstrap",
                    _ => "inject-call",
                });
            }
            signal = 0;
            // Waits in short slices, answering the peers' stops between them.
            let status = loop {
                let slice = (Instant::now() + PEER_ANSWER).min(deadline);
                match crate::attach::wait_thread(self.tid, slice).map_err(io)? {
                    Some(status) => break Some(status),
                    None if Instant::now() >= deadline => break None,
                    None => self.answer_peers(),
                }
            };
            let Some(status) = status else {
                let _ = ptrace(libc::PTRACE_INTERRUPT, self.tid, 0, 0);
                let _ =
                    crate::attach::wait_thread(self.tid, Instant::now() + Duration::from_secs(5));
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
            if !libc::WIFSTOPPED(status) {
                continue;
            }
            let stop = libc::WSTOPSIG(status);
            if stop == libc::SIGTRAP | 0x80 {
                let regs = self.registers().map_err(io)?;
                if landing != 0 && regs.rip == landing + LANDING_CATCH && regs.orig_rax == GETPID {
                    return self.read_u64(regs.rsp).map_err(io);
                }
                continue;
            }
            if (status >> 16) != 0 {
                continue;
            }
            if stop == libc::SIGSEGV && landing == 0 {
                let regs = self.registers().map_err(io)?;
                if regs.rip == 0 {
                    return Ok(regs.rax);
                }
            }
            if matches!(
                stop,
                libc::SIGSEGV | libc::SIGBUS | libc::SIGILL | libc::SIGFPE
            ) {
                let regs = self.registers().map_err(io)?;
                return Err(CallEnd::Faulted(io::Error::other(format!(
                    "the injected call faulted (signal {stop} at {:#x})",
                    regs.rip
                ))));
            }
            signal = stop as usize;
        }
    }

    /// Maps `len` bytes of read+execute memory within ±2 GiB of every address in
    /// `[low, high)`, from the nearest free gap in the process's address space.
    pub fn map_code_near(&self, low: u64, high: u64, len: u64) -> io::Result<u64> {
        const REACH: u64 = (1 << 31) - (1 << 20);
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
            .filter(|&c| c + len <= low + REACH && c + REACH >= high)
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
            "no free address range within 2 GiB of {low:#x}"
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

/// How often an injected call's wait answers the peers' stops.
const PEER_ANSWER: Duration = Duration::from_millis(2);

/// Longest a system call made through the C library may take.
const CALL_LIMIT: Duration = Duration::from_secs(10);
const TRAP_FLAG: u64 = 0x100;
const GETPID: u64 = libc::SYS_getpid as u64;

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

/// A stopped thread's registers as the kernel would resume it, with no system call
/// left for the kernel to restart: stopped in an interrupted system call that is to be
/// restarted (rax -ERESTARTSYS, -ERESTARTNOINTR, -ERESTARTNOHAND or
/// -ERESTART_RESTARTBLOCK, orig_rax the call), the instruction pointer goes back to the
/// 2-byte `syscall` and rax gets the call's number (restart_syscall's for the last),
/// exactly what the kernel does when the thread resumes with no signal handler to run.
/// Registers written back in that form cannot be restarted a second time, wherever the
/// thread was stopped in between (an injected call, the landing, a syscall stop).
pub fn resumable(mut regs: libc::user_regs_struct) -> libc::user_regs_struct {
    const RESTART_SYSCALL: u64 = 219;
    if (regs.orig_rax as i64) >= 0 {
        match regs.rax as i64 {
            -514..=-512 => {
                regs.rax = regs.orig_rax;
                regs.rip = regs.rip.wrapping_sub(2);
            }
            -516 => {
                regs.rax = RESTART_SYSCALL;
                regs.rip = regs.rip.wrapping_sub(2);
            }
            _ => {}
        }
    }
    regs.orig_rax = u64::MAX;
    regs
}

/// How the thread's x87/SSE/AVX state is read and restored: XSAVE's layout where the
/// CPU has it, else FXSAVE's.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum XstateKind {
    Xsave,
    Fxsave,
}

pub fn xstate_kind() -> XstateKind {
    if std::arch::is_x86_feature_detected!("xsave") {
        XstateKind::Xsave
    } else {
        XstateKind::Fxsave
    }
}

const NT_PRFPREG: usize = 2;
const NT_X86_XSTATE: usize = 0x202;

fn regset(kind: XstateKind) -> usize {
    match kind {
        XstateKind::Xsave => NT_X86_XSTATE,
        XstateKind::Fxsave => NT_PRFPREG,
    }
}

fn read_xstate(tid: i32, kind: XstateKind) -> io::Result<Vec<u8>> {
    let mut buffer = vec![0u8; 1 << 14];
    let mut iov = libc::iovec {
        iov_base: buffer.as_mut_ptr().cast(),
        iov_len: buffer.len(),
    };
    ptrace(
        libc::PTRACE_GETREGSET,
        tid,
        regset(kind),
        &mut iov as *mut _ as usize,
    )
    .map_err(io::Error::from_raw_os_error)?;
    buffer.truncate(iov.iov_len);
    Ok(buffer)
}

fn write_xstate(tid: i32, kind: XstateKind, state: &[u8]) -> io::Result<()> {
    let mut copy = state.to_vec();
    let mut iov = libc::iovec {
        iov_base: copy.as_mut_ptr().cast(),
        iov_len: copy.len(),
    };
    ptrace(
        libc::PTRACE_SETREGSET,
        tid,
        regset(kind),
        &mut iov as *mut _ as usize,
    )
    .map_err(io::Error::from_raw_os_error)?;
    Ok(())
}

/// The landing's context, at the stack pointer when the call returns:
/// the result (written by the landing), the 15 general registers, an `iretq` frame
/// (rip, cs, rflags, rsp, ss), and at CONTEXT_XSTATE (64-byte aligned) the x87/SSE/AVX
/// state as ptrace gave it (the standard, uncompacted XSAVE layout, or FXSAVE's).
const CONTEXT_REGISTERS: usize = 8;
const CONTEXT_IRET: usize = 128;
const CONTEXT_XSTATE: usize = 192;
/// The general registers in the context, by their x86 encoding number (rsp, 4, is the
/// iretq frame's).
const RESTORED: [u8; 15] = [0, 1, 2, 3, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];

fn landing_context(regs: &libc::user_regs_struct, xstate: &[u8]) -> Vec<u8> {
    let by_number = |n: u8| match n {
        0 => regs.rax,
        1 => regs.rcx,
        2 => regs.rdx,
        3 => regs.rbx,
        5 => regs.rbp,
        6 => regs.rsi,
        7 => regs.rdi,
        8 => regs.r8,
        9 => regs.r9,
        10 => regs.r10,
        11 => regs.r11,
        12 => regs.r12,
        13 => regs.r13,
        14 => regs.r14,
        _ => regs.r15,
    };
    let mut context = vec![0u8; CONTEXT_XSTATE + xstate.len()];
    for (i, &n) in RESTORED.iter().enumerate() {
        let at = CONTEXT_REGISTERS + 8 * i;
        context[at..at + 8].copy_from_slice(&by_number(n).to_le_bytes());
    }
    let frame = [
        regs.rip,
        regs.cs,
        regs.eflags & !TRAP_FLAG,
        regs.rsp,
        regs.ss,
    ];
    for (i, word) in frame.iter().enumerate() {
        let at = CONTEXT_IRET + 8 * i;
        context[at..at + 8].copy_from_slice(&word.to_le_bytes());
    }
    context[CONTEXT_XSTATE..].copy_from_slice(xstate);
    context
}

/// Where glass stops a thread in the landing: just after its `syscall`.
const LANDING_CATCH: u64 = 11;

/// The code injected calls return to, with rsp at their context:
///
/// ```text
///  0  mov [rsp], rax              the result
///  4  mov eax, 39                 getpid: glass, tracing the thread's system calls,
///  9  syscall                     stops it here (LANDING_CATCH) and restores it itself
/// 11  mov eax, -1; mov edx, -1    (reached only when glass died during the call)
///     xrstor64 [rsp+192]          the x87/SSE/AVX state (fxrstor64 without XSAVE)
///     mov r, [rsp+8+8i]           the 15 general registers but rsp
///     add rsp, 128
///     iretq                       rip, rflags and rsp at once
/// ```
///
/// Written by hand rather than assembled at run time: 23 fixed instructions, decoded
/// back in the tests.
pub fn landing_code(kind: XstateKind) -> Vec<u8> {
    let mut code = vec![0x48, 0x89, 0x04, 0x24, 0xb8, 39, 0, 0, 0, 0x0f, 0x05];
    debug_assert_eq!(code.len() as u64, LANDING_CATCH);
    let disp32 = |code: &mut Vec<u8>, value: usize| {
        code.extend_from_slice(&(value as u32).to_le_bytes());
    };
    // [rsp + disp32] is ModRM mod=10 rm=100 with SIB 0x24.
    match kind {
        XstateKind::Xsave => {
            code.extend_from_slice(&[0xb8, 0xff, 0xff, 0xff, 0xff, 0xba, 0xff, 0xff, 0xff, 0xff]);
            code.extend_from_slice(&[0x48, 0x0f, 0xae, 0x80 | (5 << 3) | 4, 0x24]);
        }
        XstateKind::Fxsave => {
            code.extend_from_slice(&[0x48, 0x0f, 0xae, 0x80 | (1 << 3) | 4, 0x24])
        }
    }
    disp32(&mut code, CONTEXT_XSTATE);
    for (i, &n) in RESTORED.iter().enumerate() {
        let rex = 0x48 | if n >= 8 { 0x04 } else { 0 };
        code.extend_from_slice(&[rex, 0x8b, 0x80 | ((n & 7) << 3) | 4, 0x24]);
        disp32(&mut code, CONTEXT_REGISTERS + 8 * i);
    }
    code.extend_from_slice(&[0x48, 0x81, 0xc4]);
    disp32(&mut code, CONTEXT_IRET);
    code.extend_from_slice(&[0x48, 0xcf]);
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(code: &[u8]) -> Vec<String> {
        let decoder = iced_x86::Decoder::new(64, code, iced_x86::DecoderOptions::NONE);
        let mut formatter = iced_x86::IntelFormatter::new();
        decoder
            .into_iter()
            .map(|instruction| {
                let mut text = String::new();
                iced_x86::Formatter::format(&mut formatter, &instruction, &mut text);
                text
            })
            .collect()
    }

    #[test]
    fn the_landing_saves_the_result_stops_at_getpid_then_restores_everything() {
        for kind in [XstateKind::Xsave, XstateKind::Fxsave] {
            let code = landing_code(kind);
            let text = decode(&code);
            assert_eq!(
                text[..3],
                ["mov [rsp],rax", "mov eax,27h", "syscall"],
                "{kind:?}"
            );
            // glass stops the thread at the syscall's end.
            let catch = decode(&code[..LANDING_CATCH as usize]);
            assert_eq!(catch.len(), 3);
            let restore = match kind {
                XstateKind::Xsave => {
                    assert_eq!(text[3..5], ["mov eax,0FFFFFFFFh", "mov edx,0FFFFFFFFh"]);
                    &text[5]
                }
                XstateKind::Fxsave => &text[3],
            };
            let wanted = match kind {
                XstateKind::Xsave => "xrstor64 [rsp+0C0h]",
                XstateKind::Fxsave => "fxrstor64 [rsp+0C0h]",
            };
            assert_eq!(restore, wanted);
            let loads: Vec<&String> = text.iter().filter(|t| t.starts_with("mov r")).collect();
            // The 15 general registers but rsp, each from its slot of the context.
            assert_eq!(loads.len(), 15, "{text:?}");
            assert!(!loads.iter().any(|t| t.starts_with("mov rsp")));
            for (i, name) in ["rax", "rcx", "rdx", "rbx", "rbp", "rsi", "rdi"]
                .iter()
                .enumerate()
            {
                let slot = CONTEXT_REGISTERS + 8 * [0, 1, 2, 3, 4, 5, 6][i];
                assert!(
                    loads.contains(&&format!("mov {name},[rsp+{slot:X}h]"))
                        || loads.contains(&&format!("mov {name},[rsp+{slot}]")),
                    "{name} at {slot}: {loads:?}"
                );
            }
            assert_eq!(text[text.len() - 2], "add rsp,80h");
            assert_eq!(text[text.len() - 1], "iretq");
        }
    }

    #[test]
    fn the_context_holds_the_registers_in_the_landings_order() {
        let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        regs.rax = 1;
        regs.rbx = 3;
        regs.r15 = 15;
        regs.rip = 0x401000;
        regs.cs = 0x33;
        regs.eflags = 0x246 | TRAP_FLAG;
        regs.rsp = 0x7fff0000;
        regs.ss = 0x2b;
        let context = landing_context(&regs, &[0xaa; 64]);
        let word = |at: usize| u64::from_le_bytes(context[at..at + 8].try_into().unwrap());
        assert_eq!(word(CONTEXT_REGISTERS), 1);
        assert_eq!(word(CONTEXT_REGISTERS + 8 * 3), 3);
        assert_eq!(word(CONTEXT_REGISTERS + 8 * 14), 15);
        assert_eq!(
            [0, 1, 2, 3, 4].map(|i| word(CONTEXT_IRET + 8 * i)),
            [0x401000, 0x33, 0x246, 0x7fff0000, 0x2b]
        );
        assert_eq!(&context[CONTEXT_XSTATE..], &[0xaa; 64]);
    }

    #[test]
    fn a_restartable_system_call_is_put_in_its_restarted_form_once() {
        let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        regs.rip = 0x1002;
        regs.orig_rax = 230;
        regs.rax = (-516i64) as u64;
        let once = resumable(regs);
        assert_eq!((once.rip, once.rax, once.orig_rax), (0x1000, 219, u64::MAX));
        assert_eq!(resumable(once).rip, 0x1000);
        regs.rax = (-512i64) as u64;
        let sys = resumable(regs);
        assert_eq!((sys.rip, sys.rax), (0x1000, 230));
        // Finished (or interrupted without a restart): left as it is.
        regs.rax = (-4i64) as u64;
        let eintr = resumable(regs);
        assert_eq!((eintr.rip, eintr.rax as i64), (0x1002, -4));
    }
}
