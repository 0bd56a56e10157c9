//! The guest-OS seam: what the guest sampling loop asks of whoever knows what the guest's
//! operating system keeps in its memory (glass-linux-guest for a Linux kernel; a
//! unikernel's thread list could sit beside it). The loop knows vCPUs, stops and stacks;
//! through one [`GuestOs`] it learns which task a vCPU runs, where that task's user code
//! is mapped, where a kernel stack continues on another stack, where a relocated kernel
//! runs, and the kernel's unwind tables. Its reads of guest memory go through one
//! [`GuestMemory`], which the loop makes from its backend and translation cache.

use glass_format::{Arch, GuestTask};
use glass_mem::TranslationCache;
use glass_unwind::orc::OrcTable;

use crate::guest::{paging_of, GuestBackend, GuestError, VcpuRegs};
use crate::procfs::Mapping;
use crate::stop_mark::StopMark;
use crate::TargetError;

/// Guest-virtual reads, as the guest loop makes them.
pub trait GuestMemory {
    /// Reads `at` through `regs`' page tables as vCPU `vcpu` sees it: from mapped RAM
    /// where the backend has it, else through the backend's own reads (which only a
    /// stopped VM answers). Returns the bytes read (a short count ends at the first
    /// unmapped page).
    fn read(
        &mut self,
        vcpu: usize,
        regs: &VcpuRegs,
        at: u64,
        buf: &mut [u8],
    ) -> Result<usize, GuestError>;

    /// Reads `at` through `regs`' page tables from mapped RAM only (never the backend's
    /// reads: the VM may run); 0 without RAM.
    fn read_mapped(&mut self, regs: &VcpuRegs, at: u64, buf: &mut [u8]) -> usize;

    /// The guest-physical address of `at` through `regs`' page tables: None without
    /// mapped RAM, `Some(None)` where the walk fails.
    fn translate(&mut self, regs: &VcpuRegs, at: u64) -> Option<Option<u64>>;

    /// Whether the backend maps the guest's RAM.
    fn has_ram(&self) -> bool;
}

/// A backend's memory through a translation cache: the [`GuestMemory`] of the loop.
pub struct BackendMemory<'a> {
    pub backend: &'a mut dyn GuestBackend,
    pub cache: &'a mut TranslationCache,
}

impl GuestMemory for BackendMemory<'_> {
    fn read(
        &mut self,
        vcpu: usize,
        regs: &VcpuRegs,
        at: u64,
        buf: &mut [u8],
    ) -> Result<usize, GuestError> {
        if let Some(ram) = self.backend.physical_memory() {
            return Ok(self.cache.read_with(ram, &paging_of(regs), at, buf));
        }
        self.backend.read_virtual(vcpu, at, buf)
    }

    fn read_mapped(&mut self, regs: &VcpuRegs, at: u64, buf: &mut [u8]) -> usize {
        self.backend.physical_memory().map_or(0, |ram| {
            self.cache.read_with(ram, &paging_of(regs), at, buf)
        })
    }

    fn translate(&mut self, regs: &VcpuRegs, at: u64) -> Option<Option<u64>> {
        let ram = self.backend.physical_memory()?;
        Some(self.cache.translate_with(ram, &paging_of(regs), at).ok())
    }

    fn has_ram(&self) -> bool {
        self.backend.physical_memory().is_some()
    }
}

/// A vCPU as the loop saw it at the last stop.
#[derive(Debug, Clone, Copy)]
pub struct VcpuAt {
    pub regs: VcpuRegs,
    /// In firmware (x86 real mode, or not paging and not yet in the image).
    pub in_firmware: bool,
}

/// What a vCPU runs at a stop, as far as its stack copy goes.
#[derive(Debug, Clone, Copy, Default)]
pub struct TaskAtStop {
    /// A user process of the guest: its stack is not the kernel's.
    pub user_mode: bool,
    /// Its user stack is copied for a walk in its own address space.
    pub walk_user_stack: bool,
}

/// A vCPU stopped on another stack than its task's: the stack it runs on is copied up to
/// `copy_to` (exclusive), the one it interrupted from `other`, and a third from `then`
/// (an exception in an IRQ handler: the task's stack under the IRQ stack).
#[derive(Debug, Clone, Copy)]
pub struct StackSwitch {
    pub copy_to: u64,
    pub other: u64,
    pub then: Option<u64>,
}

/// A user-mode sample's address space, once the VM runs again: the mappings learned of
/// it now (to record), and whether its stack is to be walked there.
#[derive(Debug, Default)]
pub struct UserSpace {
    /// The address space's pid in the recording.
    pub space: i32,
    pub new_mappings: Vec<Mapping>,
    pub walk: bool,
}

/// What the guest OS has to say, in the order it is to be said.
#[derive(Debug)]
pub enum Said {
    /// A figure for the summary.
    Figure(String),
    /// A warning printed at the end.
    Warning(String),
    /// A warning printed and kept in the recording.
    Kept(String),
    /// The kernel's unwind tables, to walk kernel frames with from now on.
    KernelUnwind(OrcTable),
}

/// Where a relocated kernel was found to run.
#[derive(Debug, Clone, Copy)]
pub struct Slide {
    /// How far above the symbol table (0: where the table says).
    pub by: u64,
    /// How it was found.
    pub how: &'static str,
}

/// What the guest loop asks of the guest's operating system. Every method has a
/// default that knows nothing, so an OS answers only what it knows.
pub trait GuestOs {
    /// Whether the backend is to read the registers that say where the OS keeps its
    /// current task (x86-64's GS bases, AArch64's SP_EL0 and TPIDR_EL1).
    fn wants_task_registers(&self, _arch: Arch) -> bool {
        false
    }

    /// Once connected, before sampling: whether the OS's description fits the running
    /// guest (the VM may be stopped for it, marked in `mark`). Err is one line of bad
    /// input; Ok holds what to say once the guest's memory source is said.
    fn prepare(
        &mut self,
        _backend: &mut dyn GuestBackend,
        _mark: &StopMark,
    ) -> Result<Vec<Said>, TargetError> {
        Ok(Vec::new())
    }

    /// When sampling begins (the guest's threads recorded): `raw_capture` keeps one
    /// stack range per sample.
    fn begin(&mut self, _arch: Arch, _vcpus: usize, _raw_capture: bool) -> Vec<Said> {
        Vec::new()
    }

    /// While the VM is stopped: a vCPU stopped on an entry of the OS's kernel (an
    /// exception vector, an interrupt entry) becomes the context the entry interrupted.
    fn interrupted(&mut self, _vcpu: usize, _regs: &mut VcpuRegs, _memory: &mut dyn GuestMemory) {}

    /// While the VM is stopped: reads what vCPU `vcpu` runs.
    fn task_at_stop(
        &mut self,
        _vcpu: usize,
        _at: VcpuAt,
        _memory: &mut dyn GuestMemory,
    ) -> TaskAtStop {
        TaskAtStop::default()
    }

    /// While the VM is stopped: where vCPU `vcpu`'s stack continues on another stack.
    fn stack_switch(
        &mut self,
        _vcpu: usize,
        _regs: &VcpuRegs,
        _memory: &mut dyn GuestMemory,
    ) -> Option<StackSwitch> {
        None
    }

    /// Whether kernel stacks are walked by tables (they hold no frame-record chain to
    /// follow to another stack).
    fn walks_kernel_by_tables(&self) -> bool {
        false
    }

    /// After the VM runs again: the task record to write before vCPU `vcpu`'s sample
    /// (thread `tid` of `pid`), if its task changed.
    fn task_changed(
        &mut self,
        _vcpu: usize,
        _time_ns: u64,
        _pid: u32,
        _tid: u32,
    ) -> Option<GuestTask> {
        None
    }

    /// After the VM runs again, for a user-mode sample whose stack was copied: the
    /// address space it is walked in. None leaves it unwalked.
    fn user_space(
        &mut self,
        _vcpu: usize,
        _regs: &VcpuRegs,
        _time_ns: u64,
        _memory: &mut dyn GuestMemory,
    ) -> Option<UserSpace> {
        None
    }

    /// After the VM runs again, while the kernel's place is unknown (a symbol table):
    /// where it runs, from the vCPUs stopped in it; `text` is the table's range. Err
    /// holds the note to keep when the search is given up.
    fn find_slide(
        &mut self,
        _arch: Arch,
        _vcpus: &[VcpuAt],
        _text: std::ops::Range<u64>,
        _memory: &mut dyn GuestMemory,
    ) -> Result<Option<Slide>, String> {
        Ok(None)
    }

    /// After the VM runs again, once per sample: the kernel's tables to read (`text`:
    /// the image's range where the kernel runs).
    fn after_sample(
        &mut self,
        _vcpus: &[VcpuAt],
        _text: std::ops::Range<u64>,
        _memory: &mut dyn GuestMemory,
    ) -> Vec<Said> {
        Vec::new()
    }

    /// At the end: warnings and figures.
    fn ended(&mut self) -> Vec<Said> {
        Vec::new()
    }
}
