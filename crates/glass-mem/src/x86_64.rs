//! The x86-64 page-table walk: 4-level and 5-level (LA57) paging, 4 KiB, 2 MiB and
//! 1 GiB pages, from a guest's CR3.
//!
//! glass walks the guest's tables itself, in mapped guest RAM, because asking the VMM
//! to translate costs a GDB stub round trip per read while the guest is stopped, where
//! a walk is a few memory reads (and a cached one, one; see the crate's comment).

use crate::ram::PhysicalMemory;
use crate::walk::{LeafEntry, PageWalk, Translation, WalkError};

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

/// An x86-64 vCPU's paging: CR3 and whether CR4.LA57 is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct X86Paging {
    pub cr3: u64,
    pub mode: PagingMode,
}

impl PageWalk for X86Paging {
    fn walk(&self, memory: &dyn PhysicalMemory, vaddr: u64) -> Result<Translation, WalkError> {
        translate(memory, self.cr3, self.mode, vaddr)
    }

    /// CR3's table address: PCID (bits 11:0) left out, since a walk does not use it.
    fn cache_root(&self, _vaddr: u64) -> u64 {
        self.cr3 & ADDRESS_MASK
    }

    fn page_granule(&self) -> u64 {
        4096
    }
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
                leaf: Some(LeafEntry {
                    address: entry_address,
                    value: entry,
                }),
            });
        }
        table = entry & ADDRESS_MASK;
    }
    unreachable!("level 1 always returns")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::TranslationCache;
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

    #[test]
    fn the_generic_walk_is_this_walk() {
        let mut t = Tables::new();
        let root = t.table();
        let vaddr = 0xffff_8000_0040_3000u64;
        map(&mut t, root, 4, vaddr, 1, 0x20_5000 | 3);
        let memory = t.memory();
        // PCID 5 in CR3's low bits: not part of the root.
        let paging = crate::GuestPaging::from(X86Paging {
            cr3: root | 5,
            mode: PagingMode::FourLevel,
        });
        assert_eq!(paging.walk(&memory, vaddr + 8).unwrap().physical, 0x20_5008);
        assert_eq!(
            (paging.cache_root(vaddr), paging.page_granule()),
            (root, 4096)
        );
        // The old x86 signatures and the generic ones share entries.
        let mut cache = TranslationCache::new();
        assert_eq!(
            cache.translate_with(&memory, &paging, vaddr + 8),
            Ok(0x20_5008)
        );
        assert_eq!(
            cache.translate(&memory, root, PagingMode::FourLevel, vaddr + 16),
            Ok(0x20_5010)
        );
        assert_eq!((cache.hits, cache.misses), (1, 1));
    }
}
