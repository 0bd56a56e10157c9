//! A guest whose code glass patches, whatever reaches it: QEMU's GDB stub
//! ([`crate::gdbstub::client::Client`]) or Xen's domctls and foreign mappings
//! ([`crate::xen::code::XenCode`]). `glass trace` attaches, patches and detaches through
//! this one seam, and its guardian puts code back through it
//! ([`crate::gdbstub::ledger::CodeLedger::put_back`]), so that every backend patches and
//! restores the same way.

use crate::arch::VcpuRegs;

pub trait GuestCode {
    /// The guest's vCPUs, online or not.
    fn vcpu_count(&self) -> usize;
    /// Stops every vCPU and reads its registers into `out` (one per vCPU).
    fn stop_with_registers(&mut self, out: &mut [VcpuRegs]) -> Result<(), String>;
    /// Lets every vCPU run.
    fn resume(&mut self) -> Result<(), String>;
    /// Guest-virtual memory, as the stopped vCPUs see it.
    fn read_virtual(&mut self, address: u64, len: usize) -> Result<Vec<u8>, String>;
    fn write_virtual(&mut self, address: u64, bytes: &[u8]) -> Result<(), String>;
    /// Guest-physical memory (the page tables glass maps its region through).
    fn read_physical(&mut self, address: u64, len: usize) -> Result<Vec<u8>, String>;
    fn write_physical(&mut self, address: u64, bytes: &[u8]) -> Result<(), String>;
    /// With the guest stopped: sees to it that no vCPU is at any `from` of `moves` when
    /// the guest runs again, and says how many were. A backend that can set a vCPU's pc
    /// moves it to `to`; one that cannot (Xen, see [`crate::xen::code`]) lets the guest
    /// run a moment and stops it again until none is there, so the caller calls this
    /// only where running on is harmless: before the patch is written, and after the
    /// original bytes are back.
    fn move_vcpus(&mut self, moves: &[(u64, u64)]) -> Result<usize, String>;
    /// Lets the guest run, glass done with it (a GDB stub is told glass detaches).
    fn detach(&mut self) -> Result<(), String> {
        self.resume()
    }
    /// The guest is gone (the VM ended, or its connection closed).
    fn is_gone(&mut self) -> bool {
        false
    }
    /// An AArch64 guest's generic timer frequency (CNTFRQ_EL0), which times the records
    /// of its trampolines; None where the backend cannot read it.
    fn counter_hz(&mut self) -> Option<u64> {
        None
    }
}
