//! Guest physical memory backed by a file (QEMU `memory-backend-file`/memfd with
//! `share=on`), mapped read-only.

use std::fs::File;
use std::path::Path;

/// Reads guest-physical memory.
pub trait PhysicalMemory {
    /// Copies `buf.len()` bytes from guest-physical `address`; false if any byte lies
    /// outside RAM.
    fn read_physical(&self, address: u64, buf: &mut [u8]) -> bool;

    fn read_u64(&self, address: u64) -> Option<u64> {
        let mut word = [0u8; 8];
        self.read_physical(address, &mut word)
            .then(|| u64::from_le_bytes(word))
    }

    /// Where the memory keeps pages mapped: the 4 KiB page holding `physical`, readable
    /// for 4096 bytes from the pointer, which stays valid until [`PAGE_POINTER_SPAN`]
    /// other pages have been read through this memory (a reader that keeps one pointer
    /// and asks again whenever it reads elsewhere stays within that). None: read through
    /// [`PhysicalMemory::read_physical`].
    fn page_pointer(&self, _physical: u64) -> Option<std::ptr::NonNull<u8>> {
        None
    }

    /// A count that changes whenever a pointer [`PhysicalMemory::page_pointer`] gave may
    /// have stopped being valid, however few pages were read since (a cache of mappings
    /// that unmapped one): while it stays the same, every pointer given stays valid.
    /// None: pointers are held only as [`PAGE_POINTER_SPAN`] allows.
    fn pointer_generation(&self) -> Option<u64> {
        None
    }
}

/// See [`PhysicalMemory::page_pointer`]: the pages that may be read elsewhere while a
/// page pointer is held.
pub const PAGE_POINTER_SPAN: usize = 7;

/// One stretch of guest-physical address space and where it lies in the RAM file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RamRegion {
    pub guest_physical: u64,
    pub len: u64,
    pub file_offset: u64,
}

/// The guest's RAM and its layout.
pub struct GuestRam {
    bytes: Backing,
    regions: Vec<RamRegion>,
}

enum Backing {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Backing {
    fn as_slice(&self) -> &[u8] {
        match self {
            Backing::Mapped(map) => map,
            Backing::Owned(bytes) => bytes,
        }
    }
}

/// Where QEMU's x86 PC machines put RAM above the PCI hole: RAM past this size is
/// mapped from 4 GiB up. (pc: 3.5 GiB below 4 GiB when RAM exceeds it; q35: 2 GiB;
/// smaller guests have all RAM below.)
pub fn qemu_x86_layout(ram_size: u64, below_4g_max: u64) -> Vec<RamRegion> {
    let below = ram_size.min(below_4g_max);
    let mut regions = vec![RamRegion {
        guest_physical: 0,
        len: below,
        file_offset: 0,
    }];
    if ram_size > below {
        regions.push(RamRegion {
            guest_physical: 4 << 30,
            len: ram_size - below,
            file_offset: below,
        });
    }
    regions
}

/// Where QEMU's Arm `virt` machine puts RAM: all of it, contiguous, from 1 GiB up
/// (flash and devices lie below).
pub const QEMU_ARM_VIRT_RAM_BASE: u64 = 0x4000_0000;

/// QEMU's Arm `virt` machine: one region, the whole RAM file at
/// [`QEMU_ARM_VIRT_RAM_BASE`].
pub fn qemu_arm_virt_layout(ram_size: u64) -> Vec<RamRegion> {
    vec![RamRegion {
        guest_physical: QEMU_ARM_VIRT_RAM_BASE,
        len: ram_size,
        file_offset: 0,
    }]
}

impl GuestRam {
    /// Maps the RAM file read-only with the given layout.
    pub fn open(path: &Path, regions: Vec<RamRegion>) -> std::io::Result<Self> {
        let file = File::open(path)?;
        // SAFETY: read-only shared mapping; the guest writes to it concurrently, which
        // is why every read copies bytes out and treats them as untrusted.
        let map = unsafe { memmap2::Mmap::map(&file)? };
        Ok(GuestRam {
            bytes: Backing::Mapped(map),
            regions,
        })
    }

    /// RAM held in memory (tests, snapshots).
    pub fn from_bytes(bytes: Vec<u8>, regions: Vec<RamRegion>) -> Self {
        GuestRam {
            bytes: Backing::Owned(bytes),
            regions,
        }
    }

    pub fn size(&self) -> u64 {
        self.bytes.as_slice().len() as u64
    }

    fn file_offset(&self, address: u64, len: u64) -> Option<usize> {
        let end = address.checked_add(len)?;
        let region = self
            .regions
            .iter()
            .find(|r| address >= r.guest_physical && end <= r.guest_physical + r.len)?;
        usize::try_from(region.file_offset + (address - region.guest_physical)).ok()
    }
}

impl PhysicalMemory for GuestRam {
    /// Within the RAM file's mapping, which lives as long as the `GuestRam`.
    fn page_pointer(&self, physical: u64) -> Option<std::ptr::NonNull<u8>> {
        let offset = self.file_offset(physical & !4095, 4096)?;
        let page = self.bytes.as_slice().get(offset..offset + 4096)?;
        std::ptr::NonNull::new(page.as_ptr().cast_mut())
    }

    /// The RAM file stays mapped as long as the `GuestRam`.
    fn pointer_generation(&self) -> Option<u64> {
        Some(0)
    }

    fn read_physical(&self, address: u64, buf: &mut [u8]) -> bool {
        let Some(offset) = self.file_offset(address, buf.len() as u64) else {
            return false;
        };
        match self.bytes.as_slice().get(offset..offset + buf.len()) {
            Some(bytes) => {
                buf.copy_from_slice(bytes);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pci_hole_is_skipped() {
        let layout = qemu_x86_layout(6 << 30, 3 << 29);
        assert_eq!(layout.len(), 2);
        assert_eq!(layout[1].guest_physical, 4 << 30);
        assert_eq!(layout[1].file_offset, 3 << 29);
        assert_eq!(qemu_x86_layout(512 << 20, 3 << 29).len(), 1);
        let ram = GuestRam::from_bytes(
            vec![7; 4096],
            vec![
                RamRegion {
                    guest_physical: 0,
                    len: 2048,
                    file_offset: 0,
                },
                RamRegion {
                    guest_physical: 1 << 32,
                    len: 2048,
                    file_offset: 2048,
                },
            ],
        );
        let mut buf = [0u8; 8];
        assert!(ram.read_physical(0, &mut buf));
        assert!(ram.read_physical((1 << 32) + 2040, &mut buf));
        assert!(
            !ram.read_physical(2044, &mut buf),
            "crosses the end of a region"
        );
        assert!(!ram.read_physical(1 << 31, &mut buf), "in the hole");
    }

    #[test]
    fn arm_virt_ram_starts_at_1g() {
        assert_eq!(
            qemu_arm_virt_layout(256 << 20),
            vec![RamRegion {
                guest_physical: 0x4000_0000,
                len: 256 << 20,
                file_offset: 0,
            }]
        );
        let mut bytes = vec![0u8; 8192];
        bytes[4096] = 0xa5;
        let ram = GuestRam::from_bytes(bytes, qemu_arm_virt_layout(8192));
        let mut byte = [0u8; 1];
        assert!(ram.read_physical(0x4000_1000, &mut byte));
        assert_eq!(byte, [0xa5]);
        assert!(!ram.read_physical(0x1000, &mut byte), "below RAM");
        assert!(!ram.read_physical(0x4000_2000, &mut byte), "past RAM");
    }
}
