//! `glass trace --pid` end to end: attaching to a running, self-checking, multi-threaded
//! packet pipeline (tests/fixtures/trace/nfd.c) again and again, detaching with every
//! byte restored, surviving glass's death, and refusing cleanly what it cannot trace.

mod common;
use common::*;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, Command, Stdio};
use std::time::Duration;

use glass_probe_abi::{EventKind, TscUnwrapper};

fn compile_nfd(dir: &Path, extra: &[&str]) -> PathBuf {
    let out = dir.join("nfd");
    let status = Command::new("gcc")
        .args(["-O2", "-g", "-pthread"])
        .arg(fixtures_dir().join("trace/nfd.c"))
        .arg("-o")
        .arg(&out)
        .args(extra)
        .status()
        .expect("gcc runs");
    assert!(status.success(), "gcc failed for nfd.c");
    out
}

/// A running nfd, ready (its first round checked).
struct Daemon {
    child: Child,
    stderr: BufReader<ChildStderr>,
}

impl Daemon {
    fn start(program: &Path, args: &[&str]) -> Daemon {
        let (daemon, line) = Daemon::spawn(Command::new(program).args(args));
        assert_eq!(line, "ready\n");
        daemon
    }

    /// Starts `command` with its output piped: it, and the first line of its stderr.
    fn spawn(command: &mut Command) -> (Daemon, String) {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the daemon starts");
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        stderr.read_line(&mut line).unwrap();
        (Daemon { child, stderr }, line)
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn assert_alive(&mut self) {
        assert!(
            self.child.try_wait().unwrap().is_none(),
            "nfd ended while traced"
        );
    }

    /// Stops it with SIGTERM; its stdout, its stderr (after "ready"), its exit code.
    fn finish(mut self) -> (String, String, Option<i32>) {
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
        (out, err, status.code())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What nfd prints when it was never traced.
fn reference_output(program: &Path) -> String {
    let output = Command::new(program).args(["2", "300"]).output().unwrap();
    assert!(output.status.success());
    String::from_utf8(output.stdout).unwrap()
}

/// Entries and ends (exits, unwound) per function, from the raw records.
fn calls(recording: &Path) -> (BTreeMap<String, (u64, u64)>, glass_format::TraceSummary) {
    let recording = glass_format::read_file(recording).expect("a readable recording");
    assert!(recording.damage.is_none(), "{:?}", recording.damage);
    let summary = recording.trace_summary.clone().expect("a trace summary");
    let names: BTreeMap<u32, String> = recording
        .trace_functions
        .iter()
        .map(|f| (f.id, f.name.clone()))
        .collect();
    // Counted by function id (a debug build decodes millions of records here).
    let mut by_id: Vec<(u64, u64)> = vec![(0, 0); glass_probe_abi::MAX_FUNCTIONS as usize];
    let mut unwrappers: BTreeMap<(u32, u32), TscUnwrapper> = BTreeMap::new();
    for chunk in &recording.trace_chunks {
        let unwrap = unwrappers
            .entry((chunk.pid, chunk.tid))
            .or_insert_with(|| TscUnwrapper::new(summary.tsc_start));
        for &word in &chunk.words {
            let event = unwrap.decode(word);
            let counts = &mut by_id[event.function as usize];
            match event.kind {
                EventKind::Entry => counts.0 += 1,
                EventKind::Exit | EventKind::Unwound => counts.1 += 1,
            }
        }
    }
    let calls: BTreeMap<String, (u64, u64)> = names
        .iter()
        .map(|(id, name)| (name.clone(), by_id[*id as usize]))
        .collect();
    (calls, summary)
}

fn attach(pid: i32, recording: &Path, functions: &str, seconds: &str) -> std::process::Output {
    glass(&[
        "trace",
        "--pid",
        &pid.to_string(),
        "-f",
        functions,
        "-d",
        seconds,
        "--max-threads",
        "256",
        "--ring-size",
        "262144",
        "-o",
        recording.to_str().unwrap(),
    ])
}

/// Starts `glass trace --pid PID` with `options` in the background and returns it once
/// it says it has attached, with its stderr so far and the rest to read.
fn spawn_attached(pid: i32, options: &[&str]) -> (Child, BufReader<ChildStderr>, String) {
    let pid = pid.to_string();
    let mut child = Command::new(GLASS)
        .args(["trace", "--pid", &pid])
        .args(options)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut said = String::new();
    while !said.contains("attached to pid") {
        let mut line = String::new();
        assert!(
            err.read_line(&mut line).unwrap() > 0,
            "glass ended before attaching: {said}"
        );
        said.push_str(&line);
    }
    (child, err, said)
}

/// The soak: attach, trace, detach, fifty times in a row (ten in the suite, fifty
/// under `./x bench soak`; GLASS_ATTACH_CYCLES sets any other count), each cycle tracing
/// 3 s in the suite and 5 s in the soak (GLASS_ATTACH_SECONDS), while nfd checks every
/// packet against its reference implementation and keeps replacing its threads.
#[test]
fn attach_detach_cycles_leave_the_pipeline_exact_and_the_code_as_it_was() {
    let _alone = exclusive();
    let dir = scratch("attach_soak");
    let nfd = compile_nfd(&dir, &[]);
    let reference = reference_output(&nfd);
    let cycles: usize = std::env::var("GLASS_ATTACH_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| campaign(10, 50));
    let seconds =
        std::env::var("GLASS_ATTACH_SECONDS").unwrap_or_else(|_| campaign(3, 5).to_string());
    // Workers that pause 2 ms between rounds: some threads are found asleep in a
    // system call at each attach, and the recordings stay tens of MB.
    let mut daemon = Daemon::start(&nfd, &["2", "0", "2000"]);
    let pid = daemon.pid();
    let before = code_of(pid, &nfd);
    let recording = dir.join("cycle.glass");
    for cycle in 0..cycles {
        // Most cycles trace few enough calls that nothing may be lost; every tenth adds
        // the hot rule_match (millions of calls a second per thread): the rings fill,
        // and the records dropped are counted, never waited for.
        let functions = match cycle % 10 {
            9 => "process_batch,parse_packet,classify,rule_match,rewrite,forward",
            n if n % 2 == 0 => "process_batch,classify,rewrite",
            _ => "process_batch,parse_packet,forward",
        };
        let output = attach(pid, &recording, functions, &seconds);
        let err = stderr(&output);
        assert!(output.status.success(), "cycle {cycle}: {err}");
        assert!(!err.contains("panicked"), "cycle {cycle}: {err}");
        assert!(err.contains("detached from pid"), "cycle {cycle}: {err}");
        daemon.assert_alive();
        assert!(
            code_of(pid, &nfd) == before,
            "cycle {cycle}: the code differs from before the first attach"
        );
        let (calls, summary) = calls(&recording);
        for function in functions.split(',') {
            let (entries, ends) = calls.get(function).copied().unwrap_or_default();
            assert!(
                entries > 0,
                "cycle {cycle}: no call of {function}: {calls:?}"
            );
            if summary.lost == 0 {
                // Calls in flight at attach end in the trace without their entry, those
                // in flight at detach start without their end: a few, per thread.
                assert!(
                    entries.abs_diff(ends) <= 64,
                    "cycle {cycle}: {function}: {entries} entries, {ends} ends"
                );
            }
        }
        assert!(summary.attach_stop_ns > 0 && summary.detach_stop_ns > 0);
        if cycle % 10 != 9 {
            assert_eq!(
                summary.lost + summary.no_area_lost,
                0,
                "cycle {cycle}: {err}"
            );
            // Each batch holds 8 packets, so at most 8 classify calls per batch, give or
            // take the batches cut by attach and detach.
            if let (Some(batches), Some(classify)) =
                (calls.get("process_batch"), calls.get("classify"))
            {
                assert!(classify.0 <= 8 * batches.0 + 64, "{calls:?}");
                assert!(classify.0 * 2 >= batches.0, "{calls:?}");
            }
        }
    }
    let (out, err, code) = daemon.finish();
    assert_eq!(
        out, reference,
        "nfd's output after {cycles} cycles; its stderr: {err}"
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.lines().all(|l| l.ends_with(" rounds")),
        "nfd reported errors: {err}"
    );
}

#[test]
fn the_target_finishes_its_work_when_glass_is_killed_while_attached_and_a_later_glass_cleans_up() {
    let _alone = exclusive();
    let dir = scratch("attach_sigkill");
    let nfd = compile_nfd(&dir, &[]);
    let reference = reference_output(&nfd);
    let mut daemon = Daemon::start(&nfd, &["2"]);
    let pid = daemon.pid();
    let before = code_of(pid, &nfd);
    let recording = dir.join("killed.glass");
    // Wait until it has attached (it says so), then kill it outright.
    let (mut glass_child, _, _) = spawn_attached(
        pid,
        &[
            "-f",
            "process_batch,parse_packet,classify,rewrite,forward",
            "--ring-size",
            "4096",
            "-o",
            recording.to_str().unwrap(),
        ],
    );
    std::thread::sleep(Duration::from_millis(300));
    // Its guardian dies first, so that the probes stay: what a kill of both leaves.
    let guardian = trace_guardian_of(pid).expect("glass trace --pid runs a guardian");
    // SAFETY: killing the guardian process the test found.
    unsafe { libc::kill(guardian, libc::SIGKILL) };
    glass_child.kill().unwrap();
    glass_child.wait().unwrap();
    // The probes stay, their small rings fill, and nothing waits for the dead glass.
    std::thread::sleep(Duration::from_secs(2));
    daemon.assert_alive();
    assert!(
        code_of(pid, &nfd) != before,
        "the dead glass's probes are still in place"
    );
    // The next glass finds the dead one's ledger, takes its probes out, and attaches.
    let again = dir.join("again.glass");
    let output = attach(pid, &again, "process_batch,classify", "1");
    let said = stderr(&output);
    assert!(output.status.success(), "{said}");
    assert!(said.contains("which died attached: taken out"), "{said}");
    assert!(calls(&again).0["classify"].0 > 0);
    daemon.assert_alive();
    assert!(
        code_of(pid, &nfd) == before,
        "the code after the second glass detached"
    );
    let (out, err, code) = daemon.finish();
    assert_eq!(out, reference, "nfd's stderr: {err}");
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.lines().all(|l| l.ends_with(" rounds")),
        "nfd reported errors: {err}"
    );
    // What glass wrote before it died is readable.
    let recording = glass_format::read_file(&recording).expect("readable");
    assert!(!recording.trace_functions.is_empty());
}

/// A glass SIGKILLed while attached, its guardian alive: the guardian takes the probes
/// out at once, and the next glass finds nothing of the dead one's.
#[test]
fn the_guardian_takes_the_probes_out_when_glass_is_killed() {
    let _alone = exclusive();
    let dir = scratch("attach_guardian");
    let nfd = compile_nfd(&dir, &[]);
    let reference = reference_output(&nfd);
    let mut daemon = Daemon::start(&nfd, &["2"]);
    let pid = daemon.pid();
    let before = code_of(pid, &nfd);
    let recording = dir.join("killed.glass");
    let (mut glass_child, mut err, _) = spawn_attached(
        pid,
        &[
            "-f",
            "process_batch,parse_packet,classify,rewrite,forward",
            "-o",
            recording.to_str().unwrap(),
        ],
    );
    assert!(code_of(pid, &nfd) != before);
    glass_child.kill().unwrap();
    glass_child.wait().unwrap();
    // The guardian shares glass's stderr: its one line says what it did.
    let mut said = String::new();
    while !said.contains("guardian") {
        let mut line = String::new();
        assert!(err.read_line(&mut line).unwrap() > 0, "{said}");
        said.push_str(&line);
    }
    assert!(said.contains("its guardian took the probes out"), "{said}");
    assert!(code_of(pid, &nfd) == before, "the code after the guardian");
    daemon.assert_alive();
    let again = dir.join("again.glass");
    let output = attach(pid, &again, "process_batch,classify", "0.5");
    let said = stderr(&output);
    assert!(output.status.success(), "{said}");
    assert!(!said.contains("died attached"), "{said}");
    let (out, err, code) = daemon.finish();
    assert_eq!(out, reference, "nfd's stderr: {err}");
    assert_eq!(code, Some(0), "{err}");
    assert!(
        !std::fs::read_dir("/dev/shm").unwrap().flatten().any(|e| e
            .file_name()
            .to_string_lossy()
            .starts_with(&format!("glass-trace-{}-", glass_child.id()))),
        "the dead glass's session file is left in /dev/shm"
    );
}

#[test]
fn what_glass_cannot_attach_to_is_refused_and_left_unharmed() {
    let _alone = exclusive();
    let dir = scratch("attach_refused");
    let recording = dir.join("x.glass");
    let recording = recording.to_str().unwrap();

    // No such process.
    let output = glass(&["trace", "--pid", "999999999", "-f", "*", "-o", recording]);
    assert_clean_failure(&output, 2, "no process with pid 999999999");
    // --duration belongs to --pid; a launch needs a command.
    let output = glass(&["trace", "-f", "*", "-o", recording]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));

    // A statically linked program has no dlopen to load the runtime with.
    let nfd_static = dir.join("nfd-static");
    let status = Command::new("gcc")
        .args(["-O2", "-g", "-static", "-pthread"])
        .arg(fixtures_dir().join("trace/nfd.c"))
        .arg("-o")
        .arg(&nfd_static)
        .status()
        .unwrap();
    assert!(status.success());
    let reference = reference_output(&nfd_static);
    let daemon = Daemon::start(&nfd_static, &["1"]);
    let output = glass(&[
        "trace",
        "--pid",
        &daemon.pid().to_string(),
        "-f",
        "classify",
        "-o",
        recording,
    ]);
    assert_clean_failure(&output, 2, "statically linked");
    let (out, err, code) = daemon.finish();
    assert_eq!(out, reference, "{err}");
    assert_eq!(code, Some(0));

    // A process already traced by someone else (here: this test).
    let nfd = compile_nfd(&dir, &[]);
    let reference = reference_output(&nfd);
    let daemon = Daemon::start(&nfd, &["1"]);
    let pid = daemon.pid();
    // SAFETY: seizing our own child without stopping it; released below.
    assert_eq!(
        unsafe { libc::ptrace(libc::PTRACE_SEIZE, pid, 0, 0) },
        0,
        "the test can trace its child"
    );
    let output = glass(&[
        "trace",
        "--pid",
        &pid.to_string(),
        "-f",
        "classify",
        "-o",
        recording,
    ]);
    assert_clean_failure(
        &output,
        2,
        &format!("pid {pid} is already being traced by pid "),
    );
    // SAFETY: interrupt and detach our tracee.
    unsafe {
        libc::ptrace(libc::PTRACE_INTERRUPT, pid, 0, 0);
        let mut status = 0;
        libc::waitpid(pid, &mut status, libc::__WALL);
        libc::ptrace(libc::PTRACE_DETACH, pid, 0, 0);
    }
    // Nothing patchable (the entry point is never called): refused before the process
    // is touched, so the next attach finds no ledger of a "dead" glass.
    let output = glass(&[
        "trace",
        "--pid",
        &pid.to_string(),
        "-f",
        "_start",
        "-o",
        recording,
    ]);
    assert_clean_failure(&output, 2, "none of the matching functions can be patched");
    let output = attach(pid, Path::new(recording), "classify", "0.3");
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        !stderr(&output).contains("died attached"),
        "{}",
        stderr(&output)
    );
    // A process of another user (glass run as nobody, the target root's).
    let output = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", GLASS])
        .args([
            "trace",
            "--pid",
            &pid.to_string(),
            "-f",
            "classify",
            "-o",
            "/tmp/glass-nobody.glass",
        ])
        .output()
        .expect("setpriv runs");
    assert_clean_failure(&output, 2, &format!("pid {pid}"));
    let (out, err, code) = daemon.finish();
    assert_eq!(out, reference, "{err}");
    assert_eq!(code, Some(0));
    assert!(err.lines().all(|l| l.ends_with(" rounds")), "{err}");

    // Processes that end while glass attaches: whatever the moment, one clear line or a
    // finished recording, never a panic.
    for delay_ms in [0u64, 2, 5, 10, 20, 40] {
        let daemon = Daemon::start(&nfd, &["2", "60"]);
        std::thread::sleep(Duration::from_millis(delay_ms));
        let output = attach(
            daemon.pid(),
            Path::new(recording),
            "process_batch,classify",
            "1",
        );
        let err = stderr(&output);
        assert!(!err.contains("panicked"), "{err}");
        if !output.status.success() {
            assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        }
        let (out, nfd_err, code) = daemon.finish();
        assert_eq!(out, reference, "{nfd_err}");
        assert_eq!(code, Some(0), "{nfd_err}");
    }
}

/// Runs `program` untraced for a moment and returns what it prints at SIGTERM.
fn untraced_output(program: &Path) -> String {
    let daemon = Daemon::start(program, &[]);
    std::thread::sleep(Duration::from_millis(300));
    let (out, err, code) = daemon.finish();
    assert_eq!(code, Some(0), "{err}");
    out
}

#[test]
fn threads_inside_the_replaced_bytes_or_the_trampolines_are_moved_out() {
    let _alone = exclusive();
    let dir = scratch("attach_step_out");
    let spin = dir.join("spin");
    let status = Command::new("gcc")
        .args(["-O2", "-g", "-pthread"])
        .arg(fixtures_dir().join("trace/spin.c"))
        .arg("-o")
        .arg(&spin)
        .status()
        .unwrap();
    assert!(status.success());
    let reference = untraced_output(&spin);
    let mut daemon = Daemon::start(&spin, &[]);
    let pid = daemon.pid();
    let before = code_of(pid, &spin);
    let recording = dir.join("spin.glass");
    let (mut at_attach, mut at_detach) = (0, 0);
    // By construction (tests/fixtures/trace/spin.c): one thread is almost always blocked
    // in a 50 ms poll whose restart point is strictly inside park's replaced bytes, so
    // attaching must move it into park's trampoline; while attached it blocks inside the
    // trampoline, longer than the 1 ms detaching lets threads run between its halves, so
    // detaching must move it back. It escapes only while it runs the ~15 instructions
    // between two polls or is being woken from one (a poll ending in that 1 ms: p =
    // 1/50 per detach; p < 5e-3 per attach, measured in soaks of 1840 cycles with 1 ms
    // polls). A count stays 0 over 6 attempts with p < 0.02^6 = 6.4e-11.
    for attempt in 0..6 {
        let output = attach(pid, &recording, "edge,park", "0.2");
        let err = stderr(&output);
        assert!(output.status.success(), "{err}");
        let moved = |after: &str| -> usize {
            err.split(after)
                .nth(1)
                .and_then(|rest| rest.split(" moved out").next())
                .and_then(|n| n.trim_start_matches('(').parse().ok())
                .unwrap_or_else(|| panic!("no count after {after:?} in: {err}"))
        };
        at_attach += moved("to patch ");
        at_detach += moved("to restore ");
        daemon.assert_alive();
        assert!(code_of(pid, &spin) == before, "attempt {attempt}");
        let (calls, _) = calls(&recording);
        for function in ["edge", "park"] {
            let entries = calls.get(function).map_or(0, |c| c.0);
            assert!(
                entries > 0,
                "attempt {attempt}: {function}: {calls:?}, {err}"
            );
        }
    }
    assert!(
        at_attach > 0,
        "no thread was ever found inside the replaced bytes"
    );
    assert!(at_detach > 0, "no thread was ever found inside the probes");
    let (out, err, code) = daemon.finish();
    assert_eq!(out, reference, "{err}");
    assert_eq!(code, Some(0), "{err}");
}

#[test]
fn exceptions_thrown_through_instrumented_frames_while_attached() {
    let _alone = exclusive();
    let dir = scratch("attach_throw");
    let throwd = dir.join("throwd");
    let status = Command::new("g++")
        .args(["-O2", "-g"])
        .arg(fixtures_dir().join("trace/throwd.cpp"))
        .arg("-o")
        .arg(&throwd)
        .status()
        .unwrap();
    assert!(status.success());
    let reference = untraced_output(&throwd);
    let mut daemon = Daemon::start(&throwd, &[]);
    let recording = dir.join("throw.glass");
    // The runtime is loaded with dlopen, so it cannot interpose the unwinder: glass
    // sends the process's GOT slots for it to the runtime's hooks, and puts them back.
    for _ in 0..3 {
        let output = attach(
            daemon.pid(),
            &recording,
            "catcher,level1,level2,level3",
            "1",
        );
        assert!(output.status.success(), "{}", stderr(&output));
        daemon.assert_alive();
        let (calls, summary) = calls(&recording);
        assert!(summary.unwound > 100, "{summary:?}");
        let (entries, ends) = calls["level3"];
        assert!(entries > 100 && entries.abs_diff(ends) <= 3, "{calls:?}");
    }
    let (out, err, code) = daemon.finish();
    assert_eq!(out, reference, "{err}");
    assert_eq!(code, Some(0), "{err}");
}

#[test]
fn library_calls_of_a_running_process_even_lazily_bound_ones() {
    let _alone = exclusive();
    let dir = scratch("attach_libcalls");
    // Lazy binding (the gcc default, made explicit): sched_yield's slot still points
    // at the PLT stub when glass attaches, because nfd only calls it after SIGUSR1.
    let nfd = compile_nfd(&dir, &["-Wl,-z,lazy"]);
    let reference = reference_output(&nfd);
    let mut daemon = Daemon::start(&nfd, &["2", "0", "500"]);
    let pid = daemon.pid();
    let recording = dir.join("libcalls.glass");
    let (mut glass_child, mut glass_err, said) = spawn_attached(
        pid,
        &[
            "-f",
            "process_batch",
            "--libcalls",
            "pthread_mutex_lock,pthread_mutex_unlock,sched_yield",
            "-d",
            "2",
            "-o",
            recording.to_str().unwrap(),
        ],
    );
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid, libc::SIGUSR1) };
    let status = glass_child.wait().unwrap();
    let mut rest = String::new();
    glass_err.read_to_string(&mut rest).unwrap();
    assert!(status.success(), "{said}{rest}");
    daemon.assert_alive();
    let (calls, summary) = calls(&recording);
    assert_eq!(summary.lost, 0);
    let (locks, _) = calls["pthread_mutex_lock@plt"];
    let (unlocks, _) = calls["pthread_mutex_unlock@plt"];
    let (yields, _) = calls["sched_yield@plt"];
    assert!(locks > 100 && locks.abs_diff(unlocks) <= 2, "{calls:?}");
    // Had the slot stayed lazy, the loader would have overwritten the hook at the first
    // call: one traced call, then none.
    assert!(yields > 50, "{calls:?}");
    let (out, err, code) = daemon.finish();
    assert_eq!(out, reference, "{err}");
    assert_eq!(code, Some(0), "{err}");
}

#[test]
fn ctrl_c_and_sigterm_detach_and_leave_the_code_as_it_was() {
    let _alone = exclusive();
    let dir = scratch("attach_signals");
    let nfd = compile_nfd(&dir, &[]);
    let reference = reference_output(&nfd);
    let mut daemon = Daemon::start(&nfd, &["2", "0", "500"]);
    let pid = daemon.pid();
    let before = code_of(pid, &nfd);
    let recording = dir.join("signalled.glass");
    for (signal, name) in [(libc::SIGINT, "SIGINT"), (libc::SIGTERM, "SIGTERM")] {
        let (mut child, mut err, _) = spawn_attached(
            pid,
            &[
                "-f",
                "process_batch,classify",
                "-o",
                recording.to_str().unwrap(),
            ],
        );
        std::thread::sleep(Duration::from_millis(500));
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, signal) };
        let status = child.wait().unwrap();
        let mut rest = String::new();
        err.read_to_string(&mut rest).unwrap();
        assert!(status.success(), "{rest}");
        assert!(rest.contains(&format!("({name})")), "{rest}");
        daemon.assert_alive();
        assert!(code_of(pid, &nfd) == before, "after {name}");
        let info = glass(&["info", recording.to_str().unwrap()]);
        assert!(
            stdout(&info).contains("attached:    every thread stopped"),
            "{}",
            stdout(&info)
        );
        assert!(calls(&recording).0["classify"].0 > 0);
    }
    let (out, err, code) = daemon.finish();
    assert_eq!(out, reference, "{err}");
    assert_eq!(code, Some(0), "{err}");
}

#[test]
fn all_of_libc_patched_live_and_restored() {
    let _alone = exclusive();
    let dir = scratch("attach_libc");
    let nfd = compile_nfd(&dir, &[]);
    let reference = reference_output(&nfd);
    let mut daemon = Daemon::start(&nfd, &["2", "0", "500"]);
    let pid = daemon.pid();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let libc_path = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.contains("/libc.so"))
        .expect("nfd maps libc")
        .to_string();
    let before = (code_of(pid, &nfd), code_of(pid, Path::new(&libc_path)));
    let recording = dir.join("libc.glass");
    // Every function of the program and of libc (some 3600): the threads keep calling
    // into libc (usleep, pthread_*) while glass patches it, and glass's own injected
    // calls (dlopen, dlsym) run in libc before.
    let output = glass(&[
        "trace",
        "--pid",
        &pid.to_string(),
        "--lib",
        "libc.so*",
        "-f",
        "*",
        "-d",
        "2",
        "--max-threads",
        "256",
        "-o",
        recording.to_str().unwrap(),
    ]);
    let err = stderr(&output);
    assert!(output.status.success(), "{err}");
    let instrumented: usize = err
        .split("instrumented ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(instrumented > 2000, "{err}");
    daemon.assert_alive();
    let after = (code_of(pid, &nfd), code_of(pid, Path::new(&libc_path)));
    assert!(after == before, "code differs after detach");
    let (calls, _) = calls(&recording);
    assert!(
        calls.get("clock_nanosleep").is_some_and(|c| c.0 > 0),
        "{:?}",
        calls.keys().take(20).collect::<Vec<_>>()
    );
    let (out, err, code) = daemon.finish();
    assert_eq!(out, reference, "{err}");
    assert_eq!(code, Some(0), "{err}");
}

/// Whether this test can start a server as root (the tests run as root; a server that
/// drops privileges cannot be made otherwise).
fn running_as_root() -> bool {
    // SAFETY: a plain system call.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        eprintln!("skipped: needs root, to start a server that drops its privileges");
    }
    root
}

/// A running dropd (master and worker), its worker serving as nobody.
struct Server {
    daemon: Option<Daemon>,
    worker: i32,
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.daemon.is_some() {
            // SAFETY: signalling our own child's child; its master is killed after.
            unsafe { libc::kill(self.worker, libc::SIGKILL) };
        }
    }
}

impl Server {
    /// Runs `command` (dropd, or something that execs it) until the worker says it is
    /// ready.
    fn start(command: &mut Command) -> Server {
        let (daemon, line) = Daemon::spawn(command);
        let worker = line
            .strip_prefix("worker ")
            .and_then(|rest| rest.strip_suffix(" ready\n"))
            .and_then(|pid| pid.parse().ok())
            .unwrap_or_else(|| panic!("dropd said {line:?}"));
        assert_runs_as_nobody(worker);
        Server {
            daemon: Some(daemon),
            worker,
        }
    }

    fn assert_alive(&mut self) {
        self.daemon.as_mut().unwrap().assert_alive();
        let state = std::fs::read_to_string(format!("/proc/{}/stat", self.worker))
            .expect("the worker still runs");
        let state = state.rsplit(") ").next().unwrap().chars().next().unwrap();
        assert!(matches!(state, 'R' | 'S'), "the worker is in state {state}");
    }

    /// SIGTERM to the master, which passes it on: dropd's stdout, the exit code, and
    /// asserts that it found no error.
    fn finish(mut self, reference: &str) {
        let (out, err, code) = self.daemon.take().unwrap().finish();
        assert_eq!(out, reference, "dropd's stderr: {err}");
        assert_eq!(code, Some(0), "{err}");
        assert!(
            err.lines()
                .all(|l| l.starts_with("dropd: ") && l.ends_with(" rounds")),
            "dropd reported errors: {err}"
        );
    }
}

const DROPD_FUNCTIONS: &str = "handle_request,parse_request,route,respond";

/// The issue: nginx's worker runs as nobody, and the session glass (root) created was
/// root's, so the runtime in the worker could not open it. The session is now the
/// target's user's, mode 0600.
#[test]
fn a_worker_that_dropped_root_maps_a_session_file_of_its_own_user() {
    if !running_as_root() {
        return;
    }
    let _alone = exclusive();
    let dir = scratch("attach_dropped");
    // A master that stays root and a worker that drops to nobody, as nginx's do.
    let dropd = compile(&dir, "trace/dropd.c", "dropd", &[]);
    let reference = String::from_utf8(
        Command::new(&dropd)
            .arg("300")
            .output()
            .expect("dropd runs")
            .stdout,
    )
    .unwrap();
    let mut server = Server::start(&mut Command::new(&dropd));
    let worker = server.worker;
    let before = code_of(worker, &dropd);
    let recording = dir.join("worker.glass");
    let (mut glass_child, mut glass_err, said) = spawn_attached(
        worker,
        &[
            "-f",
            DROPD_FUNCTIONS,
            "-d",
            "1.5",
            "-o",
            recording.to_str().unwrap(),
        ],
    );
    // While it traces: the worker maps the session, a file of nobody's that nobody
    // else may read.
    let (path, meta) = session_mapping(worker).expect("the worker maps the session");
    assert!(path.starts_with("/dev/shm/glass-trace-"), "{path}");
    use std::os::unix::fs::MetadataExt;
    assert_eq!((meta.uid(), meta.gid()), (65534, 65534), "{path}");
    assert_eq!(meta.mode() & 0o7777, 0o600, "{path}");
    let status = glass_child.wait().unwrap();
    let mut rest = String::new();
    glass_err.read_to_string(&mut rest).unwrap();
    assert!(status.success(), "{said}{rest}");
    assert!(
        rest.contains(&format!("detached from pid {worker}")),
        "{rest}"
    );
    let calls = reported_calls(&recording);
    for function in DROPD_FUNCTIONS.split(',') {
        assert!(
            calls.get(function).is_some_and(|&n| n > 1000),
            "{function}: {calls:?}"
        );
    }
    // Detached: the rings are unmapped, the code is as it was, and the worker serves on.
    assert!(session_mapping(worker).is_none());
    assert!(code_of(worker, &dropd) == before);
    std::thread::sleep(Duration::from_millis(300));
    server.assert_alive();
    server.finish(&reference);

    // Launch mode as before: the session is glass's user's (root, the master), mapped
    // before the worker forks and drops, and its records arrive.
    let launched = dir.join("launched.glass");
    let output = glass(&[
        "trace",
        "-f",
        DROPD_FUNCTIONS,
        "-o",
        launched.to_str().unwrap(),
        "--",
        dropd.to_str().unwrap(),
        "500",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(stdout(&output), reference);
    let calls = reported_calls(&launched);
    assert!(calls.get("route").is_some_and(|&n| n > 1000), "{calls:?}");
}

/// The session in /dev/shm and a worker that cannot reach it, made real with a mount
/// namespace of the worker's own: there /dev/shm is a tmpfs of mode 0700 (nobody may
/// pass), and from glass's namespace the file is not there at all. Either way one line
/// says which file, which user, what the errno means and what to do, nothing is
/// patched, and the worker runs on; once /dev/shm is 1777 again, attaching works.
#[test]
fn a_session_the_worker_cannot_reach_is_refused_with_the_reason() {
    if !running_as_root() {
        return;
    }
    let namespaces = Command::new("unshare")
        .args(["--mount", "true"])
        .status()
        .is_ok_and(|s| s.success());
    if !namespaces {
        eprintln!("skipped: cannot make a mount namespace (unshare --mount)");
        return;
    }
    let _alone = exclusive();
    let dir = scratch("attach_unreachable");
    // A master that stays root and a worker that drops to nobody, as nginx's do.
    let dropd = compile(&dir, "trace/dropd.c", "dropd", &[]);
    let reference =
        String::from_utf8(Command::new(&dropd).arg("300").output().unwrap().stdout).unwrap();
    let mut server = Server::start(
        Command::new("unshare")
            .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg(format!(
                "mount -t tmpfs -o mode=0700 glass-test /dev/shm && exec {}",
                dropd.display()
            )),
    );
    let worker = server.worker;
    let before = code_of(worker, &dropd);
    let recording = dir.join("refused.glass");
    let options = [
        "trace",
        "--pid",
        &worker.to_string(),
        "-f",
        DROPD_FUNCTIONS,
        "-d",
        "1",
        "-o",
        recording.to_str().unwrap(),
    ];
    // The file named in the message is gone (`root`: how glass's namespace reaches it).
    let session_removed = |err: &str, root: &str| {
        let path = err
            .split_whitespace()
            .find(|w| w.starts_with("/dev/shm/glass-trace-"))
            .unwrap_or_else(|| panic!("no session file named in: {err}"))
            .trim_end_matches(':');
        assert!(!Path::new(&format!("{root}{path}")).exists(), "{path}");
    };
    let in_its_namespace = |options: &[&str]| {
        Command::new("nsenter")
            .args(["--target", &worker.to_string(), "--mount", "--", GLASS])
            .args(options)
            .output()
            .expect("nsenter runs")
    };

    // Glass in the worker's namespace: the file is nobody's, but /dev/shm is closed.
    let output = in_its_namespace(&options);
    let err = stderr(&output);
    assert_clean_failure(&output, 1, &format!("pid {worker} (running as uid 65534"));
    for needle in [
        "could not map the session /dev/shm/glass-trace-",
        "Permission denied (EACCES)",
        "/dev/shm (mode 0700, owner uid 0, gid 0) does not let that user through",
        "chmod o+x /dev/shm",
        "(nothing was patched)",
    ] {
        assert!(err.contains(needle), "{needle:?} not in: {err}");
    }
    session_removed(&err, &format!("/proc/{worker}/root"));

    // Glass in its own namespace: the worker cannot see the file at all.
    let output = glass(&options);
    let err = stderr(&output);
    assert_clean_failure(&output, 1, &format!("pid {worker} (running as uid 65534"));
    for needle in [
        "runs in another mount namespace than glass",
        &format!("nsenter --target {worker} --mount"),
        "(nothing was patched)",
    ] {
        assert!(err.contains(needle), "{needle:?} not in: {err}");
    }
    session_removed(&err, "");
    server.assert_alive();
    assert!(code_of(worker, &dropd) == before);

    // Doing what the first message said: attaching works (the runtime the refused
    // attaches loaded is reused).
    let shm = format!("/proc/{worker}/root/dev/shm");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&shm, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let output = in_its_namespace(&options);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(reported_calls(&recording)
        .get("handle_request")
        .is_some_and(|&n| n > 1000));
    assert!(code_of(worker, &dropd) == before);
    server.assert_alive();
    server.finish(&reference);
}
