//! The interned model and every format on small recordings made here (no process, no
//! files): the tables, the categories of guest and JIT frames, pprof decoded field by
//! field, speedscope's evented calls properly nested, the Firefox categories, the diff.

use std::collections::HashMap;
use std::io::Read;

use glass_format::{
    Meta, Module, Process, ProcessKind, Recording, Sample, Thread, TraceChunk, TraceFunction,
    TraceSummary, SAMPLE_FIRMWARE, SAMPLE_HALTED, SAMPLE_TRUNCATED,
};
use glass_probe_abi::{encode, EventKind};
use glass_report::model::{Category, FrameKind, Model, ModelOptions, Source};
use glass_report::{
    diff_folded, Exporter, Firefox, Folded, Format, Pprof, Profile, ReportError, Speedscope,
};

const HZ: u32 = 100;
const PERIOD: u64 = 10_000_000;

fn sample(time_ns: u64, tid: u32, flags: u8, frames: &[u64]) -> Sample {
    Sample {
        time_ns,
        pid: 1,
        tid,
        stopped_ns: 0,
        flags,
        frames: frames.to_vec(),
    }
}

/// One process with two threads and one module of anonymous (JIT) code.
fn recording(backend: &str, samples: Vec<Sample>) -> Recording {
    Recording {
        meta: Some(Meta {
            start_unix_ns: 1_700_000_000_000_000_000,
            backend: glass_format::Backend::from_name(backend),
            frequency_hz: HZ,
            max_depth: 512,
            target_pid: 1,
            ..Meta::default()
        }),
        processes: vec![Process {
            time_ns: 0,
            pid: 1,
            parent_pid: 0,
            kind: ProcessKind::Attached,
            name: "prog".to_string(),
        }],
        modules: vec![Module {
            time_ns: 0,
            pid: 1,
            start: 0x1000,
            end: 0x9000,
            file_offset: 0,
            build_id: vec![0xab, 0xcd],
            path: "[anon:jit]".to_string(),
        }],
        threads: vec![
            Thread {
                time_ns: 0,
                pid: 1,
                tid: 1,
                name: "main".to_string(),
            },
            Thread {
                time_ns: 0,
                pid: 1,
                tid: 2,
                name: "worker".to_string(),
            },
        ],
        samples,
        ..Recording::default()
    }
}

fn process_samples() -> Vec<Sample> {
    vec![
        sample(30, 2, 0, &[0x1500, 0x2200, 0x3300]),
        sample(10, 1, 0, &[0x1100, 0x2200, 0x3300]),
        sample(20, 1, 0, &[0x1100, 0x2200, 0x3300]),
        sample(40, 1, SAMPLE_TRUNCATED, &[0x1100]),
        sample(50, 1, 0, &[0xdead_0000]),
    ]
}

fn write(exporter: &dyn Exporter, model: &Model) -> Vec<u8> {
    let mut out = Vec::new();
    exporter.write(model, &mut out).unwrap();
    out
}

#[test]
fn tables_are_interned_and_samples_timed() {
    let model = Model::build(
        &recording("ptrace", process_samples()),
        &ModelOptions::default(),
    );
    assert_eq!(model.source, Source::Samples);
    assert_eq!(model.samples, 5);
    assert_eq!(model.truncated_samples, 1);
    assert_eq!(model.period, PERIOD);
    assert_eq!(model.threads.len(), 2);
    let main = model.threads.iter().find(|t| t.tid == 1).unwrap();
    assert_eq!(model.string(main.name), "main");
    assert_eq!(model.string(main.process), "prog");
    let times: Vec<u64> = main.samples.iter().map(|s| s.time).collect();
    assert_eq!(times, [10, 20, 40, 50], "in time order");
    // The same stack twice is one stack; a sibling shares its caller's prefix.
    assert_eq!(main.samples[0].stack, main.samples[1].stack);
    let worker = model.threads.iter().find(|t| t.tid == 2).unwrap();
    let a = model.stacks[main.samples[0].stack.unwrap() as usize];
    let b = model.stacks[worker.samples[0].stack.unwrap() as usize];
    assert_ne!(a.frame, b.frame);
    assert_eq!(a.parent, b.parent);
    // Frames: return addresses are looked up at the call (address - 1); the module's
    // anonymous code is JIT code.
    let mut frames = Vec::new();
    model.stack_frames(main.samples[0].stack, &mut frames);
    let addresses: Vec<u64> = frames
        .iter()
        .map(|&f| model.frames[f as usize].address)
        .collect();
    assert_eq!(addresses, [0x32ff, 0x21ff, 0x1100]);
    for &f in &frames {
        let row = model.frames[f as usize];
        assert_eq!(row.kind, FrameKind::Code);
        assert_eq!(row.category, Category::Jit);
        assert_eq!(model.module_of(f).unwrap().build_id, [0xab, 0xcd]);
    }
    // [truncated] is the root of a cut stack; an address in no module is [unknown].
    let mut cut = Vec::new();
    model.stack_frames(main.samples[2].stack, &mut cut);
    assert_eq!(model.function(cut[0]), "[truncated]");
    let mut unknown = Vec::new();
    model.stack_frames(main.samples[3].stack, &mut unknown);
    assert_eq!(model.frames[unknown[0] as usize].kind, FrameKind::Unknown);
    // Strings are unique.
    let mut seen = std::collections::HashSet::new();
    for i in 0..model.strings.len() {
        assert!(seen.insert(model.string(i as u32).to_string()));
    }

    // The folded view: per distinct stack, under the process (and thread when split).
    let profile = Profile::from_model(&model, true);
    assert_eq!(profile.samples, 5);
    assert_eq!(profile.threads, [(1, "main".into()), (2, "worker".into())]);
    let text = String::from_utf8(write(
        &Folded {
            split_threads: true,
        },
        &model,
    ))
    .unwrap();
    assert!(text
        .lines()
        .any(|l| l.starts_with("prog;main/1;") && l.ends_with(" 2")));
    assert!(text.contains("prog;main/1;[truncated];"));
    // --tid keeps one thread.
    let one = Model::build(
        &recording("ptrace", process_samples()),
        &ModelOptions {
            tid: Some(2),
            no_idle: false,
        },
    );
    assert_eq!(one.samples, 1);
}

#[test]
fn guest_frames_are_in_the_guest_categories() {
    let samples = vec![
        sample(10, 1, 0, &[0x1100, 0x2200]),
        sample(20, 1, SAMPLE_HALTED, &[0x1100, 0x2200]),
        sample(30, 2, SAMPLE_FIRMWARE, &[0xfff0]),
    ];
    let model = Model::build(
        &recording("gdbstub", samples.clone()),
        &ModelOptions::default(),
    );
    let categories: HashMap<&str, Category> = model
        .frames
        .iter()
        .map(|f| (model.string(f.function), f.category))
        .collect();
    assert_eq!(categories["[halted]"], Category::GuestHalted);
    assert_eq!(categories["[firmware]"], Category::GuestFirmware);
    assert!(model
        .frames
        .iter()
        .filter(|f| f.kind == FrameKind::Code)
        .all(|f| f.category == Category::Guest));
    // --no-idle leaves the halted sample out.
    let busy = Model::build(
        &recording("gdbstub", samples),
        &ModelOptions {
            tid: None,
            no_idle: true,
        },
    );
    assert_eq!(busy.samples, 2);

    // In the Firefox Profiler's JSON, [halted] is in Guest's "halted" subcategory.
    let json: serde_json::Value = serde_json::from_slice(&write(
        &Firefox {
            title: "guest".into(),
        },
        &model,
    ))
    .unwrap();
    let categories = json["meta"]["categories"].as_array().unwrap();
    let guest = categories
        .iter()
        .position(|c| c["name"] == "Guest")
        .unwrap();
    let halted = categories[guest]["subcategories"]
        .as_array()
        .unwrap()
        .iter()
        .position(|s| s == "halted")
        .unwrap();
    let mut found = false;
    for thread in json["threads"].as_array().unwrap() {
        let strings = thread["stringArray"].as_array().unwrap();
        let frames = &thread["frameTable"];
        for (i, func) in frames["func"].as_array().unwrap().iter().enumerate() {
            let name = thread["funcTable"]["name"][func.as_u64().unwrap() as usize]
                .as_u64()
                .unwrap();
            if strings[name as usize] == "[halted]" {
                assert_eq!(frames["category"][i].as_u64(), Some(guest as u64));
                assert_eq!(frames["subcategory"][i].as_u64(), Some(halted as u64));
                found = true;
            }
        }
    }
    assert!(found, "{json}");
}

// ------------------------------------------------------------ a protobuf reader

#[derive(Debug, Clone)]
enum Value {
    Varint(u64),
    Bytes(Vec<u8>),
}

fn varint(bytes: &[u8], at: &mut usize) -> u64 {
    let mut value = 0;
    let mut shift = 0;
    loop {
        let byte = bytes[*at];
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return value;
        }
        shift += 7;
    }
}

fn fields(bytes: &[u8]) -> Vec<(u64, Value)> {
    let mut at = 0;
    let mut out = Vec::new();
    while at < bytes.len() {
        let key = varint(bytes, &mut at);
        let value = match key & 7 {
            0 => Value::Varint(varint(bytes, &mut at)),
            2 => {
                let len = varint(bytes, &mut at) as usize;
                at += len;
                Value::Bytes(bytes[at - len..at].to_vec())
            }
            wire => panic!("wire type {wire}"),
        };
        out.push((key >> 3, value));
    }
    out
}

fn get(message: &[(u64, Value)], field: u64) -> u64 {
    message
        .iter()
        .find(|(f, _)| *f == field)
        .map_or(0, |(_, v)| match v {
            Value::Varint(n) => *n,
            Value::Bytes(_) => panic!("field {field} is bytes"),
        })
}

fn packed(message: &[(u64, Value)], field: u64) -> Vec<u64> {
    let mut values = Vec::new();
    for (f, v) in message {
        if *f == field {
            match v {
                Value::Varint(n) => values.push(*n),
                Value::Bytes(b) => {
                    let mut at = 0;
                    while at < b.len() {
                        values.push(varint(b, &mut at));
                    }
                }
            }
        }
    }
    values
}

fn submessages(message: &[(u64, Value)], field: u64) -> Vec<Vec<(u64, Value)>> {
    message
        .iter()
        .filter(|(f, _)| *f == field)
        .map(|(_, v)| match v {
            Value::Bytes(b) => fields(b),
            Value::Varint(_) => panic!("field {field} is a varint"),
        })
        .collect()
}

fn decode_pprof(gzipped: &[u8]) -> (Vec<(u64, Value)>, Vec<String>) {
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(gzipped)
        .read_to_end(&mut bytes)
        .unwrap();
    let profile = fields(&bytes);
    let strings: Vec<String> = profile
        .iter()
        .filter(|(f, _)| *f == 6)
        .map(|(_, v)| match v {
            Value::Bytes(b) => String::from_utf8(b.clone()).unwrap(),
            Value::Varint(_) => panic!(),
        })
        .collect();
    (profile, strings)
}

#[test]
fn pprof_holds_mappings_locations_functions_and_both_values() {
    let model = Model::build(
        &recording("ptrace", process_samples()),
        &ModelOptions::default(),
    );
    let (profile, strings) = decode_pprof(&write(&Pprof { title: "t".into() }, &model));
    assert_eq!(strings[0], "");
    let types: Vec<(String, String)> = submessages(&profile, 1)
        .iter()
        .map(|t| {
            (
                strings[get(t, 1) as usize].clone(),
                strings[get(t, 2) as usize].clone(),
            )
        })
        .collect();
    assert_eq!(
        types,
        [
            ("samples".into(), "count".into()),
            ("cpu".into(), "nanoseconds".into())
        ]
    );
    assert_eq!(strings[get(&profile, 14) as usize], "cpu");
    assert_eq!(get(&profile, 12), PERIOD);
    let samples = submessages(&profile, 2);
    let (mut count, mut cpu) = (0, 0);
    for s in &samples {
        let values = packed(s, 2);
        count += values[0];
        cpu += values[1];
        assert_eq!(values[1], values[0] * PERIOD);
    }
    assert_eq!((count, cpu), (5, 5 * PERIOD));
    let mappings = submessages(&profile, 3);
    assert_eq!(mappings.len(), 1);
    assert_eq!(strings[get(&mappings[0], 5) as usize], "[anon:jit]");
    assert_eq!(strings[get(&mappings[0], 6) as usize], "abcd");
    assert_eq!(
        (get(&mappings[0], 2), get(&mappings[0], 3)),
        (0x1000, 0x9000)
    );
    let locations = submessages(&profile, 4);
    let functions = submessages(&profile, 5);
    let function_names: HashMap<u64, String> = functions
        .iter()
        .map(|f| (get(f, 1), strings[get(f, 2) as usize].clone()))
        .collect();
    let by_id: HashMap<u64, &Vec<(u64, Value)>> =
        locations.iter().map(|l| (get(l, 1), l)).collect();
    // Each location: an address in the mapping with one line per function.
    let leaf_addresses: Vec<u64> = samples
        .iter()
        .map(|s| get(by_id[&packed(s, 1)[0]], 3))
        .collect();
    assert!(leaf_addresses.contains(&0x1100));
    for location in &locations {
        let lines = submessages(location, 4);
        assert_eq!(lines.len(), 1);
        let name = &function_names[&get(&lines[0], 1)];
        let address = get(location, 3);
        if name.starts_with("[anon:jit]") {
            assert_eq!(get(location, 2), 1, "in the mapping");
            assert!((0x1000..0x9000).contains(&address));
        } else {
            assert_eq!(get(location, 2), 0, "{name}: glass's own frame, no mapping");
        }
    }
    // The thread is a label of each sample.
    let labels: Vec<String> = samples
        .iter()
        .flat_map(|s| submessages(s, 3))
        .filter(|l| strings[get(l, 1) as usize] == "thread")
        .map(|l| strings[get(&l, 2) as usize].clone())
        .collect();
    assert!(labels.contains(&"main".to_string()) && labels.contains(&"worker".to_string()));
}

/// main calls f twice; f calls g; the second g's exit is lost and f ends by longjmp.
fn trace_recording() -> Recording {
    let t = 1000;
    let words = vec![
        encode(t, 0, EventKind::Entry),
        encode(t + 10, 1, EventKind::Entry),
        encode(t + 15, 2, EventKind::Entry),
        encode(t + 25, 2, EventKind::Exit),
        encode(t + 40, 1, EventKind::Exit),
        encode(t + 50, 1, EventKind::Entry),
        encode(t + 52, 2, EventKind::Entry),
        encode(t + 60, 1, EventKind::Unwound),
        encode(t + 100, 0, EventKind::Exit),
    ];
    let mut recording = Recording {
        meta: Some(Meta {
            backend: glass_format::Backend::Trace,
            command: vec!["/bin/prog".into()],
            ..Meta::default()
        }),
        trace_summary: Some(TraceSummary {
            tsc_hz: 1_000_000_000,
            tsc_start: t - 5,
            ..TraceSummary::default()
        }),
        ..Recording::default()
    };
    for (id, name) in ["main", "f", "g"].iter().enumerate() {
        recording.trace_functions.push(TraceFunction {
            id: id as u32,
            module: "/bin/prog".into(),
            address: 0x1000 + 0x100 * id as u64,
            size: 0x40,
            name: name.to_string(),
            probe: "return address".to_string(),
        });
    }
    recording.trace_chunks.push(TraceChunk {
        pid: 7,
        tid: 7,
        words,
    });
    recording
}

fn trace_model() -> Model {
    let recording = trace_recording();
    Model::from_trace(
        &recording,
        glass_report::calltrace::CallTrace::build(&recording),
    )
}

#[test]
fn a_trace_is_calls_with_nested_open_and_close_events() {
    let model = trace_model();
    assert_eq!(model.source, Source::Calls);
    assert_eq!(model.samples, 5);
    let thread = &model.threads[0];
    assert_eq!(model.string(thread.process), "prog");
    // Self times: main 60 (100 - 30 - 10), f 20 and 10, g 10 and 8 ns.
    let costs: u64 = thread.samples.iter().map(|s| s.cost).sum();
    assert_eq!(costs, 100);
    // Every close closes the innermost open call, never before it opened.
    let mut open = Vec::new();
    let mut last = 0;
    for event in &thread.events {
        assert!(event.time >= last);
        last = event.time;
        if event.open {
            open.push(event.frame);
        } else {
            assert_eq!(open.pop(), Some(event.frame), "{:?}", thread.events);
        }
    }
    assert!(open.is_empty());
    assert_eq!(thread.events.len(), 10);
    assert_eq!(thread.events.last().unwrap().time, 100);

    let json: serde_json::Value = serde_json::from_slice(&write(
        &Speedscope {
            title: "trace".into(),
        },
        &model,
    ))
    .unwrap();
    let profile = &json["profiles"][0];
    assert_eq!(profile["type"], "evented");
    assert_eq!(profile["unit"], "nanoseconds");
    assert_eq!(profile["events"].as_array().unwrap().len(), 10);
    let names: Vec<&str> = json["shared"]["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert_eq!(profile["events"][0]["type"], "O");
    assert_eq!(
        names[profile["events"][0]["frame"].as_u64().unwrap() as usize],
        "main"
    );

    // pprof: calls and wall time.
    let (pprof, strings) = decode_pprof(&write(&Pprof { title: "t".into() }, &model));
    let types: Vec<&str> = submessages(&pprof, 1)
        .iter()
        .map(|t| strings[get(t, 1) as usize].as_str())
        .collect();
    assert_eq!(types, ["calls", "wall"]);
    let totals = submessages(&pprof, 2).iter().fold((0, 0), |acc, s| {
        let v = packed(s, 2);
        (acc.0 + v[0], acc.1 + v[1])
    });
    assert_eq!(totals, (5, 100));
}

#[test]
fn formats_refuse_what_they_cannot_show_with_typed_errors() {
    assert!(matches!(
        Format::Calls.check(Source::Samples),
        Err(ReportError::NeedsCalls { format: "calls" })
    ));
    assert!(Format::Pprof.check(Source::Calls).is_ok());
    let trace = trace_model();
    let mut out = Vec::new();
    let error = Firefox { title: "t".into() }
        .write(&trace, &mut out)
        .unwrap_err();
    assert!(matches!(error, ReportError::NeedsSamples { .. }));
    assert!(error.is_bad_input());
    let samples = Model::build(
        &recording("ptrace", process_samples()),
        &ModelOptions::default(),
    );
    let error = glass_report::calltrace::CallsReport {
        header: String::new(),
        limit: 10,
    }
    .write(&samples, &mut out)
    .unwrap_err();
    assert!(matches!(error, ReportError::NeedsCalls { .. }), "{error}");
}

#[test]
fn diff_lines_carry_both_counts_without_the_process() {
    let before = Model::build(
        &recording("ptrace", process_samples()),
        &ModelOptions::default(),
    );
    let mut more = process_samples();
    more.push(sample(60, 2, 0, &[0x1500, 0x2200, 0x3300]));
    more.push(sample(70, 2, 0, &[0x1500, 0x2200, 0x3300]));
    let after = Model::build(&recording("ptrace", more), &ModelOptions::default());
    let lines = diff_folded(&before, &after).unwrap();
    assert!(!lines.is_empty());
    for line in &lines {
        assert!(!line.starts_with("prog;"), "{line}");
        let fields: Vec<&str> = line.rsplitn(3, ' ').collect();
        assert_eq!(fields.len(), 3, "{line}");
        fields[0].parse::<u64>().unwrap();
        fields[1].parse::<u64>().unwrap();
    }
    // The worker's stack grew from 1 to 3 samples (before scaled from 5 to 7 in all).
    // The worker's leaf is at 0x1500, 0x500 into the module.
    let worker = lines
        .iter()
        .find(|l| l.split(' ').next().unwrap().ends_with("+0x500"))
        .unwrap_or_else(|| panic!("{lines:?}"));
    assert!(worker.ends_with(" 1 3"), "{worker} in {lines:?}");
}
