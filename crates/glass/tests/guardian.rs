//! A glass that dies never leaves a VM stopped, and loses at most about a second of its
//! recording (real QEMU TCG, the demo guest).
//!
//! - `glass record --gdb` SIGKILLed 50 times at pseudo-random moments (fixed seed, 20 to
//!   600 ms after it starts: during the handshake and mid-sampling at 997 Hz): each time
//!   the guest's serial progress resumes within 1 s (the guardian connects and detaches).
//! - `--vm --keep-vm` killed: the VM runs on; `--vm` killed: QEMU is gone within seconds.
//! - The guest's RAM never has a name in the file system.
//! - Normal endings say what became of the VM; bad input says what is wrong.
//! - A recording killed after 3 s keeps its samples up to (kill time - 1 s), for the
//!   ptrace, perf and gdbstub backends, and `glass info` says it was cut short.
//!
//! Every check holds however the timing falls: a kill that lands while the VM runs
//! must leave it running just as one that lands while it is stopped.

mod common;
use common::*;

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// splitmix64 from a fixed seed: the same kill moments on every run.
struct Moments(u64);

impl Moments {
    fn next_ms(&mut self, low: u64, high: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        low + z % (high - low + 1)
    }
}

/// `rate` lines in a serial log: the guest's progress.
fn progress(serial: &Path) -> usize {
    let mut text = String::new();
    let _ = std::fs::File::open(serial).and_then(|mut f| f.read_to_string(&mut text));
    text.lines().filter(|l| l.starts_with("rate")).count()
}

/// How long until the guest prints more than `before` progress lines, if within `limit`.
fn progress_within(serial: &Path, before: usize, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    loop {
        if progress(serial) > before {
            return Some(start.elapsed());
        }
        if start.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// glass running with its standard error read in the background. Its guardian shares
/// that pipe, and so does a QEMU that `--vm` launched.
struct Recorder {
    child: Child,
    text: Arc<Mutex<String>>,
    eof: Arc<AtomicBool>,
}

impl Recorder {
    fn start(args: &[&str], tmpdir: &Path) -> Recorder {
        Self::start_with_env(args, tmpdir, &[])
    }

    fn start_with_env(args: &[&str], tmpdir: &Path, env: &[(&str, &str)]) -> Recorder {
        let mut child = Command::new(GLASS)
            .args(args)
            .envs(env.iter().copied())
            .env("TMPDIR", tmpdir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            // Its own process group, as a shell gives a job: a signal to the group is
            // what Ctrl-C sends.
            .process_group(0)
            .spawn()
            .unwrap();
        let mut pipe = child.stderr.take().unwrap();
        let text = Arc::new(Mutex::new(String::new()));
        let eof = Arc::new(AtomicBool::new(false));
        let (text_in, eof_in) = (text.clone(), eof.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = pipe.read(&mut buf) {
                text_in
                    .lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
            eof_in.store(true, Ordering::SeqCst);
        });
        Recorder { child, text, eof }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn kill(&mut self, signal: i32) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.pid(), signal) };
    }

    /// Whether this glass's guardian (`__guardian ... --glass PID`) is still there.
    fn guardian_alive(&self) -> bool {
        let mine = format!("\0--glass\0{}\0", self.pid());
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().parse::<i32>().is_ok())
            .any(|e| {
                let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
                let cmdline = String::from_utf8_lossy(&cmdline);
                cmdline.contains("__guardian") && cmdline.contains(&mine) && !gone_path(&e.path())
            })
    }

    /// Waits for glass to exit.
    fn exit_status(&mut self) -> std::process::ExitStatus {
        self.child.wait().unwrap()
    }

    /// Waits for its guardian to exit (at once after `done`; within its retry bound
    /// after a death).
    fn wait_guardian(&self, what: &str) {
        let until = Instant::now() + Duration::from_secs(30);
        while self.guardian_alive() {
            assert!(
                Instant::now() < until,
                "{what}: the guardian did not exit within 30 s"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Everything written to the pipe, once every writer (glass, its guardian, a QEMU
    /// it launched) has closed it.
    fn stderr(self, what: &str) -> String {
        let until = Instant::now() + Duration::from_secs(30);
        while !self.eof.load(Ordering::SeqCst) {
            assert!(
                Instant::now() < until,
                "{what}: standard error still open after 30 s: {}",
                self.text.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let text = self.text.lock().unwrap().clone();
        text
    }

    /// Glass's exit status and what it and its guardian wrote (no QEMU left running).
    fn finish(mut self, what: &str) -> (std::process::ExitStatus, String) {
        let status = self.exit_status();
        self.wait_guardian(what);
        (status, self.stderr(what))
    }
}

fn gone_path(proc_dir: &Path) -> bool {
    match std::fs::read_to_string(proc_dir.join("stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

/// Ends a QEMU the test started through glass if the test fails before it does.
struct EndOnDrop(i32);

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        if !gone(self.0) {
            // SAFETY: signalling a QEMU this test started (still there, so still ours).
            unsafe { libc::kill(self.0, libc::SIGKILL) };
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        // A failing test does not leave glass sampling.
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Whether process `pid` is gone (or a zombie nobody reaped yet).
fn gone(pid: i32) -> bool {
    gone_path(Path::new(&format!("/proc/{pid}")))
}

fn wait_gone(pid: i32, limit: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if gone(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    gone(pid)
}

/// The time the guardian says it took to let the VM run after glass died.
fn guardian_ms(stderr: &str) -> Option<f64> {
    let rest = stderr.split("its guardian let the VM run in ").nth(1)?;
    rest.split(" ms").next()?.parse().ok()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Files in /dev/shm and `tmpdir` named after glass `pid`'s guest RAM or socket.
fn files_of(pid: i32, tmpdir: &Path) -> Vec<PathBuf> {
    let mine = format!("glass-vm-{pid}");
    [Path::new("/dev/shm"), tmpdir]
        .iter()
        .flat_map(|dir| std::fs::read_dir(dir).into_iter().flatten().flatten())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&mine))
        })
        .collect()
}

/// QEMU's pid from its -pidfile, once QEMU has written it.
fn qemu_pid(pidfile: &Path, limit: Duration) -> Option<i32> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Some(pid) = std::fs::read_to_string(pidfile)
            .ok()
            .and_then(|t| t.trim().parse().ok())
        {
            return Some(pid);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

/// The guest RAM of a QEMU that `--vm` started: a memfd (no name anywhere), and no
/// descriptor of QEMU's opens a file of this glass's.
fn assert_ram_is_a_memfd(qemu: i32, glass: i32, tmpdir: &Path, what: &str) {
    // QEMU writes its pid file before it maps the guest's RAM: a glass killed early
    // leaves a QEMU still setting up, so wait (bounded) for the RAM to be mapped.
    let started = Instant::now();
    let maps = loop {
        let maps = std::fs::read_to_string(format!("/proc/{qemu}/maps")).unwrap_or_default();
        if maps.is_empty()
            || maps.contains("/memfd:glass-vm-ram (deleted)")
            || started.elapsed() > Duration::from_secs(10)
        {
            break maps;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    if maps.is_empty() {
        return; // QEMU already ended (the check below still runs).
    }
    assert!(
        maps.contains("/memfd:glass-vm-ram (deleted)"),
        "{what}: QEMU's RAM is not glass's memfd"
    );
    let files = files_of(glass, tmpdir)
        .into_iter()
        .filter(|p| p.extension().is_none_or(|e| e != "sock"))
        .collect::<Vec<_>>();
    assert!(
        files.is_empty(),
        "{what}: guest RAM in the file system: {files:?}"
    );
}

fn qemu_args<'a>(image: &'a str, serial: &'a str, pidfile: &'a str) -> Vec<&'a str> {
    qemu_command("1", &["-serial", serial, "-pidfile", pidfile], image)
}

#[test]
fn a_sigkilled_glass_never_leaves_the_vm_stopped() {
    let _alone = exclusive();
    let dir = build_guest(&scratch("guardian_gdb"));
    let vm = Vm::start_with(&dir, "guest-fp.img", "gdb", 1);
    vm.assert_running();
    let elf = dir.join("guest-fp.elf");
    let mut moments = Moments(0x6c61_7373_2d6b_696c);
    let mut resumed_ms = Vec::new();
    let mut seen_ms = Vec::new();
    for iteration in 0..50 {
        let delay = moments.next_ms(20, 600);
        let recording = dir.join(format!("kill-{iteration}.glass"));
        let mut recorder = Recorder::start(
            &[
                "record",
                "-F",
                "997",
                "--gdb",
                vm.socket.to_str().unwrap(),
                "--symbols",
                elf.to_str().unwrap(),
                "--guest-memory",
                vm.ram.to_str().unwrap(),
                "-o",
                recording.to_str().unwrap(),
            ],
            &dir,
        );
        std::thread::sleep(Duration::from_millis(delay));
        recorder.kill(libc::SIGKILL);
        let before = vm.progress();
        let seen = progress_within(&vm.serial, before, Duration::from_secs(1));
        let (status, stderr) = recorder.finish(&format!("iteration {iteration}"));
        assert!(
            seen.is_some(),
            "iteration {iteration} (SIGKILL {delay} ms after start, {status}): the guest made no progress within 1 s; glass and its guardian said: {stderr}"
        );
        seen_ms.push(seen.unwrap().as_secs_f64() * 1e3);
        if let Some(ms) = guardian_ms(&stderr) {
            resumed_ms.push(ms);
        }
        assert!(
            !stderr.contains("could not"),
            "iteration {iteration}: {stderr}"
        );
    }
    vm.assert_running();
    resumed_ms.sort_by(f64::total_cmp);
    seen_ms.sort_by(f64::total_cmp);
    // A glass killed before it started its guardian never stopped the VM; after any
    // other kill the guardian connects and detaches, and says how long that took.
    eprintln!(
        "guardian: let the VM run {} times after 50 SIGKILLs, in p50 {:.1} ms, max {:.1} ms after glass died; next serial progress line p50 {:.0} ms, max {:.0} ms after the kill",
        resumed_ms.len(),
        percentile(&resumed_ms, 0.5),
        percentile(&resumed_ms, 1.0),
        percentile(&seen_ms, 0.5),
        percentile(&seen_ms, 1.0)
    );
}

#[test]
fn a_sigkilled_glass_leaves_a_keep_vm_guest_running_and_ends_any_other() {
    let _alone = exclusive();
    let dir = build_guest(&scratch("guardian_vm"));
    let image = dir.join("guest-fp.img");
    let elf = dir.join("guest-fp.elf");
    let mut moments = Moments(0x766d_2d6b_696c_6c21);
    // 50 SIGKILLs under --vm: 25 with --keep-vm (the VM runs on), 25 without (it ends).
    for keep in [true, false] {
        for iteration in 0..25 {
            let what = format!(
                "{} iteration {iteration}",
                if keep { "--keep-vm" } else { "--vm" }
            );
            let serial = dir.join(format!("vm-{keep}-{iteration}.serial"));
            let pidfile = dir.join(format!("vm-{keep}-{iteration}.pid"));
            let recording = dir.join(format!("vm-{keep}-{iteration}.glass"));
            let serial_arg = format!("file:{}", serial.display());
            let mut args = vec![
                "record",
                "--vm",
                "-F",
                "997",
                "--symbols",
                elf.to_str().unwrap(),
                "-o",
                recording.to_str().unwrap(),
            ];
            if keep {
                args.push("--keep-vm");
            }
            args.extend(qemu_args(
                image.to_str().unwrap(),
                &serial_arg,
                pidfile.to_str().unwrap(),
            ));
            let mut recorder = Recorder::start(&args, &dir);
            // The moments count from QEMU's start (it boots in about 0.2 s, glass
            // connects when its stub is up): some kills land before glass connects.
            let qemu = qemu_pid(&pidfile, Duration::from_secs(20))
                .unwrap_or_else(|| panic!("{what}: QEMU did not start"));
            let _end = EndOnDrop(qemu);
            let delay = moments.next_ms(20, 600);
            std::thread::sleep(Duration::from_millis(delay));
            assert_ram_is_a_memfd(qemu, recorder.pid(), &dir, &what);
            recorder.kill(libc::SIGKILL);
            let glass_pid = recorder.pid();
            if keep {
                // Boot included: QEMU may still be starting the guest.
                let before = progress(&serial);
                let first = progress_within(&serial, before, Duration::from_secs(3));
                recorder.exit_status();
                recorder.wait_guardian(&what);
                // It keeps going.
                let later = progress(&serial);
                let again = progress_within(&serial, later, Duration::from_secs(2));
                let alive = !gone(qemu);
                // SAFETY: QEMU is ours to end now (SIGTERM: it removes its socket).
                unsafe { libc::kill(qemu, libc::SIGTERM) };
                assert!(wait_gone(qemu, Duration::from_secs(5)), "{what}");
                let stderr = recorder.stderr(&what);
                assert!(
                    first.is_some() && again.is_some() && alive,
                    "{what} (SIGKILL {delay} ms after QEMU started): the guest did not run on ({first:?}, {again:?}, QEMU alive: {alive}); {stderr}"
                );
                assert!(
                    stderr.contains("left running, --keep-vm"),
                    "{what}: {stderr}"
                );
            } else {
                let (_, stderr) = recorder.finish(&what);
                assert!(
                    wait_gone(qemu, Duration::from_secs(5)),
                    "{what} (SIGKILL {delay} ms after QEMU started): QEMU is still there; {stderr}"
                );
                assert!(stderr.contains("shut the VM down"), "{what}: {stderr}");
            }
            let left = files_of(glass_pid, &dir);
            assert!(left.is_empty(), "{what}: left behind: {left:?}");
        }
    }
}

#[test]
fn normal_endings_say_what_became_of_the_vm() {
    let _alone = exclusive();
    let dir = build_guest(&scratch("guardian_endings"));
    let image = dir.join("guest-fp.img");
    let elf = dir.join("guest-fp.elf");
    // (options, how it ends, the end of the summary's reason, VM still running)
    let cases: [(&[&str], Option<i32>, &str, bool); 4] = [
        (
            &["-d", "1"],
            None,
            "(duration elapsed; VM shut down)",
            false,
        ),
        (
            &["-d", "1", "--keep-vm"],
            None,
            "(duration elapsed; VM left running (--keep-vm): QEMU pid ",
            true,
        ),
        // The signal goes to glass's whole process group, as Ctrl-C at a terminal
        // would: QEMU, in a group of its own, is not hit by it.
        (
            &["--keep-vm"],
            Some(libc::SIGINT),
            "(stopped by SIGINT; VM left running (--keep-vm): QEMU pid ",
            true,
        ),
        (
            &[],
            Some(libc::SIGTERM),
            "(stopped by SIGTERM; VM shut down)",
            false,
        ),
    ];
    for (index, (options, signal, ending, running)) in cases.into_iter().enumerate() {
        let serial = dir.join(format!("end-{index}.serial"));
        let pidfile = dir.join(format!("end-{index}.pid"));
        let recording = dir.join(format!("end-{index}.glass"));
        let serial_arg = format!("file:{}", serial.display());
        let mut args = vec![
            "record",
            "--vm",
            "-F",
            "499",
            "--symbols",
            elf.to_str().unwrap(),
            "-o",
            recording.to_str().unwrap(),
        ];
        args.extend_from_slice(options);
        args.extend(qemu_args(
            image.to_str().unwrap(),
            &serial_arg,
            pidfile.to_str().unwrap(),
        ));
        let mut recorder = Recorder::start(&args, &dir);
        let qemu = qemu_pid(&pidfile, Duration::from_secs(20)).expect("QEMU starts");
        let _end = EndOnDrop(qemu);
        if let Some(signal) = signal {
            // Sampling for a while first.
            assert!(progress_within(&serial, 2, Duration::from_secs(10)).is_some());
            std::thread::sleep(Duration::from_millis(300));
            // SAFETY: signalling the test's own child's process group.
            unsafe { libc::kill(-recorder.pid(), signal) };
        }
        let glass_pid = recorder.pid();
        let status = recorder.exit_status();
        recorder.wait_guardian(ending);
        let ran_on = running.then(|| {
            let before = progress(&serial);
            let ran_on = progress_within(&serial, before, Duration::from_secs(3));
            // SAFETY: QEMU is ours to end now (SIGTERM: it removes its socket).
            unsafe { libc::kill(qemu, libc::SIGTERM) };
            assert!(wait_gone(qemu, Duration::from_secs(5)));
            ran_on
        });
        let stderr = recorder.stderr(ending);
        assert_eq!(status.code(), Some(0), "{stderr}");
        assert!(stderr.contains(ending), "expected {ending:?} in: {stderr}");
        assert!(!stderr.contains("its guardian"), "{stderr}");
        match ran_on {
            Some(ran_on) => {
                assert!(ran_on.is_some(), "{ending}: the guest did not run on");
                assert!(
                    stderr.contains(&format!("QEMU pid {qemu}, GDB stub at ")),
                    "{stderr}"
                );
            }
            None => assert!(gone(qemu), "{ending}: QEMU still runs"),
        }
        let left = files_of(glass_pid, &dir);
        assert!(left.is_empty(), "left behind: {left:?}");
    }
}

#[test]
fn bad_input_says_what_is_wrong_in_one_line() {
    let _alone = exclusive();
    let dir = build_guest(&scratch("guardian_bad_input"));
    let elf = dir.join("guest-fp.elf");
    let image = dir.join("guest-fp.img");
    let text = dir.join("notes.txt");
    std::fs::write(&text, "not an image\n").unwrap();
    let out = dir.join("bad.glass");
    let out = out.to_str().unwrap();
    let qemu = ["qemu-system-x86_64", "-accel", "tcg", "-display", "none"];
    let cases: Vec<(Vec<&str>, String)> = vec![
        (
            // --symbols that is not an image (checked before connecting).
            vec![
                "record",
                "--gdb",
                "127.0.0.1:9",
                "--symbols",
                text.to_str().unwrap(),
                "-o",
                out,
            ],
            format!(
                "{}: neither an ELF file nor an nm -n symbol table",
                text.display()
            ),
        ),
        (
            [&["record", "--vm", "-o", out, "--"][..], &qemu[..]].concat(),
            "--vm needs -kernel in the QEMU command or --symbols".into(),
        ),
        (
            // A "QEMU" that exits at once, without a word.
            vec![
                "record",
                "--vm",
                "--symbols",
                elf.to_str().unwrap(),
                "-o",
                out,
                "--",
                "false",
                "-kernel",
                image.to_str().unwrap(),
            ],
            "the VM did not start: false exited before its GDB stub came up (exit status: 1)"
                .into(),
        ),
        (
            [
                &["record", "--vm", "-o", out, "--"][..],
                &qemu[..],
                &["-m", "12Q", "-kernel", image.to_str().unwrap()][..],
            ]
            .concat(),
            "-m 12Q: unknown unit".into(),
        ),
        (
            [
                &["record", "--vm", "-o", out, "--"][..],
                &qemu[..],
                &["-gdb", "tcp::1234", "-kernel", image.to_str().unwrap()][..],
            ]
            .concat(),
            "--vm adds its own -gdb and memory backend".into(),
        ),
    ];
    for (args, message) in cases {
        let output = glass(&args);
        assert_clean_failure(&output, 2, &message);
        assert!(!stderr(&output).contains("NUL"), "{}", stderr(&output));
    }
}

/// Records for ~3 s, SIGKILLs glass, and checks what the file kept: samples up to a
/// second before the kill (sample times are counted from the wall-clock start in the
/// meta, so how long glass took to start does not matter).
fn unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

fn kill_after_3s(args: &[&str], recording: &Path, dir: &Path, what: &str) {
    let mut recorder = Recorder::start(args, dir);
    std::thread::sleep(Duration::from_secs(3));
    recorder.kill(libc::SIGKILL);
    let killed_at = unix_ns();
    // The launched program (in glass's process group) goes too.
    // SAFETY: signalling the test's own child's process group.
    unsafe { libc::kill(-recorder.pid(), libc::SIGKILL) };
    let _ = recorder.finish(what);
    let kept = glass_format::read_file(recording).expect("a readable prefix");
    assert!(!kept.complete, "{what}");
    let start = kept
        .meta
        .as_ref()
        .expect("the meta is written first")
        .start_unix_ns;
    let last_ns = kept
        .samples
        .iter()
        .map(|s| s.time_ns)
        .chain(kept.snapshots.iter().map(|s| s.time_ns))
        .max()
        .unwrap_or(0);
    let last_at = start + last_ns;
    assert!(
        last_at + 1_000_000_000 >= killed_at,
        "{what}: the last sample kept was taken {:.3} s before the kill ({} samples)",
        killed_at.saturating_sub(last_at) as f64 / 1e9,
        kept.samples.len()
    );
    let info = glass(&["info", recording.to_str().unwrap()]);
    assert!(info.status.success(), "{what}: {}", stderr(&info));
    assert!(
        stdout(&info).contains("the recorder stopped before finishing the file"),
        "{what}: {}",
        stdout(&info)
    );
    let report = glass(&["report", recording.to_str().unwrap()]);
    assert!(report.status.success(), "{what}: {}", stderr(&report));
    eprintln!(
        "{what}: samples kept up to {:.2} s before the kill",
        killed_at.saturating_sub(last_at) as f64 / 1e9
    );
}

#[test]
fn a_killed_recording_keeps_all_but_its_last_second() {
    let _alone = exclusive();
    let dir = build_guest(&scratch("guardian_loss"));
    let split = compile(&dir, "split.c", "split", &[]);
    let perf_allowed = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .is_ok_and(|level| level.trim().parse::<i32>().is_ok_and(|l| l <= 2));
    for backend in ["ptrace", "perf"] {
        if backend == "perf" && !perf_allowed {
            eprintln!("perf_event_open is not permitted here: perf backend not checked");
            continue;
        }
        let recording = dir.join(format!("{backend}.glass"));
        kill_after_3s(
            &[
                "record",
                "-F",
                "999",
                "--backend",
                backend,
                "-o",
                recording.to_str().unwrap(),
                "--",
                split.to_str().unwrap(),
                "100000000",
            ],
            &recording,
            &dir,
            backend,
        );
    }
    let vm = Vm::start_with(&dir, "guest-fp.img", "loss", 1);
    vm.assert_running();
    let recording = dir.join("gdbstub.glass");
    kill_after_3s(
        &[
            "record",
            "-F",
            "997",
            "--gdb",
            vm.socket.to_str().unwrap(),
            "--symbols",
            dir.join("guest-fp.elf").to_str().unwrap(),
            "--guest-memory",
            vm.ram.to_str().unwrap(),
            "-o",
            recording.to_str().unwrap(),
        ],
        &recording,
        &dir,
        "gdbstub",
    );
    vm.assert_running();
}

/// The default stop bound (GLASS_STOP_BOUND_MS unset).
const BOUND: Duration = Duration::from_millis(50);
/// What the bound's enforcement may add on a loaded 2-core machine: the guardian's look
/// every 5 ms, SIGKILL and the exit of glass, the kernel releasing its tracees or the
/// guardian's detach through the stub, and the test's own 1 ms polling.
const SLACK: Duration = Duration::from_millis(150);

/// Waits (polling every ms) until glass `pid` is stopped (`T`); the moment it was seen.
fn seen_stopped(pid: i32, what: &str) -> Instant {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        if process_state(pid) == Some('T') {
            return Instant::now();
        }
        assert!(Instant::now() < until, "{what}: glass never stopped itself");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The process glass launched: the one running `program` (a fixture in the test's own
/// directory; found also once glass is gone and it has another parent).
fn launched(program: &Path) -> i32 {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let found = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .find_map(|e| {
                let pid = e.file_name().to_string_lossy().parse::<i32>().ok()?;
                (std::fs::read_link(e.path().join("exe")).ok()? == program).then_some(pid)
            });
        if let Some(pid) = found {
            return pid;
        }
        assert!(
            Instant::now() < until,
            "glass did not launch {}",
            program.display()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The state letters of every thread of `pid`.
fn thread_states(pid: i32) -> String {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|task| state_of(&task.path().join("stat")))
        .collect()
}

/// Waits until no thread of `pid` is in a ptrace stop; the moment, if within `limit`.
fn threads_released(pid: i32, limit: Duration) -> Option<Instant> {
    let until = Instant::now() + limit;
    loop {
        let states = thread_states(pid);
        if !states.is_empty() && !states.contains('t') {
            return Some(Instant::now());
        }
        if Instant::now() > until {
            return None;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Whether glass was killed by SIGKILL (its guardian's doing here).
fn killed(status: std::process::ExitStatus) -> bool {
    use std::os::unix::process::ExitStatusExt;
    status.signal() == Some(libc::SIGKILL)
}

/// `glass record --backend ptrace` of the two-thread fixture with the test hook that
/// makes glass stop itself (SIGSTOP) inside sample `sample`, right after the first thread
/// stopped. Returns glass, the target's pid and the moment glass was seen stopped.
fn ptrace_stopped_in_sample(
    dir: &Path,
    threads: &Path,
    name: &str,
    sample: u32,
    env: &[(&str, &str)],
) -> (Recorder, i32, Instant) {
    let recording = dir.join(format!("{name}.glass"));
    let sample = sample.to_string();
    let mut env = env.to_vec();
    env.push(("GLASS_TEST_STOP_IN_SAMPLE", &sample));
    let recorder = Recorder::start_with_env(
        &[
            "record",
            "--backend",
            "ptrace",
            "-F",
            "999",
            "-o",
            recording.to_str().unwrap(),
            "--",
            threads.to_str().unwrap(),
            "100000000",
        ],
        dir,
        &env,
    );
    let target = launched(threads);
    let stopped = seen_stopped(recorder.pid(), name);
    (recorder, target, stopped)
}

/// Ends the launched fixture (glass is gone; the fixture runs on, as when glass dies).
fn end_target(pid: i32) {
    // SAFETY: the fixture this test launched through glass.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let _ = wait_gone(pid, Duration::from_secs(5));
}

#[test]
fn a_stopped_glass_does_not_hold_a_traced_process_stopped() {
    let _alone = exclusive();
    let dir = scratch("guardian_ptrace_bound");
    let threads = compile(&dir, "threads.c", "threads", &["-pthread"]);
    let mut released_ms = Vec::new();
    for iteration in 0..8u32 {
        let what = format!("ptrace iteration {iteration}");
        let (mut recorder, target, stopped) =
            ptrace_stopped_in_sample(&dir, &threads, &what, 20 + 13 * iteration, &[]);
        let _end = EndOnDrop(target);
        // Every thread of the target runs again within the bound: the guardian killed
        // glass, and the kernel released the tracees of the dead tracer.
        let released = threads_released(target, Duration::from_secs(5));
        let status = recorder.exit_status();
        let states = thread_states(target);
        // The launched program was not killed: it runs, and uses its CPU (within 2 s:
        // the clock ticks are 10 ms, and the machine may be loaded).
        let cpu_before = cpu_ticks(target);
        let until = Instant::now() + Duration::from_secs(2);
        while cpu_ticks(target) == cpu_before && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        let cpu_after = cpu_ticks(target);
        let states_after = thread_states(target);
        end_target(target);
        let stderr = recorder.finish(&what).1;
        let released = released.unwrap_or_else(|| {
            panic!("{what}: threads still stopped 5 s after glass stopped ({states}); {stderr}")
        });
        let took = released.duration_since(stopped);
        released_ms.push(took.as_secs_f64() * 1e3);
        assert!(
            took <= BOUND + SLACK,
            "{what}: threads released {took:?} after glass was seen stopped; {stderr}"
        );
        assert!(killed(status), "{what}: {status}; {stderr}");
        assert!(
            cpu_after > cpu_before,
            "{what}: the target made no progress in 2 s (threads {states_after})"
        );
        assert!(
            stderr.contains("past the stop bound of 50 ms (GLASS_STOP_BOUND_MS)")
                && stderr.contains("the kernel let its threads run"),
            "{what}: {stderr}"
        );
        assert_eq!(
            stderr.matches("its guardian").count(),
            1,
            "{what}: one line from the guardian: {stderr}"
        );
        // What glass flushed stays readable.
        let kept =
            glass_format::read_file(&dir.join(format!("{what}.glass"))).expect("a readable prefix");
        assert!(!kept.complete, "{what}");
    }
    released_ms.sort_by(f64::total_cmp);
    eprintln!(
        "ptrace: glass stopped inside a sample 8 times; every thread ran again p50 {:.0} ms, max {:.0} ms after glass was seen stopped (bound 50 ms)",
        percentile(&released_ms, 0.5),
        percentile(&released_ms, 1.0)
    );
}

#[test]
fn the_stop_bound_is_glass_stop_bound_ms() {
    let _alone = exclusive();
    let dir = scratch("guardian_bound_setting");
    let threads = compile(&dir, "threads.c", "threads", &["-pthread"]);
    // A bound of a minute: the hook does hold the threads stopped (what the guardian
    // is there for), until glass is killed.
    let (mut recorder, target, _) = ptrace_stopped_in_sample(
        &dir,
        &threads,
        "long-bound",
        30,
        &[("GLASS_STOP_BOUND_MS", "60000")],
    );
    let _end = EndOnDrop(target);
    assert!(
        threads_released(target, Duration::from_millis(700)).is_none(),
        "with a bound of 60 s the threads ran while glass was stopped in a sample: {}",
        thread_states(target)
    );
    recorder.kill(libc::SIGKILL);
    assert!(threads_released(target, Duration::from_secs(2)).is_some());
    end_target(target);
    let (_, stderr) = recorder.finish("long-bound");
    assert!(!stderr.contains("its guardian"), "{stderr}");
    // 300 ms: released after the bound, not before.
    let (mut recorder, target, stopped) = ptrace_stopped_in_sample(
        &dir,
        &threads,
        "300ms",
        30,
        &[("GLASS_STOP_BOUND_MS", "300")],
    );
    let _end_too = EndOnDrop(target);
    let released = threads_released(target, Duration::from_secs(5));
    let status = recorder.exit_status();
    end_target(target);
    let (_, stderr) = recorder.finish("300ms");
    let took = released.expect("released").duration_since(stopped);
    assert!(
        took >= Duration::from_millis(250) && took <= Duration::from_millis(300) + SLACK,
        "bound 300 ms: released after {took:?}; {stderr}"
    );
    assert!(killed(status), "{status}");
    assert!(stderr.contains("past the stop bound of 300 ms"), "{stderr}");
    // Bad values: one line, exit 2, before anything starts.
    for bad in ["", "abc", "0", "4", "-50", "60001", "50ms", "1e3"] {
        let output = Command::new(GLASS)
            .args(["record", "--backend", "ptrace", "-o"])
            .arg(dir.join("bad.glass"))
            .args(["--", threads.to_str().unwrap(), "1"])
            .env("GLASS_STOP_BOUND_MS", bad)
            .output()
            .unwrap();
        assert_clean_failure(
            &output,
            2,
            &format!(
                "GLASS_STOP_BOUND_MS={bad}: the stop bound must be a whole number of milliseconds from 5 to 60000 (default 50)"
            ),
        );
        assert!(!dir.join("bad.glass").exists(), "{bad:?}: a file was left");
    }
}

#[test]
fn a_stopped_glass_does_not_hold_the_vm_stopped() {
    let _alone = exclusive();
    let dir = build_guest(&scratch("guardian_vm_bound"));
    let vm = Vm::start_with(&dir, "guest-fp.img", "bound", 1);
    vm.assert_running();
    let elf = dir.join("guest-fp.elf");
    let image = dir.join("guest-fp.img");
    let mut resumed_ms = Vec::new();
    // --gdb five times, --vm --keep-vm twice, --vm once (that VM is ended, as when
    // glass dies).
    for iteration in 0..8u32 {
        let mode = match iteration {
            0..5 => "gdb",
            5..7 => "keep-vm",
            _ => "vm",
        };
        let what = format!("{mode} iteration {iteration}");
        let recording = dir.join(format!("vm-bound-{iteration}.glass"));
        let serial = dir.join(format!("vm-bound-{iteration}.serial"));
        let pidfile = dir.join(format!("vm-bound-{iteration}.pid"));
        let serial_arg = format!("file:{}", serial.display());
        let mut args = vec![
            "record",
            "-F",
            "997",
            "--symbols",
            elf.to_str().unwrap(),
            "-o",
            recording.to_str().unwrap(),
        ];
        if mode == "gdb" {
            args.extend([
                "--gdb",
                vm.socket.to_str().unwrap(),
                "--guest-memory",
                vm.ram.to_str().unwrap(),
            ]);
        } else {
            args.push("--vm");
            if mode == "keep-vm" {
                args.push("--keep-vm");
            }
            args.extend(qemu_args(
                image.to_str().unwrap(),
                &serial_arg,
                pidfile.to_str().unwrap(),
            ));
        }
        let sample = (40 + 17 * iteration).to_string();
        let mut recorder =
            Recorder::start_with_env(&args, &dir, &[("GLASS_TEST_STOP_IN_SAMPLE", &sample)]);
        let qemu = (mode != "gdb").then(|| {
            qemu_pid(&pidfile, Duration::from_secs(20))
                .unwrap_or_else(|| panic!("{what}: QEMU did not start"))
        });
        let _end = qemu.map(EndOnDrop);
        let serial = if mode == "gdb" {
            vm.serial.clone()
        } else {
            serial
        };
        let stopped = seen_stopped(recorder.pid(), &what);
        let status = recorder.exit_status();
        let exited = Instant::now();
        let before = progress(&serial);
        recorder.wait_guardian(&what);
        let ran_on =
            (mode != "vm").then(|| progress_within(&serial, before, Duration::from_secs(2)));
        if let Some(qemu) = qemu {
            if mode == "keep-vm" {
                // SAFETY: QEMU is ours to end now (SIGTERM: it removes its socket).
                unsafe { libc::kill(qemu, libc::SIGTERM) };
            }
            assert!(
                wait_gone(qemu, Duration::from_secs(5)),
                "{what}: QEMU still runs"
            );
        }
        let stderr = recorder.stderr(&what);
        assert!(killed(status), "{what}: {status}; {stderr}");
        assert!(
            stderr.contains("glass held the VM stopped for ")
                && stderr.contains("past the stop bound of 50 ms (GLASS_STOP_BOUND_MS)"),
            "{what}: {stderr}"
        );
        assert_eq!(
            stderr.matches("its guardian killed it").count(),
            1,
            "{what}: one line from the guardian: {stderr}"
        );
        if mode == "vm" {
            assert!(stderr.contains("shut the VM down"), "{what}: {stderr}");
            continue;
        }
        assert!(
            ran_on.flatten().is_some(),
            "{what}: the guest made no progress after glass was killed; {stderr}"
        );
        // The VM runs again when the guardian's detach is done: glass's exit plus the
        // time the guardian says the detach took.
        let detach = guardian_ms(&stderr).unwrap_or_else(|| panic!("{what}: {stderr}"));
        let took = exited.duration_since(stopped) + Duration::from_secs_f64(detach / 1e3);
        resumed_ms.push(took.as_secs_f64() * 1e3);
        assert!(
            took <= BOUND + SLACK,
            "{what}: the VM ran again {took:?} after glass was seen stopped; {stderr}"
        );
    }
    vm.assert_running();
    resumed_ms.sort_by(f64::total_cmp);
    eprintln!(
        "VM: glass stopped inside a sample 7 times (--gdb, --vm --keep-vm); the VM ran again p50 {:.0} ms, max {:.0} ms after glass was seen stopped (bound 50 ms)",
        percentile(&resumed_ms, 0.5),
        percentile(&resumed_ms, 1.0)
    );
}

#[test]
fn a_vm_held_by_a_stopped_glass_stays_stopped_only_under_a_long_bound() {
    let _alone = exclusive();
    let dir = build_guest(&scratch("guardian_vm_long_bound"));
    let vm = Vm::start_with(&dir, "guest-fp.img", "longbound", 1);
    vm.assert_running();
    let elf = dir.join("guest-fp.elf");
    let recording = dir.join("long.glass");
    let mut recorder = Recorder::start_with_env(
        &[
            "record",
            "-F",
            "997",
            "--gdb",
            vm.socket.to_str().unwrap(),
            "--symbols",
            elf.to_str().unwrap(),
            "--guest-memory",
            vm.ram.to_str().unwrap(),
            "-o",
            recording.to_str().unwrap(),
        ],
        &dir,
        &[
            ("GLASS_TEST_STOP_IN_SAMPLE", "60"),
            ("GLASS_STOP_BOUND_MS", "60000"),
        ],
    );
    seen_stopped(recorder.pid(), "long bound");
    // The hook holds the VM stopped (the guest prints nothing) until glass dies.
    let before = vm.progress();
    assert!(
        progress_within(&vm.serial, before, Duration::from_millis(1500)).is_none(),
        "the guest ran while glass was stopped inside a sample"
    );
    recorder.kill(libc::SIGKILL);
    let (_, stderr) = recorder.finish("long bound");
    assert!(
        stderr.contains("glass ended without finishing the recording; its guardian let the VM run"),
        "{stderr}"
    );
    vm.assert_running();
}

#[test]
fn a_glass_waiting_for_a_stopped_vmm_is_not_killed() {
    let _alone = exclusive();
    let dir = build_guest(&scratch("guardian_slow_vmm"));
    let vm = Vm::start_with(&dir, "guest-fp.img", "slowvmm", 1);
    vm.assert_running();
    let elf = dir.join("guest-fp.elf");
    let recording = dir.join("slow.glass");
    let recorder = Recorder::start(
        &[
            "record",
            "-F",
            "997",
            "-d",
            "3",
            "--gdb",
            vm.socket.to_str().unwrap(),
            "--symbols",
            elf.to_str().unwrap(),
            "--guest-memory",
            vm.ram.to_str().unwrap(),
            "-o",
            recording.to_str().unwrap(),
        ],
        &dir,
    );
    // QEMU itself stops answering for 400 ms, three times: glass's stop of the VM then
    // lasts that long, but glass is waiting for the stub (asleep, not stalled), and
    // killing it would not end the stop sooner; it is left alone.
    let qemu = vm.child.id() as i32;
    std::thread::sleep(Duration::from_millis(800));
    for _ in 0..3 {
        // SAFETY: the QEMU this test started.
        unsafe { libc::kill(qemu, libc::SIGSTOP) };
        std::thread::sleep(Duration::from_millis(400));
        // SAFETY: as above.
        unsafe { libc::kill(qemu, libc::SIGCONT) };
        std::thread::sleep(Duration::from_millis(300));
    }
    let (status, stderr) = recorder.finish("slow VMM");
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("its guardian"), "{stderr}");
    let summary = glass_format::read_file(&recording).expect("a whole recording");
    assert!(summary.complete);
    // The recording saw those long stops (its maximum stopped time per sample).
    let max_us: f64 = stderr
        .split("stopped per sample: ")
        .nth(1)
        .and_then(|rest| rest.split("max ").nth(1))
        .and_then(|rest| rest.split(" us").next())
        .and_then(|us| us.parse().ok())
        .unwrap_or_else(|| panic!("no maximum stopped time: {stderr}"));
    assert!(max_us > 300_000.0, "max stopped {max_us} us: {stderr}");
    vm.assert_running();
}
