//! From the guest probes' records to the trace format's per-thread streams.
//!
//! The call-style probe records each entry and exit with the address of the call's return
//! slot, from any vCPU, into one ring: it knows no threads (see
//! `glass_patch::call_trampoline`). Pairing is exact without them: an exit's slot is its
//! entry's. Nesting needs a thread, so calls are grouped by the stack their slots lie in:
//! a stack is the span of slots seen, grown by each record within `STACK_GAP` of it.
//! That is exact for guests that run one stack per vCPU (most unikernels) and for
//! threads whose stacks lie further apart than the gap; stacks closer than that merge.
//! Each stack becomes a thread of the recording, with the same 8-byte words the process
//! probe writes, so every trace report reads it unchanged.

use glass_patch::call_trampoline::Record;
use glass_probe_abi::{encode, EventKind};

/// Slots further than this from every stack seen start a stack of their own.
pub const STACK_GAP: u64 = 8 << 10;

#[derive(Default)]
struct Stack {
    low: u64,
    high: u64,
    /// Calls entered and not yet returned: (slot, function id), outermost first.
    open: Vec<(u64, u32)>,
    /// Words not yet handed out.
    words: Vec<u64>,
}

impl Stack {
    /// The exit of the open call at `slot`: calls entered after it, deeper, ended without
    /// returning (longjmp, a panic).
    fn exit(&mut self, tsc: u64, slot: u64, function: u32) {
        let Some(depth) = self.open.iter().rposition(|&(open, _)| open == slot) else {
            return;
        };
        while self.open.len() > depth + 1 {
            let (_, id) = self.open.pop().unwrap_or_default();
            self.words.push(encode(tsc, id, EventKind::Unwound));
        }
        self.open.pop();
        self.words.push(encode(tsc, function, EventKind::Exit));
    }

    /// A call entered at `slot`: open calls at or above it were left without returning.
    fn enter(&mut self, tsc: u64, slot: u64, function: u32) {
        while self.open.last().is_some_and(|&(open, _)| open <= slot) {
            let (_, id) = self.open.pop().unwrap_or_default();
            self.words.push(encode(tsc, id, EventKind::Unwound));
        }
        self.open.push((slot, function));
        self.words.push(encode(tsc, function, EventKind::Entry));
    }
}

/// The streams being rebuilt.
#[derive(Default)]
pub struct Replay {
    stacks: Vec<Stack>,
    /// The stack of each key, for keyed records.
    keyed: std::collections::HashMap<u64, usize>,
    /// Exits of calls entered before the probes were in place.
    pub unmatched_exits: u64,
}

impl Replay {
    pub fn add(&mut self, record: Record) {
        let function = u32::from(record.id);
        if record.exit {
            let found = self
                .stacks
                .iter()
                .position(|stack| stack.open.iter().any(|&(slot, _)| slot == record.slot));
            match found {
                Some(index) => self.stacks[index].exit(record.tsc, record.slot, function),
                None => self.unmatched_exits += 1,
            }
            return;
        }
        self.stack_of(record.slot)
            .enter(record.tsc, record.slot, function);
    }

    /// A record whose stack is known by a key (Go's probes: the goroutine), not by where
    /// its slot lies. A call entered again at the same slot before it returned is one
    /// call: Go's stack-growth path runs the function's first byte again, on the moved
    /// stack at the same depth. Keyed and unkeyed records never share a replay.
    pub fn add_keyed(&mut self, key: u64, tsc: u64, slot: u64, function: u32, exit: bool) {
        let index = match self.keyed.get(&key) {
            Some(&index) => index,
            None => {
                self.stacks.push(Stack::default());
                self.keyed.insert(key, self.stacks.len() - 1);
                self.stacks.len() - 1
            }
        };
        let stack = &mut self.stacks[index];
        if exit {
            if stack.open.iter().any(|&(open, _)| open == slot) {
                stack.exit(tsc, slot, function);
            } else {
                self.unmatched_exits += 1;
            }
        } else if stack.open.last() != Some(&(slot, function)) {
            stack.enter(tsc, slot, function);
        }
    }

    /// The stack a slot lies in (or near), made if none is near.
    fn stack_of(&mut self, slot: u64) -> &mut Stack {
        let distance = |stack: &Stack| {
            if slot < stack.low {
                stack.low - slot
            } else {
                slot.saturating_sub(stack.high)
            }
        };
        let nearest = self
            .stacks
            .iter()
            .enumerate()
            .map(|(index, stack)| (distance(stack), index))
            .filter(|&(gap, _)| gap <= STACK_GAP)
            .min();
        let index = match nearest {
            Some((_, index)) => index,
            None => {
                self.stacks.push(Stack {
                    low: slot,
                    high: slot,
                    ..Stack::default()
                });
                self.stacks.len() - 1
            }
        };
        let stack = &mut self.stacks[index];
        stack.low = stack.low.min(slot);
        stack.high = stack.high.max(slot);
        stack
    }

    /// Each stack's new words (stacks numbered from 1, in the order they were met).
    pub fn take(&mut self, mut each: impl FnMut(u32, &[u64])) {
        for (index, stack) in self.stacks.iter_mut().enumerate() {
            if !stack.words.is_empty() {
                each(index as u32 + 1, &stack.words);
                stack.words.clear();
            }
        }
    }

    /// Stacks met so far.
    pub fn stacks(&self) -> usize {
        self.stacks.len()
    }

    /// Calls entered and not returned.
    pub fn in_flight(&self) -> u64 {
        self.stacks.iter().map(|s| s.open.len() as u64).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use glass_probe_abi::TscUnwrapper;

    fn record(tsc: u64, slot: u64, id: u16, exit: bool) -> Record {
        Record {
            tsc,
            slot,
            id,
            exit,
        }
    }

    /// Each stack's events: (time stamp, function, kind).
    type Streams = Vec<(u32, Vec<(u64, u32, EventKind)>)>;

    fn events(replay: &mut Replay) -> Streams {
        let mut out = Vec::new();
        replay.take(|stack, words| {
            let mut unwrap = TscUnwrapper::new(0);
            out.push((
                stack,
                words
                    .iter()
                    .map(|&w| {
                        let e = unwrap.decode(w);
                        (e.tsc, e.function, e.kind)
                    })
                    .collect(),
            ));
        });
        out
    }

    #[test]
    fn two_vcpus_interleaved_become_two_nested_streams() {
        let mut replay = Replay::default();
        // vCPU 0 on a stack near 0x20_0000, vCPU 1 on one 64 KiB lower; their records
        // interleave in the ring.
        let (a, b) = (0x20_0000 - 0x100, 0x1f_0000 - 0x80);
        for r in [
            record(10, a, 1, false),
            record(11, b, 3, false),
            record(12, a - 0x40, 2, false),
            record(13, b, 3, true),
            record(14, a - 0x40, 2, true),
            record(15, a, 1, true),
        ] {
            replay.add(r);
        }
        assert_eq!(replay.stacks(), 2);
        assert_eq!(replay.in_flight(), 0);
        let streams = events(&mut replay);
        use EventKind::*;
        assert_eq!(
            streams,
            vec![
                (
                    1,
                    vec![(10, 1, Entry), (12, 2, Entry), (14, 2, Exit), (15, 1, Exit)]
                ),
                (2, vec![(11, 3, Entry), (13, 3, Exit)]),
            ]
        );
    }

    #[test]
    fn calls_left_without_returning_are_unwound_and_early_exits_counted() {
        let mut replay = Replay::default();
        let top = 0x8000_0000;
        // An exit of a call entered before the probes were in.
        replay.add(record(1, top + 0x100, 9, true));
        replay.add(record(2, top, 1, false));
        replay.add(record(3, top - 0x40, 2, false));
        replay.add(record(4, top - 0x80, 3, false));
        // 1 returns: 2 and 3 were left by a longjmp.
        replay.add(record(5, top, 1, true));
        // A new call at 3's slot's level, then one at the level of a call left open.
        replay.add(record(6, top, 4, false));
        replay.add(record(7, top + 8, 5, false));
        use EventKind::*;
        assert_eq!(replay.unmatched_exits, 1);
        assert_eq!(
            events(&mut replay),
            vec![(
                1,
                vec![
                    (2, 1, Entry),
                    (3, 2, Entry),
                    (4, 3, Entry),
                    (5, 3, Unwound),
                    (5, 2, Unwound),
                    (5, 1, Exit),
                    (6, 4, Entry),
                    (7, 4, Unwound),
                    (7, 5, Entry),
                ]
            )]
        );
        assert_eq!(replay.in_flight(), 1);
    }
}
