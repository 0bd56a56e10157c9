//! x86-64: the instruction, stack and frame pointers, and the control registers of the
//! page-table walk (CR3 its root, CR4.LA57 its depth, EFER.LMA long mode), and the GS
//! bases a Linux guest's current task is found through (`--guest-btf`: the kernel's
//! per-CPU area is GS in the kernel, KERNEL_GS_BASE in user mode after `swapgs`).

use glass_unwind::UnwindRegs;

/// EFER.LMA: the vCPU runs in long mode.
const EFER_LMA: u64 = 1 << 10;

/// The names asked of a backend, each with the aliases stubs use; the order of
/// [`X86Regs::from_values`].
pub const NAMES: &[&[&str]] = &[
    &["rip"],
    &["rsp"],
    &["rbp"],
    &["cr3"],
    &["cr4"],
    &["efer"],
    &["gs_base"],
    &["k_gs_base"],
];

/// The names from here on find a Linux guest's current task (`--guest-btf`) only.
pub const TASK_REGISTERS_FROM: usize = 6;

/// How many of [`NAMES`] a backend must have (the rest read as 0 when missing).
pub const REQUIRED: usize = 3;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct X86Regs {
    pub ip: u64,
    pub sp: u64,
    pub fp: u64,
    pub cr3: u64,
    pub cr4: u64,
    pub efer: u64,
    pub gs_base: u64,
    pub k_gs_base: u64,
}

impl X86Regs {
    pub fn from_values(values: &[u64]) -> Self {
        let at = |i: usize| values.get(i).copied().unwrap_or(0);
        X86Regs {
            ip: at(0),
            sp: at(1),
            fp: at(2),
            cr3: at(3),
            cr4: at(4),
            efer: at(5),
            gs_base: at(6),
            k_gs_base: at(7),
        }
    }

    pub fn unwind(&self) -> UnwindRegs {
        UnwindRegs::new(self.ip, self.sp, self.fp)
    }

    pub fn long_mode(&self) -> bool {
        self.efer & EFER_LMA != 0
    }
}
