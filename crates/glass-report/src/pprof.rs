//! `--format pprof`: the gzip'd `profile.proto` of pprof (`go tool pprof`, pprof's web
//! UI, and the many tools that read it), written by a small protobuf encoder.
//!
//! Samples: sample types `samples/count` and `cpu/nanoseconds` (samples × the sampling
//! period), one sample per (thread, stack) with `thread`, `tid`, `pid` and `process`
//! labels. Traces: `calls/count` and `wall/nanoseconds` (self time; `wall/cycles` when
//! the cycle rate is unknown). Every module is a mapping (path, range, file offset, build
//! id); every distinct code address a location with its address and one line per
//! function, the innermost inlined one first; glass's own frames (`[truncated]`,
//! `[unknown]`, ...) are locations without a mapping.

use std::collections::HashMap;
use std::io::Write;

use flate2::write::GzEncoder;
use flate2::Compression;

use crate::model::{FrameIndex, Model, Source, StackIndex, Unit};
use crate::{Exporter, ReportError};

pub struct Pprof {
    /// A comment in the profile (what was recorded).
    pub title: String,
}

/// Protobuf wire encoding: just what profile.proto needs.
#[derive(Default)]
struct Message(Vec<u8>);

impl Message {
    fn varint(&mut self, mut value: u64) {
        while value >= 0x80 {
            self.0.push((value as u8) | 0x80);
            value >>= 7;
        }
        self.0.push(value as u8);
    }

    fn key(&mut self, field: u32, wire: u8) {
        self.varint(u64::from(field) << 3 | u64::from(wire));
    }

    /// A varint field (uint64, int64, bool); zero is the default and left out.
    fn uint(&mut self, field: u32, value: u64) {
        if value != 0 {
            self.key(field, 0);
            self.varint(value);
        }
    }

    fn bytes(&mut self, field: u32, bytes: &[u8]) {
        self.key(field, 2);
        self.varint(bytes.len() as u64);
        self.0.extend_from_slice(bytes);
    }

    fn packed(&mut self, field: u32, values: &[u64]) {
        if values.is_empty() {
            return;
        }
        let mut inner = Message::default();
        for &value in values {
            inner.varint(value);
        }
        self.bytes(field, &inner.0);
    }

    fn message(&mut self, field: u32, build: impl FnOnce(&mut Message)) {
        let mut inner = Message::default();
        build(&mut inner);
        self.bytes(field, &inner.0);
    }
}

#[derive(Default)]
struct Strings {
    list: Vec<String>,
    index: HashMap<String, u64>,
}

impl Strings {
    fn new() -> Strings {
        let mut strings = Strings::default();
        strings.get(""); // index 0 is the empty string
        strings
    }

    fn get(&mut self, text: &str) -> u64 {
        if let Some(&index) = self.index.get(text) {
            return index;
        }
        let index = self.list.len() as u64;
        self.list.push(text.to_string());
        self.index.insert(text.to_string(), index);
        index
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The encoded (not yet compressed) profile.
pub fn encode(model: &Model, title: &str) -> Vec<u8> {
    let mut strings = Strings::new();
    let mut profile = Message::default();

    let (count, time) = match model.source {
        Source::Samples => ("samples", "cpu"),
        Source::Calls => ("calls", "wall"),
    };
    let time_unit = match model.unit {
        Unit::Nanoseconds => "nanoseconds",
        Unit::Cycles => "cycles",
    };
    let value_type = |strings: &mut Strings, kind: &str, unit: &str| {
        let (kind, unit) = (strings.get(kind), strings.get(unit));
        move |m: &mut Message| {
            m.uint(1, kind);
            m.uint(2, unit);
        }
    };
    profile.message(1, value_type(&mut strings, count, "count"));
    profile.message(1, value_type(&mut strings, time, time_unit));

    let mapping_ids = write_mappings(model, &mut strings, &mut profile);

    // Functions, by name and module file.
    let mut functions: HashMap<(u32, Option<u32>), u64> = HashMap::new();
    let mut function_messages = Message::default();
    let mut function_id = |strings: &mut Strings, model: &Model, frame: FrameIndex| -> u64 {
        let row = model.frames[frame as usize];
        let file = row.module.map(|m| model.modules[m as usize].path);
        let next = functions.len() as u64 + 1;
        *functions.entry((row.function, file)).or_insert_with(|| {
            let name = strings.get(model.string(row.function));
            let filename = file.map_or(0, |f| strings.get(model.string(f)));
            function_messages.message(5, |m| {
                m.uint(1, next);
                m.uint(2, name);
                m.uint(3, name);
                m.uint(4, filename);
            });
            next
        })
    };

    // Locations: a code address with the functions inlined there (innermost first).
    let mut locations: HashMap<Vec<FrameIndex>, u64> = HashMap::new();
    let mut location_messages = Message::default();
    let mut stack_locations: HashMap<Option<StackIndex>, Vec<u64>> = HashMap::new();
    let mut frames: Vec<FrameIndex> = Vec::new();

    let (sums, order) = summed_samples(model);
    let thread_key = strings.get("thread");
    let tid_key = strings.get("tid");
    let pid_key = strings.get("pid");
    let process_key = strings.get("process");
    for key in order {
        let (thread_index, stack) = key;
        let (weight, cost) = sums[&key];
        if let std::collections::hash_map::Entry::Vacant(vacant) = stack_locations.entry(stack) {
            model.stack_frames(stack, &mut frames);
            let groups = by_location(model, &frames);
            let mut ids: Vec<u64> = Vec::with_capacity(groups.len());
            // Leaf first.
            for group in groups.into_iter().rev() {
                if let Some(&id) = locations.get(&group) {
                    ids.push(id);
                    continue;
                }
                let id = locations.len() as u64 + 1;
                let first = model.frames[group[0] as usize];
                let mapping = first.module.map_or(0, |m| mapping_ids[m as usize]);
                let function_ids: Vec<u64> = group
                    .iter()
                    .rev()
                    .map(|&f| function_id(&mut strings, model, f))
                    .collect();
                location_messages.message(4, |m| {
                    m.uint(1, id);
                    m.uint(2, mapping);
                    m.uint(3, first.address);
                    for function in function_ids {
                        m.message(4, |line| line.uint(1, function));
                    }
                });
                locations.insert(group, id);
                ids.push(id);
            }
            vacant.insert(ids);
        }
        let thread = &model.threads[thread_index];
        let thread_name = strings.get(model.string(thread.name));
        let process_name = strings.get(model.string(thread.process));
        let ids = &stack_locations[&stack];
        profile.message(2, |m| {
            m.packed(1, ids);
            m.packed(2, &[weight, cost]);
            m.message(3, |label| {
                label.uint(1, thread_key);
                label.uint(2, thread_name);
            });
            m.message(3, |label| {
                label.uint(1, process_key);
                label.uint(2, process_name);
            });
            m.message(3, |label| {
                label.uint(1, tid_key);
                label.uint(3, u64::from(thread.tid));
            });
            m.message(3, |label| {
                label.uint(1, pid_key);
                label.uint(3, u64::from(thread.pid));
            });
        });
    }
    profile.0.extend_from_slice(&location_messages.0);
    profile.0.extend_from_slice(&function_messages.0);

    let comment = strings.get(title);
    let time_kind = strings.get(time);
    let unit = strings.get(time_unit);
    for text in &strings.list {
        profile.bytes(6, text.as_bytes());
    }
    profile.uint(9, model.start_unix_ns);
    profile.uint(10, model.end);
    profile.message(11, |m| {
        m.uint(1, time_kind);
        m.uint(2, unit);
    });
    profile.uint(12, model.period);
    profile.packed(13, &[comment]);
    profile.uint(14, time_kind);
    profile.0
}

/// Mappings: one per distinct module (path, build id, range, offset), written to
/// `profile`; each module's mapping id.
fn write_mappings(model: &Model, strings: &mut Strings, profile: &mut Message) -> Vec<u64> {
    let mut mapping_ids: Vec<u64> = Vec::with_capacity(model.modules.len());
    let mut mappings: HashMap<(u32, &[u8], u64, u64, u64), u64> = HashMap::new();
    for module in &model.modules {
        let key = (
            module.path,
            module.build_id.as_slice(),
            module.start,
            module.end,
            module.file_offset,
        );
        let next = mappings.len() as u64 + 1;
        let id = *mappings.entry(key).or_insert_with(|| {
            let filename = strings.get(model.string(module.path));
            let build_id = strings.get(&hex(&module.build_id));
            profile.message(3, |m| {
                m.uint(1, next);
                m.uint(2, module.start);
                m.uint(3, module.end);
                m.uint(4, module.file_offset);
                m.uint(5, filename);
                m.uint(6, build_id);
                m.uint(7, 1); // has_functions
                m.uint(10, 1); // has_inline_frames
            });
            next
        });
        mapping_ids.push(id);
    }
    mapping_ids
}

/// (weight, cost) summed per (thread, stack), and the keys in the order first seen.
type Sums = HashMap<(usize, Option<StackIndex>), (u64, u64)>;

/// The samples, summed per (thread, stack), and those keys in the order first seen.
fn summed_samples(model: &Model) -> (Sums, Vec<(usize, Option<StackIndex>)>) {
    let mut sums: Sums = HashMap::new();
    let mut order: Vec<(usize, Option<StackIndex>)> = Vec::new();
    for (thread_index, thread) in model.threads.iter().enumerate() {
        for sample in &thread.samples {
            let key = (thread_index, sample.stack);
            let sum = sums.entry(key).or_insert_with(|| {
                order.push(key);
                (0, 0)
            });
            sum.0 += sample.weight;
            sum.1 += sample.cost;
        }
    }
    (sums, order)
}

/// A stack's frames grouped by address: a frame inlined into the one before shares its
/// location.
fn by_location(model: &Model, frames: &[FrameIndex]) -> Vec<Vec<FrameIndex>> {
    let mut groups: Vec<Vec<FrameIndex>> = Vec::new();
    for &frame in frames {
        let row = model.frames[frame as usize];
        match groups.last_mut() {
            Some(group) if row.inline_depth > 0 => group.push(frame),
            _ => groups.push(vec![frame]),
        }
    }
    groups
}

impl Exporter for Pprof {
    fn write(&self, model: &Model, out: &mut dyn Write) -> Result<(), ReportError> {
        let encoded = encode(model, &self.title);
        let mut gzip = GzEncoder::new(out, Compression::default());
        gzip.write_all(&encoded)?;
        gzip.finish()?;
        Ok(())
    }
}
