//! The AArch64 stage-1 walker and the cache over it, on hand-built tables in RAM laid
//! out as QEMU's `virt` machine lays it (from 1 GiB). Level shifts, start levels and
//! register encodings below are written out from the Arm ARM rather than computed the
//! way the walker computes them, so a mistake in one does not hide in the other.

use glass_mem::ram::{qemu_arm_virt_layout, GuestRam};
use glass_mem::{Aarch64Paging, GuestPaging, PageWalk, Translation, TranslationCache, WalkError};

const RAM_BASE: u64 = 0x4000_0000;
const RAM_SIZE: u64 = 16 << 20;
/// Where data pages go (tables are allocated from the start of RAM).
const DATA: u64 = RAM_BASE + (8 << 20);

const SCTLR_M: u64 = 1;
const EPD0: u64 = 1 << 7;
const A1: u64 = 1 << 22;
const EPD1: u64 = 1 << 23;
const AS: u64 = 1 << 36;
const TBI0: u64 = 1 << 37;
const TBI1: u64 = 1 << 38;

/// Descriptor bits 1:0.
const TABLE: u64 = 0b11;
const PAGE: u64 = 0b11;
const BLOCK: u64 = 0b01;
/// Attribute bits a real leaf carries (UXN, PXN, Contiguous, nG, AF, SH, AP, AttrIndx,
/// software bits 58:55): none may leak into the output address.
const ATTRS: u64 = (0xf << 55)
    | (1 << 54)
    | (1 << 53)
    | (1 << 52)
    | (1 << 11)
    | (1 << 10)
    | (3 << 8)
    | (1 << 6)
    | (4 << 2);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum G {
    K4,
    K16,
    K64,
}

impl G {
    fn size(self) -> u64 {
        match self {
            G::K4 => 4 << 10,
            G::K16 => 16 << 10,
            G::K64 => 64 << 10,
        }
    }
    /// The lowest virtual-address bit each level (0..3) resolves.
    fn level_shift(self, level: u32) -> u32 {
        let shifts = match self {
            G::K4 => [39, 30, 21, 12],
            G::K16 => [47, 36, 25, 14],
            // No level 0 without 52-bit addresses.
            G::K64 => [u32::MAX, 42, 29, 16],
        };
        shifts[level as usize]
    }
    /// Index bits of a full table.
    fn table_bits(self) -> u32 {
        match self {
            G::K4 => 9,
            G::K16 => 11,
            G::K64 => 13,
        }
    }
    /// TCR_EL1.TG0 (bits 15:14).
    fn tg0(self) -> u64 {
        (match self {
            G::K4 => 0b00,
            G::K64 => 0b01,
            G::K16 => 0b10,
        }) << 14
    }
    /// TCR_EL1.TG1 (bits 31:30), encoded differently.
    fn tg1(self) -> u64 {
        (match self {
            G::K16 => 0b01,
            G::K4 => 0b10,
            G::K64 => 0b11,
        }) << 30
    }
}

/// TCR_EL1 with T0SZ/TG0 and T1SZ/TG1 for the given region sizes (in bits).
fn tcr(g0: G, bits0: u32, g1: G, bits1: u32) -> u64 {
    (64 - bits0) as u64 | g0.tg0() | ((64 - bits1) as u64) << 16 | g1.tg1()
}

/// Guest RAM being filled with tables.
#[derive(Clone)]
struct Guest {
    ram: Vec<u8>,
    next_table: u64,
    /// ORed into every table descriptor made.
    table_bits: u64,
}

/// One set of tables: its root, granule, region size and start level.
#[derive(Clone, Copy)]
struct Space {
    root: u64,
    g: G,
    bits: u32,
    start: u32,
}

impl Guest {
    fn new() -> Self {
        Guest {
            ram: vec![0; RAM_SIZE as usize],
            next_table: RAM_BASE,
            table_bits: 0,
        }
    }
    fn table(&mut self, g: G) -> u64 {
        let at = self.next_table.next_multiple_of(g.size());
        self.next_table = at + g.size();
        assert!(self.next_table <= DATA);
        at
    }
    /// A space whose start table begins `offset` bytes into a fresh granule (start
    /// tables smaller than a granule need only be aligned to their own size).
    fn space(&mut self, g: G, bits: u32, start: u32, offset: u64) -> Space {
        Space {
            root: self.table(g) + offset,
            g,
            bits,
            start,
        }
    }
    fn write(&mut self, address: u64, value: u64) {
        let at = (address - RAM_BASE) as usize;
        self.ram[at..at + 8].copy_from_slice(&value.to_le_bytes());
    }
    fn read(&self, address: u64) -> u64 {
        let at = (address - RAM_BASE) as usize;
        u64::from_le_bytes(self.ram[at..at + 8].try_into().unwrap())
    }
    fn fill(&mut self, address: u64, len: u64, byte: u8) {
        let at = (address - RAM_BASE) as usize;
        self.ram[at..at + len as usize].fill(byte);
    }
    fn memory(&self) -> GuestRam {
        GuestRam::from_bytes(self.ram.clone(), qemu_arm_virt_layout(RAM_SIZE))
    }

    fn entry_address(&self, s: Space, table: u64, vaddr: u64, level: u32) -> u64 {
        let shift = s.g.level_shift(level);
        let bits = if level == s.start {
            s.bits - shift
        } else {
            s.g.table_bits()
        };
        table + ((vaddr >> shift) & ((1 << bits) - 1)) * 8
    }

    /// Maps `vaddr` down to `leaf_level`, making tables on the way, and writes `leaf`
    /// there. Returns where the leaf went.
    fn map(&mut self, s: Space, vaddr: u64, leaf_level: u32, leaf: u64) -> u64 {
        let mut table = s.root;
        for level in s.start..leaf_level {
            let at = self.entry_address(s, table, vaddr, level);
            let existing = self.read(at);
            table = if existing & 3 == TABLE {
                existing & 0x0000_ffff_ffff_f000 & !(s.g.size() - 1)
            } else {
                let next = self.table(s.g);
                self.write(at, next | self.table_bits | TABLE);
                next
            };
        }
        let at = self.entry_address(s, table, vaddr, leaf_level);
        self.write(at, leaf);
        at
    }
}

fn on(ttbr0: u64, ttbr1: u64, tcr: u64) -> Aarch64Paging {
    Aarch64Paging {
        ttbr0,
        ttbr1,
        tcr,
        sctlr: SCTLR_M,
    }
}

fn physical(paging: &Aarch64Paging, memory: &GuestRam, vaddr: u64) -> Result<u64, WalkError> {
    paging.walk(memory, vaddr).map(|t| t.physical)
}

/// (granule, region bits, start level, start table's offset in its granule): each
/// granule with each number of levels it supports, and the region sizes where the
/// start level changes.
const LAYOUTS: &[(G, u32, u32, u64)] = &[
    (G::K4, 48, 0, 0),
    (G::K4, 40, 0, 0x40), // L0 with 1 bit: two entries, 64-byte aligned
    (G::K4, 39, 1, 0),
    (G::K4, 31, 1, 0x40), // L1 with 1 bit
    (G::K4, 30, 2, 0),
    (G::K4, 25, 2, 0x80),  // L2 with 4 bits: 16 entries, 128 bytes
    (G::K16, 48, 0, 0x40), // L0 with 1 bit (Linux's 16K/48-bit)
    (G::K16, 47, 1, 0),
    (G::K16, 37, 1, 0x40), // L1 with 1 bit
    (G::K16, 36, 2, 0),
    (G::K64, 48, 1, 0x200), // L1 with 6 bits: 64 entries, 512 bytes
    (G::K64, 43, 1, 0x40),  // L1 with 1 bit
    (G::K64, 42, 2, 0),
];

/// A virtual page with nonzero indices at every level, within `bits`.
fn low_page(g: G, bits: u32) -> u64 {
    0x0000_a5c3_9e17_b35d_u64 & ((1 << bits) - 1) & !(g.size() - 1)
}

/// The same low bits in the upper half: bits 63..`bits` all ones.
fn high(bits: u32, low: u64) -> u64 {
    (u64::MAX << bits) | low
}

#[test]
fn pages_with_every_granule_and_level_count() {
    for &(g, bits, start, offset) in LAYOUTS {
        let mut guest = Guest::new();
        // Table descriptors with their attributes (NSTable, APTable, UXNTable,
        // PXNTable) and, for 16K and 64K, bits below the granule in the address field
        // (RES0 without 52-bit addresses) set: none is part of the next table's address.
        guest.table_bits = (0x1f << 59) | ((g.size() - 1) & !0xfff);
        let low_space = guest.space(g, bits, start, offset);
        let high_space = guest.space(g, bits, start, offset);
        let va = low_page(g, bits);
        let pa_low = DATA + 3 * g.size();
        let pa_high = DATA + 5 * g.size();
        guest.map(low_space, va, 3, pa_low | ATTRS | PAGE);
        guest.map(high_space, high(bits, va), 3, pa_high | ATTRS | PAGE);
        let memory = guest.memory();
        // ASIDs in TTBR bits 63:48, CnP in bit 0 and the RES0 bits below the start
        // table's alignment (its size, at least 64 bytes) are not part of its address.
        let start_table = (8u64 << (bits - g.level_shift(start))).max(64);
        let res0 = start_table - 2;
        let paging = on(
            low_space.root | 0x1234 << 48 | res0 | 1,
            high_space.root | 0x5678 << 48 | res0 | 1,
            tcr(g, bits, g, bits),
        );
        let case = format!("{g:?} {bits}-bit");
        let offset_in_page = g.size() - 8;
        let t = paging.walk(&memory, va + offset_in_page).unwrap();
        assert_eq!(t.physical, pa_low + offset_in_page, "{case}");
        assert_eq!(t.page_size, g.size(), "{case}");
        assert_eq!(paging.page_granule(), g.size(), "{case}");
        assert_eq!(
            physical(&paging, &memory, high(bits, va) + 0x18),
            Ok(pa_high + 0x18),
            "{case}: TTBR1"
        );
        // The neighbouring page is not mapped: an invalid entry at level 3.
        assert_eq!(
            physical(&paging, &memory, va + g.size()),
            Err(WalkError::NotPresent { level: 3 }),
            "{case}"
        );
        // The same tables read with one level fewer (the region just small enough)
        // give something else: the level count matters.
        let fewer = g.level_shift(start);
        let short_va = va & ((1 << fewer) - 1);
        let shorter = on(low_space.root, 0, tcr(g, fewer, g, bits));
        assert_ne!(physical(&shorter, &memory, short_va), Ok(pa_low), "{case}");
        if va >> fewer != 0 {
            assert_eq!(
                physical(&shorter, &memory, va),
                Err(WalkError::OutsideRange),
                "{case}"
            );
        }
    }
}

#[test]
fn blocks_where_the_granule_allows_them() {
    // (granule, region bits, start level, block level, block size)
    let cases = [
        (G::K4, 48, 0, 1, 1u64 << 30),
        (G::K4, 39, 1, 1, 1 << 30),
        (G::K4, 48, 0, 2, 2 << 20),
        (G::K4, 30, 2, 2, 2 << 20),
        (G::K16, 48, 0, 2, 32 << 20),
        (G::K16, 36, 2, 2, 32 << 20),
        (G::K64, 48, 1, 2, 512 << 20),
        (G::K64, 42, 2, 2, 512 << 20),
    ];
    for (g, bits, start, level, size) in cases {
        let mut guest = Guest::new();
        let space = guest.space(g, bits, start, 0);
        let va = 0x0000_5a5a_5a5a_5a5a_u64 & ((1 << bits) - 1) & !(size - 1);
        // Outside RAM is fine for a translation: only reading it would fail.
        let pa = 0x80_0000_0000 + 7 * size;
        // nT (bit 16) and any other bit of the output field below the block's alignment
        // is not part of the address.
        let below_alignment = 1 << 16 | (size >> 1);
        let leaf_at = guest.map(space, va, level, pa | below_alignment | ATTRS | BLOCK);
        let memory = guest.memory();
        let paging = on(space.root, 0, tcr(g, bits, G::K4, 39) | EPD1);
        let inside = (size >> 2) | 0x2238;
        let t: Translation = paging.walk(&memory, va + inside).unwrap();
        let case = format!("{g:?} {bits}-bit level {level}");
        assert_eq!((t.physical, t.page_size), (pa + inside, size), "{case}");
        let leaf = t.leaf.unwrap();
        assert_eq!(
            (leaf.address, leaf.value),
            (leaf_at, guest.read(leaf_at)),
            "{case}"
        );
    }
}

#[test]
fn blocks_where_the_granule_reserves_them() {
    // (granule, region bits, start level, block level)
    let cases = [
        (G::K4, 48, 0, 0),
        (G::K16, 48, 0, 0),
        (G::K16, 47, 1, 1),
        (G::K64, 48, 1, 1),
    ];
    for (g, bits, start, level) in cases {
        let mut guest = Guest::new();
        let space = guest.space(g, bits, start, 0);
        let va = 1u64 << (bits - 2);
        guest.map(space, va, level, BLOCK);
        let paging = on(space.root, 0, tcr(g, bits, G::K4, 39) | EPD1);
        assert_eq!(
            physical(&paging, &guest.memory(), va),
            Err(WalkError::Reserved { level }),
            "{g:?} {bits}-bit level {level}"
        );
    }
    // 0b01 at level 3 is reserved in every granule.
    for g in [G::K4, G::K16, G::K64] {
        let (bits, start) = if g == G::K64 { (42, 2) } else { (39, 1) };
        let mut guest = Guest::new();
        let space = guest.space(g, bits, start, 0);
        let va = 1u64 << (bits - 3);
        guest.map(space, va, 3, DATA | BLOCK);
        let paging = on(space.root, 0, tcr(g, bits, G::K4, 39) | EPD1);
        assert_eq!(
            physical(&paging, &guest.memory(), va),
            Err(WalkError::Reserved { level: 3 }),
            "{g:?}"
        );
    }
}

#[test]
fn invalid_entries_at_each_level() {
    for (g, bits, start) in [(G::K4, 48, 0), (G::K16, 48, 0), (G::K64, 48, 1)] {
        let mut guest = Guest::new();
        let space = guest.space(g, bits, start, 0);
        let va = low_page(g, bits);
        guest.map(space, va, 3, DATA | PAGE);
        let paging = on(space.root, 0, tcr(g, bits, G::K4, 39) | EPD1);
        assert_eq!(physical(&paging, &guest.memory(), va), Ok(DATA));
        for level in start..=3 {
            // Flip the lowest index bit of this level: same path above, an empty entry
            // here.
            let other = va ^ 1 << g.level_shift(level);
            assert_eq!(
                physical(&paging, &guest.memory(), other),
                Err(WalkError::NotPresent { level }),
                "{g:?} level {level}"
            );
        }
        // An entry with bit 0 clear is invalid whatever else it holds.
        let leaf_at = guest.map(space, va, 3, DATA | 0b10 | ATTRS);
        assert_eq!(
            physical(&paging, &guest.memory(), va),
            Err(WalkError::NotPresent { level: 3 })
        );
        // A table pointer past RAM.
        guest.write(leaf_at, DATA | PAGE);
        let root_entry = guest.map(space, 0, start, 0x7_0000_0000 | TABLE);
        assert_eq!(root_entry, space.root);
        assert_eq!(
            physical(&paging, &guest.memory(), 0x10_0000),
            Err(WalkError::OutsideRam)
        );
    }
}

#[test]
fn the_upper_half_goes_through_ttbr1() {
    // Linux's 4K/39-bit layout for the kernel, 48-bit for user space.
    let mut guest = Guest::new();
    let user = guest.space(G::K4, 48, 0, 0);
    let kernel = guest.space(G::K4, 39, 1, 0);
    guest.map(user, 0x1234_5000, 3, (DATA + 0x1000) | PAGE);
    guest.map(kernel, 0xffff_ff80_1234_5000, 3, (DATA + 0x2000) | PAGE);
    guest.map(kernel, 0xffff_ffff_ffff_f000, 3, (DATA + 0x3000) | PAGE);
    let memory = guest.memory();
    let paging = on(user.root, kernel.root, tcr(G::K4, 48, G::K4, 39));
    assert_eq!(physical(&paging, &memory, 0x1234_5678), Ok(DATA + 0x1678));
    assert_eq!(
        physical(&paging, &memory, 0xffff_ff80_1234_5678),
        Ok(DATA + 0x2678)
    );
    assert_eq!(
        physical(&paging, &memory, 0xffff_ffff_ffff_fff8),
        Ok(DATA + 0x3ff8)
    );
    // The same low bits under the other table are not mapped.
    assert_eq!(
        physical(&paging, &memory, 0xffff_ff80_0000_0000),
        Err(WalkError::NotPresent { level: 2 })
    );
    for outside in [
        0x0001_0000_0000_0000, // above TTBR0's 48 bits
        0x8000_0000_1234_5000, // only bit 63 set
        0xffff_ff7f_ffff_f000, // just below TTBR1's 39 bits
        0xffff_0000_1234_5000, // 48-bit kernel address, 39-bit TTBR1
        0x00ff_0000_0000_0000, // a tag without TBI
    ] {
        assert_eq!(
            physical(&paging, &memory, outside),
            Err(WalkError::OutsideRange),
            "{outside:#x}"
        );
    }
}

#[test]
fn top_byte_ignore() {
    let mut guest = Guest::new();
    let user = guest.space(G::K4, 48, 0, 0);
    let kernel = guest.space(G::K4, 48, 0, 0);
    guest.map(user, 0x7fff_1234_5000, 3, (DATA + 0x1000) | PAGE);
    guest.map(kernel, 0xffff_8000_0000_0000, 3, (DATA + 0x2000) | PAGE);
    let memory = guest.memory();
    let untagged = 0x0000_7fff_1234_5678;
    let tagged = 0x5a00_7fff_1234_5678;
    // Bit 55 set, top byte 0x5a: the upper half only when its top byte is ignored.
    let tagged_kernel = 0x5aff_8000_0000_0010;
    let base = tcr(G::K4, 48, G::K4, 48);
    let both = on(user.root, kernel.root, base | TBI0 | TBI1);
    assert_eq!(physical(&both, &memory, untagged), Ok(DATA + 0x1678));
    assert_eq!(physical(&both, &memory, tagged), Ok(DATA + 0x1678));
    assert_eq!(physical(&both, &memory, tagged_kernel), Ok(DATA + 0x2010));
    // A top byte of all ones is a tag too: bit 55 still says TTBR0.
    assert_eq!(
        physical(&both, &memory, 0xff00_7fff_1234_5678),
        Ok(DATA + 0x1678)
    );
    // Bit 55 selects the half under TBI: clear it in a kernel address and it is low.
    assert_eq!(
        physical(&both, &memory, 0xff7f_8000_0000_0000),
        Err(WalkError::OutsideRange)
    );
    let none = on(user.root, kernel.root, base);
    assert_eq!(physical(&none, &memory, untagged), Ok(DATA + 0x1678));
    assert_eq!(
        physical(&none, &memory, tagged),
        Err(WalkError::OutsideRange)
    );
    assert_eq!(
        physical(&none, &memory, tagged_kernel),
        Err(WalkError::OutsideRange)
    );
    // Linux's setting: TBI0 only.
    let user_only = on(user.root, kernel.root, base | TBI0);
    assert_eq!(physical(&user_only, &memory, tagged), Ok(DATA + 0x1678));
    assert_eq!(
        physical(&user_only, &memory, tagged_kernel),
        Err(WalkError::OutsideRange)
    );
    assert_eq!(
        physical(&user_only, &memory, 0xffff_8000_0000_0010),
        Ok(DATA + 0x2010)
    );
}

#[test]
fn epd_disables_walks_of_one_half() {
    let mut guest = Guest::new();
    let user = guest.space(G::K16, 47, 1, 0);
    let kernel = guest.space(G::K16, 47, 1, 0);
    guest.map(user, 0x4000, 3, DATA | PAGE);
    guest.map(kernel, high(47, 0x4000), 3, (DATA + 0x4000) | PAGE);
    let memory = guest.memory();
    let base = tcr(G::K16, 47, G::K16, 47);
    let both = on(user.root, kernel.root, base);
    assert_eq!(physical(&both, &memory, 0x4008), Ok(DATA + 8));
    assert_eq!(
        physical(&both, &memory, high(47, 0x4008)),
        Ok(DATA + 0x4008)
    );
    let no_user = on(user.root, kernel.root, base | EPD0);
    assert_eq!(
        physical(&no_user, &memory, 0x4008),
        Err(WalkError::WalksDisabled)
    );
    assert_eq!(
        physical(&no_user, &memory, high(47, 0x4008)),
        Ok(DATA + 0x4008)
    );
    let no_kernel = on(user.root, kernel.root, base | EPD1);
    assert_eq!(physical(&no_kernel, &memory, 0x4008), Ok(DATA + 8));
    assert_eq!(
        physical(&no_kernel, &memory, high(47, 0x4008)),
        Err(WalkError::WalksDisabled)
    );
    // Bare-metal guests often leave TG1 at its reserved 0b00 with EPD1 set: the lower
    // half still walks, and its granule is the one that counts.
    let tg1_reserved = (base & !(3 << 30)) | EPD1;
    let paging = on(user.root, 0, tg1_reserved);
    assert_eq!(physical(&paging, &memory, 0x4008), Ok(DATA + 8));
    assert_eq!(paging.page_granule(), 16 << 10);
    assert_eq!(
        physical(&on(user.root, 0, base & !(3 << 30)), &memory, high(47, 0)),
        Err(WalkError::ReservedGranule)
    );
    // Different granules per half: the cache's unit is the smaller.
    let mixed = on(user.root, 0, tcr(G::K16, 47, G::K64, 42));
    assert_eq!(mixed.page_granule(), 16 << 10);
    assert_eq!(physical(&mixed, &memory, 0x4008), Ok(DATA + 8));
}

#[test]
fn mmu_off_is_the_identity() {
    let mut guest = Guest::new();
    guest.fill(DATA + 0xff8, 16, 0xc3);
    let memory = guest.memory();
    // TTBRs and TCR hold leftovers; with SCTLR_EL1.M clear they do not matter.
    let off = Aarch64Paging {
        ttbr0: 0xdead_b000,
        ttbr1: 0xbeef_0000,
        tcr: tcr(G::K64, 42, G::K64, 42) | EPD0,
        sctlr: 0x30d0_0800,
    };
    let t = off.walk(&memory, DATA + 0x123).unwrap();
    assert_eq!(
        (t.physical, t.page_size, t.leaf),
        (DATA + 0x123, 64 << 10, None)
    );
    assert_eq!(
        physical(&off, &memory, 0x0001_0000_0000_0000),
        Err(WalkError::OutsideRange)
    );
    assert_eq!(
        physical(&off, &memory, 0x5a00_0000_4000_0000),
        Err(WalkError::OutsideRange)
    );
    let tbi = Aarch64Paging {
        tcr: off.tcr | TBI0,
        ..off
    };
    assert_eq!(physical(&tbi, &memory, 0x5a00_0000_4000_0000), Ok(RAM_BASE));
    // Through the cache: hits without a table to verify.
    let mut cache = TranslationCache::new();
    let mut buf = [0u8; 16];
    assert_eq!(cache.read_with(&memory, &off, DATA + 0xff8, &mut buf), 16);
    assert_eq!(buf, [0xc3; 16]);
    assert_eq!(cache.translate_with(&memory, &off, DATA + 8), Ok(DATA + 8));
    assert_eq!((cache.hits, cache.misses), (1, 1));
    // RAM ends where the mapping ends: the 4 bytes before it are read.
    let end = RAM_BASE + RAM_SIZE - 4;
    assert_eq!(cache.read_with(&memory, &off, end, &mut buf), 4);
}

#[test]
fn the_cache_hits_verifies_and_walks_stale_entries_again() {
    let mut guest = Guest::new();
    let space = guest.space(G::K4, 39, 1, 0);
    let va = 0x12_3456_7000;
    let leaf_at = guest.map(space, va, 3, DATA | PAGE);
    let block_va = 0x40_0000_0000 - (2 << 20);
    guest.map(space, block_va, 2, 0x8000_0000 | BLOCK);
    let memory = guest.memory();
    let paging = on(space.root, 0, tcr(G::K4, 39, G::K4, 39) | EPD1);
    let mut cache = TranslationCache::new();
    assert_eq!(cache.translate_with(&memory, &paging, va + 8), Ok(DATA + 8));
    assert_eq!(
        cache.translate_with(&memory, &paging, va + 16),
        Ok(DATA + 16)
    );
    assert_eq!((cache.hits, cache.misses, cache.stale), (1, 1, 0));
    // A block's offset survives a hit.
    assert_eq!(
        cache.translate_with(&memory, &paging, block_va + 0x1_2345),
        Ok(0x8001_2345)
    );
    assert_eq!(
        cache.translate_with(&memory, &paging, block_va + 0x1_2fff),
        Ok(0x8001_2fff)
    );
    assert_eq!((cache.hits, cache.misses, cache.stale), (2, 2, 0));
    // The guest remaps the page: the hit is found stale and walked again.
    let mut remapped = guest.clone();
    remapped.write(leaf_at, (DATA + 0x5000) | PAGE);
    let memory = remapped.memory();
    assert_eq!(
        cache.translate_with(&memory, &paging, va + 8),
        Ok(DATA + 0x5008)
    );
    assert_eq!((cache.hits, cache.misses, cache.stale), (2, 3, 1));
    assert_eq!(
        cache.translate_with(&memory, &paging, va + 8),
        Ok(DATA + 0x5008)
    );
    assert_eq!((cache.hits, cache.misses, cache.stale), (3, 3, 1));
    // Unmapped now: stale, and the walk's error.
    remapped.write(leaf_at, 0);
    assert_eq!(
        cache.translate_with(&remapped.memory(), &paging, va),
        Err(WalkError::NotPresent { level: 3 })
    );
    assert_eq!((cache.hits, cache.misses, cache.stale), (3, 4, 2));
    // A disabled cache walks every time.
    let mut walking = TranslationCache::disabled();
    for _ in 0..3 {
        assert_eq!(
            walking.translate_with(&memory, &paging, va),
            Ok(DATA + 0x5000)
        );
    }
    assert_eq!((walking.hits, walking.misses), (0, 3));
}

#[test]
fn the_cache_keeps_address_spaces_apart() {
    let mut guest = Guest::new();
    let a = guest.space(G::K4, 48, 0, 0);
    let b = guest.space(G::K4, 48, 0, 0);
    let va = 0x7fff_ffff_e000;
    guest.map(a, va, 3, DATA | PAGE);
    guest.map(b, va, 3, (DATA + 0x1000) | PAGE);
    let memory = guest.memory();
    let tcr = tcr(G::K4, 48, G::K4, 48) | AS;
    let mut cache = TranslationCache::new();
    let asid = |n: u64| n << 48;
    // Other tables: their own translation, never the cached one.
    assert_eq!(
        cache.translate_with(&memory, &on(a.root | asid(1), 0, tcr), va),
        Ok(DATA)
    );
    assert_eq!(
        cache.translate_with(&memory, &on(b.root | asid(2), 0, tcr), va),
        Ok(DATA + 0x1000)
    );
    assert_eq!((cache.hits, cache.misses), (0, 2));
    // Same tables, another ASID: a separate entry (walked), same translation.
    assert_eq!(
        cache.translate_with(&memory, &on(a.root | asid(0x103), 0, tcr), va),
        Ok(DATA)
    );
    assert_eq!((cache.hits, cache.misses), (0, 3));
    assert_eq!(
        cache.translate_with(&memory, &on(a.root | asid(1), 0, tcr), va),
        Ok(DATA)
    );
    assert_eq!((cache.hits, cache.misses), (1, 3));
    // 8-bit ASIDs (TCR_EL1.AS clear): 0x104 and 0x204 are both ASID 4.
    let tcr8 = tcr & !AS;
    cache
        .translate_with(&memory, &on(a.root | asid(0x104), 0, tcr8), va)
        .unwrap();
    cache
        .translate_with(&memory, &on(a.root | asid(0x204), 0, tcr8), va)
        .unwrap();
    assert_eq!((cache.hits, cache.misses), (2, 4));
    // TCR_EL1.A1 (as Linux sets it): the ASID is TTBR1's, for both halves.
    let tcr_a1 = tcr | A1;
    cache
        .translate_with(&memory, &on(a.root | asid(7), asid(9), tcr_a1), va)
        .unwrap();
    cache
        .translate_with(&memory, &on(a.root | asid(8), asid(9), tcr_a1), va)
        .unwrap();
    assert_eq!((cache.hits, cache.misses), (3, 5));
    cache
        .translate_with(&memory, &on(a.root, asid(10), tcr_a1), va)
        .unwrap();
    assert_eq!((cache.hits, cache.misses), (3, 6));
}

#[test]
fn read_with_copies_across_pages_and_stops_at_an_unmapped_one() {
    for (g, bits, start) in [(G::K4, 39, 1), (G::K16, 47, 1), (G::K64, 42, 2)] {
        let mut guest = Guest::new();
        let space = guest.space(g, bits, start, 0);
        let va = high(bits, 0x20 * g.size());
        // Two virtually adjacent pages, physically apart and in reverse order.
        let (first, second) = (DATA + 6 * g.size(), DATA + 2 * g.size());
        guest.map(space, va, 3, first | PAGE);
        guest.map(space, va + g.size(), 3, second | PAGE);
        guest.fill(first, g.size(), 0x11);
        guest.fill(second, g.size(), 0x22);
        let memory = guest.memory();
        let paging = GuestPaging::from(on(0, space.root, tcr(g, bits, g, bits) | EPD0));
        let mut cache = TranslationCache::new();
        let mut buf = vec![0u8; 64];
        let start_at = va + g.size() - 24;
        assert_eq!(cache.read_with(&memory, &paging, start_at, &mut buf), 64);
        assert_eq!(&buf[..24], &[0x11; 24], "{g:?}");
        assert_eq!(&buf[24..], &[0x22; 40], "{g:?}");
        // Into the third page, which is not mapped: a short count.
        let mut buf = vec![0u8; g.size() as usize];
        let near_end = va + 2 * g.size() - 40;
        assert_eq!(
            cache.read_with(&memory, &paging, near_end, &mut buf),
            40,
            "{g:?}"
        );
        assert_eq!(&buf[..40], &[0x22; 40]);
        assert_eq!(buf[40], 0, "nothing copied past the mapped page");
    }
}

#[test]
fn guest_paging_delegates() {
    let mut guest = Guest::new();
    let space = guest.space(G::K64, 48, 1, 0);
    guest.map(space, 0x1_0000, 3, DATA | PAGE);
    let memory = guest.memory();
    let arm = on(space.root | 5 << 48, 0, tcr(G::K64, 48, G::K64, 48));
    let paging = GuestPaging::Aarch64(arm);
    assert_eq!(paging.walk(&memory, 0x1_0040), arm.walk(&memory, 0x1_0040));
    assert_eq!(
        paging.walk(&memory, 0x1_0040).unwrap().physical,
        DATA + 0x40
    );
    assert_eq!(paging.page_granule(), 64 << 10);
    assert_eq!(paging.cache_root(0x1_0000), arm.cache_root(0x1_0000));
    let dynamic: &dyn PageWalk = &paging;
    let mut cache = TranslationCache::new();
    assert_eq!(
        cache.translate_with(&memory, dynamic, 0x1_0008),
        Ok(DATA + 8)
    );
}
