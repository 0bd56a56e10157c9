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

    /// On the first instruction of an interrupt or exception entry (QEMU delivers a
    /// pending interrupt before it honours the stop), the context it interrupted, from
    /// the hardware frame at the stack pointer (`frame`: its first six words): RIP, CS,
    /// RFLAGS, RSP, SS, after an error code for the exceptions that push one. Told by
    /// CS, which must be Linux's kernel or user code segment. rbp is the interrupted
    /// code's still.
    pub fn interrupted(&mut self, frame: &[u64; 6]) {
        const CODE_SEGMENTS: [u64; 3] = [0x10, 0x33, 0x23];
        let at = (0..2).find(|&k| CODE_SEGMENTS.contains(&frame[k + 1]));
        if let Some(k) = at {
            self.ip = frame[k];
            self.sp = frame[k + 3];
        }
    }

    pub fn long_mode(&self) -> bool {
        self.efer & EFER_LMA != 0
    }
}
