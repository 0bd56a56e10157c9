//! Xen guests sampled through the hypervisor, from dom0: the second [`GuestBackend`].
//!
//! Per sample: pause the domain and read every vCPU's context and state, in one multicall
//! (`XEN_DOMCTL_pausedomain` and one `XEN_DOMCTL_getvcpucontext` per vCPU: a single trap
//! into Xen, where libxenctrl's `xc_domain_pause` + `xc_vcpu_getcontext` take one each
//! and bounce a fresh buffer every time); let the loop walk the guest's page tables
//! through frames mapped with libxenforeignmemory ([`frames`], a bounded cache); unpause;
//! then ask whether the domain is ending (getdomaininfo: outside the pause, which every
//! domctl in the multicall lengthens).
//! The hypercall buffers are allocated once (libxencall's locked pages), so nothing is
//! allocated while the domain is paused.
//!
//! Guests: 64-bit PV, and HVM/PVH (Xen marks both with the HVM flag: one path). For PV,
//! CR3 and the page tables hold machine frame numbers and privcmd maps PV frames by MFN,
//! so glass-mem's x86-64 walk runs unchanged; a vCPU in guest-user mode is walked from
//! its user page table (`ctrlreg[1]`). For HVM/PVH, each vCPU's registers come from
//! `XEN_DOMCTL_gethvmcontext_partial` (HVM_SAVE_CODE(CPU), in the same multicall where
//! PV's come from `getvcpucontext`): the same RIP/RSP/RBP/CR3/CR4 as getvcpucontext gives,
//! plus CR0 and EFER, which say how the vCPU pages (off, 32-bit, PAE, long mode: glass-mem
//! walks each). CR3 is then a guest-physical address and the frames map by GFN through
//! the same [`frames`] code (xenforeignmemory takes GFNs for them). The loop records a
//! vCPU in real mode, or outside the image before it ran image code (hvmloader,
//! SeaBIOS), with its instruction pointer only, as `[firmware]`; a PVH entry in 32-bit
//! protected mode inside the image is walked by 32-bit frames. Hypercall stubs are
//! stepped out of in long mode only.
//!
//! Idle vCPUs: the same multicall asks `XEN_DOMCTL_getvcpuinfo` of every vCPU, and a
//! vCPU Xen reports blocked (waiting for an event: `SCHEDOP_block`/`poll`, the PV idle
//! loop) is flagged halted. A PV vCPU inside a hypercall made through the hypercall
//! page (as Linux and Mini-OS make them) has its instruction pointer right after the
//! `syscall` of Xen's stub, with the stub's two pushes on its stack: glass recognises the
//! stub's bytes and samples the vCPU at the stub's caller (return address and stack
//! pointer as after the stub's `ret`). Without this, a frame-pointer walk from the stub
//! skips the caller (the stub keeps no frame), and the page has no CFI. An HVM/PVH
//! guest's stubs are `mov; vmcall|vmmcall; ret`, which push nothing: the same step out,
//! from the word at the stack pointer.
//!
//! Safety of the domain: glass counts as holding the domain paused from just before the
//! pause hypercall until the unpause returned, and says so in a [`StopMark`] shared
//! with its guardian process, which unpauses the domain if glass dies holding it, and
//! kills a glass that holds it paused past the stop bound (then unpauses it).

pub mod abi;
pub mod arm64;
pub mod code;
pub mod frames;
pub mod libs;

use std::ffi::c_void;
use std::sync::Arc;

use glass_format::Backend;
use glass_mem::{PagingMode, PhysicalMemory, TranslationCache, X86Paging};

use crate::arch::x86_64::X86Regs;
use crate::guest::{Arch, GuestBackend, GuestError, VcpuRegs};
use crate::stop_mark::StopMark;
use crate::TargetError;
use abi::*;
use frames::ForeignFrames;
use libs::XenLibs;

/// The architecture of the guests this build samples: Xen runs guests of its own
/// architecture, and glass runs natively in its dom0 (an aarch64 build on Xen on ARM64,
/// see [`arm64`]).
pub const GUEST_ARCH: Arch = if cfg!(target_arch = "aarch64") {
    Arch::Aarch64
} else {
    Arch::X86_64
};

/// Frames kept mapped (16 MiB): stacks and the page tables above them, with room.
const FRAME_CACHE: usize = 4096;
/// EFER.LMA and CR4.PAE: a 64-bit PV vCPU is always in long mode with 4-level paging.
const EFER_LMA: u64 = 1 << 10;
const CR4_PAE: u64 = 1 << 5;
/// CR0.PG: paging on (an HVM vCPU in real mode or unpaged protected mode has it clear).
const CR0_PG: u64 = 1 << 31;
/// CR0.PE: protected mode (a PV guest always is).
const CR0_PE: u64 = 1;
/// What `getvcpucontext` answers for a vCPU the guest never brought up.
const ENODATA: i64 = 61;

/// One of libxencall's hypercall-safe buffers (locked, never moved).
struct HypercallBuffer {
    libs: Arc<XenLibs>,
    call: *mut c_void,
    pointer: *mut u8,
    len: usize,
}

impl HypercallBuffer {
    fn new(libs: &Arc<XenLibs>, call: *mut c_void, len: usize) -> std::io::Result<Self> {
        // SAFETY: a valid xencall handle.
        let pointer = unsafe { (libs.xencall_alloc_buffer)(call, len) } as *mut u8;
        if pointer.is_null() {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `len` bytes were allocated.
        unsafe { std::ptr::write_bytes(pointer, 0, len) };
        Ok(HypercallBuffer {
            libs: libs.clone(),
            call,
            pointer,
            len,
        })
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: `len` bytes owned by this buffer.
        unsafe { std::slice::from_raw_parts_mut(self.pointer, self.len) }
    }

    fn address(&self, offset: usize) -> u64 {
        self.pointer as u64 + offset as u64
    }
}

impl Drop for HypercallBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated by xencall_alloc_buffer on this handle.
        unsafe { (self.libs.xencall_free_buffer)(self.call, self.pointer.cast()) };
    }
}

/// What [`Hypervisor::unpause_left`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unpaused {
    /// The domain was paused by glass, and runs now.
    Unpaused,
    /// Its pause had not taken effect: the domain was not paused.
    WasRunning,
}

/// The hypervisor's control interface (libxencall on /dev/xen/privcmd).
pub struct Hypervisor {
    libs: Arc<XenLibs>,
    call: *mut c_void,
    /// One domctl for the calls outside the sample path.
    single: Option<HypercallBuffer>,
}

/// What `XEN_DOMCTL_getdomaininfo` says of a domain.
#[derive(Debug, Clone, Copy)]
pub struct DomainInfo {
    pub domid: u32,
    pub flags: u32,
    pub online_vcpus: u32,
    pub max_vcpu_id: u32,
}

impl DomainInfo {
    pub fn paused(&self) -> bool {
        self.flags & DOMINF_PAUSED != 0
    }

    /// An HVM or PVH guest (else PV).
    pub fn hvm(&self) -> bool {
        self.flags & DOMINF_HVM_GUEST != 0
    }

    /// The guest's kind, for the summary.
    pub fn kind(&self) -> &'static str {
        if GUEST_ARCH == Arch::Aarch64 {
            "ARM64"
        } else if self.hvm() {
            "HVM/PVH"
        } else {
            "64-bit PV"
        }
    }
}

fn errno_text(errno: i32) -> String {
    std::io::Error::from_raw_os_error(errno).to_string()
}

impl Hypervisor {
    /// Opens the control interface, with one line for each reason it cannot be: no
    /// Xen, no libraries, not dom0, no privileges.
    pub fn open() -> Result<Hypervisor, TargetError> {
        let bad = |text: String| TargetError::BadInput(format!("--xen: {text}"));
        let hypervisor = std::fs::read_to_string("/sys/hypervisor/type").unwrap_or_default();
        if hypervisor.trim() != "xen" {
            return Err(bad(
                "this machine is not running on Xen (/sys/hypervisor/type does not say xen): run glass in dom0 of a Xen host".into(),
            ));
        }
        let capabilities = std::fs::read_to_string("/proc/xen/capabilities");
        match capabilities {
            Ok(text) if !text.contains("control_d") => {
                return Err(bad(
                    "this is a Xen guest, not dom0 (/proc/xen/capabilities has no control_d): run glass record --xen in dom0".into(),
                ))
            }
            Err(_) if !std::path::Path::new("/dev/xen/privcmd").exists() => {
                return Err(bad(
                    "no /proc/xen/capabilities and no /dev/xen/privcmd: this is not dom0 (a Xen guest, or a dom0 without Xen's drivers: modprobe xenfs xen-privcmd; mount -t xenfs xenfs /proc/xen)".into(),
                ))
            }
            _ => {}
        }
        let libs = XenLibs::load().map_err(|missing| {
            bad(format!(
                "cannot load {missing}: install Xen's tools in dom0 (Debian: xen-utils-4.17)"
            ))
        })?;
        let libs = Arc::new(libs);
        // SAFETY: a logger that lives for the program, no flags.
        let call = unsafe { (libs.xencall_open)(libs::quiet_logger(), 0) };
        if call.is_null() {
            let error = std::io::Error::last_os_error();
            return Err(bad(format!(
                "cannot open Xen's hypercall interface (/dev/xen/privcmd): {error}; run as root in dom0"
            )));
        }
        let mut hv = Hypervisor {
            libs,
            call,
            single: None,
        };
        hv.single =
            Some(HypercallBuffer::new(&hv.libs, call, DOMCTL_SIZE).map_err(TargetError::Io)?);
        Ok(hv)
    }

    /// One domctl through the single buffer; `fill` sets its payload. Returns the
    /// buffer as Xen left it, or the errno.
    fn domctl(&mut self, cmd: u32, domid: u32, fill: impl FnOnce(&mut [u8])) -> Result<&[u8], i32> {
        let call = self.call;
        let xencall1 = self.libs.xencall1;
        let buffer = self.single.as_mut().expect("opened");
        domctl(buffer.bytes(), cmd, domid);
        fill(buffer.bytes());
        // SAFETY: the domctl lies in a hypercall buffer of this handle.
        let result = unsafe { xencall1(call, HYPERVISOR_DOMCTL, buffer.address(0)) };
        if result < 0 {
            return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
        }
        Ok(buffer.bytes())
    }

    pub fn domain_info(&mut self, domid: u32) -> Result<DomainInfo, i32> {
        let reply = self.domctl(DOMCTL_GETDOMAININFO, domid, |_| {})?;
        Ok(DomainInfo {
            domid: read_u16(reply, INFO_DOMAIN) as u32,
            flags: read_u32(reply, INFO_FLAGS),
            online_vcpus: read_u32(reply, INFO_NR_ONLINE_VCPUS),
            max_vcpu_id: read_u32(reply, INFO_MAX_VCPU_ID),
        })
    }

    pub fn pause(&mut self, domid: u32) -> Result<(), i32> {
        self.domctl(DOMCTL_PAUSEDOMAIN, domid, |_| {}).map(|_| ())
    }

    pub fn unpause(&mut self, domid: u32) -> Result<(), i32> {
        self.domctl(DOMCTL_UNPAUSEDOMAIN, domid, |_| {}).map(|_| ())
    }

    /// What the guardian does for a glass that died holding domain `domid` paused: lets
    /// it run. Xen refuses an unpause with no controller pause outstanding: glass was
    /// killed between marking the pause and the pause taking effect (a pause can wait
    /// long in Xen, for the domctl lock or for the vCPUs to be descheduled). Nothing of
    /// glass's is held then; whether the domain runs is Xen's word, not the mark's.
    pub fn unpause_left(domid: u32) -> Result<Unpaused, String> {
        let mut hv = Hypervisor::open().map_err(|e| e.to_string())?;
        match hv.unpause(domid) {
            Ok(()) => Ok(Unpaused::Unpaused),
            Err(libc::EINVAL) => match hv.domain_info(domid) {
                Ok(info) if info.domid == domid && !info.paused() => Ok(Unpaused::WasRunning),
                _ => Err(std::io::Error::from_raw_os_error(libc::EINVAL).to_string()),
            },
            Err(errno) => Err(std::io::Error::from_raw_os_error(errno).to_string()),
        }
    }

    /// The guest's address size in bits (64 for a 64-bit PV guest).
    fn address_size(&mut self, domid: u32) -> Result<u32, i32> {
        self.domctl(DOMCTL_GET_ADDRESS_SIZE, domid, |_| {})
            .map(|reply| read_u32(reply, ADDRESS_SIZE_SIZE))
    }

    /// The domain `spec` names (a domid, or a name as `xl list` shows it), checked to
    /// be one glass can sample.
    pub fn find(&mut self, spec: &str) -> Result<(DomainInfo, String), TargetError> {
        let bad = |text: String| TargetError::BadInput(format!("--xen {spec}: {text}"));
        let (domid, name) = match spec.parse::<u32>() {
            Ok(domid) => {
                let name = self
                    .libs
                    .domain_names()
                    .and_then(|names| names.into_iter().find(|(id, _)| *id == domid))
                    .map_or_else(|| format!("domain {domid}"), |(_, name)| name);
                (domid, name)
            }
            Err(_) => {
                let names = self.libs.domain_names().ok_or_else(|| {
                    bad("cannot reach xenstore to look the name up (is xenstored running?); give the domain's id (xl list)".into())
                })?;
                match names.iter().find(|(_, name)| name == spec) {
                    Some((domid, name)) => (*domid, name.clone()),
                    None => {
                        let known: Vec<&str> = names.iter().map(|(_, n)| n.as_str()).collect();
                        return Err(bad(format!(
                            "no such domain (running: {})",
                            known.join(", ")
                        )));
                    }
                }
            }
        };
        if domid == 0 {
            return Err(bad(
                "that is dom0, where glass runs: glass samples a guest domain from dom0 (xl list shows their ids)".into(),
            ));
        }
        let info = match self.domain_info(domid) {
            Ok(info) if info.domid == domid => info,
            Ok(_) | Err(libc::ESRCH) => return Err(bad("no such domain (xl list shows the domains)".into())),
            Err(libc::EACCES) => {
                return Err(bad(format!(
                    "the hypervisor refused domctl interface version {DOMCTL_INTERFACE_VERSION:#x}: glass speaks Xen 4.17's, this Xen is another version"
                )))
            }
            Err(errno) => return Err(bad(format!("cannot query the domain: {}", errno_text(errno)))),
        };
        if info.flags & (DOMINF_DYING | DOMINF_SHUTDOWN) != 0 {
            return Err(bad("the domain is shutting down".into()));
        }
        // Every ARM domain carries the HVM flag and answers no address-size query.
        if GUEST_ARCH == Arch::Aarch64 {
            if info.max_vcpu_id == u32::MAX {
                return Err(bad("the domain has no vCPUs".into()));
            }
            return Ok((info, name));
        }
        // An HVM/PVH guest's width is its vCPUs' mode (EFER.LMA), seen at each sample;
        // Xen answers the address-size query for PV guests only.
        match self.address_size(domid) {
            _ if info.hvm() => {}
            Ok(64) => {}
            Ok(bits) => {
                return Err(bad(format!(
                    "a {bits}-bit PV guest: glass record --xen samples 64-bit guests"
                )))
            }
            Err(errno) => {
                return Err(bad(format!(
                    "cannot query the domain: {}",
                    errno_text(errno)
                )))
            }
        }
        if info.max_vcpu_id == u32::MAX {
            return Err(bad("the domain has no vCPUs".into()));
        }
        Ok((info, name))
    }
}

impl Drop for Hypervisor {
    fn drop(&mut self) {
        self.single = None;
        // SAFETY: the handle opened in `open`; its buffers are freed above or by their
        // owners, which hold their own reference to the libraries.
        unsafe { (self.libs.xencall_close)(self.call) };
    }
}

/// A PV domain as a [`GuestBackend`].
pub struct XenBackend {
    hv: Hypervisor,
    domid: u32,
    vcpus: usize,
    /// HVM/PVH: registers from the vCPU's HVM save record, CR3 guest-physical.
    hvm: bool,
    /// Multicall entries: pause, then one getvcpucontext per vCPU.
    entries: HypercallBuffer,
    domctls: HypercallBuffer,
    contexts: HypercallBuffer,
    /// The hypervisor takes domctls in a multicall (probed at start); else one call each.
    batched: bool,
    frames: ForeignFrames,
    /// For the backend's own reads (hypercall stubs); the loop keeps its own for stacks.
    translations: TranslationCache,
    halted: Vec<bool>,
    /// Per vCPU at the last stop: it has a context (was brought up).
    online: Vec<bool>,
    /// vCPUs seen inside a hypercall stub and sampled at its caller.
    in_hypercall: Vec<u64>,
    mark: Option<StopMark>,
    /// Between the pause and the unpause.
    paused: bool,
    /// GLASS_XEN_STOP_WHILE_PAUSED (tests only): glass stops itself (SIGSTOP) once while
    /// it holds the domain paused, so that a test can kill it there by construction.
    stop_while_paused: bool,
    gone: bool,
    /// When [`GuestBackend::ran_again`] last asked Xen about the domain.
    liveness_asked: Option<std::time::Instant>,
    /// Whether vCPU states are asked in the pause (see [`StateAsking`]).
    states: StateAsking,
    /// Per vCPU at the last stop: Xen said it was blocked (None: not asked).
    blocked: Vec<Option<bool>>,
    /// Per vCPU at the last stop: stopped inside SCHEDOP_block/poll's stub.
    in_block_stub: Vec<bool>,
    /// What [`XenBackend::hypercall_at`] read, by (CR3, rip).
    stubs: std::collections::HashMap<(u64, u64), Option<(u64, u64)>, foldhash::fast::FixedState>,
}

/// Addresses whose code [`XenBackend::hypercall_at`] remembers (past it, it reads afresh).
const MAX_STUBS_REMEMBERED: usize = 4096;

/// Whether the pause's multicall asks each vCPU's state (getvcpuinfo: blocked or not).
/// A 64-bit PV guest blocks through SCHEDOP_block or SCHEDOP_poll, made through the
/// hypercall page, whose stub the backend recognises at every stop anyway: there Xen's
/// word says nothing the stub does not, and leaving it out takes one domctl per vCPU out
/// of the pause. It is left out only after the first [`StateAsking::LEARN`] stops showed
/// every blocked vCPU inside such a stub, asked again every [`StateAsking::RECHECK`]th
/// stop, and for good once a blocked vCPU was elsewhere (a guest that blocks by its own
/// hypercall instruction). HVM/PVH guests halt with `hlt`, and arm64 ones with `wfi`:
/// their states are always asked.
#[derive(Default)]
struct StateAsking {
    stops: u64,
    asked: u64,
    /// A blocked vCPU was seen outside the block stubs: asked at every stop.
    always: bool,
}

impl StateAsking {
    const LEARN: u64 = 64;
    const RECHECK: u64 = 256;

    fn at_this_stop(&self, pv_x86: bool) -> bool {
        !pv_x86
            || self.always
            || self.stops < Self::LEARN
            || self.stops.is_multiple_of(Self::RECHECK)
    }
}

/// How often the domain's liveness is asked (one more hypercall, tens of microseconds of
/// dom0's CPU under TCG, where the reference loop in bench/ takes none): a domain that shut
/// down is noticed within this, at most this much of its end (its vCPUs stopped where they
/// shut down) sampled.
const LIVENESS_PERIOD: std::time::Duration = std::time::Duration::from_millis(10);

impl XenBackend {
    /// Opens domain `info` for sampling; `mark` is shared with the guardian.
    pub fn new(
        hv: Hypervisor,
        info: DomainInfo,
        mark: Option<StopMark>,
    ) -> Result<XenBackend, TargetError> {
        let vcpus = info.max_vcpu_id as usize + 1;
        let io = TargetError::Io;
        let calls = 1 + 2 * vcpus;
        let entries =
            HypercallBuffer::new(&hv.libs, hv.call, calls * MULTICALL_ENTRY_SIZE).map_err(io)?;
        let domctls = HypercallBuffer::new(&hv.libs, hv.call, calls * DOMCTL_SIZE).map_err(io)?;
        let contexts = HypercallBuffer::new(&hv.libs, hv.call, vcpus * CONTEXT_SIZE).map_err(io)?;
        let frames =
            ForeignFrames::open(hv.libs.clone(), info.domid, FRAME_CACHE).map_err(|e| {
                TargetError::BadInput(format!(
                    "--xen: cannot open Xen's foreign-memory interface: {e}; run as root in dom0"
                ))
            })?;
        let mut backend = XenBackend {
            hv,
            domid: info.domid,
            vcpus,
            // An ARM domain carries the HVM flag, but its registers come from
            // getvcpucontext (decoded by `arm64`), as a PV guest's do.
            hvm: info.hvm() && GUEST_ARCH == Arch::X86_64,
            entries,
            domctls,
            contexts,
            batched: false,
            frames,
            translations: TranslationCache::new(),
            halted: vec![false; vcpus],
            online: vec![false; vcpus],
            in_hypercall: vec![0; vcpus],
            mark,
            paused: false,
            stop_while_paused: std::env::var_os("GLASS_XEN_STOP_WHILE_PAUSED").is_some(),
            gone: false,
            liveness_asked: None,
            stubs: Default::default(),
            states: StateAsking::default(),
            blocked: vec![None; vcpus],
            in_block_stub: vec![false; vcpus],
        };
        // GLASS_XEN_NO_MULTICALL=1 takes the fallback on purpose, to measure what the
        // multicall saves (bench/xen_bench.py) and to test the fallback itself.
        backend.batched =
            std::env::var_os("GLASS_XEN_NO_MULTICALL").is_none() && backend.probe_multicall();
        Ok(backend)
    }

    /// Whether one multicall may carry the domctls: tried with a getdomaininfo.
    fn probe_multicall(&mut self) -> bool {
        let domid = self.domid;
        let domctl_address = self.domctls.address(0);
        domctl(self.domctls.bytes(), DOMCTL_GETDOMAININFO, domid);
        let entry = self.entries.bytes();
        entry[..MULTICALL_ENTRY_SIZE].fill(0);
        write_u64(entry, 0, HYPERVISOR_DOMCTL as u64);
        write_u64(entry, 16, domctl_address);
        // SAFETY: one entry whose domctl lies in a hypercall buffer.
        let result = unsafe {
            (self.hv.libs.xencall2)(
                self.hv.call,
                HYPERVISOR_MULTICALL,
                self.entries.address(0),
                1,
            )
        };
        let entry_result = read_u64(self.entries.bytes(), 8) as i64;
        result == 0
            && entry_result == 0
            && read_u16(self.domctls.bytes(), INFO_DOMAIN) as u32 == domid
    }

    /// Pauses the domain and reads every vCPU's context into `contexts` and its state
    /// (blocked or not) into `domctls`; sets per vCPU whether it has a context (a vCPU
    /// never brought up has none). The domctls: 0 the pause, then per vCPU `v`
    /// getvcpucontext (HVM/PVH: gethvmcontext_partial of its CPU record) at 1 + 2v and
    /// getvcpuinfo at 2 + 2v. (A domain being destroyed can still be paused and read,
    /// but glass must let go of it, its mapped frames keeping it from dying: `resume`
    /// asks its state once it runs.) Nothing is allocated here.
    fn pause_and_read(&mut self, online: &mut [bool]) -> Result<(), GuestError> {
        let domid = self.domid;
        // The domain's own state (ending, or gone) is asked once it runs again
        // (`ran_again`): every domctl in the multicall lengthens the pause.
        let states = self.states.at_this_stop(self.pv_x86());
        // Per vCPU: its context, then (if asked) its state.
        let stride = 1 + usize::from(states);
        let calls = 1 + stride * self.vcpus;
        for index in 0..calls {
            let vcpu = index.saturating_sub(1) / stride;
            let is_context = index >= 1 && (index - 1) % stride == 0;
            let context = self.contexts.address(vcpu * CONTEXT_SIZE);
            let buffer = &mut self.domctls.bytes()[index * DOMCTL_SIZE..];
            if index == 0 {
                domctl(buffer, DOMCTL_PAUSEDOMAIN, domid);
            } else if is_context && self.hvm {
                domctl(buffer, DOMCTL_GETHVMCONTEXT_PARTIAL, domid);
                write_u32(buffer, HVMCONTEXT_TYPE, HVM_SAVE_CPU);
                write_u32(buffer, HVMCONTEXT_INSTANCE, vcpu as u32);
                write_u64(buffer, HVMCONTEXT_BUFSZ, CONTEXT_SIZE as u64);
                write_u64(buffer, HVMCONTEXT_BUFFER, context);
            } else if is_context {
                domctl(buffer, DOMCTL_GETVCPUCONTEXT, domid);
                write_u32(buffer, VCPUCONTEXT_VCPU, vcpu as u32);
                write_u64(buffer, VCPUCONTEXT_CTXT, context);
            } else {
                domctl(buffer, DOMCTL_GETVCPUINFO, domid);
                write_u32(buffer, VCPUINFO_VCPU, vcpu as u32);
            }
        }
        if let Some(mark) = &self.mark {
            mark.begin();
        }
        self.paused = true;
        let call = self.hv.call;
        let (xencall1, xencall2) = (self.hv.libs.xencall1, self.hv.libs.xencall2);
        if self.batched {
            for index in 0..calls {
                let address = self.domctls.address(index * DOMCTL_SIZE);
                let entry = &mut self.entries.bytes()[index * MULTICALL_ENTRY_SIZE..];
                entry[..MULTICALL_ENTRY_SIZE].fill(0);
                write_u64(entry, 0, HYPERVISOR_DOMCTL as u64);
                write_u64(entry, 16, address);
            }
            // SAFETY: `calls` entries, each pointing at a domctl in a hypercall buffer,
            // each getvcpucontext at a context buffer of CONTEXT_SIZE bytes.
            let result = unsafe {
                xencall2(
                    call,
                    HYPERVISOR_MULTICALL,
                    self.entries.address(0),
                    calls as u64,
                )
            };
            if result < 0 {
                let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
                return Err(self.failed("pause", errno));
            }
        } else {
            for index in 0..calls {
                let address = self.domctls.address(index * DOMCTL_SIZE);
                // SAFETY: a domctl in a hypercall buffer (its context buffer as well).
                let result = unsafe { xencall1(call, HYPERVISOR_DOMCTL, address) };
                let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
                // Kept where the multicall keeps it, to read both ways alike below.
                let entry = &mut self.entries.bytes()[index * MULTICALL_ENTRY_SIZE..];
                write_u64(
                    entry,
                    8,
                    if result < 0 {
                        (-(errno as i64)) as u64
                    } else {
                        0
                    },
                );
                if index == 0 && result < 0 {
                    break;
                }
            }
        }
        let result = |backend: &mut Self, index: usize| {
            read_u64(backend.entries.bytes(), index * MULTICALL_ENTRY_SIZE + 8) as i64
        };
        let paused = result(self, 0);
        if paused != 0 {
            self.paused = false;
            if let Some(mark) = &self.mark {
                mark.end();
            }
            return Err(self.failed("pause", -paused as i32));
        }
        self.states.stops += 1;
        self.states.asked += u64::from(states);
        for (vcpu, online) in online.iter_mut().enumerate() {
            let context = result(self, 1 + stride * vcpu);
            *online = context == 0;
            if context != 0 && context != -ENODATA {
                return Err(self.failed("read the vCPU context of", -context as i32));
            }
            let state = 2 + stride * vcpu;
            let blocked = states.then(|| {
                result(self, state) == 0
                    && self.domctls.bytes()[state * DOMCTL_SIZE + VCPUINFO_BLOCKED] != 0
            });
            self.blocked[vcpu] = blocked;
            self.halted[vcpu] = blocked == Some(true);
        }
        Ok(())
    }

    fn unpause(&mut self) -> Result<(), GuestError> {
        match self.hv.unpause(self.domid) {
            Ok(()) => {
                self.paused = false;
                if let Some(mark) = &self.mark {
                    mark.end();
                }
                Ok(())
            }
            Err(errno) => Err(self.failed("unpause", errno)),
        }
    }

    /// A hypercall on the domain failed: "gone" where the domain no longer runs (ESRCH, or
    /// as [`XenBackend::alive`] finds it), else what failed.
    fn failed(&mut self, what: &str, errno: i32) -> GuestError {
        if errno == libc::ESRCH {
            self.gone = true;
            return GuestError(format!("domain {} is gone", self.domid));
        }
        if let Err(gone) = self.alive() {
            return gone;
        }
        GuestError(format!(
            "cannot {what} domain {}: {}",
            self.domid,
            errno_text(errno)
        ))
    }

    /// The registers of vCPU `vcpu` from its context, stepped out of a hypercall stub.
    fn registers(&mut self, vcpu: usize) -> X86Regs {
        let context = &self.contexts.bytes()[vcpu * CONTEXT_SIZE..(vcpu + 1) * CONTEXT_SIZE];
        let (mut regs, rdi) = if self.hvm {
            let cr0 = read_u64(context, HVM_CPU_CR0);
            let regs = X86Regs {
                ip: read_u64(context, HVM_CPU_RIP),
                sp: read_u64(context, HVM_CPU_RSP),
                fp: read_u64(context, HVM_CPU_RBP),
                cr3: read_u64(context, HVM_CPU_CR3),
                cr4: read_u64(context, HVM_CPU_CR4),
                // The walk's mode (paging off, 2-level, PAE, long) as for a QEMU guest.
                cr0,
                // EFER.LMA implies CR0.PG; checked anyway, as the walk needs both.
                efer: if cr0 & CR0_PG != 0 {
                    read_u64(context, HVM_CPU_EFER)
                } else {
                    0
                },
                gs_base: read_u64(context, HVM_CPU_GS_BASE),
                k_gs_base: read_u64(context, HVM_CPU_SHADOW_GS),
            };
            (regs, read_u64(context, HVM_CPU_RDI))
        } else {
            let flags = read_u64(context, CONTEXT_FLAGS);
            let kernel_table = read_u64(context, CONTEXT_CTRLREG + 3 * 8);
            let user_table = read_u64(context, CONTEXT_CTRLREG + 8);
            let in_user = flags & VGCF_IN_KERNEL == 0;
            let cr3 = if in_user && user_table != 0 {
                user_table
            } else {
                kernel_table
            };
            // Xen swaps a PV guest's GS bases for it at each change of mode.
            let (kernel_gs, user_gs) = (
                read_u64(context, CONTEXT_GS_BASE_KERNEL),
                read_u64(context, CONTEXT_GS_BASE_USER),
            );
            let (gs_base, k_gs_base) = if in_user {
                (user_gs, kernel_gs)
            } else {
                (kernel_gs, user_gs)
            };
            let regs = X86Regs {
                ip: read_u64(context, CONTEXT_RIP),
                sp: read_u64(context, CONTEXT_RSP),
                fp: read_u64(context, CONTEXT_RBP),
                cr3,
                cr4: CR4_PAE,
                efer: EFER_LMA,
                cr0: CR0_PE | CR0_PG,
                gs_base,
                k_gs_base,
            };
            (regs, read_u64(context, CONTEXT_RDI))
        };
        if !regs.long_mode() {
            // Not paging in long mode: nothing to walk, nor a stub to step out of.
            return regs;
        }
        if let Some((number, pushed)) = self.hypercall_at(&regs) {
            let mut word = [0u8; 8];
            if self.read_virtual_exact(&regs, regs.sp + pushed, &mut word) {
                self.in_hypercall[vcpu] += 1;
                // Xen's own word (getvcpuinfo) says whether it is blocked; a vCPU still
                // inside SCHEDOP_block/poll is on its way there or back.
                let blocks =
                    number == HYPERVISOR_SCHED_OP && matches!(rdi, SCHEDOP_BLOCK | SCHEDOP_POLL);
                self.in_block_stub[vcpu] = blocks;
                self.halted[vcpu] |= blocks;
                regs.ip = u64::from_le_bytes(word);
                regs.sp += pushed + 8;
            }
        }
        regs
    }

    /// Reads guest-virtual memory as `regs` page it through the backend's own
    /// translation cache (the stub's code and the word above it, before the loop's stack
    /// copy).
    fn read_virtual_exact(&mut self, regs: &X86Regs, address: u64, buf: &mut [u8]) -> bool {
        let paging = X86Paging {
            cr3: regs.cr3,
            mode: PagingMode::from_registers(regs.cr0, regs.cr4, regs.efer),
        };
        self.translations
            .read_with(&self.frames, &paging, address, buf)
            == buf.len()
    }

    /// When `regs.ip` sits right after the call instruction of one of Xen's hypercall
    /// stubs: the hypercall number, and how many bytes the stub pushed above its return
    /// address (PV's stub pushes rcx and r11; HVM's nothing). What the code at an address
    /// of an address space is, once read, is remembered: a vCPU blocked in the guest's
    /// idle loop is stopped in the same stub at most samples, and reading its code again
    /// cost a translation and a copy in every one of those stops. (Xen fills the hypercall
    /// page once, when the guest is built or asks for it at boot.)
    fn hypercall_at(&mut self, regs: &X86Regs) -> Option<(u64, u64)> {
        let back = if self.hvm {
            HVM_HYPERCALL_STUB_RETURN
        } else {
            HYPERCALL_STUB_RETURN
        };
        let start = regs.ip.checked_sub(back as u64)?;
        if start % 32 != 0 {
            return None;
        }
        let key = (regs.cr3, regs.ip);
        if let Some(&stub) = self.stubs.get(&key) {
            return stub;
        }
        // Unreadable: not remembered (the page may be mapped later).
        let stub = self.read_hypercall_stub(regs, start)?;
        if self.stubs.len() >= MAX_STUBS_REMEMBERED {
            self.stubs.clear();
        }
        self.stubs.insert(key, stub);
        stub
    }

    /// [`XenBackend::hypercall_at`]'s reading of the code at `start`: None where it could
    /// not be read, Some(None) where it is no stub.
    fn read_hypercall_stub(&mut self, regs: &X86Regs, start: u64) -> Option<Option<(u64, u64)>> {
        let pushed = if self.hvm { 0 } else { 16 };
        if self.hvm {
            let mut bytes = [0u8; HVM_HYPERCALL_STUB.len()];
            if !self.read_virtual_exact(regs, start, &mut bytes) {
                return None;
            }
            let number = u32::from_le_bytes(bytes[1..5].try_into().unwrap());
            let mut expected = HVM_HYPERCALL_STUB;
            expected[1..5].copy_from_slice(&number.to_le_bytes());
            if bytes[7] == HVM_VMMCALL {
                expected[7] = HVM_VMMCALL;
            }
            return Some((bytes == expected).then_some((number as u64, pushed)));
        }
        let mut bytes = [0u8; HYPERCALL_STUB.len()];
        if !self.read_virtual_exact(regs, start, &mut bytes) {
            return None;
        }
        let number = u32::from_le_bytes(bytes[4..8].try_into().unwrap());
        let mut expected = HYPERCALL_STUB;
        expected[4..8].copy_from_slice(&number.to_le_bytes());
        Some((bytes == expected).then_some((number as u64, pushed)))
    }

    /// A 64-bit PV guest on x86-64 Xen (whose vCPUs block only through the stubs
    /// [`XenBackend::hypercall_at`] recognises).
    fn pv_x86(&self) -> bool {
        !self.hvm && GUEST_ARCH == Arch::X86_64
    }

    /// Whether the domain still runs: not shut down, not destroyed (getdomaininfo then
    /// answers for the next domain, or ESRCH). Marks the backend gone if not.
    fn alive(&mut self) -> Result<(), GuestError> {
        let domid = self.domid;
        match self.hv.domain_info(domid) {
            Ok(info)
                if info.domid == domid && info.flags & (DOMINF_DYING | DOMINF_SHUTDOWN) == 0 =>
            {
                Ok(())
            }
            Ok(_) | Err(_) => {
                self.gone = true;
                Err(GuestError(format!(
                    "domain {domid} is gone (shut down or destroyed)"
                )))
            }
        }
    }
}

impl GuestBackend for XenBackend {
    fn arch(&self) -> Arch {
        GUEST_ARCH
    }

    fn recording_backend(&self) -> Backend {
        Backend::Xen
    }

    /// dom0 shares its pCPU with guest vCPUs: a glass that sleeps to its next deadline
    /// gives the pCPU away and wakes late (104-120 stops/s taken at 997 Hz asked, where
    /// the libxenctrl floor, which never sleeps once late, took 209-245).
    fn takes_late_ticks_at_once(&self) -> bool {
        true
    }

    fn vcpu_count(&self) -> usize {
        self.vcpus
    }

    fn stop_with_registers(&mut self, out: &mut [VcpuRegs]) -> Result<(), GuestError> {
        let mut online = std::mem::take(&mut self.online);
        let read = self.pause_and_read(&mut online);
        self.online = online;
        read?;
        if std::mem::take(&mut self.stop_while_paused) {
            // SAFETY: raising a signal at ourselves.
            unsafe { libc::raise(libc::SIGSTOP) };
        }
        self.in_block_stub.fill(false);
        for vcpu in 0..self.vcpus.min(out.len()) {
            out[vcpu] = if self.online[vcpu] && GUEST_ARCH == Arch::Aarch64 {
                let context = &self.contexts.bytes()[vcpu * CONTEXT_SIZE..];
                // An AArch32 vCPU reads as not started, as one never brought up.
                arm64::registers(&context[..arm64::CONTEXT_SIZE])
                    .map_or(VcpuRegs::zeroed(Arch::Aarch64), VcpuRegs::Aarch64)
            } else if self.online[vcpu] {
                VcpuRegs::X86_64(self.registers(vcpu))
            } else {
                // Never brought up: no long mode, so the loop shows it as not started.
                self.halted[vcpu] = false;
                VcpuRegs::zeroed(GUEST_ARCH)
            };
        }
        if self.pv_x86() {
            // A vCPU Xen had blocked outside the block stubs: states asked from now on.
            let outside =
                (0..self.vcpus).any(|v| self.blocked[v] == Some(true) && !self.in_block_stub[v]);
            self.states.always |= outside;
        }
        Ok(())
    }

    fn resume(&mut self) -> Result<(), GuestError> {
        if !self.paused {
            return Ok(());
        }
        self.unpause()
    }

    /// Asked now rather than in the pause's multicall, and after the loop's timing of
    /// the stop, at most every [`LIVENESS_PERIOD`] (and by `failed` whenever a hypercall
    /// on the domain fails): a domain shut down or destroyed ends the recording there.
    fn ran_again(&mut self, now: std::time::Instant) -> Result<(), GuestError> {
        if self
            .liveness_asked
            .is_some_and(|asked| now.duration_since(asked) < LIVENESS_PERIOD)
        {
            return Ok(());
        }
        self.liveness_asked = Some(now);
        self.alive()
    }

    fn detach(&mut self) -> Result<(), GuestError> {
        if !self.paused {
            return Ok(());
        }
        self.unpause()
    }

    fn physical_memory(&self) -> Option<&dyn PhysicalMemory> {
        Some(&self.frames)
    }

    fn read_virtual(
        &mut self,
        _vcpu: usize,
        _address: u64,
        _buf: &mut [u8],
    ) -> Result<usize, GuestError> {
        // Every read goes through `physical_memory`.
        Ok(0)
    }

    fn read_unit(&self) -> usize {
        4096
    }

    fn halted(&self, vcpu: usize) -> Option<bool> {
        self.halted.get(vcpu).copied()
    }

    fn walks_in_place(&self) -> bool {
        true
    }

    fn gone(&self) -> bool {
        self.gone
    }

    fn figures(&self) -> Vec<String> {
        let frames = self.frames.figures();
        let stepped: u64 = self.in_hypercall.iter().sum();
        vec![
            format!(
                "Xen: pause, {} vCPU {} and states {}{}",
                self.vcpus,
                if self.hvm {
                    "HVM CPU records"
                } else {
                    "contexts"
                },
                if self.batched {
                    "in one multicall per sample"
                } else {
                    "in one hypercall each (GLASS_XEN_NO_MULTICALL, or this Xen refused domctls in a multicall)"
                },
                if self.states.asked < self.states.stops {
                    format!(
                        "; the states in {} of {} (every blocked vCPU was inside SCHEDOP_block or SCHEDOP_poll's stub, which tells the same)",
                        self.states.asked, self.states.stops
                    )
                } else {
                    String::new()
                }
            ),
            format!(
                "guest frames mapped: {} now (bounded at {FRAME_CACHE}), {} maps, {} unmapped to make room, {} failed",
                frames.mapped_now, frames.maps, frames.unmaps, frames.failures
            ),
            format!("vCPUs sampled inside a hypercall (shown at its caller): {stepped}"),
        ]
    }
}

impl Drop for XenBackend {
    fn drop(&mut self) {
        // Whatever ends the backend, the domain runs.
        let _ = self.resume();
    }
}
