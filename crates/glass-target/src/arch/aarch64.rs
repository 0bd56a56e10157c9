//! AArch64: pc, sp, the frame pointer x29, the link register x30 (the leaf's return
//! address until saved), and the EL1 system registers of the stage-1 walk (TTBR0_EL1,
//! TTBR1_EL1, TCR_EL1, SCTLR_EL1). QEMU's stub sends the first five in `g` and the
//! system registers only on `p` requests (feature `org.qemu.gdb.arm.sys.regs`), and
//! names SCTLR_EL1 `SCTLR` and VBAR_EL1 `VBAR`.
//!
//! A vCPU stopped on an exception vector entry (QEMU delivers a pending IRQ before it
//! honours the stop) has run nothing of the handler: its registers are the interrupted
//! context's but for the pc, the PSTATE and, from EL0, the stack pointer. The sample is
//! taken as that context (ELR_EL1, SPSR_EL1, SP_EL0): otherwise `vectors` is a leaf with no
//! caller (8-10% of a Linux guest's samples).
//!
//! TPIDR_EL1 (the CPU's per-CPU offset) and SP_EL0 (the current task while the kernel
//! runs) find a Linux guest's current task (`--guest-btf`).

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
    &["VBAR_EL1", "VBAR"],
    &["ELR_EL1"],
    &["SPSR_EL1"],
    &["SP_EL0"],
    &["TPIDR_EL1"],
];

/// The names from here on find a Linux guest's current task (`--guest-btf`) only
/// (SP_EL0, which holds it in the kernel, is read for vector entries anyway).
pub const TASK_REGISTERS_FROM: usize = 13;

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
    pub vbar_el1: u64,
    pub elr_el1: u64,
    pub spsr_el1: u64,
    pub sp_el0: u64,
    pub tpidr_el1: u64,
}

/// The vector table's size: 16 entries of 0x80 bytes.
const VECTORS_SIZE: u64 = 0x800;
const VECTOR_ENTRY: u64 = 0x80;

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
            vbar_el1: at(9),
            elr_el1: at(10),
            spsr_el1: at(11),
            sp_el0: at(12),
            tpidr_el1: at(13),
        }
        .interrupted()
    }

    /// Inside one of the kernel's vector tables at `tables` (from its symbols) with an
    /// exception from EL0: with KPTI, VBAR_EL1 is the trampoline's alias and the stop
    /// comes after the trampoline branched into the table proper. Nothing of the user's
    /// context has been saved or changed there but x30 (the trampoline's scratch): the
    /// user pc (ELR_EL1) and stack pointer (SP_EL0) are taken.
    pub fn interrupted_in_tables(&mut self, tables: &[u64]) {
        let inside = tables
            .iter()
            .any(|&t| self.pc >= t && self.pc - t < VECTORS_SIZE);
        if inside && self.exception_level() == 1 && (self.spsr_el1 >> 2) & 3 == 0 {
            *self = Aarch64Regs {
                pc: self.elr_el1,
                cpsr: self.spsr_el1,
                sp: self.sp_el0,
                x30: 0,
                ..*self
            };
        }
    }

    /// On an exception vector entry: the interrupted context (see the module comment);
    /// otherwise the registers as they are.
    fn interrupted(self) -> Self {
        let on_entry = self.vbar_el1 != 0
            && self.pc >= self.vbar_el1
            && self.pc - self.vbar_el1 < VECTORS_SIZE
            && (self.pc - self.vbar_el1).is_multiple_of(VECTOR_ENTRY);
        if !on_entry {
            return self;
        }
        let from_el0 = (self.spsr_el1 >> 2) & 3 == 0;
        Aarch64Regs {
            pc: self.elr_el1,
            cpsr: self.spsr_el1,
            // SPSR.M[0] (SPSel) at EL1: which stack pointer the interrupted code used.
            sp: if from_el0 || self.spsr_el1 & 1 == 0 {
                self.sp_el0
            } else {
                self.sp
            },
            ..self
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

#[cfg(test)]
mod tests {
    use super::*;

    const VBAR: u64 = 0xffff_8000_0801_0800;

    fn stopped(pc: u64, sp: u64, spsr: u64) -> Aarch64Regs {
        let mut values = [0u64; 13];
        values[0] = pc;
        values[1] = sp;
        values[4] = 0x3c5; // EL1h, interrupts masked: the vector's own PSTATE
        values[9] = VBAR;
        values[10] = 0xffff_8000_0845_1234;
        values[11] = spsr;
        values[12] = 0x0000_ffff_f000_0000;
        Aarch64Regs::from_values(&values)
    }

    #[test]
    fn a_vcpu_on_a_vector_entry_is_sampled_as_the_interrupted_context() {
        // An IRQ from EL1h (SPSR 0x3c5 -> M = 0b0101): the kernel's own stack pointer.
        let r = stopped(VBAR + 0x280, 0xffff_8000_0a00_3f00, 0x80000005);
        assert_eq!(
            (r.pc, r.sp, r.exception_level()),
            (0xffff_8000_0845_1234, 0xffff_8000_0a00_3f00, 1)
        );
        // From EL0: the user stack pointer.
        let r = stopped(VBAR + 0x480, 0xffff_8000_0a00_3f00, 0x0);
        assert_eq!(
            (r.pc, r.sp, r.exception_level()),
            (0xffff_8000_0845_1234, 0x0000_ffff_f000_0000, 0)
        );
        // Inside an entry, or elsewhere: as stopped.
        let r = stopped(VBAR + 0x284, 0x1000, 0x5);
        assert_eq!(r.pc, VBAR + 0x284);
        let r = stopped(0xffff_8000_0900_0000, 0x1000, 0x5);
        assert_eq!(r.pc, 0xffff_8000_0900_0000);
    }
}
