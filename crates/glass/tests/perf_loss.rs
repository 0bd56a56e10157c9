//! No lost samples with the perf backend: rings sized from the rate and the stack size,
//! drained by a thread of their own. node, python3 and 16 C threads are recorded at 499
//! and 999 Hz and must lose nothing, with each thread's samples in line with the CPU
//! time it used. What the rings' size buys is checked without depending on how loaded
//! the machine is: a drain forced to pause 200 ms after every pass still loses nothing;
//! rings made too small for the same pause lose, and the loss is reported per thread as
//! the kernel counted it.

mod common;
use common::*;

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Output};

fn fixture(name: &str) -> String {
    fixtures_dir().join("loss").join(name).display().to_string()
}

/// Installs the Debian package of `command` when it is missing (tests run as root).
fn need(command: &str, package: &str) -> String {
    let found = |c: &str| {
        Command::new("sh")
            .args(["-c", &format!("command -v {c}")])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    if let Some(path) = found(command) {
        return path;
    }
    apt_install(package);
    found(command).unwrap_or_else(|| panic!("{package} installed but {command} not found"))
}

/// The real interpreter (not a version manager's shim, which would be sampled too).
fn python3() -> String {
    ["/usr/bin/python3"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .map(str::to_string)
        .unwrap_or_else(|| need("python3", "python3"))
}

fn record(out: &Path, hz: u32, options: &[&str], env: &[(&str, &str)], argv: &[&str]) -> Output {
    let hz = hz.to_string();
    let mut command = Command::new(GLASS);
    command
        .args(["record", "--backend", "perf", "-F", &hz, "-o"])
        .arg(out)
        .args(options)
        .arg("--")
        .args(argv);
    for (key, value) in env {
        command.env(key, value);
    }
    let output = command.output().expect("glass runs");
    assert!(
        output.status.success(),
        "glass record failed: {}",
        stderr(&output)
    );
    output
}

/// Samples per thread of the recording, and the summary's total loss.
fn samples_by_thread(path: &Path) -> (HashMap<u32, u64>, glass_format::Recording) {
    let recording = glass_format::read_file(path).expect("readable recording");
    let mut by_tid = HashMap::new();
    for sample in &recording.samples {
        *by_tid.entry(sample.tid).or_insert(0u64) += 1;
    }
    (by_tid, recording)
}

fn lost(recording: &glass_format::Recording) -> u64 {
    recording.summary.as_ref().expect("summary").lost_samples
}

/// The interpreters report their own CPU time: samples of their process must match it (a
/// cpu-clock sample every 1/HZ s of CPU time in user mode, and in kernel mode with kernel
/// stacks).
fn check_interpreter(name: &str, hz: u32, argv: &[&str], dir: &Path) {
    let out = dir.join(format!("{name}-{hz}.glass"));
    let output = record(&out, hz, &[], &[], argv);
    let (by_tid, recording) = samples_by_thread(&out);
    assert_eq!(
        lost(&recording),
        0,
        "{name} at {hz} Hz lost samples: {}",
        stderr(&output)
    );
    assert!(recording.thread_lost.is_empty());
    assert!(
        stderr(&output).contains("lost samples 0"),
        "{}",
        stderr(&output)
    );
    let figure = |name: &str| -> f64 {
        stdout(&output)
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} printed no {name}: {}", stdout(&output)))
    };
    // With kernel stacks, kernel-mode time is sampled too.
    let kernel = stderr(&output).contains("kernel stacks recorded");
    let cpu_us = figure("user_us") + if kernel { figure("system_us") } else { 0.0 };
    let samples: u64 = by_tid.values().sum();
    let expected = cpu_us / 1e6 * hz as f64;
    let ratio = samples as f64 / expected;
    eprintln!("{name} at {hz} Hz: {samples} samples for {expected:.0} expected ({ratio:.2})");
    assert!(
        (0.8..=1.15).contains(&ratio),
        "{name} at {hz} Hz: {samples} samples for {:.3} s of CPU time ({expected:.0} expected)",
        cpu_us / 1e6
    );
}

#[test]
fn node_loses_nothing() {
    let _alone = exclusive();
    let node = need("node", "nodejs");
    let dir = scratch("perf_loss_node");
    let script = fixture("busy.js");
    for hz in [499, 999] {
        check_interpreter("node", hz, &[&node, &script, "1500"], &dir);
    }
}

#[test]
fn python_loses_nothing() {
    let _alone = exclusive();
    let python = python3();
    let dir = scratch("perf_loss_python");
    let script = fixture("busy.py");
    for hz in [499, 999] {
        check_interpreter("python3", hz, &[&python, &script, "1500"], &dir);
    }
}

/// (tid, CPU seconds) per thread as the fixture measured them.
fn thread_cpu(output: &Output) -> Vec<(u32, f64)> {
    let threads: Vec<(u32, f64)> = stdout(output)
        .lines()
        .filter_map(|l| {
            let mut words = l.strip_prefix("thread ")?.split_whitespace();
            Some((
                words.next()?.parse().ok()?,
                words.next()?.parse::<f64>().ok()? / 1e9,
            ))
        })
        .collect();
    assert_eq!(threads.len(), 16, "{}", stdout(output));
    threads
}

#[test]
fn sixteen_threads_lose_nothing_and_each_gets_its_share() {
    let _alone = exclusive();
    let dir = scratch("perf_loss_threads");
    let binary = compile(&dir, "loss/threads16.c", "threads16", &["-pthread"]);
    for hz in [499, 999] {
        let out = dir.join(format!("t-{hz}.glass"));
        let output = record(&out, hz, &[], &[], &[binary.to_str().unwrap(), "12"]);
        let (by_tid, recording) = samples_by_thread(&out);
        assert_eq!(lost(&recording), 0, "at {hz} Hz: {}", stderr(&output));
        let (mut all_samples, mut all_expected) = (0.0, 0.0);
        for (tid, cpu) in thread_cpu(&output) {
            let samples = by_tid.get(&tid).copied().unwrap_or(0) as f64;
            let expected = cpu * hz as f64;
            all_samples += samples;
            all_expected += expected;
            assert!(
                samples > 0.0 && samples <= expected * 1.2 + 5.0,
                "thread {tid} at {hz} Hz: {samples} samples for {cpu:.3} s of CPU ({expected:.0} expected)"
            );
            // The kernel's cpu-clock event, not glass, decides how many samples a thread
            // gets, and 16 threads on 2 CPUs run in slices shorter than its period: a
            // thread of a dozen expected samples got 2 in a fresh-clone run (0 lost). The
            // share is held only where the count is large enough to say something.
            if expected >= 30.0 {
                assert!(
                    samples >= expected * 0.75 - 5.0,
                    "thread {tid} at {hz} Hz: {samples} samples for {cpu:.3} s of CPU ({expected:.0} expected)"
                );
            }
        }
        assert!(
            all_samples >= all_expected * 0.8,
            "at {hz} Hz: {all_samples} samples for {all_expected:.0} expected over the 16 threads"
        );
    }
}

/// A drain that pauses 200 ms after every pass (as a glass starved of CPU would) loses
/// nothing: the rings hold half a second at the rate.
#[test]
fn a_slow_drain_loses_nothing_with_rings_sized_for_the_rate() {
    let _alone = exclusive();
    let dir = scratch("perf_loss_slow");
    let binary = compile(&dir, "loss/threads16.c", "threads16", &["-pthread"]);
    let out = dir.join("slow.glass");
    let output = record(
        &out,
        999,
        &[],
        &[("GLASS_PERF_DRAIN_PAUSE_MS", "200")],
        &[binary.to_str().unwrap(), "8"],
    );
    let (by_tid, recording) = samples_by_thread(&out);
    assert_eq!(lost(&recording), 0, "{}", stderr(&output));
    let cpu: f64 = thread_cpu(&output).iter().map(|(_, c)| c).sum();
    let samples: u64 = by_tid.values().sum();
    assert!(
        samples as f64 >= cpu * 999.0 * 0.75,
        "{samples} samples for {cpu:.2} s of CPU"
    );
}

/// Rings of 64 KiB (three 16 KiB stacks) with the same slow drain must lose samples, and
/// the loss is reported per thread: the threads are the target's, their counts add up to
/// the summary's, and what was kept plus what was lost is about what the CPU time makes.
#[test]
fn loss_is_reported_per_thread_as_the_kernel_counted_it() {
    let _alone = exclusive();
    let dir = scratch("perf_loss_small");
    let binary = compile(&dir, "loss/threads16.c", "threads16", &["-pthread"]);
    let out = dir.join("small.glass");
    let output = record(
        &out,
        999,
        &["--ring-kib", "64"],
        &[("GLASS_PERF_DRAIN_PAUSE_MS", "200")],
        &[binary.to_str().unwrap(), "8"],
    );
    let (by_tid, recording) = samples_by_thread(&out);
    let total = lost(&recording);
    let err = stderr(&output);
    assert!(
        total > 0,
        "64 KiB rings drained every 200 ms lost nothing: {err}"
    );
    let per_thread: u64 = recording.thread_lost.iter().map(|l| l.count).sum();
    assert_eq!(per_thread, total, "per-thread losses add up to the total");
    let pid = recording.meta.as_ref().unwrap().target_pid;
    assert!(
        recording.thread_lost.iter().all(|l| l.pid == pid),
        "losses of threads outside the target: {:?}",
        recording.thread_lost
    );
    let threads = thread_cpu(&output);
    let known: Vec<u32> = threads.iter().map(|(tid, _)| *tid).collect();
    assert!(
        recording.thread_lost.iter().any(|l| known.contains(&l.tid)),
        "no loss attributed to a worker: {:?}",
        recording.thread_lost
    );
    assert!(err.contains("lost samples by thread"), "{err}");
    assert!(err.contains("worker"), "{err}");
    let cpu: f64 = threads.iter().map(|(_, c)| c).sum();
    let kept: u64 = by_tid.values().sum();
    let expected = cpu * 999.0;
    assert!(
        (kept + total) as f64 >= expected * 0.6 && ((kept + total) as f64) <= expected * 1.2 + 20.0,
        "kept {kept} + lost {total} for {expected:.0} expected"
    );
}

/// Rings the locked-memory limit cannot hold are made smaller, said in one line, and the
/// recording goes on (run as `nobody`, whose limit is perf_event_mlock_kb per CPU).
#[test]
fn rings_above_the_mlock_limit_shrink_with_a_note() {
    let _alone = exclusive();
    let dir = scratch("perf_loss_mlock");
    let binary = compile(&dir, "loss/threads16.c", "threads16", &["-pthread"]);
    open_to_nobody(&dir);
    let out = dir.join("nobody.glass");
    let output = glass_as_nobody(&[
        "record",
        "--backend",
        "perf",
        "-F",
        "999",
        "-o",
        out.to_str().unwrap(),
        "--",
        binary.to_str().unwrap(),
        "2",
    ]);
    let err = stderr(&output);
    let paranoid = perf_event_paranoid();
    if paranoid > 2 {
        // Debian's level 3 refuses perf_event_open to users: the ptrace backend is used.
        return;
    }
    assert!(output.status.success(), "{err}");
    let notes: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("perf rings limited"))
        .collect();
    assert_eq!(notes.len(), 1, "{err}");
    assert!(notes[0].contains("perf_event_mlock_kb"), "{err}");
    let (by_tid, _) = samples_by_thread(&out);
    assert!(by_tid.values().sum::<u64>() > 0, "{err}");
}
