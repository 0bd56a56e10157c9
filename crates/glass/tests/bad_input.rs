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

/// A run refused once glass has begun (the target cannot be traced, or launched) leaves
/// a recording already at its path byte for byte, and no file of its own.
#[test]
fn a_refused_recording_leaves_the_one_already_at_its_path_whole() {
    let dir = scratch("refused_keeps");
    let recording = dir.join("kept.glass");
    record(&recording, 99, &["true"]);
    let before = std::fs::read(&recording).unwrap();
    let names = || -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    let path = recording.to_str().unwrap();
    for (refused, says) in [
        (
            vec!["record", "--pid", "2", "-o", path],
            "cannot trace pid 2",
        ),
        (
            vec!["record", "-o", path, "--", "/no/such/program"],
            "command not found",
        ),
    ] {
        let output = glass(&refused);
        assert_clean_failure(&output, 2, says);
        assert!(
            std::fs::read(&recording).unwrap() == before,
            "{refused:?} changed it"
        );
        assert_eq!(names(), ["kept.glass"], "{refused:?}");
    }
    // A run that records takes the path.
    record(&recording, 99, &["sh", "-c", "for i in 1 2 3; do :; done"]);
    assert!(std::fs::read(&recording).unwrap() != before);
    assert_eq!(names(), ["kept.glass"]);
    let info = glass(&["info", path]);
    assert!(info.status.success(), "{}", stderr(&info));
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
fn a_stopped_budget_that_is_no_percentage_is_refused() {
    for value in ["0", "101", "nan", "inf", "-5", "most"] {
        let budget = format!("--max-stopped={value}");
        let output = glass(&["record", "--xen", "uk", "--symbols", "/dev/null", &budget]);
        assert_clean_failure(&output, 2, value);
        assert!(
            stderr(&output).contains("percentage"),
            "{}",
            stderr(&output)
        );
    }
    // Only with --xen.
    let output = glass(&["record", "--max-stopped", "50", "--", "true"]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
}

#[test]
fn a_guest_clock_for_a_process_is_refused() {
    for clock in ["wall", "running"] {
        let output = glass(&["record", "--clock", clock, "--", "true"]);
        assert_clean_failure(&output, 2, clock);
        assert!(stderr(&output).contains("VM guests"), "{}", stderr(&output));
    }
    let output = glass(&["record", "--clock", "sundial", "--xen", "uk"]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
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
    assert_clean_failure(&output, 2, "cannot connect to the GDB stub");
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
    assert_clean_failure(&output, 2, "did not answer");
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

/// Runs glass, killing it (and failing) past `bound`: for inputs that once hung it.
fn glass_within(args: &[&str], bound: std::time::Duration) -> std::process::Output {
    let mut child = std::process::Command::new(GLASS)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > bound {
            let _ = child.kill();
            let _ = child.wait();
            panic!("glass {args:?} still ran after {bound:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

const BOUND: std::time::Duration = std::time::Duration::from_secs(20);

#[test]
fn durations_a_duration_cannot_hold_are_refused() {
    // Every option that takes seconds, on every subcommand that has it.
    for value in ["inf", "-inf", "1e308", "nan", "0", "-1", "soon"] {
        // (`--duration=-1`: a separate `-1` would read as an option.)
        let (duration, window, interval) = (
            format!("--duration={value}"),
            format!("--window={value}"),
            format!("--interval={value}"),
        );
        for args in [
            vec![
                "record",
                &duration,
                "-o",
                "/tmp/glass-unused.glass",
                "--",
                "true",
            ],
            vec!["trace", "--pid", "1", &duration, "-f", "main"],
            vec!["top", "--batch", &duration, "--", "true"],
            vec!["top", "--batch", &window, "--", "true"],
            vec!["top", "--batch", &interval, "--", "true"],
        ] {
            let output = glass(&args);
            assert_clean_failure(&output, 2, value);
            assert!(
                stderr(&output).contains("seconds"),
                "{args:?}: {}",
                stderr(&output)
            );
        }
    }
}

#[test]
fn special_files_are_refused_without_blocking() {
    let dir = scratch("special_files");
    let fifo = dir.join("fifo");
    let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    let fifo = fifo.to_str().unwrap();
    let split = compile(&dir, "split.c", "split", &[]);
    let recording = dir.join("ok.glass");
    record(&recording, 99, &[split.to_str().unwrap(), "300"]);
    let recording = recording.to_str().unwrap();
    // Nobody writes the FIFO: opening it to read would wait for ever.
    for args in [vec!["report", fifo], vec!["info", fifo]] {
        assert_clean_failure(&glass_within(&args, BOUND), 2, "a FIFO");
    }
    assert_clean_failure(
        &glass_within(&["report", recording, "--diff", fifo], BOUND),
        2,
        "a FIFO",
    );
    // /dev/zero never ends; a FIFO never starts.
    for symbols in ["/dev/zero", fifo] {
        let output = glass_within(
            &[
                "record",
                "--gdb",
                "127.0.0.1:1",
                "--symbols",
                symbols,
                "-o",
                "/tmp/glass-unused.glass",
            ],
            BOUND,
        );
        assert_clean_failure(&output, 2, "--symbols from a regular file");
    }
    // Nobody reads the FIFO: a recording cannot go there, nor a report.
    for args in [
        vec!["record", "-o", fifo, "--", "true"],
        vec!["trace", "-o", fifo, "-f", "main", "--", "true"],
        vec!["report", recording, "-o", fifo],
    ] {
        let output = glass_within(&args, BOUND);
        assert_clean_failure(&output, 2, "FIFO");
    }
    // A directory is no recording either.
    assert_clean_failure(
        &glass_within(&["info", dir.to_str().unwrap()], BOUND),
        2,
        "a directory",
    );
}

#[test]
fn glass_cannot_record_itself_or_what_it_runs_under() {
    // The test is glass's parent.
    let parent = std::process::id().to_string();
    for args in [
        vec!["record", "--pid", &parent, "-o", "/tmp/glass-unused.glass"],
        vec![
            "record",
            "--backend",
            "ptrace",
            "--pid",
            &parent,
            "-o",
            "/tmp/glass-unused.glass",
        ],
        vec![
            "trace",
            "--pid",
            &parent,
            "-f",
            "main",
            "-o",
            "/tmp/glass-unused.glass",
        ],
    ] {
        assert_clean_failure(&glass(&args), 2, "a process glass runs under");
    }
    // glass itself: the shell's pid, which exec makes glass's.
    for command in ["record --pid $$", "trace -f main --pid $$"] {
        let output = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("exec {GLASS} {command} -o /tmp/glass-unused.glass"))
            .output()
            .unwrap();
        assert_clean_failure(&output, 2, "is glass itself");
    }
}

/// glass's standard error (or output) a pipe nobody reads: it must not panic, and a
/// recording must still be written whole.
#[test]
fn a_closed_stderr_is_no_reason_to_panic() {
    use std::os::fd::FromRawFd;
    let dir = scratch("closed_stderr");
    let split = compile(&dir, "split.c", "split", &[]);
    let closed_pipe = || {
        let mut fds = [0; 2];
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        unsafe { libc::close(fds[0]) };
        unsafe { std::process::Stdio::from_raw_fd(fds[1]) }
    };
    let recording = dir.join("split.glass");
    let recording = recording.to_str().unwrap();
    for backend in ["perf", "ptrace"] {
        let status = std::process::Command::new(GLASS)
            .args([
                "record",
                "--backend",
                backend,
                "-F",
                "499",
                "-o",
                recording,
                "--",
            ])
            .arg(&split)
            .arg("300")
            .stderr(closed_pipe())
            .stdout(closed_pipe())
            .status()
            .unwrap();
        assert_eq!(status.code(), Some(0), "{backend}: {status:?}");
        let kept = glass_format::read_file(std::path::Path::new(recording)).unwrap();
        assert!(kept.complete && !kept.samples.is_empty(), "{backend}");
    }
    // Errors, summaries and warnings with nowhere to go.
    for (args, code) in [
        (vec!["info", "/no/such/file.glass"], 2),
        (vec!["report", "/no/such/file.glass"], 2),
        (vec!["record", "-d", "inf", "--", "true"], 2),
        (vec!["info", recording], 0),
    ] {
        let status = std::process::Command::new(GLASS)
            .args(&args)
            .stderr(closed_pipe())
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert_eq!(status.code(), Some(code), "{args:?}: {status:?}");
    }
}

#[test]
fn a_gdb_address_with_no_stub_behind_it_is_bad_input() {
    let dir = scratch("gdb_addresses");
    let elf = compile(&dir, "split.c", "split", &[]);
    let elf = elf.to_str().unwrap();
    let out = dir.join("x.glass");
    let out = out.to_str().unwrap();
    // Nothing listening (a port nobody binds), an address that does not parse.
    for address in ["127.0.0.1:1", "no-port-here", "256.1.1.1:99999"] {
        let output = glass_within(
            &["record", "--gdb", address, "--symbols", elf, "-o", out],
            BOUND,
        );
        assert_clean_failure(&output, 2, address);
    }
    // A server that is not a GDB stub: it answers, but not in the protocol.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let talker = std::thread::spawn(move || {
        use std::io::Write;
        let (mut connection, _) = listener.accept().unwrap();
        let _ = connection.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
        std::thread::sleep(std::time::Duration::from_secs(2));
    });
    let output = glass_within(
        &["record", "--gdb", &address, "--symbols", elf, "-o", out],
        BOUND,
    );
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(stderr(&output).contains("GDB stub"), "{}", stderr(&output));
    talker.join().unwrap();
}

/// A stub that goes away mid-recording is a runtime failure (exit 1), and what was
/// recorded before is kept, ended cleanly.
#[test]
fn a_gdb_stub_that_dies_mid_run_keeps_what_was_recorded() {
    let dir = scratch("stub_dies");
    build_guest(&dir);
    let mut vm = Vm::start(&dir, "guest-fp.img", "dies");
    let recording = dir.join("dies.glass");
    let glass = std::process::Command::new(GLASS)
        .args(["record", "-F", "199", "-d", "60", "--gdb"])
        .arg(&vm.socket)
        .arg("--symbols")
        .arg(dir.join("guest-fp.elf"))
        .arg("-o")
        .arg(&recording)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_recording(&recording, 2000);
    std::thread::sleep(std::time::Duration::from_millis(500));
    vm.child.kill().unwrap();
    let output = glass.wait_with_output().unwrap();
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{err}");
    assert!(err.contains("went away mid-recording"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let kept = glass_format::read_file(&recording).unwrap();
    assert!(kept.complete, "{:?}", kept.damage);
    assert!(!kept.samples.is_empty());
}

/// An unprivileged user is told what sampling another user's process needs.
#[test]
fn an_unprivileged_user_is_told_what_is_needed() {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root, to run glass as nobody against a root process");
        return;
    }
    let dir = scratch("unprivileged");
    open_to_nobody(&dir);
    let mut sleeper = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let pid = sleeper.id().to_string();
    let out = dir.join("x.glass");
    let out = out.to_str().unwrap();
    for (args, needle) in [
        (vec!["record", "--pid", &pid, "-o", out], "as root"),
        (
            vec!["record", "--backend", "ptrace", "--pid", &pid, "-o", out],
            "as root",
        ),
        (
            vec!["trace", "-f", "main", "--pid", &pid, "-o", out],
            "CAP_SYS_PTRACE",
        ),
    ] {
        let output = glass_as_nobody(&args);
        assert_clean_failure(&output, 2, needle);
    }
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
}

/// The recording's directory removed while glass writes into it: no "wrote …", a
/// failure; the file alone removed: written again from glass's open copy. The same for
/// `glass top -o` (its text view, --batch), which writes the same file.
#[test]
fn a_recording_removed_mid_run_is_not_reported_as_written() {
    let dir = scratch("removed_mid_run");
    let split = compile(&dir, "split.c", "split", &[]);
    let commands: [&[&str]; 2] = [&["record"], &["top", "--batch", "-d", "4"]];
    for (command, whole_directory) in commands.iter().flat_map(|c| [(c, true), (c, false)]) {
        let inner = dir.join(format!("out-{}-{whole_directory}", command[0]));
        std::fs::create_dir_all(&inner).unwrap();
        let recording = inner.join("prof.glass");
        let glass = std::process::Command::new(GLASS)
            .args(*command)
            .args(["-F", "499", "-o"])
            .arg(&recording)
            .arg("--")
            .arg(&split)
            .arg("8000")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        wait_for_recording(&recording, 100);
        if whole_directory {
            std::fs::remove_dir_all(&inner).unwrap();
        } else {
            std::fs::remove_file(&recording).unwrap();
        }
        let output = glass.wait_with_output().unwrap();
        let err = format!("{command:?}: {}", stderr(&output));
        assert!(!err.contains("panicked"), "{err}");
        if whole_directory {
            assert_eq!(output.status.code(), Some(1), "{err}");
            assert!(err.contains("was removed while glass wrote it"), "{err}");
            assert!(
                !err.contains(" -> "),
                "no summary of a file that is gone: {err}"
            );
        } else {
            assert_eq!(output.status.code(), Some(0), "{err}");
            assert!(err.contains("written again"), "{err}");
            let kept = glass_format::read_file(&recording).unwrap();
            assert!(
                kept.complete && !kept.samples.is_empty(),
                "{:?}",
                kept.damage
            );
        }
    }
}

/// A disk that fills mid-recording (a small tmpfs): every block written whole is kept,
/// the file is ended cleanly, and glass says what was lost (exit 1).
#[test]
fn a_full_disk_keeps_every_whole_block() {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root, to mount a small tmpfs");
        return;
    }
    let dir = scratch("full_disk");
    let nf = compile(&dir, "trace/nf.c", "nf", &[]);
    let split = compile(&dir, "split.c", "split", &[]);
    let disk = dir.join("disk");
    std::fs::create_dir_all(&disk).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=192k", "glass-full-disk"])
        .arg(&disk)
        .status()
        .unwrap();
    assert!(mounted.success());
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(disk.clone());
    for run in 0..3 {
        let recording = disk.join(format!("trace-{run}.glass"));
        let output = std::process::Command::new(GLASS)
            .args(["trace", "-o"])
            .arg(&recording)
            .args([
                "-f",
                "process_batch,parse_*,classify,rule_match,rewrite,forward",
                "--",
            ])
            .arg(&nf)
            .arg("3000")
            .stdout(std::process::Stdio::null())
            .output()
            .unwrap();
        let err = stderr(&output);
        assert_eq!(output.status.code(), Some(1), "{err}");
        assert!(err.contains("No space left on device"), "{err}");
        assert!(
            err.contains("call records lost") && err.contains("ended cleanly"),
            "{err}"
        );
        let kept = glass_format::read_file(&recording).unwrap();
        assert!(kept.complete, "run {run}: {:?}", kept.damage);
        assert!(
            !kept.trace_chunks.is_empty(),
            "run {run}: no call records kept"
        );
        assert!(kept.trace_summary.as_ref().is_some_and(|s| s.lost > 0));
        std::fs::remove_file(&recording).unwrap();
    }
    for run in 0..2 {
        let recording = disk.join(format!("samples-{run}.glass"));
        // Fill all but a little of the disk first: the samples fill the rest.
        let filler = disk.join("filler");
        let _ = std::process::Command::new("dd")
            .args(["if=/dev/zero", "bs=1k", "count=170"])
            .arg(format!("of={}", filler.display()))
            .stderr(std::process::Stdio::null())
            .status();
        // `glass top -o` writes the same file, and ends it the same way.
        let command: &[&str] = match run {
            0 => &["record"],
            _ => &["top", "--batch"],
        };
        let output = std::process::Command::new(GLASS)
            .args(command)
            .args(["-F", "999", "-o"])
            .arg(&recording)
            .arg("--")
            .arg(&split)
            .arg("8000")
            .output()
            .unwrap();
        let err = format!("{command:?}: {}", stderr(&output));
        assert_eq!(output.status.code(), Some(1), "{err}");
        assert!(err.contains("No space left on device"), "{err}");
        assert!(err.contains("ended cleanly"), "{err}");
        let kept = glass_format::read_file(&recording).unwrap();
        assert!(kept.complete, "run {run}: {:?}", kept.damage);
        assert!(!kept.samples.is_empty(), "run {run}: no samples kept");
        std::fs::remove_file(&recording).unwrap();
        std::fs::remove_file(&filler).unwrap();
    }
}
