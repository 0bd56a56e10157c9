//! `glass report --format calls`, `tree`, `invocations` and `flamegraph` of a trace
//! stream the file and sum the calls per function, per call path and per invocation of
//! the root with several decoding workers
//! (`glass_report::calltrace::scan`). Held to what the fixtures know they called, to the
//! whole-recording path (`CallTrace::build`, which the other trace formats use) byte for
//! byte, to itself with 1 and N workers, and to the same on a truncated file and on a
//! file with a damaged chunk.

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

/// `--format tree` (every line) and the flame graph's stacks as the whole-recording
/// path makes them.
fn paths_in_memory(recording: &Path) -> (String, Vec<String>) {
    let recording = glass_format::read_file(recording).expect("readable");
    let trace = CallTrace::build(&recording);
    let model = glass_report::Model::from_trace(&recording, trace);
    let header = calltrace::header(&recording, model.calls.as_ref().unwrap());
    let mut out = Vec::new();
    let tree = calltrace::TreeReport {
        header,
        limit: usize::MAX,
    };
    glass_report::Exporter::write(&tree, &model, &mut out).unwrap();
    let folded = calltrace::folded(model.calls.as_ref().unwrap());
    (String::from_utf8(out).unwrap(), folded)
}

/// `--format invocations --root ROOT` (every row) as the whole-recording path writes it.
fn invocations_in_memory(recording: &Path, root: &str) -> String {
    let recording = glass_format::read_file(recording).expect("readable");
    let trace = CallTrace::build(&recording);
    let model = glass_report::Model::from_trace(&recording, trace);
    let header = calltrace::header(&recording, model.calls.as_ref().unwrap());
    let mut out = Vec::new();
    let report = calltrace::InvocationsReport {
        header,
        root: root.to_string(),
        limit: usize::MAX,
    };
    glass_report::Exporter::write(&report, &model, &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

/// The invocations of `root`, streamed with 1 and `jobs` workers, are those of the
/// whole-recording path; the report (every row) is returned.
fn invocations_agree(recording: &Path, root: &str, jobs: &str, what: &str) -> String {
    let expected = invocations_in_memory(recording, root);
    let mut streamed = String::new();
    for jobs in ["1", jobs] {
        let output = glass(&[
            "report",
            recording.to_str().unwrap(),
            "--format",
            "invocations",
            "--root",
            root,
            "--jobs",
            jobs,
            "--limit",
            "1000000",
        ]);
        assert!(output.status.success(), "{what}: {}", stderr(&output));
        streamed = stdout(&output);
        assert_eq!(
            streamed, expected,
            "{what}: invocations of {root}, {jobs} workers"
        );
    }
    streamed
}

fn report_calls(recording: &Path, jobs: &str) -> (String, String) {
    report_as(recording, "calls", jobs)
}

fn report_as(recording: &Path, format: &str, jobs: &str) -> (String, String) {
    let output = glass(&[
        "report",
        recording.to_str().unwrap(),
        "--format",
        format,
        "--jobs",
        jobs,
        "--limit",
        "1000000",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    (stdout(&output), stderr(&output))
}

/// The frames of a flame graph: each box's title (name, weight, share), sorted.
fn boxes(svg: &str) -> Vec<String> {
    let mut titles: Vec<String> = svg
        .split("<title>")
        .skip(1)
        .filter_map(|rest| rest.split("</title>").next())
        .map(str::to_string)
        .collect();
    titles.sort();
    titles
}

/// Draws `folded` as the streamed report does, for its boxes.
fn boxes_of_folded(folded: &[String], recording: &Path) -> Vec<String> {
    let recording = glass_format::read_file(recording).unwrap();
    let unit = match recording.trace_summary.as_ref().map_or(0, |s| s.tsc_hz) {
        0 => "cycles",
        _ => "ns",
    };
    let mut svg = Vec::new();
    glass_report::write_folded_as_flamegraph(folded, "", unit, &mut svg).unwrap();
    boxes(&String::from_utf8(svg).unwrap())
}

/// The tree and the flame graph, streamed with 1 and `jobs` workers, are those of the
/// whole-recording path; the tree (every line) is returned.
fn paths_agree(recording: &Path, jobs: &str, what: &str) -> String {
    let (tree, folded) = paths_in_memory(recording);
    let (one, _) = report_as(recording, "tree", "1");
    assert_eq!(one, tree, "{what}");
    assert_eq!(report_as(recording, "tree", jobs).0, tree, "{what}");
    let expected = boxes_of_folded(&folded, recording);
    for jobs in ["1", jobs] {
        let svg = report_as(recording, "flamegraph", jobs).0;
        assert_eq!(boxes(&svg), expected, "{what}: flamegraph, {jobs} workers");
    }
    one
}

/// The line of `function` at `depth` in a tree: (calls, the line).
fn tree_line<'a>(tree: &'a str, depth: usize, function: &str) -> Option<(u64, &'a str)> {
    let indent = "  ".repeat(depth);
    tree.lines().find_map(|line| {
        let figures = line
            .strip_suffix(function)?
            .strip_suffix(&indent)?
            .strip_suffix("  ")?;
        // (Deeper lines leave spaces, not the calls column, before the indent.)
        let calls = figures.split(' ').next_back()?.parse().ok()?;
        Some((calls, line))
    })
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
    let wanted = scan::Wanted {
        paths: true,
        root: Some("inner".into()),
    };
    let scan = scan::scan_file(recording, workers, &wanted).expect("scans");
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
    let paths = scan.paths.as_ref().expect("paths summed");
    for (children, node) in paths.children().iter().zip(&paths.nodes) {
        let children: Vec<u64> = children.iter().map(|&c| u64::from(c)).collect();
        let mut row = [
            node.calls,
            node.total,
            node.self_time,
            node.first.1,
            0,
            0,
            0,
            0,
        ];
        row[4..4 + children.len().min(4)].copy_from_slice(&children[..children.len().min(4)]);
        rows.push((u32::MAX - 1, row));
    }
    for invocation in &scan.invocations.rows {
        let first = scan
            .invocations
            .callees(invocation)
            .next()
            .map_or(0, |c| c.1);
        let row = [
            invocation.start,
            invocation.cycles,
            u64::from(invocation.tid),
            first,
            0,
            0,
            0,
            0,
        ];
        rows.push((u32::MAX - 2, row));
    }
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

/// The offset of the `n`-th packed trace chunk record (tag 13), its length, and the
/// offset of the block that holds it (see docs/format.md: blocks of whole records).
fn packed_chunk(bytes: &[u8], n: usize) -> (usize, usize, usize) {
    let mut block = glass_format::HEADER_LEN;
    let mut seen = 0;
    while block + glass_format::BLOCK_HEAD_LEN <= bytes.len() {
        let block_len =
            u32::from_le_bytes(bytes[block + 8..block + 12].try_into().unwrap()) as usize;
        let end = block + glass_format::BLOCK_HEAD_LEN + block_len;
        let mut pos = block + glass_format::BLOCK_HEAD_LEN;
        while pos + 5 <= end {
            let len = u32::from_le_bytes(bytes[pos + 1..pos + 5].try_into().unwrap()) as usize;
            if bytes[pos] == 13 {
                if seen == n {
                    return (pos, len, block);
                }
                seen += 1;
            }
            pos += 5 + len;
        }
        block = end;
    }
    panic!("fewer than {} packed chunks", n + 1)
}

/// Sets the checksum of the block at `block` to match its bytes (as the writer would
/// have, had it written them).
fn reseal_block(bytes: &mut [u8], block: usize) {
    let len = u32::from_le_bytes(bytes[block + 8..block + 12].try_into().unwrap()) as usize;
    let mut crc = crc32fast::Hasher::new();
    crc.update(&bytes[block + 4..block + 12]);
    crc.update(&bytes[block + 16..block + 16 + len]);
    let crc = crc.finalize();
    bytes[block + 12..block + 16].copy_from_slice(&crc.to_le_bytes());
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
    let tree = paths_agree(&recording, "4", "threads");
    assert_eq!(tree_line(&tree, 0, "work_a").unwrap().0, 100_000, "{tree}");
    assert_eq!(tree_line(&tree, 0, "work_b").unwrap().0, 50_000, "{tree}");
    let invocations = invocations_agree(&recording, "work_b", "4", "threads");
    assert!(
        invocations.contains("\n50000 calls of work_b; median "),
        "{invocations}"
    );
    // A root that was not traced (no output file left), or none: one line, exit 2.
    let refused = dir.join("refused.txt");
    let output = glass(&[
        "report",
        recording.to_str().unwrap(),
        "--format",
        "invocations",
        "--root",
        "no_such_function",
        "-o",
        refused.to_str().unwrap(),
    ]);
    assert_clean_failure(
        &output,
        2,
        "--root no_such_function: no traced function of that name",
    );
    assert!(
        !refused.exists(),
        "an output file was left for a refused report"
    );
    let output = glass(&[
        "report",
        recording.to_str().unwrap(),
        "--format",
        "invocations",
    ]);
    assert_clean_failure(&output, 2, "needs --root FUNCTION");
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
    // glass info counts the records as they stream by too.
    let info = glass(&["info", recording.to_str().unwrap()]);
    assert!(
        stdout(&info).contains("contents:    300000 call records from 2 threads"),
        "{}",
        stdout(&info)
    );

    // Cut inside the second chunk: what comes before it is reported, alike by every path.
    let bytes = std::fs::read(&recording).unwrap();
    // (The first chunk in a later block than the first chunk's.)
    let first_block = packed_chunk(&bytes, 0).2;
    let later = (1..)
        .find(|&n| packed_chunk(&bytes, n).2 != first_block)
        .unwrap();
    let (offset, len, block) = packed_chunk(&bytes, later);
    let truncated = dir.join("truncated.glass");
    std::fs::write(&truncated, &bytes[..offset + 5 + len / 2]).unwrap();
    let (one, warning) = report_calls(&truncated, "1");
    // (What is cut is the block that holds the cut.)
    assert!(
        warning.contains(&format!("truncated at byte {block}")),
        "{warning}"
    );
    let (four, _) = report_calls(&truncated, "4");
    assert_eq!(one, four);
    assert_eq!(one, calls_in_memory(&truncated));
    paths_agree(&truncated, "4", "truncated");
    invocations_agree(&truncated, "work_a", "4", "truncated");
    let kept = calls_of(&one, "work_a") + calls_of(&one, "work_b");
    assert!(kept > 0 && kept < 150_000, "{one}");
    assert!(one.contains("the recording ended early"), "{one}");
    assert_eq!(figures(&truncated, 1), figures(&truncated, 2));

    // A chunk whose packed body is damaged: its block fails its checksum and is skipped,
    // the blocks behind it read, alike by every path.
    let mut damaged = bytes.clone();
    let (offset, len, block) = packed_chunk(&bytes, 1);
    for byte in &mut damaged[offset + 5 + len / 2..offset + 5 + len / 2 + 16] {
        *byte = 0xff; // overlong varints
    }
    let skipped_path = dir.join("skipped.glass");
    std::fs::write(&skipped_path, &damaged).unwrap();
    let (one, warning) = report_calls(&skipped_path, "1");
    assert!(
        warning.contains("damaged (checksum mismatch)")
            && warning.contains(&format!("bytes {block}-")),
        "{warning}"
    );
    let (four, _) = report_calls(&skipped_path, "4");
    assert_eq!(one, four);
    assert_eq!(one, calls_in_memory(&skipped_path));
    paths_agree(&skipped_path, "4", "skipped");
    invocations_agree(&skipped_path, "work_a", "4", "skipped");

    // The same damage in a block whose checksum matches it (a writer other than glass):
    // everything from the chunk on is dropped, as the whole-file reader drops it, though
    // the workers only find out while decoding.
    reseal_block(&mut damaged, block);
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
    paths_agree(&damaged_path, "4", "damaged");
    invocations_agree(&damaged_path, "work_a", "4", "damaged");
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
    // Each level of the recursion is a path of its own: 100 calls at every depth.
    let tree = paths_agree(&recording, "2", "recursion");
    assert_eq!(tree_line(&tree, 0, "main").unwrap().0, 1, "{tree}");
    for depth in [1, 2, 500, 1000] {
        let (calls, line) = tree_line(&tree, depth, "descend").unwrap_or_else(|| panic!("{tree}"));
        assert_eq!(calls, 100, "{line}");
    }
    // The recursion's outermost calls are its invocations; main's only callee is descend.
    let invocations = invocations_agree(&recording, "descend", "2", "recursion");
    assert!(
        invocations.contains("\n100 calls of descend;"),
        "{invocations}"
    );
    let main = invocations_agree(&recording, "main", "2", "recursion");
    assert!(main.contains("\n1 calls of main;"), "{main}");
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
    paths_agree(&thinned, "3", "thinned");
    invocations_agree(&thinned, "descend", "3", "thinned");
}

/// A trace written record by record: `threads` of (tid, words), in chunks of `split`
/// words, interleaved; `early`: the summary (with its counters) and the functions'
/// names before the chunks, as glass writes them (else the names come after them).
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
    let names = |writer: &mut glass_format::Writer<Vec<u8>>| {
        for (id, name) in ["outer", "inner", "leaf"].iter().enumerate() {
            writer
                .write(&Record::TraceFunction(TraceFunction {
                    id: id as u32,
                    module: "/bin/synthetic".into(),
                    address: 0x1000 + id as u64 * 16,
                    size: 16,
                    name: name.to_string(),
                    probe: "return address".to_string(),
                }))
                .unwrap();
        }
    };
    if early {
        names(&mut writer);
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
    if !early {
        names(&mut writer);
    }
    writer.write(&Record::TraceSummary(summary)).unwrap();
    writer.write(&Record::End).unwrap();
    std::fs::write(path, writer.into_inner()).unwrap();
}

/// Calls nested three deep with lost exits, recursion and unwinding, `counters` words
/// after each record, starting just below a wrap of the records' 44 bits of time.
fn nested_words(seed: u64, counters: usize, base: u64) -> Vec<u64> {
    use glass_probe_abi::{encode, EventKind::*};
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
        // No summary or names before the chunks: the first pass takes 1 word a record
        // and knows no root, the end says 3 words and names the root: read again.
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
        let tree = paths_agree(&path, "5", name);
        // (Outer calls whose exit was lost hold the next ones: paths at many depths.)
        let outer: u64 = (0..=2001)
            .filter_map(|depth| tree_line(&tree, depth, "outer"))
            .map(|(calls, _)| calls)
            .sum();
        assert_eq!(outer, 3 * 2001, "{name}: {tree}");
        for root in ["outer", "inner", "leaf"] {
            invocations_agree(&path, root, "5", name);
        }
        assert_eq!(figures(&path, 1), figures(&path, 3), "{name}");
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
        paths_agree(&empty, "2", "empty");
        let never = invocations_agree(&empty, "outer", "2", "empty");
        assert!(never.ends_with("outer was never called\n"), "{never}");
    }
}

#[test]
fn paths_of_equal_time_keep_the_order_of_their_first_calls() {
    use glass_probe_abi::{encode, EventKind::*};
    let dir = scratch("report_scan_ties");
    let base = 1u64 << 40;
    // Two threads call leaf and inner for exactly as long, in opposite orders: the
    // thread whose records come first in the file decides (leaf, then inner), whichever
    // worker decodes which thread.
    let calls = |first: u32, second: u32| {
        vec![
            encode(base, 0, Entry),
            encode(base + 5, first, Entry),
            encode(base + 15, first, Exit),
            encode(base + 20, second, Entry),
            encode(base + 30, second, Exit),
            encode(base + 40, 0, Exit),
        ]
    };
    let path = dir.join("ties.glass");
    synthetic(
        &path,
        &[],
        base,
        &[(1, calls(2, 1)), (2, calls(1, 2))],
        2,
        true,
    );
    for jobs in ["1", "2"] {
        let tree = paths_agree(&path, jobs, "ties");
        let (_, leaf) = tree_line(&tree, 1, "leaf").unwrap_or_else(|| panic!("{tree}"));
        let (_, inner) = tree_line(&tree, 1, "inner").unwrap_or_else(|| panic!("{tree}"));
        let at = |line: &str| tree.find(line).unwrap();
        assert!(at(leaf) < at(inner), "{tree}");
    }
    // The other thread first: the other order.
    synthetic(
        &path,
        &[],
        base,
        &[(2, calls(1, 2)), (1, calls(2, 1))],
        2,
        true,
    );
    let tree = paths_agree(&path, "2", "ties swapped");
    // Invocations that start together are numbered in the file's thread order.
    invocations_agree(&path, "outer", "2", "ties");
    let at = |function: &str| tree.find(tree_line(&tree, 1, function).unwrap().1).unwrap();
    assert!(at("inner") < at("leaf"), "{tree}");
}
