//! The perf_event backend: the kernel samples the target on a cpu-clock timer and copies
//! the user registers and the top of the user stack into a ring buffer at the interrupt.
//! The target is never stopped by glass: the only cost it pays is the copy, made by the
//! kernel on the target's own core.
//!
//! One event per CPU with `inherit`, attached to the target's threads (every existing
//! thread for `--pid`; the launched process before exec otherwise), so threads and
//! children created later are sampled too; every event of a CPU writes into that CPU's
//! one ring, sized from the rate and the stack size (see [`wanted_ring_bytes`]).
//! `PERF_RECORD_MMAP2`, `COMM`, `FORK` and `EXIT` records keep the module map and the
//! thread names current. Where permitted, samples also carry the kernel's callchain
//! ([`PerfConfig::kernel`]), and a context-switch event samples where threads block
//! ([`PerfConfig::off_cpu`]).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use perf_event_open_sys as sys;
use sys::bindings as b;

use crate::TargetError;

/// x86-64 perf register numbers (arch/x86/include/uapi/asm/perf_regs.h).
#[cfg(target_arch = "x86_64")]
mod regs {
    pub const BP: u32 = 6;
    pub const SP: u32 = 7;
    pub const IP: u32 = 8;
}
#[cfg(target_arch = "aarch64")]
mod regs {
    // arch/arm64/include/uapi/asm/perf_regs.h: x29 is the frame pointer.
    pub const BP: u32 = 29;
    pub const SP: u32 = 31;
    pub const IP: u32 = 32;
}

/// Registers sampled, in the order the kernel writes them (ascending bit number).
const REGS_MASK: u64 = (1 << regs::BP) | (1 << regs::SP) | (1 << regs::IP);

/// How long the rings hold samples at the sampling rate. glass drains them from a thread
/// of its own that does nothing else, woken at a watermark well below this; the rest is
/// headroom for a drain thread that a loaded machine schedules late.
const RING_HOLD_MS: u64 = 500;
/// The wake-up comes after at most this much of the rate's samples (or a quarter ring).
const WAKE_MS: u64 = 100;
/// Bounds of one ring's data area.
const RING_MIN_BYTES: usize = 16 << 10;
const RING_MAX_BYTES: usize = 64 << 20;
/// A sample's bytes besides the stack copy: header, tid, time, abi, three registers,
/// stack size and dyn size.
const SAMPLE_FIXED_BYTES: usize = 8 + 8 + 8 + 8 + 3 * 8 + 8 + 8;

/// What to sample and how big the rings are.
#[derive(Debug, Clone)]
pub struct PerfConfig {
    pub frequency_hz: u32,
    pub stack_size: u32,
    /// Counting starts when the (paused) launched process execs.
    pub enable_on_exec: bool,
    /// Ring data bytes per CPU (a power of two); `None`: sized from the rate and the
    /// stack size (see [`wanted_ring_bytes`]).
    pub ring_bytes: Option<usize>,
    /// Sample in kernel mode too, with the kernel's callchain (kernel frames only: the
    /// user stack is still unwound by glass from the copy).
    pub kernel: bool,
    /// Also sample every context switch out of a target thread (its stacks where it
    /// blocks), with `PERF_RECORD_SWITCH` records to time each block. Needs `kernel`.
    pub off_cpu: bool,
}

/// What a sample record holds besides the fixed fields, as the events were opened.
#[derive(Debug, Clone, Copy, Default)]
pub struct Layout {
    /// `PERF_SAMPLE_IDENTIFIER`: the event's id first (tells switch samples apart).
    pub identifier: bool,
    /// `PERF_SAMPLE_CALLCHAIN`: the kernel's callchain after the time.
    pub callchain: bool,
}

impl Layout {
    pub fn of(config: &PerfConfig) -> Layout {
        Layout {
            identifier: config.off_cpu,
            callchain: config.kernel || config.off_cpu,
        }
    }
}

/// The kernel's callchain depth limit (kernel.perf_event_max_stack's default).
const MAX_KERNEL_FRAMES: usize = 127;

impl PerfConfig {
    pub fn new(frequency_hz: u32, stack_size: u32, enable_on_exec: bool) -> Self {
        PerfConfig {
            frequency_hz,
            stack_size,
            enable_on_exec,
            ring_bytes: None,
            kernel: false,
            off_cpu: false,
        }
    }

    /// The largest record a sample makes.
    pub fn sample_bytes(&self) -> usize {
        let layout = Layout::of(self);
        SAMPLE_FIXED_BYTES
            + self.stack_size as usize
            + if layout.identifier { 8 } else { 0 }
            + if layout.callchain {
                8 * (MAX_KERNEL_FRAMES + 2)
            } else {
                0
            }
    }
}

/// The ring size that holds [`RING_HOLD_MS`] of samples from one CPU (a CPU runs one
/// thread at a time, so it makes at most `frequency_hz` samples a second whatever the
/// number of threads): perf sizes its rings from `perf_event_mlock_kb` alone, which is
/// enough for it because it only copies records to a file, but glass's records carry a
/// 16 KiB stack where perf's carry 8, and glass does more per record.
pub fn wanted_ring_bytes(config: &PerfConfig) -> usize {
    // Off-CPU samples come at the rate threads block, which nothing bounds: room for as
    // many again as the clock makes is a guess that holds for the servers tried.
    let rate = config.frequency_hz as u64 * if config.off_cpu { 2 } else { 1 };
    let per_second = rate * config.sample_bytes() as u64;
    let bytes = (per_second * RING_HOLD_MS / 1000) as usize;
    bytes
        .max(4 * config.sample_bytes())
        .next_power_of_two()
        .clamp(RING_MIN_BYTES, RING_MAX_BYTES)
}

/// The rings as they were mapped.
#[derive(Debug, Clone, Default)]
pub struct RingInfo {
    /// Data bytes per ring (one ring per CPU).
    pub bytes: usize,
    /// What the sizing asked for.
    pub wanted: usize,
    pub rings: usize,
    /// Bytes of records that wake glass.
    pub watermark: usize,
    /// Why `bytes` is below `wanted` (the locked-memory limits), if it is.
    pub limited_by: Option<String>,
}

/// One record read from a ring. Slices borrow the sampler's scratch buffer.
#[derive(Debug)]
pub enum PerfRecord<'a> {
    Sample {
        /// The event's id (with [`Layout::identifier`]; else 0): see
        /// [`PerfSampler::switch_ids`].
        id: u64,
        pid: u32,
        tid: u32,
        time_ns: u64,
        /// The kernel's callchain as it is in the record (with [`Layout::callchain`]):
        /// read it with [`kernel_frames`].
        callchain: &'a [u8],
        ip: u64,
        sp: u64,
        fp: u64,
        /// The copied stack, starting at `sp`; only the first `dyn_size` bytes are valid.
        stack: &'a [u8],
    },
    Mmap {
        time_ns: u64,
        pid: u32,
        start: u64,
        len: u64,
        file_offset: u64,
        executable: bool,
        path: &'a str,
    },
    Comm {
        time_ns: u64,
        pid: u32,
        tid: u32,
        exec: bool,
        name: &'a str,
    },
    Fork {
        time_ns: u64,
        pid: u32,
        parent_pid: u32,
        tid: u32,
    },
    Exit {
        time_ns: u64,
        pid: u32,
        tid: u32,
    },
    /// A target thread left the CPU (`out`; `preempted`: it was still runnable) or came
    /// back to it.
    Switch {
        time_ns: u64,
        pid: u32,
        tid: u32,
        out: bool,
        preempted: bool,
    },
    /// Records the kernel dropped because the ring was full, said before the next
    /// record that fit: `pid`/`tid` are that record's (the kernel keeps no finer count;
    /// on a CPU's ring it is most often the thread whose samples were dropped).
    Lost {
        time_ns: u64,
        pid: u32,
        tid: u32,
        count: u64,
    },
}

struct Ring {
    base: *mut u8,
    mapped_len: usize,
    data_len: usize,
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what was mapped.
        unsafe { libc::munmap(self.base.cast(), self.mapped_len) };
    }
}

// SAFETY: the mapping belongs to this Ring alone.
unsafe impl Send for Ring {}

/// The kernel's sampling of one target: the events (one per CPU, or per thread and CPU
/// for `--pid`) and one ring per CPU, into which every event of that CPU writes
/// (`PERF_EVENT_IOC_SET_OUTPUT`, as perf does): memory grows with CPUs, not threads.
pub struct PerfSampler {
    /// Per ring, the descriptor it is mapped from (polled for wake-ups).
    ring_fds: Vec<OwnedFd>,
    rings: Vec<Ring>,
    /// The other events, writing into their CPU's ring.
    others: Vec<OwnedFd>,
    pub stack_size: u32,
    pub ring_info: RingInfo,
    pub layout: Layout,
    /// Ids of the context-switch events (`--off-cpu`): their samples are switches out.
    pub switch_ids: Vec<u64>,
}

/// Whether perf_event_open with user stack capture is allowed here.
pub fn available() -> bool {
    let mut attr = attributes(&PerfConfig::new(99, 512, false), 4096);
    // SAFETY: a valid attr; the fd is closed at once.
    let fd = unsafe { sys::perf_event_open(&mut attr, 0, -1, -1, b::PERF_FLAG_FD_CLOEXEC as _) };
    if fd >= 0 {
        unsafe { libc::close(fd) };
        true
    } else {
        false
    }
}

/// The two kinds of event: the sampling clock, and (`--off-cpu`) context switches.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Clock,
    Switches,
}

fn attributes(config: &PerfConfig, watermark: usize) -> b::perf_event_attr {
    event_attributes(config, watermark, Kind::Clock)
}

fn event_attributes(config: &PerfConfig, watermark: usize, kind: Kind) -> b::perf_event_attr {
    let layout = Layout::of(config);
    let mut sample_type = (b::PERF_SAMPLE_TID
        | b::PERF_SAMPLE_TIME
        | b::PERF_SAMPLE_REGS_USER
        | b::PERF_SAMPLE_STACK_USER) as u64;
    if layout.identifier {
        sample_type |= b::PERF_SAMPLE_IDENTIFIER as u64;
    }
    if layout.callchain {
        sample_type |= b::PERF_SAMPLE_CALLCHAIN as u64;
    }
    let mut attr = b::perf_event_attr {
        type_: b::PERF_TYPE_SOFTWARE,
        size: std::mem::size_of::<b::perf_event_attr>() as u32,
        config: match kind {
            Kind::Clock => b::PERF_COUNT_SW_CPU_CLOCK as u64,
            Kind::Switches => b::PERF_COUNT_SW_CONTEXT_SWITCHES as u64,
        },
        sample_type,
        sample_regs_user: REGS_MASK,
        sample_stack_user: config.stack_size,
        clockid: libc::CLOCK_MONOTONIC,
        ..Default::default()
    };
    // cpu-clock counts nanoseconds: a fixed period of 1e9/HZ samples at exactly HZ per
    // second of CPU time. (Frequency mode would start with a tiny period and adjust it,
    // a burst of samples at the start that skews short recordings.)
    attr.__bindgen_anon_1.sample_period = match kind {
        Kind::Clock => 1_000_000_000 / config.frequency_hz.max(1) as u64,
        Kind::Switches => 1,
    };
    let on_exec = config.enable_on_exec as u64;
    attr.set_disabled(1);
    attr.set_enable_on_exec(on_exec);
    attr.set_inherit(1);
    // The switch event fires inside schedule(): in kernel mode by definition.
    attr.set_exclude_kernel((!config.kernel && kind == Kind::Clock) as u64);
    // The kernel's frames only: glass unwinds the user stack from the copy, with the
    // CFI the kernel does not have.
    attr.set_exclude_callchain_user(1);
    attr.set_exclude_hv(1);
    // Side records (mappings, names, threads, switches) from the clock events only.
    let side = (kind == Kind::Clock) as u64;
    attr.set_mmap(side);
    attr.set_mmap2(side);
    attr.set_comm(side);
    attr.set_comm_exec(side);
    attr.set_task(side);
    attr.set_context_switch(side & config.off_cpu as u64);
    attr.set_sample_id_all(1);
    attr.set_use_clockid(1);
    // Wake glass at a watermark, not at every sample: each wake-up is paid for in the
    // target's context (measured: 3.1% slowdown at 999 Hz waking per sample).
    attr.set_watermark(1);
    attr.__bindgen_anon_2.wakeup_watermark = watermark as u32;
    attr
}

impl PerfSampler {
    /// Opens one event per CPU for each of `tids`, with rings sized from the rate and
    /// the stack size.
    pub fn open(
        tids: &[i32],
        frequency_hz: u32,
        stack_size: u32,
        enable_on_exec: bool,
    ) -> Result<Self, TargetError> {
        Self::open_with(
            tids,
            &PerfConfig::new(frequency_hz, stack_size, enable_on_exec),
        )
    }

    /// Opens the events of `config` on each of `tids` and every online CPU, disabled
    /// unless `enable_on_exec` (then the exec enables them); [`PerfSampler::enable`]
    /// starts them otherwise.
    pub fn open_with(tids: &[i32], config: &PerfConfig) -> Result<Self, TargetError> {
        let cpus = online_cpus();
        let page = page_size();
        let wanted = config
            .ring_bytes
            .unwrap_or_else(|| wanted_ring_bytes(config))
            .max(page)
            .next_power_of_two();
        // The size is mapped first (the locked-memory limits decide it), then the events
        // are opened with a watermark that fits it.
        let probe_watermark = watermark_for(config, wanted);
        let mut events = open_events(config, probe_watermark, tids, &cpus)?;
        let (rings, bytes, limited_by) = map_rings(&events, wanted, page)?;
        let watermark = watermark_for(config, bytes);
        // The watermark is a property of the event that owns the ring: reopening is the
        // only way to change it, so when the limits made the ring too small for the
        // watermark the events were opened with, they are opened again.
        let rings = if watermark != probe_watermark {
            drop(rings);
            events = open_events(config, watermark, tids, &cpus)?;
            map_rings(&events, bytes, page)?.0
        } else {
            rings
        };
        let mut ring_fds = Vec::new();
        let mut others = Vec::new();
        let mut switch_ids = Vec::new();
        for event in events {
            if event.kind == Kind::Switches {
                let mut id = 0u64;
                // SAFETY: an ioctl on our perf descriptor, writing the u64.
                unsafe { libc::ioctl(event.fd.as_raw_fd(), b::ID as _, &mut id) };
                switch_ids.push(id);
            }
            if event.leader {
                ring_fds.push(event.fd);
                continue;
            }
            let leader = ring_fds.last().expect("a CPU's leader comes first");
            // SAFETY: an ioctl on our perf descriptors; both are on the same CPU.
            if unsafe { libc::ioctl(event.fd.as_raw_fd(), b::SET_OUTPUT as _, leader.as_raw_fd()) }
                < 0
            {
                return Err(TargetError::Io(io::Error::other(format!(
                    "redirecting a perf event into its CPU's ring: {}",
                    io::Error::last_os_error()
                ))));
            }
            others.push(event.fd);
        }
        let ring_info = RingInfo {
            bytes,
            wanted,
            rings: rings.len(),
            watermark,
            limited_by,
        };
        Ok(PerfSampler {
            ring_fds,
            rings,
            others,
            stack_size: config.stack_size,
            ring_info,
            layout: Layout::of(config),
            switch_ids,
        })
    }

    /// Descriptors that become readable when records are waiting.
    pub fn fds(&self) -> Vec<i32> {
        self.ring_fds.iter().map(|fd| fd.as_raw_fd()).collect()
    }

    fn all_fds(&self) -> impl Iterator<Item = &OwnedFd> {
        self.ring_fds.iter().chain(&self.others)
    }

    /// Turns the events on (for `--pid`, where there is no exec to do it).
    pub fn enable(&self) {
        for fd in self.all_fds() {
            // SAFETY: an ioctl on our perf descriptor.
            unsafe { libc::ioctl(fd.as_raw_fd(), b::ENABLE as _, 0) };
        }
    }

    pub fn disable(&self) {
        for fd in self.all_fds() {
            // SAFETY: an ioctl on our perf descriptor.
            unsafe { libc::ioctl(fd.as_raw_fd(), b::DISABLE as _, 0) };
        }
    }

    /// Hands every waiting record, oldest first per ring, to `handle`.
    pub fn drain(&mut self, handle: &mut dyn FnMut(PerfRecord<'_>)) {
        let mut bytes = Vec::new();
        self.drain_raw(&mut bytes);
        records(&bytes, self.layout, handle);
    }

    /// Appends every waiting record (header included), oldest first per ring, to `out`
    /// and gives the space back to the kernel at once: two copies per ring, nothing
    /// parsed. [`records`] reads them back.
    pub fn drain_raw(&mut self, out: &mut Vec<u8>) -> usize {
        let page = page_size();
        let before = out.len();
        for ring in &self.rings {
            // SAFETY: the first page is the kernel's perf_event_mmap_page.
            let meta = ring.base as *mut b::perf_event_mmap_page;
            let head = unsafe { std::ptr::read_volatile(&(*meta).data_head) };
            std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
            let tail = unsafe { std::ptr::read_volatile(&(*meta).data_tail) };
            let available = head.saturating_sub(tail).min(ring.data_len as u64) as usize;
            if available > 0 {
                // SAFETY: the data area follows the first page.
                let data = unsafe { ring.base.add(page) };
                let at = out.len();
                out.resize(at + available, 0);
                copy_wrapped(
                    data,
                    ring.data_len,
                    (tail % ring.data_len as u64) as usize,
                    &mut out[at..],
                );
            }
            std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
            // SAFETY: handing the consumed space back to the kernel.
            unsafe { std::ptr::write_volatile(&mut (*meta).data_tail, tail + available as u64) };
        }
        out.len() - before
    }
}

struct Opened {
    fd: OwnedFd,
    kind: Kind,
    /// The first event of its CPU: its ring is mapped, the others write into it.
    leader: bool,
}

/// Every event of `config`, CPU by CPU, each CPU's leader first.
fn open_events(
    config: &PerfConfig,
    watermark: usize,
    tids: &[i32],
    cpus: &[i32],
) -> Result<Vec<Opened>, TargetError> {
    let mut kinds = vec![Kind::Clock];
    if config.off_cpu {
        kinds.push(Kind::Switches);
    }
    let mut events = Vec::new();
    for &cpu in cpus {
        let mut leader = true;
        for &kind in &kinds {
            for &tid in tids {
                events.push(Opened {
                    fd: open_event(config, watermark, kind, tid, cpu)?,
                    kind,
                    leader,
                });
                leader = false;
            }
        }
    }
    Ok(events)
}

/// Opens one event of `config` on `tid` and `cpu`.
fn open_event(
    config: &PerfConfig,
    watermark: usize,
    kind: Kind,
    tid: i32,
    cpu: i32,
) -> Result<OwnedFd, TargetError> {
    let mut attr = event_attributes(config, watermark, kind);
    // SAFETY: a valid attr for this call.
    let fd = unsafe { sys::perf_event_open(&mut attr, tid, cpu, -1, b::PERF_FLAG_FD_CLOEXEC as _) };
    if fd < 0 {
        let error = io::Error::last_os_error();
        return Err(match error.raw_os_error() {
            Some(libc::ESRCH) => TargetError::NoSuchProcess(tid),
            Some(code @ (libc::EPERM | libc::EACCES)) => TargetError::Attach(tid, code),
            _ => TargetError::Io(io::Error::other(format!("perf_event_open: {error}"))),
        });
    }
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The wake-up: a quarter ring, or [`WAKE_MS`] of samples if that is less.
fn watermark_for(config: &PerfConfig, ring_bytes: usize) -> usize {
    let per_wake =
        (config.frequency_hz as u64 * config.sample_bytes() as u64 * WAKE_MS / 1000) as usize;
    (ring_bytes / 4)
        .min(per_wake.max(config.sample_bytes()))
        .max(8)
}

/// Maps one ring per CPU (the first of each CPU's `per_cpu` events) of `wanted` data
/// bytes, or the largest power of two below it that the locked-memory limits allow: an
/// unprivileged user may lock `perf_event_mlock_kb` per CPU plus RLIMIT_MEMLOCK for all
/// rings together (root, with CAP_IPC_LOCK, is not limited).
fn map_rings(
    events: &[Opened],
    wanted: usize,
    page: usize,
) -> Result<(Vec<Ring>, usize, Option<String>), TargetError> {
    let mut bytes = wanted;
    loop {
        let mut rings = Vec::new();
        let mut failure = None;
        for fd in events.iter().filter(|e| e.leader).map(|e| &e.fd) {
            let mapped_len = page + bytes;
            // SAFETY: mapping the event's ring as documented in perf_event_open(2).
            let base = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    mapped_len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    fd.as_raw_fd(),
                    0,
                )
            };
            if base == libc::MAP_FAILED {
                failure = Some(io::Error::last_os_error());
                break;
            }
            rings.push(Ring {
                base: base.cast(),
                mapped_len,
                data_len: bytes,
            });
        }
        let Some(error) = failure else {
            let limited_by = (bytes < wanted).then(|| {
                let mlock_kb = std::fs::read_to_string("/proc/sys/kernel/perf_event_mlock_kb")
                    .map(|t| t.trim().to_string())
                    .unwrap_or_else(|_| "?".into());
                let mut limit = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                // SAFETY: writes the rlimit.
                unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) };
                format!(
                    "perf_event_mlock_kb {mlock_kb} per CPU, RLIMIT_MEMLOCK {} KiB",
                    limit.rlim_cur / 1024
                )
            });
            return Ok((rings, bytes, limited_by));
        };
        drop(rings);
        let limited = matches!(error.raw_os_error(), Some(libc::EPERM | libc::ENOMEM));
        if !limited || bytes <= page {
            return Err(TargetError::Io(io::Error::other(format!(
                "mapping the perf ring ({} KiB): {error}",
                bytes / 1024
            ))));
        }
        bytes /= 2;
    }
}

/// The kernel frames of a sample's callchain, innermost first (the context markers the
/// kernel puts between kinds of frames left out).
// The bindings' integer type for the markers differs between architectures.
#[allow(clippy::unnecessary_cast)]
pub fn kernel_frames(callchain: &[u8]) -> impl Iterator<Item = u64> + '_ {
    callchain
        .chunks_exact(8)
        .map(|w| u64::from_ne_bytes(w.try_into().unwrap()))
        .filter(|&ip| ip < b::PERF_CONTEXT_MAX as u64)
}

/// Reads back what [`PerfSampler::drain_raw`] copied: whole records, ring after ring,
/// handed over in time order. Each ring is in order, but a process's records spread over
/// the rings of the CPUs it ran on: an exec on one CPU and the loader's mappings on
/// another would otherwise arrive mapping first, and the exec would forget them. Records
/// of later drains are all later than these (each ring is read after the one before it,
/// so what a later pass finds was written after this pass read its ring), as perf's
/// rounds assume too.
pub fn records(bytes: &[u8], layout: Layout, handle: &mut dyn FnMut(PerfRecord<'_>)) {
    let mut order: Vec<(u64, usize, usize)> = Vec::new();
    let mut at = 0;
    while let Some(header) = bytes.get(at..at + 8) {
        let kind = u32::from_ne_bytes(header[0..4].try_into().unwrap());
        let size = u16::from_ne_bytes(header[6..8].try_into().unwrap()) as usize;
        let Some(record) = bytes.get(at..at + size).filter(|_| size >= 8) else {
            break;
        };
        order.push((record_time(kind, &record[8..], layout), at, size));
        at += size;
    }
    // Stable: records of one time keep their ring's order.
    order.sort_by_key(|&(time, _, _)| time);
    for (_, at, size) in order {
        let record = &bytes[at..at + size];
        let kind = u32::from_ne_bytes(record[0..4].try_into().unwrap());
        let misc = u16::from_ne_bytes(record[4..6].try_into().unwrap());
        if let Some(record) = parse(kind, misc, &record[8..], layout) {
            handle(record);
        }
    }
}

/// A record's time: a sample's own field, the `sample_id_all` trailer's otherwise.
fn record_time(kind: u32, body: &[u8], layout: Layout) -> u64 {
    let at = if kind == b::PERF_RECORD_SAMPLE {
        // After the identifier (if any) and the pid/tid pair.
        Some(if layout.identifier { 16 } else { 8 })
    } else {
        body.len()
            .checked_sub(if layout.identifier { 16 } else { 8 })
    };
    at.and_then(|at| body.get(at..at + 8))
        .map_or(0, |b| u64::from_ne_bytes(b.try_into().unwrap()))
}

fn copy_wrapped(data: *const u8, len: usize, at: usize, out: &mut [u8]) {
    let first = out.len().min(len - at);
    // SAFETY: both pieces lie inside the ring's data area.
    unsafe {
        std::ptr::copy_nonoverlapping(data.add(at), out.as_mut_ptr(), first);
        std::ptr::copy_nonoverlapping(data, out.as_mut_ptr().add(first), out.len() - first);
    }
}

struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn u32(&mut self) -> Option<u32> {
        let v = u32::from_ne_bytes(self.bytes.get(self.at..self.at + 4)?.try_into().ok()?);
        self.at += 4;
        Some(v)
    }
    fn u64(&mut self) -> Option<u64> {
        let v = u64::from_ne_bytes(self.bytes.get(self.at..self.at + 8)?.try_into().ok()?);
        self.at += 8;
        Some(v)
    }
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let v = self.bytes.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(v)
    }
    /// A NUL-terminated string padded to 8 bytes, up to the end of the fixed part.
    fn c_str(&mut self) -> Option<&'a str> {
        let rest = self.bytes.get(self.at..)?;
        let end = rest.iter().position(|&c| c == 0)?;
        let text = std::str::from_utf8(&rest[..end]).ok()?;
        self.at += (end + 1).next_multiple_of(8);
        Some(text)
    }
}

fn parse(kind: u32, misc: u16, body: &[u8], layout: Layout) -> Option<PerfRecord<'_>> {
    let mut c = Cursor { bytes: body, at: 0 };
    // With sample_id_all, every other record ends with the sample's TID and TIME.
    // With PERF_SAMPLE_IDENTIFIER the trailer ends with the id, after the time.
    let trailer = if layout.identifier { 24 } else { 16 };
    let (trailer_pid, trailer_tid) = body
        .len()
        .checked_sub(trailer)
        .and_then(|at| body.get(at..at + 8))
        .map(|b| {
            (
                u32::from_ne_bytes(b[0..4].try_into().unwrap()),
                u32::from_ne_bytes(b[4..8].try_into().unwrap()),
            )
        })
        .unwrap_or((0, 0));
    let time_ns = body
        .len()
        .checked_sub(trailer - 8)
        .and_then(|at| body.get(at..at + 8))
        .and_then(|b| b.try_into().ok())
        .map(u64::from_ne_bytes)
        .unwrap_or(0);
    match kind {
        b::PERF_RECORD_SAMPLE => {
            let id = if layout.identifier { c.u64()? } else { 0 };
            let pid = c.u32()?;
            let tid = c.u32()?;
            let time_ns = c.u64()?;
            let callchain = if layout.callchain {
                let count = c.u64()? as usize;
                c.take(count.checked_mul(8)?)?
            } else {
                &[]
            };
            let abi = c.u64()?;
            let (fp, sp, ip) = if abi != 0 {
                let (r0, r1, r2) = (c.u64()?, c.u64()?, c.u64()?);
                // Ascending register numbers: BP, SP, IP on x86-64 (x29, sp, pc on arm64).
                (r0, r1, r2)
            } else {
                (0, 0, 0)
            };
            let size = c.u64()? as usize;
            let stack = c.take(size)?;
            let dyn_size = if size > 0 { c.u64()? as usize } else { 0 };
            Some(PerfRecord::Sample {
                id,
                pid,
                tid,
                time_ns,
                callchain,
                ip,
                sp,
                fp,
                stack: &stack[..dyn_size.min(size)],
            })
        }
        b::PERF_RECORD_MMAP2 => {
            let pid = c.u32()?;
            let _tid = c.u32()?;
            let start = c.u64()?;
            let len = c.u64()?;
            let file_offset = c.u64()?;
            // maj, min, ino, ino_generation (or build id): 24 bytes.
            c.take(24)?;
            let prot = c.u32()?;
            let _flags = c.u32()?;
            let path = c.c_str()?;
            Some(PerfRecord::Mmap {
                time_ns,
                pid,
                start,
                len,
                file_offset,
                executable: prot & libc::PROT_EXEC as u32 != 0,
                path,
            })
        }
        b::PERF_RECORD_COMM => {
            let pid = c.u32()?;
            let tid = c.u32()?;
            let name = c.c_str()?;
            Some(PerfRecord::Comm {
                time_ns,
                pid,
                tid,
                exec: misc & b::PERF_RECORD_MISC_COMM_EXEC as u16 != 0,
                name,
            })
        }
        b::PERF_RECORD_FORK => Some(PerfRecord::Fork {
            time_ns,
            pid: c.u32()?,
            parent_pid: c.u32()?,
            tid: c.u32()?,
        }),
        b::PERF_RECORD_SWITCH => Some(PerfRecord::Switch {
            time_ns,
            pid: trailer_pid,
            tid: trailer_tid,
            out: misc & b::PERF_RECORD_MISC_SWITCH_OUT as u16 != 0,
            preempted: misc & b::PERF_RECORD_MISC_SWITCH_OUT_PREEMPT as u16 != 0,
        }),
        b::PERF_RECORD_EXIT => {
            let pid = c.u32()?;
            let _ppid = c.u32()?;
            let tid = c.u32()?;
            Some(PerfRecord::Exit { time_ns, pid, tid })
        }
        b::PERF_RECORD_LOST => {
            let _id = c.u64()?;
            Some(PerfRecord::Lost {
                time_ns,
                pid: trailer_pid,
                tid: trailer_tid,
                count: c.u64()?,
            })
        }
        // Samples the kernel took but could not write (hardware buffers, filters).
        b::PERF_RECORD_LOST_SAMPLES => Some(PerfRecord::Lost {
            time_ns,
            pid: trailer_pid,
            tid: trailer_tid,
            count: c.u64()?,
        }),
        _ => None,
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

fn online_cpus() -> Vec<i32> {
    // "0-3,5" style list.
    let text =
        std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_else(|_| "0".into());
    let mut cpus = Vec::new();
    for part in text.trim().split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<i32>(), b.parse::<i32>()) {
                    cpus.extend(a..=b);
                }
            }
            None => cpus.extend(part.parse::<i32>().ok()),
        }
    }
    if cpus.is_empty() {
        cpus.push(0);
    }
    cpus
}

/// Why kernel frames cannot be named here, if they cannot: `/proc/kallsyms` shows zeros
/// instead of addresses to those `kptr_restrict` hides them from.
pub fn kallsyms_hidden() -> Option<String> {
    let text = std::fs::read_to_string("/proc/kallsyms").ok();
    let first = text
        .as_deref()
        .and_then(|t| t.lines().next())
        .and_then(|l| l.split_whitespace().next())
        .and_then(|a| u64::from_str_radix(a, 16).ok());
    match first {
        Some(address) if address != 0 => None,
        _ => {
            let restrict = std::fs::read_to_string("/proc/sys/kernel/kptr_restrict")
                .map(|t| t.trim().to_string())
                .unwrap_or_else(|_| "?".into());
            Some(format!(
                "/proc/kallsyms hides kernel addresses from this user (kptr_restrict {restrict})"
            ))
        }
    }
}

/// The kernel functions `addresses` fall in, named from `/proc/kallsyms` (text symbols
/// of the kernel and its modules; each runs to the next symbol). Read once, when the
/// recording ends: only the symbols hit are kept, a few KiB where the whole table is
/// megabytes.
pub fn kernel_symbols(addresses: &[u64]) -> glass_format::KernelSymbols {
    let Ok(text) = std::fs::read_to_string("/proc/kallsyms") else {
        return Default::default();
    };
    let table = kallsyms_text_symbols(&text);
    let mut hit: Vec<usize> = addresses
        .iter()
        .filter_map(|&address| table.partition_point(|s| s.0 <= address).checked_sub(1))
        .collect();
    hit.sort_unstable();
    hit.dedup();
    let symbols = hit
        .into_iter()
        .map(|index| kernel_symbol(&table, index))
        .collect();
    glass_format::KernelSymbols { symbols }
}

/// Every text symbol of `/proc/kallsyms`, for a live view that names kernel frames as
/// they come (empty where it cannot be read).
pub fn all_kernel_symbols() -> glass_format::KernelSymbols {
    let Ok(text) = std::fs::read_to_string("/proc/kallsyms") else {
        return Default::default();
    };
    let table = kallsyms_text_symbols(&text);
    let mut symbols: Vec<glass_format::KernelSymbol> = (0..table.len())
        .map(|index| kernel_symbol(&table, index))
        .collect();
    // Aliases share a start; the first name stays.
    symbols.dedup_by_key(|s| s.start);
    glass_format::KernelSymbols { symbols }
}

/// kallsyms' text symbols as (address, name, module), sorted by address.
fn kallsyms_text_symbols(text: &str) -> Vec<(u64, &str, &str)> {
    let mut table: Vec<(u64, &str, &str)> = text
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let address = u64::from_str_radix(words.next()?, 16).ok()?;
            let kind = words.next()?;
            let name = words.next()?;
            let module = words
                .next()
                .map_or("", |m| m.trim_start_matches('[').trim_end_matches(']'));
            matches!(kind, "t" | "T" | "w" | "W").then_some((address, name, module))
        })
        .filter(|(address, _, _)| *address != 0)
        .collect();
    table.sort_by_key(|(address, _, _)| *address);
    table
}

fn kernel_symbol(table: &[(u64, &str, &str)], index: usize) -> glass_format::KernelSymbol {
    let (start, name, module) = table[index];
    // The next symbol at a higher address ends this one (aliases share starts).
    let end = table[index..]
        .iter()
        .map(|s| s.0)
        .find(|&a| a > start)
        .unwrap_or(start + 4096);
    glass_format::KernelSymbol {
        start,
        len: end - start,
        name: name.to_string(),
        module: module.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rings_hold_half_a_second_of_samples_and_wake_before_a_quarter() {
        for (hz, stack) in [
            (99, 16384),
            (499, 16384),
            (999, 16384),
            (999, 65528),
            (4999, 8192),
        ] {
            for (kernel, off_cpu) in [(false, false), (true, false), (true, true)] {
                let config = PerfConfig {
                    kernel,
                    off_cpu,
                    ..PerfConfig::new(hz, stack, false)
                };
                let ring = wanted_ring_bytes(&config);
                assert!(ring.is_power_of_two());
                let rate = hz as usize * if off_cpu { 2 } else { 1 };
                let per_second = rate * config.sample_bytes();
                if ring < RING_MAX_BYTES {
                    assert!(ring * 2 >= per_second, "{hz} Hz: {ring} bytes");
                }
                let watermark = watermark_for(&config, ring);
                assert!(watermark <= ring / 4 && watermark >= config.sample_bytes().min(ring / 4));
                // The wake-up comes at most a tenth of a second of samples in.
                assert!(
                    watermark <= (hz as usize * config.sample_bytes()) / 10 + config.sample_bytes()
                );
            }
        }
    }

    /// A record as the kernel lays it out: header, body, `sample_id_all` trailer.
    fn record(kind: u32, body: &[u8], pid: u32, time: u64) -> Vec<u8> {
        let mut bytes = Vec::new();
        let size = 8 + body.len() + 16;
        bytes.extend(kind.to_ne_bytes());
        bytes.extend(0u16.to_ne_bytes());
        bytes.extend((size as u16).to_ne_bytes());
        bytes.extend(body);
        bytes.extend(pid.to_ne_bytes());
        bytes.extend(pid.to_ne_bytes());
        bytes.extend(time.to_ne_bytes());
        bytes
    }

    #[test]
    fn records_of_the_rings_come_out_in_time_order() {
        // Ring 0 holds a later exit, ring 1 an earlier fork: the fork comes first.
        let exit = record(
            b::PERF_RECORD_EXIT,
            &[
                7, 0, 0, 0, 1, 0, 0, 0, 7, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
            ],
            7,
            200,
        );
        let fork = record(
            b::PERF_RECORD_FORK,
            &[
                7, 0, 0, 0, 1, 0, 0, 0, 7, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
            ],
            7,
            100,
        );
        let bytes = [exit, fork].concat();
        let mut times = Vec::new();
        records(&bytes, Layout::default(), &mut |record| match record {
            PerfRecord::Fork { time_ns, .. } | PerfRecord::Exit { time_ns, .. } => {
                times.push(time_ns)
            }
            _ => panic!("{record:?}"),
        });
        assert_eq!(times, [100, 200]);
    }

    #[test]
    // The bindings' integer type for the markers differs between architectures.
    #[allow(clippy::unnecessary_cast)]
    fn callchains_lose_their_context_markers() {
        let words: Vec<u8> = [
            b::PERF_CONTEXT_KERNEL as u64,
            0xffff_ffff_8100_1234,
            0xffff_ffff_8100_5678,
        ]
        .iter()
        .flat_map(|w| w.to_ne_bytes())
        .collect();
        let frames: Vec<u64> = kernel_frames(&words).collect();
        assert_eq!(frames, [0xffff_ffff_8100_1234, 0xffff_ffff_8100_5678]);
    }
}
