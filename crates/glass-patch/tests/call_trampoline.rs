//! The call-style trampoline run for real, in this process: a function patched to it is
//! called from several threads at once while a reader drains the ring, and every call's
//! entry and exit arrive, paired by their slot, with nothing dropped; a ring nobody
//! drains drops and counts, and the function still returns what it returned before.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use glass_patch::analyze;
use glass_patch::call_trampoline::{build, Record, Ring, RECORD_BYTES};
use glass_patch::trampoline::entry_patch;

/// `push rbx; mov rax, rdi; add rax, 1; mov rbx, rax; pop rbx; ret`: returns its
/// argument plus one, long enough for the jump.
const FUNCTION: [u8; 14] = [
    0x53, 0x48, 0x89, 0xf8, 0x48, 0x83, 0xc0, 0x01, 0x48, 0x89, 0xc3, 0x5b, 0xc3, 0xcc,
];

/// Readable, writable and executable memory: the ring's words at its start, the
/// function at 0x8000, its trampoline at 0x9000, the records from 0x10000.
struct Region {
    base: *mut u8,
    len: usize,
}

unsafe impl Send for Region {}
unsafe impl Sync for Region {}

impl Region {
    fn new(len: usize) -> Region {
        // SAFETY: a fresh anonymous mapping, unmapped in Drop.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        Region {
            base: base.cast(),
            len,
        }
    }

    fn address(&self, offset: usize) -> u64 {
        self.base as u64 + offset as u64
    }

    fn write(&self, offset: usize, bytes: &[u8]) {
        assert!(offset + bytes.len() <= self.len);
        // SAFETY: inside the mapping; nothing runs this code yet.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.base.add(offset), bytes.len()) }
    }

    fn word(&self, offset: usize) -> &AtomicU64 {
        // SAFETY: 8-aligned, inside the mapping, shared with the traced code as atomics.
        unsafe { &*(self.base.add(offset) as *const AtomicU64) }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the mapping made in new.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

const HEAD: usize = 0;
const TAIL: usize = 8;
const DROPPED: usize = 16;
const FUNCTION_AT: usize = 0x8000;
const TRAMPOLINE_AT: usize = 0x9000;
const RECORDS: usize = 0x10000;

/// The region with FUNCTION patched to its trampoline (id 5) over a ring of
/// `capacity` records; the function to call.
fn patched(capacity: u64) -> (Arc<Region>, extern "C" fn(u64) -> u64) {
    let region = Arc::new(Region::new(RECORDS + (capacity * RECORD_BYTES) as usize));
    let function = region.address(FUNCTION_AT);
    region.write(FUNCTION_AT, &FUNCTION);
    let ring = Ring {
        head: region.address(HEAD),
        tail: region.address(TAIL),
        dropped: region.address(DROPPED),
        records: region.address(RECORDS),
        capacity,
    };
    let plan = analyze(&FUNCTION, function).unwrap();
    let trampoline = region.address(TRAMPOLINE_AT);
    let (code, moves) = build(&plan, 5, trampoline, &ring).unwrap();
    // Each displaced instruction after the first has its copy in the trampoline, and the
    // end of the displaced bytes the body's jump back.
    assert_eq!(moves.len(), plan.instructions.len(), "{moves:x?}");
    region.write(TRAMPOLINE_AT, &code);
    region.write(FUNCTION_AT, &entry_patch(&plan, trampoline).unwrap());
    // SAFETY: the patched function keeps the C ABI of the original.
    let call = unsafe { std::mem::transmute::<u64, extern "C" fn(u64) -> u64>(function) };
    (region, call)
}

/// Takes every published record, in ring order, until `stop` and the ring is empty.
fn drain(region: &Region, capacity: u64, stop: &AtomicBool) -> Vec<Record> {
    let mut records = Vec::new();
    let mut tail = 0u64;
    loop {
        let stopping = stop.load(Ordering::Acquire);
        let head = region.word(HEAD).load(Ordering::Acquire);
        while tail < head {
            let at = RECORDS + ((tail % capacity) * RECORD_BYTES) as usize;
            let word = region.word(at + 8).load(Ordering::Acquire);
            let Some(record) = Record::decode(region.word(at).load(Ordering::Relaxed), word) else {
                break; // reserved, not yet written
            };
            records.push(record);
            region.word(at + 8).store(0, Ordering::Relaxed);
            tail += 1;
            region.word(TAIL).store(tail, Ordering::Release);
        }
        if stopping && tail == region.word(HEAD).load(Ordering::Acquire) {
            return records;
        }
        std::hint::spin_loop();
    }
}

#[test]
fn every_call_of_every_thread_is_recorded_and_paired() {
    // Room for every record: the reader, sharing two cores with three callers, may
    // fall far behind.
    let capacity = 1 << 18;
    let (region, call) = patched(capacity);
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (region, stop) = (region.clone(), stop.clone());
        std::thread::spawn(move || drain(&region, capacity, &stop))
    };
    let calls_per_thread = 20_000u64;
    // All three at once: a thread that ended would give its stack to the next.
    let together = Arc::new(std::sync::Barrier::new(3));
    let callers: Vec<_> = (0..3)
        .map(|_| {
            let together = together.clone();
            std::thread::spawn(move || {
                together.wait();
                for n in 0..calls_per_thread {
                    assert_eq!(call(n), n + 1);
                }
            })
        })
        .collect();
    for caller in callers {
        caller.join().unwrap();
    }
    stop.store(true, Ordering::Release);
    let records = reader.join().unwrap();
    assert_eq!(region.word(DROPPED).load(Ordering::Relaxed), 0);
    assert_eq!(records.len() as u64, 3 * calls_per_thread * 2);
    assert!(records.iter().all(|r| r.id == 5));
    // Per slot (one per caller's stack), entries and exits alternate, in time order.
    let mut slots: std::collections::BTreeMap<u64, Vec<Record>> = Default::default();
    for record in &records {
        slots.entry(record.slot).or_default().push(*record);
    }
    assert_eq!(slots.len(), 3);
    for (slot, sequence) in &slots {
        assert_eq!(sequence.len() as u64, 2 * calls_per_thread);
        for pair in sequence.chunks(2) {
            assert!(!pair[0].exit && pair[1].exit, "slot {slot:#x}: {pair:?}");
            assert!(pair[0].tsc <= pair[1].tsc);
        }
    }
}

#[test]
fn a_full_ring_drops_and_counts_and_the_function_still_works() {
    let capacity = 8;
    let (region, call) = patched(capacity);
    for n in 0..100 {
        assert_eq!(call(n), n + 1);
    }
    assert_eq!(region.word(HEAD).load(Ordering::Relaxed), capacity);
    assert_eq!(region.word(DROPPED).load(Ordering::Relaxed), 200 - capacity);
    // The first four calls are in the ring, entry then exit each.
    let first = Record::decode(
        region.word(RECORDS).load(Ordering::Relaxed),
        region.word(RECORDS + 8).load(Ordering::Relaxed),
    )
    .unwrap();
    let second = Record::decode(
        region.word(RECORDS + 16).load(Ordering::Relaxed),
        region.word(RECORDS + 24).load(Ordering::Relaxed),
    )
    .unwrap();
    assert!(
        !first.exit && second.exit && first.slot == second.slot,
        "{first:?} {second:?}"
    );
    assert!(second.tsc >= first.tsc);
}
