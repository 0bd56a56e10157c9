//! Hardware counters for `glass trace --pmc cycles,instructions,...`.
//!
//! A traced thread opens one perf event per counter on itself (`pid` 0, `cpu` -1,
//! user space only), maps the event's first page (`struct perf_event_mmap_page`) and
//! reads the counter with the `rdpmc` instruction: no system call, a few dozen cycles,
//! cheap enough to run on every probe hit. The `read()` system call stays as the slow
//! path for when the event is not on the PMU at that moment.
//!
//! # Why the read protocol is written here
//!
//! `perf-event-open-sys` (used here for the system call, `perf_event_attr` and the
//! page's layout) is raw bindings only, and the `perf-event` crate built on it reads
//! counts with `read()`: neither exposes the user-space `rdpmc` read of the mapped
//! page. That read is short and is documented in `linux/perf_event.h`, so it is
//! written out in [`read_page`], over a raw page pointer and with an injectable
//! `rdpmc` so tests can drive it with a synthetic page. The byte offsets of the fields
//! it reads are checked at compile time against the `perf-event-open-sys` bindings of
//! that header (see [`page`]).
//!
//! # The seqlock
//!
//! The kernel rewrites the page (`index`: which hardware counter holds the event, or 0
//! when none does; `offset`: what to add to that counter's raw value) whenever the
//! event is scheduled in or out, which for a self-monitoring thread happens between two
//! of its instructions (on a context switch or an interrupt). Each rewrite increments
//! `lock`. The reader therefore reads `lock`, then the fields and the counter, then
//! `lock` again, and starts over if it changed: the values it keeps were all read
//! while the event sat on the same counter, so `offset + rdpmc(index - 1)` is
//! consistent. `rdpmc` returns `pmc_width` bits, sign-extended before the addition
//! (the kernel starts counters at negative values to count towards an overflow).
//!
//! Only the thread that opened an event may read it this way: `rdpmc` reads the
//! counter of the CPU the caller runs on, which holds the event only when the caller is
//! the counted thread. [`ThreadCounter`] is therefore neither `Send` nor `Sync`.
//!
//! Multiplexing (more events than counters, `time_running < time_enabled`) is not
//! scaled for: the values are raw counts over the time the event was counting.

use std::fs::File;
use std::io::{self, Read};
use std::marker::PhantomData;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::{compiler_fence, Ordering};

use memmap2::{MmapOptions, MmapRaw};
use perf_event_open_sys::bindings;

/// Byte offsets of the fields of `struct perf_event_mmap_page` that the read uses
/// (from `/usr/include/linux/perf_event.h`: `version` and `compat_version` come first,
/// so `lock` is at 8, not 0).
pub mod page {
    pub const VERSION: usize = 0;
    pub const LOCK: usize = 8;
    pub const INDEX: usize = 12;
    pub const OFFSET: usize = 16;
    pub const TIME_ENABLED: usize = 24;
    pub const TIME_RUNNING: usize = 32;
    pub const CAPABILITIES: usize = 40;
    pub const PMC_WIDTH: usize = 48;
    /// The kernel writes the size of the header up to `__reserved` here.
    pub const SIZE: usize = 72;
    /// `capabilities` bit: deprecated bit 0 is zero (always set by current kernels).
    pub const CAP_BIT0_IS_DEPRECATED: u64 = 1 << 1;
    /// `capabilities` bit: `rdpmc` may be used to read the counter.
    pub const CAP_USER_RDPMC: u64 = 1 << 2;
    /// Bytes mapped: the first page only (no sample ring).
    pub const MAP_LEN: usize = 4096;
}

// The offsets above, checked against the bindings generated from the kernel header.
const _: () = {
    use core::mem::offset_of;
    use perf_event_open_sys::bindings::perf_event_mmap_page as P;
    assert!(offset_of!(P, version) == page::VERSION);
    assert!(offset_of!(P, lock) == page::LOCK);
    assert!(offset_of!(P, index) == page::INDEX);
    assert!(offset_of!(P, offset) == page::OFFSET);
    assert!(offset_of!(P, time_enabled) == page::TIME_ENABLED);
    assert!(offset_of!(P, time_running) == page::TIME_RUNNING);
    assert!(offset_of!(P, __bindgen_anon_1) == page::CAPABILITIES);
    assert!(offset_of!(P, pmc_width) == page::PMC_WIDTH);
    assert!(offset_of!(P, size) == page::SIZE);
    assert!(core::mem::size_of::<P>() <= page::MAP_LEN);
};

/// A hardware counter `glass trace --pmc` can record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Counter {
    Cycles,
    Instructions,
    BranchInstructions,
    BranchMisses,
    CacheReferences,
    CacheMisses,
}

impl Counter {
    /// Every counter, in the order the names are listed to users.
    pub const ALL: [Counter; 6] = [
        Counter::Cycles,
        Counter::Instructions,
        Counter::BranchInstructions,
        Counter::BranchMisses,
        Counter::CacheReferences,
        Counter::CacheMisses,
    ];

    /// The name used on the command line and in trace files (as `perf` names them).
    pub fn name(self) -> &'static str {
        match self {
            Counter::Cycles => "cycles",
            Counter::Instructions => "instructions",
            Counter::BranchInstructions => "branches",
            Counter::BranchMisses => "branch-misses",
            Counter::CacheReferences => "cache-references",
            Counter::CacheMisses => "cache-misses",
        }
    }

    pub fn from_name(name: &str) -> Option<Counter> {
        Counter::ALL.into_iter().find(|c| c.name() == name)
    }

    /// `perf_event_attr.type` and `.config` of the counter.
    pub fn perf_type_config(self) -> (u32, u64) {
        let config = match self {
            Counter::Cycles => bindings::PERF_COUNT_HW_CPU_CYCLES,
            Counter::Instructions => bindings::PERF_COUNT_HW_INSTRUCTIONS,
            Counter::BranchInstructions => bindings::PERF_COUNT_HW_BRANCH_INSTRUCTIONS,
            Counter::BranchMisses => bindings::PERF_COUNT_HW_BRANCH_MISSES,
            Counter::CacheReferences => bindings::PERF_COUNT_HW_CACHE_REFERENCES,
            Counter::CacheMisses => bindings::PERF_COUNT_HW_CACHE_MISSES,
        };
        (bindings::PERF_TYPE_HARDWARE, config as u64)
    }
}

impl std::fmt::Display for Counter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

fn known_names() -> String {
    Counter::ALL.map(Counter::name).join(", ")
}

/// Parses a comma-separated list of counter names (`"cycles,instructions"`).
pub fn parse_list(s: &str) -> Result<Vec<Counter>, String> {
    let mut counters = Vec::new();
    for name in s.split(',').map(str::trim) {
        if name.is_empty() {
            return Err(format!(
                "empty counter name in \"{s}\" (known counters: {})",
                known_names()
            ));
        }
        let counter = Counter::from_name(name).ok_or_else(|| {
            format!(
                "unknown counter \"{name}\" (known counters: {})",
                known_names()
            )
        })?;
        if counters.contains(&counter) {
            return Err(format!("counter \"{name}\" is listed twice"));
        }
        counters.push(counter);
    }
    Ok(counters)
}

/// Reads hardware performance counter `index` (`ecx`) of the CPU the caller runs on.
///
/// # Safety
///
/// Faults (SIGSEGV) unless the kernel allows user-space `rdpmc` for this process (the
/// mapped page of an open event says so in `cap_user_rdpmc`) and `index` names a
/// counter the CPU has. The value only means something for the event the page names,
/// read through the protocol of [`read_page`]. x86-64 only (the probe that calls it is
/// x86-64 code; an aarch64 glass, for Xen on ARM64's dom0, has no probe).
#[cfg(target_arch = "x86_64")]
#[inline]
pub unsafe fn rdpmc(index: u32) -> u64 {
    let lo: u32;
    let hi: u32;
    // No `nomem`: the instruction must stay between the two reads of `lock`.
    core::arch::asm!(
        "rdpmc",
        in("ecx") index,
        out("eax") lo,
        out("edx") hi,
        options(nostack, preserves_flags),
    );
    ((hi as u64) << 32) | lo as u64
}

/// Reads an event's count from its mapped `perf_event_mmap_page` with the seqlock
/// protocol of `linux/perf_event.h`, calling `rdpmc` for the hardware counter.
///
/// Returns `None` when the page does not allow it: `cap_user_rdpmc` is 0, or `index`
/// is 0 (a software event, or a hardware event not on a counter right now; the
/// `read()` system call then gives the count).
///
/// # Safety
///
/// `page` must point to at least [`page::MAP_LEN`] readable bytes, 8-byte aligned,
/// laid out as `struct perf_event_mmap_page`; the kernel (or a test) may change them
/// concurrently only in the seqlock's way. With the real [`rdpmc`], the caller must be
/// the thread the event counts.
pub unsafe fn read_page(page: *const u8, rdpmc: impl Fn(u32) -> u64) -> Option<u64> {
    debug_assert_eq!(page as usize % 8, 0, "perf_event_mmap_page must be aligned");
    let field = |at: usize| page.add(at);
    loop {
        let seq = field(page::LOCK).cast::<u32>().read_volatile();
        compiler_fence(Ordering::SeqCst);
        let index = field(page::INDEX).cast::<u32>().read_volatile();
        let offset = field(page::OFFSET).cast::<i64>().read_volatile();
        let capabilities = field(page::CAPABILITIES).cast::<u64>().read_volatile();
        if capabilities & page::CAP_USER_RDPMC == 0 || index == 0 {
            return None;
        }
        let width = u32::from(field(page::PMC_WIDTH).cast::<u16>().read_volatile());
        let raw = rdpmc(index - 1);
        let pmc = if width == 0 || width >= 64 {
            raw as i64
        } else {
            ((raw << (64 - width)) as i64) >> (64 - width)
        };
        let count = offset.wrapping_add(pmc);
        compiler_fence(Ordering::SeqCst);
        if field(page::LOCK).cast::<u32>().read_volatile() == seq {
            return Some(count as u64);
        }
    }
}

/// `perf_event_open` of an event counting the calling thread in user space, on any CPU,
/// enabled from the start.
fn open_event(kind: u32, config: u64) -> io::Result<File> {
    let mut attr = bindings::perf_event_attr {
        type_: kind,
        size: core::mem::size_of::<bindings::perf_event_attr>() as u32,
        config,
        ..Default::default()
    };
    attr.set_exclude_kernel(1);
    attr.set_exclude_hv(1);
    // SAFETY: attr is a valid perf_event_attr whose `size` is its own size.
    let fd = unsafe {
        perf_event_open_sys::perf_event_open(
            &mut attr,
            0,
            -1,
            -1,
            bindings::PERF_FLAG_FD_CLOEXEC as libc::c_ulong,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by perf_event_open and nothing else owns it.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// Opens an event counting the calling thread and maps its page, for good: the probe
/// runtime reads the page with rdpmc for the rest of the thread's life (the descriptor
/// and the mapping are never released; one per counter per traced thread).
pub fn open_page(kind: u32, config: u64) -> Option<*const u8> {
    use std::os::fd::AsRawFd;
    let file = open_event(kind, config).ok()?;
    // SAFETY: mapping the first page of a perf_event descriptor, read-only.
    let page = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            page::MAP_LEN,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if page == libc::MAP_FAILED {
        return None;
    }
    std::mem::forget(file);
    Some(page as *const u8)
}

/// One perf event counting the calling thread in user space, with its page mapped.
#[derive(Debug)]
pub struct ThreadCounter {
    file: File,
    page: MmapRaw,
    /// `rdpmc` reads the current CPU's counters: only the opening thread may read.
    _not_send: PhantomData<*const ()>,
}

impl ThreadCounter {
    /// Opens `counter` on the calling thread (user space only) and maps its page.
    pub fn open(counter: Counter) -> io::Result<Self> {
        let (kind, config) = counter.perf_type_config();
        Self::open_raw(kind, config)
    }

    /// Opens any perf event type on the calling thread (user space only).
    pub(crate) fn open_raw(kind: u32, config: u64) -> io::Result<Self> {
        Self::map(open_event(kind, config)?)
    }

    /// Maps the first page of an open event.
    fn map(file: File) -> io::Result<Self> {
        let page = MmapOptions::new()
            .len(page::MAP_LEN)
            .map_raw_read_only(&file)?;
        Ok(ThreadCounter {
            file,
            page,
            _not_send: PhantomData,
        })
    }

    /// The mapped `perf_event_mmap_page`.
    pub fn page(&self) -> *const u8 {
        self.page.as_ptr()
    }

    /// Whether the kernel lets this process read the counter with `rdpmc`.
    pub fn rdpmc_allowed(&self) -> bool {
        self.capabilities() & page::CAP_USER_RDPMC != 0
    }

    fn capabilities(&self) -> u64 {
        // SAFETY: the page is mapped, page-aligned and MAP_LEN bytes long.
        unsafe {
            self.page()
                .add(page::CAPABILITIES)
                .cast::<u64>()
                .read_volatile()
        }
    }

    /// The count, read in user space with `rdpmc`; `None` when the page does not allow
    /// it right now (see [`read_page`]): use [`ThreadCounter::read_syscall`] then.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    pub fn read(&self) -> Option<u64> {
        // SAFETY: the page is mapped for as long as self lives; self is not Send, so
        // the caller is the thread the event counts; read_page calls rdpmc only when
        // cap_user_rdpmc says the kernel allows it.
        unsafe { read_page(self.page(), |index| rdpmc(index)) }
    }

    /// No `rdpmc` off x86-64: always [`ThreadCounter::read_syscall`].
    #[cfg(not(target_arch = "x86_64"))]
    pub fn read(&self) -> Option<u64> {
        None
    }

    /// The count, read with the `read()` system call.
    pub fn read_syscall(&self) -> io::Result<u64> {
        let mut value = [0u8; 8];
        (&self.file).read_exact(&mut value)?;
        Ok(u64::from_ne_bytes(value))
    }
}

/// Where the kernel publishes the core PMU (`cpu`, or `cpu_core` on hybrid CPUs).
fn cpu_pmu_dir() -> Option<&'static str> {
    [
        "/sys/bus/event_source/devices/cpu",
        "/sys/bus/event_source/devices/cpu_core",
    ]
    .into_iter()
    .find(|dir| std::path::Path::new(dir).exists())
}

fn open_failure(counter: Counter, err: &io::Error) -> String {
    let why = match err.raw_os_error() {
        Some(libc::ENOENT) | Some(libc::EOPNOTSUPP) | Some(libc::ENODEV) => match cpu_pmu_dir() {
            None => " (this machine exposes no hardware PMU)".to_string(),
            Some(_) => " (the CPU's PMU does not provide this event)".to_string(),
        },
        Some(libc::EACCES) | Some(libc::EPERM) => {
            let paranoid = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "unknown".to_string());
            format!(
                " (kernel.perf_event_paranoid is {paranoid}, counting one's own user space \
                 needs 2 or lower or CAP_PERFMON; a seccomp filter, as in containers, can \
                 also refuse perf_event_open)"
            )
        }
        Some(libc::ENOSYS) => " (the kernel has no perf_event support)".to_string(),
        _ => String::new(),
    };
    format!("hardware counters are not available: perf_event_open({counter}) failed: {err}{why}")
}

/// Checks that the calling thread can count `counters` and read them with `rdpmc`:
/// opens each (all at once, as a traced thread would), maps its page and checks
/// `cap_user_rdpmc`. The error is one sentence saying why not.
pub fn availability(counters: &[Counter]) -> Result<(), String> {
    let mut open = Vec::with_capacity(counters.len());
    for &counter in counters {
        let (kind, config) = counter.perf_type_config();
        let file = open_event(kind, config).map_err(|err| open_failure(counter, &err))?;
        let event = ThreadCounter::map(file).map_err(|err| {
            format!(
                "hardware counters are not available: mapping the perf_event page of \
                 {counter} failed: {err}"
            )
        })?;
        if !event.rdpmc_allowed() {
            let file = cpu_pmu_dir().unwrap_or("/sys/bus/event_source/devices/cpu");
            return Err(format!(
                "the kernel does not allow rdpmc (cap_user_rdpmc is 0; see {file}/rdpmc)"
            ));
        }
        open.push(event);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// A synthetic perf_event_mmap_page.
    #[repr(C, align(4096))]
    struct Page {
        bytes: [u8; 4096],
    }

    impl Page {
        fn new() -> Box<Page> {
            Box::new(Page { bytes: [0; 4096] })
        }
        fn set<const N: usize>(&mut self, at: usize, value: [u8; N]) {
            self.bytes[at..at + N].copy_from_slice(&value);
        }
        fn ptr(&mut self) -> *mut u8 {
            self.bytes.as_mut_ptr()
        }
    }

    fn rdpmc_page(lock: u32, index: u32, offset: i64, width: u16) -> Box<Page> {
        let mut page = Page::new();
        page.set(page::LOCK, lock.to_ne_bytes());
        page.set(page::INDEX, index.to_ne_bytes());
        page.set(page::OFFSET, offset.to_ne_bytes());
        page.set(
            page::CAPABILITIES,
            (page::CAP_USER_RDPMC | page::CAP_BIT0_IS_DEPRECATED).to_ne_bytes(),
        );
        page.set(page::PMC_WIDTH, width.to_ne_bytes());
        page
    }

    #[test]
    fn index_zero_means_no_user_space_read() {
        let mut page = rdpmc_page(2, 0, 1000, 48);
        let called = Cell::new(false);
        let got = unsafe {
            read_page(page.ptr(), |_| {
                called.set(true);
                0
            })
        };
        assert_eq!(got, None);
        assert!(!called.get());
    }

    #[test]
    fn no_cap_user_rdpmc_means_no_user_space_read() {
        let mut page = rdpmc_page(2, 3, 1000, 48);
        page.set(
            page::CAPABILITIES,
            page::CAP_BIT0_IS_DEPRECATED.to_ne_bytes(),
        );
        let got = unsafe { read_page(page.ptr(), |_| panic!("rdpmc must not run")) };
        assert_eq!(got, None);
    }

    #[test]
    fn reads_counter_index_minus_one_sign_extended_plus_offset() {
        // The kernel starts a 48-bit counter at -(2^47) + 5 and sets offset so that
        // offset + pmc is the count: 1005.
        let raw: u64 = (1 << 47) | 5;
        let offset: i64 = (1 << 47) + 1000;
        let mut page = rdpmc_page(4, 3, offset, 48);
        let asked = Cell::new(None);
        let got = unsafe {
            read_page(page.ptr(), |index| {
                asked.set(Some(index));
                raw
            })
        };
        assert_eq!(asked.get(), Some(2));
        assert_eq!(got, Some(1005));
    }

    #[test]
    fn full_width_counters_are_not_shifted() {
        let mut page = rdpmc_page(0, 1, 7, 64);
        let got = unsafe { read_page(page.ptr(), |_| u64::MAX) };
        assert_eq!(got, Some(6));
    }

    #[test]
    fn a_lock_change_during_the_read_retries() {
        let mut page = rdpmc_page(6, 3, 1000, 48);
        let base = page.ptr();
        let calls = Cell::new(0u32);
        let got = unsafe {
            read_page(base, |index| {
                assert_eq!(index, 2);
                calls.set(calls.get() + 1);
                if calls.get() == 1 {
                    // The event was rescheduled between the reads: new offset, lock bumped.
                    base.add(page::OFFSET).cast::<i64>().write_volatile(2000);
                    base.add(page::LOCK).cast::<u32>().write_volatile(7);
                    10
                } else {
                    20
                }
            })
        };
        assert_eq!(calls.get(), 2);
        assert_eq!(got, Some(2020));
    }

    #[test]
    fn parse_list_accepts_known_names() {
        assert_eq!(
            parse_list("cycles,instructions").unwrap(),
            vec![Counter::Cycles, Counter::Instructions]
        );
        assert_eq!(
            parse_list(" branches , branch-misses,cache-references,cache-misses").unwrap(),
            vec![
                Counter::BranchInstructions,
                Counter::BranchMisses,
                Counter::CacheReferences,
                Counter::CacheMisses
            ]
        );
        for counter in Counter::ALL {
            assert_eq!(Counter::from_name(counter.name()), Some(counter));
        }
    }

    #[test]
    fn parse_list_names_the_unknown_counter_and_the_known_ones() {
        let err = parse_list("cycles,bogus").unwrap_err();
        assert!(err.contains("\"bogus\""), "{err}");
        for counter in Counter::ALL {
            assert!(err.contains(counter.name()), "{err}");
        }
        assert!(parse_list("").is_err());
        assert!(parse_list("cycles,,instructions").is_err());
        assert!(parse_list("cycles,cycles").unwrap_err().contains("twice"));
    }

    #[test]
    fn availability_says_why_not() {
        match availability(&[Counter::Cycles, Counter::Instructions]) {
            Ok(()) => {}
            Err(why) => {
                eprintln!("availability: {why}");
                assert!(!why.trim().is_empty());
                assert!(!why.contains('\n'), "{why}");
            }
        }
        assert_eq!(availability(&[]), Ok(()));
    }

    #[test]
    fn a_software_counter_opens_maps_and_reads() {
        let event = match ThreadCounter::open_raw(
            bindings::PERF_TYPE_SOFTWARE,
            bindings::PERF_COUNT_SW_TASK_CLOCK as u64,
        ) {
            Ok(event) => event,
            Err(err)
                if matches!(
                    err.raw_os_error(),
                    Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::ENOSYS)
                ) =>
            {
                eprintln!("skipped: perf_event_open is refused here: {err}");
                return;
            }
            Err(err) => panic!("perf_event_open(task-clock): {err}"),
        };
        let mut x = 0u64;
        for i in 0..1_000_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        let p = event.page();
        let (index, size, capabilities) = unsafe {
            (
                p.add(page::INDEX).cast::<u32>().read_volatile(),
                p.add(page::SIZE).cast::<u32>().read_volatile(),
                p.add(page::CAPABILITIES).cast::<u64>().read_volatile(),
            )
        };
        // Software events have no hardware counter.
        assert_eq!(index, 0);
        // The kernel writes the header size (up to __reserved) and the deprecation bit.
        assert_eq!(size, 96);
        assert_ne!(capabilities & page::CAP_BIT0_IS_DEPRECATED, 0);
        assert_eq!(
            unsafe { read_page(p, |_| panic!("rdpmc must not run")) },
            None
        );
        assert_eq!(event.read(), None);
        let first = event.read_syscall().unwrap();
        assert!(first > 0, "task-clock read {first} ns");
        let second = event.read_syscall().unwrap();
        assert!(second >= first);
    }
}
