//! The perf_event backend: the kernel samples the target on a cpu-clock timer and copies
//! the user registers and the top of the user stack into a ring buffer at the interrupt.
//! The target is never stopped by glass: the only cost it pays is the copy, made by the
//! kernel on the target's own core.
//!
//! One event per CPU with `inherit`, attached to the target's threads (every existing
//! thread for `--pid`; the launched process before exec otherwise), so threads and
//! children created later are sampled too. `PERF_RECORD_MMAP2`, `COMM`, `FORK` and
//! `EXIT` records keep the module map and the thread names current.

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

/// Ring buffer data pages per event (a power of two).
const RING_PAGES: usize = 256;

/// One record read from a ring. Slices borrow the sampler's scratch buffer.
#[derive(Debug)]
pub enum PerfRecord<'a> {
    Sample {
        pid: u32,
        tid: u32,
        time_ns: u64,
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
    Lost {
        count: u64,
    },
}

struct Ring {
    fd: OwnedFd,
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

/// The kernel's sampling of one target.
pub struct PerfSampler {
    rings: Vec<Ring>,
    scratch: Vec<u8>,
    pub stack_size: u32,
}

/// Whether perf_event_open with user stack capture is allowed here.
pub fn available() -> bool {
    let mut attr = attributes(99, 512, false);
    // SAFETY: a valid attr; the fd is closed at once.
    let fd = unsafe { sys::perf_event_open(&mut attr, 0, -1, -1, b::PERF_FLAG_FD_CLOEXEC as _) };
    if fd >= 0 {
        unsafe { libc::close(fd) };
        true
    } else {
        false
    }
}

fn attributes(frequency_hz: u32, stack_size: u32, enable_on_exec: bool) -> b::perf_event_attr {
    let mut attr = b::perf_event_attr {
        type_: b::PERF_TYPE_SOFTWARE,
        size: std::mem::size_of::<b::perf_event_attr>() as u32,
        config: b::PERF_COUNT_SW_CPU_CLOCK as u64,
        sample_type: (b::PERF_SAMPLE_TID
            | b::PERF_SAMPLE_TIME
            | b::PERF_SAMPLE_REGS_USER
            | b::PERF_SAMPLE_STACK_USER) as u64,
        sample_regs_user: REGS_MASK,
        sample_stack_user: stack_size,
        clockid: libc::CLOCK_MONOTONIC,
        ..Default::default()
    };
    // cpu-clock counts nanoseconds: a fixed period of 1e9/HZ samples at exactly HZ per
    // second of CPU time. (Frequency mode would start with a tiny period and adjust it,
    // a burst of samples at the start that skews short recordings.)
    attr.__bindgen_anon_1.sample_period = 1_000_000_000 / frequency_hz.max(1) as u64;
    attr.set_disabled(if enable_on_exec { 1 } else { 0 });
    attr.set_enable_on_exec(if enable_on_exec { 1 } else { 0 });
    attr.set_inherit(1);
    attr.set_exclude_kernel(1);
    attr.set_exclude_hv(1);
    attr.set_mmap(1);
    attr.set_mmap2(1);
    attr.set_comm(1);
    attr.set_comm_exec(1);
    attr.set_task(1);
    attr.set_sample_id_all(1);
    attr.set_use_clockid(1);
    // Wake glass when a quarter of the ring is full, not at every sample: each wake-up
    // is paid for in the target's context (measured: 3.1% slowdown at 999 Hz waking per
    // sample). glass also polls with a timeout, so nothing waits long.
    attr.set_watermark(1);
    attr.__bindgen_anon_2.wakeup_watermark = (RING_PAGES * 4096 / 4) as u32;
    attr
}

impl PerfSampler {
    /// Opens one event per CPU for each of `tids`. With `enable_on_exec`, counting
    /// starts when the (paused) launched process execs.
    pub fn open(
        tids: &[i32],
        frequency_hz: u32,
        stack_size: u32,
        enable_on_exec: bool,
    ) -> Result<Self, TargetError> {
        let cpus = online_cpus();
        let page = page_size();
        let mut rings = Vec::new();
        for &tid in tids {
            for &cpu in &cpus {
                let mut attr = attributes(frequency_hz, stack_size, enable_on_exec);
                // SAFETY: a valid attr for this call.
                let fd = unsafe {
                    sys::perf_event_open(&mut attr, tid, cpu, -1, b::PERF_FLAG_FD_CLOEXEC as _)
                };
                if fd < 0 {
                    let error = io::Error::last_os_error();
                    return Err(match error.raw_os_error() {
                        Some(libc::ESRCH) => TargetError::NoSuchProcess(tid),
                        Some(code @ (libc::EPERM | libc::EACCES)) => TargetError::Attach(tid, code),
                        _ => TargetError::Io(io::Error::other(format!("perf_event_open: {error}"))),
                    });
                }
                // SAFETY: a fresh descriptor we own.
                let fd = unsafe { OwnedFd::from_raw_fd(fd) };
                let mapped_len = page * (RING_PAGES + 1);
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
                    return Err(TargetError::Io(io::Error::other(format!(
                        "mapping the perf ring: {}",
                        io::Error::last_os_error()
                    ))));
                }
                rings.push(Ring {
                    fd,
                    base: base.cast(),
                    mapped_len,
                    data_len: page * RING_PAGES,
                });
            }
        }
        Ok(PerfSampler {
            rings,
            scratch: Vec::with_capacity(stack_size as usize + 4096),
            stack_size,
        })
    }

    /// Descriptors that become readable when records are waiting.
    pub fn fds(&self) -> Vec<i32> {
        self.rings.iter().map(|r| r.fd.as_raw_fd()).collect()
    }

    /// Turns the events on (for `--pid`, where there is no exec to do it).
    pub fn enable(&self) {
        for ring in &self.rings {
            // SAFETY: an ioctl on our perf descriptor.
            unsafe { libc::ioctl(ring.fd.as_raw_fd(), sys::bindings::ENABLE as _, 0) };
        }
    }

    pub fn disable(&self) {
        for ring in &self.rings {
            // SAFETY: an ioctl on our perf descriptor.
            unsafe { libc::ioctl(ring.fd.as_raw_fd(), sys::bindings::DISABLE as _, 0) };
        }
    }

    /// Hands every waiting record, oldest first per ring, to `handle`.
    pub fn drain(&mut self, handle: &mut dyn FnMut(PerfRecord<'_>)) {
        for index in 0..self.rings.len() {
            self.drain_ring(index, handle);
        }
    }

    fn drain_ring(&mut self, index: usize, handle: &mut dyn FnMut(PerfRecord<'_>)) {
        let ring = &self.rings[index];
        let page = page_size();
        // SAFETY: the first page is the kernel's perf_event_mmap_page.
        let meta = ring.base as *mut b::perf_event_mmap_page;
        let head = unsafe { std::ptr::read_volatile(&(*meta).data_head) };
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        let mut tail = unsafe { std::ptr::read_volatile(&(*meta).data_tail) };
        let data = unsafe { ring.base.add(page) };
        let data_len = ring.data_len as u64;
        while tail < head {
            // Copy the record out (it may wrap around the end of the ring).
            let header_at = (tail % data_len) as usize;
            let mut header = [0u8; 8];
            copy_wrapped(data, ring.data_len, header_at, &mut header);
            let kind = u32::from_ne_bytes(header[0..4].try_into().unwrap());
            let misc = u16::from_ne_bytes(header[4..6].try_into().unwrap());
            let size = u16::from_ne_bytes(header[6..8].try_into().unwrap()) as usize;
            if size < 8 {
                break;
            }
            self.scratch.resize(size, 0);
            copy_wrapped(data, ring.data_len, header_at, &mut self.scratch[..size]);
            if let Some(record) = parse(kind, misc, &self.scratch[8..size]) {
                handle(record);
            }
            tail += size as u64;
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        // SAFETY: handing the consumed space back to the kernel.
        unsafe { std::ptr::write_volatile(&mut (*meta).data_tail, tail) };
    }
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

fn parse(kind: u32, misc: u16, body: &[u8]) -> Option<PerfRecord<'_>> {
    let mut c = Cursor { bytes: body, at: 0 };
    // With sample_id_all, every other record ends with the sample's TID and TIME.
    let time_ns = body
        .len()
        .checked_sub(8)
        .and_then(|at| body.get(at..))
        .and_then(|b| b.try_into().ok())
        .map(u64::from_ne_bytes)
        .unwrap_or(0);
    match kind {
        b::PERF_RECORD_SAMPLE => {
            let pid = c.u32()?;
            let tid = c.u32()?;
            let time_ns = c.u64()?;
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
                pid,
                tid,
                time_ns,
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
        b::PERF_RECORD_EXIT => {
            let pid = c.u32()?;
            let _ppid = c.u32()?;
            let tid = c.u32()?;
            Some(PerfRecord::Exit { time_ns, pid, tid })
        }
        b::PERF_RECORD_LOST => {
            let _id = c.u64()?;
            Some(PerfRecord::Lost { count: c.u64()? })
        }
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
