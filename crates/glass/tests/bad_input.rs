//! Bad input gets one clear error line and exit code 2, never a panic.

mod common;
use common::*;

#[test]
fn a_pid_that_does_not_exist() {
    // Pids above pid_max are never in use.
    let output = glass(&[
        "record",
        "--pid",
        "99999999",
        "-o",
        "/tmp/glass-unused.glass",
    ]);
    assert_clean_failure(&output, 2, "no process with pid 99999999");
}

/// A kernel thread cannot be traced, even by root.
#[test]
fn a_pid_glass_may_not_trace() {
    let kernel_thread = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            // Kernel threads have no executable and an empty command line.
            *pid > 1
                && std::fs::read_link(format!("/proc/{pid}/exe")).is_err()
                && std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.is_empty())
        })
        .expect("a kernel thread");
    let dir = scratch("not_permitted");
    let out = dir.join("x.glass");
    let output = glass(&[
        "record",
        "--pid",
        &kernel_thread.to_string(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_clean_failure(&output, 2, "cannot trace pid");
    assert!(!out.exists(), "no empty recording is left behind");
}

#[test]
fn a_command_that_does_not_exist() {
    let output = glass(&[
        "record",
        "-o",
        "/tmp/glass-unused.glass",
        "--",
        "/no/such/program",
    ]);
    assert_clean_failure(&output, 2, "command not found: /no/such/program");
    let output = glass(&[
        "record",
        "-o",
        "/tmp/glass-unused.glass",
        "--",
        "no-such-program-anywhere",
    ]);
    assert_clean_failure(&output, 2, "command not found");
}

#[test]
fn a_file_that_is_not_a_recording() {
    let dir = scratch("not_glass");
    let file = dir.join("notes.txt");
    std::fs::write(&file, "hello, this is not a profile\n").unwrap();
    assert_clean_failure(
        &glass(&["report", file.to_str().unwrap()]),
        2,
        "not a .glass file",
    );
    assert_clean_failure(
        &glass(&["info", file.to_str().unwrap()]),
        2,
        "not a .glass file",
    );
    assert_clean_failure(
        &glass(&["report", "/no/such/file.glass"]),
        2,
        "/no/such/file.glass",
    );
}

#[test]
fn a_truncated_recording_reports_what_it_has() {
    let dir = scratch("truncated");
    let split = compile(&dir, "split.c", "split", &[]);
    let recording = dir.join("full.glass");
    record(&recording, 499, &[split.to_str().unwrap(), "3000"]);
    let bytes = std::fs::read(&recording).unwrap();
    let cut = dir.join("cut.glass");
    std::fs::write(&cut, &bytes[..bytes.len() * 2 / 3]).unwrap();
    let report = glass(&["report", cut.to_str().unwrap(), "--format", "folded"]);
    assert_eq!(report.status.code(), Some(0), "{}", stderr(&report));
    assert!(stderr(&report).contains("truncated"), "{}", stderr(&report));
    assert!(stdout(&report).contains("alpha"));
    let info = glass(&["info", cut.to_str().unwrap()]);
    assert_eq!(info.status.code(), Some(0), "{}", stderr(&info));
    assert!(stdout(&info).contains("truncated"), "{}", stdout(&info));
}

#[test]
fn a_reader_that_stops_early_ends_report_and_info_without_a_panic() {
    use std::os::fd::FromRawFd;
    let dir = scratch("closed_pipe");
    let split = compile(&dir, "split.c", "split", &[]);
    let recording = dir.join("split.glass");
    record(&recording, 499, &[split.to_str().unwrap(), "1000"]);
    for args in [vec!["info"], vec!["report", "--format", "folded"]] {
        // `glass info FILE | head -0`: the reader is gone before glass writes a byte.
        let mut fds = [0; 2];
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        unsafe { libc::close(fds[0]) };
        let write_end = unsafe { std::process::Stdio::from_raw_fd(fds[1]) };
        let output = std::process::Command::new(GLASS)
            .args(&args)
            .arg(&recording)
            .stdout(write_end)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&output.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

#[test]
fn an_output_path_in_a_missing_directory() {
    let output = glass(&["record", "-o", "/no/such/dir/prof.glass", "--", "true"]);
    assert_clean_failure(&output, 2, "cannot write /no/such/dir/prof.glass");
    let dir = scratch("missing_dir");
    let recording = dir.join("ok.glass");
    record(&recording, 99, &["true"]);
    for format in ["top", "folded", "flamegraph"] {
        let output = glass(&[
            "report",
            recording.to_str().unwrap(),
            "--format",
            format,
            "-o",
            "/no/such/dir/out",
        ]);
        assert_clean_failure(&output, 2, "/no/such/dir/out");
    }
}

#[test]
fn usage_errors_exit_2() {
    let output = glass(&["record", "-F", "0", "--", "true"]);
    assert_eq!(output.status.code(), Some(2));
    let output = glass(&["record"]);
    assert_eq!(output.status.code(), Some(2));
    let output = glass(&["frobnicate"]);
    assert_eq!(output.status.code(), Some(2));
}

#[test]
fn a_gdb_stub_that_is_not_there_or_never_answers() {
    let dir = scratch("bad_stub");
    let elf = compile(&dir, "split.c", "split", &[]);
    let out = dir.join("x.glass");
    let output = glass(&[
        "record",
        "--gdb",
        "/no/such/stub.sock",
        "--symbols",
        elf.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_clean_failure(&output, 1, "cannot connect to the GDB stub");
    // A listener that accepts and never answers: one timeout error, not a hang.
    let socket = dir.join("silent.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let holder = std::thread::spawn(move || {
        let connection = listener.accept();
        std::thread::sleep(std::time::Duration::from_secs(8));
        drop(connection);
    });
    let started = std::time::Instant::now();
    let output = glass(&[
        "record",
        "--gdb",
        socket.to_str().unwrap(),
        "--symbols",
        elf.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_clean_failure(&output, 1, "did not answer");
    assert!(started.elapsed() < std::time::Duration::from_secs(8));
    holder.join().unwrap();
    // Symbols that are neither ELF nor an nm table.
    let junk = dir.join("junk.txt");
    std::fs::write(&junk, "hello\n").unwrap();
    let output = glass(&[
        "record",
        "--gdb",
        socket.to_str().unwrap(),
        "--symbols",
        junk.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_clean_failure(&output, 2, "neither an ELF file nor an nm -n symbol table");
}
