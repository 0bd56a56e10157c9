//! What every architecture's page-table walker gives and how it fails, and the trait the
//! translation cache walks through, so one cache serves x86-64 and AArch64 guests.

use std::fmt;

use crate::aarch64::Aarch64Paging;
use crate::ram::PhysicalMemory;
use crate::x86_64::X86Paging;

/// A guest-virtual address's physical page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Translation {
    /// Physical address of `vaddr` itself.
    pub physical: u64,
    /// Size of the page or block it lies in (a power of two).
    pub page_size: u64,
    /// The descriptor that mapped it, read again to verify a cached translation. None
    /// when no table was walked (AArch64 with its MMU off: there is nothing to change).
    pub leaf: Option<LeafEntry>,
}

/// Where a leaf entry lives (guest-physical) and what it held when walked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeafEntry {
    pub address: u64,
    pub value: u64,
}

/// Why an address did not translate. Levels are numbered as each architecture numbers
/// them: x86-64 5 (PML5) ... 1 (PT); AArch64 0 ... 3 (the page level).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WalkError {
    /// The entry at this level is not present (x86) or invalid (AArch64, bit 0 clear).
    NotPresent { level: u32 },
    /// An encoding the architecture reserves at this level: x86 a page-size bit in a
    /// PML5E/PML4E; AArch64 a block where blocks are not allowed, or 0b01 at level 3.
    Reserved { level: u32 },
    /// A table lies outside guest RAM.
    OutsideRam,
    /// x86: not a canonical address for the paging mode (above 4 GiB outside long mode).
    NonCanonical,
    /// AArch64: in neither the TTBR0 nor the TTBR1 range (the bits above the region
    /// size are neither all zeros nor all ones).
    OutsideRange,
    /// AArch64: TCR_EL1.EPD0/EPD1 disables walks for the half this address is in.
    WalksDisabled,
    /// AArch64: TCR_EL1.TG0/TG1 holds a reserved granule encoding.
    ReservedGranule,
}

impl fmt::Display for WalkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WalkError::NotPresent { level } => write!(f, "entry not present at level {level}"),
            WalkError::Reserved { level } => write!(f, "reserved entry encoding at level {level}"),
            WalkError::OutsideRam => f.write_str("page table outside guest RAM"),
            WalkError::NonCanonical => f.write_str("non-canonical address"),
            WalkError::OutsideRange => f.write_str("address outside both translation ranges"),
            WalkError::WalksDisabled => f.write_str("table walks disabled for this range"),
            WalkError::ReservedGranule => f.write_str("reserved translation granule"),
        }
    }
}

impl std::error::Error for WalkError {}

/// A guest's address translation as it stands on one vCPU (its paging registers).
pub trait PageWalk {
    /// Walks the guest's tables for `vaddr`.
    fn walk(&self, memory: &dyn PhysicalMemory, vaddr: u64) -> Result<Translation, WalkError>;

    /// The table root `vaddr` is walked from, as the first half of a cache key: two
    /// address spaces must give different roots (x86: CR3's table address; AArch64: the
    /// selected TTBR's table address with the ASID in effect).
    fn cache_root(&self, vaddr: u64) -> u64;

    /// The smallest page size `walk` can give (4096 on x86-64): the cache's key unit and
    /// the chunk `read_with` copies.
    fn page_granule(&self) -> u64;
}

/// One vCPU's paging, whatever the guest's architecture, so a backend can hold it per
/// vCPU and hand it to the cache without knowing which it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuestPaging {
    X86_64(X86Paging),
    Aarch64(Aarch64Paging),
}

impl PageWalk for GuestPaging {
    fn walk(&self, memory: &dyn PhysicalMemory, vaddr: u64) -> Result<Translation, WalkError> {
        match self {
            GuestPaging::X86_64(paging) => paging.walk(memory, vaddr),
            GuestPaging::Aarch64(paging) => paging.walk(memory, vaddr),
        }
    }

    fn cache_root(&self, vaddr: u64) -> u64 {
        match self {
            GuestPaging::X86_64(paging) => paging.cache_root(vaddr),
            GuestPaging::Aarch64(paging) => paging.cache_root(vaddr),
        }
    }

    fn page_granule(&self) -> u64 {
        match self {
            GuestPaging::X86_64(paging) => paging.page_granule(),
            GuestPaging::Aarch64(paging) => paging.page_granule(),
        }
    }
}

impl From<X86Paging> for GuestPaging {
    fn from(paging: X86Paging) -> Self {
        GuestPaging::X86_64(paging)
    }
}

impl From<Aarch64Paging> for GuestPaging {
    fn from(paging: Aarch64Paging) -> Self {
        GuestPaging::Aarch64(paging)
    }
}
