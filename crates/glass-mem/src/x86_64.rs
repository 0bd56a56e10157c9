//! The x86-64 page-table walk: 4-level and 5-level (LA57) paging, 4 KiB, 2 MiB and
//! 1 GiB pages, from a guest's CR3, done by glass in mapped guest RAM.
//!
//! The translation cache is keyed by (page-table root, virtual page). A hit is verified
//! with one read: the cached leaf entry is read again and must hold the same value, so
//! a page the guest remapped is walked afresh instead of silently giving a wrong stack.

use std::collections::HashMap;

use crate::ram::PhysicalMemory;

const PRESENT: u64 = 1;
const PAGE_SIZE_BIT: u64 = 1 << 7;
/// Physical address bits of an entry (bits 12..51).
const ADDRESS_MASK: u64 = 0x000f_ffff_ffff_f000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PagingMode {
    FourLevel,
    /// CR4.LA57: 57-bit virtual addresses, a fifth level.
    FiveLevel,
}

impl PagingMode {
    /// From CR4 (bit 12 is LA57).
    pub fn from_cr4(cr4: u64) -> Self {
        if cr4 & (1 << 12) != 0 {
            PagingMode::FiveLevel
        } else {
            PagingMode::FourLevel
        }
    }

    fn levels(self) -> u32 {
        match self {
            PagingMode::FourLevel => 4,
            PagingMode::FiveLevel => 5,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WalkError {
    /// The entry at this level (5 = PML5 ... 1 = PT) is not present.
    NotPresent { level: u32 },
    /// A page-size bit where the architecture reserves it (PML5E/PML4E).
    Reserved { level: u32 },
    /// A table or the page lies outside guest RAM.
    OutsideRam,
    /// Not a canonical address for the paging mode.
    NonCanonical,
}

/// A guest-virtual address's physical page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Translation {
    /// Physical address of `vaddr` itself.
    pub physical: u64,
    /// Size of the page it lies in (4 KiB, 2 MiB or 1 GiB).
    pub page_size: u64,
    /// Where the leaf entry lives and what it held, for verification.
    leaf_entry_address: u64,
    leaf_entry: u64,
}

/// Walks the tables rooted at `cr3` for `vaddr`.
pub fn translate(
    memory: &dyn PhysicalMemory,
    cr3: u64,
    mode: PagingMode,
    vaddr: u64,
) -> Result<Translation, WalkError> {
    let virtual_bits = if mode == PagingMode::FiveLevel {
        57
    } else {
        48
    };
    let sign = (vaddr as i64) >> (virtual_bits - 1);
    if sign != 0 && sign != -1 {
        return Err(WalkError::NonCanonical);
    }
    let mut table = cr3 & ADDRESS_MASK;
    for level in (1..=mode.levels()).rev() {
        let index = (vaddr >> (12 + 9 * (level - 1))) & 0x1ff;
        let entry_address = table + index * 8;
        let entry = memory
            .read_u64(entry_address)
            .ok_or(WalkError::OutsideRam)?;
        if entry & PRESENT == 0 {
            return Err(WalkError::NotPresent { level });
        }
        let large = entry & PAGE_SIZE_BIT != 0;
        if large && level >= 4 {
            return Err(WalkError::Reserved { level });
        }
        if large && level >= 2 || level == 1 {
            let page_size = 1u64 << (12 + 9 * (level - 1));
            let base = entry & ADDRESS_MASK & !(page_size - 1);
            return Ok(Translation {
                physical: base | (vaddr & (page_size - 1)),
                page_size,
                leaf_entry_address: entry_address,
                leaf_entry: entry,
            });
        }
        table = entry & ADDRESS_MASK;
    }
    unreachable!("level 1 always returns")
}

/// Remembers translations per (root, 4 KiB virtual page).
#[derive(Default)]
pub struct TranslationCache {
    entries: HashMap<(u64, u64), Translation>,
    /// Off: every translation walks the tables (to measure what the cache saves).
    disabled: bool,
    pub hits: u64,
    pub misses: u64,
    /// Hits whose leaf entry had changed: walked again.
    pub stale: u64,
}

/// Entries kept before the cache is cleared (guests touch few stack pages; this only
/// bounds memory when a guest switches among many address spaces).
const CACHE_LIMIT: usize = 65_536;

impl TranslationCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// A cache that never remembers: every translation is a full walk.
    pub fn disabled() -> Self {
        TranslationCache {
            disabled: true,
            ..Self::default()
        }
    }

    pub fn translate(
        &mut self,
        memory: &dyn PhysicalMemory,
        cr3: u64,
        mode: PagingMode,
        vaddr: u64,
    ) -> Result<u64, WalkError> {
        let root = cr3 & ADDRESS_MASK;
        let key = (root, vaddr >> 12);
        if let Some(cached) = self.entries.get(&key) {
            // Verify: the leaf entry must still say the same.
            if memory.read_u64(cached.leaf_entry_address) == Some(cached.leaf_entry) {
                self.hits += 1;
                let offset_mask = cached.page_size - 1;
                return Ok((cached.physical & !offset_mask) | (vaddr & offset_mask));
            }
            self.stale += 1;
            self.entries.remove(&key);
        }
        self.misses += 1;
        let translation = translate(memory, cr3, mode, vaddr)?;
        if self.disabled {
            return Ok(translation.physical);
        }
        if self.entries.len() >= CACHE_LIMIT {
            self.entries.clear();
        }
        self.entries.insert(key, translation);
        Ok(translation.physical)
    }

    /// Copies guest-virtual memory, page by page; returns how many bytes from `vaddr`
    /// could be read (a short count stops at the first unmapped page).
    pub fn read_virtual(
        &mut self,
        memory: &dyn PhysicalMemory,
        cr3: u64,
        mode: PagingMode,
        vaddr: u64,
        buf: &mut [u8],
    ) -> usize {
        let mut done = 0;
        while done < buf.len() {
            let address = vaddr.wrapping_add(done as u64);
            let in_page = (4096 - (address & 4095)) as usize;
            let n = in_page.min(buf.len() - done);
            let Ok(physical) = self.translate(memory, cr3, mode, address) else {
                break;
            };
            if !memory.read_physical(physical, &mut buf[done..done + n]) {
                break;
            }
            done += n;
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ram::{GuestRam, RamRegion};

    const RAM: usize = 16 << 20;

    /// Hand-built page tables in a 16 MiB RAM image.
    struct Tables {
        ram: Vec<u8>,
        next_table: u64,
    }

    impl Tables {
        fn new() -> Self {
            Tables {
                ram: vec![0; RAM],
                next_table: 0x10_0000,
            }
        }
        fn table(&mut self) -> u64 {
            let at = self.next_table;
            self.next_table += 4096;
            at
        }
        fn set(&mut self, table: u64, index: u64, entry: u64) {
            let at = (table + index * 8) as usize;
            self.ram[at..at + 8].copy_from_slice(&entry.to_le_bytes());
        }
        fn memory(&self) -> GuestRam {
            GuestRam::from_bytes(
                self.ram.clone(),
                vec![RamRegion {
                    guest_physical: 0,
                    len: RAM as u64,
                    file_offset: 0,
                }],
            )
        }
    }

    fn index(vaddr: u64, level: u32) -> u64 {
        (vaddr >> (12 + 9 * (level - 1))) & 0x1ff
    }

    /// Maps `vaddr` through a chain of new tables down to `leaf_level`, whose entry is
    /// `leaf` (physical base | flags). Returns the root.
    fn map(t: &mut Tables, root: u64, levels: u32, vaddr: u64, leaf_level: u32, leaf: u64) {
        let mut table = root;
        for level in (leaf_level + 1..=levels).rev() {
            let at = (table + index(vaddr, level) * 8) as usize;
            let existing = u64::from_le_bytes(t.ram[at..at + 8].try_into().unwrap());
            table = if existing & PRESENT != 0 {
                existing & ADDRESS_MASK
            } else {
                let next = t.table();
                t.set(table, index(vaddr, level), next | 3);
                next
            };
        }
        t.set(table, index(vaddr, leaf_level), leaf);
    }

    #[test]
    fn four_level_with_4k_2m_and_1g_pages() {
        let mut t = Tables::new();
        let root = t.table();
        let small = 0xffff_8000_0040_3000u64;
        map(&mut t, root, 4, small, 1, 0x20_5000 | 3);
        let big = 0x0000_7f00_0060_0000u64;
        map(&mut t, root, 4, big, 2, 0x40_0000 | 3 | PAGE_SIZE_BIT);
        let huge = 0x0000_0080_0000_0000u64;
        map(&mut t, root, 4, huge, 3, PRESENT | 2 | PAGE_SIZE_BIT);
        let memory = t.memory();
        let m = PagingMode::FourLevel;
        assert_eq!(
            translate(&memory, root, m, small + 0x123).unwrap().physical,
            0x20_5123
        );
        let two = translate(&memory, root, m, big + 0x1_2345).unwrap();
        assert_eq!((two.physical, two.page_size), (0x41_2345, 2 << 20));
        let one = translate(&memory, root, m, huge + 0xab_cdef).unwrap();
        assert_eq!((one.physical, one.page_size), (0xab_cdef, 1 << 30));
        // Reading through the cache across a page boundary into an unmapped page.
        let mut cache = TranslationCache::new();
        let mut buf = [0u8; 64];
        assert_eq!(
            cache.read_virtual(&memory, root, m, small + 4096 - 16, &mut buf),
            16
        );
    }

    #[test]
    fn five_level_paging() {
        let mut t = Tables::new();
        let root = t.table();
        let vaddr = 0x00ff_ff00_1234_5000u64 | (0x1fu64 << 48);
        let vaddr = vaddr & 0x00ff_ffff_ffff_ffff; // canonical for 57 bits (bit 56 clear)
        map(&mut t, root, 5, vaddr, 1, 0x30_0000 | 3);
        let memory = t.memory();
        assert_eq!(
            translate(&memory, root, PagingMode::FiveLevel, vaddr + 8)
                .unwrap()
                .physical,
            0x30_0008
        );
        assert_eq!(PagingMode::from_cr4(1 << 12), PagingMode::FiveLevel);
        // The same tables read as 4-level give something else (or nothing): the mode matters.
        assert_ne!(
            translate(
                &memory,
                root,
                PagingMode::FourLevel,
                vaddr & 0xffff_ffff_ffff
            )
            .ok()
            .map(|t| t.physical),
            Some(0x30_0008)
        );
    }

    #[test]
    fn non_present_reserved_and_non_canonical() {
        let mut t = Tables::new();
        let root = t.table();
        let vaddr = 0x4000_0000u64;
        map(&mut t, root, 4, vaddr, 1, 0x50_0000 | 3);
        let memory = t.memory();
        let m = PagingMode::FourLevel;
        assert_eq!(
            translate(&memory, root, m, vaddr + 4096),
            Err(WalkError::NotPresent { level: 1 })
        );
        assert_eq!(
            translate(&memory, root, m, 0x7f00_0000_0000),
            Err(WalkError::NotPresent { level: 4 })
        );
        assert_eq!(
            translate(&memory, root, m, 0x0000_8000_0000_0000),
            Err(WalkError::NonCanonical)
        );
        // A page-size bit in a PML4 entry is reserved.
        let mut t2 = Tables::new();
        let root2 = t2.table();
        t2.set(root2, 0, 0x20_0000 | 3 | PAGE_SIZE_BIT);
        assert_eq!(
            translate(&t2.memory(), root2, m, 0x1000),
            Err(WalkError::Reserved { level: 4 })
        );
        // A table pointer past the end of RAM.
        let mut t3 = Tables::new();
        let root3 = t3.table();
        t3.set(root3, 0, 0x4000_0000 | 3);
        assert_eq!(
            translate(&t3.memory(), root3, m, 0x1000),
            Err(WalkError::OutsideRam)
        );
    }

    #[test]
    fn the_cache_is_keyed_by_root_and_verified() {
        let mut t = Tables::new();
        let root_a = t.table();
        let root_b = t.table();
        let vaddr = 0x7fff_f000_0000u64;
        map(&mut t, root_a, 4, vaddr, 1, 0x60_0000 | 3);
        map(&mut t, root_b, 4, vaddr, 1, 0x70_0000 | 3);
        let m = PagingMode::FourLevel;
        let mut cache = TranslationCache::new();
        let memory = t.memory();
        assert_eq!(
            cache.translate(&memory, root_a, m, vaddr + 8),
            Ok(0x60_0008)
        );
        assert_eq!(
            cache.translate(&memory, root_a, m, vaddr + 16),
            Ok(0x60_0010)
        );
        assert_eq!((cache.hits, cache.misses), (1, 1));
        // Another root (another address space): its own translation, not the cached one.
        assert_eq!(cache.translate(&memory, root_b, m, vaddr), Ok(0x70_0000));
        // The guest remaps the page under the same root: the hit is detected as stale.
        let mut remapped = Tables {
            ram: t.ram.clone(),
            next_table: t.next_table,
        };
        map(&mut remapped, root_a, 4, vaddr, 1, 0x68_0000 | 3);
        let memory = remapped.memory();
        assert_eq!(
            cache.translate(&memory, root_a, m, vaddr + 8),
            Ok(0x68_0008)
        );
        assert_eq!(cache.stale, 1);
    }
}
