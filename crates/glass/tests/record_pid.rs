//! `glass record --pid`: attaching to a running process never harms it. Whatever ends
//! the recording (the duration, SIGTERM, SIGINT, even SIGKILL of glass), the target
//! keeps running and produces exactly the output it produces untraced.

mod common;
use common::*;

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ROUNDS: &str = "6000";

fn untraced_output(split: &std::path::Path) -> String {
    let output = Command::new(split).arg(ROUNDS).output().unwrap();
    assert!(output.status.success());
    String::from_utf8(output.stdout).unwrap()
}

fn start(split: &std::path::Path) -> Child {
    Command::new(split)
        .arg(ROUNDS)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

fn finish(mut child: Child) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "target failed: {status:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "target never finished: left stopped?"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut text = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut text)
        .unwrap();
    text
}

fn tracer_of(pid: u32) -> u32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("TracerPid:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn attach_for_a_duration_then_detach() {
    let dir = scratch("pid_duration");
    let split = compile(&dir, "split.c", "split", &[]);
    let expected = untraced_output(&split);
    let target = start(&split);
    let pid = target.id().to_string();
    let recording = dir.join("pid.glass");
    let output = glass(&[
        "record",
        "-F",
        "499",
        "-d",
        "1",
        "--pid",
        &pid,
        "-o",
        recording.to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(
        tracer_of(target.id()),
        0,
        "target still traced after detach"
    );
    assert_ne!(process_state(target.id()), Some('t'), "target left stopped");
    assert_eq!(finish(target), expected);
    let stacks = folded(&recording, &[]);
    assert!(samples_in(&stacks, "alpha") > 50, "{stacks:?}");
}

fn stop_glass_with(signal: i32, name: &str) {
    let dir = scratch(name);
    let split = compile(&dir, "split.c", "split", &[]);
    let expected = untraced_output(&split);
    let target = start(&split);
    let recording = dir.join("pid.glass");
    let mut recorder = Command::new(GLASS)
        .args([
            "record",
            "-F",
            "999",
            "--pid",
            &target.id().to_string(),
            "-o",
            recording.to_str().unwrap(),
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Samples written (a flush after SIGKILL is what the prefix has), then some more.
    wait_for_recording(&recording, 4096);
    std::thread::sleep(Duration::from_millis(600));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(recorder.id() as i32, signal) };
    let status = recorder.wait().unwrap();
    let mut err = String::new();
    recorder
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(!err.contains("panicked"), "{err}");
    if signal == libc::SIGKILL {
        assert_eq!(status.code(), None);
    } else {
        assert_eq!(status.code(), Some(0), "{err}");
    }
    assert_eq!(
        finish(target),
        expected,
        "target output differs after glass got signal {signal}"
    );

    // The file is complete after SIGTERM/SIGINT, and a readable prefix after SIGKILL.
    let report = glass(&["report", recording.to_str().unwrap(), "--format", "folded"]);
    assert!(report.status.success(), "{}", stderr(&report));
    assert!(stdout(&report).contains("alpha"), "{}", stdout(&report));
    let truncated = stderr(&report).contains("truncated");
    assert_eq!(truncated, signal == libc::SIGKILL, "{}", stderr(&report));
}

#[test]
fn sigterm_ends_the_recording_and_the_target_runs_on() {
    stop_glass_with(libc::SIGTERM, "pid_sigterm");
}

#[test]
fn sigint_ends_the_recording_and_the_target_runs_on() {
    stop_glass_with(libc::SIGINT, "pid_sigint");
}

#[test]
fn sigkill_of_glass_leaves_the_target_running_and_a_readable_prefix() {
    stop_glass_with(libc::SIGKILL, "pid_sigkill");
}

#[test]
fn launch_mode_ctrl_c_detaches_and_the_target_finishes() {
    let dir = scratch("launch_sigint");
    let split = compile(&dir, "split.c", "split", &[]);
    let expected = untraced_output(&split);
    let recording = dir.join("launch.glass");
    let recorder = Command::new(GLASS)
        .args([
            "record",
            "-F",
            "999",
            "-o",
            recording.to_str().unwrap(),
            "--",
            split.to_str().unwrap(),
            ROUNDS,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    // SIGINT to glass alone (not the process group): glass detaches, the target finishes.
    unsafe { libc::kill(recorder.id() as i32, libc::SIGINT) };
    let output = recorder.wait_with_output().unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    // The target inherited glass's stdout: wait until it closes it.
    assert_eq!(stdout(&output), expected);
}
