//! The AArch64 stage-1 table walk (VMSAv8-64, the EL1&0 regime): 4 KiB, 16 KiB and
//! 64 KiB granules, every level count TCR_EL1 can ask for, pages and the blocks allowed
//! without FEAT_LPA/LPA2, from the guest's TTBR0_EL1/TTBR1_EL1, TCR_EL1 and SCTLR_EL1.
//!
//! glass walks the guest's tables itself, in mapped guest RAM, because asking the VMM
//! to translate costs a GDB stub round trip per read while the guest is stopped, where
//! a walk is a few memory reads (and a cached one, one; see the crate's comment).
//!
//! Only what decides where an address lies is modelled: permissions, the access flag,
//! memory attributes and the output size (TCR_EL1.IPS) are not checked, since glass reads
//! as an outsider and a page the guest would fault on still holds the bytes it maps.
//! 52-bit addresses (FEAT_LVA/LPA/LPA2) are not supported: outputs are 48 bits.
//! The EL2&0 regime (VHE hosts) is out of scope: glass samples EL1 guests.

use crate::ram::PhysicalMemory;
use crate::walk::{LeafEntry, PageWalk, Translation, WalkError};

/// Bit 0 of a descriptor: valid.
const VALID: u64 = 1;
/// Bit 1: table (levels 0-2) or page (level 3); clear, a block (or reserved at level 3).
const TABLE_OR_PAGE: u64 = 1 << 1;
/// Output address bits 47..12 of a descriptor; each granule clears its own low bits.
const OUTPUT_MASK: u64 = 0x0000_ffff_ffff_f000;
/// TTBRn_EL1.BADDR (bits 47..1): the ASID (63..48) and CnP (bit 0) left out.
const TTBR_BADDR: u64 = 0x0000_ffff_ffff_fffe;
/// Physical addresses are 48 bits wide here (no FEAT_LPA).
const PHYSICAL_MASK: u64 = (1 << 48) - 1;
/// The cache root of translations with the MMU off: bit 0 is never set in a TTBR-based
/// root (CnP is masked out), so an identity translation never shares a key with a walk.
const IDENTITY_ROOT: u64 = 1;

// TCR_EL1 fields.
const TCR_T0SZ_SHIFT: u32 = 0;
const TCR_EPD0: u64 = 1 << 7;
const TCR_TG0_SHIFT: u32 = 14;
const TCR_T1SZ_SHIFT: u32 = 16;
/// The ASID comes from TTBR1_EL1 rather than TTBR0_EL1 (Linux sets this).
const TCR_A1: u64 = 1 << 22;
const TCR_EPD1: u64 = 1 << 23;
const TCR_TG1_SHIFT: u32 = 30;
/// 16-bit ASIDs; clear, only ASID bits 7..0 count.
const TCR_AS: u64 = 1 << 36;
const TCR_TBI0: u64 = 1 << 37;
const TCR_TBI1: u64 = 1 << 38;
/// SCTLR_EL1.M: the stage-1 MMU is on.
const SCTLR_M: u64 = 1;

/// A translation granule: the page size and the size of every table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Granule {
    K4,
    K16,
    K64,
}

impl Granule {
    fn from_tg0(tg0: u64) -> Option<Self> {
        match tg0 & 3 {
            0b00 => Some(Granule::K4),
            0b01 => Some(Granule::K64),
            0b10 => Some(Granule::K16),
            _ => None,
        }
    }

    /// TG1 encodes the granules differently from TG0.
    fn from_tg1(tg1: u64) -> Option<Self> {
        match tg1 & 3 {
            0b01 => Some(Granule::K16),
            0b10 => Some(Granule::K4),
            0b11 => Some(Granule::K64),
            _ => None,
        }
    }

    fn shift(self) -> u32 {
        match self {
            Granule::K4 => 12,
            Granule::K16 => 14,
            Granule::K64 => 16,
        }
    }

    fn size(self) -> u64 {
        1 << self.shift()
    }

    /// Levels at which a block descriptor is allowed without FEAT_LPA/LPA2: 4K 1 GiB
    /// (level 1) and 2 MiB (level 2); 16K 32 MiB (level 2); 64K 512 MiB (level 2).
    /// Elsewhere it is a translation fault on hardware. (QEMU 7.2's TCG walker maps
    /// blocks at 4K/16K level 0 and 16K/64K level 1 all the same; a 64K level-1 block is
    /// also legal on CPUs with FEAT_LPA. Guests do not use them: Linux does not.)
    fn block_allowed(self, level: u32) -> bool {
        match self {
            Granule::K4 => level == 1 || level == 2,
            Granule::K16 | Granule::K64 => level == 2,
        }
    }

    /// The largest TxSZ (smallest region) with FEAT_TTST; a larger value is treated as
    /// this, one of the behaviours the architecture allows.
    fn max_txsz(self) -> u32 {
        match self {
            Granule::K4 | Granule::K16 => 48,
            Granule::K64 => 47,
        }
    }
}

/// The smallest TxSZ (48-bit regions) without FEAT_LVA; smaller values are treated as
/// this, one of the behaviours the architecture allows.
const MIN_TXSZ: u32 = 16;

/// One of the two halves of the address space, as TCR_EL1 sets it up.
struct Range {
    ttbr: u64,
    granule: Granule,
    /// Bits of the region: 64 - TxSZ.
    input_bits: u32,
}

/// An AArch64 vCPU's EL1 translation registers, as read from the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Aarch64Paging {
    pub ttbr0: u64,
    pub ttbr1: u64,
    pub tcr: u64,
    pub sctlr: u64,
}

impl Aarch64Paging {
    fn mmu_on(&self) -> bool {
        self.sctlr & SCTLR_M != 0
    }

    /// The highest address bit that counts (the architecture's AddrTop): 55 when top-byte
    /// ignore is on for the half bit 55 points at, else 63.
    fn top_bit(&self, vaddr: u64) -> u32 {
        let tbi = if vaddr & (1 << 55) != 0 {
            TCR_TBI1
        } else {
            TCR_TBI0
        };
        if self.tcr & tbi != 0 {
            55
        } else {
            63
        }
    }

    /// Whether `vaddr` is in the upper (TTBR1) half: its top counting bit is set.
    fn upper(&self, vaddr: u64) -> bool {
        vaddr >> self.top_bit(vaddr) & 1 != 0
    }

    fn granule(&self, upper: bool) -> Option<Granule> {
        if upper {
            Granule::from_tg1(self.tcr >> TCR_TG1_SHIFT)
        } else {
            Granule::from_tg0(self.tcr >> TCR_TG0_SHIFT)
        }
    }

    fn disabled(&self, upper: bool) -> bool {
        self.tcr & if upper { TCR_EPD1 } else { TCR_EPD0 } != 0
    }

    /// The half `vaddr` is walked in, with its checks: walks enabled, a granule, and the
    /// bits from the top counting bit down to the region size all equal.
    fn range(&self, vaddr: u64) -> Result<Range, WalkError> {
        let top = self.top_bit(vaddr);
        let upper = vaddr >> top & 1 != 0;
        if self.disabled(upper) {
            return Err(WalkError::WalksDisabled);
        }
        let granule = self.granule(upper).ok_or(WalkError::ReservedGranule)?;
        let txsz_shift = if upper {
            TCR_T1SZ_SHIFT
        } else {
            TCR_T0SZ_SHIFT
        };
        let txsz = ((self.tcr >> txsz_shift) & 0x3f) as u32;
        let input_bits = 64 - txsz.clamp(MIN_TXSZ, granule.max_txsz());
        // Bits top..input_bits: all zeros below, all ones above.
        let above = vaddr >> input_bits & ((1u64 << (top + 1 - input_bits)) - 1);
        let expected = if upper {
            (1u64 << (top + 1 - input_bits)) - 1
        } else {
            0
        };
        if above != expected {
            return Err(WalkError::OutsideRange);
        }
        Ok(Range {
            ttbr: if upper { self.ttbr1 } else { self.ttbr0 },
            granule,
            input_bits,
        })
    }

    /// The ASID in effect: from TTBR1 when TCR_EL1.A1 is set, else from TTBR0; 8 bits
    /// unless TCR_EL1.AS asks for 16.
    fn asid(&self) -> u64 {
        let ttbr = if self.tcr & TCR_A1 != 0 {
            self.ttbr1
        } else {
            self.ttbr0
        };
        let asid = ttbr >> 48;
        if self.tcr & TCR_AS != 0 {
            asid
        } else {
            asid & 0xff
        }
    }
}

impl PageWalk for Aarch64Paging {
    fn walk(&self, memory: &dyn PhysicalMemory, vaddr: u64) -> Result<Translation, WalkError> {
        if !self.mmu_on() {
            // Stage 1 off: the physical address is the virtual one, which must fit the
            // physical address size (below the top byte when it is ignored).
            let top = self.top_bit(vaddr);
            if vaddr & !PHYSICAL_MASK & (u64::MAX >> (63 - top)) != 0 {
                return Err(WalkError::OutsideRange);
            }
            return Ok(Translation {
                physical: vaddr & PHYSICAL_MASK,
                page_size: self.page_granule(),
                leaf: None,
            });
        }
        let range = self.range(vaddr)?;
        let grain = range.granule.shift();
        // Each table is one granule of 8-byte descriptors.
        let stride = grain - 3;
        let levels = (range.input_bits - grain).div_ceil(stride);
        let start_level = 4 - levels;
        // The start table resolves what is left over: fewer bits than a full table.
        let start_bits = range.input_bits - grain - stride * (levels - 1);
        // The start table is aligned to its size, at least 64 bytes; lower TTBR bits
        // are RES0 and treated as zero.
        let start_align = 1u64 << (start_bits + 3).max(6);
        let output_mask = OUTPUT_MASK & !(range.granule.size() - 1);
        let mut table = range.ttbr & TTBR_BADDR & !(start_align - 1);
        for level in start_level..=3 {
            let shift = grain + stride * (3 - level);
            let bits = if level == start_level {
                start_bits
            } else {
                stride
            };
            let index = (vaddr >> shift) & ((1 << bits) - 1);
            let entry_address = table + index * 8;
            let entry = memory
                .read_u64(entry_address)
                .ok_or(WalkError::OutsideRam)?;
            if entry & VALID == 0 {
                return Err(WalkError::NotPresent { level });
            }
            let table_or_page = entry & TABLE_OR_PAGE != 0;
            if level < 3 && table_or_page {
                table = entry & output_mask;
                continue;
            }
            // A page (level 3, 0b11) or a block (0b01 above it).
            let reserved = if level == 3 {
                !table_or_page
            } else {
                !range.granule.block_allowed(level)
            };
            if reserved {
                return Err(WalkError::Reserved { level });
            }
            let page_size = 1u64 << shift;
            let base = entry & output_mask & !(page_size - 1);
            return Ok(Translation {
                physical: base | (vaddr & (page_size - 1)),
                page_size,
                leaf: Some(LeafEntry {
                    address: entry_address,
                    value: entry,
                }),
            });
        }
        unreachable!("level 3 always returns")
    }

    /// The selected TTBR's table address with the ASID in effect in bits 63..48, so two
    /// address spaces sharing tables under different ASIDs keep apart.
    fn cache_root(&self, vaddr: u64) -> u64 {
        if !self.mmu_on() {
            return IDENTITY_ROOT;
        }
        let ttbr = if self.upper(vaddr) {
            self.ttbr1
        } else {
            self.ttbr0
        };
        (ttbr & TTBR_BADDR) | self.asid() << 48
    }

    /// The smaller of the two halves' granules (they may differ); halves with walks
    /// disabled or a reserved granule give no translations and do not count. With the
    /// MMU off any size is right for the identity map.
    fn page_granule(&self) -> u64 {
        [false, true]
            .into_iter()
            .filter(|&upper| !self.disabled(upper))
            .filter_map(|upper| self.granule(upper))
            .map(Granule::size)
            .min()
            .unwrap_or(4096)
    }
}
