//! AArch64: pc, sp, the frame pointer x29, the link register x30 (the leaf's return
//! address until saved), and the EL1 system registers of the stage-1 walk (TTBR0_EL1,
//! TTBR1_EL1, TCR_EL1, SCTLR_EL1). QEMU's stub sends the first five in `g` and the
//! system registers only on `p` requests (feature `org.qemu.gdb.arm.sys.regs`), and
//! names SCTLR_EL1 `SCTLR`.

use glass_unwind::UnwindRegs;

/// SCTLR_EL1.M: the stage-1 MMU is on.
const SCTLR_M: u64 = 1;

/// The names asked of a backend, each with the aliases stubs use; the order of
/// [`Aarch64Regs::from_values`].
pub const NAMES: &[&[&str]] = &[
    &["pc"],
    &["sp"],
    &["x29"],
    &["x30"],
    &["cpsr"],
    &["TTBR0_EL1"],
    &["TTBR1_EL1"],
    &["TCR_EL1"],
    &["SCTLR_EL1", "SCTLR"],
];

/// How many of [`NAMES`] a backend must have (the rest read as 0 when missing).
pub const REQUIRED: usize = 4;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Aarch64Regs {
    pub pc: u64,
    pub sp: u64,
    pub x29: u64,
    pub x30: u64,
    pub cpsr: u64,
    pub ttbr0_el1: u64,
    pub ttbr1_el1: u64,
    pub tcr_el1: u64,
    pub sctlr_el1: u64,
}

impl Aarch64Regs {
    pub fn from_values(values: &[u64]) -> Self {
        let at = |i: usize| values.get(i).copied().unwrap_or(0);
        Aarch64Regs {
            pc: at(0),
            sp: at(1),
            x29: at(2),
            x30: at(3),
            cpsr: at(4),
            ttbr0_el1: at(5),
            ttbr1_el1: at(6),
            tcr_el1: at(7),
            sctlr_el1: at(8),
        }
    }

    pub fn unwind(&self) -> UnwindRegs {
        UnwindRegs {
            lr: self.x30,
            va_bits: self.va_bits(),
            ..UnwindRegs::new(self.pc, self.sp, self.x29)
        }
    }

    /// The virtual address sizes of the lower and upper halves (64 - T0SZ, 64 - T1SZ),
    /// [0, 0] where TCR_EL1 is unknown.
    pub fn va_bits(&self) -> [u8; 2] {
        if self.tcr_el1 == 0 {
            return [0; 2];
        }
        let bits = |tsz: u64| 64 - (tsz & 0x3f).min(63) as u8;
        [bits(self.tcr_el1), bits(self.tcr_el1 >> 16)]
    }

    pub fn mmu_on(&self) -> bool {
        self.sctlr_el1 & SCTLR_M != 0
    }

    /// The exception level the vCPU was at (CPSR.M[3:2]).
    pub fn exception_level(&self) -> u8 {
        ((self.cpsr >> 2) & 3) as u8
    }
}
