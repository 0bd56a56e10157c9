//! Kernel stacks and off-CPU time with the perf backend: kernel frames (named from
//! /proc/kallsyms, kept in the recording) under the system call wrapper that entered the
//! kernel, in the share of CPU time the fixture spent there; none with --no-kernel;
//! `--off-cpu` puts the time a thread blocked under `[off-cpu]` and the function that
//! blocked, in the share the fixture measured, and next to nothing for a program that
//! never blocks; an unprivileged user gets user stacks and one line saying why kernel
//! stacks are off.

mod common;
use common::*;

use std::path::Path;
use std::process::Output;

/// The fixture's own figures (`name value` lines).
fn figure(output: &Output, name: &str) -> f64 {
    stdout(output)
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in: {}", stdout(output)))
}

fn is_kernel(frame: &str) -> bool {
    frame.ends_with("_[k]")
}

/// A kernel frame that enters the kernel asynchronously (an interrupt or an exception,
/// such as a page fault), not by a system call.
fn is_interrupt(frame: &str) -> bool {
    [
        "asm_sysvec_",
        "asm_common_interrupt",
        "asm_exc_",
        "el1_interrupt",
        "el0_interrupt",
        "el0_da",
        "el0_ia",
    ]
    .iter()
    .any(|entry| frame.starts_with(entry))
}

fn syscalls(dir: &Path) -> std::path::PathBuf {
    compile(dir, "kernel/syscalls.c", "syscalls", &[])
}

/// The fixture's figures are the thread's CPU time inside each *function* (its CPU clock
/// read around `user_part` and around `kernel_part`), not in each *mode*: an interrupt or a
/// preemption that lands in `user_part` is kernel time the fixture counts as user_part's.
/// Under load that time is not small (a tick that preempts `user_part` returns through
/// `irqentry_exit_to_user_mode`, `schedule` and `finish_task_switch`; perf sees the same
/// samples), so the share compared with the fixture's is the share of samples *under
/// each function*, whatever their mode; where the kernel frames sit is checked apart.
#[test]
fn kernel_frames_sit_under_the_system_call_wrapper_in_the_right_share() {
    let _alone = exclusive();
    let dir = scratch("kernel_split");
    let binary = syscalls(&dir);
    let out = dir.join("k.glass");
    let output = record_with(
        &out,
        999,
        &["--backend", "perf"],
        &[binary.to_str().unwrap(), "1500"],
    );
    let err = stderr(&output);
    assert!(err.contains("kernel stacks recorded"), "{err}");
    let stacks = folded(&out, &[]);
    // Samples under user_part and under kernel_part; of those, the ones whose kernel
    // frames entered by a system call and by an interrupt or exception.
    let (mut user, mut kernel) = (0, 0);
    let (mut user_interrupted, mut kernel_syscalls) = (0, 0);
    for (frames, count) in &stacks {
        let in_kernel_part = frames.iter().any(|f| f == "kernel_part");
        if !in_kernel_part && !frames.iter().any(|f| f == "user_part") {
            continue;
        }
        if in_kernel_part {
            kernel += count;
        } else {
            user += count;
        }
        let Some(at) = frames.iter().position(|f| is_kernel(f)) else {
            continue;
        };
        // Kernel frames are the leaves, below the user frame that entered the kernel.
        assert!(frames[at..].iter().all(|f| is_kernel(f)), "{frames:?}");
        assert!(!is_kernel(&frames[at - 1]), "{frames:?}");
        if !in_kernel_part {
            // user_part makes no system call: its kernel frames are interrupts taken
            // in user_part itself.
            assert!(
                frames[at - 1] == "user_part" && is_interrupt(&frames[at]),
                "kernel frames in user_part not from an interrupt: {frames:?}"
            );
            user_interrupted += count;
        } else if !is_interrupt(&frames[at]) {
            // The system calls of kernel_part are its reads. (An interrupt may come in
            // anywhere: a timer tick in kernel_part's own loop has kernel frames under it.)
            assert!(
                frames[at - 1].contains("read"),
                "kernel frames not under the read wrapper: {frames:?}"
            );
            kernel_syscalls += count;
        }
    }
    // Named from kallsyms: the read system call's path through the kernel.
    let named = |name: &str| {
        stacks
            .iter()
            .any(|(f, _)| f.iter().any(|f| f.starts_with(name)))
    };
    assert!(
        named("ksys_read_[k]") || named("vfs_read_[k]"),
        "{stacks:?}"
    );
    if cfg!(target_arch = "x86_64") {
        assert!(named("do_syscall_64_[k]"), "{stacks:?}");
    }
    let user_ns = figure(&output, "user_part_ns");
    let kernel_ns = figure(&output, "kernel_part_ns");
    let samples = user + kernel;
    assert!(samples >= 200, "too few samples: {kernel} + {user}");
    let expected = 100.0 * kernel_ns / (user_ns + kernel_ns);
    let measured = 100.0 * kernel as f64 / samples as f64;
    // Four standard errors of a share of this many samples (each ~0.4 ms part is hit by
    // a 1 ms sampling clock or not: binomial noise), at least 3 points.
    let tolerance = share_tolerance(expected, samples, 3.0);
    eprintln!(
        "kernel_part: {measured:.1}% of samples, {expected:.1}% of CPU time ({kernel} of {samples}; {tolerance:.1} points allowed); \
         kernel frames: {kernel_syscalls} by read under kernel_part, {user_interrupted} by interrupts under user_part"
    );
    assert!(
        (measured - expected).abs() <= tolerance,
        "kernel_part has {measured:.1}% of the samples, {expected:.1}% of the CPU time \
         ({kernel} of {samples} samples; {tolerance:.1} points allowed)"
    );
    // kernel_part's time is its reads (16 MiB cleared by the kernel a round, against a
    // 16-step loop in user mode): its samples are in the read system call (98.7-99.8% here,
    // quiet or loaded). Kernel frames dropped, or not kept with their sample, fail this.
    assert!(
        kernel_syscalls as f64 >= 0.8 * kernel as f64,
        "only {kernel_syscalls} of kernel_part's {kernel} samples have the read system call's kernel frames"
    );
    // user_part's kernel time is interrupts (ticks, IPIs, the way back from a preemption):
    // 0.3% of its samples on a quiet machine, up to 6% beside a parallel build. Kernel
    // frames put on user-mode samples fail this.
    assert!(
        user_interrupted * 2 <= user,
        "{user_interrupted} of user_part's {user} samples have kernel frames"
    );
    let recording = glass_format::read_file(&out).unwrap();
    assert!(!recording.kernel_symbols.symbols.is_empty());
}

#[test]
fn no_kernel_records_no_kernel_frames() {
    let _alone = exclusive();
    let dir = scratch("kernel_none");
    let binary = syscalls(&dir);
    let out = dir.join("u.glass");
    let output = record_with(
        &out,
        999,
        &["--backend", "perf", "--no-kernel"],
        &[binary.to_str().unwrap(), "600"],
    );
    let err = stderr(&output);
    assert!(
        err.contains("kernel stacks not recorded: --no-kernel"),
        "{err}"
    );
    let stacks = folded(&out, &[]);
    assert!(total(&stacks) > 50);
    assert!(
        stacks.iter().all(|(f, _)| !f.iter().any(|f| is_kernel(f))),
        "{stacks:?}"
    );
    let recording = glass_format::read_file(&out).unwrap();
    assert!(recording.kernel_symbols.symbols.is_empty());
    assert!(recording.samples.iter().all(|s| s
        .frames
        .iter()
        .all(|&a| !glass_format::is_kernel_address(a))));
}

/// The report names kernel frames from the recording alone: with /proc/kallsyms hidden
/// (an empty file bound over it in a mount namespace of its own) the names are the same.
#[test]
fn kernel_names_come_from_the_recording() {
    let _alone = exclusive();
    let dir = scratch("kernel_offline");
    let binary = syscalls(&dir);
    let out = dir.join("k.glass");
    record_with(
        &out,
        999,
        &["--backend", "perf"],
        &[binary.to_str().unwrap(), "300"],
    );
    let here = stdout(&glass(&[
        "report",
        out.to_str().unwrap(),
        "--format",
        "folded",
    ]));
    let script = format!(
        "mount --bind /dev/null /proc/kallsyms && test ! -s /proc/kallsyms && exec {GLASS} report {} --format folded",
        out.display()
    );
    let hidden = std::process::Command::new("unshare")
        .args(["-m", "sh", "-c", &script])
        .output()
        .expect("unshare runs");
    assert!(hidden.status.success(), "{}", stderr(&hidden));
    let elsewhere = stdout(&hidden);
    assert!(elsewhere.contains("_[k]"), "{elsewhere}");
    assert_eq!(here, elsewhere);
}

#[test]
fn off_cpu_time_is_under_the_blocking_function_in_its_share() {
    let _alone = exclusive();
    let dir = scratch("kernel_off_cpu");
    let binary = compile(&dir, "kernel/blocking.c", "blocking", &["-pthread"]);
    let out = dir.join("b.glass");
    let hz = 999;
    let output = record_with(
        &out,
        hz,
        &["--backend", "perf", "--off-cpu"],
        &[binary.to_str().unwrap(), "60"],
    );
    let err = stderr(&output);
    assert!(err.contains("off-CPU:"), "{err}");
    let tid = figure(&output, "main_tid") as u32;
    let waited_s = figure(&output, "waited_ns") / 1e9;
    let cpu_s = figure(&output, "main_cpu_ns") / 1e9;
    let stacks = folded(&out, &["--tid", &tid.to_string()]);
    let blocked: u64 = stacks
        .iter()
        .filter(|(f, _)| f.get(1).map(String::as_str) == Some("[off-cpu]"))
        .filter(|(f, _)| f.iter().any(|f| f == "wait_for_data"))
        .map(|(_, n)| n)
        .sum();
    let other_blocked: u64 = stacks
        .iter()
        .filter(|(f, _)| f.get(1).map(String::as_str) == Some("[off-cpu]"))
        .filter(|(f, _)| !f.iter().any(|f| f == "wait_for_data"))
        .map(|(_, n)| n)
        .sum();
    let computing = samples_in(&stacks, "compute");
    let expected_blocked = waited_s * hz as f64;
    let expected_computing = cpu_s * hz as f64;
    assert!(
        (blocked as f64) >= expected_blocked * 0.75 && (blocked as f64) <= expected_blocked * 1.25,
        "blocked under wait_for_data: {blocked} samples' worth for {waited_s:.3} s measured"
    );
    assert!(
        (other_blocked as f64) <= expected_blocked * 0.1 + 10.0,
        "{other_blocked} off-CPU elsewhere: {stacks:?}"
    );
    assert!(
        (computing as f64) >= expected_computing * 0.75
            && (computing as f64) <= expected_computing * 1.25,
        "compute: {computing} samples for {cpu_s:.3} s of CPU"
    );
    // The blocked stack goes through the kernel's read of the pipe into the scheduler.
    assert!(
        stacks
            .iter()
            .any(|(f, _)| f.iter().any(|f| f == "wait_for_data")
                && f.last().is_some_and(|leaf| is_kernel(leaf))),
        "{stacks:?}"
    );
    let top = stdout(&glass(&[
        "report",
        out.to_str().unwrap(),
        "--tid",
        &tid.to_string(),
    ]));
    assert!(top.contains("on-CPU:") && top.contains("off-CPU:"), "{top}");
}

#[test]
fn a_program_that_never_blocks_has_next_to_no_off_cpu_time() {
    let _alone = exclusive();
    let dir = scratch("kernel_on_cpu");
    let binary = syscalls(&dir);
    let out = dir.join("c.glass");
    record_with(
        &out,
        999,
        &["--backend", "perf", "--off-cpu"],
        &[binary.to_str().unwrap(), "300"],
    );
    let stacks = folded(&out, &[]);
    let off: u64 = stacks
        .iter()
        .filter(|(f, _)| f.get(1).map(String::as_str) == Some("[off-cpu]"))
        .map(|(_, n)| n)
        .sum();
    let on = total(&stacks) - off;
    assert!(on > 100, "{stacks:?}");
    // Preemptions (runnable, waiting for a CPU) are not blocking; what is left is the
    // program's start (the loader mapping files) and exit.
    assert!(
        (off as f64) <= on as f64 * 0.05 + 5.0,
        "{off} off-CPU against {on} on-CPU: {stacks:?}"
    );
}

/// An unprivileged user under perf_event_paranoid 2 may not sample the kernel: glass
/// records user stacks and says so in one line.
#[test]
fn without_privileges_user_stacks_are_recorded_and_the_reason_said() {
    let _alone = exclusive();
    let paranoid = perf_event_paranoid();
    if paranoid != 2 {
        // 1 or lower lets users sample the kernel; 3 (Debian) refuses perf entirely.
        eprintln!("perf_event_paranoid {paranoid}: not the case this test is about");
        return;
    }
    let dir = scratch("kernel_nobody");
    let binary = syscalls(&dir);
    open_to_nobody(&dir);
    for extra in [&[][..], &["--kernel", "--off-cpu"][..]] {
        let out = dir.join("n.glass");
        let mut args = vec![
            "record",
            "--backend",
            "perf",
            "-F",
            "999",
            "-o",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", binary.to_str().unwrap(), "200"]);
        let output = glass_as_nobody(&args);
        let err = stderr(&output);
        assert!(output.status.success(), "{err}");
        let why: Vec<&str> = err
            .lines()
            .filter(|l| l.contains("not recorded: perf_event_paranoid is 2"))
            .collect();
        // The summary's line, and with --kernel/--off-cpu asked for, a warning.
        assert_eq!(why.len(), if extra.is_empty() { 1 } else { 2 }, "{err}");
        let stacks = folded(&out, &[]);
        assert!(samples_in(&stacks, "user_part") > 20, "{stacks:?}");
        assert!(
            stacks.iter().all(|(f, _)| !f.iter().any(|f| is_kernel(f))),
            "{stacks:?}"
        );
    }
}

/// Kernel stacks and off-CPU time are the perf backend's: asked of another, one line and
/// exit status 2, before anything is started.
#[test]
fn kernel_options_need_the_perf_backend() {
    let _alone = exclusive();
    let dir = scratch("kernel_ptrace");
    let out = dir.join("p.glass");
    for option in ["--off-cpu", "--kernel"] {
        let output = glass(&[
            "record",
            "--backend",
            "ptrace",
            option,
            "-o",
            out.to_str().unwrap(),
            "--",
            "true",
        ]);
        assert_clean_failure(&output, 2, &format!("{option} needs the perf backend"));
        assert!(!out.exists());
    }
}

/// `--off-cpu` on a running process (`--pid`, every thread's events): its blocking shows
/// under `[off-cpu]` and the function that blocked, and the process runs on.
#[test]
fn off_cpu_time_of_a_running_process() {
    let _alone = exclusive();
    let dir = scratch("kernel_off_cpu_pid");
    let binary = compile(&dir, "kernel/blocking.c", "blocking", &["-pthread"]);
    let target = std::process::Command::new(&binary)
        .arg("150")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let out = dir.join("pid.glass");
    let pid = target.id().to_string();
    let output = glass(&[
        "record",
        "--backend",
        "perf",
        "--off-cpu",
        "-F",
        "499",
        "-d",
        "1",
        "--pid",
        &pid,
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let finished = target.wait_with_output().unwrap();
    assert!(finished.status.success());
    let stacks = folded(&out, &[]);
    let blocked: u64 = stacks
        .iter()
        .filter(|(f, _)| f.get(1).map(String::as_str) == Some("[off-cpu]"))
        .filter(|(f, _)| f.iter().any(|f| f == "wait_for_data"))
        .map(|(_, n)| n)
        .sum();
    // The main thread waits at least 10 ms of every ~20 ms round: a quarter of the
    // second at least, at 499 Hz.
    assert!(blocked >= 499 / 4, "{blocked}: {stacks:?}");
}
