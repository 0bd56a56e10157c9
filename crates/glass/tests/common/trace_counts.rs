//! A trace's calls counted from its raw records, independently of the reports, and the
//! counts a trace fixture prints (`calls: name=N ...`): what the trace tests of every
//! architecture hold each other to.

use std::collections::BTreeMap;
use std::path::Path;

use glass_format::Recording;
use glass_probe_abi::{EventKind, TscUnwrapper};

/// Calls per function name, counted from the raw records (independently of the reports).
pub struct Counts {
    pub entries: BTreeMap<String, u64>,
    pub exits: BTreeMap<String, u64>,
    pub unwound: BTreeMap<String, u64>,
    pub recording: Recording,
}

pub fn counts(recording: &Path) -> Counts {
    let recording = glass_format::read_file(recording).expect("a readable recording");
    assert!(recording.damage.is_none(), "{:?}", recording.damage);
    let summary = recording.trace_summary.clone().expect("a trace summary");
    let names: BTreeMap<u32, String> = recording
        .trace_functions
        .iter()
        .map(|f| (f.id, f.name.clone()))
        .collect();
    let mut out = Counts {
        entries: BTreeMap::new(),
        exits: BTreeMap::new(),
        unwound: BTreeMap::new(),
        recording: recording.clone(),
    };
    let mut unwrappers: BTreeMap<(u32, u32), TscUnwrapper> = BTreeMap::new();
    // Each record is followed by one word per hardware counter.
    let stride = 1 + summary.counters.len();
    for chunk in &recording.trace_chunks {
        assert_eq!(chunk.words.len() % stride, 0, "chunks hold whole records");
        let unwrap = unwrappers
            .entry((chunk.pid, chunk.tid))
            .or_insert_with(|| TscUnwrapper::new(summary.tsc_start));
        for record in chunk.words.chunks_exact(stride) {
            let event = unwrap.decode(record[0]);
            let name = names
                .get(&event.function)
                .expect("a known function id")
                .clone();
            let map = match event.kind {
                EventKind::Entry => &mut out.entries,
                EventKind::Exit => &mut out.exits,
                EventKind::Unwound => &mut out.unwound,
            };
            *map.entry(name).or_default() += 1;
        }
    }
    out
}

impl Counts {
    pub fn calls(&self, name: &str) -> u64 {
        self.entries.get(name).copied().unwrap_or(0)
    }
    pub fn ended(&self, name: &str) -> u64 {
        self.exits.get(name).copied().unwrap_or(0) + self.unwound.get(name).copied().unwrap_or(0)
    }
    pub fn lost(&self) -> u64 {
        let s = self.recording.trace_summary.as_ref().unwrap();
        s.lost + s.no_area_lost
    }
}

/// `calls: name=N name=N` from a fixture's output.
pub fn printed_counts(output: &str) -> BTreeMap<String, u64> {
    output
        .lines()
        .find_map(|l| l.strip_prefix("calls: "))
        .expect("a calls line")
        .split_whitespace()
        .map(|pair| {
            let (name, n) = pair.split_once('=').unwrap();
            (name.to_string(), n.parse().unwrap())
        })
        .collect()
}
