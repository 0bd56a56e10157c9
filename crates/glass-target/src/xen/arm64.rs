//! Xen on ARM64: an arm64 domain's vCPU context (Xen 4.17's `vcpu_guest_context` of
//! `public/arch-arm.h`, 352 bytes) as the registers of glass's AArch64 unwinding and
//! glass-mem's AArch64 page walk.
//!
//! ARM has no PV: every domain carries the HVM flag, its stage-1 tables (TTBR0/TTBR1)
//! hold guest-physical addresses, and frames map by GFN through the same
//! [`super::frames`] cache. The context keeps SP_EL0 and SP_EL1 apart: the vCPU's stack
//! pointer is the one its PSTATE selected (EL1h: SP_EL1; EL1t and EL0: SP_EL0).
//! `getvcpucontext`, pause and unpause go in the same multicall as on x86: the domctl
//! and multicall layouts do not change with the architecture (xen_ulong_t is 64-bit on
//! both ARM ABIs).

use super::abi::read_u64;
use crate::arch::aarch64::Aarch64Regs;

/// `sizeof(vcpu_guest_context_t)` on arm64, and the fields glass reads: the core
/// registers start at 8 (after `flags` and its padding), `x0`..`x30` 8 bytes each.
pub const CONTEXT_SIZE: usize = 352;
pub const CONTEXT_X29: usize = 240;
pub const CONTEXT_X30: usize = 248;
/// `pc64` (the vCPU's ELR_EL2) and `cpsr` (its SPSR_EL2, PSTATE at the trap).
pub const CONTEXT_PC: usize = 256;
pub const CONTEXT_CPSR: usize = 264;
pub const CONTEXT_SP_EL0: usize = 296;
pub const CONTEXT_SP_EL1: usize = 304;
pub const CONTEXT_SCTLR: usize = 320;
pub const CONTEXT_TCR: usize = 328;
pub const CONTEXT_TTBR0: usize = 336;
pub const CONTEXT_TTBR1: usize = 344;

/// PSTATE.nRW (M[4]): the vCPU runs AArch32.
const CPSR_AARCH32: u64 = 1 << 4;
/// PSTATE.M[0] (SPSel) at EL1: EL1h, on SP_EL1.
const CPSR_SPSEL: u64 = 1;

/// The registers of one vCPU from its context, or None for a vCPU in AArch32 state
/// (a 32-bit guest, whose registers mean other things).
pub fn registers(context: &[u8]) -> Option<Aarch64Regs> {
    let cpsr = read_u64(context, CONTEXT_CPSR);
    if cpsr & CPSR_AARCH32 != 0 {
        return None;
    }
    let el = (cpsr >> 2) & 3;
    let sp = if el >= 1 && cpsr & CPSR_SPSEL != 0 {
        read_u64(context, CONTEXT_SP_EL1)
    } else {
        read_u64(context, CONTEXT_SP_EL0)
    };
    Some(Aarch64Regs {
        pc: read_u64(context, CONTEXT_PC),
        sp,
        x29: read_u64(context, CONTEXT_X29),
        x30: read_u64(context, CONTEXT_X30),
        cpsr,
        ttbr0_el1: read_u64(context, CONTEXT_TTBR0),
        ttbr1_el1: read_u64(context, CONTEXT_TTBR1),
        tcr_el1: read_u64(context, CONTEXT_TCR),
        sctlr_el1: read_u64(context, CONTEXT_SCTLR),
        ..Aarch64Regs::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context(cpsr: u64) -> Vec<u8> {
        let mut c = vec![0u8; CONTEXT_SIZE];
        for (at, value) in [
            (CONTEXT_X29, 0x29),
            (CONTEXT_X30, 0x30),
            (CONTEXT_PC, 0xffff_ff80_4020_1000),
            (CONTEXT_CPSR, cpsr),
            (CONTEXT_SP_EL0, 0xe0),
            (CONTEXT_SP_EL1, 0xe1),
            (CONTEXT_SCTLR, 1),
            (CONTEXT_TCR, 0x1b5193519),
            (CONTEXT_TTBR0, 0x4020_1000),
            (CONTEXT_TTBR1, 0x4020_2000),
        ] {
            c[at..at + 8].copy_from_slice(&u64::to_le_bytes(value));
        }
        c
    }

    #[test]
    fn stack_pointer_follows_the_exception_level_and_spsel() {
        // EL1h (M = 0b0101), EL1t (0b0100), EL0t (0b0000) with interrupts masked.
        let el1h = registers(&context(0x3c5)).unwrap();
        assert_eq!((el1h.sp, el1h.exception_level()), (0xe1, 1));
        assert_eq!(registers(&context(0x3c4)).unwrap().sp, 0xe0);
        assert_eq!(registers(&context(0x0)).unwrap().sp, 0xe0);
        assert_eq!(el1h.pc, 0xffff_ff80_4020_1000);
        assert_eq!(
            (el1h.x29, el1h.x30, el1h.tcr_el1),
            (0x29, 0x30, 0x1b5193519)
        );
        assert_eq!((el1h.ttbr0_el1, el1h.ttbr1_el1), (0x4020_1000, 0x4020_2000));
        assert!(el1h.mmu_on());
    }

    #[test]
    fn aarch32_vcpus_are_not_read() {
        assert_eq!(registers(&context(0x1d3)), None);
    }
}
