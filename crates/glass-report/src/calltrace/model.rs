//! Calls rebuilt from a `glass trace` recording: each thread's records replayed against
//! a stack by the scan's replay (one state machine for every trace format), their
//! timestamps made whole. An exit closes the innermost open call of its
//! function (calls above it whose exit was lost are closed with it, marked incomplete);
//! an unwound record closes a call that ended by longjmp or an exception.

use std::collections::HashMap;

use glass_format::Recording;
use glass_probe_abi::TSC_BITS;

use super::scan::{Sums, ThreadState};

const TSC_MASK: u64 = (1 << TSC_BITS) - 1;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub function: u32,
    /// Index into [`CallTrace::threads`].
    pub thread: usize,
    pub start: u64,
    pub end: u64,
    pub depth: u32,
    pub parent: Option<usize>,
    /// Time spent in traced callees (their inclusive time).
    pub children: u64,
    /// Ended by longjmp or an exception rather than a return.
    pub unwound: bool,
    /// Its end was not recorded (a lost record, or still running when tracing stopped).
    pub incomplete: bool,
    /// An ancestor is a call of the same function (recursion): its time is already
    /// inside the ancestor's. Known at entry from the replay's open counts.
    pub nested_in_itself: bool,
}

impl Call {
    pub fn cycles(&self) -> u64 {
        self.end - self.start
    }
    pub fn self_cycles(&self) -> u64 {
        self.cycles().saturating_sub(self.children)
    }
}

#[derive(Debug, Default)]
pub struct CallTrace {
    pub names: HashMap<u32, String>,
    /// (pid, tid) per thread index.
    pub threads: Vec<(u32, u32)>,
    /// Every call, in entry order per thread (threads one after another).
    pub calls: Vec<Call>,
    /// Cycles per second; 0 when the recording does not say.
    pub tsc_hz: u64,
    /// Hardware counters each record carries (names).
    pub counter_names: Vec<String>,
    /// Per call, the counters' increase over the call (inclusive), `counter_names.len()`
    /// values per call, in call order.
    pub counter_deltas: Vec<u64>,
    /// The earliest timestamp, the origin of timelines.
    pub first: u64,
    pub last: u64,
}

impl CallTrace {
    /// Every call of a recording: each thread's records replayed by
    /// [`scan`](super::scan)'s one replay (`ThreadState`), keeping the calls, their
    /// times made absolute again from the session's start.
    pub fn build(recording: &Recording) -> CallTrace {
        let summary = recording.trace_summary.clone().unwrap_or_default();
        let mut trace = CallTrace {
            names: recording
                .trace_functions
                .iter()
                .map(|f| (f.id, f.name.clone()))
                .collect(),
            tsc_hz: summary.tsc_hz,
            counter_names: summary.counters.clone(),
            first: u64::MAX,
            ..CallTrace::default()
        };
        // Each thread's chunks, in file order (their words are not copied together: a
        // trace's words are most of its memory).
        let mut order: Vec<(u32, u32)> = Vec::new();
        let mut chunks: HashMap<(u32, u32), Vec<&[u64]>> = HashMap::new();
        for chunk in &recording.trace_chunks {
            let key = (chunk.pid, chunk.tid);
            if !chunks.contains_key(&key) {
                order.push(key);
            }
            chunks.entry(key).or_default().push(&chunk.words);
        }
        let counters = trace.counter_names.len();
        let stride = 1 + counters;
        let mut sums = Sums::calls(counters);
        for key in order {
            let thread = trace.threads.len();
            trace.threads.push(key);
            let first_call = sums.calls.as_ref().map_or(0, |sink| sink.calls.len());
            // Records in order; one split across two chunks is put together, a partial
            // one at the end is dropped.
            let mut state = ThreadState::new(thread as u32, stride);
            for words in &chunks[&key] {
                for &word in words.iter() {
                    if stride == 1 {
                        state.record(word, &[], &mut sums);
                    } else {
                        state.word(word, &mut sums);
                    }
                }
            }
            state.finish(&mut sums);
            let Some(low) = state.first_low else {
                trace.last = trace.last.max(summary.tsc_start);
                continue;
            };
            // The first value at or after the session's start with these bits.
            let base = summary
                .tsc_start
                .wrapping_add(low.wrapping_sub(summary.tsc_start) & TSC_MASK);
            trace.first = trace.first.min(base);
            trace.last = trace.last.max(base.wrapping_add(state.now));
            if let Some(sink) = &mut sums.calls {
                for call in &mut sink.calls[first_call..] {
                    call.start = base.wrapping_add(call.start);
                    call.end = base.wrapping_add(call.end);
                }
            }
        }
        if trace.first == u64::MAX {
            trace.first = 0;
        }
        let sink = sums.calls.take().unwrap_or_default();
        trace.calls = sink.calls;
        trace.counter_deltas = sink.counter_deltas;
        trace
    }

    /// The counters' increase over call `index`.
    pub fn counters_of(&self, index: usize) -> &[u64] {
        let n = self.counter_names.len();
        &self.counter_deltas[index * n..index * n + n]
    }

    pub fn name(&self, function: u32) -> &str {
        self.names
            .get(&function)
            .map_or("[unknown]", String::as_str)
    }

    /// Nanoseconds for a number of cycles (0 when the cycle rate is unknown).
    pub fn ns(&self, cycles: u64) -> f64 {
        ns(self.tsc_hz, cycles)
    }

    /// A duration for people: ns, µs, ms or s, or cycles when the rate is unknown.
    pub fn duration(&self, cycles: u64) -> String {
        duration(self.tsc_hz, cycles)
    }

    /// Whether an ancestor of `index` is a call of the same function (recursion): its
    /// time is already inside the ancestor's.
    pub fn is_nested_in_itself(&self, index: usize) -> bool {
        self.calls[index].nested_in_itself
    }

    /// Call indices of each call's children.
    pub fn children(&self) -> Vec<Vec<usize>> {
        let mut children = vec![Vec::new(); self.calls.len()];
        for (index, call) in self.calls.iter().enumerate() {
            if let Some(parent) = call.parent {
                children[parent].push(index);
            }
        }
        children
    }
}

/// Nanoseconds for a number of cycles at `tsc_hz` (0 when the rate is unknown).
pub fn ns(tsc_hz: u64, cycles: u64) -> f64 {
    if tsc_hz == 0 {
        0.0
    } else {
        cycles as f64 * 1e9 / tsc_hz as f64
    }
}

/// A duration for people: ns, µs, ms or s, or cycles when the rate is unknown.
pub fn duration(tsc_hz: u64, cycles: u64) -> String {
    if tsc_hz == 0 {
        return format!("{cycles} cyc");
    }
    human_ns(ns(tsc_hz, cycles))
}

pub fn human_ns(ns: f64) -> String {
    if ns < 1e3 {
        format!("{ns:.0} ns")
    } else if ns < 1e6 {
        format!("{:.2} µs", ns / 1e3)
    } else if ns < 1e9 {
        format!("{:.2} ms", ns / 1e6)
    } else {
        format!("{:.2} s", ns / 1e9)
    }
}

/// Cycles in a short form: 950, 12.3k, 4.56M.
pub fn human_cycles(cycles: u64) -> String {
    let c = cycles as f64;
    if c < 1e4 {
        format!("{cycles}")
    } else if c < 1e7 {
        format!("{:.1}k", c / 1e3)
    } else if c < 1e10 {
        format!("{:.2}M", c / 1e6)
    } else {
        format!("{:.2}G", c / 1e9)
    }
}

#[cfg(test)]
mod tests {
    use glass_format::{TraceChunk, TraceFunction, TraceSummary};
    use glass_probe_abi::{encode, EventKind::*};

    use super::*;

    fn recording(threads: &[(u32, Vec<u64>)], start: u64) -> Recording {
        let mut recording = Recording {
            trace_summary: Some(TraceSummary {
                tsc_hz: 1_000_000_000,
                tsc_start: start,
                ..TraceSummary::default()
            }),
            ..Recording::default()
        };
        for (id, name) in ["main", "f", "g"].iter().enumerate() {
            recording.trace_functions.push(TraceFunction {
                id: id as u32,
                module: "m".into(),
                address: 0x1000 + id as u64,
                size: 1,
                name: name.to_string(),
                probe: "return address".to_string(),
            });
        }
        for (tid, words) in threads {
            // Split each thread's words over two chunks, as the drain does.
            let half = words.len() / 2;
            for part in [&words[..half], &words[half..]] {
                recording.trace_chunks.push(TraceChunk {
                    pid: 1,
                    tid: *tid,
                    words: part.to_vec(),
                });
            }
        }
        recording
    }

    #[test]
    fn nesting_self_time_lost_exits_and_unwinding() {
        let t = 1000;
        let words = vec![
            encode(t, 0, Entry),
            encode(t + 10, 1, Entry),
            encode(t + 15, 2, Entry),
            encode(t + 25, 2, Exit),
            encode(t + 40, 1, Exit),
            encode(t + 50, 1, Entry),
            encode(t + 52, 2, Entry), // its exit is lost
            encode(t + 60, 1, Unwound),
            encode(t + 100, 0, Exit),
        ];
        let trace = CallTrace::build(&recording(&[(7, words)], t - 5));
        let calls = &trace.calls;
        assert_eq!(calls.len(), 5);
        assert_eq!((calls[0].cycles(), calls[0].self_cycles()), (100, 60));
        assert_eq!(
            (calls[1].cycles(), calls[1].self_cycles(), calls[1].depth),
            (30, 20, 1)
        );
        assert_eq!(calls[2].cycles(), 10);
        assert!(calls[3].unwound && !calls[3].incomplete);
        assert!(calls[4].incomplete && calls[4].end == t + 60);
        assert_eq!(trace.duration(1500), "1.50 µs");
    }

    #[test]
    fn timestamps_across_a_wrap_of_the_kept_bits_and_two_threads() {
        let start = (3u64 << 44) - 20;
        let a = vec![encode(start + 10, 1, Entry), encode(start + 40, 1, Exit)];
        let b = vec![
            encode(start + 5, 2, Entry),
            encode(start + 1_000_005, 2, Exit),
        ];
        let trace = CallTrace::build(&recording(&[(1, a), (2, b)], start));
        assert_eq!(trace.threads.len(), 2);
        assert_eq!(trace.calls[0].cycles(), 30);
        assert_eq!(trace.calls[1].cycles(), 1_000_000);
        assert_eq!(trace.first, start + 5);
    }

    #[test]
    fn counters_follow_each_record() {
        let t = 100;
        let words = vec![
            encode(t, 0, Entry),
            1000,
            50,
            encode(t + 10, 1, Entry),
            1100,
            60,
            encode(t + 20, 1, Exit),
            1400,
            90,
            encode(t + 30, 0, Exit),
            2000,
            100,
        ];
        let mut recording = recording(&[(1, words)], t);
        recording.trace_summary.as_mut().unwrap().counters =
            vec!["cycles".to_string(), "instructions".to_string()];
        let trace = CallTrace::build(&recording);
        assert_eq!(trace.calls.len(), 2);
        assert_eq!(trace.counters_of(0), [1000, 50]);
        assert_eq!(trace.counters_of(1), [300, 30]);
    }

    #[test]
    fn recursion_is_not_counted_twice() {
        let t = 10;
        let words = vec![
            encode(t, 1, Entry),
            encode(t + 1, 1, Entry),
            encode(t + 2, 1, Exit),
            encode(t + 3, 1, Exit),
        ];
        let trace = CallTrace::build(&recording(&[(1, words)], t));
        assert!(!trace.is_nested_in_itself(0));
        assert!(trace.is_nested_in_itself(1));
    }
}
