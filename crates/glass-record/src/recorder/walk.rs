//! Walking a sample's stack: a copy once the target runs again, or the target's memory
//! in place while it is stopped (a Xen guest: `GuestBackend::walks_in_place`); by the
//! guest kernel's ORC tables where they cover the pc, else frame pointers or CFI as
//! asked; and, for `--capture raw`, the walk that tells which stack words the report's
//! own unwind will read, so that only those are kept verbatim. Apart from the recorder
//! because a walk needs only the stack's words and one address space, and says how it
//! ended: whether it was cut by the copy's length, and how much stack it wanted for the
//! next copy.

use glass_format::Arch;
use glass_unwind::orc::OrcTable;
use glass_unwind::snapshot::compact;
use glass_unwind::{walk_frame_pointers_by_word, UnwindRegs, WalkEnd};

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

/// The walks of one recording, and what they keep between samples.
pub(super) struct StackWalker {
    unwind: UnwindMode,
    max_depth: usize,
    /// An x86-64 Linux guest kernel's ORC tables (glass_linux_guest::orc), once read: kernel
    /// pcs they cover are walked with them.
    guest_kernel_orc: Option<OrcTable>,
    /// Walks that wanted stack memory outside every copy (another stack than the one
    /// copied): cut, though not by the copy's length.
    walks_outside_copies: u64,
    /// Walks made in place ([`StackWalker::walk_live`]) that met memory they could not
    /// read.
    live_walks_unreadable: u64,
    /// Whether in-place walks may follow frame records instead of CFI.
    frame_records: FrameRecords,
    /// The frame-record walk compared with a CFI one (reused buffer).
    scratch: Vec<u64>,
    /// Stack words the last raw snapshot's unwind read (reused buffer).
    read_words: Vec<usize>,
}

impl StackWalker {
    pub(super) fn new(unwind: UnwindMode, max_depth: usize) -> Self {
        StackWalker {
            unwind,
            max_depth,
            guest_kernel_orc: None,
            walks_outside_copies: 0,
            live_walks_unreadable: 0,
            frame_records: FrameRecords::default(),
            scratch: Vec::new(),
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
        let unwind = self.unwind;
        let end = self.walk_words(
            space,
            arch,
            regs,
            &mut |address| memory.word(address),
            frames,
            unwind,
        );
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

    /// Unwinds a stack read in place, a word at a time (`read_word`), while its target
    /// is stopped: no copy to be cut by, so a walk that could not read on ends truncated
    /// and is counted apart ([`StackWalker::live_walks_unreadable`]).
    ///
    /// With `--unwind auto`, the walks are by CFI until frame records are known to give
    /// the same frames: the first [`FrameRecords::TRIAL`] walks are made both ways and
    /// compared, and if every one agreed the later walks follow frame records alone (two
    /// words a frame, no table lookups: the least a walk can cost the stopped guest),
    /// with every [`FrameRecords::CHECK_EVERY`]th walk made both ways again. One walk that
    /// disagrees puts the recording back on CFI for good.
    pub(super) fn walk_live(
        &mut self,
        space: &mut AddressSpace,
        arch: Arch,
        regs: UnwindRegs,
        read_word: &mut dyn FnMut(u64) -> Option<u64>,
        frames: &mut Vec<u64>,
    ) -> u8 {
        let mode = match self.unwind {
            UnwindMode::Auto if self.frame_records.trusted_for_next() => UnwindMode::Fp,
            mode => mode,
        };
        let end = self.walk_words(space, arch, regs, read_word, frames, mode);
        if mode == UnwindMode::Auto && self.frame_records.comparing() {
            let mut by_records = std::mem::take(&mut self.scratch);
            by_records.clear();
            self.walk_words(
                space,
                arch,
                regs,
                read_word,
                &mut by_records,
                UnwindMode::Fp,
            );
            self.frame_records.compared(frames, &by_records);
            self.scratch = by_records;
        }
        self.live_walks_unreadable += u64::from(end == WalkEnd::Unreadable);
        truncation_flags(end, 0, 0)
    }

    /// How the in-place walks went, for the summary (None if there were none by CFI).
    pub(super) fn frame_records_figure(&self) -> Option<String> {
        self.frame_records.figure()
    }

    pub(super) fn live_walks_unreadable(&self) -> u64 {
        self.live_walks_unreadable
    }

    /// The walk itself, over stack words however they are read: by the guest kernel's
    /// ORC tables where they cover the pc, else frame pointers or CFI (`unwind`).
    fn walk_words(
        &mut self,
        space: &mut AddressSpace,
        arch: Arch,
        regs: UnwindRegs,
        read_word: &mut dyn FnMut(u64) -> Option<u64>,
        frames: &mut Vec<u64>,
        unwind: UnwindMode,
    ) -> WalkEnd {
        let max_depth = self.max_depth;
        let orc_end = self
            .guest_kernel_orc
            .as_ref()
            .filter(|orc| arch == Arch::X86_64 && orc.find(regs.ip).is_some())
            .map(|orc| orc.walk(regs, read_word, max_depth, frames));
        match unwind {
            _ if orc_end.is_some() => orc_end.unwrap_or(WalkEnd::Complete),
            UnwindMode::Fp if arch == Arch::Aarch64 => {
                let unwinder = &space.unwinder;
                glass_unwind::aarch64::walk_frame_records(
                    regs,
                    read_word,
                    max_depth,
                    frames,
                    &|a, b| unwinder.same_function(a, b),
                )
            }
            UnwindMode::Fp => walk_frame_pointers(space, regs, read_word, max_depth, frames),
            UnwindMode::Auto | UnwindMode::Dwarf => {
                space.unwinder.walk(regs, read_word, max_depth, frames)
            }
        }
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

/// Whether frame records give the frames CFI gives, judged over the in-place walks
/// ([`StackWalker::walk_live`]).
#[derive(Default)]
struct FrameRecords {
    /// In-place walks made with `--unwind auto`, either way.
    walks: u64,
    /// Walks made both ways, and how many of them disagreed.
    compared: u64,
    disagreed: u64,
    /// The walk (counted from 1) that first disagreed, and where: the frame's depth
    /// and what each walk had there (None: the walk had ended).
    first_disagreement: Option<(u64, usize, Option<u64>, Option<u64>)>,
}

impl FrameRecords {
    /// Walks made both ways before frame records are trusted.
    const TRIAL: u64 = 32;
    /// Once trusted, every this many walks one is made both ways again.
    const CHECK_EVERY: u64 = 64;

    fn trusted(&self) -> bool {
        self.disagreed == 0 && self.compared >= Self::TRIAL
    }

    /// Counts the next walk; true if it is to follow frame records alone.
    fn trusted_for_next(&mut self) -> bool {
        self.walks += 1;
        self.trusted() && !self.walks.is_multiple_of(Self::CHECK_EVERY)
    }

    /// Whether the walk just made by CFI is to be compared with frame records.
    fn comparing(&self) -> bool {
        self.disagreed == 0
    }

    fn compared(&mut self, by_cfi: &[u64], by_records: &[u64]) {
        self.compared += 1;
        if by_cfi != by_records {
            self.disagreed += 1;
            let depth = (0..)
                .find(|&i| by_cfi.get(i) != by_records.get(i))
                .unwrap_or(0);
            let walk = self.walks;
            self.first_disagreement.get_or_insert((
                walk,
                depth,
                by_cfi.get(depth).copied(),
                by_records.get(depth).copied(),
            ));
        }
    }

    fn figure(&self) -> Option<String> {
        if self.walks == 0 {
            return None;
        }
        let frame =
            |address: Option<u64>| address.map_or("its end".to_string(), |a| format!("{a:#x}"));
        Some(match self.first_disagreement {
            Some((walk, depth, by_cfi, by_records)) => format!(
                "stacks walked in place by CFI: frame records gave other frames at walk {walk} (of {} compared), frame {depth}: CFI {}, frame records {}",
                self.compared,
                frame(by_cfi),
                frame(by_records)
            ),
            None if self.trusted() => format!(
                "stacks walked in place by frame records (two words a frame): they gave the frames CFI gives in all {} walks made both ways (the first {}, then one in {})",
                self.compared,
                Self::TRIAL,
                Self::CHECK_EVERY
            ),
            None => format!(
                "stacks walked in place by CFI: {} of the {} walks that decide on frame records made so far",
                self.compared,
                Self::TRIAL
            ),
        })
    }
}

/// x86-64's frame-pointer walk, with the caller a chain skips.
fn walk_frame_pointers(
    space: &AddressSpace,
    regs: UnwindRegs,
    read_word: &mut dyn FnMut(u64) -> Option<u64>,
    max_depth: usize,
    frames: &mut Vec<u64>,
) -> WalkEnd {
    let start = frames.len();
    let end = walk_frame_pointers_by_word(regs, read_word, max_depth, frames);
    // A sample in a function without a frame (yet): its caller, which the chain
    // skips, from the return address at the stack pointer.
    let leaf_return = glass_unwind::unchained_return_address(
        regs,
        read_word,
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

#[cfg(test)]
mod tests {
    use super::FrameRecords;

    #[test]
    fn frame_records_are_trusted_after_the_trial_checked_again_and_dropped_at_one_disagreement() {
        let mut records = FrameRecords::default();
        for _ in 0..FrameRecords::TRIAL {
            assert!(!records.trusted_for_next(), "trusted during the trial");
            assert!(records.comparing());
            records.compared(&[1, 2, 3], &[1, 2, 3]);
        }
        // Trusted: only every CHECK_EVERY-th walk is made by CFI and compared.
        let by_cfi = (0..FrameRecords::CHECK_EVERY * 3)
            .filter(|_| !records.trusted_for_next())
            .count();
        assert_eq!(by_cfi, 3);
        assert!(records.figure().unwrap().contains("by frame records"));
        // One disagreement: CFI from then on, and no more comparing.
        while records.trusted_for_next() {}
        records.compared(&[1, 2, 3], &[1, 2]);
        assert!(!records.comparing());
        assert!((0..1000).all(|_| !records.trusted_for_next()));
        let figure = records.figure().unwrap();
        assert!(
            figure.starts_with(
                "stacks walked in place by CFI: frame records gave other frames at walk 256 (of 33 compared), frame 2: CFI 0x3, frame records its end"
            ),
            "{figure}"
        );
    }
}
