//! AArch64's part of injection: registers through PTRACE_GETREGSET (arm64 has no
//! PTRACE_GETREGS), the launch mode's system calls (an `svc #0` written at the thread's
//! pc and stepped over), and calls into a running process that return to a landing which
//! restores the thread by itself. Writes through /proc/PID/mem reach execution as
//! ptrace's do: the kernel's `copy_to_user_page` cleans and invalidates the caches of an
//! executable page it writes (`flush_ptrace_access`).
//!
//! The landing restores the thread with `rt_sigreturn` on a signal frame glass wrote
//! below the call's stack: the kernel puts back every general register, sp, pc, PSTATE,
//! the FP/SIMD registers and the signal mask at once, which no sequence of user
//! instructions can (the last jump needs a register). glass lets it, and stops the
//! thread at the sigreturn's exit, rather than putting the registers back itself at the
//! landing's `getpid` stop: at a system call stop arm64 ptrace shows x7 as the stop's
//! direction and drops writes to it.
//!
//! A thread stopped in a system call the kernel is to restart is put in its restarted
//! form (pc back on the `svc`, x0 its first argument again) before the first call; its
//! first argument, which the kernel keeps in `orig_x0` and ptrace does not show, is
//! read from /proc/PID/task/TID/syscall.

use super::*;
use std::time::Instant;

/// `brk #0`, written at the entry point by the launch mode; its trap leaves the pc on it.
pub(super) const BREAKPOINT: &[u8] = &0xd420_0000u32.to_le_bytes();
pub(super) const PC_AFTER_BREAKPOINT: u64 = 0;
/// `svc #0`.
const SVC: u32 = 0xd400_0001;

pub(super) fn pc(regs: &libc::user_regs_struct) -> u64 {
    regs.pc
}

pub(super) fn set_pc(regs: &mut libc::user_regs_struct, pc: u64) {
    regs.pc = pc;
}

impl StoppedProcess {
    pub(super) fn registers(&self) -> io::Result<libc::user_regs_struct> {
        crate::attach::registers(self.tid)
    }

    pub(super) fn set_registers(&self, regs: &libc::user_regs_struct) -> io::Result<()> {
        crate::attach::set_registers(self.tid, regs)
    }

    /// Runs one system call by writing `svc #0` at the thread's pc and stepping over
    /// it; returns its result (negative: -errno). Only for the launch mode's process,
    /// whose only thread is this one (see the x86-64 version).
    pub(super) fn syscall_at_pc(&self, number: u64, args: [u64; 6]) -> io::Result<i64> {
        let saved = self.registers()?;
        let at = saved.pc;
        let code = self.read(at, 4)?;
        self.write(at, &SVC.to_le_bytes())?;
        let mut regs = saved;
        regs.regs[8] = number;
        regs.regs[..6].copy_from_slice(&args);
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
            Ok(self.registers()?.regs[0] as i64)
        });
        self.write(at, &code)?;
        self.set_registers(&saved)?;
        run
    }

    /// The thread's registers and FP/SIMD state as they were when glass first took it:
    /// after a landing restored it, those the landing restored (see the module's first
    /// comment); else read now, in their restarted form.
    fn original(&self) -> io::Result<Saved> {
        if let Some(saved) = *self.after_landing.borrow() {
            return Ok(saved);
        }
        Ok(Saved {
            regs: resumable(self.pid, self.tid, self.registers()?)?,
            fpsimd: read_fpsimd(self.tid)?,
        })
    }

    /// The general registers of `tid`, a thread of this process glass holds stopped: for
    /// the thread injected calls run in, those its landing restored (see `original`).
    pub fn thread_registers(&self, tid: i32) -> io::Result<libc::user_regs_struct> {
        match *self.after_landing.borrow() {
            Some(saved) if tid == self.tid => Ok(saved.regs),
            _ => crate::attach::registers(tid),
        }
    }

    /// Sets them (and, for the thread injected calls run in, what a later call restores).
    pub fn set_thread_registers(&self, tid: i32, regs: &libc::user_regs_struct) -> io::Result<()> {
        if tid == self.tid {
            if let Some(saved) = self.after_landing.borrow_mut().as_mut() {
                saved.regs = *regs;
            }
        }
        crate::attach::set_registers(tid, regs)
    }

    /// Calls `function` in the stopped thread with up to six integer arguments, as if the
    /// thread had called it where it stopped (below its stack pointer, 16-byte aligned),
    /// and returns its result, with the thread's registers (general, FP/SIMD, signal mask)
    /// as they were. Signals that arrive during the call are delivered to it.
    ///
    /// The call returns to the landing ([`landing_code`]) with a signal frame of the
    /// thread's state at its stack pointer; the landing stores the result, makes a
    /// `getpid` (where glass learns that the call returned) and an `rt_sigreturn` that
    /// restores everything. A glass that dies during the call leaves a thread that
    /// finishes it and restores itself the same way. Before a landing exists (the first
    /// call in a process maps it) the call returns to address 0, and glass puts the
    /// registers back at the fault.
    ///
    /// Gives up after `limit`: with a landing the thread is left to finish the call on
    /// its own (it restores itself when it returns) and takes no other call; without one
    /// its registers are put back, the call's frames abandoned.
    pub fn call(&self, function: u64, args: &[CallArg], limit: Duration) -> io::Result<u64> {
        if self.busy.get() {
            return Err(io::Error::other(
                "the thread is still in an injected call that did not return",
            ));
        }
        let original = self.original()?;
        let landing = self.landing.get();
        let mut regs = original.regs;
        let mut sp = original.regs.sp.wrapping_sub(128) & !15;
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
        if landing != 0 {
            let frame = signal_frame(&original, blocked_signals(self.pid, self.tid)?);
            sp = (sp - frame.len() as u64) & !15;
            self.write(sp, &frame)?;
        }
        for (register, value) in regs.regs.iter_mut().zip(values) {
            *register = value;
        }
        regs.regs[30] = landing;
        regs.sp = sp;
        regs.pc = function;
        // No branch-target type pending: the call starts as if branched to directly.
        regs.pstate &= !PSTATE_BTYPE;
        self.set_registers(&regs)?;
        // Nothing for the kernel to restart on the way back to user space.
        crate::thread_state::set_syscall_number(self.tid, -1)?;
        let outcome = self.run_call(landing, Instant::now() + limit);
        match &outcome {
            Err(CallEnd::TimedOut(_)) if landing != 0 => self.busy.set(true),
            Err(CallEnd::Ended(_)) => {}
            Ok(_) if landing != 0 => *self.after_landing.borrow_mut() = Some(original),
            _ => {
                self.set_registers(&original.regs)?;
                write_fpsimd(self.tid, &original.fpsimd)?;
                crate::thread_state::set_syscall_number(self.tid, -1)?;
            }
        }
        outcome.map_err(CallEnd::into_error)
    }

    /// Runs the thread until the call it was set up for returns: its result. With a
    /// landing, the thread is left stopped at its `rt_sigreturn`'s exit, restored.
    fn run_call(&self, landing: u64, deadline: Instant) -> Result<u64, CallEnd> {
        let request = match landing {
            0 => libc::PTRACE_CONT,
            _ => libc::PTRACE_SYSCALL,
        };
        let io = CallEnd::Faulted;
        let mut signal = 0;
        let mut first = true;
        let mut result = None;
        let mut returning = false;
        loop {
            let Some(status) =
                self.resume_in_call(request, std::mem::take(&mut signal), &mut first, deadline)?
            else {
                continue;
            };
            let stop = libc::WSTOPSIG(status);
            if stop == libc::SIGTRAP | 0x80 {
                let regs = self.registers().map_err(io)?;
                if landing == 0 {
                    continue;
                }
                if returning {
                    // The exit of the landing's rt_sigreturn: the thread is restored.
                    return result.ok_or_else(|| io(io::Error::other("no result")));
                }
                let number = crate::thread_state::syscall_number(self.tid).map_err(io)?;
                if regs.pc == landing + LANDING_CATCH && number == Some(GETPID) && result.is_none()
                {
                    result = Some(self.read_u64(regs.sp).map_err(io)?);
                } else if regs.pc == landing + LANDING_RETURN && number == Some(RT_SIGRETURN) {
                    returning = result.is_some();
                }
                continue;
            }
            if (status >> 16) != 0 {
                continue;
            }
            if stop == libc::SIGSEGV && landing == 0 {
                let regs = self.registers().map_err(io)?;
                if regs.pc == 0 {
                    return Ok(regs.regs[0]);
                }
            }
            if matches!(
                stop,
                libc::SIGSEGV | libc::SIGBUS | libc::SIGILL | libc::SIGFPE
            ) && result.is_none()
            {
                let regs = self.registers().map_err(io)?;
                return Err(CallEnd::Faulted(io::Error::other(format!(
                    "the injected call faulted (signal {stop} at {:#x})",
                    regs.pc
                ))));
            }
            signal = stop as usize;
        }
    }
}

/// A thread's state as glass keeps it around an injected call.
#[derive(Clone, Copy)]
pub(super) struct Saved {
    regs: libc::user_regs_struct,
    /// NT_PRFPREG's `user_fpsimd_state`: v0-v31, fpsr, fpcr.
    fpsimd: [u8; FPSIMD_BYTES],
}

const NT_PRFPREG: usize = 2;
const FPSIMD_BYTES: usize = 528;
/// PSTATE.BTYPE.
const PSTATE_BTYPE: u64 = 3 << 10;
const GETPID: i64 = libc::SYS_getpid;
const RT_SIGRETURN: i64 = libc::SYS_rt_sigreturn;

fn read_fpsimd(tid: i32) -> io::Result<[u8; FPSIMD_BYTES]> {
    let mut state = [0u8; FPSIMD_BYTES];
    let mut iov = libc::iovec {
        iov_base: state.as_mut_ptr().cast(),
        iov_len: state.len(),
    };
    ptrace(
        libc::PTRACE_GETREGSET,
        tid,
        NT_PRFPREG,
        &mut iov as *mut _ as usize,
    )
    .map_err(io::Error::from_raw_os_error)?;
    Ok(state)
}

fn write_fpsimd(tid: i32, state: &[u8; FPSIMD_BYTES]) -> io::Result<()> {
    let mut copy = *state;
    let mut iov = libc::iovec {
        iov_base: copy.as_mut_ptr().cast(),
        iov_len: copy.len(),
    };
    ptrace(
        libc::PTRACE_SETREGSET,
        tid,
        NT_PRFPREG,
        &mut iov as *mut _ as usize,
    )
    .map_err(io::Error::from_raw_os_error)?;
    Ok(())
}

/// The thread's blocked signals (its `SigBlk` in /proc), which the frame restores.
fn blocked_signals(pid: i32, tid: i32) -> io::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigBlk:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .ok_or_else(|| io::Error::other(format!("no SigBlk in /proc/{pid}/task/{tid}/status")))
}

/// The first argument of the system call a stopped thread is in, as the kernel keeps it
/// for a restart (`orig_x0`): /proc/PID/task/TID/syscall's second field.
fn first_argument(pid: i32, tid: i32) -> io::Result<u64> {
    let line = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall"))?;
    line.split_whitespace()
        .nth(1)
        .and_then(|hex| u64::from_str_radix(hex.trim_start_matches("0x"), 16).ok())
        .ok_or_else(|| io::Error::other(format!("cannot read its system call: {line:?}")))
}

/// A stopped thread's registers as the kernel would resume it, with no system call left
/// for the kernel to restart (see x86-64's `resumable`): stopped in an interrupted call
/// to be restarted, pc goes back to the `svc` and x0 gets the call's first argument
/// again (x8 still holds its number), or x8 gets restart_syscall's number for
/// -ERESTART_RESTARTBLOCK. The caller sets the thread's system call number to -1 when it
/// writes them back.
pub fn resumable(
    pid: i32,
    tid: i32,
    mut regs: libc::user_regs_struct,
) -> io::Result<libc::user_regs_struct> {
    const RESTART_SYSCALL: u64 = 128;
    if crate::thread_state::syscall_number(tid)?.is_some() {
        match regs.regs[0] as i64 {
            -514..=-512 => {
                regs.regs[0] = first_argument(pid, tid)?;
                regs.pc = regs.pc.wrapping_sub(4);
            }
            -516 => {
                regs.regs[8] = RESTART_SYSCALL;
                regs.pc = regs.pc.wrapping_sub(4);
            }
            _ => {}
        }
    }
    Ok(regs)
}

/// Where glass stops a thread in the landing (after its `getpid`'s `svc`), and where its
/// `rt_sigreturn` stops at its entry.
const LANDING_CATCH: u64 = 12;
const LANDING_RETURN: u64 = 20;

/// The code injected calls return to, with sp at their signal frame:
///
/// ```text
///  0  str x0, [sp]        the result, over the frame's siginfo (which sigreturn ignores)
///  4  mov x8, #172        getpid: glass, tracing the thread's system calls, learns here
///  8  svc #0              (LANDING_CATCH) that the call returned
/// 12  mov x8, #139
/// 16  svc #0              rt_sigreturn: every register back from the frame
/// 20  brk #0x3e8          never reached
/// ```
pub fn landing_code() -> Vec<u8> {
    [
        0xf900_03e0u32,
        0xd280_1588,
        SVC,
        0xd280_1168,
        SVC,
        0xd420_7d00,
    ]
    .iter()
    .flat_map(|w| w.to_le_bytes())
    .collect()
}

/// The signal frame (`struct rt_sigframe`: siginfo, then the ucontext) `rt_sigreturn`
/// restores `saved` from, with `blocked` as the signal mask. The alternate signal stack
/// in it is of size 0, which the kernel refuses and so leaves the thread's own as it is.
fn signal_frame(saved: &Saved, blocked: u64) -> Vec<u8> {
    const UC: usize = 128;
    const SIGMASK: usize = UC + 40;
    const MCONTEXT: usize = UC + 176;
    const REGS: usize = MCONTEXT + 8;
    const SP: usize = MCONTEXT + 256;
    const PC: usize = MCONTEXT + 264;
    const PSTATE: usize = MCONTEXT + 272;
    const RESERVED: usize = MCONTEXT + 288;
    const FPSIMD_MAGIC: u32 = 0x4650_8001;
    let mut frame = vec![0u8; RESERVED + 4096];
    let mut put = |at: usize, bytes: &[u8]| frame[at..at + bytes.len()].copy_from_slice(bytes);
    put(SIGMASK, &blocked.to_le_bytes());
    for (i, value) in saved.regs.regs.iter().enumerate() {
        put(REGS + 8 * i, &value.to_le_bytes());
    }
    put(SP, &saved.regs.sp.to_le_bytes());
    put(PC, &saved.regs.pc.to_le_bytes());
    put(PSTATE, &saved.regs.pstate.to_le_bytes());
    // fpsimd_context: its header, fpsr, fpcr, then v0-v31 (ptrace gives v0-v31 first).
    put(RESERVED, &FPSIMD_MAGIC.to_le_bytes());
    put(RESERVED + 4, &(FPSIMD_BYTES as u32).to_le_bytes());
    put(RESERVED + 8, &saved.fpsimd[512..520]);
    put(RESERVED + 16, &saved.fpsimd[..512]);
    // Then the terminating empty record (already zeros).
    frame
}
