//! The guest-backend seam: what the guest sampling loop needs from whatever holds a VM
//! (a VMM's GDB stub, `gdbstub::backend`; Xen's hypercall interface, `xen`). A
//! backend lists vCPUs, stops them all and reads their registers, resumes, detaches,
//! and gives access to guest memory: the guest's physical RAM where it can map it (the
//! loop then walks the guest's page tables itself, see glass-mem), or its own
//! virtual-memory reads otherwise.

use glass_format::Backend;
use glass_mem::{GuestPaging, PhysicalMemory};

pub use crate::arch::{Arch, VcpuRegs};

/// A backend's failure: the VM went away or the connection to it broke.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct GuestError(pub String);

/// What a backend saw when it lost the VM: the GDB stub's last packet, an exit packet
/// (`W00`: QEMU sends it as it shuts down), and whether the connection is gone (closed,
/// reset) rather than merely silent.
#[derive(Debug, Default, Clone)]
pub struct Lost {
    pub exit_packet: Option<String>,
    pub closed: bool,
}

pub trait GuestBackend {
    /// The guest's architecture.
    fn arch(&self) -> Arch;

    /// How many vCPUs the guest has.
    fn vcpu_count(&self) -> usize;

    /// Stops every vCPU and reads each one's registers into `out` (one per vCPU).
    fn stop_with_registers(&mut self, out: &mut [VcpuRegs]) -> Result<(), GuestError>;

    /// Lets the guest run again.
    fn resume(&mut self) -> Result<(), GuestError>;

    /// After a [`GuestBackend::resume`] at `now`, once the loop has timed the stop: what
    /// the backend asks of a running guest (Xen: whether the domain is ending). An error
    /// ends the recording as a lost guest.
    fn ran_again(&mut self, _now: std::time::Instant) -> Result<(), GuestError> {
        Ok(())
    }

    /// Lets the guest run and lets go of it for good.
    fn detach(&mut self) -> Result<(), GuestError>;

    /// The guest's physical memory, where the backend has it mapped.
    fn physical_memory(&self) -> Option<&dyn PhysicalMemory>;

    /// Reads guest-virtual memory as vCPU `vcpu` sees it through the backend itself
    /// (when there is no [`GuestBackend::physical_memory`]); returns the bytes read.
    fn read_virtual(
        &mut self,
        vcpu: usize,
        address: u64,
        buf: &mut [u8],
    ) -> Result<usize, GuestError>;

    /// The bytes one [`GuestBackend::read_virtual`] call costs one round trip for.
    fn read_unit(&self) -> usize;

    /// What the recording names this backend.
    fn recording_backend(&self) -> Backend;

    /// Whether vCPU `vcpu` was idle (halted, blocked) at the last stop, where the
    /// backend knows; None leaves it to the loop (an instruction after `hlt`/`wfi`).
    fn halted(&self, _vcpu: usize) -> Option<bool> {
        None
    }

    /// Whether the sampling clock, when it finds it missed a deadline, takes the latest
    /// one at once rather than wait for the next (see glass-record's `LateTicks`).
    fn takes_late_ticks_at_once(&self) -> bool {
        false
    }

    /// Whether the loop walks a stack in place while the guest is stopped, reading only
    /// the words the walk needs from [`GuestBackend::physical_memory`], instead of
    /// copying the stack and walking the copy once the guest runs. Where copying costs
    /// more than walking: in a Xen dom0 under TCG every byte copied is emulated (a
    /// 61 KiB stack took 150-190 us of the stop), where a walk reads two words a frame.
    fn walks_in_place(&self) -> bool {
        false
    }

    /// The guest no longer exists (after an error: it ended, it was destroyed).
    fn gone(&self) -> bool {
        false
    }

    /// After a failure: what the backend saw of the VM's end (see [`Lost`]).
    fn lost(&mut self) -> Lost {
        Lost::default()
    }

    /// The backend's own figures for the summary.
    fn figures(&self) -> Vec<String> {
        Vec::new()
    }
}

/// How vCPU registers say their page tables are to be walked.
pub fn paging_of(regs: &VcpuRegs) -> GuestPaging {
    match regs {
        VcpuRegs::X86_64(r) => GuestPaging::X86_64(glass_mem::X86Paging {
            cr3: r.cr3,
            mode: glass_mem::PagingMode::from_registers(r.cr0, r.cr4, r.efer),
        }),
        VcpuRegs::Aarch64(r) => GuestPaging::Aarch64(glass_mem::Aarch64Paging {
            ttbr0: r.ttbr0_el1,
            ttbr1: r.ttbr1_el1,
            tcr: r.tcr_el1,
            sctlr: r.sctlr_el1,
        }),
    }
}
