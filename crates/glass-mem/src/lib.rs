//! Guest memory seen from outside the guest: its RAM (a read-only mapping of the file
//! QEMU backs it with, or QEMU's own memory read with process_vm_readv), the guest's own page tables walked by glass, and a translation
//! cache.
//!
//! Why a walker of our own: the alternative is asking the VMM (a GDB stub round trip
//! per read, tens of microseconds each under QEMU) while the guest is stopped. Walking
//! the tables in mapped RAM costs a few memory reads, and the cache makes the common
//! case (the same stack pages, sample after sample) one verification read.
//!
//! One module per architecture's walker (`x86_64`, `aarch64`), each implementing
//! [`PageWalk`] from `walk`, which also holds what they share; `cache` works with any.

pub mod aarch64;
pub mod cache;
pub mod process;
pub mod ram;
pub mod walk;
pub mod x86_64;

pub use aarch64::Aarch64Paging;
pub use cache::{TranslationCache, WordReader};
pub use process::{HostRange, ProcessRam};
pub use ram::{GuestRam, PhysicalMemory};
pub use walk::{GuestPaging, LeafEntry, PageWalk, Translation, WalkError};
pub use x86_64::{PagingMode, X86Paging};
