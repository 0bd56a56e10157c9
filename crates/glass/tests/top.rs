//! `glass top`, end to end: the live view drawn in a real terminal (a detached tmux
//! session of a fixed size), driven by keys sent to it and read back from the pane; the
//! `--batch` text mode; and what becomes of the target when the user quits. Every wait
//! is a poll of the pane or of /proc with a generous timeout.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// How long anything may take to show up on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(60);

/// Rounds enough for the fixtures to run until they are ended.
const FOREVER: &str = "1000000000";

/// A private tmux server (its own socket) running one command in a detached session.
struct Tmux {
    socket: String,
    /// Where the command's exit status is written when it ends.
    status: PathBuf,
}

fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

impl Tmux {
    /// Runs `args` (glass's) in a 120x40 terminal; stderr goes to `dir/stderr`.
    fn start(dir: &Path, name: &str, args: &[&str]) -> Tmux {
        let socket = format!("glass-test-{name}-{}", std::process::id());
        let status = dir.join("status");
        let stderr = dir.join("stderr");
        let _ = std::fs::remove_file(&status);
        let mut command = quote(GLASS);
        for arg in args {
            command.push(' ');
            command.push_str(&quote(arg));
        }
        let script = format!(
            "{command} 2>{}; echo $? > {}.tmp; mv {}.tmp {}",
            quote(stderr.to_str().unwrap()),
            quote(status.to_str().unwrap()),
            quote(status.to_str().unwrap()),
            quote(status.to_str().unwrap()),
        );
        let tmux = Tmux { socket, status };
        let ok = tmux
            .command()
            .args(["-f", "/dev/null", "new-session", "-d", "-s", "top"])
            .args(["-x", "120", "-y", "40", "sh", "-c", &script])
            .status()
            .expect("tmux runs")
            .success();
        assert!(ok, "tmux new-session failed");
        tmux
    }

    fn command(&self) -> Command {
        let mut command = Command::new("tmux");
        // A private server even when the tests themselves run inside tmux.
        command.env_remove("TMUX").args(["-L", &self.socket]);
        command
    }

    fn screen(&self) -> String {
        let output = self
            .command()
            .args(["capture-pane", "-p", "-t", "top"])
            .output()
            .expect("tmux runs");
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    fn keys(&self, keys: &str) {
        let ok = self
            .command()
            .args(["send-keys", "-t", "top", "-l", keys])
            .status()
            .expect("tmux runs")
            .success();
        assert!(ok, "tmux send-keys failed");
    }

    /// Sends one key by its tmux name (`C-c`).
    fn key(&self, name: &str) {
        let ok = self
            .command()
            .args(["send-keys", "-t", "top", name])
            .status()
            .expect("tmux runs")
            .success();
        assert!(ok, "tmux send-keys failed");
    }

    /// Polls the pane until `ready` accepts it; the screen it accepted.
    fn wait_for(&self, what: &str, ready: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let screen = self.screen();
            // A settled frame: the same on a second look. A capture can land while glass
            // top is redrawing, with part of the old frame still on the screen (seen once:
            // a row's tail and two stale rows under the name sort).
            if ready(&screen) {
                std::thread::sleep(Duration::from_millis(30));
                if self.screen() == screen {
                    return screen;
                }
                continue;
            }
            if let Some(code) = self.exit_status() {
                panic!("glass exited ({code}) while waiting for {what}; screen:\n{screen}");
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; screen:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn exit_status(&self) -> Option<i32> {
        std::fs::read_to_string(&self.status)
            .ok()
            .and_then(|s| s.trim().parse().ok())
    }

    /// Waits until glass has ended; its exit status.
    fn wait_exit(&self) -> i32 {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(code) = self.exit_status() {
                return code;
            }
            assert!(
                Instant::now() < deadline,
                "glass did not exit; screen:\n{}",
                self.screen()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self
            .command()
            .arg("kill-server")
            .stderr(Stdio::null())
            .status();
        // A server that ended with its session leaves its socket file behind.
        let base = std::env::var("TMUX_TMPDIR").unwrap_or_else(|_| "/tmp".into());
        // SAFETY: no arguments.
        let uid = unsafe { libc::getuid() };
        let _ = std::fs::remove_file(format!("{base}/tmux-{uid}/{}", self.socket));
    }
}

/// A table row as the view draws it: shares, counts, (thread,) function, module.
#[derive(Debug)]
struct Row {
    self_share: f64,
    total_share: f64,
    thread: Option<String>,
    function: String,
}

/// The rows of the table on `screen` (the lines after the column titles).
fn rows(screen: &str) -> Vec<Row> {
    let mut lines = screen.lines().skip_while(|l| !l.contains("SELF%"));
    let split = lines.next().is_some_and(|titles| titles.contains("THREAD"));
    lines
        .filter_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            let self_share = words.first()?.parse().ok()?;
            let total_share = words.get(1)?.parse().ok()?;
            let (thread, function) = match split {
                true => (Some(words.get(4)?.to_string()), words.get(5)?),
                false => (None, words.get(4)?),
            };
            Some(Row {
                self_share,
                total_share,
                thread,
                function: function.to_string(),
            })
        })
        .collect()
}

fn self_share(screen: &str, function: &str) -> Option<f64> {
    rows(screen)
        .into_iter()
        .find(|r| r.function == function)
        .map(|r| r.self_share)
}

/// The number after `label` on the screen (`(pid 123`, `last 5 s: 99 samples`).
fn number_after(screen: &str, label: &str) -> Option<u64> {
    let at = screen.find(label)? + label.len();
    let digits: String = screen[at..]
        .chars()
        .skip_while(|c| *c == ' ')
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// Samples the table's shares are of ("view: ... (N samples)").
fn view_samples(screen: &str) -> u64 {
    let line = screen
        .lines()
        .find(|l| l.starts_with("view: "))
        .unwrap_or("");
    number_after(line, "(").unwrap_or(0)
}

/// The pid of the process running `program` whose command line holds `needle` (a path
/// unique to a test).
fn pid_with_argument(program: &str, needle: &str) -> Option<i32> {
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            (text.contains(needle) && text.starts_with(program)).then_some(pid)
        })
}

/// Polls until `done`, panicking with `what` after the patience runs out.
fn poll(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The split fixture's 60/30/10 in the table's self column (generous bounds: a
/// window of at least 400 samples, alpha's 45-75 is over five standard errors).
fn assert_split(screen: &str) {
    let alpha = self_share(screen, "alpha").expect("alpha row");
    let beta = self_share(screen, "beta").expect("beta row");
    let gamma = self_share(screen, "gamma_").expect("gamma_ row");
    assert!((45.0..=75.0).contains(&alpha), "alpha {alpha}%:\n{screen}");
    assert!((18.0..=42.0).contains(&beta), "beta {beta}%:\n{screen}");
    assert!((3.0..=20.0).contains(&gamma), "gamma_ {gamma}%:\n{screen}");
}

fn split_ready(screen: &str) -> bool {
    view_samples(screen) >= 400
        && ["alpha", "beta", "gamma_"]
            .iter()
            .all(|f| self_share(screen, f).is_some_and(|s| s > 0.0))
}

/// A child ended and reaped, or not ours and gone.
fn gone(pid: i32) -> bool {
    matches!(process_state(pid), None | Some('Z') | Some('X'))
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn launched_command_shares_keys_pause_and_quit() {
    let _exclusive = exclusive();
    let dir = scratch("top_launched");
    let split = compile(&dir, "split.c", "split", &[]);
    let tmux = Tmux::start(
        &dir,
        "launched",
        &[
            "top",
            "--interval",
            "0.5",
            "--window",
            "10",
            "--",
            split.to_str().unwrap(),
            FOREVER,
        ],
    );
    let screen = tmux.wait_for("the split table", split_ready);
    assert!(
        screen.contains("glass top: split 1000000000 (pid "),
        "{screen}"
    );
    let pid = number_after(&screen, "(pid ").expect("the target's pid") as i32;
    assert_split(&screen);
    assert!(screen.contains("sort: self"), "{screen}");
    // Self order: alpha, beta, gamma_ lead.
    let functions: Vec<String> = rows(&screen).into_iter().map(|r| r.function).collect();
    assert_eq!(functions[..3], ["alpha", "beta", "gamma_"], "{screen}");

    // T: by total; every function on every stack (main) leads with 100%.
    tmux.keys("T");
    let screen = tmux.wait_for("the total sort", |s| s.contains("sort: total"));
    let table = rows(&screen);
    // (The program's start in ld.so, before main, may have a sample or two.)
    assert!(table[0].total_share > 98.0, "{screen}");
    assert!(
        table
            .windows(2)
            .all(|w| w[0].total_share >= w[1].total_share),
        "{screen}"
    );

    // n: by name.
    tmux.keys("n");
    let screen = tmux.wait_for("the name sort", |s| s.contains("sort: name"));
    let names: Vec<String> = rows(&screen).into_iter().map(|r| r.function).collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted, "{screen}");

    // Arrow keys (escape sequences) change nothing; s: back to self.
    tmux.key("Up");
    tmux.key("Down");
    tmux.keys("s");
    let screen = tmux.wait_for("the self sort", |s| s.contains("sort: self"));
    assert_eq!(rows(&screen)[0].function, "alpha", "{screen}");

    // Space: the table freezes (its window no longer moves) while sampling goes on.
    tmux.keys(" ");
    let frozen = tmux.wait_for("the pause", |s| s.contains("PAUSED"));
    let frozen_samples = number_after(&frozen, "s: ").expect("window samples");
    let cpu_at_pause = cpu_ticks(pid);
    // The target runs on (it is sampled, not stopped): wait for a second of its CPU.
    poll("the target to run on while paused", || {
        cpu_ticks(pid) >= cpu_at_pause + 100
    });
    let still = tmux.screen();
    assert!(still.contains("PAUSED"), "{still}");
    assert_eq!(
        number_after(&still, "s: "),
        Some(frozen_samples),
        "paused view changed:\n{frozen}\n---\n{still}"
    );
    // Keys still apply to the frozen window.
    tmux.keys("T");
    let screen = tmux.wait_for("the total sort while paused", |s| {
        s.contains("sort: total") && s.contains("PAUSED")
    });
    assert_eq!(
        number_after(&screen, "s: "),
        Some(frozen_samples),
        "{screen}"
    );
    tmux.keys(" ");
    tmux.wait_for("the window to move again", |s| {
        !s.contains("PAUSED") && number_after(s, "s: ") != Some(frozen_samples)
    });

    // q: glass ends the recording and the command it launched, and exits 0.
    tmux.keys("q");
    assert_eq!(tmux.wait_exit(), 0, "{}", tmux.screen());
    poll("the launched command to end", || gone(pid));
    let stderr = std::fs::read_to_string(dir.join("stderr")).unwrap();
    assert!(stderr.contains("stopped by SIGINT"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// The backends that can run here: ptrace always, perf where the kernel permits it.
fn backends() -> Vec<&'static str> {
    let mut backends = vec!["ptrace"];
    let probe = glass(&[
        "record",
        "--backend",
        "perf",
        "-o",
        "/dev/null",
        "--",
        "true",
    ]);
    if probe.status.success() {
        backends.push("perf");
    }
    backends
}

#[test]
fn pid_target_runs_on_after_quit() {
    let _exclusive = exclusive();
    let dir = scratch("top_pid");
    let split = compile(&dir, "split.c", "split", &[]);
    for backend in backends() {
        let target = Killed(
            Command::new(&split)
                .arg(FOREVER)
                .stdout(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let pid = target.0.id() as i32;
        let tmux = Tmux::start(
            &dir,
            &format!("pid-{backend}"),
            &[
                "top",
                "--backend",
                backend,
                "--interval",
                "0.5",
                "--window",
                "10",
                "--pid",
                &pid.to_string(),
            ],
        );
        let screen = tmux.wait_for("the split table", split_ready);
        assert!(
            screen.contains(&format!("glass top: pid {pid} (split)")),
            "{screen}"
        );
        assert!(screen.contains(&format!("{backend} backend")), "{screen}");
        assert_split(&screen);
        // The sampler's own cost in the header.
        match backend {
            "ptrace" => {
                assert!(
                    screen.contains("target stopped per sample: mean "),
                    "{screen}"
                );
                assert!(screen.contains("overhead "), "{screen}");
            }
            _ => assert!(
                screen.contains("target stopped per sample: 0 us")
                    && screen.contains("lost samples "),
                "{screen}"
            ),
        }
        // Ctrl-C quits as q does (the view reads it as a key: raw mode).
        match backend {
            "ptrace" => tmux.keys("q"),
            _ => tmux.key("C-c"),
        }
        assert_eq!(tmux.wait_exit(), 0, "{}", tmux.screen());
        // Detached, not stopped, and still working.
        let state = process_state(pid).expect("the target is still there");
        assert!(
            !matches!(state, 't' | 'T' | 'Z'),
            "{backend}: state {state}"
        );
        let before = cpu_ticks(pid);
        poll("the target to make progress after glass quit", || {
            cpu_ticks(pid) > before
        });
        let tracer = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        assert!(tracer.contains("TracerPid:\t0"), "{tracer}");
    }
}

#[test]
fn thread_views_split_and_filter() {
    let _exclusive = exclusive();
    let dir = scratch("top_threads");
    let threads = compile(&dir, "threads.c", "threads", &["-pthread"]);
    let tmux = Tmux::start(
        &dir,
        "threads",
        &[
            "top",
            "--interval",
            "0.5",
            "--window",
            "10",
            "--",
            threads.to_str().unwrap(),
            FOREVER,
        ],
    );
    let both = |s: &str| {
        view_samples(s) >= 100
            && self_share(s, "crunch_numbers").is_some_and(|x| x > 0.0)
            && self_share(s, "hash_bytes").is_some_and(|x| x > 0.0)
    };
    tmux.wait_for("both workers in the table", both);
    // t: one row per thread and function, each worker's function on its own thread
    // (named once the workers have named themselves).
    tmux.keys("t");
    let screen = tmux.wait_for("the split view with named workers", |s| {
        s.contains("view: split by thread")
            && rows(s).iter().any(|r| {
                r.function == "crunch_numbers"
                    && r.thread
                        .as_deref()
                        .is_some_and(|t| t.starts_with("cruncher/"))
            })
            && rows(s).iter().any(|r| {
                r.function == "hash_bytes"
                    && r.thread
                        .as_deref()
                        .is_some_and(|t| t.starts_with("hasher/"))
            })
    });
    for row in rows(&screen) {
        let thread = row.thread.clone().expect("a thread column");
        match row.function.as_str() {
            "crunch_numbers" => assert!(thread.starts_with("cruncher/"), "{screen}"),
            "hash_bytes" => assert!(thread.starts_with("hasher/"), "{screen}"),
            _ => {}
        }
    }
    // t again: one thread at a time, in tid order, then all threads again. Each worker
    // alone shows its own function only, at nearly all of its samples.
    let mut seen = Vec::new();
    let mut last = screen;
    for _ in 0..8 {
        tmux.keys("t");
        let previous = last
            .lines()
            .find(|l| l.starts_with("view: "))
            .unwrap_or("")
            .to_string();
        let screen = tmux.wait_for("the next thread view", |s| {
            let view = s.lines().find(|l| l.starts_with("view: ")).unwrap_or("");
            // The view changed (not only its sample count).
            view.split(" (").next() != previous.split(" (").next()
        });
        if screen.contains("view: all threads") {
            break;
        }
        let table = rows(&screen);
        if screen.contains("view: thread cruncher/") {
            assert!(table.iter().all(|r| r.function != "hash_bytes"), "{screen}");
            assert!(
                self_share(&screen, "crunch_numbers").unwrap_or(0.0) > 80.0,
                "{screen}"
            );
            seen.push("cruncher");
        }
        if screen.contains("view: thread hasher/") {
            assert!(
                table.iter().all(|r| r.function != "crunch_numbers"),
                "{screen}"
            );
            assert!(
                self_share(&screen, "hash_bytes").unwrap_or(0.0) > 80.0,
                "{screen}"
            );
            seen.push("hasher");
        }
        last = screen;
    }
    assert_eq!(seen, ["cruncher", "hasher"], "{last}");
    assert!(tmux.screen().contains("view: all threads"));
    tmux.keys("q");
    assert_eq!(tmux.wait_exit(), 0, "{}", tmux.screen());
}

#[test]
fn the_view_stays_when_the_command_ends_and_glass_exits_with_its_status() {
    let dir = scratch("top_ends");
    let tmux = Tmux::start(
        &dir,
        "ends",
        &["top", "--", "sh", "-c", "sleep 0.2; exit 3"],
    );
    let screen = tmux.wait_for("the end of the recording", |s| {
        s.contains("recording ended: target exited (status 3); press q to quit")
    });
    assert!(
        screen.contains("glass top: sh -c sleep 0.2; exit 3 (pid "),
        "{screen}"
    );
    // Still there until the user quits.
    assert_eq!(tmux.exit_status(), None);
    tmux.keys("q");
    assert_eq!(tmux.wait_exit(), 3, "{}", tmux.screen());
    let stderr = std::fs::read_to_string(dir.join("stderr")).unwrap();
    assert!(stderr.contains("(target exited)"), "{stderr}");
}

/// Closing the terminal (tmux's server killed: SIGHUP) ends glass, while it records
/// and while it shows a finished recording, and what it launched ends with it.
#[test]
fn closing_the_terminal_ends_glass() {
    let _exclusive = exclusive();
    let dir = scratch("top_hangup");
    let split = compile(&dir, "split.c", "split", &[]);
    let marker = dir.join("marker");
    let marker = marker.to_str().unwrap();
    for (name, command) in [
        ("running", vec![split.to_str().unwrap(), FOREVER]),
        ("ended", vec!["sh", "-c", "exit 0", marker]),
    ] {
        let mut args = vec!["top", "--interval", "0.5", "--window", "10", "--"];
        args.extend_from_slice(&command);
        let tmux = Tmux::start(&dir, &format!("hangup-{name}"), &args);
        let target = match name {
            "running" => {
                let screen = tmux.wait_for("the split table", split_ready);
                Some(number_after(&screen, "(pid ").unwrap() as i32)
            }
            _ => {
                tmux.wait_for("the end", |s| s.contains("recording ended: "));
                None
            }
        };
        let needle = if name == "running" { FOREVER } else { marker };
        let glass_pid = pid_with_argument(GLASS, needle).expect("glass runs");
        drop(tmux);
        poll("glass to end with its terminal", || gone(glass_pid));
        if let Some(target) = target {
            poll("the launched command to end", || gone(target));
        }
    }
}

#[test]
fn batch_mode_prints_tables_and_writes_the_recording() {
    let _exclusive = exclusive();
    let dir = scratch("top_batch");
    let split = compile(&dir, "split.c", "split", &[]);
    let recording = dir.join("top.glass");
    // The default rounds end by themselves in a few seconds of CPU.
    let output = glass(&[
        "top",
        "--batch",
        "--interval",
        "0.5",
        "--window",
        "60",
        "-o",
        recording.to_str().unwrap(),
        "--",
        split.to_str().unwrap(),
    ]);
    let text = stdout(&output);
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(0), "{err}\n{text}");
    assert!(
        text.contains("recording ended: target exited (status 0)"),
        "{text}"
    );
    // The last table covers the whole run (a 60 s window).
    let last = text.rsplit("glass top: ").next().unwrap();
    assert!(
        !last.contains("view: "),
        "no key help in batch mode: {last}"
    );
    let header = last.lines().next().unwrap();
    let samples = number_after(header, "s: ").unwrap();
    assert!(samples >= 100, "{header}");
    let titles_and_rows = format!("SELF%{}", last.split_once("SELF%").unwrap().1);
    assert_split(&titles_and_rows);
    assert!(text.matches("glass top: split").count() >= 2, "{text}");
    assert!(
        err.contains(&format!("-> {}", recording.display())),
        "{err}"
    );
    // The file holds the same run.
    let stacks = folded(&recording, &[]);
    // (The leaf there is the inlined spin_units; alpha holds it.)
    assert!(samples_in(&stacks, "alpha") > samples_in(&stacks, "beta"));
    assert!(total(&stacks) >= samples, "{} < {samples}", total(&stacks));
}

/// `--duration` ends the recording; the command glass top launched ends with it (glass
/// record would leave it running).
#[test]
fn a_launched_command_does_not_outlive_glass() {
    let dir = scratch("top_duration");
    let split = compile(&dir, "split.c", "split", &[]);
    let output = glass(&[
        "top",
        "--batch",
        "-d",
        "1",
        "--",
        split.to_str().unwrap(),
        FOREVER,
    ]);
    let text = stdout(&output);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let pid = number_after(&text, "(pid ").expect("the pid in the header") as i32;
    assert!(
        gone(pid),
        "the launched command runs on: {:?}",
        process_state(pid)
    );
    assert!(
        stderr(&output).contains(&format!("ended the command it launched (pid {pid})")),
        "{}",
        stderr(&output)
    );
}

#[test]
fn batch_mode_split_by_thread() {
    let _exclusive = exclusive();
    let dir = scratch("top_batch_threads");
    let threads = compile(&dir, "threads.c", "threads", &["-pthread"]);
    let output = glass(&[
        "top",
        "--batch",
        "--threads",
        "--window",
        "60",
        "--",
        threads.to_str().unwrap(),
    ]);
    let text = stdout(&output);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    // The last table, of the whole run: each worker's function on its own thread.
    let last = text.rsplit("glass top: ").next().unwrap();
    let table = format!("SELF%{}", last.split_once("SELF%").unwrap().1);
    let rows = rows(&table);
    let on = |function: &str, thread: &str| {
        rows.iter().any(|r| {
            r.function == function && r.thread.as_deref().is_some_and(|t| t.starts_with(thread))
        })
    };
    assert!(on("crunch_numbers", "cruncher/"), "{table}");
    assert!(on("hash_bytes", "hasher/"), "{table}");
    assert!(
        !on("crunch_numbers", "hasher/") && !on("hash_bytes", "cruncher/"),
        "{table}"
    );
}

#[test]
fn bad_input_is_one_line_and_exit_2() {
    let dir = scratch("top_bad");
    // Not a terminal, no --batch.
    let output = glass(&["top", "--", "true"]);
    assert_clean_failure(&output, 2, "not a terminal");
    // No such process, in batch mode and in the interactive view (no screen is drawn).
    let file = dir.join("never.glass");
    let output = glass(&[
        "top",
        "--batch",
        "-o",
        file.to_str().unwrap(),
        "--pid",
        "99999999",
    ]);
    assert_clean_failure(&output, 2, "no process with pid 99999999");
    assert!(stdout(&output).is_empty(), "{}", stdout(&output));
    assert!(!file.exists(), "-o file left behind by a failed start");
    let tmux = Tmux::start(&dir, "nopid", &["top", "--pid", "99999999"]);
    assert_eq!(tmux.wait_exit(), 2);
    let err = std::fs::read_to_string(dir.join("stderr")).unwrap();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("no process with pid 99999999"), "{err}");
    // A command that does not exist.
    let output = glass(&["top", "--batch", "--", "/nonexistent/program"]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert_eq!(
        stderr(&output).trim_end().lines().count(),
        1,
        "{}",
        stderr(&output)
    );
    // Raw capture has no frames to show.
    let output = glass(&["top", "--batch", "--capture", "raw", "--", "true"]);
    assert_clean_failure(&output, 2, "--capture raw");
}

#[test]
fn vm_guests_launched_end_and_attached_run_on() {
    let _exclusive = exclusive();
    let dir = build_guest(&scratch("top_vm"));
    let serial = dir.join("top-vm.serial");
    let serial_arg = format!("file:{}", serial.display());
    let elf = dir.join("guest-fp.elf");
    let image = dir.join("guest-fp.img");
    let tmux = Tmux::start(
        &dir,
        "vm",
        &[
            "top",
            "--vm",
            "-F",
            "199",
            "--interval",
            "0.5",
            "--window",
            "10",
            "--symbols",
            elf.to_str().unwrap(),
            "--",
            "qemu-system-x86_64",
            "-accel",
            "tcg",
            "-smp",
            "2",
            "-m",
            "64",
            "-display",
            "none",
            "-nodefaults",
            "-serial",
            &serial_arg,
            "-kernel",
            image.to_str().unwrap(),
        ],
    );
    // Both vCPUs' work: the split on vCPU 0, checksum_blocks on vCPU 1.
    let screen = tmux.wait_for("both vCPUs' work", |s| {
        view_samples(s) >= 300
            && rows(s).iter().any(|r| r.function == "alpha")
            && rows(s).iter().any(|r| r.function == "checksum_blocks")
    });
    assert!(screen.contains("gdbstub backend, 199 Hz"), "{screen}");
    assert!(
        screen.contains("target stopped per sample: mean ") && screen.contains("overhead "),
        "{screen}"
    );
    let qemu = pid_with_argument("qemu-system", serial.to_str().unwrap()).expect("QEMU runs");
    // t, t: vCPU 0 alone (vcpu0 is tid 1, the first), where the split is.
    tmux.keys("t");
    tmux.wait_for("the split view", |s| s.contains("view: split by thread"));
    tmux.keys("t");
    let screen = tmux.wait_for("vCPU 0 alone with its split", |s| {
        s.contains("view: thread vcpu0/") && split_ready(s)
    });
    assert_split(&screen);
    assert!(
        rows(&screen)
            .iter()
            .all(|r| r.function != "checksum_blocks"),
        "{screen}"
    );
    // q ends the VM glass launched, as glass record ends it.
    tmux.keys("q");
    assert_eq!(tmux.wait_exit(), 0, "{}", tmux.screen());
    poll("QEMU to end", || gone(qemu));
    let stderr = std::fs::read_to_string(dir.join("stderr")).unwrap();
    assert!(stderr.contains("VM shut down"), "{stderr}");
    drop(tmux);

    // --gdb: a VM someone else started runs on after q.
    let vm = Vm::start(&dir, "guest-fp.img", "top-gdb");
    let tmux = Tmux::start(
        &dir,
        "gdb",
        &[
            "top",
            "-F",
            "199",
            "--interval",
            "0.5",
            "--gdb",
            vm.socket.to_str().unwrap(),
            "--guest-memory",
            vm.ram.to_str().unwrap(),
            "--symbols",
            elf.to_str().unwrap(),
        ],
    );
    let screen = tmux.wait_for("the guest's table", |s| {
        view_samples(s) >= 100 && rows(s).iter().any(|r| r.function == "alpha")
    });
    assert!(screen.contains("glass top: VM guest at "), "{screen}");
    tmux.keys("q");
    assert_eq!(tmux.wait_exit(), 0, "{}", tmux.screen());
    vm.assert_running();
}

#[test]
fn kernel_frames_are_named_live() {
    let _exclusive = exclusive();
    let dir = scratch("top_kernel");
    let binary = compile(&dir, "kernel/syscalls.c", "syscalls", &[]);
    // The perf backend takes the kernel's callchain where permitted (root, as in CI):
    // the view names those frames from /proc/kallsyms as they come. At 999 Hz the run
    // (~0.2 s) gives ~200 samples, so kernel_part (a fifth of the time) cannot be missed.
    let output = glass(&[
        "top",
        "--batch",
        "--window",
        "60",
        "--frequency",
        "999",
        "--limit",
        "100",
        "--backend",
        "perf",
        "--",
        binary.to_str().unwrap(),
        "400",
    ]);
    let text = stdout(&output);
    assert_eq!(output.status.code(), Some(0), "{}\n{text}", stderr(&output));
    let last = text.rsplit("glass top: ").next().unwrap();
    let table = rows(last);
    let kernel: Vec<&Row> = table
        .iter()
        .filter(|r| r.function.ends_with("_[k]"))
        .collect();
    assert!(
        !kernel.is_empty() && last.contains("[kernel.kallsyms]"),
        "no kernel frames: {last}"
    );
    // The read system call's path through the kernel lies under kernel_part. (Other
    // kernel frames may not: cpu_ns's clock_gettime of the thread's CPU clock, printf's
    // write at the end, an interrupt taken in user_part.)
    let total_of = |function: &str| table.iter().find(|r| r.function == function);
    let kernel_part = total_of("kernel_part").unwrap_or_else(|| panic!("{last}"));
    assert!(kernel_part.total_share > 5.0, "{last}");
    let read_path: Vec<&Row> = ["ksys_read_[k]", "vfs_read_[k]", "read_zero_[k]"]
        .iter()
        .filter_map(|f| total_of(f))
        .collect();
    assert!(!read_path.is_empty(), "the read path is not named: {last}");
    for row in read_path {
        assert!(
            row.total_share <= kernel_part.total_share + 0.01,
            "{} outside kernel_part: {last}",
            row.function
        );
    }
    assert!(
        !table.iter().any(|r| r.function == "[unknown]"),
        "unnamed frames: {last}"
    );
}

/// `glass top --off-cpu` shows blocked time as the report shows it (one sample model):
/// `[off-cpu]` and the function that blocks have the same shares in the last table as
/// in `glass report` of the recording it wrote with -o.
#[test]
fn off_cpu_is_shown_live_as_the_report_shows_it() {
    let _exclusive = exclusive();
    let dir = scratch("top_off_cpu");
    let binary = compile(&dir, "kernel/blocking.c", "blocking", &["-pthread"]);
    let recording = dir.join("b.glass");
    let output = glass(&[
        "top",
        "--batch",
        "--window",
        "600",
        "--frequency",
        "999",
        "--limit",
        "1000",
        "--backend",
        "perf",
        "--off-cpu",
        "-o",
        recording.to_str().unwrap(),
        "--",
        binary.to_str().unwrap(),
        "40",
    ]);
    let text = stdout(&output);
    assert_eq!(output.status.code(), Some(0), "{}\n{text}", stderr(&output));
    let last = text.rsplit("glass top: ").next().unwrap();
    let live = rows(last);
    let report = stdout(&glass(&[
        "report",
        recording.to_str().unwrap(),
        "--limit",
        "1000",
    ]));
    // The report's rows: self%, total%, self, total, function, module.
    let reported: Vec<(f64, f64, String)> = report
        .lines()
        .filter_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            let share = |w: &str| w.strip_suffix('%')?.parse::<f64>().ok();
            Some((
                share(words.first()?)?,
                share(words.get(1)?)?,
                words.get(4)?.to_string(),
            ))
        })
        .collect();
    for function in ["[off-cpu]", "wait_for_data", "compute"] {
        let live = live
            .iter()
            .find(|r| r.function == function)
            .unwrap_or_else(|| panic!("no {function} live: {last}"));
        let (self_share, total_share, _) = reported
            .iter()
            .find(|r| r.2 == function)
            .unwrap_or_else(|| panic!("no {function} in the report: {report}"));
        assert!(
            (live.total_share - total_share).abs() < 0.5
                && (live.self_share - self_share).abs() < 0.5,
            "{function}: live {live:?}, report {self_share}/{total_share}\n{last}\n{report}"
        );
    }
    let off_cpu = live.iter().find(|r| r.function == "[off-cpu]").unwrap();
    assert!(off_cpu.total_share > 20.0, "{last}");
    // The window (the whole run) weighs as many samples as the report: on-CPU samples
    // and blocked time in sampling periods.
    let shown = number_after(last, "s: ").unwrap_or_else(|| panic!("{last}"));
    let on_cpu = number_after(&report, "on-CPU: ").unwrap_or_else(|| panic!("{report}"));
    let blocked = number_after(&report, "weighed as ").unwrap_or_else(|| panic!("{report}"));
    assert_eq!(shown, on_cpu + blocked, "{last}\n{report}");
}
