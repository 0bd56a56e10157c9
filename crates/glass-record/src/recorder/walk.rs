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
    /// With `--unwind auto` on x86-64, a walk follows frame records (two words a frame,
    /// no table lookup: the least a walk can cost the stopped guest) after one CFI step
    /// for the leaf, and keeps that walk only where every pair of adjacent frames in it
    /// was seen in an earlier walk that CFI made too and that gave the same frames
    /// ([`FrameRecords`]); otherwise the walk is made by CFI, and compared. A function
    /// without a frame record above the leaf makes its caller's record skip a frame: the
    /// pair it leaves is one no correct walk has, so that walk is made by CFI.
    pub(super) fn walk_live(
        &mut self,
        space: &mut AddressSpace,
        arch: Arch,
        regs: UnwindRegs,
        read_word: &mut dyn FnMut(u64) -> Option<u64>,
        frames: &mut Vec<u64>,
    ) -> u8 {
        if !self.by_frame_records(arch, regs) {
            let unwind = self.unwind;
            let end = self.walk_words(space, arch, regs, read_word, frames, unwind);
            return self.ended_live(end);
        }
        let mut hybrid = std::mem::take(&mut self.scratch);
        hybrid.clear();
        let hybrid_end =
            walk_leaf_then_records(space, regs, read_word, self.max_depth, &mut hybrid);
        let end = if hybrid_end == Some(WalkEnd::Complete) && self.frame_records.known(&hybrid) {
            self.frame_records.by_records += 1;
            frames.extend_from_slice(&hybrid);
            WalkEnd::Complete
        } else {
            let end = self.walk_words(space, arch, regs, read_word, frames, UnwindMode::Auto);
            if hybrid_end.is_some() {
                self.frame_records
                    .compared(frames, &hybrid, end == WalkEnd::Complete);
            } else {
                // No CFI for the leaf (a hypercall page): nothing to compare.
                self.frame_records.by_cfi_alone += 1;
            }
            end
        };
        self.scratch = hybrid;
        self.ended_live(end)
    }

    /// Whether a walk in place from `regs` tries frame records ([`StackWalker::walk_live`]).
    fn by_frame_records(&self, arch: Arch, regs: UnwindRegs) -> bool {
        self.unwind == UnwindMode::Auto
            && arch == Arch::X86_64
            && self.frame_records.worth_trying()
            && self
                .guest_kernel_orc
                .as_ref()
                .is_none_or(|orc| orc.find(regs.ip).is_none())
    }

    /// A walk in place made only to bring what the next one will read into the caches,
    /// while the target runs (its stack may change under it: what the walk finds is
    /// dropped, and nothing is counted or learned). At 101 Hz in the nested dom0 a walk
    /// made cold, after 10 ms of sleep, took 37-62 us of the stop against 8-12 us at
    /// 997 Hz.
    pub(super) fn warm(
        &mut self,
        space: &mut AddressSpace,
        arch: Arch,
        regs: UnwindRegs,
        read_word: &mut dyn FnMut(u64) -> Option<u64>,
    ) {
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        if self.by_frame_records(arch, regs) {
            let end = walk_leaf_then_records(space, regs, read_word, self.max_depth, &mut scratch);
            if end.is_some() {
                let _ = self.frame_records.would_keep(&scratch);
            }
        } else {
            let unwind = self.unwind;
            let _ = self.walk_words(space, arch, regs, read_word, &mut scratch, unwind);
        }
        self.scratch = scratch;
    }

    fn ended_live(&mut self, end: WalkEnd) -> u8 {
        self.live_walks_unreadable += u64::from(end == WalkEnd::Unreadable);
        truncation_flags(end, 0, 0)
    }

    /// How the in-place walks went, for the summary (None if none tried frame records).
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

/// Which walks made in place may follow frame records: those whose every pair of
/// adjacent frames (from the leaf's caller on, the last one paired with the stack's end)
/// an agreeing CFI walk had ([`StackWalker::walk_live`]).
#[derive(Default)]
struct FrameRecords {
    /// Adjacent frames of walks where frame records and CFI agreed (0: the stack's end).
    pairs: std::collections::HashSet<(u64, u64), foldhash::fast::RandomState>,
    /// The last walk kept, whose pairs are all in `pairs` (from its leaf's caller on).
    last_kept: Vec<u64>,
    /// Walks kept as frame records gave them, and walks whose leaf no CFI describes
    /// (made by CFI's fallbacks, not compared).
    by_records: u64,
    by_cfi_alone: u64,
    /// Walks made by CFI and compared, and how many of them disagreed.
    compared: u64,
    disagreed: u64,
    /// The first disagreement: the walk (counted from 1 over every walk that tried frame
    /// records), the frame's depth and what each walk had there (None: it had ended).
    first_disagreement: Option<(u64, usize, Option<u64>, Option<u64>)>,
}

impl FrameRecords {
    /// Pairs kept (a bound on memory; past it they are learned afresh).
    const MAX_PAIRS: usize = 1 << 16;
    /// Disagreements after which, if they are most of the comparisons, an image without
    /// frame records is walked by CFI alone.
    const GIVE_UP_AFTER: u64 = 16;

    fn worth_trying(&self) -> bool {
        self.disagreed < Self::GIVE_UP_AFTER || self.disagreed * 2 <= self.compared
    }

    fn walks(&self) -> u64 {
        self.by_records + self.compared + self.by_cfi_alone
    }

    fn pairs_of(frames: &[u64]) -> impl Iterator<Item = (u64, u64)> + '_ {
        let from_caller = frames.get(1..).unwrap_or(&[]);
        from_caller
            .iter()
            .zip(from_caller.iter().skip(1).chain([&0]))
            .map(|(&a, &b)| (a, b))
    }

    /// Whether a walk by frame records may be kept: every pair of it already seen. The
    /// frames it ends with in common with the last walk kept (from that walk's leaf's
    /// caller on) have their pairs known without a lookup: consecutive samples mostly
    /// share their callers, and a deep recursion's 80 lookups were most of its walk.
    fn known(&mut self, by_records: &[u64]) -> bool {
        let known = self.would_keep(by_records);
        if known {
            self.kept(by_records);
        }
        known
    }

    /// [`FrameRecords::known`]'s answer, without remembering the walk.
    fn would_keep(&self, by_records: &[u64]) -> bool {
        let len = by_records.len();
        if len < 2 {
            return false;
        }
        let shared = by_records
            .iter()
            .rev()
            .zip(self.last_kept.iter().rev())
            .take_while(|(a, b)| a == b)
            .count()
            .min(self.last_kept.len().saturating_sub(1));
        // The pairs (frames[i], frames[i + 1], or the stack's end 0) from i = 1 that do
        // not begin in the shared frames.
        (1..len - shared).all(|i| {
            let next = by_records.get(i + 1).copied().unwrap_or(0);
            self.pairs.contains(&(by_records[i], next))
        })
    }

    fn kept(&mut self, walk: &[u64]) {
        self.last_kept.clear();
        self.last_kept.extend_from_slice(walk);
    }

    /// A walk was made by CFI (`complete`: to the stack's end) after the one by frame
    /// records: where they agree, its pairs are known from now on.
    fn compared(&mut self, by_cfi: &[u64], by_records: &[u64], complete: bool) {
        self.compared += 1;
        if by_cfi == by_records {
            if complete {
                if self.pairs.len() >= Self::MAX_PAIRS {
                    self.pairs.clear();
                }
                self.pairs.extend(Self::pairs_of(by_cfi));
                self.kept(by_cfi);
            }
            return;
        }
        self.disagreed += 1;
        let depth = (0..)
            .find(|&i| by_cfi.get(i) != by_records.get(i))
            .unwrap_or(0);
        let walk = self.walks();
        self.first_disagreement.get_or_insert((
            walk,
            depth,
            by_cfi.get(depth).copied(),
            by_records.get(depth).copied(),
        ));
    }

    fn figure(&self) -> Option<String> {
        let walks = self.walks();
        if walks == 0 {
            return None;
        }
        let frame =
            |address: Option<u64>| address.map_or("its end".to_string(), |a| format!("{a:#x}"));
        let mut figure = format!(
            "stacks walked in place: {} of {walks} by frame records after a CFI step for the leaf, each of their adjacent frames first seen in a CFI walk that agreed; {} by CFI, {} of them unlike frame records' walk",
            self.by_records,
            self.compared + self.by_cfi_alone,
            self.disagreed
        );
        if let Some((walk, depth, by_cfi, by_records)) = self.first_disagreement {
            figure.push_str(&format!(
                " (first at walk {walk}, frame {depth}: CFI {}, frame records {})",
                frame(by_cfi),
                frame(by_records)
            ));
        }
        if !self.worth_trying() {
            figure.push_str("; frame records given up: most walks disagreed");
        }
        Some(figure)
    }
}

/// x86-64: the leaf's caller by one CFI step, then frame records. None where CFI does
/// not describe the leaf.
fn walk_leaf_then_records(
    space: &mut AddressSpace,
    regs: UnwindRegs,
    read_word: &mut dyn FnMut(u64) -> Option<u64>,
    max_depth: usize,
    frames: &mut Vec<u64>,
) -> Option<WalkEnd> {
    let caller = space.unwinder.caller_of_leaf(regs, read_word)?;
    frames.push(regs.ip);
    Some(walk_frame_pointers_by_word(
        caller,
        read_word,
        max_depth.saturating_sub(1),
        frames,
    ))
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
    fn a_walk_by_frame_records_is_kept_only_where_cfi_agreed_on_each_of_its_adjacent_frames() {
        let mut records = FrameRecords::default();
        // leaf 0x10 in gamma (no frame), gamma 0x20, dispatch 0x30, run 0x40.
        let whole = [0x10, 0x20, 0x30, 0x40];
        assert!(
            !records.known(&whole),
            "nothing is known before a CFI walk agreed"
        );
        records.compared(&whole, &whole, true);
        assert!(records.known(&whole));
        // Another leaf under the same callers: its caller's pairs are known.
        assert!(records.known(&[0x11, 0x20, 0x30, 0x40]));
        // A frame record that skips a frameless function's caller (0x30): the pair
        // (0x20, 0x40) was never in an agreeing walk.
        assert!(!records.known(&[0x10, 0x20, 0x40]));
        // Cut short: its last frame was never the stack's end.
        assert!(!records.known(&[0x10, 0x20, 0x30]));
        // A frameless caller (0x50's function) under the leaf's: its caller's frame
        // (0x30) skipped. The disagreement learns nothing and is reported.
        records.compared(&[0x12, 0x50, 0x30, 0x40], &[0x12, 0x50, 0x40], true);
        assert!(!records.known(&[0x12, 0x50, 0x40]));
        let figure = records.figure().unwrap();
        assert!(
            figure.contains("(first at walk 2, frame 2: CFI 0x30, frame records 0x40)"),
            "{figure}"
        );
        // A deep stack kept (its pairs learned), then walks sharing its callers: the
        // shared frames need no lookup, the pairs where they differ still do.
        let deep: Vec<u64> = [0x13].into_iter().chain(0x100..0x150).collect();
        records.compared(&deep, &deep, true);
        assert!(records.known(&deep));
        let mut other_leaf = deep.clone();
        other_leaf[0] = 0x14;
        assert!(records.known(&other_leaf));
        // The leaf's caller skipped (0x100): the pair (0x101, ...) is shared, but the
        // walk's first pair is not the kept walk's.
        let mut skipped = deep.clone();
        skipped.remove(1);
        skipped[0] = 0x15;
        assert!(
            records.known(&skipped),
            "(0x101, 0x102) was a pair of the deep walk"
        );
        let mut unknown_caller = deep.clone();
        unknown_caller[1] = 0x999;
        assert!(
            !records.known(&unknown_caller),
            "(0x999, 0x101) was never seen"
        );
        // The last walk kept is a suffix of this one: its leaf (0x15) is no caller in it.
        let mut longer = vec![0x16, 0x15];
        longer.extend_from_slice(&skipped[1..]);
        assert!(
            !records.known(&longer),
            "(0x15, 0x101) was never seen: a kept walk's leaf has no pair"
        );
        // An image without frame records: given up once most walks disagree.
        let mut tried = 0;
        while records.worth_trying() && tried < 100 {
            records.compared(&[1, 2, 3], &[1, 3], true);
            tried += 1;
        }
        assert_eq!(tried, FrameRecords::GIVE_UP_AFTER - 1);
        assert!(records
            .figure()
            .unwrap()
            .ends_with("frame records given up: most walks disagreed"));
    }
}
