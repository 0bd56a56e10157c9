//! Stack unwinders that work on stack memory copied out of a target.
//!
//! An unwinder needs the instruction pointer, the stack pointer, the frame pointer (and
//! on AArch64 the link register) and a way to read words of the target's stack. The
//! architecture is a value ([`Arch`]): a glass built for x86-64 unwinds an AArch64
//! guest's stacks, so nothing here is chosen by `cfg`. The same walk serves a live process
//! (words read with `process_vm_readv` into a [`StackWindow`]), a VM guest read through
//! its page tables, and a snapshot stored in a recording.

pub mod aarch64;
pub mod cfi;
pub mod dwarf;
pub mod fp;
mod leaf_step;
pub mod orc;
pub mod snapshot;
pub mod window;
pub mod x86_64;

pub use cfi::{cfi_sources, CfiSources};
pub use dwarf::DwarfUnwinder;
pub use fp::{
    unchained_return_address, walk_frame_pointers, walk_frame_pointers_32,
    walk_frame_pointers_by_word, WalkEnd,
};
pub use glass_format::Arch;
pub use window::{RemoteMemory, StackWindow};

/// The registers an unwinder starts from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UnwindRegs {
    pub ip: u64,
    pub sp: u64,
    /// rbp on x86-64, x29 on AArch64.
    pub fp: u64,
    /// AArch64's link register x30 (the return address of a function that has not saved
    /// it yet); 0 on x86-64, whose calls push the return address.
    pub lr: u64,
    /// AArch64's virtual address sizes in bits, of the lower and the upper half (64 minus
    /// TCR_EL1's T0SZ and T1SZ): the bits above them in a return address are a pointer
    /// authentication code (see [`aarch64::strip_pac`]). 0 where unknown: nothing is
    /// stripped.
    pub va_bits: [u8; 2],
}

impl UnwindRegs {
    /// x86-64's three (it has no link register).
    pub const fn new(ip: u64, sp: u64, fp: u64) -> Self {
        UnwindRegs {
            ip,
            sp,
            fp,
            lr: 0,
            va_bits: [0; 2],
        }
    }
}
