//! x86-64: the first step of a CFI walk, remembered per sampled instruction.
//!
//! A walk made while its target is stopped ([`crate::DwarfUnwinder::caller_of_leaf`])
//! takes one CFI step for the leaf and follows frame records from there. framehop's own
//! rule cache makes that step cheap to decide but not cheap to take: through its API a
//! hit still cost ~390 cycles here (its module lookup, the register conversion, the
//! catch of a parser panic, the check that an FDE covers the pc), most of a short walk's
//! time, and in a Xen dom0 under TCG every cycle of the stop is paid ~30 times over.
//! framehop's rules are not public, so the step each pc takes is found once by asking
//! framehop with made-up registers whose values tell where each result came from
//! ([`probe`]), twice with different values to be sure its shape is one of the two below,
//! and then taken with one hash lookup. A pc whose step has another shape (a CFA that
//! is an expression of other registers) asks framehop every time.

use std::collections::HashMap;

use crate::UnwindRegs;

/// The caller's (ip, sp, bp) from the leaf's, as a CFI rule gives them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LeafStep {
    /// A frame record is set up: ([bp + 8], bp + 16, [bp]).
    FrameRecord,
    /// No frame record (yet, or at all): ([sp + offset - 8], sp + offset, bp, or the word
    /// at sp + bp_at where the leaf saved it).
    OffsetSp { offset: u64, bp_at: Option<i64> },
}

/// What is known of a pc.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LeafMemo {
    /// No FDE covers it: no step.
    Undescribed,
    Step(LeafStep),
    /// A step of another shape: framehop takes it each time.
    AskFramehop,
}

/// Leaf steps per pc, emptied whenever a module is added (a pc no FDE covered may be
/// covered now).
#[derive(Default, Clone)]
pub(crate) struct LeafSteps {
    steps: HashMap<u64, LeafMemo, foldhash::fast::FixedState>,
}

impl LeafSteps {
    /// Bounds memory for a target that samples many distinct pcs (a JIT): past it the
    /// steps are learned afresh.
    const MAX: usize = 1 << 16;

    pub(crate) fn get(&self, ip: u64) -> Option<LeafMemo> {
        self.steps.get(&ip).copied()
    }

    pub(crate) fn insert(&mut self, ip: u64, memo: LeafMemo) {
        if self.steps.len() >= Self::MAX {
            self.steps.clear();
        }
        self.steps.insert(ip, memo);
    }

    pub(crate) fn clear(&mut self) {
        self.steps.clear();
    }
}

/// Tags a made-up stack word with the address it was read from.
const TAG: u64 = 0x5a5a_0000_0000_0000;

/// The shape of the step framehop takes from `ip`, found by letting `step` (framehop's
/// step from (ip, sp, bp), reading stack words through the function given, returning
/// the caller's (ip, sp, bp)) run on two sets of made-up registers, with each word read
/// holding its own address (tagged). None unless both give the same shape.
pub(crate) fn probe(
    ip: u64,
    mut step: impl FnMut(UnwindRegs, &mut dyn FnMut(u64) -> Option<u64>) -> Option<UnwindRegs>,
) -> Option<LeafStep> {
    let mut shape = |sp: u64, bp: u64| -> Option<LeafStep> {
        let caller = step(UnwindRegs::new(ip, sp, bp), &mut |address| {
            Some(address ^ TAG)
        })?;
        if caller.ip != caller.sp.wrapping_sub(8) ^ TAG {
            return None;
        }
        if caller.sp == bp.wrapping_add(16) && caller.fp == bp ^ TAG {
            return Some(LeafStep::FrameRecord);
        }
        let offset = caller.sp.wrapping_sub(sp);
        if !(8..=1 << 20).contains(&offset) {
            return None;
        }
        let bp_at = if caller.fp == bp {
            None
        } else {
            let at = (caller.fp ^ TAG).wrapping_sub(sp) as i64;
            if at.unsigned_abs() > 1 << 20 {
                return None;
            }
            Some(at)
        };
        Some(LeafStep::OffsetSp { offset, bp_at })
    };
    // Far apart, so that no offset from sp can reach bp's frame.
    let first = shape(0x1000_0000_0000, 0x2000_0000_0000)?;
    let second = shape(0x3000_0000_1238, 0x4000_0000_2ab0)?;
    (first == second).then_some(first)
}

impl LeafStep {
    /// The caller's registers, as framehop's rule of this shape gives them (None where
    /// it would end the walk or fail: a word unreadable, a zero frame pointer or return
    /// address, a frame record below the stack pointer).
    pub(crate) fn take(
        self,
        regs: UnwindRegs,
        read_word: &mut dyn FnMut(u64) -> Option<u64>,
    ) -> Option<UnwindRegs> {
        let (sp, bp) = match self {
            LeafStep::FrameRecord => {
                if regs.fp == 0 {
                    return None;
                }
                let sp = regs.fp.checked_add(16).filter(|&sp| sp > regs.sp)?;
                (sp, read_word(regs.fp)?)
            }
            LeafStep::OffsetSp { offset, bp_at } => {
                let sp = regs.sp.checked_add(offset)?;
                let bp = match bp_at {
                    None => regs.fp,
                    Some(at) => {
                        let at = regs.sp.checked_add_signed(at)?;
                        // As framehop: a word below the stack pointer, in the first frame
                        // (an epilogue that already popped it), may be unreadable.
                        match read_word(at) {
                            Some(bp) => bp,
                            None if at < regs.sp => regs.fp,
                            None => return None,
                        }
                    }
                };
                (sp, bp)
            }
        };
        let ip = read_word(sp - 8).filter(|&ip| ip != 0)?;
        Some(UnwindRegs::new(ip, sp, bp))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A step that is framehop's UseFramePointer rule.
    fn frame_record(
        regs: UnwindRegs,
        read: &mut dyn FnMut(u64) -> Option<u64>,
    ) -> Option<UnwindRegs> {
        let sp = regs.fp + 16;
        Some(UnwindRegs::new(read(sp - 8)?, sp, read(regs.fp)?))
    }

    #[test]
    fn each_shape_is_found_by_the_values_it_reads() {
        assert_eq!(probe(0x1000, frame_record), Some(LeafStep::FrameRecord));
        let offset_sp = |regs: UnwindRegs, read: &mut dyn FnMut(u64) -> Option<u64>| {
            let sp = regs.sp + 24;
            Some(UnwindRegs::new(read(sp - 8)?, sp, regs.fp))
        };
        assert_eq!(
            probe(0x1000, offset_sp),
            Some(LeafStep::OffsetSp {
                offset: 24,
                bp_at: None
            })
        );
        let restores_bp = |regs: UnwindRegs, read: &mut dyn FnMut(u64) -> Option<u64>| {
            let sp = regs.sp + 32;
            Some(UnwindRegs::new(read(sp - 8)?, sp, read(regs.sp + 16)?))
        };
        assert_eq!(
            probe(0x1000, restores_bp),
            Some(LeafStep::OffsetSp {
                offset: 32,
                bp_at: Some(16)
            })
        );
    }

    #[test]
    fn a_step_of_another_shape_is_not_remembered() {
        // The CFA read from the stack (a signal frame's rule): no fixed offset.
        let cfa_in_memory = |regs: UnwindRegs, read: &mut dyn FnMut(u64) -> Option<u64>| {
            let sp = read(regs.sp + 8)?;
            Some(UnwindRegs::new(read(sp - 8)?, sp, regs.fp))
        };
        assert_eq!(probe(0x1000, cfa_in_memory), None);
        // A shape that depends on the registers' values.
        let odd = |regs: UnwindRegs, read: &mut dyn FnMut(u64) -> Option<u64>| {
            let sp = regs.sp + if regs.sp & 0x1000 != 0 { 8 } else { 16 };
            Some(UnwindRegs::new(read(sp - 8)?, sp, regs.fp))
        };
        assert_eq!(probe(0x1000, odd), None);
        assert_eq!(probe(0x1000, |_, _| None), None);
    }

    #[test]
    fn a_remembered_step_gives_what_the_rule_gives() {
        let stack: HashMap<u64, u64> = [
            (0x7f00, 0x7f40),
            (0x7f08, 0x401234),
            (0x7ef8, 0x401999),
            (0x7ee0, 0x7f10),
        ]
        .into_iter()
        .collect();
        let mut read = |address: u64| stack.get(&address).copied();
        let regs = UnwindRegs::new(0x401000, 0x7ef0, 0x7f00);
        assert_eq!(
            LeafStep::FrameRecord.take(regs, &mut read),
            frame_record(regs, &mut read)
        );
        assert_eq!(
            LeafStep::OffsetSp {
                offset: 16,
                bp_at: None
            }
            .take(regs, &mut read),
            Some(UnwindRegs::new(0x401999, 0x7f00, 0x7f00))
        );
        // bp saved below sp (popped already) and unreadable: kept, as framehop does.
        assert_eq!(
            LeafStep::OffsetSp {
                offset: 16,
                bp_at: Some(-8)
            }
            .take(regs, &mut read),
            Some(UnwindRegs::new(0x401999, 0x7f00, 0x7f00))
        );
        assert_eq!(
            LeafStep::OffsetSp {
                offset: 16,
                bp_at: Some(-16)
            }
            .take(regs, &mut read),
            Some(UnwindRegs::new(0x401999, 0x7f00, 0x7f10))
        );
        // A zero frame pointer ends the walk.
        let no_frame = UnwindRegs::new(0x401000, 0x7ef0, 0);
        assert_eq!(LeafStep::FrameRecord.take(no_frame, &mut read), None);
    }
}
