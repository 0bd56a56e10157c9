//! Walking a sample's stack copy once the target runs again: by the guest kernel's ORC
//! tables where they cover the pc, else frame pointers or CFI as asked; and, for
//! `--capture raw`, the walk that tells which stack words the report's own unwind will
//! read, so that only those are kept verbatim. Apart from the recorder because a walk
//! needs only the copy and one address space, and says how it ended: whether it was cut
//! by the copy's length, and how much stack it wanted for the next copy.

use glass_format::Arch;
use glass_unwind::orc::OrcTable;
use glass_unwind::snapshot::compact;
use glass_unwind::{walk_frame_pointers, RemoteMemory, StackWindow, UnwindRegs, WalkEnd};

use super::modules::AddressSpace;
use crate::UnwindMode;

/// A sample's copy of stack memory, and where to unwind it.
pub(super) struct StackCopy<'s> {
    pub(super) regs: UnwindRegs,
    /// From `regs.sp` up.
    pub(super) bytes: &'s [u8],
    /// More ranges (address, bytes): other stacks the walk may continue on
    /// ([`Event::Stack`](crate::event::Event::Stack)'s `other_stacks`).
    pub(super) other: &'s [(u64, &'s [u8])],
    /// The address space whose modules unwind it, where not the sample's process's
    /// (`Event::Stack`'s `space`: a Linux guest process's user stack).
    pub(super) space: Option<i32>,
}

/// Stack memory from a copy taken at the sample.
struct CopiedStack<'a> {
    sp: u64,
    bytes: &'a [u8],
    /// The highest address an unwinder asked for, to size later copies.
    high_water: u64,
    /// More ranges (address, bytes): other stacks the walk continues on.
    other: &'a [(u64, &'a [u8])],
    /// A word was asked for outside both ranges and not just past the first: the walk
    /// wanted memory glass did not copy (another stack's).
    outside: bool,
}

impl CopiedStack<'_> {
    fn word(&mut self, address: u64) -> Option<u64> {
        let at = |base: u64, bytes: &[u8]| {
            let offset = usize::try_from(address.checked_sub(base)?).ok()?;
            let word = bytes.get(offset..offset.checked_add(8)?)?;
            Some(u64::from_le_bytes(word.try_into().ok()?))
        };
        if let Some(word) = at(self.sp, self.bytes) {
            self.high_water = self.high_water.max(address + 8);
            return Some(word);
        }
        if let Some(word) = self.other.iter().find_map(|(base, bytes)| at(*base, bytes)) {
            return Some(word);
        }
        if address >= self.sp && address - self.sp <= (self.bytes.len() + 4096) as u64 {
            // Just past the copy: the same stack, deeper than copied.
            self.high_water = self.high_water.max(address + 8);
        } else if address.is_multiple_of(8) && address >> 63 == self.sp >> 63 {
            // A frame elsewhere in the same half (another stack); a word of data taken
            // for a frame pointer (unaligned, or a small number) is a walk gone astray.
            self.outside = true;
        }
        None
    }
}

impl RemoteMemory for CopiedStack<'_> {
    fn read(&mut self, address: u64, buf: &mut [u8]) -> usize {
        self.high_water = self.high_water.max(address + buf.len() as u64);
        let Some(offset) = address
            .checked_sub(self.sp)
            .and_then(|o| usize::try_from(o).ok())
        else {
            return 0;
        };
        let available = self.bytes.len().saturating_sub(offset);
        let n = available.min(buf.len());
        if n > 0 {
            buf[..n].copy_from_slice(&self.bytes[offset..offset + n]);
        }
        n
    }
}

/// The walks of one recording, and what they keep between samples.
pub(super) struct StackWalker {
    unwind: UnwindMode,
    max_depth: usize,
    window: StackWindow,
    /// An x86-64 Linux guest kernel's ORC tables (glass_linux_guest::orc), once read: kernel
    /// pcs they cover are walked with them.
    guest_kernel_orc: Option<OrcTable>,
    /// Walks that wanted stack memory outside every copy (another stack than the one
    /// copied): cut, though not by the copy's length.
    walks_outside_copies: u64,
    /// Stack words the last raw snapshot's unwind read (reused buffer).
    read_words: Vec<usize>,
}

impl StackWalker {
    pub(super) fn new(unwind: UnwindMode, max_depth: usize) -> Self {
        StackWalker {
            unwind,
            max_depth,
            window: StackWindow::new(),
            guest_kernel_orc: None,
            walks_outside_copies: 0,
            read_words: Vec::new(),
        }
    }

    pub(super) fn walk_guest_kernel_with(&mut self, table: OrcTable) {
        self.guest_kernel_orc = Some(table);
    }

    pub(super) fn walks_outside_copies(&self) -> u64 {
        self.walks_outside_copies
    }

    /// Unwinds `copy` in `space` after whatever `frames` holds; returns the sample's
    /// truncation flags (see [`truncation_flags`]) and how many bytes of stack it
    /// wanted.
    pub(super) fn walk(
        &mut self,
        space: &mut AddressSpace,
        arch: Arch,
        copy: &StackCopy,
        frames: &mut Vec<u64>,
    ) -> (u8, usize) {
        let regs = copy.regs;
        let first = frames.len();
        let mut memory = CopiedStack {
            sp: regs.sp,
            bytes: copy.bytes,
            high_water: regs.sp,
            other: copy.other,
            outside: false,
        };
        let max_depth = self.max_depth;
        let orc_end = self
            .guest_kernel_orc
            .as_ref()
            .filter(|orc| arch == Arch::X86_64 && orc.find(regs.ip).is_some())
            .map(|orc| orc.walk(regs, &mut |address| memory.word(address), max_depth, frames));
        let end = match self.unwind {
            _ if orc_end.is_some() => orc_end.unwrap_or(WalkEnd::Complete),
            UnwindMode::Fp if arch == Arch::Aarch64 => {
                let unwinder = &space.unwinder;
                glass_unwind::aarch64::walk_frame_records(
                    regs,
                    &mut |address| memory.word(address),
                    max_depth,
                    frames,
                    &|a, b| unwinder.same_function(a, b),
                )
            }
            UnwindMode::Fp => self.walk_frame_pointers(space, regs, &mut memory, frames),
            UnwindMode::Auto | UnwindMode::Dwarf => {
                space
                    .unwinder
                    .walk(regs, &mut |address| memory.word(address), max_depth, frames)
            }
        };
        if copy.space.is_some() {
            // A guest process's stack ends at its outermost frame in its own code: past
            // `_start` a walk reads whatever the kernel put there (argc).
            while frames.len() > first + 1 && frames.last().is_some_and(|&a| !space.contains(a)) {
                frames.pop();
            }
        }
        self.walks_outside_copies += u64::from(memory.outside && end == WalkEnd::Unreadable);
        let wanted = (memory.high_water - regs.sp) as usize;
        (truncation_flags(end, wanted, copy.bytes.len()), wanted)
    }

    /// x86-64's frame-pointer walk over a copy, with the caller a chain skips.
    fn walk_frame_pointers(
        &mut self,
        space: &AddressSpace,
        regs: UnwindRegs,
        memory: &mut CopiedStack,
        frames: &mut Vec<u64>,
    ) -> WalkEnd {
        let max_depth = self.max_depth;
        let start = frames.len();
        self.window.fill(memory, regs.sp);
        let end = walk_frame_pointers(regs, &mut self.window, memory, max_depth, frames);
        // A sample in a function without a frame (yet): its caller, which the chain
        // skips, from the return address at the stack pointer.
        let window = &mut self.window;
        let leaf_return = glass_unwind::unchained_return_address(
            regs,
            &mut |address| window.word(memory, address),
            frames.get(start + 1).copied(),
            &|address| space.contains(address),
        );
        if let Some(address) = leaf_return {
            frames.insert(start + 1, address);
            if frames.len() - start > max_depth {
                frames.pop();
            }
        }
        end
    }

    /// A `--capture raw` sample's stack, compacted: the walk the report will make (CFI,
    /// frame pointers as fallback) is made here too, noting every stack word it reads;
    /// those are kept verbatim, so the report's unwind of the compacted copy gives
    /// exactly these frames.
    pub(super) fn compact(
        &mut self,
        space: &mut AddressSpace,
        regs: UnwindRegs,
        stack: &[u8],
    ) -> Vec<u8> {
        let mut read_words = std::mem::take(&mut self.read_words);
        read_words.clear();
        let mut scratch = Vec::new();
        let sp = regs.sp;
        space.unwinder.walk(
            regs,
            &mut |address| {
                let offset = usize::try_from(address.checked_sub(sp)?).ok()?;
                let word = stack.get(offset..offset.checked_add(8)?)?;
                read_words.push(offset / 8);
                if offset % 8 != 0 {
                    read_words.push(offset / 8 + 1);
                }
                Some(u64::from_le_bytes(word.try_into().ok()?))
            },
            self.max_depth,
            &mut scratch,
        );
        read_words.sort_unstable();
        read_words.dedup();
        let mut encoded = Vec::new();
        let reach = read_words.last().map_or(0, |&last| last + 1);
        compact(
            stack,
            regs.sp,
            &|value| space.contains(value),
            &read_words,
            reach,
            &mut encoded,
        );
        self.read_words = read_words;
        encoded
    }

    /// x86-64, a frame-pointer walk made while the thread was stopped (`frames`): a
    /// sample in a function without a frame (yet) has its caller skipped by the chain;
    /// it is taken from the return address at the stack pointer (`top`: the words at
    /// `regs.sp` and above), as for a stack copy's walk.
    pub(super) fn recover_leaf_caller(
        &self,
        space: &AddressSpace,
        regs: UnwindRegs,
        top: [Option<u64>; 2],
        frames: &mut Vec<u64>,
    ) {
        let leaf_return = glass_unwind::unchained_return_address(
            regs,
            &mut |address| match address.wrapping_sub(regs.sp) {
                0 => top[0],
                8 => top[1],
                _ => None,
            },
            frames.get(1).copied(),
            &|address| space.contains(address),
        );
        if let Some(address) = leaf_return {
            frames.insert(1, address);
            if frames.len() > self.max_depth {
                frames.pop();
            }
        }
    }
}

/// The flags for how a walk over a stack copy of `copied` bytes ended, having asked for
/// `wanted` bytes above the stack pointer: SAMPLE_TRUNCATED, with SAMPLE_STACK_CUT when
/// the walk needed more of the stack than was copied. A read far above the copy (more
/// than a thread's usual 8 MiB stack) is a frame pointer register holding data in code
/// that keeps no frame, not a short copy.
fn truncation_flags(end: WalkEnd, wanted: usize, copied: usize) -> u8 {
    match end {
        WalkEnd::Complete => 0,
        WalkEnd::DepthLimit => glass_format::SAMPLE_TRUNCATED,
        _ if wanted > copied && wanted <= 8 << 20 => {
            glass_format::SAMPLE_TRUNCATED | glass_format::SAMPLE_STACK_CUT
        }
        _ => glass_format::SAMPLE_TRUNCATED,
    }
}
