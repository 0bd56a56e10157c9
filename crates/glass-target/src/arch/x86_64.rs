//! x86-64 (and 32-bit x86 guests, whose registers the same stub gives zero-extended):
//! the instruction, stack and frame pointers, and the control registers of the
//! page-table walk (CR3 its root, CR0.PE/PG, CR4.PAE/PSE/LA57 and EFER.LMA its mode), and the GS
//! bases a Linux guest's current task is found through (`--guest-btf`: the kernel's
//! per-CPU area is GS in the kernel, KERNEL_GS_BASE in user mode after `swapgs`).

use glass_unwind::UnwindRegs;

/// EFER.LMA: the vCPU runs in long mode.
const EFER_LMA: u64 = 1 << 10;
/// CR0.PE: protected mode (clear: real mode, the firmware's).
const CR0_PE: u64 = 1;
/// CR0.PG: paging on.
const CR0_PG: u64 = 1 << 31;

/// The names asked of a backend, each with the aliases stubs use; the order of
/// [`X86Regs::from_values`].
pub const NAMES: &[&[&str]] = &[
    &["rip"],
    &["rsp"],
    &["rbp"],
    &["cr3"],
    &["cr4"],
    &["efer"],
    &["cr0"],
    &["gs_base"],
    &["k_gs_base"],
];

/// The names from here on find a Linux guest's current task (`--guest-btf`) only.
pub const TASK_REGISTERS_FROM: usize = 7;

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
    /// 0 where the backend lacks it: read as real mode unless EFER.LMA says long mode.
    pub cr0: u64,
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
            cr0: at(6),
            gs_base: at(7),
            k_gs_base: at(8),
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

    /// 32-bit protected mode (paging on or off), not long mode.
    pub fn protected_32(&self) -> bool {
        !self.long_mode() && self.cr0 & CR0_PE != 0
    }

    /// Addresses go through page tables: long mode, or 32-bit paging (2-level or PAE).
    pub fn paging(&self) -> bool {
        self.long_mode() || self.cr0 & (CR0_PE | CR0_PG) == CR0_PE | CR0_PG
    }
}
