//! Stacks deeper than the reports' bound (`glass_report::MAX_DEPTH`): a 4000-deep
//! recursion traced by glass trace, and sampled 4000 deep by glass record. Every
//! report keeps the outermost 1024 frames and folds the rest into one
//! `[deeper than 1024 frames]` frame, so a flame graph's memory and time stay bounded
//! (before the bound, this trace's flame graph took 163 MB and 2-6 s: paths written out
//! per node grow with the square of the depth).

mod common;
use common::*;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use glass_report::{DEEPER_FRAME, MAX_DEPTH};

/// Runs glass to completion and returns its peak resident memory (bytes, from the
/// kernel's accounting of this one child: wait4's rusage) and its wall time.
// The child is reaped by wait4 (which also gives its rusage), not by Child::wait.
#[allow(clippy::zombie_processes)]
fn glass_measured(args: &[&str]) -> (u64, Duration) {
    let started = Instant::now();
    let child = Command::new(GLASS)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("glass runs");
    let mut status = 0;
    // SAFETY: zeroed rusage is a valid out-parameter.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child, writing status and usage.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    let elapsed = started.elapsed();
    assert_eq!(pid, child.id() as i32);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "glass {args:?}: status {status:#x}"
    );
    (usage.ru_maxrss as u64 * 1024, elapsed)
}

#[test]
fn a_4000_deep_trace_is_drawn_in_bounded_memory_and_time() {
    let dir = scratch("depth_trace");
    let program = compile(&dir, "trace/recursion.c", "recursion", &[]);
    let recording = dir.join("deep.glass");
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
            "4000",
            "20",
        ]);
        assert!(traced.status.success(), "{}", stderr(&traced));
    }
    let svg = dir.join("deep.svg");
    let (rss, took) = glass_measured(&[
        "report",
        recording.to_str().unwrap(),
        "--format",
        "flamegraph",
        "-o",
        svg.to_str().unwrap(),
    ]);
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(
        text.contains(DEEPER_FRAME),
        "no {DEEPER_FRAME} in the graph"
    );
    eprintln!(
        "4000-deep trace: flame graph {} MB peak, {took:?}",
        rss >> 20
    );
    assert!(rss < 80 << 20, "flame graph took {} MB", rss >> 20);
    assert!(took < Duration::from_secs(20), "flame graph took {took:?}");

    // The tree stops at the bound with one line for everything deeper: the 20 calls
    // of its first level (main is depth 0, descend 1..=4000).
    let tree = report(&recording, &["--format", "tree", "--limit", "5000"]);
    let lines: Vec<&str> = tree.lines().skip(2).collect();
    assert_eq!(
        lines.len(),
        MAX_DEPTH + 1,
        "{}",
        &tree[..tree.len().min(2000)]
    );
    let last = lines.last().unwrap();
    assert!(last.ends_with(DEEPER_FRAME), "{last}");
    assert_eq!(last.split_whitespace().nth(2), Some("20"), "{last}");
    let indent = last.len() - last.trim_start().len();
    assert!(indent < 2 * MAX_DEPTH + 40, "{indent}");

    // The whole-recording formats see the same bound (the model's stacks).
    let speedscope = report(&recording, &["--format", "speedscope"]);
    let json: glass_report::serde_json::Value =
        glass_report::serde_json::from_str(&speedscope).expect("speedscope JSON");
    let frames = json["shared"]["frames"].as_array().unwrap();
    assert!(
        frames.iter().any(|f| f["name"] == DEEPER_FRAME),
        "{speedscope:.500}"
    );
    let (rss, took) = glass_measured(&[
        "report",
        recording.to_str().unwrap(),
        "--format",
        "pprof",
        "-o",
        dir.join("deep.pb.gz").to_str().unwrap(),
    ]);
    eprintln!("4000-deep trace: pprof {} MB peak, {took:?}", rss >> 20);
    assert!(rss < 120 << 20, "pprof took {} MB", rss >> 20);

    // Damage of the kind that took 3.7 GB (a corrupted trace whose calls never close):
    // the same records without a single exit, so every call stays open inside the
    // ones before it, 80,001 deep.
    let full = glass_format::read_file(&recording).unwrap();
    let mut writer = glass_format::Writer::new(Vec::new()).unwrap();
    let meta = full.meta.clone().map(glass_format::Record::Meta);
    let summary = full.trace_summary.clone().unwrap();
    for record in meta
        .into_iter()
        .chain([glass_format::Record::TraceSummary(summary.clone())])
    {
        writer.write(&record).unwrap();
    }
    for function in &full.trace_functions {
        writer
            .write(&glass_format::Record::TraceFunction(function.clone()))
            .unwrap();
    }
    for chunk in &full.trace_chunks {
        let mut entries = chunk.clone();
        entries.words = chunk
            .words
            .iter()
            .filter(|&&w| w & (1 << glass_probe_abi::EXIT_BIT) == 0)
            .copied()
            .collect();
        writer
            .write(&glass_format::Record::TraceChunk(entries))
            .unwrap();
    }
    writer
        .write(&glass_format::Record::TraceSummary(summary))
        .unwrap();
    writer.write(&glass_format::Record::End).unwrap();
    let unclosed = dir.join("unclosed.glass");
    std::fs::write(&unclosed, writer.into_inner()).unwrap();
    for format in ["flamegraph", "speedscope"] {
        let (rss, took) = glass_measured(&[
            "report",
            unclosed.to_str().unwrap(),
            "--format",
            format,
            "-o",
            dir.join(format!("unclosed.{format}")).to_str().unwrap(),
        ]);
        eprintln!(
            "80,001 calls never closed: {format} {} MB peak, {took:?}",
            rss >> 20
        );
        assert!(rss < 120 << 20, "{format} took {} MB", rss >> 20);
        assert!(took < Duration::from_secs(30), "{format} took {took:?}");
    }
    let tree = report(&unclosed, &["--format", "tree", "--limit", "5000"]);
    assert!(
        tree.trim_end().ends_with(DEEPER_FRAME),
        "{:.300}",
        &tree[tree.len() - 300..]
    );
}

#[test]
fn a_4000_deep_sampled_stack_is_cut_at_the_bound() {
    let dir = scratch("depth_samples");
    let program = compile(&dir, "recursion.c", "recursion", &[]);
    let recording = dir.join("deep.glass");
    {
        let _alone = exclusive();
        let recorded = glass(&[
            "record",
            "-q",
            "--backend",
            "ptrace",
            "--unwind",
            "fp",
            "--max-depth",
            "8000",
            "-F",
            "199",
            "-o",
            recording.to_str().unwrap(),
            "--",
            program.to_str().unwrap(),
            "10000",
            "4000",
        ]);
        assert!(recorded.status.success(), "{}", stderr(&recorded));
    }
    let folded = report(&recording, &["--format", "folded"]);
    let mut deep = 0;
    for line in folded.lines() {
        let (stack, _) = line.rsplit_once(' ').unwrap();
        let frames: Vec<&str> = stack.split(';').collect();
        // The process, then at most MAX_DEPTH frames and the marker.
        assert!(frames.len() <= MAX_DEPTH + 2, "{} frames", frames.len());
        if frames.last() == Some(&DEEPER_FRAME) {
            assert_eq!(frames.len(), MAX_DEPTH + 2);
            // From the root: main, or the mark of a walk cut at the stack copy's end.
            assert!(
                ["main", "[truncated]"].contains(&frames[1]),
                "{}",
                frames[1]
            );
            deep += 1;
        }
    }
    assert!(deep > 0, "no stack reached the bound:\n{folded:.2000}");
    let (rss, took) = glass_measured(&[
        "report",
        recording.to_str().unwrap(),
        "--format",
        "flamegraph",
        "-o",
        dir.join("deep.svg").to_str().unwrap(),
    ]);
    eprintln!(
        "4000-deep samples: flame graph {} MB peak, {took:?}",
        rss >> 20
    );
    assert!(rss < 80 << 20, "flame graph took {} MB", rss >> 20);
    assert!(took < Duration::from_secs(20), "flame graph took {took:?}");
}
