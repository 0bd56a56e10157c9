//! glass trace and Go programs. The Go runtime moves goroutine stacks as they grow and
//! reads every frame's return address itself, so the exit probe's replaced return
//! address kills a Go program (`-f '*'` ended in the probe's `ud2`; `--pid` killed a
//! running service in 3 of 8 attaches). Until exit probes that leave return addresses
//! alone exist, glass refuses Go functions in one line, before the program is started or
//! touched, and still traces the C libraries of a cgo-linked Go program.

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// tests/fixtures/trace/gosvc.go, built with cgo by Go's toolchain (./x test installs
/// golang-go).
fn go_program(dir: &Path) -> PathBuf {
    let out = dir.join("gosvc");
    let output = Command::new("go")
        .args(["build", "-o"])
        .arg(&out)
        .arg(fixtures_dir().join("trace/gosvc.go"))
        .env("GOCACHE", dir.join("gocache"))
        .env("GOPATH", dir.join("gopath"))
        .env("CGO_ENABLED", "1")
        .output()
        .expect("go runs (./x test installs golang-go)");
    assert!(
        output.status.success(),
        "go build: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    out
}

#[test]
fn go_functions_are_refused_before_the_program_starts() {
    let dir = scratch("trace_go_launch");
    let program = go_program(&dir);
    let program = program.to_str().unwrap();
    let recording = dir.join("go.glass");
    let recording = recording.to_str().unwrap();
    for patterns in ["main.*", "*"] {
        let output = glass(&[
            "trace", "-o", recording, "-f", patterns, "--", program, "0.2",
        ]);
        assert_clean_failure(&output, 2, "is a Go program");
        assert!(
            stderr(&output).contains("moves goroutine stacks"),
            "{}",
            stderr(&output)
        );
        assert!(!stdout(&output).contains("done"), "the program ran");
    }
    let output = glass(&[
        "trace",
        "-o",
        recording,
        "-f",
        "x",
        "--libcalls",
        "malloc",
        "--",
        program,
        "0.2",
    ]);
    assert_clean_failure(&output, 2, "is a Go program: --libcalls");

    // Its C library is C: every libc function patched beside a Go runtime that moves
    // its stacks, and the program ends by itself with its C calls counted.
    let output = glass(&[
        "trace", "-o", recording, "-f", "*", "--lib", "libc.so*", "--", program, "1",
    ]);
    let err = stderr(&output);
    assert!(output.status.success(), "{err}");
    assert!(err.contains(" a Go function"), "{err}");
    let made: u64 = stdout(&output)
        .lines()
        .find_map(|l| l.strip_prefix("calls ")?.parse().ok())
        .unwrap_or_else(|| panic!("no 'calls' line: {}", stdout(&output)));
    assert!(stdout(&output).contains("done true"), "{}", stdout(&output));
    let calls = reported_calls(Path::new(recording));
    let malloc = calls.get("malloc").copied().unwrap_or(0);
    assert!(
        made > 10 && malloc >= made,
        "malloc traced {malloc} times, the program called it {made} times"
    );
}

#[test]
fn a_running_go_program_is_refused_untouched_and_its_c_library_traced() {
    let dir = scratch("trace_go_attach");
    let program = go_program(&dir);
    let target = Command::new(&program)
        .arg("5")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = target.id() as i32;
    let pid_text = pid.to_string();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let before = code_of(pid, &program);
    let recording = dir.join("go.glass");
    let recording = recording.to_str().unwrap();
    // Twice: a refusal leaves nothing behind that the next attach would find.
    for _ in 0..2 {
        let output = glass(&[
            "trace", "--pid", &pid_text, "-f", "main.*", "-d", "0.3", "-o", recording,
        ]);
        assert_clean_failure(&output, 2, "is a Go program");
        assert!(session_mapping(pid).is_none());
    }
    assert_eq!(
        code_of(pid, &program),
        before,
        "the Go program's code changed"
    );

    let output = glass(&[
        "trace",
        "--pid",
        &pid_text,
        "-f",
        "malloc,free",
        "--lib",
        "libc.so*",
        "-d",
        "1",
        "-o",
        recording,
    ]);
    let err = stderr(&output);
    assert!(output.status.success(), "{err}");
    assert!(!err.contains("died attached"), "{err}");
    let calls = reported_calls(Path::new(recording));
    assert!(
        calls.get("malloc").copied().unwrap_or(0) > 10,
        "{calls:?}\n{err}"
    );

    let ended = target.wait_with_output().unwrap();
    let printed = String::from_utf8_lossy(&ended.stdout);
    assert!(
        ended.status.success() && printed.contains("done true"),
        "the Go program after glass: {:?} {printed}",
        ended.status
    );
}
