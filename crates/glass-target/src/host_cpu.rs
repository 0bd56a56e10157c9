//! What glass asks of the CPU it runs on when it writes code another CPU will run: the
//! instruction cache made to see the bytes, and the generic timer's rate.
//!
//! On x86-64 instruction fetch snoops stores, so there is nothing to do. On AArch64 it
//! does not: bytes glass stores through its own mapping of a guest's memory (Xen's
//! foreign mapping, QEMU's RAM memfd) reach another CPU's instruction fetch only once
//! their data-cache lines are cleaned to the point of unification (`dc cvau`) and the
//! instruction-cache lines holding the old bytes are invalidated (`ic ivau`), each
//! followed by a `dsb ish`. Both operations are broadcast in the inner shareable domain,
//! so they reach the CPU that will run the code whichever it is; that CPU's next context
//! synchronisation (the exception return into the guest after a pause) discards what it
//! had prefetched. CTR_EL0 gives the line sizes, and says (IDC, DIC) where a step is not
//! needed. Written here because no crate of the field wraps these instructions for
//! user space (the kernel's `caches_clean_inval_pou` does the same).

/// Makes the `len` bytes at `pointer`, just written through this process's mapping,
/// what every CPU fetches from that memory (see the module comment). Nothing to do on
/// x86-64.
///
/// # Safety
/// `pointer..pointer + len` is mapped in this process.
#[cfg(target_arch = "aarch64")]
pub unsafe fn written(pointer: *const u8, len: usize) {
    use std::arch::asm;
    if len == 0 {
        return;
    }
    let ctr: u64;
    // SAFETY: CTR_EL0 is readable at EL0 under Linux (SCTLR_EL1.UCT, or trapped and
    // emulated by the kernel).
    unsafe { asm!("mrs {}, ctr_el0", out(reg) ctr, options(nomem, nostack)) };
    let data_line = 4usize << ((ctr >> 16) & 0xf);
    let instruction_line = 4usize << (ctr & 0xf);
    let (idc, dic) = (ctr >> 28 & 1 != 0, ctr >> 29 & 1 != 0);
    let start = pointer as usize;
    let end = start + len;
    if !idc {
        let mut line = start & !(data_line - 1);
        while line < end {
            // SAFETY: a mapped line (the caller's range); cleaning changes no data.
            unsafe { asm!("dc cvau, {}", in(reg) line, options(nostack)) };
            line += data_line;
        }
    }
    // SAFETY: barriers only.
    unsafe { asm!("dsb ish", options(nostack)) };
    if !dic {
        let mut line = start & !(instruction_line - 1);
        while line < end {
            // SAFETY: a mapped line; invalidating the instruction cache changes no data.
            unsafe { asm!("ic ivau, {}", in(reg) line, options(nostack)) };
            line += instruction_line;
        }
        // SAFETY: barriers only.
        unsafe { asm!("dsb ish", options(nostack)) };
    }
    // SAFETY: a context synchronisation of this CPU only.
    unsafe { asm!("isb", options(nostack)) };
}

/// See the AArch64 version: x86-64's instruction fetch sees stores by itself.
///
/// # Safety
/// None needed; unsafe to match the AArch64 version.
#[cfg(not(target_arch = "aarch64"))]
pub unsafe fn written(_pointer: *const u8, _len: usize) {}

/// The generic timer's frequency (CNTFRQ_EL0), which every CPU's and every guest's
/// CNTVCT_EL0 counts at; None where there is none (x86-64).
pub fn generic_timer_hz() -> Option<u64> {
    #[cfg(target_arch = "aarch64")]
    {
        let hz: u64;
        // SAFETY: CNTFRQ_EL0 is readable at EL0 (CNTKCTL_EL1.EL0VCTEN, set by Linux).
        unsafe { std::arch::asm!("mrs {}, cntfrq_el0", out(reg) hz, options(nomem, nostack)) };
        (hz != 0).then_some(hz)
    }
    #[cfg(not(target_arch = "aarch64"))]
    {
        None
    }
}
