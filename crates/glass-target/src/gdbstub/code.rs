//! QEMU's GDB stub as the guest `glass trace` patches ([`GuestCode`]): memory through
//! `m`/`M` packets (guest-physical addresses in QEMU's physical-memory mode,
//! `Qqemu.PhyMemMode`), vCPUs moved by setting their pc. Writes through the stub are
//! what make QEMU drop the translated code of the written bytes (see
//! [`Client::write_memory`]).

use super::client::Client;
use crate::arch::VcpuRegs;
use crate::guest_code::GuestCode;

impl GuestCode for Client {
    fn vcpu_count(&self) -> usize {
        self.vcpus.len()
    }

    fn stop_with_registers(&mut self, out: &mut [VcpuRegs]) -> Result<(), String> {
        Client::stop_with_registers(self, out).map_err(|e| format!("cannot stop the VM: {e}"))
    }

    fn resume(&mut self) -> Result<(), String> {
        Client::resume(self).map_err(|e| format!("cannot let the VM run: {e}"))
    }

    fn read_virtual(&mut self, address: u64, len: usize) -> Result<Vec<u8>, String> {
        let bytes = self
            .read_memory(address, len)
            .map_err(|e| format!("cannot read the guest's memory: {e}"))?;
        if bytes.len() != len {
            return Err(format!("cannot read the guest's memory at {address:#x}"));
        }
        Ok(bytes)
    }

    fn write_virtual(&mut self, address: u64, bytes: &[u8]) -> Result<(), String> {
        self.write_memory(address, bytes)
            .map_err(|e| format!("cannot write the guest's memory: {e}"))
    }

    fn read_physical(&mut self, address: u64, len: usize) -> Result<Vec<u8>, String> {
        self.physical_memory_mode(true)
            .map_err(|e| format!("cannot read the guest's page tables: {e}"))?;
        let read = GuestCode::read_virtual(self, address, len);
        let back = self.physical_memory_mode(false);
        let bytes = read?;
        back.map_err(|e| format!("cannot read the guest's page tables: {e}"))?;
        Ok(bytes)
    }

    fn write_physical(&mut self, address: u64, bytes: &[u8]) -> Result<(), String> {
        self.physical_memory_mode(true)
            .map_err(|e| format!("cannot write the guest's page tables: {e}"))?;
        let written = self.write_memory(address, bytes);
        let back = self.physical_memory_mode(false);
        written.map_err(|e| format!("cannot write the guest's page tables: {e}"))?;
        back.map_err(|e| format!("cannot write the guest's page tables: {e}"))
    }

    fn move_vcpus(&mut self, moves: &[(u64, u64)]) -> Result<usize, String> {
        let pc = VcpuRegs::pc_name(self.arch());
        let mut moved = 0;
        // Reading each vCPU's registers selects it; the memory packets that follow go
        // through the selected vCPU's translation, so one that maps the guest's code is
        // selected again at the end (an AArch64 vCPU PSCI has not started has its MMU
        // off, and the code's addresses would not be found through it).
        let mut mapping = None;
        for index in 0..self.vcpus.len() {
            let regs = self
                .registers(index)
                .map_err(|e| format!("cannot read a vCPU: {e}"))?;
            if mapping.is_none() && regs.paging_on() {
                mapping = Some(index);
            }
            if let Some(&(_, to)) = moves.iter().find(|&&(from, _)| from == regs.ip()) {
                self.select(index)
                    .and_then(|()| self.set_register(pc, to))
                    .map_err(|e| format!("cannot move a vCPU: {e}"))?;
                moved += 1;
            }
        }
        self.select(mapping.unwrap_or(0))
            .map_err(|e| format!("cannot select a vCPU: {e}"))?;
        Ok(moved)
    }

    fn detach(&mut self) -> Result<(), String> {
        Client::detach(self).map_err(|e| format!("cannot let the VM run: {e}"))
    }

    fn is_gone(&mut self) -> bool {
        self.is_closed()
    }

    fn counter_hz(&mut self) -> Option<u64> {
        (self.arch() == crate::arch::Arch::Aarch64)
            .then(|| self.register("CNTFRQ_EL0").ok())
            .flatten()
            .filter(|&hz| hz != 0)
    }
}
