//! Names as good as perf's, on a real program (tests/fixtures/names/names.c, stripped):
//! its time in the vDSO is named `__vdso_clock_gettime` and `__vdso_gettimeofday` as
//! perf names it; its static functions, which a stripped binary names only by their
//! `.eh_frame` FDEs, are one `sub_<address>` each, the same in `report` and in `trace`,
//! which accepts the name; a function instrumented but never called has its row (0
//! calls); `glass info` of a `trace --pid` recording says attached; and the summaries
//! count threads alike, in words that agree in number ("1 thread in 1 process").

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

/// The fixture built with symbols, and a stripped copy of it.
fn build(dir: &Path) -> (PathBuf, PathBuf) {
    let names = compile(dir, "names/names.c", "names", &[]);
    let stripped = dir.join("names-stripped");
    std::fs::copy(&names, &stripped).unwrap();
    let status = Command::new("strip").arg(&stripped).status().unwrap();
    assert!(status.success());
    (names, stripped)
}

/// The address and size of a local function of `binary` (gcc may suffix its name:
/// `static_mix.constprop.0`), from its symbol table.
fn local_function(binary: &Path, name: &str) -> (u64, u64) {
    let output = Command::new("nm")
        .args(["-S", "--defined-only"])
        .arg(binary)
        .output()
        .unwrap();
    stdout(&output)
        .lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [address, size, kind, symbol] = fields[..] else {
                return None;
            };
            let wanted = symbol == name || symbol.starts_with(&format!("{name}."));
            (wanted && kind.eq_ignore_ascii_case("t")).then(|| {
                (
                    u64::from_str_radix(address, 16).unwrap(),
                    u64::from_str_radix(size, 16).unwrap(),
                )
            })
        })
        .unwrap_or_else(|| panic!("no {name} in {}", binary.display()))
}

/// glass's top table: (function, module) -> self samples.
fn top_rows(recording: &Path) -> BTreeMap<(String, String), u64> {
    let output = glass(&["report", recording.to_str().unwrap(), "--limit", "100000"]);
    assert!(output.status.success(), "{}", stderr(&output));
    stdout(&output)
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("self%"))
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 6 {
                return None;
            }
            let module = fields[fields.len() - 1].to_string();
            let function = fields[4..fields.len() - 1].join(" ");
            Some(((function, module), fields[2].parse().ok()?))
        })
        .collect()
}

/// perf's names for the samples in the vDSO of the same program, or None where perf
/// cannot record here.
fn perf_vdso_names(dir: &Path, program: &Path) -> Option<BTreeSet<String>> {
    let data = dir.join("perf.data");
    let recorded = Command::new("perf")
        .args(["record", "-q", "-F", "999", "-o"])
        .arg(&data)
        .arg("--")
        .arg(program)
        .arg("100")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .ok()?;
    if !recorded.success() {
        eprintln!("perf record cannot run here: the comparison with perf is skipped");
        return None;
    }
    let output = Command::new("perf")
        .args([
            "report",
            "--stdio",
            "--no-children",
            "--sort",
            "dso,sym",
            "-i",
        ])
        .arg(&data)
        .output()
        .ok()?;
    Some(
        stdout(&output)
            .lines()
            .filter(|l| !l.starts_with('#') && l.contains("[vdso]"))
            .filter_map(|l| l.split("[.] ").nth(1))
            .map(|s| s.trim().to_string())
            .collect(),
    )
}

#[test]
fn the_vdso_and_stripped_statics_are_named_once_as_perf_and_trace_name_them() {
    let dir = scratch("names_record");
    let (names, stripped) = build(&dir);
    let (mix_at, mix_size) = local_function(&names, "static_mix");
    let mix = format!("sub_{mix_at:x}");
    for backend in ["perf", "ptrace"] {
        if backend == "perf" && perf_event_paranoid() > 1 {
            continue;
        }
        let recording = dir.join(format!("{backend}.glass"));
        let stripped_arg = stripped.to_str().unwrap();
        record_with(
            &recording,
            999,
            &["--backend", backend],
            &[stripped_arg, "100"],
        );
        let rows = top_rows(&recording);
        let vdso: BTreeSet<String> = rows
            .keys()
            .filter(|(_, module)| module == "[vdso]")
            .map(|(function, _)| function.clone())
            .collect();
        assert!(
            vdso.contains("__vdso_clock_gettime") && vdso.contains("__vdso_gettimeofday"),
            "{backend}: the vDSO's functions are not named: {rows:?}"
        );
        assert!(
            !vdso.iter().any(|f| f.starts_with("[vdso]+")),
            "{backend}: {vdso:?}"
        );
        // static_mix is about 3/4 of the run: one row, under its FDE's name.
        let module_rows: Vec<&(String, String)> = rows
            .keys()
            .filter(|(f, m)| m == "names-stripped" && f.starts_with("names-stripped+"))
            .collect();
        assert!(
            module_rows.is_empty(),
            "{backend}: addresses named by offset: {module_rows:?}"
        );
        let total: u64 = rows.values().sum();
        let in_mix = rows
            .get(&(mix.clone(), "names-stripped".to_string()))
            .copied()
            .unwrap_or(0);
        assert!(
            in_mix * 2 > total,
            "{backend}: {mix} (static_mix, {mix_size} bytes) has {in_mix} of {total} samples: {rows:?}"
        );
        if backend == "perf" {
            if let Some(perf) = perf_vdso_names(&dir, &stripped) {
                assert!(!perf.is_empty(), "perf named nothing in the vDSO");
                assert!(
                    perf.is_subset(&vdso),
                    "perf names {perf:?} in the vDSO, glass {vdso:?}"
                );
            }
        }
    }

    // The name the report gave is one glass trace takes: one call per round.
    let recording = dir.join("trace.glass");
    let output = glass(&[
        "trace",
        "-f",
        &mix,
        "-o",
        recording.to_str().unwrap(),
        "--",
        stripped.to_str().unwrap(),
        "7",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let calls = reported_calls(&recording);
    assert_eq!(calls.get(&mix), Some(&7), "{calls:?}");
}

#[test]
fn a_function_never_called_has_its_row_with_0_calls() {
    let dir = scratch("names_never_called");
    let (names, _) = build(&dir);
    let recording = dir.join("trace.glass");
    let output = glass(&[
        "trace",
        "-f",
        "round_of_work,never_called",
        "-o",
        recording.to_str().unwrap(),
        "--",
        names.to_str().unwrap(),
        "3",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    // The summary says how many, in the singular where it is one.
    let err = stderr(&output);
    assert!(err.contains("instrumented 2 functions"), "{err}");
    assert!(err.contains(" from 1 thread in "), "{err}");
    let report = glass(&["report", "--format", "calls", recording.to_str().unwrap()]);
    let text = stdout(&report);
    assert!(text.contains(", 1 thread, "), "{text}");
    let never = text
        .lines()
        .find(|l| l.ends_with(" never_called"))
        .unwrap_or_else(|| panic!("no row for never_called:\n{text}"));
    assert_eq!(never.split_whitespace().next(), Some("0"), "{never}");
    let calls = reported_calls(&recording);
    assert_eq!(calls.get("round_of_work"), Some(&3), "{calls:?}");
}

#[test]
fn info_of_a_trace_of_a_running_process_says_attached() {
    let dir = scratch("names_attached");
    let (names, _) = build(&dir);
    let mut target = Command::new(&names)
        .arg("100000")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let recording = dir.join("attached.glass");
    let pid = target.id().to_string();
    let output = glass(&[
        "trace",
        "--pid",
        &pid,
        "-f",
        "round_of_work",
        "-d",
        "1",
        "-o",
        recording.to_str().unwrap(),
    ]);
    let _ = target.kill();
    let _ = target.wait();
    assert!(output.status.success(), "{}", stderr(&output));
    let info = stdout(&glass(&["info", recording.to_str().unwrap()]));
    let target_line = info.lines().find(|l| l.starts_with("target:")).unwrap();
    assert!(
        target_line.contains("(attached, pid ") && !target_line.contains("launched"),
        "{info}"
    );
    assert!(target_line.contains("names 100000"), "{target_line}");
    // The same for a launched one.
    let launched = dir.join("launched.glass");
    let output = glass(&[
        "trace",
        "-f",
        "round_of_work",
        "-o",
        launched.to_str().unwrap(),
        "--",
        names.to_str().unwrap(),
        "2",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let info = stdout(&glass(&["info", launched.to_str().unwrap()]));
    assert!(info.contains(" 2 (launched, pid "), "{info}");
}

#[test]
fn the_summaries_count_threads_alike() {
    let _one = exclusive();
    let dir = scratch("names_threads");
    let threads = compile(&dir, "threads.c", "threads", &["-pthread"]);
    let (names, _) = build(&dir);
    for (program, args, expected) in [
        (&names, "20", Some(1usize)),
        // Its main thread waits in join: sampled by ptrace (wall-clock), not by perf.
        (&threads, "3000", None),
    ] {
        let recording = dir.join("threads.glass");
        let output = record(&recording, 499, &[program.to_str().unwrap(), args]);
        let err = stderr(&output);
        let summary = err
            .lines()
            .find(|l| l.contains(" samples, ") || l.contains(" sample, "))
            .unwrap_or_else(|| panic!("no summary: {err}"));
        let report = stdout(&glass(&["report", recording.to_str().unwrap()]));
        let header = report.lines().next().unwrap();
        let info = stdout(&glass(&["info", recording.to_str().unwrap()]));
        let contents = info.lines().find(|l| l.starts_with("contents:")).unwrap();
        // The threads with samples, as each says it.
        let count_before = |text: &str, word: &str| -> usize {
            let at = text
                .find(word)
                .unwrap_or_else(|| panic!("no {word:?} in {text}"));
            text[..at]
                .rsplit(|c: char| !c.is_ascii_digit())
                .find(|s| !s.is_empty())
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("no count before {word:?} in {text}"))
        };
        let threads = |text: &str| {
            if text.contains(" 1 thread") {
                " thread"
            } else {
                " threads"
            }
        };
        let recorded = count_before(summary, threads(summary));
        let reported = count_before(header, threads(header));
        let informed = count_before(contents, &format!("{} sampled", threads(contents)));
        let expected = expected.unwrap_or(recorded);
        assert_eq!(
            (recorded, reported, informed),
            (expected, expected, expected),
            "\n{summary}\n{header}\n{contents}"
        );
        assert!(summary.contains(" in 1 process,"), "{summary}");
        assert!(
            !summary.contains("1 threads") && !header.contains("1 threads"),
            "{summary}\n{header}"
        );
    }
}

#[test]
fn a_recording_with_a_duration_says_where_the_time_beyond_it_went() {
    let dir = scratch("names_duration");
    let (names, _) = build(&dir);
    let recording = dir.join("d.glass");
    // The program runs on after -d and holds what glass's stdout and stderr were: a
    // file, not a pipe whose end the test would wait for.
    let err_file = dir.join("record.err");
    let status = Command::new(GLASS)
        .args(["record", "-F", "499", "-d", "2", "-o"])
        .arg(&recording)
        .arg("--")
        .arg(&names)
        .arg("100000")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err_file).unwrap())
        .status()
        .unwrap();
    // The program runs on after -d: it is ended here.
    let info = stdout(&glass(&["info", recording.to_str().unwrap()]));
    if let Some(pid) = info
        .split("(launched, pid ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .and_then(|pid| pid.parse::<i32>().ok())
    {
        // SAFETY: a signal to the process this test launched through glass.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let err = std::fs::read_to_string(&err_file).unwrap();
    assert!(status.success(), "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("glass: -d 2: sampled "))
        .unwrap_or_else(|| panic!("the time beyond -d is not said: {err}"));
    let figures: Vec<f64> = line
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .filter(|s| s.contains('.'))
        .filter_map(|s| s.parse().ok())
        .collect();
    let [sampled, setting_up, stopping, _writing_end] = figures[..] else {
        panic!("{line}");
    };
    assert!((2.0..2.5).contains(&sampled), "{line}");
    // The summary's duration is the three parts.
    let duration: f64 = err
        .lines()
        .find(|l| l.contains(" s at 499 Hz"))
        .and_then(|l| l.split(" s at 499 Hz").next())
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|d| d.parse().ok())
        .unwrap_or_else(|| panic!("{err}"));
    assert!(
        (duration - (sampled + setting_up + stopping)).abs() < 0.03,
        "{duration} s recorded, {line}"
    );
}

/// `contents:` of glass info, and the note of the top table, for `recording`.
fn truncation_lines(recording: &Path) -> (String, String) {
    let info = stdout(&glass(&["info", recording.to_str().unwrap()]));
    let report = stdout(&glass(&["report", recording.to_str().unwrap()]));
    (
        info.lines()
            .find(|l| l.starts_with("contents:"))
            .unwrap()
            .to_string(),
        report
            .lines()
            .find(|l| l.starts_with("note: ") && l.contains("truncated"))
            .unwrap_or_default()
            .to_string(),
    )
}

#[test]
fn a_truncated_stack_says_why() {
    let _one = exclusive();
    let dir = scratch("names_truncated");
    // 300 frames of about 32 bytes: more than a 2 KiB copy holds.
    let recursion = compile(&dir, "recursion.c", "recursion", &[]);
    let recording = dir.join("cut.glass");
    let backend: &[&str] = if perf_event_paranoid() > 1 {
        &["--backend", "ptrace"]
    } else {
        &["--backend", "perf"]
    };
    record_with(
        &recording,
        499,
        &[backend, &["--stack-size", "2048"]].concat(),
        &[recursion.to_str().unwrap(), "3000"],
    );
    let (contents, note) = truncation_lines(&recording);
    assert!(
        contents.contains("where the stack copy was cut short")
            && !contents.contains("keeps no frame"),
        "{contents}"
    );
    assert!(
        note.contains("where the stack copy was cut short"),
        "{note}"
    );

    // Code built without frame pointers, walked by frame pointers: the walk fails in
    // frames that keep none, however much stack there is.
    let frameless = compile(
        &dir,
        "recursion.c",
        "frameless",
        &["-fomit-frame-pointer", "-fno-asynchronous-unwind-tables"],
    );
    let recording = dir.join("frameless.glass");
    record_with(
        &recording,
        499,
        &["--backend", "ptrace", "--unwind", "fp"],
        &[frameless.to_str().unwrap(), "3000", "40"],
    );
    let (contents, note) = truncation_lines(&recording);
    assert!(
        contents.contains("where the walk met code that keeps no frame")
            && !contents.contains("cut short"),
        "{contents}"
    );
    assert!(note.contains("keeps no frame"), "{note}");
}
