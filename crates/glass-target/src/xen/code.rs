//! A Xen HVM/PVH guest (x86-64), or an ARM64 domU (Xen on ARM64, glass's aarch64 build in
//! its dom0), as the guest `glass trace` patches ([`GuestCode`]), and the memory glass
//! adds to it for its trampolines and ring.
//!
//! - Stops and registers: the sampling backend's (`XEN_DOMCTL_pausedomain` and each
//!   vCPU's HVM CPU record, or its ARM vCPU context, in one multicall, under the stop
//!   mark its guardian watches).
//! - Memory: guest frames mapped with libxenforeignmemory, read through the sampling
//!   backend's frame cache and written through a writable mapping of the one frame,
//!   with the domain paused. Virtual addresses are walked through the stopped vCPUs'
//!   page tables (glass-mem, x86-64 or VMSAv8-64), as the guest's own MMU would. Under
//!   hardware virtualisation an x86 vCPU re-enters the guest through VMRUN/VMRESUME,
//!   which serialise, so it runs the bytes written; under nested TCG, QEMU sees dom0's
//!   stores and drops what it translated of those pages. On ARM the instruction cache
//!   is not coherent with stores: glass cleans the written lines to the point of
//!   unification and invalidates them in the instruction cache, by the address of its
//!   own mapping ([`crate::host_cpu::written`]); both operations reach every CPU of
//!   the inner shareable domain, so the pCPU that runs the vCPU too, and its entry to
//!   the guest (an exception return) is the context synchronisation that makes it
//!   fetch anew.
//! - Moving a vCPU: Xen sets an HVM vCPU's registers only through
//!   `XEN_DOMCTL_setvcpucontext`, which also reloads its FPU from the context's legacy
//!   FXSAVE area (dropping AVX state), or `sethvmcontext`, which reloads its TSC. glass
//!   touches neither: a vCPU found at a place it must not be (inside bytes about to be
//!   replaced, or in a relocated copy once the original bytes are back) is let run for
//!   a moment and stopped again, until none is there. Both places are a few
//!   instructions long and lead out by themselves.
//! - The region: 2 MiB of new guest frames at a 2 MiB-aligned guest-physical address
//!   above everything the guest has ([`XenCode::add_region`]): `XEN_DOMCTL_max_mem`
//!   raised by 2 MiB, then `XENMEM_populate_physmap` of those frames. The guest's memory
//!   map does not list them, so it never uses them; glass maps them writable for as long
//!   as it traces.
//!
//! PV guests are refused: their page tables hold machine frames that Xen validates, so
//! mapping the region into them would take `mmu_update` on the guest's behalf. (ARM has
//! no PV: every ARM domain carries the HVM flag.)

use std::ffi::{c_int, c_void};
use std::sync::Arc;
use std::time::Duration;

use glass_mem::{GuestPaging, PageWalk, PhysicalMemory};

use super::abi::*;
use super::libs::XenLibs;
use super::{DomainInfo, HypercallBuffer, Hypervisor, XenBackend};
use crate::arch::VcpuRegs;
use crate::guest::GuestBackend;
use crate::guest_code::GuestCode;
use crate::stop_mark::StopMark;
use crate::TargetError;

const PAGE: u64 = 4096;
const HYPERVISOR_MEMORY_OP: u32 = 12;
const XENMEM_POPULATE_PHYSMAP: u64 = 6;
const XENMEM_MAXIMUM_GPFN: u64 = 14;
const DOMCTL_MAX_MEM: u32 = 11;
const MAX_MEM_KB: usize = 16;
const INFO_TOT_PAGES: usize = 24;
const INFO_MAX_PAGES: usize = 32;
/// How often glass lets the guest run a moment to have a vCPU leave a place (see the
/// module's comment) before it gives up.
const RUN_OUT_TRIES: usize = 200;
/// How much of a region glass reads to know it for its own (its page tables and header
/// words lie in its first pages).
const HEADER_PAGES: usize = 4;

/// A Xen HVM/PVH domain glass patches.
pub struct XenCode {
    backend: XenBackend,
    /// The vCPUs' registers at the last stop.
    regs: Vec<VcpuRegs>,
    stopped: bool,
}

impl XenCode {
    /// Opens domain `spec` (a domid or a name), refusing what glass cannot patch;
    /// `mark` is shared with glass's guardian. The domain's name as well.
    pub fn open(spec: &str, mark: Option<StopMark>) -> Result<(XenCode, String), TargetError> {
        let mut hv = Hypervisor::open()?;
        let (info, name) = hv.find(spec)?;
        if !info.hvm() {
            return Err(TargetError::BadInput(format!(
                "--xen {spec}: a PV guest, whose page tables Xen validates (glass would have to map its region with mmu_update on the guest's behalf): glass trace --xen traces PVH and HVM guests"
            )));
        }
        let vcpus = info.max_vcpu_id as usize + 1;
        let backend = XenBackend::new(hv, info, mark)?;
        Ok((
            XenCode {
                backend,
                regs: vec![VcpuRegs::zeroed(super::GUEST_ARCH); vcpus],
                stopped: false,
            },
            name,
        ))
    }

    pub fn domid(&self) -> u32 {
        self.backend.domid
    }

    pub fn info(&mut self) -> Result<DomainInfo, String> {
        let domid = self.backend.domid;
        self.backend
            .hv
            .domain_info(domid)
            .map_err(|e| format!("cannot query domain {domid}: {}", super::errno_text(e)))
    }

    /// The paging of the first vCPU in long mode (x86-64) or with its MMU on (AArch64)
    /// at the last stop.
    fn paging(&self) -> Result<GuestPaging, String> {
        self.regs
            .iter()
            .find(|r| match r {
                VcpuRegs::X86_64(x) => x.long_mode(),
                VcpuRegs::Aarch64(a) => a.mmu_on(),
            })
            .map(crate::guest::paging_of)
            .ok_or_else(|| "no vCPU of the guest runs in long mode or with its MMU on".to_string())
    }

    /// The guest-physical address of guest-virtual `address`.
    fn physical(&self, address: u64) -> Result<u64, String> {
        self.paging()?
            .walk(&self.backend.frames, address)
            .map(|t| t.physical)
            .map_err(|e| format!("the guest does not map {address:#x}: {e}"))
    }

    /// Finds glass's region in the domain, or adds one: 2 MiB (`bytes`) of new frames at
    /// a 2 MiB-aligned guest-physical address above all the guest has. Its address, and
    /// whether an earlier trace had added it (`is_glass` says so from its first page).
    pub fn add_region(
        &mut self,
        bytes: u64,
        is_glass: &dyn Fn(&[u8]) -> bool,
    ) -> Result<(u64, bool), String> {
        let domid = self.backend.domid;
        let frames = bytes / PAGE;
        let max_gpfn = self.maximum_gpfn()?;
        // An earlier trace's region sits at 4 GiB, or at the first aligned place above
        // the guest's frames: both are looked at.
        let four_gib = 1u64 << 32;
        let above = (max_gpfn + 1) * PAGE;
        let aligned = |at: u64| at.div_ceil(bytes) * bytes;
        for candidate in [four_gib, aligned(above.saturating_sub(bytes))] {
            if candidate + bytes <= above {
                // The region's header: its page tables and its words.
                let mut first = vec![0u8; HEADER_PAGES * PAGE as usize];
                if self.backend.frames.read_physical(candidate, &mut first) && is_glass(&first) {
                    return Ok((candidate, true));
                }
            }
        }
        let gpa = if above <= four_gib {
            four_gib
        } else {
            aligned(above)
        };
        let reply = self
            .backend
            .hv
            .domctl(DOMCTL_GETDOMAININFO, domid, |_| {})
            .map_err(|e| format!("cannot query domain {domid}: {}", super::errno_text(e)))?;
        let (tot, max) = (
            read_u64(reply, INFO_TOT_PAGES),
            read_u64(reply, INFO_MAX_PAGES),
        );
        let wanted_kb = (tot.max(max) + frames) * (PAGE / 1024);
        self.backend
            .hv
            .domctl(DOMCTL_MAX_MEM, domid, |b| {
                write_u64(b, MAX_MEM_KB, wanted_kb)
            })
            .map_err(|e| {
                format!(
                    "cannot raise domain {domid}'s memory limit by 2 MiB for glass's region: {}",
                    super::errno_text(e)
                )
            })?;
        // One 2 MiB extent where Xen has one; else 4 KiB frames.
        if self.populate(&[gpa / PAGE], 9)? != 1 {
            let gfns: Vec<u64> = (0..frames).map(|i| gpa / PAGE + i).collect();
            let done = self.populate(&gfns, 0)?;
            if done != frames {
                return Err(format!(
                    "Xen gave glass's region {done} of its {frames} frames in domain {domid} (XENMEM_populate_physmap)"
                ));
            }
        }
        Ok((gpa, false))
    }

    fn maximum_gpfn(&mut self) -> Result<u64, String> {
        let libs = self.backend.hv.libs.clone();
        let call = self.backend.hv.call;
        let mut buffer = HypercallBuffer::new(&libs, call, 8).map_err(|e| e.to_string())?;
        write_u16(buffer.bytes(), 0, self.backend.domid as u16);
        let result = self.memory_op(XENMEM_MAXIMUM_GPFN, &buffer);
        if result < 0 {
            return Err(format!(
                "cannot ask Xen for domain {}'s highest frame: {}",
                self.backend.domid,
                std::io::Error::last_os_error()
            ));
        }
        Ok(result as u64)
    }

    /// `XENMEM_populate_physmap` of `gfns` (each an extent of 2^`order` frames): how
    /// many extents Xen populated.
    fn populate(&mut self, gfns: &[u64], order: u32) -> Result<u64, String> {
        let libs = self.backend.hv.libs.clone();
        let call = self.backend.hv.call;
        let mut list =
            HypercallBuffer::new(&libs, call, gfns.len() * 8).map_err(|e| e.to_string())?;
        for (i, gfn) in gfns.iter().enumerate() {
            write_u64(list.bytes(), i * 8, *gfn);
        }
        let mut reservation = HypercallBuffer::new(&libs, call, 32).map_err(|e| e.to_string())?;
        let r = reservation.bytes();
        write_u64(r, 0, list.address(0));
        write_u64(r, 8, gfns.len() as u64);
        write_u32(r, 16, order);
        write_u32(r, 20, 0);
        write_u16(r, 24, self.backend.domid as u16);
        // (The reservation's extent list is another of this handle's buffers.)
        let result = self.memory_op(XENMEM_POPULATE_PHYSMAP, &reservation);
        if result < 0 {
            return Err(format!(
                "Xen would not add glass's region to domain {} (XENMEM_populate_physmap): {}",
                self.backend.domid,
                std::io::Error::last_os_error()
            ));
        }
        Ok(result as u64)
    }

    /// `HYPERVISOR_memory_op` `cmd` with its argument in `argument`: Xen's result.
    fn memory_op(&self, cmd: u64, argument: &HypercallBuffer) -> i64 {
        let libs = &self.backend.hv.libs;
        // SAFETY: the argument lies in a hypercall buffer of this handle, as `cmd` wants.
        let result = unsafe {
            (libs.xencall2)(
                self.backend.hv.call,
                HYPERVISOR_MEMORY_OP,
                cmd,
                argument.address(0),
            )
        };
        result as i64
    }

    /// Maps `bytes` of guest-physical memory from `gpa` (glass's region) writable, for
    /// as long as the mapping lives.
    pub fn map(&self, gpa: u64, bytes: u64) -> Result<ForeignMapping, String> {
        ForeignMapping::new(self.backend.hv.libs.clone(), self.backend.domid, gpa, bytes)
    }

    fn write_frame(&self, gpa: u64, bytes: &[u8]) -> Result<(), String> {
        let page = self.map(gpa & !(PAGE - 1), PAGE)?;
        let offset = (gpa % PAGE) as usize;
        // SAFETY: one writable page; offset + len <= PAGE (the caller splits at pages).
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), page.pointer.add(offset), bytes.len());
            crate::host_cpu::written(page.pointer.add(offset), bytes.len());
        }
        Ok(())
    }
}

impl GuestCode for XenCode {
    fn vcpu_count(&self) -> usize {
        self.regs.len()
    }

    fn stop_with_registers(&mut self, out: &mut [VcpuRegs]) -> Result<(), String> {
        if !self.stopped {
            self.backend
                .stop_with_registers(&mut self.regs)
                .map_err(|e| e.to_string())?;
            self.stopped = true;
        }
        for (out, regs) in out.iter_mut().zip(&self.regs) {
            *out = *regs;
        }
        Ok(())
    }

    fn resume(&mut self) -> Result<(), String> {
        if self.stopped {
            self.backend.resume().map_err(|e| e.to_string())?;
            self.stopped = false;
        }
        Ok(())
    }

    fn read_virtual(&mut self, address: u64, len: usize) -> Result<Vec<u8>, String> {
        let mut out = vec![0u8; len];
        let mut done = 0;
        while done < len {
            let at = address + done as u64;
            let part = ((PAGE - at % PAGE) as usize).min(len - done);
            let physical = self.physical(at)?;
            if !self
                .backend
                .frames
                .read_physical(physical, &mut out[done..done + part])
            {
                return Err(format!("cannot read the guest's memory at {at:#x}"));
            }
            done += part;
        }
        Ok(out)
    }

    fn write_virtual(&mut self, address: u64, bytes: &[u8]) -> Result<(), String> {
        let mut done = 0;
        while done < bytes.len() {
            let at = address + done as u64;
            let part = ((PAGE - at % PAGE) as usize).min(bytes.len() - done);
            let physical = self.physical(at)?;
            self.write_frame(physical, &bytes[done..done + part])?;
            done += part;
        }
        Ok(())
    }

    fn read_physical(&mut self, address: u64, len: usize) -> Result<Vec<u8>, String> {
        let mut out = vec![0u8; len];
        if !self.backend.frames.read_physical(address, &mut out) {
            return Err(format!(
                "cannot read the guest's memory at guest-physical {address:#x}"
            ));
        }
        Ok(out)
    }

    fn write_physical(&mut self, address: u64, bytes: &[u8]) -> Result<(), String> {
        let mut done = 0;
        while done < bytes.len() {
            let at = address + done as u64;
            let part = ((PAGE - at % PAGE) as usize).min(bytes.len() - done);
            self.write_frame(at, &bytes[done..done + part])?;
            done += part;
        }
        Ok(())
    }

    /// Lets the guest run a moment and stops it again until no vCPU is at a `from` (see
    /// the module's comment): how many were at the first look.
    fn move_vcpus(&mut self, moves: &[(u64, u64)]) -> Result<usize, String> {
        let inside = |regs: &[VcpuRegs]| {
            regs.iter()
                .filter(|r| r.paging_on() && moves.iter().any(|&(from, _)| from == r.ip()))
                .count()
        };
        let first = inside(&self.regs);
        let mut tries = 0;
        while inside(&self.regs) > 0 {
            if tries == RUN_OUT_TRIES {
                return Err(format!(
                    "a vCPU of domain {} stayed where glass cannot leave it ({:#x}) through {RUN_OUT_TRIES} short runs",
                    self.backend.domid,
                    self.regs.iter().find(|r| moves.iter().any(|&(f, _)| f == r.ip())).map_or(0, |r| r.ip())
                ));
            }
            tries += 1;
            GuestCode::resume(self)?;
            std::thread::sleep(Duration::from_micros(200));
            let mut regs = std::mem::take(&mut self.regs);
            let stopped = GuestCode::stop_with_registers(self, &mut regs);
            self.regs = regs;
            stopped?;
        }
        Ok(first)
    }

    /// The generic timer's frequency, which the guest's CNTVCT_EL0 counts at: CNTFRQ_EL0
    /// is one system-wide register, read here in dom0 (Xen offsets each domain's count,
    /// not its rate). None on x86-64, whose records are timed by the TSC.
    fn counter_hz(&mut self) -> Option<u64> {
        crate::host_cpu::generic_timer_hz()
    }

    /// Gone when Xen says so: the domain is shutting down, dying, or another domain has
    /// its id (the drain never pauses it, so no failed pause would say so).
    fn is_gone(&mut self) -> bool {
        if self.backend.gone {
            return true;
        }
        let domid = self.backend.domid;
        let gone = match self.backend.hv.domain_info(domid) {
            Ok(info) => info.domid != domid || info.flags & (DOMINF_DYING | DOMINF_SHUTDOWN) != 0,
            Err(_) => true,
        };
        self.backend.gone = gone;
        gone
    }
}

/// Guest frames mapped into glass with libxenforeignmemory, writable; unmapped when
/// dropped.
pub struct ForeignMapping {
    libs: Arc<XenLibs>,
    handle: *mut c_void,
    pointer: *mut u8,
    pages: usize,
}

impl ForeignMapping {
    fn new(libs: Arc<XenLibs>, domid: u32, gpa: u64, bytes: u64) -> Result<Self, String> {
        // SAFETY: a logger that lives for the program, no flags.
        let handle = unsafe { (libs.fmem_open)(super::libs::quiet_logger(), 0) };
        if handle.is_null() {
            return Err(format!(
                "cannot open Xen's foreign-memory interface: {}",
                std::io::Error::last_os_error()
            ));
        }
        let pages = bytes.div_ceil(PAGE) as usize;
        let frames: Vec<u64> = (0..pages as u64).map(|i| gpa / PAGE + i).collect();
        let mut errors: Vec<c_int> = vec![0; pages];
        // SAFETY: `pages` frame numbers and as many error slots.
        let pointer = unsafe {
            (libs.fmem_map)(
                handle,
                domid,
                libc::PROT_READ | libc::PROT_WRITE,
                pages,
                frames.as_ptr(),
                errors.as_mut_ptr(),
            )
        };
        let mapping = ForeignMapping {
            libs,
            handle,
            pointer: pointer.cast(),
            pages,
        };
        if pointer.is_null() || errors.iter().any(|&e| e != 0) {
            return Err(format!(
                "cannot map domain {domid}'s memory at guest-physical {gpa:#x} writable: {}",
                std::io::Error::from_raw_os_error(
                    errors
                        .iter()
                        .find(|&&e| e != 0)
                        .map_or(libc::EFAULT, |e| e.abs())
                )
            ));
        }
        Ok(mapping)
    }

    /// The mapped bytes. The guest writes them too: read and write words atomically.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `pages` pages mapped for as long as self lives.
        unsafe { std::slice::from_raw_parts(self.pointer, self.pages * PAGE as usize) }
    }
}

impl Drop for ForeignMapping {
    fn drop(&mut self) {
        // SAFETY: the mapping and handle made in `new`.
        unsafe {
            if !self.pointer.is_null() {
                (self.libs.fmem_unmap)(self.handle, self.pointer.cast(), self.pages);
            }
            (self.libs.fmem_close)(self.handle);
        }
    }
}
