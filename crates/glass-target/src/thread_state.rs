//! What `glass trace --pid` reads and changes of a thread it holds stopped, the same on
//! every architecture: where it resumes, its stack, the system call it is in (and whether
//! the kernel will restart it), and its thread pointer. The registers behind them are
//! each architecture's own (x86-64: PTRACE_GETREGS; AArch64: PTRACE_GETREGSET of
//! NT_PRSTATUS, NT_ARM_SYSTEM_CALL and NT_ARM_TLS, arm64 having no PTRACE_GETREGS).

use std::io;

#[cfg(target_arch = "aarch64")]
use crate::attach::ptrace;
use crate::attach::{registers, set_registers};

/// The system call return values with which the kernel restarts the call when the
/// thread resumes without a handler to run (-ERESTARTSYS, -ERESTARTNOINTR,
/// -ERESTARTNOHAND, -ERESTART_RESTARTBLOCK).
pub const RESTARTING: [i64; 4] = [-512, -513, -514, -516];

/// Bytes of the instruction that makes a system call (`syscall`, `svc #0`): a restarted
/// call resumes that far back.
pub const SYSCALL_INSTRUCTION: u64 = if cfg!(target_arch = "aarch64") { 4 } else { 2 };

/// A stopped thread, as glass's tracer needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadState {
    /// Where it resumes.
    pub pc: u64,
    pub sp: u64,
    /// The system call it is in (stopped inside one), if any.
    pub syscall: Option<i64>,
    /// That call returned a value with which the kernel restarts it: the thread resumes
    /// [`SYSCALL_INSTRUCTION`] bytes before `pc`.
    pub restarting: bool,
    /// The thread pointer (fs base; TPIDR_EL0), where its TLS lies.
    pub thread_pointer: u64,
}

impl ThreadState {
    /// Where the thread resumes: `pc` and, for a call the kernel restarts, the system
    /// call instruction before it. Both must be outside code glass changes.
    pub fn resume_points(&self) -> [u64; 2] {
        [
            self.pc,
            self.pc.wrapping_sub(if self.restarting {
                SYSCALL_INSTRUCTION
            } else {
                0
            }),
        ]
    }
}

#[cfg(target_arch = "x86_64")]
pub fn thread_state(tid: i32) -> io::Result<ThreadState> {
    let regs = registers(tid)?;
    let syscall = (regs.orig_rax as i64 >= 0).then_some(regs.orig_rax as i64);
    Ok(ThreadState {
        pc: regs.rip,
        sp: regs.rsp,
        syscall,
        restarting: syscall.is_some() && RESTARTING.contains(&(regs.rax as i64)),
        thread_pointer: regs.fs_base,
    })
}

#[cfg(target_arch = "aarch64")]
pub fn thread_state(tid: i32) -> io::Result<ThreadState> {
    let regs = registers(tid)?;
    let syscall = syscall_number(tid)?;
    Ok(ThreadState {
        pc: regs.pc,
        sp: regs.sp,
        syscall,
        restarting: syscall.is_some() && RESTARTING.contains(&(regs.regs[0] as i64)),
        thread_pointer: regset_word(tid, NT_ARM_TLS)?,
    })
}

/// Moves a stopped thread's pc (nothing else changes; a restart the kernel has yet to
/// make goes back from the new pc).
pub fn set_pc(tid: i32, pc: u64) -> io::Result<()> {
    let mut regs = registers(tid)?;
    #[cfg(target_arch = "x86_64")]
    {
        regs.rip = pc;
    }
    #[cfg(target_arch = "aarch64")]
    {
        regs.pc = pc;
    }
    set_registers(tid, &regs)
}

#[cfg(target_arch = "aarch64")]
const NT_ARM_TLS: usize = 0x401;
#[cfg(target_arch = "aarch64")]
const NT_ARM_SYSTEM_CALL: usize = 0x404;

/// The system call a stopped thread is in (its `syscallno`; -1: none).
#[cfg(target_arch = "aarch64")]
pub fn syscall_number(tid: i32) -> io::Result<Option<i64>> {
    let mut number: i32 = -1;
    let mut iov = libc::iovec {
        iov_base: &mut number as *mut i32 as *mut libc::c_void,
        iov_len: 4,
    };
    ptrace(
        libc::PTRACE_GETREGSET,
        tid,
        NT_ARM_SYSTEM_CALL,
        &mut iov as *mut _ as usize,
    )
    .map_err(io::Error::from_raw_os_error)?;
    Ok((number >= 0).then_some(number as i64))
}

/// Sets the system call a stopped thread is in: -1 leaves none for the kernel to restart
/// (or, at a system call's entry, skips it).
#[cfg(target_arch = "aarch64")]
pub fn set_syscall_number(tid: i32, number: i32) -> io::Result<()> {
    let mut value = number;
    let mut iov = libc::iovec {
        iov_base: &mut value as *mut i32 as *mut libc::c_void,
        iov_len: 4,
    };
    ptrace(
        libc::PTRACE_SETREGSET,
        tid,
        NT_ARM_SYSTEM_CALL,
        &mut iov as *mut _ as usize,
    )
    .map_err(io::Error::from_raw_os_error)?;
    Ok(())
}

#[cfg(target_arch = "aarch64")]
fn regset_word(tid: i32, set: usize) -> io::Result<u64> {
    let mut word = 0u64;
    let mut iov = libc::iovec {
        iov_base: &mut word as *mut u64 as *mut libc::c_void,
        iov_len: 8,
    };
    ptrace(
        libc::PTRACE_GETREGSET,
        tid,
        set,
        &mut iov as *mut _ as usize,
    )
    .map_err(io::Error::from_raw_os_error)?;
    Ok(word)
}

/// System calls a thread may be waiting in while `glass trace --pid` uses it to load the
/// runtime: waits that hold no lock of the C library's (read, poll, sleep, futex, wait,
/// accept, ...), so a thread stopped in one is at a safe point for injected calls even
/// inside the C library.
pub const WAITING_SYSCALLS: &[i64] = &[
    libc::SYS_read,
    libc::SYS_ppoll,
    libc::SYS_pselect6,
    libc::SYS_nanosleep,
    libc::SYS_clock_nanosleep,
    libc::SYS_accept,
    libc::SYS_accept4,
    libc::SYS_recvfrom,
    libc::SYS_recvmsg,
    libc::SYS_wait4,
    libc::SYS_waitid,
    libc::SYS_rt_sigsuspend,
    libc::SYS_rt_sigtimedwait,
    libc::SYS_futex,
    libc::SYS_epoll_pwait,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_poll,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_select,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_pause,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_epoll_wait,
];
