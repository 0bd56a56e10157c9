//! The frame-pointer walk (x86-64 and AArch64 lay frames out the same way: the frame
//! pointer points at the saved caller frame pointer, with the return address one word
//! above it).
//!
//! Written here rather than taken from framehop because it must run inside the
//! target's stopped window against a [`StackWindow`] that reads more stack on demand
//! (a dozen lines). The AArch64 walk, which also weighs the link register, is in
//! [`crate::aarch64`].

use crate::window::{RemoteMemory, StackWindow};
use crate::UnwindRegs;

/// Why the walk stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WalkEnd {
    /// Reached the outermost frame (a zero frame pointer or return address).
    Complete,
    /// Hit the depth limit.
    DepthLimit,
    /// A frame pointer that did not move up the stack, or that lay outside it.
    BadFramePointer,
    /// Stack memory could not be read.
    Unreadable,
}

impl WalkEnd {
    pub fn is_truncated(self) -> bool {
        self != WalkEnd::Complete
    }
}

/// No thread stack is larger than this; a frame pointer further above the stack pointer
/// is not a frame pointer (the register holds data in code built without them).
const MAX_STACK_SPAN: u64 = 512 << 20;

/// Appends the instruction pointer and then each return address to `frames`, at most
/// `max_depth` addresses in all.
pub fn walk_frame_pointers(
    regs: UnwindRegs,
    window: &mut StackWindow,
    memory: &mut impl RemoteMemory,
    max_depth: usize,
    frames: &mut Vec<u64>,
) -> WalkEnd {
    walk_frame_pointers_by_word(
        regs,
        &mut |address| window.word(memory, address),
        max_depth,
        frames,
    )
}

/// [`walk_frame_pointers`] over memory read a word at a time (`read_word`): for memory
/// that costs nothing to reach but much to copy (a Xen guest's frames, mapped once, in a
/// dom0 whose every copy is emulated), the walk reads the two words of each frame record
/// and nothing else.
pub fn walk_frame_pointers_by_word(
    regs: UnwindRegs,
    read_word: &mut dyn FnMut(u64) -> Option<u64>,
    max_depth: usize,
    frames: &mut Vec<u64>,
) -> WalkEnd {
    frames.push(regs.ip);
    follow_chain(
        regs.fp,
        regs.sp,
        read_word,
        max_depth,
        frames,
        &|address| address,
        0,
    )
}

/// x86-64: the return address a frame-pointer walk skips when the sample is in a
/// function that has not set up a frame: a leaf gcc built without one (it does so even
/// with -fno-omit-frame-pointer), or any function before its `push rbp; mov rbp, rsp`.
/// rbp is then still its caller's, so the chain's first return address is the caller's
/// caller's. Such a function's return address is at the stack pointer, or just above
/// the rbp it has pushed; it is taken when it is code (`is_code`) and not already the
/// chain's first return address (`chained`). A frameless function that keeps other
/// things on the stack (locals, saved registers) is not found: only CFI finds its
/// return address (`--unwind auto`).
pub fn unchained_return_address(
    regs: UnwindRegs,
    read_word: &mut dyn FnMut(u64) -> Option<u64>,
    chained: Option<u64>,
    is_code: &dyn Fn(u64) -> bool,
) -> Option<u64> {
    let top = read_word(regs.sp)?;
    let candidate = if top == regs.fp && regs.fp != 0 {
        // Just after `push rbp`: the return address is above it.
        read_word(regs.sp + 8)?
    } else {
        top
    };
    (is_code(candidate) && Some(candidate) != chained).then_some(candidate)
}

/// Follows frame records from `fp` (saved frame pointer at `fp`, return address above
/// it): the part of the walk both architectures share. `frames` already holds the
/// first address(es); at most `max_depth` in all counting from its first entry.
/// `strip` makes a saved return address an address (AArch64's pointer authentication).
/// `switches`: how many times the chain may move to another stack (a frame record that
/// leads to a lower address: Linux's IRQ stack back to the task's, as the kernel's own
/// unwinder allows once per kind of stack); after a switch the chain must rise again.
pub(crate) fn follow_chain(
    fp: u64,
    sp: u64,
    read_word: &mut dyn FnMut(u64) -> Option<u64>,
    max_depth: usize,
    frames: &mut Vec<u64>,
    strip: &dyn Fn(u64) -> u64,
    switches: usize,
) -> WalkEnd {
    follow_chain_of(8, fp, sp, read_word, max_depth, frames, strip, switches)
}

/// 32-bit x86 (protected mode guests): frame records of 4-byte words (saved ebp at ebp,
/// the return address at ebp + 4) in `stack`, a copy of the stack from `regs.sp`.
/// Appends the instruction pointer and each return address to `frames`; returns how
/// the walk ended and how many bytes from `regs.sp` it read (what a next copy needs).
/// Frame pointers only: framehop unwinds x86-64 and AArch64 CFI, not i386's. A sample
/// in a function before its `push ebp; mov ebp, esp` (or a frameless leaf) loses its
/// caller, as a 64-bit walk without CFI does.
pub fn walk_frame_pointers_32(
    regs: UnwindRegs,
    stack: &[u8],
    max_depth: usize,
    frames: &mut Vec<u64>,
) -> (WalkEnd, usize) {
    let mut wanted = 0usize;
    let mut read_word = |address: u64| {
        let offset = usize::try_from(address.checked_sub(regs.sp)?).ok()?;
        wanted = wanted.max(offset + 4);
        let bytes = stack.get(offset..offset.checked_add(4)?)?;
        Some(u64::from(u32::from_le_bytes(bytes.try_into().ok()?)))
    };
    frames.push(regs.ip);
    let end = follow_chain_of(
        4,
        regs.fp,
        regs.sp,
        &mut read_word,
        max_depth,
        frames,
        &|a| a,
        0,
    );
    (end, wanted)
}

/// [`follow_chain`] for frame records of `word`-byte words.
#[allow(clippy::too_many_arguments)]
fn follow_chain_of(
    word: u64,
    mut fp: u64,
    sp: u64,
    read_word: &mut dyn FnMut(u64) -> Option<u64>,
    max_depth: usize,
    frames: &mut Vec<u64>,
    strip: &dyn Fn(u64) -> u64,
    mut switches: usize,
) -> WalkEnd {
    let start = frames.len().saturating_sub(1);
    let mut lowest_allowed = sp;
    let mut stack_base = sp;
    loop {
        if fp == 0 {
            return WalkEnd::Complete;
        }
        if fp < lowest_allowed && fp.is_multiple_of(word) && switches > 0 {
            switches -= 1;
            lowest_allowed = fp;
            stack_base = fp;
        }
        if fp < lowest_allowed || !fp.is_multiple_of(word) || fp - stack_base > MAX_STACK_SPAN {
            return WalkEnd::BadFramePointer;
        }
        if frames.len() - start >= max_depth {
            return WalkEnd::DepthLimit;
        }
        let Some(return_address) = read_word(fp + word) else {
            return WalkEnd::Unreadable;
        };
        let Some(caller_fp) = read_word(fp) else {
            return WalkEnd::Unreadable;
        };
        if return_address == 0 {
            return WalkEnd::Complete;
        }
        frames.push(strip(return_address));
        // The caller's frame must lie strictly above this one: this is the loop check.
        lowest_allowed = fp + 2 * word;
        fp = caller_fp;
    }
}

#[cfg(test)]
mod leaf_tests {
    use super::*;

    #[test]
    fn a_32_bit_chain_is_walked_in_4_byte_words_to_its_zero_frame_pointer() {
        // sp 0x1000: [0x1008] = 0x1010 (saved ebp), [0x100c] = 0x2222; [0x1010] = 0,
        // [0x1014] = 0x3333 (the outermost frame's return address).
        let mut stack = vec![0u8; 0x20];
        let mut put = |at: usize, v: u32| stack[at..at + 4].copy_from_slice(&v.to_le_bytes());
        put(0x8, 0x1010);
        put(0xc, 0x2222);
        put(0x10, 0);
        put(0x14, 0x3333);
        let regs = UnwindRegs::new(0x1111, 0x1000, 0x1008);
        let mut frames = Vec::new();
        let (end, wanted) = walk_frame_pointers_32(regs, &stack, 64, &mut frames);
        assert_eq!(frames, [0x1111, 0x2222, 0x3333]);
        assert_eq!((end, wanted), (WalkEnd::Complete, 0x18));
        // A chain that leaves the copy is unreadable there.
        let mut frames = Vec::new();
        let (end, _) = walk_frame_pointers_32(regs, &stack[..0x12], 64, &mut frames);
        assert_eq!((end, frames.len()), (WalkEnd::Unreadable, 2));
    }

    #[test]
    fn a_frameless_leafs_return_address_is_found_and_a_framed_functions_is_not_doubled() {
        let code = |a: u64| (0x1000..0x2000).contains(&a);
        let stack = |words: Vec<(u64, u64)>| {
            move |a: u64| words.iter().find(|(at, _)| *at == a).map(|(_, w)| *w)
        };
        let regs = |sp, fp| UnwindRegs {
            ip: 0x1010,
            sp,
            fp,
            ..UnwindRegs::default()
        };
        // A frameless leaf: its return address at sp, rbp the caller's frame.
        let mut read = stack(vec![(0x7000, 0x1234), (0x7100, 0x7200), (0x7108, 0x1500)]);
        assert_eq!(
            unchained_return_address(regs(0x7000, 0x7100), &mut read, Some(0x1500), &code),
            Some(0x1234)
        );
        // Just after `push rbp`: the saved rbp at sp, the return address above it.
        let mut read = stack(vec![(0x6ff8, 0x7100), (0x7000, 0x1234)]);
        assert_eq!(
            unchained_return_address(regs(0x6ff8, 0x7100), &mut read, Some(0x1500), &code),
            Some(0x1234)
        );
        // A framed function after its prologue: a stack address at sp, not code.
        let mut read = stack(vec![(0x6ff0, 0x7100), (0x6ff8, 0x1234)]);
        assert_eq!(
            unchained_return_address(regs(0x6ff0, 0x6ff0), &mut read, Some(0x1234), &code),
            None
        );
        // The chain already holds it.
        let mut read = stack(vec![(0x7000, 0x1234)]);
        assert_eq!(
            unchained_return_address(regs(0x7000, 0x7100), &mut read, Some(0x1234), &code),
            None
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake stack: the test builds real frame layouts in a byte array.
    struct Memory {
        base: u64,
        bytes: Vec<u8>,
        reads: usize,
    }

    impl RemoteMemory for Memory {
        fn read(&mut self, addr: u64, buf: &mut [u8]) -> usize {
            self.reads += 1;
            let Some(offset) = addr.checked_sub(self.base) else {
                return 0;
            };
            let offset = offset as usize;
            if offset >= self.bytes.len() {
                return 0;
            }
            let n = buf.len().min(self.bytes.len() - offset);
            buf[..n].copy_from_slice(&self.bytes[offset..offset + n]);
            n
        }
    }

    fn stack_with_frames(base: u64, size: usize, frames: &[(u64, u64, u64)]) -> Memory {
        // (frame address, saved fp, return address)
        let mut bytes = vec![0u8; size];
        for &(at, saved, ret) in frames {
            let o = (at - base) as usize;
            bytes[o..o + 8].copy_from_slice(&saved.to_le_bytes());
            bytes[o + 8..o + 16].copy_from_slice(&ret.to_le_bytes());
        }
        Memory {
            base,
            bytes,
            reads: 0,
        }
    }

    #[test]
    fn walks_a_chain_to_the_end() {
        let base = 0x7000_0000;
        let mut memory = stack_with_frames(
            base,
            0x1000,
            &[
                (base + 0x100, base + 0x200, 0x401000),
                (base + 0x200, base + 0x300, 0x402000),
                (base + 0x300, 0, 0x403000),
            ],
        );
        let mut window = StackWindow::new();
        window.fill(&mut memory, base);
        let mut frames = Vec::new();
        let regs = UnwindRegs::new(0x400500, base, base + 0x100);
        let end = walk_frame_pointers(regs, &mut window, &mut memory, 512, &mut frames);
        assert_eq!(end, WalkEnd::Complete);
        assert_eq!(frames, vec![0x400500, 0x401000, 0x402000, 0x403000]);
        assert_eq!(window.reads(), 1);
    }

    #[test]
    fn a_frame_pointer_that_does_not_move_up_is_a_loop() {
        let base = 0x7000_0000;
        let mut memory = stack_with_frames(base, 0x1000, &[(base + 0x100, base + 0x100, 0x401000)]);
        let mut window = StackWindow::new();
        window.fill(&mut memory, base);
        let mut frames = Vec::new();
        let regs = UnwindRegs::new(1, base, base + 0x100);
        assert_eq!(
            walk_frame_pointers(regs, &mut window, &mut memory, 512, &mut frames),
            WalkEnd::BadFramePointer
        );
        assert_eq!(frames, vec![1, 0x401000]);
    }

    #[test]
    fn depth_limit_and_deep_stacks_need_few_reads() {
        let base = 0x7000_0000u64;
        let depth = 2000u64;
        let frames_spec: Vec<_> = (0..depth)
            .map(|i| {
                let at = base + 64 + i * 48;
                let saved = if i + 1 == depth { 0 } else { at + 48 };
                (at, saved, 0x400000 + i)
            })
            .collect();
        let mut memory = stack_with_frames(base, (64 + depth * 48 + 64) as usize, &frames_spec);
        let mut window = StackWindow::new();
        window.fill(&mut memory, base);
        let mut frames = Vec::new();
        let regs = UnwindRegs::new(7, base, base + 64);
        assert_eq!(
            walk_frame_pointers(regs, &mut window, &mut memory, 100_000, &mut frames),
            WalkEnd::Complete
        );
        assert_eq!(frames.len() as u64, depth + 1);
        assert!(window.reads() <= 4, "{} reads", window.reads());
        // The next sample of the same depth reads once.
        window.finish();
        window.fill(&mut memory, base);
        frames.clear();
        walk_frame_pointers(regs, &mut window, &mut memory, 100_000, &mut frames);
        assert_eq!(window.reads(), 1);
        frames.clear();
        assert_eq!(
            walk_frame_pointers(regs, &mut window, &mut memory, 10, &mut frames),
            WalkEnd::DepthLimit
        );
        assert_eq!(frames.len(), 10);
    }

    #[test]
    fn an_unmapped_frame_pointer_is_unreadable() {
        let base = 0x7000_0000;
        let mut memory =
            stack_with_frames(base, 0x1000, &[(base + 0x100, base + 0x4000, 0x401000)]);
        let mut window = StackWindow::new();
        window.fill(&mut memory, base);
        let mut frames = Vec::new();
        let regs = UnwindRegs::new(1, base, base + 0x100);
        assert_eq!(
            walk_frame_pointers(regs, &mut window, &mut memory, 512, &mut frames),
            WalkEnd::Unreadable
        );
    }
}
