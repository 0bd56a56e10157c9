//! The GDB stub as a [`GuestBackend`]: the [`Client`]'s pipelined stop-and-registers
//! exchange, `m` packets for memory, and the guest's RAM where QEMU shares it (a file
//! or memfd glass maps read-only, laid out as the machine does; or QEMU's own memory).

use glass_mem::{GuestRam, PhysicalMemory};

use super::client::{Client, StubError};
use crate::guest::{paging_of, Arch, GuestBackend, GuestError, Lost, VcpuRegs};

pub struct GdbBackend {
    pub client: Client,
    ram: Option<Box<dyn PhysicalMemory>>,
    /// The registers of the last stop, and the vCPU the stub has selected since: an
    /// `m` read through another vCPU with the same page tables needs no `Hg`.
    last_regs: Vec<VcpuRegs>,
    selected: Option<usize>,
}

impl From<StubError> for GuestError {
    fn from(error: StubError) -> Self {
        GuestError(error.to_string())
    }
}

impl GdbBackend {
    pub fn new(client: Client, ram: Option<GuestRam>) -> Self {
        Self::with_memory(client, ram.map(|r| Box::new(r) as Box<dyn PhysicalMemory>))
    }

    /// With any guest-physical memory: a RAM file, or QEMU's own memory
    /// ([`glass_mem::ProcessRam`]).
    pub fn with_memory(client: Client, ram: Option<Box<dyn PhysicalMemory>>) -> Self {
        let vcpus = client.vcpus.len();
        GdbBackend {
            client,
            ram,
            last_regs: Vec::with_capacity(vcpus),
            selected: None,
        }
    }
}

impl GuestBackend for GdbBackend {
    fn arch(&self) -> Arch {
        self.client.arch()
    }

    fn vcpu_count(&self) -> usize {
        self.client.vcpus.len()
    }

    fn recording_backend(&self) -> glass_format::Backend {
        glass_format::Backend::GdbStub
    }

    fn stop_with_registers(&mut self, out: &mut [VcpuRegs]) -> Result<(), GuestError> {
        self.selected = None;
        self.client.stop_with_registers(out)?;
        // The exchange ends with the last vCPU selected.
        self.selected = out.len().checked_sub(1);
        self.last_regs.clear();
        self.last_regs.extend_from_slice(out);
        Ok(())
    }

    fn resume(&mut self) -> Result<(), GuestError> {
        self.selected = None;
        Ok(self.client.resume()?)
    }

    fn detach(&mut self) -> Result<(), GuestError> {
        Ok(self.client.detach()?)
    }

    fn physical_memory(&self) -> Option<&dyn PhysicalMemory> {
        self.ram.as_deref()
    }

    /// Whole packets until `buf` is full or the stub returns less (an unmapped page).
    /// `m` reads memory as the selected vCPU sees it (its page tables).
    fn read_virtual(
        &mut self,
        vcpu: usize,
        address: u64,
        buf: &mut [u8],
    ) -> Result<usize, GuestError> {
        let same_tables = |a: usize, b: usize| {
            let paging = |i: usize| self.last_regs.get(i).map(paging_of);
            a == b || paging(a).is_some_and(|p| Some(p) == paging(b))
        };
        if !self
            .selected
            .is_some_and(|selected| same_tables(selected, vcpu))
        {
            self.client.select(vcpu)?;
            self.selected = Some(vcpu);
        }
        let unit = self.client.max_memory_read();
        let mut done = 0;
        while done < buf.len() {
            let want = unit.min(buf.len() - done);
            let bytes = self
                .client
                .read_memory(address.wrapping_add(done as u64), want)?;
            buf[done..done + bytes.len()].copy_from_slice(&bytes);
            done += bytes.len();
            if bytes.len() < want {
                break;
            }
        }
        Ok(done)
    }

    fn read_unit(&self) -> usize {
        self.client.max_memory_read()
    }

    /// What is left on the connection is read (for at most 2 s, until QEMU closes it):
    /// QEMU sends `W00` just before it closes its stub as it shuts down.
    fn lost(&mut self) -> Lost {
        let exit_packet = self.client.last_words(std::time::Duration::from_secs(2));
        Lost {
            exit_packet,
            closed: self.client.is_closed(),
        }
    }
}
