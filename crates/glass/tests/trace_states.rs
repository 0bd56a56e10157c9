//! `glass trace --pid` never breaks a live process, whatever its threads are doing and
//! whatever happens to glass: a self-checking target (tests/fixtures/trace/states.c)
//! with threads parked in nanosleep, a futex wait, epoll_wait, read on a pipe, waitpid
//! and sigsuspend (with a signal handler that calls the traced function), one spinning
//! through the bytes glass replaces, one holding vector registers across a spin, and
//! threads being created all the time. It is attached to again and again, after a
//! ptrace recording, and with glass SIGKILLed at each named step of attach and detach
//! (a test hook stops glass exactly there: GLASS_TEST_STOP_AT), with and without its
//! guardian. The target must end its run with no error found, and no session file may
//! be left in /dev/shm.

mod common;
use common::*;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, Command, Stdio};
use std::time::{Duration, Instant};

/// The steps glass can be stopped at (and killed): each is a place in attach or detach
/// where the target's state differs.
const STEPS: [&str; 10] = [
    "attach-safe-point",
    "inject-call",
    "attach-runtime",
    "attach-ledger",
    "attach-prepared",
    "attach-stopped",
    "attach-patched",
    "detach-code-restored",
    "detach-stopped",
    "detach-restored",
];

struct Target {
    child: Child,
    stderr: BufReader<ChildStderr>,
}

impl Target {
    fn start(program: &Path) -> Target {
        let mut child = Command::new(program)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the target starts");
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        stderr.read_line(&mut line).unwrap();
        assert_eq!(line, "ready\n");
        Target { child, stderr }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn assert_alive(&mut self, when: &str) {
        assert!(
            self.child.try_wait().unwrap().is_none(),
            "the target ended {when}"
        );
    }

    /// SIGTERM; it must report no error and exit 0.
    fn finish(mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.pid(), libc::SIGTERM) };
        let mut out = String::new();
        self.child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        let mut err = String::new();
        self.stderr.read_to_string(&mut err).unwrap();
        let status = self.child.wait().unwrap();
        assert_eq!(out, "errors: 0\n", "{err}");
        assert_eq!(status.code(), Some(0), "{err}");
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn compile_states(dir: &Path) -> PathBuf {
    let program = dir.join("states");
    let status = Command::new("gcc")
        .args(["-O2", "-g", "-pthread"])
        .arg(fixtures_dir().join("trace/states.c"))
        .arg("-o")
        .arg(&program)
        .status()
        .unwrap();
    assert!(status.success());
    program
}

fn attach(pid: i32, recording: &Path, seconds: &str) -> std::process::Output {
    glass(&[
        "trace",
        "--pid",
        &pid.to_string(),
        "-f",
        "mix",
        "-d",
        seconds,
        "-o",
        recording.to_str().unwrap(),
    ])
}

/// A failed attach: exit 1 with one `glass:` line of its own (after what it printed on
/// the way), never a panic.
fn assert_clean_refusal(output: &std::process::Output, round: usize) {
    let err = stderr(output);
    assert_eq!(output.status.code(), Some(1), "attach {round}: {err}");
    assert!(!err.contains("panicked"), "attach {round}: {err}");
    eprintln!(
        "attach {round} failed cleanly: {}",
        err.lines().last().unwrap_or("")
    );
}

fn session_files_of(glass_pid: u32) -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with(&format!("glass-trace-{glass_pid}-")))
        .collect()
}

/// Starts glass to stop itself at `step`, waits until it has, and kills it (its
/// guardian first unless `guardian_lives`). Returns glass's stderr (the guardian's
/// line included when it lives).
fn kill_glass_at(pid: i32, step: &str, recording: &Path, guardian_lives: bool) -> String {
    let mut glass = Command::new(GLASS)
        .args(["trace", "--pid", &pid.to_string(), "-f", "mix", "-d", "0.2"])
        .arg("-o")
        .arg(recording)
        .env("GLASS_TEST_STOP_AT", step)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let glass_pid = glass.id();
    let deadline = Instant::now() + Duration::from_secs(20);
    while process_state(glass_pid) != Some('T') {
        if let Some(status) = glass.try_wait().unwrap() {
            // Said with what glass said (seen once in ten runs, cause not yet known).
            let mut err = String::new();
            let _ = glass.stderr.take().unwrap().read_to_string(&mut err);
            panic!("glass ended ({status}) before reaching {step}: {err}");
        }
        assert!(Instant::now() < deadline, "glass never reached {step}");
        std::thread::sleep(Duration::from_millis(5));
    }
    if !guardian_lives {
        let guardian = trace_guardian_of(pid).expect("glass trace --pid runs a guardian");
        // SAFETY: killing the guardian process the test found.
        unsafe { libc::kill(guardian, libc::SIGKILL) };
    }
    glass.kill().unwrap();
    glass.wait().unwrap();
    let mut err = String::new();
    // Ends when the guardian (which shares glass's stderr) is done too.
    glass
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    if guardian_lives {
        assert!(
            err.contains("glass ended while tracing pid"),
            "{step}: {err}"
        );
        assert!(!err.contains("could not"), "{step}: {err}");
        assert!(session_files_of(glass_pid).is_empty(), "{step}: {err}");
    }
    err
}

#[test]
fn every_thread_state_survives_repeated_attaches_and_a_ptrace_recording() {
    let _alone = exclusive();
    let dir = scratch("trace_states_attach");
    let program = compile_states(&dir);
    let mut target = Target::start(&program);
    let pid = target.pid();
    let recording = dir.join("states.glass");
    let mut refused = Vec::new();
    for round in 0..20 {
        let output = attach(pid, &recording, "0.1");
        let err = stderr(&output);
        if !output.status.success() {
            // Known, rare (about 1 in 100 here): an injected dlsym that does not return
            // in time, or a detach that finds no safe point; glass says so in one line
            // and the target runs on whole. What may never happen is checked below.
            assert_clean_refusal(&output, round);
            refused.push(err);
        } else {
            assert!(err.contains("detached from pid"), "attach {round}: {err}");
        }
        target.assert_alive(&format!("after attach {round}"));
    }
    assert!(
        refused.len() <= 2,
        "{} of 20 attaches failed: {refused:?}",
        refused.len()
    );
    let sampled = dir.join("sampled.glass");
    let output = glass(&[
        "record",
        "--backend",
        "ptrace",
        "--pid",
        &pid.to_string(),
        "-d",
        "0.3",
        "-o",
        sampled.to_str().unwrap(),
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    target.assert_alive("after the ptrace recording");
    for round in 0..3 {
        let output = attach(pid, &recording, "0.1");
        assert!(output.status.success(), "{}", stderr(&output));
        target.assert_alive(&format!("after attach {round} following the recording"));
    }
    target.finish();
}

#[test]
fn a_glass_killed_at_any_step_leaves_the_target_whole_and_the_next_attach_works() {
    let _alone = exclusive();
    let dir = scratch("trace_states_killed");
    let program = compile_states(&dir);
    let mut target = Target::start(&program);
    let pid = target.pid();
    let recording = dir.join("killed.glass");
    let next = dir.join("next.glass");
    let mut refused = 0;
    for step in STEPS {
        for guardian_lives in [true, false] {
            let said = kill_glass_at(pid, step, &recording, guardian_lives);
            target.assert_alive(&format!("after glass was killed at {step}"));
            let output = attach(pid, &next, "0.1");
            let err = stderr(&output);
            if !output.status.success() {
                // As in the test above: rare, one line, the target whole.
                assert_clean_refusal(&output, refused);
                refused += 1;
                assert!(refused <= 2, "{step}: {said}\n{err}");
                target.assert_alive(&format!("after the attach that followed {step}"));
                continue;
            }
            if guardian_lives {
                // The guardian left nothing for the next glass to take out.
                assert!(!err.contains("died attached"), "{step}: {said}\n{err}");
            }
            target.assert_alive(&format!("after the attach that followed {step}"));
        }
    }
    // A glass killed while it takes out a dead one's probes: its guardian finishes.
    kill_glass_at(pid, "attach-patched", &recording, false);
    kill_glass_at(pid, "recover", &recording, true);
    // A session file left by a glass that died with its guardian: the next glass
    // removes it (its glass no longer runs).
    let mut gone = Command::new("true").spawn().unwrap();
    let dead_pid = gone.id();
    gone.wait().unwrap();
    let left = PathBuf::from(format!("/dev/shm/glass-trace-{dead_pid}-1-0"));
    std::fs::write(&left, b"").unwrap();
    let output = attach(pid, &next, "0.1");
    let err = stderr(&output);
    assert!(output.status.success(), "{err}");
    assert!(!err.contains("died attached"), "{err}");
    assert!(
        !left.exists(),
        "a dead glass's session file was left in /dev/shm"
    );
    target.finish();
}

#[test]
fn a_second_glass_on_the_same_process_is_refused_in_one_line() {
    let _alone = exclusive();
    let dir = scratch("trace_states_second");
    let program = compile_states(&dir);
    let mut target = Target::start(&program);
    let pid = target.pid();
    let first = dir.join("first.glass");
    let mut tracing = Command::new(GLASS)
        .args(["trace", "--pid", &pid.to_string(), "-f", "mix", "-d", "30"])
        .arg("-o")
        .arg(&first)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(tracing.stderr.take().unwrap());
    let mut said = String::new();
    while !said.contains("attached to pid") {
        let mut line = String::new();
        assert!(err.read_line(&mut line).unwrap() > 0, "{said}");
        said.push_str(&line);
    }
    let second = glass(&[
        "trace",
        "--pid",
        &pid.to_string(),
        "-f",
        "mix",
        "-d",
        "0.2",
        "-o",
        dir.join("second.glass").to_str().unwrap(),
    ]);
    assert_clean_failure(
        &second,
        2,
        &format!(
            "pid {pid} is already being traced by glass pid {}",
            tracing.id()
        ),
    );
    target.assert_alive("after the second glass");
    // The first is undisturbed: it detaches on SIGINT as usual.
    // SAFETY: signalling our own child.
    unsafe { libc::kill(tracing.id() as i32, libc::SIGINT) };
    let status = tracing.wait().unwrap();
    let mut rest = String::new();
    err.read_to_string(&mut rest).unwrap();
    assert!(status.success(), "{said}{rest}");
    assert!(rest.contains("detached from pid"), "{rest}");
    target.finish();
}
