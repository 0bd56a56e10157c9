//! The region glass adds to a guest: where it sits in the guest's address space, what is
//! in it, and the ring glass reads from it while the guest runs.
//!
//! ```text
//! region (2 MiB at guest-physical 4 GiB, one 2 MiB page of the guest's page tables)
//!   0x0000   page-directory-pointer table: one entry, to the page directory
//!   0x1000   page directory: one 2 MiB entry, the region itself
//!   0x2000   ring: head, tail, dropped (u64 each)
//!   0x3000   trampolines
//!   0x100000 records: 65536 of 16 bytes
//! ```
//!
//! The guest reaches it through top-level entry 511 (the top 512 GiB), which must be
//! empty, at the highest 2 MiB-aligned address from which every patched function is
//! within a `jmp rel32` (2 GiB): from a kernel linked in the low 2 GiB, addresses wrap
//! around to the top one. The guest runs the trampolines at ring 0 (supervisor pages,
//! executable).

use std::sync::atomic::{AtomicU64, Ordering};

use glass_patch::call_trampoline::{self, Record, Ring, RECORD_BYTES};
use glass_patch::trampoline::entry_patch;

use super::replay::Replay;
use super::REGION_GPA;
use crate::install::Installed;
use crate::select::ModuleChoice;

pub const REGION_BYTES: u64 = 2 << 20;
const PDPT: u64 = 0x0;
const PAGE_DIRECTORY: u64 = 0x1000;
const HEAD: u64 = 0x2000;
const TAIL: u64 = 0x2008;
const DROPPED: u64 = 0x2010;
const TRAMPOLINES: u64 = 0x3000;
const RECORDS: u64 = 0x10_0000;
const CAPACITY: u64 = (REGION_BYTES - RECORDS) / RECORD_BYTES;

/// Present, writable; a 2 MiB page.
const PRESENT_WRITABLE: u64 = 0x3;
const LARGE_PAGE: u64 = 0x80;

/// The top-level entry the region hangs from.
const TOP_INDEX: u64 = 511;

/// Where the region is in the guest's virtual address space.
pub struct Layout {
    /// Its first byte, as the guest addresses it.
    base: u64,
}

impl Layout {
    /// The region's place for code at `low..high`, or why there is none.
    pub fn choose(low: u64, high: u64) -> Result<Layout, String> {
        const REACH: i64 = 1 << 31;
        if (low as i64) < 0 || (high as i64) < 0 {
            return Err(format!(
                "the code to trace is in the top half of the guest's address space ({low:#x}): glass's region cannot go there yet (a kernel linked high, as Linux is)"
            ));
        }
        // The lowest 2 MiB-aligned base (below 0, wrapped) that `high` still reaches,
        // with the region's whole length in reach too.
        let lowest = high as i64 + 16 - REACH + REGION_BYTES as i64;
        let base = (lowest + (REGION_BYTES as i64 - 1)) & !(REGION_BYTES as i64 - 1);
        if base > -(REGION_BYTES as i64) {
            return Err(format!(
                "the code to trace reaches {high:#x}, more than 2 GiB above 0: no place for glass's region within a jump of it"
            ));
        }
        Ok(Layout { base: base as u64 })
    }

    /// The guest's top-level page-table entry glass sets, by index.
    pub fn top_index(&self) -> u64 {
        TOP_INDEX
    }

    /// The value of that entry: the region's page-directory-pointer table.
    pub fn top_entry(&self) -> u64 {
        (REGION_GPA + PDPT) | PRESENT_WRITABLE
    }

    fn address(&self, offset: u64) -> u64 {
        self.base + offset
    }

    /// Writes the region (page tables, an empty ring, the trampolines) into `shared`;
    /// what is installed, the entry jumps to write (address, bytes), and where a vCPU
    /// stopped inside the bytes they replace goes.
    #[allow(clippy::type_complexity)]
    pub fn install(
        &self,
        shared: &mut [u8],
        choice: &ModuleChoice,
        module: &std::path::Path,
    ) -> Result<(Vec<Installed>, Vec<(u64, Vec<u8>)>, Vec<(u64, u64)>), String> {
        let put = |shared: &mut [u8], offset: u64, bytes: &[u8]| {
            shared[offset as usize..offset as usize + bytes.len()].copy_from_slice(bytes);
        };
        shared[..RECORDS as usize].fill(0);
        let pdpt_index = (self.base >> 30) & 511;
        let pd_index = (self.base >> 21) & 511;
        put(
            shared,
            PDPT + 8 * pdpt_index,
            &((REGION_GPA + PAGE_DIRECTORY) | PRESENT_WRITABLE).to_le_bytes(),
        );
        put(
            shared,
            PAGE_DIRECTORY + 8 * pd_index,
            &(REGION_GPA | PRESENT_WRITABLE | LARGE_PAGE).to_le_bytes(),
        );
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
        let mut at = TRAMPOLINES;
        for (id, (function, plan, _)) in choice.patchable.iter().enumerate() {
            let address = self.address(at);
            let (code, function_moves) = call_trampoline::build(plan, id as u16, address, &ring)
                .map_err(|e| format!("{}: {e}", function.name))?;
            if at + code.len() as u64 > RECORDS {
                break;
            }
            put(shared, at, &code);
            patches.push((plan.patch_at, entry_patch(plan, address)?));
            moves.extend(function_moves);
            installed.push(Installed {
                id: id as u32,
                module: module.display().to_string(),
                address: function.address,
                size: function.size,
                name: function.name.clone(),
            });
            at = (at + code.len() as u64 + 15) & !15;
        }
        Ok((installed, patches, moves))
    }
}

/// Reads the ring while the guest writes it: takes each published record in order,
/// zeroes its word, and moves the tail on (see `glass_patch::call_trampoline`).
#[derive(Default)]
pub struct RingReader {
    tail: u64,
    first_tsc: Option<u64>,
    dropped: u64,
}

impl RingReader {
    /// Hands every published record to `replay`; how many.
    pub fn drain(&mut self, shared: &memmap2::MmapMut, replay: &mut Replay) -> usize {
        let word = |offset: u64| -> &AtomicU64 {
            // SAFETY: 8-aligned offsets inside the mapping, which lives as long as
            // `shared`; the guest writes the same words, atomically.
            unsafe { &*(shared.as_ptr().add(offset as usize) as *const AtomicU64) }
        };
        let head = word(HEAD).load(Ordering::Acquire);
        let mut taken = 0;
        while self.tail < head {
            let at = RECORDS + (self.tail % CAPACITY) * RECORD_BYTES;
            let Some(record) = Record::decode(
                word(at).load(Ordering::Relaxed),
                word(at + 8).load(Ordering::Acquire),
            ) else {
                // Reserved, not yet written.
                break;
            };
            self.first_tsc.get_or_insert(record.tsc);
            replay.add(record);
            word(at + 8).store(0, Ordering::Relaxed);
            self.tail += 1;
            word(TAIL).store(self.tail, Ordering::Release);
            taken += 1;
        }
        self.dropped = word(DROPPED).load(Ordering::Relaxed);
        taken
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

    #[test]
    fn the_region_goes_where_every_function_reaches_it() {
        let layout = Layout::choose(0x10_0000, 0x10_4000).unwrap();
        // Just reachable from the highest function, 2 MiB-aligned, in the top 2 GiB.
        assert_eq!(layout.base % REGION_BYTES, 0);
        assert!(layout.base >= 0xffff_ffff_8000_0000);
        let reach =
            |from: u64, to: u64| (to.wrapping_sub(from + 5) as i64).unsigned_abs() < 1 << 31;
        for function in [0x10_0000, 0x10_4000] {
            assert!(reach(function, layout.base));
            assert!(reach(function, layout.base + REGION_BYTES - 1));
        }
        assert!(Layout::choose(0xffff_ffff_8100_0000, 0xffff_ffff_8200_0000).is_err());
        assert!(Layout::choose(0x10_0000, 0x7ff0_0000).is_err());
    }
}
