//! What the probe runtime (`glass-probe`, loaded into the traced process) and glass share:
//! the layout of the session's shared memory, the 8-byte call record, and the decoding
//! of records back into full timestamps.
//!
//! The shared memory is one file (tmpfs) mapped by both sides:
//!
//! ```text
//! [header: 4 KiB][thread area 0][thread area 1]...      each area ring_stride bytes
//! thread area: [head | tail | producer fields][shadow stack][records: capacity x 8 B]
//! ```
//!
//! A thread claims an area the first time it hits a probe (an atomic increment of
//! `next_area`), and from then on is its only producer: one single-producer /
//! single-consumer ring per thread, no locks. The producer writes records at its private
//! `cursor` and publishes them in batches of [`PUBLISH_EVERY`] by storing `head`; glass
//! consumes up to `head` and stores `tail`. A full ring drops records and counts them
//! (`lost`): the target never waits for glass. The shadow stack (real return addresses
//! of the calls in flight) lives in the area too, so a crashed glass leaves the target
//! nothing to miss.

pub mod pmc;
pub mod session;

/// First word of the header.
pub const MAGIC: u64 = u64::from_le_bytes(*b"GLASSTRC");
/// Bumped when the layout changes.
pub const VERSION: u64 = 3;

/// Header fields (byte offsets).
pub mod header {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    /// Number of thread areas.
    pub const AREA_COUNT: usize = 16;
    /// Bytes from one area to the next.
    pub const AREA_STRIDE: usize = 24;
    /// Records per ring (a power of two).
    pub const CAPACITY: usize = 32;
    /// Areas claimed so far (may exceed AREA_COUNT: those threads are not traced).
    pub const NEXT_AREA: usize = 40;
    /// Probe events of threads that found no free area.
    pub const NO_AREA_LOST: usize = 48;
    /// Hardware counter values per record (0: time only).
    pub const COUNTERS: usize = 56;
    /// The runtime's exit stub in the target (where hijacked returns go).
    pub const EXIT_STUB: usize = 64;
    /// Full time-stamp counter when the session started: the reference for the 44
    /// bits each record keeps.
    pub const TSC_START: usize = 72;
    /// Written by the runtime when it has mapped the session: its pid.
    pub const RUNTIME_PID: usize = 80;
    /// The runtime's entry probe (`glass_enter`) in the target.
    pub const ENTER: usize = 88;
    /// Per hardware counter (up to [`MAX_COUNTERS`](crate::MAX_COUNTERS)): the
    /// perf_event type and config, two words each.
    pub const COUNTER_CONFIG: usize = 96;
    /// Written by the runtime: where a thread's area word lies, relative to its thread
    /// pointer (fs base). glass clears each thread's word when it detaches.
    pub const TLS_OFFSET: usize = 160;
    /// Written by the runtime: where it mapped the session in the target (a later
    /// glass reads the shadow stacks there if this one dies attached).
    pub const MAPPED_AT: usize = 168;
    /// Written by the runtime of a launched program that dies of a fault (SIGSEGV,
    /// SIGILL, SIGBUS, SIGFPE, where the program had no handler of its own): the
    /// signal, the instruction pointer and the faulting address, for glass to say where
    /// it died (0: no such death).
    pub const FATAL_SIGNAL: usize = 176;
    pub const FATAL_PC: usize = 184;
    pub const FATAL_ADDRESS: usize = 192;
    /// The process that died so (a forked child shares the session).
    pub const FATAL_PID: usize = 200;
    /// Written by the runtime: its Go entry and exit probes (`glass_site_enter`,
    /// `glass_site_exit`), which key each record by goroutine instead of replacing the
    /// return address (see [`KEYED_BIT`]).
    pub const SITE_ENTER: usize = 208;
    pub const SITE_EXIT: usize = 216;
    /// Written by glass for a Go program: where the running goroutine (`g`) lies
    /// relative to the thread pointer (fs base), as the Go runtime keeps it in TLS; 0
    /// when unknown (records are then keyed by their slot alone).
    pub const GO_G_OFFSET: usize = 224;
    /// Written by the runtime: the exit probe of native code's return sites
    /// (`glass_site_return`), whose entries `glass_enter` records with
    /// [`SITE_ID_BIT`](crate::SITE_ID_BIT) set.
    pub const SITE_RETURN: usize = 232;
    /// AArch64: `glass_probe_as_held(held, stub, value, key)`, which signs `value` as
    /// `held` (the exit stub, signed or not with `key` as modifier) was signed: glass
    /// calls it when it gives a signed return address back at detach, the keys being
    /// the process's own. 0 elsewhere.
    pub const AS_HELD: usize = 240;
    pub const SIZE: usize = 4096;
}

/// Thread-area fields (byte offsets from the area's start). `head` and `tail` sit on
/// their own cache lines: one is written by the producer, the other by glass.
pub mod area {
    /// Records published (producer writes, glass reads).
    pub const HEAD: usize = 0;
    /// Records consumed (glass writes, producer reads when its cached limit runs out).
    pub const TAIL: usize = 64;
    /// Records written, published or not (producer only).
    pub const CURSOR: usize = 128;
    /// The producer's cached `tail + capacity`.
    pub const LIMIT: usize = 136;
    /// Calls in flight on the shadow stack.
    pub const DEPTH: usize = 144;
    /// Non-zero while a probe of this thread runs: a signal handler's probe then
    /// passes (counted in SKIPPED) instead of corrupting the shadow stack.
    pub const BUSY: usize = 152;
    /// Records dropped because the ring was full.
    pub const LOST: usize = 160;
    pub const TID: usize = 168;
    pub const PID: usize = 176;
    /// capacity - 1.
    pub const MASK: usize = 184;
    /// Calls that ended without returning (longjmp, exceptions), recorded when noticed.
    pub const UNWOUND: usize = 192;
    /// Calls not traced: a probe was already running (signal) or the shadow stack was full.
    pub const SKIPPED: usize = 200;
    /// Non-zero once a thread owns this area.
    pub const CLAIMED: usize = 208;
    /// Words per record: 1, plus one per hardware counter.
    pub const RECORD_WORDS: usize = 216;
    /// Per counter, the thread's perf_event page (read with rdpmc).
    pub const PMC_PAGES: usize = 224;
    /// The shadow stack: SHADOW_CAPACITY entries of (slot address, real return
    /// address, function id | flags).
    pub const SHADOW: usize = 256;
    pub const SHADOW_CAPACITY: usize = 4096;
    pub const SHADOW_ENTRY: usize = 24;
    /// Where the records start.
    pub const RECORDS: usize = (SHADOW + SHADOW_CAPACITY * SHADOW_ENTRY).div_ceil(4096) * 4096;
}

/// Shadow-entry flag: the entry record was dropped, so the exit is not recorded either.
pub const SHADOW_DROPPED_BIT: u32 = 32;
/// Shadow-entry flag: the real return address was put back for an exception in flight.
pub const SHADOW_RESTORED_BIT: u32 = 33;
/// In the function id a trampoline pushes for `glass_enter`, and so in the shadow entry:
/// the call is timed at its return sites (`glass_site_return`), and its return address
/// is left alone. Above every function id; shifted out of the record word.
pub const SITE_ID_BIT: u32 = 30;
/// AArch64: in the word a trampoline hands `glass_enter` (x16, above the function id),
/// and so in the shadow entry: where the function keeps its return address (x30) once
/// its prologue has run, in words below its entry stack pointer, as its CFI says (0: not
/// known). The C++ exception hooks put the real address back there; the slot of x86-64
/// (the word the call pushed) does not exist on AArch64, where the return address
/// arrives in a register.
pub const LR_SAVE_SHIFT: u32 = 40;
pub const LR_SAVE_BITS: u32 = 16;

/// Hardware counters a record can carry (each adds one word after the record).
pub const MAX_COUNTERS: usize = 4;

/// The producer publishes `head` every this many records.
pub const PUBLISH_EVERY: u64 = 32;

/// Bits of the time-stamp counter a record keeps (2^44 cycles: ~1.6 hours at 3 GHz,
/// the longest silence a thread may have between two records).
pub const TSC_BITS: u32 = 44;
pub const EXIT_BIT: u32 = 44;
pub const UNWOUND_BIT: u32 = 45;
pub const FUNCTION_SHIFT: u32 = 46;
/// A record of the Go probes, which two more words follow: whose stack the call is on,
/// and its slot there. On a goroutine's stack they are the goroutine (`g`) and the
/// slot's offset from the stack's top plus 2^62, which stay the same when the Go runtime
/// moves the stack; elsewhere (a signal handler's first frames) the thread pointer and
/// the slot's address. glass pairs these per stack before they reach the file, which
/// never holds them.
pub const KEYED_BIT: u32 = 63;
/// Words of a keyed record.
pub const KEYED_WORDS: usize = 3;
/// Largest function id a record can carry (the top bit is [`KEYED_BIT`]).
pub const MAX_FUNCTIONS: u32 = 1 << (KEYED_BIT - FUNCTION_SHIFT);

/// What a record says happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Entry,
    Exit,
    /// The call ended without returning (longjmp, an exception); its time is when the
    /// probe noticed.
    Unwound,
}

/// One decoded record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    pub tsc: u64,
    pub function: u32,
    pub kind: EventKind,
}

/// Encodes a record the way the probe does (used by tests and tools).
pub fn encode(tsc: u64, function: u32, kind: EventKind) -> u64 {
    let mut word = (tsc & ((1 << TSC_BITS) - 1)) | ((function as u64) << FUNCTION_SHIFT);
    match kind {
        EventKind::Entry => {}
        EventKind::Exit => word |= 1 << EXIT_BIT,
        EventKind::Unwound => word |= (1 << EXIT_BIT) | (1 << UNWOUND_BIT),
    }
    word
}

/// Rebuilds full timestamps from the low bits records keep: each is the first value at
/// or after the previous one (per thread) with the same low bits.
#[derive(Debug, Clone, Copy)]
pub struct TscUnwrapper {
    last: u64,
}

impl TscUnwrapper {
    pub fn new(start: u64) -> Self {
        TscUnwrapper { last: start }
    }

    pub fn decode(&mut self, word: u64) -> Event {
        const MASK: u64 = (1 << TSC_BITS) - 1;
        let low = word & MASK;
        let mut tsc = (self.last & !MASK) | low;
        if tsc < self.last {
            tsc += 1 << TSC_BITS;
        }
        self.last = tsc;
        let kind = if word & (1 << EXIT_BIT) == 0 {
            EventKind::Entry
        } else if word & (1 << UNWOUND_BIT) != 0 {
            EventKind::Unwound
        } else {
            EventKind::Exit
        };
        Event {
            tsc,
            function: ((word >> FUNCTION_SHIFT) as u32) & (MAX_FUNCTIONS - 1),
            kind,
        }
    }
}

/// AArch64: where the function of a shadow entry keeps its x30, in words below its key
/// (its entry stack pointer), from its CFI (see [`LR_SAVE_SHIFT`]); 0 when not known.
pub fn lr_save_words(entry_word: u64) -> u64 {
    (entry_word >> LR_SAVE_SHIFT) & ((1 << LR_SAVE_BITS) - 1)
}

/// AArch64: a user code address without its pointer-authentication code (user
/// addresses lie below 2^48; the code sits above them).
pub fn stripped(address: u64) -> u64 {
    address & ((1u64 << 48) - 1)
}

/// AArch64: calls `visit(first, last, low)` for each run of a thread's shadow entries
/// that share a key (a tail call's), from the deepest of `depth` entries up: `first` is
/// the run's first entry (whose real return address the frame must get back), `last` its
/// last (the function running at that key now, whose frame holds the saved x30), `low`
/// the lowest address that frame can hold it at (the deeper run's key, or `low` for the
/// deepest). Runs below `low` are not visited. Shared by the probe runtime's exception
/// hooks and glass's detach; allocates nothing (the runtime runs it in whatever thread
/// calls the unwinder).
pub fn each_shadow_run(
    depth: u64,
    key_of: impl Fn(u64) -> u64,
    mut low: u64,
    mut visit: impl FnMut(u64, u64, u64),
) {
    let mut index = depth;
    while index > 0 {
        let key = key_of(index - 1);
        let mut first = index - 1;
        while first > 0 && key_of(first - 1) == key {
            first -= 1;
        }
        if key >= low {
            visit(first, index - 1, low);
            low = key;
        }
        index = first;
    }
}

/// Reads the time-stamp counter.
#[cfg(target_arch = "x86_64")]
#[inline]
pub fn rdtsc() -> u64 {
    // SAFETY: rdtsc has no side effects; every x86-64 CPU has it.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// Reads the counter that stands for the time-stamp counter on AArch64: the generic
/// timer's virtual count (the aarch64 glass, built for Xen on ARM64's dom0, records no
/// traces; this keeps the session code building).
#[cfg(target_arch = "aarch64")]
#[inline]
pub fn rdtsc() -> u64 {
    let count: u64;
    // SAFETY: reading CNTVCT_EL0 has no side effects and is allowed at EL0 on Linux.
    unsafe { core::arch::asm!("mrs {}, cntvct_el0", out(reg) count, options(nomem, nostack)) };
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shadow_runs_are_visited_deepest_first_with_their_frame_bounds() {
        // Keys of entries 0..5: 0x900; 0x800 and 0x800 (a tail call); 0x700; 0x100 (below
        // the thread's stack pointer: a frame that is gone).
        let keys = [0x900u64, 0x800, 0x800, 0x700, 0x100];
        let mut seen = Vec::new();
        each_shadow_run(
            5,
            |i| keys[i as usize],
            0x600,
            |first, last, low| seen.push((first, last, low)),
        );
        assert_eq!(seen, [(3, 3, 0x600), (1, 2, 0x700), (0, 0, 0x800)]);
        assert_eq!(lr_save_words(7 | 3 << LR_SAVE_SHIFT), 3);
        assert_eq!(stripped(0x0012_ffff_0000_1234), 0xffff_0000_1234);
    }

    #[test]
    fn records_round_trip_across_a_wrap_of_the_kept_bits() {
        let start = (5u64 << TSC_BITS) - 100;
        let mut unwrap = TscUnwrapper::new(start);
        let times = [
            start + 1,
            start + 99,
            start + 100,
            start + 5000,
            start + (3 << 40),
        ];
        for (i, &t) in times.iter().enumerate() {
            let kind = [EventKind::Entry, EventKind::Exit, EventKind::Unwound][i % 3];
            let event = unwrap.decode(encode(t, 131_000 + i as u32, kind));
            assert_eq!(
                event,
                Event {
                    tsc: t,
                    function: 131_000 + i as u32,
                    kind
                }
            );
        }
    }

    // The record area follows the shadow stack, page aligned.
    const _: () =
        assert!(area::RECORDS >= area::SHADOW + area::SHADOW_CAPACITY * area::SHADOW_ENTRY);
    const _: () = assert!(area::RECORDS.is_multiple_of(4096));
    const _: () = assert!(area::CLAIMED < area::SHADOW);
    const _: () = assert!(area::PMC_PAGES + 8 * MAX_COUNTERS <= area::SHADOW);

    #[test]
    fn the_file_format_packs_the_same_record_layout() {
        assert_eq!(TSC_BITS, glass_format::TRACE_TIME_BITS);
    }
}
