//! The registers a sampler needs from a stopped guest vCPU, one file per architecture
//! (mirroring glass-unwind's and glass-mem's per-architecture files): which registers
//! to ask a backend for, and what they mean for unwinding and address translation.
//! A backend (the GDB stub today, Xen next) fills a [`VcpuRegs`] by register name.

pub mod aarch64;
pub mod x86_64;

pub use aarch64::Aarch64Regs;
pub use glass_format::Arch;
pub use x86_64::X86Regs;

use glass_unwind::UnwindRegs;

/// One vCPU's registers, of whichever architecture the guest is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VcpuRegs {
    X86_64(X86Regs),
    Aarch64(Aarch64Regs),
}

impl Default for VcpuRegs {
    fn default() -> Self {
        VcpuRegs::X86_64(X86Regs::default())
    }
}

impl VcpuRegs {
    /// Zeroed registers of `arch`.
    pub fn zeroed(arch: Arch) -> Self {
        match arch {
            Arch::X86_64 => VcpuRegs::X86_64(X86Regs::default()),
            Arch::Aarch64 => VcpuRegs::Aarch64(Aarch64Regs::default()),
        }
    }

    /// The name the GDB stub gives `arch`'s program counter (to move a vCPU).
    pub fn pc_name(arch: Arch) -> &'static str {
        match arch {
            Arch::X86_64 => "rip",
            Arch::Aarch64 => "pc",
        }
    }

    /// The register names a backend must provide for `arch`, in the order
    /// [`VcpuRegs::from_values`] takes them.
    pub fn names(arch: Arch) -> &'static [&'static [&'static str]] {
        match arch {
            Arch::X86_64 => x86_64::NAMES,
            Arch::Aarch64 => aarch64::NAMES,
        }
    }

    /// How many of [`VcpuRegs::names`] a backend must have (the rest read as 0).
    pub fn required(arch: Arch) -> usize {
        match arch {
            Arch::X86_64 => x86_64::REQUIRED,
            Arch::Aarch64 => aarch64::REQUIRED,
        }
    }

    /// The first of [`VcpuRegs::names`] that only finds a Linux guest's current task
    /// (the rest of the list).
    pub fn task_registers_from(arch: Arch) -> usize {
        match arch {
            Arch::X86_64 => x86_64::TASK_REGISTERS_FROM,
            Arch::Aarch64 => aarch64::TASK_REGISTERS_FROM,
        }
    }

    /// From the values of [`VcpuRegs::names`] (0 for a register the backend lacks).
    pub fn from_values(arch: Arch, values: &[u64]) -> Self {
        match arch {
            Arch::X86_64 => VcpuRegs::X86_64(X86Regs::from_values(values)),
            Arch::Aarch64 => VcpuRegs::Aarch64(Aarch64Regs::from_values(values)),
        }
    }

    pub fn ip(&self) -> u64 {
        match self {
            VcpuRegs::X86_64(r) => r.ip,
            VcpuRegs::Aarch64(r) => r.pc,
        }
    }

    pub fn sp(&self) -> u64 {
        self.unwind().sp
    }

    pub fn unwind(&self) -> UnwindRegs {
        match self {
            VcpuRegs::X86_64(r) => r.unwind(),
            VcpuRegs::Aarch64(r) => r.unwind(),
        }
    }

    /// AArch64: a vCPU inside one of the kernel's vector tables on an exception from EL0
    /// is taken as the user context it interrupted (see [`Aarch64Regs::interrupted_in_tables`]).
    pub fn interrupted_in_tables(&mut self, tables: &[u64]) {
        if let VcpuRegs::Aarch64(r) = self {
            r.interrupted_in_tables(tables);
        }
    }

    /// The exception vector base (AArch64's VBAR_EL1), where the backend gives it.
    pub fn vector_base(&self) -> Option<u64> {
        match self {
            VcpuRegs::X86_64(_) => None,
            VcpuRegs::Aarch64(r) => (r.vbar_el1 != 0).then_some(r.vbar_el1),
        }
    }

    /// The vCPU translates addresses through page tables (x86: long mode, 32-bit or PAE paging; AArch64: the
    /// stage-1 MMU on). A vCPU that does not and has not yet run the guest image is
    /// still in its firmware or has not been started.
    pub fn paging_on(&self) -> bool {
        match self {
            VcpuRegs::X86_64(r) => r.paging(),
            VcpuRegs::Aarch64(r) => r.mmu_on(),
        }
    }

    /// x86 in 32-bit protected mode (paging on or off): its frames are 32-bit.
    pub fn protected_32(&self) -> bool {
        matches!(self, VcpuRegs::X86_64(r) if r.protected_32())
    }

    /// x86 in real mode (CR0.PE clear, not long mode): firmware, whatever it runs.
    pub fn real_mode(&self) -> bool {
        matches!(self, VcpuRegs::X86_64(r) if !r.long_mode() && !r.protected_32())
    }
}
