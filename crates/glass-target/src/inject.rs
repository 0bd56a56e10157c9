//! Changing a stopped process from outside, for `glass trace`: its memory is written
//! through `/proc/PID/mem` (which may write read-only code pages, as a debugger's
//! breakpoints do: the same effect as mprotect around the write, without changing the
//! mapping's permissions), and system calls run in it by pointing a stopped thread at a
//! `syscall` instruction with the arguments in its registers.
//!
//! Launch mode stops the new program at its ELF entry point: by then the dynamic loader
//! has mapped every library and run their constructors (the probe runtime's among them),
//! and not one instruction of the program itself has run.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

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
        })
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
        let at = self.syscall(
            libc::SYS_mmap as u64,
            [0, len, prot as u64, flags as u64, u64::MAX, 0],
        )?;
        if at < 0 {
            return Err(io::Error::from_raw_os_error(-at as i32));
        }
        Ok(at as u64)
    }

    /// Unmaps what [`StoppedProcess::map_anonymous`] (or anything else) mapped; best
    /// effort, for clean-up.
    pub fn unmap(&self, address: u64, len: u64) {
        let _ = self.syscall(libc::SYS_munmap as u64, [address, len, 0, 0, 0, 0]);
    }

    fn registers(&self) -> io::Result<libc::user_regs_struct> {
        crate::attach::registers(self.tid)
    }

    fn set_registers(&self, regs: &libc::user_regs_struct) -> io::Result<()> {
        crate::attach::set_registers(self.tid, regs)
    }

    /// Runs one system call in the process and returns its result (negative: -errno).
    pub fn syscall(&self, number: u64, args: [u64; 6]) -> io::Result<i64> {
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
                if libc::WIFSTOPPED(status) && libc::WSTOPSIG(status) == libc::SIGTRAP {
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
    /// and returns its result. It returns to `trap`, an `int3` glass placed in the
    /// process. The thread's registers are restored afterwards, and signals that arrive
    /// during the call are delivered to it. Gives up after `limit`, leaving the thread
    /// as it was before the call (the call's frames abandoned).
    pub fn call(
        &self,
        function: u64,
        args: &[CallArg],
        trap: u64,
        limit: std::time::Duration,
    ) -> io::Result<u64> {
        let saved = self.registers()?;
        let mut regs = saved;
        // Past the red zone of whatever the thread was running.
        let mut sp = (saved.rsp - 512) & !15;
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
        // At a function's first instruction rsp + 8 is 16-byte aligned.
        sp -= 8;
        self.write(sp, &trap.to_le_bytes())?;
        regs.rsp = sp;
        regs.rip = function;
        regs.rax = 0;
        // Not in a system call: the kernel must not restart one when the thread runs.
        regs.orig_rax = u64::MAX;
        self.set_registers(&regs)?;
        let outcome = self.run_until_trap(trap, limit);
        let restored = self.set_registers(&saved);
        let result = outcome?;
        restored?;
        Ok(result)
    }

    fn run_until_trap(&self, trap: u64, limit: std::time::Duration) -> io::Result<u64> {
        let deadline = std::time::Instant::now() + limit;
        let mut signal = 0;
        loop {
            ptrace(libc::PTRACE_CONT, self.tid, 0, signal).map_err(io::Error::from_raw_os_error)?;
            let Some(status) = crate::attach::wait_thread(self.tid, deadline)? else {
                let _ = ptrace(libc::PTRACE_INTERRUPT, self.tid, 0, 0);
                let _ = crate::attach::wait_thread(
                    self.tid,
                    std::time::Instant::now() + std::time::Duration::from_secs(5),
                );
                return Err(io::Error::other(format!(
                    "the injected call did not return within {:.1} s",
                    limit.as_secs_f64()
                )));
            };
            if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
                return Err(io::Error::other(format!(
                    "the process ended during the injected call ({})",
                    shell_status(status)
                )));
            }
            signal = 0;
            if (status >> 16) != 0 {
                continue;
            }
            let stop = libc::WSTOPSIG(status);
            if stop == libc::SIGTRAP {
                let regs = self.registers()?;
                if regs.rip == trap + 1 {
                    return Ok(regs.rax);
                }
            }
            if matches!(
                stop,
                libc::SIGSEGV | libc::SIGBUS | libc::SIGILL | libc::SIGFPE
            ) {
                let regs = self.registers()?;
                return Err(io::Error::other(format!(
                    "the injected call faulted (signal {stop} at {:#x})",
                    regs.rip
                )));
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
            let result = self.syscall(
                libc::SYS_mmap as u64,
                [
                    candidate,
                    len,
                    (libc::PROT_READ | libc::PROT_EXEC) as u64,
                    (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE) as u64,
                    u64::MAX,
                    0,
                ],
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
