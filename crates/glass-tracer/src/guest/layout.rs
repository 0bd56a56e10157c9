//! The region glass adds to a guest: where it sits in the guest's address space, what is
//! in it, and the ring glass reads from it while the guest runs.
//!
//! ```text
//! region (2 MiB at guest-physical 4 GiB, one 2 MiB page of the guest's page tables)
//!   0x0000   page-directory-pointer table: one entry, to the page directory
//!   0x1000   page directory: one 2 MiB entry, the region itself
//!   0x2000   ring: head, tail, dropped (u64 each)
//!   0x2018   where the trampolines written so far end (0: none yet)
//!   0x2020   "glassrgn": the region is glass's (a `--guest-scratch` range says so)
//!   0x3000   trampolines
//!   0x100000 records: 65536 of 16 bytes
//! ```
//!
//! The guest reaches it through one entry glass adds to its page tables, at a 1 GiB
//! slot within a `jmp rel32` (2 GiB) of every patched function that the guest does not
//! map (`Layout::choose`): an empty top-level entry (a kernel linked in the low 2 GiB
//! reaches the top one, addresses wrapping around), or an empty entry of the guest's
//! page-directory-pointer table of a kernel linked in the top 2 GiB. The guest runs the
//! trampolines at ring 0 (supervisor pages, executable).
//!
//! A region stays in the VM after glass detaches (a call under way returns through its
//! trampoline), and the next `glass trace --qmp` of that VM uses it again: its
//! trampolines go after the earlier ones, never over them (a call of the earlier trace
//! may still return into one), and its ring reader starts where the earlier one stopped.

use std::sync::atomic::{AtomicU64, Ordering};

use glass_patch::call_trampoline::{self, Record, Ring, RECORD_BYTES};
use glass_patch::trampoline::entry_patch;

use crate::install::Installed;
use crate::replay::Replay;
use crate::select::ModuleChoice;

pub const REGION_BYTES: u64 = 2 << 20;
const PDPT: u64 = 0x0;
const PAGE_DIRECTORY: u64 = 0x1000;
const HEAD: u64 = 0x2000;
const TAIL: u64 = 0x2008;
const DROPPED: u64 = 0x2010;
const TRAMPOLINES_END: u64 = 0x2018;
const MAGIC_AT: u64 = 0x2020;
const MAGIC: &[u8; 8] = b"glassrgn";
/// The bytes before the trampolines: all [`Layout::install`] reads of a region used
/// before (its page tables and header).
pub const HEADER_BYTES: u64 = TRAMPOLINES;
/// The ring's words and records: what a range glass has not used before must have
/// zeroed before its first use.
pub const RING: std::ops::Range<u64> = HEAD..REGION_BYTES;
const TRAMPOLINES: u64 = 0x3000;
const RECORDS: u64 = 0x10_0000;
/// What glass writes into the region before the guest uses it: everything before the
/// records.
pub const IMAGE_BYTES: u64 = RECORDS;
const CAPACITY: u64 = (REGION_BYTES - RECORDS) / RECORD_BYTES;

/// Present, writable; a 2 MiB page.
const PRESENT_WRITABLE: u64 = 0x3;
const LARGE_PAGE: u64 = 0x80;

/// What [`Layout::install`] wrote and what the guest's code needs.
pub struct Installation {
    pub installed: Vec<Installed>,
    /// The entry jumps to write: (address, bytes).
    pub patches: Vec<(u64, Vec<u8>)>,
    /// (inside the bytes a jump replaces, the same instruction in the relocated copy).
    pub moves: Vec<(u64, u64)>,
    /// The region's bytes this installation wrote, as offsets, besides the page-table
    /// pages and the header word: its trampolines.
    pub trampolines: std::ops::Range<u64>,
}

impl Installation {
    /// The region's byte ranges (offsets) glass writes into a region the guest may be
    /// running trampolines of an earlier trace in: its page-table pages (entries are
    /// only added), the header word, and the new trampolines. Never the ring's words,
    /// which such a trampoline may be updating.
    pub fn written(&self) -> [std::ops::Range<u64>; 3] {
        [
            PDPT..HEAD,
            TRAMPOLINES_END..MAGIC_AT + 8,
            self.trampolines.clone(),
        ]
    }

    /// What glass and its guardian put back at the end: each patch's original bytes
    /// (read from the guest), and the moves reversed.
    pub fn ledger(
        &self,
        originals: Vec<(u64, Vec<u8>)>,
    ) -> glass_target::gdbstub::ledger::CodeLedger {
        glass_target::gdbstub::ledger::CodeLedger {
            code: originals,
            back: self.moves.iter().map(|&(from, to)| (to, from)).collect(),
        }
    }
}

/// Where the region is in the guest's virtual address space, and the one entry of the
/// guest's page tables that reaches it.
pub struct Layout {
    /// Its first byte, as the guest addresses it.
    base: u64,
    /// Its first byte, guest-physical.
    gpa: u64,
    /// The guest-physical address of the entry glass sets, and its value.
    entry_at: u64,
    entry: u64,
    /// That entry, in words ("top-level entry 511").
    hang: String,
    /// An AArch64 guest: the entry is a 2 MiB block descriptor in one of the guest's
    /// own level-2 tables (no table of the region's), the trampolines
    /// `glass_patch::aarch64_call`'s.
    aarch64: bool,
}

/// What a walk's accessed bit changes: glass's own entry of an earlier trace, which the
/// guest's walks have marked accessed since, is still glass's.
const ACCESSED: u64 = 0x20;
const ADDRESS_MASK: u64 = 0x000f_ffff_ffff_f000;

impl Layout {
    /// The region's place for code at `low..high`, the region being at guest-physical
    /// `gpa` (2 MiB-aligned), in the page tables at `cr3` (4-level), whose entries
    /// `entry` reads (a u64 at a guest-physical address); or why there is none.
    ///
    /// A 1 GiB slot within a `jmp rel32` (2 GiB) of every function, whose top-level
    /// entry is empty (the region's own page-directory-pointer table then hangs
    /// there), or else whose entry in an existing page-directory-pointer table of the
    /// guest is (the region's page directory hangs there): a kernel linked in the top 2
    /// GiB, as Linux and most unikernels built with `-mcmodel=kernel` are, has its
    /// top-level entry in use, and a free 1 GiB below its image.
    pub fn choose(
        low: u64,
        high: u64,
        gpa: u64,
        cr3: u64,
        entry: &mut dyn FnMut(u64) -> Result<u64, String>,
    ) -> Result<Layout, String> {
        if !gpa.is_multiple_of(REGION_BYTES) {
            return Err(format!(
                "glass's region is at guest-physical {gpa:#x}, not on a 2 MiB boundary"
            ));
        }
        const REACH: i128 = 1 << 31;
        const GIB: i128 = 1 << 30;
        let (low_signed, high_signed) = (low as i64 as i128, high as i64 as i128);
        // Every base from `lowest` to `highest` has the region's whole length within a
        // jump of every function, and every function within a jump of it.
        let lowest = high_signed + 16 - REACH + REGION_BYTES as i128;
        let highest = low_signed + REACH - 2 * REGION_BYTES as i128 - 16;
        let align = |at: i128| (at + REGION_BYTES as i128 - 1) & !(REGION_BYTES as i128 - 1);
        let canonical = |at: i128| (-(1i128 << 47)..(1i128 << 47)).contains(&at);
        let mut slots = Vec::new();
        let mut slot = lowest.div_euclid(GIB) * GIB;
        while slot <= highest {
            let base = align(slot.max(lowest));
            if base <= highest && base < slot + GIB && canonical(base) {
                slots.push(base as i64 as u64);
            }
            slot += GIB;
        }
        if slots.is_empty() {
            return Err(format!(
                "the code to trace spans {low:#x}..{high:#x}, more than 2 GiB: no place for glass's region within a jump of all of it"
            ));
        }
        let table = cr3 & ADDRESS_MASK;
        let own_pdpt = (gpa + PDPT) | PRESENT_WRITABLE;
        let own_pd = (gpa + PAGE_DIRECTORY) | PRESENT_WRITABLE;
        let free = |value: u64, own: u64| value & !ACCESSED == 0 || value & !ACCESSED == own;
        // Nearest the code first: the top 2 GiB wrap to a kernel linked low.
        for &base in slots.iter().rev() {
            let index = (base >> 39) & 511;
            let entry_at = table + 8 * index;
            if free(entry(entry_at)?, own_pdpt) {
                return Ok(Layout {
                    base,
                    gpa,
                    entry_at,
                    entry: own_pdpt,
                    hang: format!("the guest's top-level page-table entry {index}"),
                    aarch64: false,
                });
            }
        }
        for &base in slots.iter().rev() {
            let top = entry(table + 8 * ((base >> 39) & 511))?;
            if top & 1 == 0 {
                continue;
            }
            let index = (base >> 30) & 511;
            let entry_at = (top & ADDRESS_MASK) + 8 * index;
            if free(entry(entry_at)?, own_pd) {
                return Ok(Layout {
                    base,
                    gpa,
                    entry_at,
                    entry: own_pd,
                    hang: format!(
                        "entry {index} of the guest's page-directory-pointer table at guest-physical {:#x}",
                        top & ADDRESS_MASK
                    ),
                    aarch64: false,
                });
            }
        }
        Err(format!(
            "the guest maps every 1 GiB within a jump of the code to trace ({low:#x}..{high:#x}): no room for glass's region"
        ))
    }

    /// An AArch64 guest's region at `base`, mapped by the block descriptor `entry` glass
    /// writes at guest-physical `entry_at` (see `super::aarch64`).
    pub fn aarch64(base: u64, gpa: u64, entry_at: u64, entry: u64, hang: String) -> Layout {
        Layout {
            base,
            gpa,
            entry_at,
            entry,
            hang,
            aarch64: true,
        }
    }

    /// The guest-physical address of the page-table entry glass sets, and its value.
    pub fn entry(&self) -> (u64, u64) {
        (self.entry_at, self.entry)
    }

    /// Whether `value`, read at [`Layout::entry`]'s address, leaves the place free for
    /// the region: empty, or glass's own of an earlier trace.
    pub fn entry_is_free(&self, value: u64) -> bool {
        if self.aarch64 {
            // Its access flag is set by glass: the entry reads back as written.
            return value == 0 || value == self.entry;
        }
        value & !ACCESSED == 0 || value & !ACCESSED == self.entry
    }

    /// That entry, in words.
    pub fn hang(&self) -> &str {
        &self.hang
    }

    /// Where the guest sees the region.
    pub fn base(&self) -> u64 {
        self.base
    }

    fn address(&self, offset: u64) -> u64 {
        self.base + offset
    }

    /// Writes into `shared` (the region's first [`IMAGE_BYTES`]: zeroes for a new
    /// region; for one used before, its first [`HEADER_BYTES`] as they are) its page tables and the
    /// trampolines, after any written before. Functions whose trampolines do not fit are
    /// left out, as skipped.
    pub fn install(
        &self,
        shared: &mut [u8],
        choice: &ModuleChoice,
        module: &std::path::Path,
        skipped: &mut Vec<crate::Skip>,
    ) -> Result<Installation, String> {
        let put = |shared: &mut [u8], offset: u64, bytes: &[u8]| {
            shared[offset as usize..offset as usize + bytes.len()].copy_from_slice(bytes);
        };
        let end_word = TRAMPOLINES_END as usize..TRAMPOLINES_END as usize + 8;
        let written = u64::from_le_bytes(shared[end_word.clone()].try_into().unwrap_or_default());
        let first = if (TRAMPOLINES..=RECORDS).contains(&written) {
            written
        } else {
            TRAMPOLINES
        };
        if !self.aarch64 {
            let pdpt_index = (self.base >> 30) & 511;
            let pd_index = (self.base >> 21) & 511;
            put(
                shared,
                PDPT + 8 * pdpt_index,
                &((self.gpa + PAGE_DIRECTORY) | PRESENT_WRITABLE).to_le_bytes(),
            );
            put(
                shared,
                PAGE_DIRECTORY + 8 * pd_index,
                &(self.gpa | PRESENT_WRITABLE | LARGE_PAGE).to_le_bytes(),
            );
        }
        let ring = Ring {
            head: self.address(HEAD),
            tail: self.address(TAIL),
            dropped: self.address(DROPPED),
            records: self.address(RECORDS),
            capacity: CAPACITY,
        };
        let mut installed = Vec::new();
        let mut patches = Vec::new();
        let mut moves = Vec::new();
        let mut at = first;
        // Builds `function`'s trampoline at the next free place and records it as
        // installed; None (and the function listed as skipped) when the region is full.
        // The trampoline of a function, x86-64's or AArch64's.
        enum Planned<'a> {
            X86(&'a glass_patch::Plan),
            Aarch64(&'a glass_patch::aarch64::Plan),
        }
        let mut place = |shared: &mut [u8],
                         function: &glass_patch::Function,
                         plan: Planned,
                         id: u16|
         -> Result<Option<(u64, glass_patch::trampoline::Moves)>, String> {
            let address = self.address(at);
            let (code, moves) = match plan {
                Planned::X86(plan) => call_trampoline::build(plan, id, address, &ring),
                // A BTI-marked image's way back must be a direct B (a far trampoline out
                // of its reach is refused); an unmarked one's may go through x16.
                Planned::Aarch64(plan) => {
                    glass_patch::aarch64_call::build(plan, id, address, &ring, choice.bti_guarded)
                }
            }
            .map_err(|e| format!("{}: {e}", function.name))?;
            if at + code.len() as u64 > RECORDS {
                skipped.push(crate::Skip {
                    module: module.display().to_string(),
                    address: function.address,
                    name: function.name.clone(),
                    reason: crate::SkipReason::Trampoline(
                        "no room left in glass's 2 MiB region".into(),
                    ),
                });
                return Ok(None);
            }
            put(shared, at, &code);
            installed.push(Installed {
                id: u32::from(id),
                module: module.display().to_string(),
                address: function.address,
                size: function.size,
                name: function.name.clone(),
                probe: crate::install::Probe::Call,
            });
            at = (at + code.len() as u64 + 15) & !15;
            Ok(Some((address, moves)))
        };
        for (id, (function, plan, _)) in choice.patchable.iter().enumerate() {
            if let Some((address, function_moves)) =
                place(shared, function, Planned::X86(plan), id as u16)?
            {
                patches.push((plan.patch_at, entry_patch(plan, address)?));
                moves.extend(function_moves);
            }
        }
        for (id, (function, plan, _)) in choice.arm_patchable.iter().enumerate() {
            if let Some((address, function_moves)) =
                place(shared, function, Planned::Aarch64(plan), id as u16)?
            {
                let words = glass_patch::aarch64::patch_words(plan, address)
                    .map_err(|e| format!("{}: {e}", function.name))?;
                patches.push((plan.patch_at, glass_patch::aarch64::to_bytes(&words)));
                moves.extend(function_moves);
            }
        }
        // Short functions: one trampoline each, whose body is the whole function; each
        // direct call, jump or conditional jump to it now goes there (its last four
        // bytes, the displacement). No vCPU can be inside those four bytes.
        let first_short = choice.patchable.len();
        for (index, (function, plan, sites)) in choice.redirected.iter().enumerate() {
            let Some((address, _)) = place(
                shared,
                function,
                Planned::X86(plan),
                (first_short + index) as u16,
            )?
            else {
                continue;
            };
            for site in sites {
                let next = site.at + u64::from(site.len);
                let displacement =
                    i32::try_from(address.wrapping_sub(next) as i64).map_err(|_| {
                        format!(
                            "{}: the call site at {:#x} cannot reach glass's region",
                            function.name, site.at
                        )
                    })?;
                patches.push((next - 4, displacement.to_le_bytes().to_vec()));
            }
        }
        let end = at.min(RECORDS);
        put(shared, TRAMPOLINES_END, &end.to_le_bytes());
        put(shared, MAGIC_AT, MAGIC);
        Ok(Installation {
            installed,
            patches,
            moves,
            trampolines: first..end,
        })
    }
}

/// Whether the region's first bytes (its first [`IMAGE_BYTES`]) are glass's: written by
/// an earlier trace.
pub fn is_glass_region(image: &[u8]) -> bool {
    image.get(MAGIC_AT as usize..MAGIC_AT as usize + 8) == Some(&MAGIC[..])
}

/// The region's bytes as glass reaches them while the guest runs: a memfd glass shares
/// with QEMU (`--vm`), QEMU's own memory (`--qmp`, `--libvirt`), or guest memory
/// through the GDB stub, with the VM stopped (`--gdb`).
pub trait RegionAccess {
    /// Writes `bytes` at `offset`.
    fn write(&self, offset: u64, bytes: &[u8]) -> Result<(), String>;
    /// Before a batch of accesses (a drain): a region reached through the stub stops
    /// the VM once for the batch.
    fn begin(&self) {}
    /// After the batch.
    fn end(&self) {}
    /// How long the drain loop sleeps when it found little.
    fn drain_every(&self) -> std::time::Duration {
        crate::DRAIN_WAKE
    }
    /// The u64 at `offset`.
    fn load(&self, offset: u64) -> u64;
    /// Stores a u64 at `offset`.
    fn store(&self, offset: u64, value: u64);
    /// `out.len()` bytes from `offset`.
    fn read(&self, offset: u64, out: &mut [u8]);
    /// Zeroes `len` bytes from `offset`.
    fn zero(&self, offset: u64, len: u64);
}

/// The region mapped into glass: a memfd shared with QEMU (`--vm`), or guest frames
/// mapped from Xen (`--xen`).
pub struct Words<'a>(pub &'a [u8]);

impl RegionAccess for Words<'_> {
    fn write(&self, offset: u64, bytes: &[u8]) -> Result<(), String> {
        for (i, chunk) in bytes.chunks(8).enumerate() {
            let mut value = word(self.0, offset + 8 * i as u64)
                .load(Ordering::Acquire)
                .to_le_bytes();
            value[..chunk.len()].copy_from_slice(chunk);
            word(self.0, offset + 8 * i as u64).store(u64::from_le_bytes(value), Ordering::Release);
        }
        // Code among the bytes (trampolines): on AArch64 the instruction cache is
        // made to see them (glass_target::host_cpu).
        if (offset as usize).saturating_add(bytes.len()) <= self.0.len() {
            // SAFETY: inside the mapping (checked), which lives as long as the borrow.
            unsafe {
                glass_target::host_cpu::written(self.0.as_ptr().add(offset as usize), bytes.len())
            };
        }
        Ok(())
    }

    fn load(&self, offset: u64) -> u64 {
        word(self.0, offset).load(Ordering::Acquire)
    }

    fn store(&self, offset: u64, value: u64) {
        word(self.0, offset).store(value, Ordering::Release);
    }

    fn read(&self, offset: u64, out: &mut [u8]) {
        // Word by word, each an atomic load: the guest writes these words meanwhile.
        for (i, chunk) in out.chunks_mut(8).enumerate() {
            let value = word(self.0, offset + 8 * i as u64).load(Ordering::Acquire);
            chunk.copy_from_slice(&value.to_le_bytes()[..chunk.len()]);
        }
    }

    fn zero(&self, offset: u64, len: u64) {
        for at in (offset..offset + len).step_by(8) {
            word(self.0, at).store(0, Ordering::Relaxed);
        }
    }
}

fn word(shared: &[u8], offset: u64) -> &AtomicU64 {
    assert!(offset.is_multiple_of(8) && offset + 8 <= shared.len() as u64);
    // SAFETY: an 8-aligned offset inside the mapping (checked), which lives as long as
    // the borrow; the guest writes the same words, atomically.
    unsafe { &*(shared.as_ptr().add(offset as usize) as *const AtomicU64) }
}

/// Reads the ring while the guest writes it: takes each published record in order,
/// zeroes it, and moves the tail on (see `glass_patch::call_trampoline`).
#[derive(Default)]
pub struct RingReader {
    tail: u64,
    /// Records reserved before this trace's patches went in (below this head) are an
    /// earlier trace's: read, to keep the ring moving, and set aside.
    earlier_until: u64,
    set_aside: u64,
    first_tsc: Option<u64>,
    dropped: u64,
    /// The drop count an earlier trace of the same region left.
    dropped_before: u64,
    batch: Vec<u8>,
}

/// The ring's head: how many records were ever reserved in the region.
pub fn ring_head(region: &dyn RegionAccess) -> u64 {
    region.load(HEAD)
}

impl RingReader {
    /// A reader that goes on where an earlier trace's left the region's ring (a new
    /// region reads 0s: from the start). `patched_at` is the ring's head when this
    /// trace's patches went in ([`ring_head`], read with the guest stopped): the records
    /// before it are an earlier trace's, which this one does not replay. They are calls
    /// that earlier trace timed after its last read: while its glass was stopped before
    /// it was killed, or before its guardian put the code back, or returning after it
    /// detached; their ids are its ids, not this trace's, and a call it was in when its
    /// patches went shows some of its callees, not all.
    pub fn resuming(region: &dyn RegionAccess, patched_at: u64) -> RingReader {
        RingReader {
            tail: region.load(TAIL),
            earlier_until: patched_at,
            dropped_before: region.load(DROPPED),
            ..RingReader::default()
        }
    }

    /// Hands every published record to `replay`; how many.
    pub fn drain(&mut self, region: &dyn RegionAccess, replay: &mut Replay) -> usize {
        region.begin();
        let taken = self.drain_held(region, replay);
        region.end();
        taken
    }

    fn drain_held(&mut self, region: &dyn RegionAccess, replay: &mut Replay) -> usize {
        let head = region.load(HEAD);
        let waiting = head.saturating_sub(self.tail).min(CAPACITY);
        let mut taken = 0u64;
        // At most two stretches: to the ring's end, then from its start.
        while taken < waiting {
            let index = (self.tail + taken) % CAPACITY;
            let count = (waiting - taken).min(CAPACITY - index);
            self.batch.resize((count * RECORD_BYTES) as usize, 0);
            region.read(RECORDS + index * RECORD_BYTES, &mut self.batch);
            let mut published = 0;
            let earlier = self.earlier_until.saturating_sub(self.tail + taken);
            for record in self.batch.chunks_exact(RECORD_BYTES as usize) {
                let tsc = u64::from_le_bytes(record[..8].try_into().unwrap_or_default());
                let word = u64::from_le_bytes(record[8..].try_into().unwrap_or_default());
                // Reserved, not yet written: the rest waits for the next turn. The batch
                // is read in address order, the time stamp before the word that
                // publishes it, so a record written between the two loads reads as its
                // word with the zero its slot was left at: also not yet (no TSC is 0).
                // Seen once in 4.5 million records under Xen: a call of 6776 s.
                if tsc == 0 {
                    break;
                }
                let Some(record) = Record::decode(tsc, word) else {
                    break;
                };
                if published < earlier {
                    self.set_aside += 1;
                } else {
                    self.first_tsc.get_or_insert(record.tsc);
                    replay.add(record);
                }
                published += 1;
            }
            region.zero(RECORDS + index * RECORD_BYTES, published * RECORD_BYTES);
            taken += published;
            if published < count {
                break;
            }
        }
        self.tail += taken;
        if taken > 0 {
            region.store(TAIL, self.tail);
        }
        self.dropped = region.load(DROPPED).saturating_sub(self.dropped_before);
        taken as usize
    }

    /// Records of an earlier trace read and not replayed (see [`RingReader::resuming`]).
    pub fn set_aside(&self) -> u64 {
        self.set_aside
    }

    /// The first record's time stamp (0 before any).
    pub fn first_tsc(&self) -> u64 {
        self.first_tsc.unwrap_or(0)
    }

    /// Records the guest dropped because the ring was full.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Page tables as a map of guest-physical address to entry.
    fn tables(entries: &[(u64, u64)]) -> impl FnMut(u64) -> Result<u64, String> + '_ {
        move |at| {
            Ok(entries
                .iter()
                .find(|(a, _)| *a == at)
                .map_or(0, |(_, v)| *v))
        }
    }

    fn reach(from: u64, to: u64) -> bool {
        (to.wrapping_sub(from + 5) as i64).unsigned_abs() < 1 << 31
    }

    /// A published record at ring index `index`: its time stamp, then its word.
    fn publish(region: &Words, index: u64, tsc: u64, slot: u64, id: u64, exit: bool) {
        let at = RECORDS + index * RECORD_BYTES;
        region.store(at, tsc);
        region.store(at + 8, slot << 16 | id << 1 | u64::from(exit));
    }

    fn events(replay: &mut Replay) -> Vec<(u32, glass_probe_abi::EventKind)> {
        let mut events = Vec::new();
        replay.take(|_, words| {
            let mut unwrap = glass_probe_abi::TscUnwrapper::new(0);
            events.extend(words.iter().map(|&w| {
                let event = unwrap.decode(w);
                (event.function, event.kind)
            }));
        });
        events
    }

    #[test]
    fn an_earlier_traces_records_are_read_and_set_aside() {
        use glass_probe_abi::EventKind::{Entry, Exit};
        let memory = vec![0u64; (REGION_BYTES / 8) as usize];
        // SAFETY: the vector's own bytes, 8-aligned, borrowed as long as it lives.
        let bytes = unsafe {
            std::slice::from_raw_parts(memory.as_ptr().cast::<u8>(), REGION_BYTES as usize)
        };
        let region = Words(bytes);
        // The earlier trace read record 0. Then, before its code went back: a call of
        // its function 3 whole, and the entry of its function 2, whose callee after the
        // code went back was not timed. This trace patched with the head at 4, then
        // timed its function 0; record 6 is reserved, not yet written.
        let (stack, deeper) = (0xffff_0000_0010_0000, 0xffff_0000_0010_0000 - 64);
        publish(&region, 1, 100, deeper, 3, false);
        publish(&region, 2, 110, deeper, 3, true);
        publish(&region, 3, 120, stack, 2, false);
        publish(&region, 4, 200, deeper, 0, false);
        publish(&region, 5, 210, deeper, 0, true);
        region.store(TAIL, 1);
        region.store(HEAD, 7);
        let mut reader = RingReader::resuming(&region, 4);
        let mut replay = Replay::default();
        assert_eq!(reader.drain(&region, &mut replay), 5);
        assert_eq!(reader.set_aside(), 3);
        assert_eq!(reader.first_tsc(), 200);
        assert_eq!(events(&mut replay), [(0, Entry), (0, Exit)]);
        assert_eq!(region.load(TAIL), 6);
        for index in 1..6 {
            let at = RECORDS + index * RECORD_BYTES;
            assert_eq!((region.load(at), region.load(at + 8)), (0, 0));
        }
        // The earlier trace's call returns now, after this trace's own records: an exit
        // this trace never saw enter, not replayed.
        publish(&region, 6, 220, stack, 2, true);
        assert_eq!(reader.drain(&region, &mut replay), 1);
        assert_eq!(replay.unmatched_exits, 1);
        assert!(events(&mut replay).is_empty());
    }

    #[test]
    fn the_region_goes_where_every_function_reaches_it() {
        let cr3 = 0x1000;
        // The kernel's own top-level entry, 0, is in use.
        let kernel = [(cr3, 0x2003)];
        let layout =
            Layout::choose(0x10_0000, 0x10_4000, 1 << 32, cr3, &mut tables(&kernel)).unwrap();
        // A kernel linked low: the top-level entry 511, wrapped around.
        assert_eq!(layout.base % REGION_BYTES, 0);
        assert!(layout.base >= 0xffff_ffff_8000_0000);
        assert_eq!(
            layout.entry(),
            (cr3 + 8 * 511, (1 << 32) | PRESENT_WRITABLE)
        );
        for function in [0x10_0000, 0x10_4000] {
            assert!(reach(function, layout.base));
            assert!(reach(function, layout.base + REGION_BYTES - 1));
        }
        assert!(
            Layout::choose(0x10_0000, 0x1_7ff0_0000, 1 << 32, cr3, &mut tables(&kernel)).is_err()
        );
        assert!(Layout::choose(
            0x10_0000,
            0x10_4000,
            (1 << 32) + 4096,
            cr3,
            &mut tables(&[])
        )
        .is_err());
    }

    #[test]
    fn a_kernel_linked_high_gets_the_region_in_its_own_top_table() {
        // As the Xen PVH demo maps itself: top-level entry 511 to a table whose entries
        // 510 and 511 map the image's 2 GiB.
        let (cr3, pdpt) = (0x1000, 0x5000);
        let entries = [
            (cr3 + 8 * 511, pdpt | 3),
            (pdpt + 8 * 510, 0x6000 | 3),
            (pdpt + 8 * 511, 0x7000 | 3),
        ];
        let (low, high) = (0xffff_ffff_8010_0000, 0xffff_ffff_8012_0000);
        let layout = Layout::choose(low, high, 1 << 32, cr3, &mut tables(&entries)).unwrap();
        assert_eq!(layout.entry().0, pdpt + 8 * 509);
        assert_eq!(
            layout.entry().1,
            ((1 << 32) + PAGE_DIRECTORY) | PRESENT_WRITABLE
        );
        for function in [low, high] {
            assert!(reach(function, layout.base));
            assert!(reach(function, layout.base + REGION_BYTES - 1));
        }
        // Its own entry of an earlier trace, accessed since, is still free for it.
        let mut again = entries.to_vec();
        again.push((pdpt + 8 * 509, layout.entry().1 | ACCESSED));
        let reused = Layout::choose(low, high, 1 << 32, cr3, &mut tables(&again)).unwrap();
        assert_eq!(reused.entry(), layout.entry());
        // Every slot in reach mapped: refused.
        let mut full = entries.to_vec();
        full.extend((0..510).map(|i| (pdpt + 8 * i, 0x9000 | 3)));
        assert!(Layout::choose(low, high, 1 << 32, cr3, &mut tables(&full)).is_err());
    }
}
