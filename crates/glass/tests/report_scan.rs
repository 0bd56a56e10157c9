//! `glass report --format calls` streams the file and sums the calls per function with
//! several decoding workers (`glass_report::calltrace::scan`). Held to what the fixtures
//! know they called, to the whole-recording path (`CallTrace::build`, which every other
//! trace format uses) byte for byte, to itself with 1 and N workers, and to the same on
//! a truncated file and on a file with a damaged chunk.

mod common;
use common::*;

use std::path::Path;

use glass_report::calltrace::{self, scan, CallTrace};

/// `--format calls` as the whole-recording path writes it.
fn calls_in_memory(recording: &Path) -> String {
    let recording = glass_format::read_file(recording).expect("readable");
    let trace = CallTrace::build(&recording);
    let header = calltrace::header(&recording, &trace);
    let mut out = Vec::new();
    calltrace::calls::write_calls(&trace, &header, usize::MAX, &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

fn report_calls(recording: &Path, jobs: &str) -> (String, String) {
    let output = glass(&[
        "report",
        recording.to_str().unwrap(),
        "--format",
        "calls",
        "--jobs",
        jobs,
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    (stdout(&output), stderr(&output))
}

/// The calls column of a function's row.
fn calls_of(report: &str, function: &str) -> u64 {
    report
        .lines()
        .find(|l| l.split_whitespace().last() == Some(function))
        .and_then(|l| l.split_whitespace().next())
        .map_or(0, |n| n.parse().unwrap())
}

/// The same figures from the library with `workers` workers.
fn figures(recording: &Path, workers: usize) -> Vec<(u32, [u64; 8])> {
    let scan = scan::scan_file(recording, workers).expect("scans");
    let mut rows: Vec<(u32, [u64; 8])> = scan
        .stats
        .iter()
        .map(|(&id, s)| {
            let d = &s.durations;
            (
                id,
                [
                    s.calls,
                    s.total,
                    s.self_time,
                    d.min(),
                    d.percentile(50.0),
                    d.percentile(99.0),
                    d.max(),
                    s.unwound,
                ],
            )
        })
        .collect();
    rows.sort();
    rows.push((
        u32::MAX,
        [
            scan.calls,
            scan.records,
            scan.span(),
            scan.threads.len() as u64,
            0,
            0,
            0,
            0,
        ],
    ));
    rows
}

/// The offset of the `n`-th packed trace chunk record (tag 13) and its length.
fn packed_chunk(bytes: &[u8], n: usize) -> (usize, usize) {
    let mut pos = glass_format::HEADER_LEN;
    let mut seen = 0;
    while pos + 5 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[pos + 1..pos + 5].try_into().unwrap()) as usize;
        if bytes[pos] == 13 {
            if seen == n {
                return (pos, len);
            }
            seen += 1;
        }
        pos += 5 + len;
    }
    panic!("fewer than {} packed chunks", n + 1)
}

#[test]
fn threads_are_decoded_alike_by_one_or_many_workers_and_counts_are_exact() {
    let dir = scratch("report_scan_threads");
    let program = compile(&dir, "trace/threads.c", "threads", &["-lpthread"]);
    let recording = dir.join("t.glass");
    {
        let _alone = exclusive();
        // 100000 and 50000 calls: 200000 and 100000 records, well within a ring of 2^20,
        // so none is lost however late the drain runs.
        let traced = glass(&[
            "trace",
            "-q",
            "-o",
            recording.to_str().unwrap(),
            "-f",
            "work_*",
            "--",
            program.to_str().unwrap(),
        ]);
        assert!(traced.status.success(), "{}", stderr(&traced));
        assert_eq!(stdout(&traced).trim(), "work_a=100000 work_b=50000");
    }
    let (one, _) = report_calls(&recording, "1");
    let (four, _) = report_calls(&recording, "4");
    assert_eq!(one, four);
    assert_eq!(one, calls_in_memory(&recording));
    assert_eq!(calls_of(&one, "work_a"), 100_000);
    assert_eq!(calls_of(&one, "work_b"), 50_000);
    assert!(
        one.starts_with(&format!(
            "glass trace: {}: 150000 calls, 2 threads,",
            program.display()
        )),
        "{one}"
    );
    // The report is the default for a trace.
    let default = glass(&["report", recording.to_str().unwrap()]);
    assert_eq!(stdout(&default), one);
    let figures_one = figures(&recording, 1);
    assert_eq!(figures_one, figures(&recording, 3));
    assert_eq!(figures_one.last().unwrap().1[1], 300_000, "records decoded");

    // Cut inside the second chunk: what comes before it is reported, alike by every path.
    let bytes = std::fs::read(&recording).unwrap();
    let (offset, len) = packed_chunk(&bytes, 1);
    let truncated = dir.join("truncated.glass");
    std::fs::write(&truncated, &bytes[..offset + 5 + len / 2]).unwrap();
    let (one, warning) = report_calls(&truncated, "1");
    assert!(
        warning.contains(&format!("truncated at byte {offset}")),
        "{warning}"
    );
    let (four, _) = report_calls(&truncated, "4");
    assert_eq!(one, four);
    assert_eq!(one, calls_in_memory(&truncated));
    let kept = calls_of(&one, "work_a") + calls_of(&one, "work_b");
    assert!(kept > 0 && kept < 150_000, "{one}");
    assert!(one.contains("the recording ended early"), "{one}");
    assert_eq!(figures(&truncated, 1), figures(&truncated, 2));

    // A chunk whose packed body is damaged: everything from it on is dropped, as the
    // whole-file reader drops it, though the workers only find out while decoding.
    let mut damaged = bytes.clone();
    let (offset, len) = packed_chunk(&bytes, 1);
    for byte in &mut damaged[offset + 5 + len / 2..offset + 5 + len / 2 + 16] {
        *byte = 0xff; // overlong varints
    }
    let damaged_path = dir.join("damaged.glass");
    std::fs::write(&damaged_path, &damaged).unwrap();
    let (one, warning) = report_calls(&damaged_path, "1");
    assert!(
        warning.contains(&format!("corrupt record at byte {offset}")),
        "{warning}"
    );
    let (four, _) = report_calls(&damaged_path, "4");
    assert_eq!(one, four);
    assert_eq!(one, calls_in_memory(&damaged_path));
}

#[test]
fn recursion_is_counted_once_and_lost_exits_close_calls_as_the_model_does() {
    let dir = scratch("report_scan_recursion");
    let program = compile(&dir, "trace/recursion.c", "recursion", &[]);
    let recording = dir.join("r.glass");
    {
        let _alone = exclusive();
        let traced = glass(&[
            "trace",
            "-q",
            "-o",
            recording.to_str().unwrap(),
            "-f",
            "descend,main",
            "--",
            program.to_str().unwrap(),
        ]);
        assert!(traced.status.success(), "{}", stderr(&traced));
    }
    let (one, _) = report_calls(&recording, "1");
    assert_eq!(one, calls_in_memory(&recording));
    assert_eq!(one, report_calls(&recording, "2").0);
    assert_eq!(calls_of(&one, "descend"), 100 * 1000);
    // Every second record dropped: exits without entries are skipped, entries without
    // exits are closed by their caller's exit or at the end, on both paths alike.
    let full = glass_format::read_file(&recording).unwrap();
    let mut writer = glass_format::Writer::new(Vec::new()).unwrap();
    for record in [
        full.meta.clone().map(glass_format::Record::Meta),
        full.trace_summary
            .clone()
            .map(glass_format::Record::TraceSummary),
    ]
    .into_iter()
    .flatten()
    {
        writer.write(&record).unwrap();
    }
    for function in &full.trace_functions {
        writer
            .write(&glass_format::Record::TraceFunction(function.clone()))
            .unwrap();
    }
    for chunk in &full.trace_chunks {
        let mut thinned = chunk.clone();
        thinned.words = chunk.words.iter().step_by(3).copied().collect();
        writer
            .write(&glass_format::Record::TraceChunk(thinned))
            .unwrap();
    }
    writer
        .write(&glass_format::Record::TraceSummary(
            full.trace_summary.clone().unwrap(),
        ))
        .unwrap();
    writer.write(&glass_format::Record::End).unwrap();
    let thinned = dir.join("thinned.glass");
    std::fs::write(&thinned, writer.into_inner()).unwrap();
    let (one, _) = report_calls(&thinned, "1");
    assert_eq!(one, calls_in_memory(&thinned));
    assert_eq!(one, report_calls(&thinned, "3").0);
}

/// A trace written record by record: `threads` of (tid, words), in chunks of `split`
/// words, interleaved; `early`: the summary (with its counters) before the chunks too,
/// as glass writes it.
fn synthetic(
    path: &Path,
    counters: &[&str],
    tsc_start: u64,
    threads: &[(u32, Vec<u64>)],
    split: usize,
    early: bool,
) {
    use glass_format::{Record, TraceChunk, TraceFunction, TraceSummary};
    let summary = TraceSummary {
        tsc_hz: 2_000_000_000,
        tsc_start,
        counters: counters.iter().map(|c| c.to_string()).collect(),
        ..TraceSummary::default()
    };
    let mut writer = glass_format::Writer::new(Vec::new()).unwrap();
    writer
        .write(&Record::Meta(glass_format::Meta {
            backend: glass_format::Backend::Trace,
            command: vec!["synthetic".into()],
            ..Default::default()
        }))
        .unwrap();
    for (id, name) in ["outer", "inner", "leaf"].iter().enumerate() {
        writer
            .write(&Record::TraceFunction(TraceFunction {
                id: id as u32,
                module: "/bin/synthetic".into(),
                address: 0x1000 + id as u64 * 16,
                size: 16,
                name: name.to_string(),
            }))
            .unwrap();
    }
    if early {
        writer
            .write(&Record::TraceSummary(summary.clone()))
            .unwrap();
    }
    let longest = threads.iter().map(|t| t.1.len()).max().unwrap_or(0);
    for start in (0..longest).step_by(split) {
        for (tid, words) in threads {
            if start < words.len() {
                let end = (start + split).min(words.len());
                writer
                    .write(&Record::TraceChunk(TraceChunk {
                        pid: 7,
                        tid: *tid,
                        words: words[start..end].to_vec(),
                    }))
                    .unwrap();
            }
        }
    }
    writer.write(&Record::TraceSummary(summary)).unwrap();
    writer.write(&Record::End).unwrap();
    std::fs::write(path, writer.into_inner()).unwrap();
}

/// Calls nested three deep with lost exits, recursion and unwinding, `counters` words
/// after each record, starting just below a wrap of the records' 44 bits of time.
fn nested_words(seed: u64, counters: usize, base: u64) -> Vec<u64> {
    use glass_trace::{encode, EventKind::*};
    let mut words = Vec::new();
    let mut time = base;
    let mut value = 1000 * seed;
    let mut push = |words: &mut Vec<u64>, step: u64, function: u32, kind| {
        time += step;
        words.push(encode(time, function, kind));
        for c in 0..counters {
            value += 3 + c as u64;
            words.push(value * (c as u64 + 1));
        }
    };
    for i in 0..2000u64 {
        let step = 1 + (i * 7 + seed) % 50;
        push(&mut words, step, 0, Entry);
        push(&mut words, step, 1, Entry);
        push(&mut words, step, 1, Entry); // recursion
        push(&mut words, step * 90, 2, Entry);
        if i % 5 != 0 {
            push(&mut words, step, 2, Exit); // else lost: closed by inner's exit
        }
        push(&mut words, step, 1, Exit);
        if i % 7 == 0 {
            push(&mut words, step, 1, Unwound);
        } else {
            push(&mut words, step, 1, Exit);
        }
        if i % 11 != 0 {
            push(&mut words, step * 3, 0, Exit);
        }
        if i % 13 == 0 {
            push(&mut words, step, 2, Exit); // its entry was lost
        }
    }
    push(&mut words, 1, 0, Entry); // still open at the end
    words
}

#[test]
fn counters_time_wraps_and_summaries_written_only_at_the_end() {
    let dir = scratch("report_scan_synthetic");
    let base = (5u64 << 44) - 30_000;
    for (name, counters, split, early) in [
        ("plain", &[][..], 1000, true),
        ("counters", &["cycles", "instructions"][..], 999, true),
        // No summary before the chunks: the first pass takes 1 word a record, the
        // summary at the end says 3, and the file is read again.
        ("late-summary", &["cycles", "instructions"][..], 1001, false),
        ("single-words", &["cycles"][..], 1, true),
    ] {
        let path = dir.join(format!("{name}.glass"));
        let threads: Vec<(u32, Vec<u64>)> = (0..3)
            .map(|t| (100 + t, nested_words(t as u64, counters.len(), base)))
            .collect();
        synthetic(&path, counters, base - 10, &threads, split, early);
        let (one, _) = report_calls(&path, "1");
        assert_eq!(one, calls_in_memory(&path), "{name}");
        assert_eq!(one, report_calls(&path, "2").0, "{name}");
        assert_eq!(one, report_calls(&path, "5").0, "{name}");
        assert_eq!(calls_of(&one, "outer"), 3 * 2001, "{name}: {one}");
        for counter in counters.iter() {
            assert!(one.contains(&format!("{counter}/call")), "{name}: {one}");
        }
    }
    // A trace without any call record, with and without counters.
    for counters in [&[][..], &["cycles"][..]] {
        let empty = dir.join("empty.glass");
        synthetic(&empty, counters, base, &[], 1, true);
        let (one, _) = report_calls(&empty, "2");
        assert_eq!(one, calls_in_memory(&empty));
        assert!(one.contains(": 0 calls, 0 threads"), "{one}");
    }
}
