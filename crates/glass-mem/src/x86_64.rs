//! The x86 page-table walk, in whichever mode the vCPU's CR0, CR4 and EFER say: paging
//! off (linear = physical, 32-bit), 32-bit 2-level paging (4 KiB pages, 4 MiB with
//! CR4.PSE), PAE 3-level (2 MiB pages), and long mode's 4-level and 5-level (LA57)
//! paging (2 MiB and 1 GiB pages), from a guest's CR3.
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

/// Physical address bits of a PAE PDPTE, PDE or PTE (bits 12..51, as in long mode).
const PAE_ADDRESS_MASK: u64 = ADDRESS_MASK;
/// CR0.PG: paging on.
const CR0_PG: u64 = 1 << 31;
/// CR4.PSE: 4 MiB pages in 32-bit paging.
const CR4_PSE: u64 = 1 << 4;
/// CR4.PAE: 64-bit entries, the 4-entry PDPT.
const CR4_PAE: u64 = 1 << 5;
/// CR4.LA57: a fifth level in long mode.
const CR4_LA57: u64 = 1 << 12;
/// EFER.LMA: long mode active.
const EFER_LMA: u64 = 1 << 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PagingMode {
    /// CR0.PG clear (protected mode without paging): linear addresses are physical,
    /// 32 bits wide.
    Off,
    /// 32-bit paging (CR0.PG, no CR4.PAE): a page directory and page tables of 4-byte
    /// entries; `pse` (CR4.PSE) allows 4 MiB pages.
    TwoLevel {
        pse: bool,
    },
    /// PAE paging outside long mode: CR3 points at a 4-entry PDPT, then 8-byte entries.
    Pae,
    FourLevel,
    /// CR4.LA57: 57-bit virtual addresses, a fifth level.
    FiveLevel,
}

impl PagingMode {
    /// Long mode's, from CR4 (bit 12 is LA57).
    pub fn from_cr4(cr4: u64) -> Self {
        if cr4 & CR4_LA57 != 0 {
            PagingMode::FiveLevel
        } else {
            PagingMode::FourLevel
        }
    }

    /// As the processor decides it: EFER.LMA long mode (which implies CR0.PG), else
    /// CR0.PG off, else CR4.PAE.
    pub fn from_registers(cr0: u64, cr4: u64, efer: u64) -> Self {
        if efer & EFER_LMA != 0 {
            PagingMode::from_cr4(cr4)
        } else if cr0 & CR0_PG == 0 {
            PagingMode::Off
        } else if cr4 & CR4_PAE != 0 {
            PagingMode::Pae
        } else {
            PagingMode::TwoLevel {
                pse: cr4 & CR4_PSE != 0,
            }
        }
    }

    fn levels(self) -> u32 {
        match self {
            PagingMode::FiveLevel => 5,
            _ => 4,
        }
    }
}

/// An x86 vCPU's paging: CR3 and the mode its control registers select.
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
    /// Paging off has no table: 1, which no table address is.
    fn cache_root(&self, _vaddr: u64) -> u64 {
        match self.mode {
            PagingMode::Off => 1,
            PagingMode::TwoLevel { .. } => self.cr3 & 0xffff_f000,
            PagingMode::Pae => self.cr3 & 0xffff_ffe0,
            PagingMode::FourLevel | PagingMode::FiveLevel => self.cr3 & ADDRESS_MASK,
        }
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
    match mode {
        PagingMode::Off => {
            if vaddr >> 32 != 0 {
                return Err(WalkError::NonCanonical);
            }
            // Nothing walked, so nothing for the cache to verify.
            return Ok(Translation {
                physical: vaddr,
                page_size: 4096,
                leaf: None,
            });
        }
        PagingMode::TwoLevel { pse } => return translate_two_level(memory, cr3, pse, vaddr),
        PagingMode::Pae => return translate_pae(memory, cr3, vaddr),
        PagingMode::FourLevel | PagingMode::FiveLevel => {}
    }
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
            return Ok(leaf(entry_address, entry, base, page_size, vaddr));
        }
        table = entry & ADDRESS_MASK;
    }
    unreachable!("level 1 always returns")
}

/// A leaf found at `entry_address` (`entry` as walked) mapping a page of `page_size`
/// at `base`.
fn leaf(entry_address: u64, entry: u64, base: u64, page_size: u64, vaddr: u64) -> Translation {
    Translation {
        physical: base | (vaddr & (page_size - 1)),
        page_size,
        leaf: Some(LeafEntry {
            address: entry_address,
            value: entry,
        }),
    }
}

/// The 8 bytes at `address`, an entry of `level` that must be present.
fn present_entry(memory: &dyn PhysicalMemory, address: u64, level: u32) -> Result<u64, WalkError> {
    let entry = memory.read_u64(address).ok_or(WalkError::OutsideRam)?;
    if entry & PRESENT == 0 {
        return Err(WalkError::NotPresent { level });
    }
    Ok(entry)
}

/// 32-bit paging: levels 2 (the page directory) and 1 (a page table), 4-byte entries.
/// Entries are read as 8 bytes (the next entry in the upper half), so that the cache's
/// verification, which reads 8 bytes, compares the same word; a change in the
/// neighbour only costs a fresh walk.
fn translate_two_level(
    memory: &dyn PhysicalMemory,
    cr3: u64,
    pse: bool,
    vaddr: u64,
) -> Result<Translation, WalkError> {
    if vaddr >> 32 != 0 {
        return Err(WalkError::NonCanonical);
    }
    let pde_address = (cr3 & 0xffff_f000) + ((vaddr >> 22) & 0x3ff) * 4;
    let pde_word = present_entry(memory, pde_address, 2)?;
    let pde = pde_word & 0xffff_ffff;
    if pse && pde & PAGE_SIZE_BIT != 0 {
        // PSE-36: PDE bits 20:13 are physical bits 39:32.
        let base = (pde & 0xffc0_0000) | ((pde >> 13) & 0xff) << 32;
        return Ok(leaf(pde_address, pde_word, base, 4 << 20, vaddr));
    }
    let pte_address = (pde & 0xffff_f000) + ((vaddr >> 12) & 0x3ff) * 4;
    let pte_word = present_entry(memory, pte_address, 1)?;
    let pte = pte_word & 0xffff_ffff;
    Ok(leaf(pte_address, pte_word, pte & 0xffff_f000, 4096, vaddr))
}

/// PAE paging outside long mode: level 3 (the 4-entry PDPT at CR3 bits 31:5), 2 (a
/// page directory, 2 MiB pages) and 1. The processor loads the PDPTEs when CR3 is
/// written; glass reads them from memory, which differs only if the guest changed
/// its PDPT without reloading CR3.
fn translate_pae(
    memory: &dyn PhysicalMemory,
    cr3: u64,
    vaddr: u64,
) -> Result<Translation, WalkError> {
    if vaddr >> 32 != 0 {
        return Err(WalkError::NonCanonical);
    }
    let pdpte_address = (cr3 & 0xffff_ffe0) + ((vaddr >> 30) & 3) * 8;
    let pdpte = present_entry(memory, pdpte_address, 3)?;
    let pde_address = (pdpte & PAE_ADDRESS_MASK) + ((vaddr >> 21) & 0x1ff) * 8;
    let pde = present_entry(memory, pde_address, 2)?;
    if pde & PAGE_SIZE_BIT != 0 {
        let base = pde & PAE_ADDRESS_MASK & !((2 << 20) - 1);
        return Ok(leaf(pde_address, pde, base, 2 << 20, vaddr));
    }
    let pte_address = (pde & PAE_ADDRESS_MASK) + ((vaddr >> 12) & 0x1ff) * 8;
    let pte = present_entry(memory, pte_address, 1)?;
    Ok(leaf(pte_address, pte, pte & PAE_ADDRESS_MASK, 4096, vaddr))
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
    fn a_word_reader_reads_words_across_pages_and_stops_at_an_unmapped_one() {
        let mut t = Tables::new();
        let root = t.table();
        let stack = 0xffff_8000_0070_0000u64;
        // Two virtual pages, physically apart and in reverse order.
        map(&mut t, root, 4, stack, 1, 0x30_1000 | 3);
        map(&mut t, root, 4, stack + 4096, 1, 0x30_0000 | 3);
        let put = |t: &mut Tables, physical: usize, value: u64| {
            t.ram[physical..physical + 8].copy_from_slice(&value.to_le_bytes())
        };
        put(&mut t, 0x30_1000 + 0x10, 0x1111);
        put(&mut t, 0x30_0000 + 0x8, 0x2222);
        // A word across the boundary: 4 bytes at the end of each page.
        t.ram[0x30_1ffc..0x30_2000].copy_from_slice(&[1, 2, 3, 4]);
        t.ram[0x30_0000..0x30_0004].copy_from_slice(&[5, 6, 7, 8]);
        let memory = t.memory();
        let paging = X86Paging {
            cr3: root,
            mode: PagingMode::FourLevel,
        };
        let mut cache = TranslationCache::new();
        let mut reader = crate::WordReader::new(&memory, &mut cache, &paging);
        assert_eq!(reader.word(stack + 0x10), Some(0x1111));
        assert_eq!(reader.word(stack + 4096 + 8), Some(0x2222));
        assert_eq!(
            reader.word(stack + 4096 - 4),
            Some(u64::from_le_bytes([1, 2, 3, 4, 5, 6, 7, 8]))
        );
        assert_eq!(reader.word(stack + 2 * 4096), None, "an unmapped page");
        assert_eq!(reader.word(stack + 0x10), Some(0x1111));
        assert_eq!(reader.words, 5);
    }

    /// RAM the test changes while a reader's cache remembers pointers into it.
    struct SharedRam(std::cell::RefCell<Vec<u8>>);

    impl crate::PhysicalMemory for SharedRam {
        fn read_physical(&self, address: u64, buf: &mut [u8]) -> bool {
            let ram = self.0.borrow();
            match ram.get(address as usize..address as usize + buf.len()) {
                Some(bytes) => {
                    buf.copy_from_slice(bytes);
                    true
                }
                None => false,
            }
        }

        fn page_pointer(&self, physical: u64) -> Option<std::ptr::NonNull<u8>> {
            let ram = self.0.borrow();
            let page = ram.get((physical & !4095) as usize..)?.get(..4096)?;
            std::ptr::NonNull::new(page.as_ptr().cast_mut())
        }

        fn pointer_generation(&self) -> Option<u64> {
            Some(0)
        }
    }

    #[test]
    fn a_page_read_at_one_stop_is_remembered_for_the_next_and_forgotten_once_remapped() {
        let mut t = Tables::new();
        let root = t.table();
        let stack = 0xffff_8000_0070_0000u64;
        map(&mut t, root, 4, stack, 1, 0x30_1000 | 3);
        t.ram[0x30_1010..0x30_1018].copy_from_slice(&0x1111u64.to_le_bytes());
        t.ram[0x30_2010..0x30_2018].copy_from_slice(&0x2222u64.to_le_bytes());
        let memory = SharedRam(std::cell::RefCell::new(t.ram.clone()));
        let paging = X86Paging {
            cr3: root,
            mode: PagingMode::FourLevel,
        };
        let mut cache = TranslationCache::new();
        let stop = |cache: &mut TranslationCache| {
            crate::WordReader::new(&memory, cache, &paging).word(stack + 0x10)
        };
        assert_eq!(stop(&mut cache), Some(0x1111));
        assert_eq!((cache.hits, cache.misses), (0, 1));
        // The next stop: the page remembered, its leaf entry read again (unchanged).
        assert_eq!(stop(&mut cache), Some(0x1111));
        assert_eq!((cache.hits, cache.misses), (1, 1));
        // The guest maps the page elsewhere: the leaf entry differs, the page is walked
        // afresh and the new frame read.
        let leaf = crate::x86_64::translate(&memory, root, PagingMode::FourLevel, stack)
            .unwrap()
            .leaf
            .unwrap();
        memory.0.borrow_mut()[leaf.address as usize..leaf.address as usize + 8]
            .copy_from_slice(&(0x30_2000u64 | 3).to_le_bytes());
        assert_eq!(stop(&mut cache), Some(0x2222));
        assert_eq!(cache.stale, 1);
        assert_eq!(stop(&mut cache), Some(0x2222));
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

    fn set32(t: &mut Tables, at: u64, entry: u32) {
        t.ram[at as usize..at as usize + 4].copy_from_slice(&entry.to_le_bytes());
    }

    #[test]
    fn paging_off_is_the_identity_in_32_bits() {
        let memory = Tables::new().memory();
        let m = PagingMode::from_registers(1, 0, 0);
        assert_eq!(m, PagingMode::Off);
        let one = translate(&memory, 0, m, 0x10_2345).unwrap();
        assert_eq!((one.physical, one.leaf), (0x10_2345, None));
        assert_eq!(
            translate(&memory, 0, m, 1 << 32),
            Err(WalkError::NonCanonical)
        );
    }

    #[test]
    fn two_level_paging_with_4k_and_4m_pages() {
        let mut t = Tables::new();
        let (pd, pt) = (t.table(), t.table());
        // 0xc010_3000 -> 0x20_7000 through a page table; 0x8040_0000 a 4 MiB page at 0x80_0000.
        set32(&mut t, pd + (0xc010_3000u64 >> 22) * 4, pt as u32 | 3);
        set32(&mut t, pt + ((0xc010_3000u64 >> 12) & 0x3ff) * 4, 0x20_7003);
        set32(&mut t, pd + (0x8040_0000u64 >> 22) * 4, 0x80_0083);
        let memory = t.memory();
        let cr0_pg = 1 << 31 | 1;
        let pse = PagingMode::from_registers(cr0_pg, CR4_PSE, 0);
        assert_eq!(pse, PagingMode::TwoLevel { pse: true });
        let small = translate(&memory, pd, pse, 0xc010_3abc).unwrap();
        assert_eq!((small.physical, small.page_size), (0x20_7abc, 4096));
        let big = translate(&memory, pd, pse, 0x8051_2345).unwrap();
        assert_eq!((big.physical, big.page_size), (0x91_2345, 4 << 20));
        // Without CR4.PSE the PS bit is ignored: the PDE points at a page table.
        let no_pse = PagingMode::from_registers(cr0_pg, 0, 0);
        assert_ne!(
            translate(&memory, pd, no_pse, 0x8051_2345)
                .ok()
                .map(|t| t.physical),
            Some(0x91_2345)
        );
        assert_eq!(
            translate(&memory, pd, pse, 0xc040_0000),
            Err(WalkError::NotPresent { level: 2 })
        );
        assert_eq!(
            translate(&memory, pd, pse, 0xc010_4000),
            Err(WalkError::NotPresent { level: 1 })
        );
        // Through the cache, which verifies the 4-byte leaf.
        let paging = X86Paging { cr3: pd, mode: pse };
        let mut cache = TranslationCache::new();
        assert_eq!(
            cache.translate_with(&memory, &paging, 0xc010_3008),
            Ok(0x20_7008)
        );
        assert_eq!(
            cache.translate_with(&memory, &paging, 0xc010_3010),
            Ok(0x20_7010)
        );
        assert_eq!((cache.hits, cache.misses), (1, 1));
    }

    #[test]
    fn pae_paging_with_4k_and_2m_pages() {
        let mut t = Tables::new();
        let (pdpt, pd, pt) = (t.table() + 0x20, t.table(), t.table());
        // 0xc010_3000 -> 0x30_5000 through a PT; 0xc060_0000 a 2 MiB page at 0xa0_0000.
        t.set(pdpt, 3, pd | 1);
        t.set(pd, (0xc010_3000u64 >> 21) & 0x1ff, pt | 3);
        t.set(pt, (0xc010_3000u64 >> 12) & 0x1ff, 0x30_5003 | 1 << 63);
        t.set(pd, (0xc060_0000u64 >> 21) & 0x1ff, 0xa0_0083);
        let memory = t.memory();
        let m = PagingMode::from_registers(1 << 31 | 1, CR4_PAE, 0);
        assert_eq!(m, PagingMode::Pae);
        let small = translate(&memory, pdpt, m, 0xc010_3abc).unwrap();
        assert_eq!((small.physical, small.page_size), (0x30_5abc, 4096));
        let big = translate(&memory, pdpt, m, 0xc071_2345).unwrap();
        assert_eq!((big.physical, big.page_size), (0xb1_2345, 2 << 20));
        assert_eq!(
            translate(&memory, pdpt, m, 0x4000_0000),
            Err(WalkError::NotPresent { level: 3 })
        );
        assert_eq!(X86Paging { cr3: pdpt, mode: m }.cache_root(0), pdpt);
        // Long mode wins over CR0/CR4.PAE: EFER.LMA selects the 4-level walk.
        assert_eq!(
            PagingMode::from_registers(1 << 31 | 1, CR4_PAE, EFER_LMA),
            PagingMode::FourLevel
        );
    }
}
