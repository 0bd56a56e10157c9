//! The Go probes' records, from the rings of the threads that wrote them to one stream
//! per goroutine.
//!
//! A goroutine runs on whichever thread the scheduler gives it, so a call's entry and
//! exit may lie in two threads' rings, and one thread's ring interleaves the calls of
//! many goroutines. The Go probes therefore key each record by its goroutine and its
//! slot relative to the goroutine's stack top (see `glass_probe_abi::KEYED_BIT`), and
//! the replay pairs them per goroutine ([`Replay::add_keyed`]). The relative slot, not
//! its address, is what stays the same when the runtime moves a goroutine's stack.
//! Calls on no goroutine's stack (a signal handler's first frames) are keyed by their
//! thread instead.
//!
//! Records must reach the replay in time order. Each ring is in order, and the probes
//! publish every keyed record at once, but one drain turn reads the rings one after the
//! other: a goroutine that went from thread A to thread B may have its later records
//! read (from B) in a turn that missed its earlier ones (A, read first, before they were
//! written). So records wait one turn: those stamped before the previous turn began are
//! sorted and replayed, the rest kept for the next turn; the last turn takes all.

use glass_probe_abi::{TscUnwrapper, EXIT_BIT, KEYED_BIT, KEYED_WORDS};

use crate::replay::Replay;

/// Thread ids the goroutine streams are written under: each goroutine (a `g`, which the
/// runtime reuses for later goroutines) is a thread of the recording from here up.
pub const GOROUTINE_TIDS: u32 = 1 << 30;

/// One keyed record, its time made whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Keyed {
    tsc: u64,
    /// The goroutine, or the thread pointer off any goroutine's stack.
    stack: u64,
    /// The slot, as a place on that stack: deeper calls have smaller ones.
    slot: u64,
    function: u32,
    exit: bool,
}

pub struct Goroutines {
    tsc_start: u64,
    /// Each writing thread's time unwrapper (records keep 44 bits of time).
    unwrap: std::collections::HashMap<u32, TscUnwrapper>,
    waiting: Vec<Keyed>,
    /// When the previous drain turn began, and the current one.
    previous_turn: u64,
    this_turn: u64,
    replay: Replay,
}

impl Goroutines {
    pub fn new(tsc_start: u64) -> Self {
        Goroutines {
            tsc_start,
            unwrap: Default::default(),
            waiting: Vec::new(),
            previous_turn: 0,
            this_turn: 0,
            replay: Replay::default(),
        }
    }

    /// A drain turn begins: `now` is the time stamp counter.
    pub fn begin_turn(&mut self, now: u64) {
        self.previous_turn = self.this_turn;
        self.this_turn = now;
    }

    /// Takes the keyed records out of one thread's `words` and returns the rest. A
    /// keyed record cut short by the end of the words (a ring cannot hold that, since
    /// the probe publishes whole records) is dropped.
    pub fn split(&mut self, tid: u32, words: &[u64]) -> Vec<u64> {
        let mut plain = Vec::with_capacity(words.len());
        let unwrap = self
            .unwrap
            .entry(tid)
            .or_insert_with(|| TscUnwrapper::new(self.tsc_start));
        let mut index = 0;
        while index < words.len() {
            let word = words[index];
            if word >> KEYED_BIT == 0 {
                plain.push(word);
                index += 1;
                continue;
            }
            if index + KEYED_WORDS > words.len() {
                break;
            }
            let event = unwrap.decode(word);
            self.waiting.push(Keyed {
                tsc: event.tsc,
                stack: words[index + 1],
                slot: words[index + 2],
                function: event.function,
                exit: word & (1 << EXIT_BIT) != 0,
            });
            index += KEYED_WORDS;
        }
        plain
    }

    /// Replays the records that can no longer be preceded by one still unread (all of
    /// them when `all`), and hands out each goroutine's new words: (thread id, words).
    pub fn end_turn(&mut self, all: bool, mut each: impl FnMut(u32, &[u64])) {
        let until = if all { u64::MAX } else { self.previous_turn };
        self.waiting.sort_unstable();
        let ready = self.waiting.partition_point(|record| record.tsc < until);
        for record in self.waiting.drain(..ready) {
            self.replay.add_keyed(
                record.stack,
                record.tsc,
                record.slot,
                record.function,
                record.exit,
            );
        }
        self.replay
            .take(|stack, words| each(GOROUTINE_TIDS + stack, words));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use glass_probe_abi::{encode, EventKind};

    /// A keyed record at `depth` bytes below the top of goroutine `g`'s stack.
    fn keyed(tsc: u64, function: u32, kind: EventKind, g: u64, depth: u64) -> [u64; 3] {
        [
            encode(tsc, function, kind) | 1 << KEYED_BIT,
            g,
            (1 << 62) - depth,
        ]
    }

    #[test]
    fn a_goroutine_that_moves_between_threads_is_one_stream_in_time_order() {
        let mut go = Goroutines::new(0);
        let mut out = Vec::new();
        go.begin_turn(1000);
        // Thread 2 is read first; its records are the goroutine's later ones, after it
        // left thread 1 (read second) in the middle of a call.
        let later: Vec<u64> = [
            keyed(30, 2, EventKind::Exit, 0xc000, 64),
            keyed(40, 1, EventKind::Exit, 0xc000, 8),
        ]
        .concat();
        let mut earlier: Vec<u64> = [
            keyed(10, 1, EventKind::Entry, 0xc000, 8),
            keyed(20, 2, EventKind::Entry, 0xc000, 64),
            // The stack-growth path enters 2 again at the same depth: one call.
            keyed(21, 2, EventKind::Entry, 0xc000, 64),
        ]
        .concat();
        earlier.push(encode(25, 9, EventKind::Entry));
        assert!(go.split(2, &later).is_empty());
        assert_eq!(go.split(1, &earlier), [encode(25, 9, EventKind::Entry)]);
        go.end_turn(false, |tid, words| out.push((tid, words.to_vec())));
        assert!(out.is_empty(), "records wait a turn");
        go.begin_turn(2000);
        go.end_turn(false, |tid, words| out.push((tid, words.to_vec())));
        assert_eq!(
            out,
            [(
                GOROUTINE_TIDS + 1,
                vec![
                    encode(10, 1, EventKind::Entry),
                    encode(20, 2, EventKind::Entry),
                    encode(30, 2, EventKind::Exit),
                    encode(40, 1, EventKind::Exit)
                ]
            )]
        );
    }

    #[test]
    fn a_panic_unwinds_the_calls_it_left_and_goroutines_stay_apart() {
        let mut go = Goroutines::new(0);
        let mut out = Vec::new();
        let words: Vec<u64> = [
            keyed(1, 1, EventKind::Entry, 0xa, 8),
            keyed(2, 1, EventKind::Entry, 0xb, 8),
            keyed(3, 2, EventKind::Entry, 0xa, 64),
            keyed(4, 3, EventKind::Entry, 0xa, 128),
            // 1 recovers: 2 and 3 were left by the panic.
            keyed(5, 1, EventKind::Exit, 0xa, 8),
        ]
        .concat();
        go.split(1, &words);
        go.end_turn(true, |tid, words| out.push((tid, words.to_vec())));
        use EventKind::*;
        assert_eq!(
            out,
            [
                (
                    GOROUTINE_TIDS + 1,
                    vec![
                        encode(1, 1, Entry),
                        encode(3, 2, Entry),
                        encode(4, 3, Entry),
                        encode(5, 3, Unwound),
                        encode(5, 2, Unwound),
                        encode(5, 1, Exit)
                    ]
                ),
                (GOROUTINE_TIDS + 2, vec![encode(2, 1, Entry)])
            ]
        );
    }
}
