//! AArch64's part of injection: registers through PTRACE_GETREGSET (arm64 has no
//! PTRACE_GETREGS), and the launch mode's system calls, an `svc #0` written at the
//! thread's pc and stepped over. Writes through /proc/PID/mem reach execution as
//! ptrace's do: the kernel's `copy_to_user_page` cleans and invalidates the caches of
//! an executable page it writes (`flush_ptrace_access`). Calls into a running process
//! (`glass trace --pid`'s) are not built for AArch64 yet.

use super::*;

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

    /// Calls into a running process are x86-64 only so far (`glass trace --pid`).
    pub fn call(&self, _function: u64, _args: &[CallArg], _limit: Duration) -> io::Result<u64> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "calls injected into a running process are built for x86-64 only so far",
        ))
    }
}
