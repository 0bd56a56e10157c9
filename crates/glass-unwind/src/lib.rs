//! Stack unwinders that work on stack memory copied out of a target.
//!
//! An unwinder needs three registers (instruction pointer, stack pointer, frame pointer)
//! and a way to read words of the target's stack. The same walk serves a live process
//! (words read with `process_vm_readv` into a [`StackWindow`]), a VM guest read through
//! its page tables, and a snapshot stored in a recording.

pub mod cfi;
pub mod dwarf;
pub mod fp;
pub mod snapshot;
pub mod window;

pub use cfi::{cfi_sources, CfiSources};
pub use dwarf::DwarfUnwinder;
pub use fp::{walk_frame_pointers, WalkEnd};
pub use window::{RemoteMemory, StackWindow};

/// The registers an unwinder starts from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UnwindRegs {
    pub ip: u64,
    pub sp: u64,
    pub fp: u64,
}
