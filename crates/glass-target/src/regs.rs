//! Reading a stopped thread's registers, one implementation per architecture. Both use
//! `PTRACE_GETREGSET` with `NT_PRSTATUS`: one system call for the whole set.

use glass_unwind::UnwindRegs;

/// What a sample needs from a stopped thread.
#[derive(Debug, Clone, Copy, Default)]
pub struct SampleRegs {
    pub unwind: UnwindRegs,
    /// The thread was inside a system call (off-CPU) when it stopped.
    pub in_syscall: bool,
}

#[cfg(target_arch = "x86_64")]
type RawRegs = libc::user_regs_struct;
#[cfg(target_arch = "aarch64")]
type RawRegs = libc::user_regs_struct;

pub fn read(tid: i32) -> Result<SampleRegs, i32> {
    let mut raw = std::mem::MaybeUninit::<RawRegs>::zeroed();
    let mut iov = libc::iovec {
        iov_base: raw.as_mut_ptr().cast(),
        iov_len: std::mem::size_of::<RawRegs>(),
    };
    // SAFETY: the kernel writes at most iov_len bytes into `raw`, a plain-data struct.
    let result = unsafe {
        libc::ptrace(
            libc::PTRACE_GETREGSET,
            tid,
            libc::NT_PRSTATUS as usize as *mut libc::c_void,
            &mut iov as *mut libc::iovec,
        )
    };
    if result < 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
    }
    // SAFETY: zero-initialised and filled by the kernel; every bit pattern is valid.
    let raw = unsafe { raw.assume_init() };
    Ok(convert(&raw))
}

#[cfg(target_arch = "x86_64")]
fn convert(raw: &RawRegs) -> SampleRegs {
    SampleRegs {
        unwind: UnwindRegs::new(raw.rip, raw.rsp, raw.rbp),
        // orig_rax holds the system call number while the thread is inside one.
        in_syscall: raw.orig_rax as i64 >= 0,
    }
}

#[cfg(target_arch = "aarch64")]
fn convert(raw: &RawRegs) -> SampleRegs {
    SampleRegs {
        unwind: UnwindRegs::new(raw.pc, raw.sp, raw.regs[29]),
        in_syscall: false,
    }
}
