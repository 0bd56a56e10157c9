//! `glass trace` end to end: fixtures with known call counts and awkward control flow
//! (recursion, threads, exceptions, longjmp, signals, tiny and oddly shaped functions),
//! and real programs of this machine with every function patched. Each traced run must
//! print exactly what the untraced run prints and exit with the same status.

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn compile_trace_fixture(dir: &Path, source: &str, extra: &[&str]) -> PathBuf {
    let stem = source.split('.').next().unwrap();
    let out = dir.join(stem);
    let compiler = if source.ends_with(".cpp") {
        "g++"
    } else {
        "gcc"
    };
    let status = Command::new(compiler)
        .args(["-O2", "-g"])
        .arg(fixtures_dir().join("trace").join(source))
        .arg("-o")
        .arg(&out)
        .args(extra)
        .status()
        .expect("compiler runs");
    assert!(status.success(), "{compiler} failed for {source}");
    out
}

fn run(command: &[&str]) -> Output {
    Command::new(command[0])
        .args(&command[1..])
        .output()
        .expect("runs")
}

/// Traces `command` and checks it behaves exactly as without glass.
fn trace_same(recording: &Path, options: &[&str], command: &[&str]) -> (Output, Output) {
    let native = run(command);
    let mut args = vec!["trace", "-o", recording.to_str().unwrap()];
    args.extend_from_slice(options);
    args.push("--");
    args.extend_from_slice(command);
    let traced = glass(&args);
    assert_eq!(
        stdout(&traced),
        stdout(&native),
        "traced output differs; glass said: {}",
        stderr(&traced)
    );
    assert_eq!(
        traced.status.code(),
        native.status.code(),
        "exit status differs; glass said: {}",
        stderr(&traced)
    );
    assert!(!stderr(&traced).contains("panicked"), "{}", stderr(&traced));
    (native, traced)
}

/// The functions whose calls the recording says were timed by `probe`.
fn probes<'a>(counted: &'a Counts, probe: &str) -> Vec<&'a str> {
    counted
        .recording
        .trace_functions
        .iter()
        .filter(|f| f.probe == probe)
        .map(|f| f.name.as_str())
        .collect()
}

#[test]
fn packet_pipeline_counts_are_exact_and_the_slow_batches_are_found() {
    let _alone = exclusive();
    let dir = scratch("trace_nf");
    let nf = compile_trace_fixture(&dir, "nf.c", &[]);
    let recording = dir.join("nf.glass");
    let (native, _) = trace_same(
        &recording,
        &[
            "--ring-size",
            "4194304",
            "-f",
            "process_batch,parse_*,classify,rule_match,rewrite,forward",
        ],
        &[nf.to_str().unwrap(), "600"],
    );
    let expected = printed_counts(&stdout(&native));
    let counted = counts(&recording);
    assert_eq!(counted.lost(), 0);
    for (name, n) in &expected {
        assert_eq!(counted.calls(name), *n, "entries of {name}");
        assert_eq!(counted.ended(name), *n, "exits of {name}");
    }
    // The calls report shows the same counts.
    let table = report(&recording, &["--format", "calls"]);
    for (name, n) in &expected {
        let row = table
            .lines()
            .find(|l| l.split_whitespace().any(|w| w == name))
            .unwrap_or_else(|| panic!("{name} not in\n{table}"));
        assert!(
            row.split_whitespace()
                .any(|w| w.replace(',', "") == n.to_string()),
            "{name}: {n} calls not in row {row:?}"
        );
    }
    // The slowest invocations of process_batch are the batches the fixture marked slow.
    let slow: Vec<u64> = stdout(&native)
        .lines()
        .find_map(|l| l.strip_prefix("slow batches:"))
        .unwrap()
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    assert!(!slow.is_empty());
    // Rank by wall time: a preemption can make an ordinary batch look slow on a busy
    // machine, so look a little further than the number of marked batches, and ask
    // nine in ten of the marked ones to be there.
    let rows = slow.len() + 8;
    let invocations = report(
        &recording,
        &[
            "--format",
            "invocations",
            "--root",
            "process_batch",
            "--limit",
            &rows.to_string(),
        ],
    );
    let found: Vec<u64> = invocations
        .lines()
        .filter_map(|l| {
            let first = l.split_whitespace().next()?;
            first.strip_prefix('#')?.parse().ok()
        })
        .collect();
    assert_eq!(found.len(), rows, "invocation report:\n{invocations}");
    let hits = slow.iter().filter(|n| found.contains(n)).count();
    assert!(
        hits * 10 >= slow.len() * 9,
        "{hits} of {} marked batches among the {rows} slowest:\n{invocations}",
        slow.len()
    );
    assert!(
        invocations.contains("classify"),
        "the slow part is named:\n{invocations}"
    );
    // The other formats render.
    for format in ["tree", "chrome", "flamegraph"] {
        let out = dir.join(format!("nf.{format}"));
        report(
            &recording,
            &["--format", format, "-o", out.to_str().unwrap()],
        );
        assert!(std::fs::metadata(&out).unwrap().len() > 100, "{format}");
    }
    // One complete event per call on the timeline; the flame graph names the stages.
    let total_calls: u64 = expected.values().sum();
    let chrome = std::fs::read_to_string(dir.join("nf.chrome")).unwrap();
    assert!(chrome.starts_with('{') && chrome.trim_end().ends_with("]}"));
    assert_eq!(chrome.matches("\"ph\":\"X\"").count() as u64, total_calls);
    let svg = std::fs::read_to_string(dir.join("nf.flamegraph")).unwrap();
    for name in ["process_batch", "classify", "rule_match"] {
        assert!(svg.contains(name), "{name} in the flame graph");
    }
    let info = glass(&["info", recording.to_str().unwrap()]);
    assert!(stdout(&info).contains("lost"), "{}", stdout(&info));
}

#[test]
fn deep_recursion_and_threads() {
    let _alone = exclusive();
    let dir = scratch("trace_recursion");
    let program = compile_trace_fixture(&dir, "recursion.c", &[]);
    let recording = dir.join("r.glass");
    trace_same(&recording, &["-f", "descend"], &[program.to_str().unwrap()]);
    let counted = counts(&recording);
    assert_eq!(counted.calls("descend"), 100 * 1000);
    assert_eq!(counted.ended("descend"), 100 * 1000);

    let program = compile_trace_fixture(&dir, "threads.c", &["-lpthread"]);
    let recording = dir.join("t.glass");
    trace_same(&recording, &["-f", "work_*"], &[program.to_str().unwrap()]);
    let counted = counts(&recording);
    assert_eq!(counted.calls("work_a"), 100_000);
    assert_eq!(counted.calls("work_b"), 50_000);
    let threads: std::collections::BTreeSet<u32> = counted
        .recording
        .trace_chunks
        .iter()
        .map(|c| c.tid)
        .collect();
    assert_eq!(threads.len(), 2, "one ring per thread");
}

#[test]
fn exceptions_longjmp_and_signals_behave_as_without_glass() {
    let _alone = exclusive();
    let dir = scratch("trace_nonlocal");
    // Each exit probe: return sites where the code allows (the default), and the
    // return address replaced everywhere. gcc splits each C++ function's landing pads
    // into a `.cold` part the hot part jumps to, which the return-site probes refuse;
    // built without the split, the exception unwinds frames timed at their return sites.
    for (exit_probe, split) in [("auto", true), ("auto", false), ("return-address", true)] {
        let flags: &[&str] = match split {
            true => &[],
            false => &["-fno-reorder-blocks-and-partition"],
        };
        let program = compile_trace_fixture(&dir, "throw.cpp", flags);
        let recording = dir.join(format!("throw-{exit_probe}-{split}.glass"));
        let (native, _) = trace_same(
            &recording,
            &[
                "-f",
                "catcher,level1,level2,level3",
                "--exit-probe",
                exit_probe,
            ],
            &[program.to_str().unwrap()],
        );
        assert_eq!(native.status.code(), Some(3));
        let counted = counts(&recording);
        for name in ["catcher", "level1", "level2", "level3"] {
            assert_eq!(counted.calls(name), 1000, "{name} ({exit_probe})");
            assert_eq!(counted.ended(name), 1000, "{name} ({exit_probe})");
        }
        assert_eq!(
            counted.unwound.get("level3").copied(),
            Some(1000),
            "{exit_probe}"
        );
        let sites = probes(&counted, "return sites");
        match (exit_probe, split) {
            ("auto", false) => assert_eq!(sites.len(), 4, "{sites:?}"),
            ("return-address", _) => assert!(sites.is_empty(), "{sites:?}"),
            _ => {}
        }

        let program = compile_trace_fixture(&dir, "longjmp.c", &[]);
        let recording = dir.join(format!("longjmp-{exit_probe}.glass"));
        trace_same(
            &recording,
            &["-f", "driver,jump_*", "--exit-probe", exit_probe],
            &[program.to_str().unwrap()],
        );
        let counted = counts(&recording);
        assert_eq!(counted.calls("jump_a"), counted.ended("jump_a"));
        assert!(counted.unwound.values().sum::<u64>() > 0);
        let sites = probes(&counted, "return sites");
        match exit_probe {
            "auto" => assert!(sites.contains(&"jump_a"), "{sites:?}"),
            _ => assert!(sites.is_empty(), "{sites:?}"),
        }
    }
    let program = dir.join("longjmp");
    // With every function of libc too: setjmp must not be patched (it would save the
    // exit stub as the place longjmp comes back to), nor the unwinder for exceptions.
    trace_same(
        &dir.join("longjmp-libc.glass"),
        &["-f", "*", "--lib", "libc.so*"],
        &[program.to_str().unwrap()],
    );
    let throw = dir.join("throw");
    trace_same(
        &dir.join("throw-all.glass"),
        &["-f", "*", "--lib", "libstdc++*,libgcc_s*,libc.so*"],
        &[throw.to_str().unwrap()],
    );

    let program = compile_trace_fixture(&dir, "signal.c", &[]);
    let recording = dir.join("signal.glass");
    trace_same(
        &recording,
        &["-f", "busy_step,on_signal_work"],
        &[program.to_str().unwrap()],
    );
    let counted = counts(&recording);
    assert_eq!(counted.calls("busy_step"), 2_000_000);
    assert!(counted.calls("on_signal_work") >= 1, "handlers are traced");
}

#[test]
fn tail_calls_and_a_forked_child() {
    let _alone = exclusive();
    let dir = scratch("trace_tailcall");
    let program = compile_trace_fixture(&dir, "tailcall.c", &[]);
    let recording = dir.join("tailcall.glass");
    trace_same(
        &recording,
        &["-f", "leaf,middle,outer,in_child"],
        &[program.to_str().unwrap()],
    );
    let counted = counts(&recording);
    assert_eq!(counted.lost(), 0);
    for (name, calls) in [
        ("outer", 2500),
        ("middle", 2500),
        ("leaf", 2500),
        ("in_child", 500),
    ] {
        assert_eq!(counted.calls(name), calls, "{name}");
        assert_eq!(
            counted.exits.get(name).copied(),
            Some(calls),
            "{name} returns"
        );
    }
    let pids: std::collections::BTreeSet<u32> = counted
        .recording
        .trace_chunks
        .iter()
        .map(|c| c.pid)
        .collect();
    assert_eq!(pids.len(), 2, "the child records into its own ring");
    // A tail call nests: middle's call ends when leaf returns, with it.
    let tree = report(&recording, &["--format", "tree"]);
    let depth = |name: &str| {
        tree.lines()
            .find(|l| l.trim_end().ends_with(&format!(" {name}")))
            .map(|l| l.split_whitespace().count())
    };
    assert!(tree.contains("outer") && depth("leaf").is_some(), "{tree}");
}

#[test]
fn the_target_runs_on_when_glass_is_killed() {
    let _alone = exclusive();
    let dir = scratch("trace_killed");
    let program = compile_trace_fixture(&dir, "nf.c", &[]);
    let native = run(&[program.to_str().unwrap(), "100000"]);
    let recording = dir.join("killed.glass");
    let child = Command::new(GLASS)
        .args([
            "trace",
            "-q",
            "--ring-size",
            "4096",
            "-o",
            recording.to_str().unwrap(),
            "-f",
            "*",
        ])
        .arg("--")
        .arg(&program)
        .arg("100000")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    // SAFETY: killing our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    // The target still holds the pipe: its whole output arrives once it has finished.
    let output = child.wait_with_output().unwrap();
    assert_eq!(stdout(&output), stdout(&native));
    // What glass wrote before it died is a readable recording that says it is cut short,
    // with times in nanoseconds from the rate measured while setting up.
    let recording = glass_format::read_file(&recording).unwrap();
    if !recording.complete && !recording.trace_functions.is_empty() {
        let trace = glass_report::calltrace::CallTrace::build(&recording);
        assert!(trace.tsc_hz > 0);
        assert!(glass_report::calltrace::losses(&recording).contains("ended early"));
    }
}

#[test]
fn tiny_and_oddly_shaped_functions_are_instrumented() {
    let _alone = exclusive();
    let dir = scratch("trace_shapes");
    let program = compile_trace_fixture(&dir, "shapes.c", &[]);
    let recording = dir.join("shapes.glass");
    trace_same(&recording, &["-f", "*"], &[program.to_str().unwrap()]);
    let counted = counts(&recording);
    let skipped: Vec<&str> = counted
        .recording
        .trace_skipped
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    // packed_inc has no padding after it: it is traced at its direct call sites.
    for name in [
        "add3",
        "zero",
        "load_global",
        "short_branch",
        "dispatch",
        "tiny_call",
        "packed_inc",
        "packed_dec",
    ] {
        assert!(!skipped.contains(&name), "{name} was skipped: {skipped:?}");
        assert!(
            counted.calls(name) >= 1000,
            "{name}: {}",
            counted.calls(name)
        );
        assert_eq!(counted.calls(name), counted.ended(name), "{name}");
    }
}

#[test]
fn real_programs_run_identically_with_every_function_patched() {
    let _alone = exclusive();
    let dir = scratch("trace_real");
    let input = dir.join("input.txt");
    let text: String = (0..20_000)
        .map(|i| format!("line {i} {}\n", i * 7919 % 1000))
        .collect();
    std::fs::write(&input, text).unwrap();
    let input = input.to_str().unwrap();
    let cases: Vec<Vec<&str>> = vec![
        vec!["/usr/bin/xz", "-c", "-6", input],
        vec!["/usr/bin/gzip", "-c", "-9", input],
        vec![
            "/usr/bin/python3",
            "-c",
            "import json; print(sum(len(json.dumps({'a': i})) for i in range(3000)))",
        ],
    ];
    for command in cases {
        if !Path::new(command[0]).exists() {
            continue;
        }
        let recording = dir.join("real.glass");
        let (_, traced) = trace_same(&recording, &["-f", "*"], &command);
        let said = stderr(&traced);
        assert!(said.contains("instrumented"), "{said}");
        let counted = counts(&recording);
        assert!(counted.recording.trace_functions.len() > 50, "{said}");
        assert!(counted.entries.values().sum::<u64>() > 0);
        eprintln!("{}: {said}", command[0]);
    }
}

#[test]
fn library_calls_through_the_got_lazy_bind_now_and_relro() {
    let _alone = exclusive();
    let dir = scratch("trace_libcalls");
    for (name, flags) in [
        ("lazy", &["-Wl,-z,lazy"][..]),
        ("now_relro", &["-Wl,-z,now,-z,relro"][..]),
        ("no_plt", &["-fno-plt"][..]),
    ] {
        let program = compile_trace_fixture(&dir, "libcalls.c", flags);
        let renamed = dir.join(name);
        std::fs::rename(&program, &renamed).unwrap();
        let recording = dir.join(format!("{name}.glass"));
        trace_same(
            &recording,
            &["--libcalls", "malloc,free,mem*"],
            &[renamed.to_str().unwrap()],
        );
        let counted = counts(&recording);
        for call in ["malloc@plt", "memset@plt", "free@plt"] {
            assert_eq!(counted.calls(call), 10_000, "{name}: {call}");
            assert_eq!(counted.ended(call), 10_000, "{name}: {call}");
        }
    }
}

#[test]
fn functions_of_a_shared_library_with_lib() {
    let _alone = exclusive();
    // qsort in libc calls back into the program: both are traced, nested.
    let dir = scratch("trace_lib");
    let qsort = compile(&dir, "qsort.c", "qsort", &[]);
    let recording = dir.join("qsort.glass");
    trace_same(
        &recording,
        &[
            "-f",
            "qsort,compare_records,sort_records",
            "--lib",
            "libc.so*",
        ],
        &[qsort.to_str().unwrap(), "3"],
    );
    let counted = counts(&recording);
    assert_eq!(counted.calls("sort_records"), 3);
    assert_eq!(counted.calls("qsort"), 3);
    assert!(counted.calls("compare_records") > 1000);
    let tree = report(&recording, &["--format", "tree"]);
    let indent = |name: &str| {
        let line = tree.lines().find(|l| l.trim_end().ends_with(name)).unwrap();
        line.len() - line.trim_end().len() + line.rfind(name).unwrap()
    };
    assert!(indent("compare_records") > indent("qsort"), "{tree}");
    // Every patchable function of libc and of the program at once.
    let input = dir.join("input");
    std::fs::write(&input, "some text to compress\n".repeat(5000)).unwrap();
    if Path::new("/usr/bin/xz").exists() {
        trace_same(
            &dir.join("xz.glass"),
            &["-f", "*", "--lib", "libc.so*"],
            &["/usr/bin/xz", "-c", input.to_str().unwrap()],
        );
    }
}

#[test]
fn hardware_counters_fall_back_to_time_and_say_why() {
    let _alone = exclusive();
    let dir = scratch("trace_pmc");
    let program = compile_trace_fixture(&dir, "recursion.c", &[]);
    let recording = dir.join("pmc.glass");
    let (_, traced) = trace_same(
        &recording,
        &["-f", "descend", "--pmc", "cycles,instructions"],
        &[program.to_str().unwrap()],
    );
    let said = stderr(&traced);
    let counted = counts(&recording);
    let summary = counted.recording.trace_summary.clone().unwrap();
    match glass_probe_abi::pmc::availability(&[glass_probe_abi::pmc::Counter::Cycles]) {
        // This machine has no hardware counters: glass says so and records time.
        Err(why) => {
            assert!(said.contains("recording time only"), "{said}");
            assert!(said.contains(&why), "{said}");
            assert!(summary.counters.is_empty());
            assert_eq!(summary.counters_note, why);
            let info = stdout(&glass(&["info", recording.to_str().unwrap()]));
            assert!(info.contains("time only"), "{info}");
        }
        Ok(()) => assert!(!summary.counters_note.is_empty() || !summary.counters.is_empty()),
    }
    assert_eq!(counted.calls("descend"), 100 * 1000);
    // The counter path end to end (the probe opens each thread's events, reads their
    // pages under the seqlock, glass decodes and reports them), with the software task
    // clock standing in for the hardware counters this machine does not have. Its page
    // has no rdpmc index: the probe reads the page's offset, which the kernel updates
    // when the thread is scheduled out and in, as the parent is while it waits for its
    // forked child.
    let program = compile_trace_fixture(&dir, "tailcall.c", &[]);
    let native = run(&[program.to_str().unwrap()]);
    let recording = dir.join("software.glass");
    let traced = Command::new(GLASS)
        .env("GLASS_TRACE_TEST_SOFTWARE_COUNTERS", "1")
        .args(["trace", "-o", recording.to_str().unwrap()])
        .args(["-f", "leaf,middle,outer,in_child"])
        .args(["--pmc", "cycles,instructions", "--"])
        .arg(&program)
        .output()
        .unwrap();
    assert_eq!(stdout(&traced), stdout(&native), "{}", stderr(&traced));
    let counted = counts(&recording);
    assert_eq!(counted.calls("outer"), 2500);
    assert_eq!(counted.ended("in_child"), 500);
    let summary = counted.recording.trace_summary.clone().unwrap();
    assert_eq!(summary.counters, ["cycles", "instructions"]);
    let parent = counted.recording.meta.as_ref().unwrap().target_pid;
    let values: Vec<u64> = counted
        .recording
        .trace_chunks
        .iter()
        .filter(|c| c.pid == parent)
        .flat_map(|c| c.words.chunks_exact(3).map(|r| r[1]).collect::<Vec<_>>())
        .collect();
    assert!(
        values.windows(2).all(|w| w[0] <= w[1]),
        "a thread's counter never goes back"
    );
    assert!(
        values.last() > values.first(),
        "the parent's task clock advanced across its wait for the child"
    );
    let table = report(&recording, &["--format", "calls"]);
    assert!(
        table.contains("cycles/call") && table.contains("instructions/call"),
        "{table}"
    );

    let output = glass(&[
        "trace",
        "-o",
        "/tmp/glass-unused.glass",
        "-f",
        "descend",
        "--pmc",
        "cycles,bogus",
        "--",
        program.to_str().unwrap(),
    ]);
    assert_clean_failure(&output, 2, "bogus");
}

#[test]
fn bad_input_and_a_full_disk() {
    let _alone = exclusive();
    let dir = scratch("trace_bad");
    let program = compile_trace_fixture(&dir, "recursion.c", &[]);
    let program = program.to_str().unwrap();
    let out = dir.join("x.glass");
    let out = out.to_str().unwrap();
    let output = glass(&["trace", "-o", out, "-f", "no_such_*", "--", program]);
    assert_clean_failure(&output, 2, "no function of");
    let script = dir.join("script.sh");
    std::fs::write(&script, "#!/bin/sh\necho hi\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let output = glass(&[
        "trace",
        "-o",
        out,
        "-f",
        "*",
        "--",
        script.to_str().unwrap(),
    ]);
    assert_clean_failure(&output, 2, "not an ELF file");
    // An ELF for another machine: the same binary with e_machine set to AArch64.
    let mut bytes = std::fs::read(program).unwrap();
    bytes[18] = 0xb7;
    bytes[19] = 0;
    let foreign = dir.join("foreign");
    std::fs::write(&foreign, bytes).unwrap();
    std::fs::set_permissions(
        &foreign,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let output = glass(&[
        "trace",
        "-o",
        out,
        "-f",
        "*",
        "--",
        foreign.to_str().unwrap(),
    ]);
    assert_clean_failure(&output, 2, "x86-64");
    let output = glass(&["trace", "-o", out, "--", program]);
    assert_clean_failure(&output, 2, "nothing to trace");
    // A statically linked program cannot load the probe runtime: it is not started.
    let static_dir = dir.join("static");
    std::fs::create_dir_all(&static_dir).unwrap();
    let static_program = compile_trace_fixture(&static_dir, "recursion.c", &["-static"]);
    // What is at the output path already stays: the refusal comes once the program is
    // reached, and nothing was recorded.
    std::fs::write(out, b"an earlier recording").unwrap();
    let output = glass(&[
        "trace",
        "-o",
        out,
        "-f",
        "descend",
        "--",
        static_program.to_str().unwrap(),
    ]);
    assert_clean_failure(&output, 2, "statically linked");
    assert!(stdout(&output).is_empty(), "the program did not run");
    assert_eq!(std::fs::read(out).unwrap(), b"an earlier recording");
    // A full disk: the target runs to the end unharmed, glass says what was lost.
    let native = run(&[program]);
    let output = glass(&["trace", "-o", "/dev/full", "-f", "descend", "--", program]);
    assert_eq!(stdout(&output), stdout(&native));
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("records lost"),
        "{}",
        stderr(&output)
    );
}

/// `-f` globs match the names reports show: Rust's (`rsp::*`, with panics unwinding
/// through traced frames) and C++'s (`shapes::Counter::*`, with exceptions), and every
/// trace format names them so, as sampling reports do; the raw symbol still matches.
#[test]
fn rust_and_cpp_functions_are_traced_by_their_demangled_names() {
    let _alone = exclusive();
    let dir = scratch("trace_demangled");
    let rust = dir.join("rsp");
    let status = Command::new("rustc")
        .args([
            "-C",
            "opt-level=1",
            "-C",
            "debuginfo=2",
            "-C",
            "panic=unwind",
        ])
        .args(["-C", "force-frame-pointers=yes", "--edition", "2021", "-o"])
        .arg(&rust)
        .arg(fixtures_dir().join("trace/rsp.rs"))
        .status()
        .expect("rustc runs");
    assert!(status.success(), "rustc failed for rsp.rs");
    let recording = dir.join("rsp.glass");
    let (native, traced) = trace_same(
        &recording,
        &["-f", "rsp::top,rsp::mid,rsp::leaf"],
        &[rust.to_str().unwrap(), "50"],
    );
    assert!(
        stderr(&traced).contains("instrumented 3 functions"),
        "{}",
        stderr(&traced)
    );
    let truth = stdout(&native);
    let own = |name: &str| -> u64 {
        truth
            .split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{name}="))?.parse().ok())
            .unwrap_or_else(|| panic!("{name} in {truth}"))
    };
    let counted = counts(&recording);
    for name in ["top", "mid", "leaf"] {
        assert_eq!(
            counted.calls(&format!("rsp::{name}")),
            own(name),
            "{name}: {truth}"
        );
    }
    // Each panic unwinds through mid's traced frame.
    assert_eq!(
        counted.unwound.get("rsp::mid").copied(),
        Some(own("panics")),
        "{truth}"
    );
    for format in ["calls", "tree", "chrome"] {
        let shown = stdout(&glass(&[
            "report",
            recording.to_str().unwrap(),
            "--format",
            format,
        ]));
        assert!(
            shown.contains("rsp::mid") && !shown.contains("_ZN3rsp"),
            "{format}: {shown}"
        );
    }
    // The raw symbol matches too, and is shown demangled.
    let raw = String::from_utf8_lossy(&Command::new("nm").arg(&rust).output().unwrap().stdout)
        .lines()
        .find_map(|l| {
            l.split_whitespace()
                .nth(2)
                .filter(|n| n.starts_with("_ZN3rsp4leaf"))
                .map(String::from)
        })
        .expect("rsp::leaf's symbol");
    trace_same(&recording, &["-f", &raw], &[rust.to_str().unwrap(), "5"]);
    assert_eq!(counts(&recording).calls("rsp::leaf"), 5 * 170);

    let cpp = compile_trace_fixture(&dir, "names.cpp", &[]);
    let recording = dir.join("names.glass");
    let (native, _) = trace_same(
        &recording,
        &["-f", "shapes::Counter::*"],
        &[cpp.to_str().unwrap()],
    );
    assert!(
        stdout(&native).starts_with("bump=1000 twice=800 caught=200"),
        "{}",
        stdout(&native)
    );
    let counted = counts(&recording);
    assert_eq!(counted.calls("shapes::Counter::bump(int)"), 1000);
    assert_eq!(counted.calls("shapes::Counter::twice(int)"), 800);
    assert_eq!(
        counted.unwound.get("shapes::Counter::bump(int)").copied(),
        Some(200)
    );
}

/// A program that dies of a fault under tracing dies as without glass (same signal,
/// same output), and glass says where, in one line: here in its own traced function.
#[test]
fn a_program_that_dies_of_a_fault_is_said_to_have_died_where_it_did() {
    let _alone = exclusive();
    let dir = scratch("trace_crash");
    let program = compile_trace_fixture(&dir, "crash.c", &[]);
    let recording = dir.join("crash.glass");
    let native = run(&[program.to_str().unwrap()]);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(native.status.signal(), Some(libc::SIGSEGV));
    let traced = glass(&[
        "trace",
        "-o",
        recording.to_str().unwrap(),
        "-f",
        "work",
        "--",
        program.to_str().unwrap(),
    ]);
    // As a shell says it: 128 + the signal.
    assert_eq!(traced.status.code(), Some(128 + libc::SIGSEGV));
    assert_eq!(stdout(&traced), stdout(&native));
    let err = stderr(&traced);
    assert!(
        err.contains("died of SIGSEGV at pc ") && err.contains("in its own code, in work+0x"),
        "{err}"
    );
    assert_eq!(counts(&recording).calls("work"), 1001);
}
