//! Shared helpers for the end-to-end tests: compile a fixture with gcc, run glass, and
//! read its folded output.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub const GLASS: &str = env!("CARGO_BIN_EXE_glass");

/// tests/fixtures/trace/`source`, a Go program built with cgo by Go's toolchain (./x test
/// installs golang-go), its build cache and GOPATH in `dir`.
pub fn go_build(dir: &Path, source: &str) -> PathBuf {
    let out = dir.join(source.trim_end_matches(".go"));
    let output = Command::new("go")
        .args(["build", "-o"])
        .arg(&out)
        .arg(fixtures_dir().join("trace").join(source))
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

/// The repository's root (the workspace), where guests/, tests/fixtures and target/ are.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn fixtures_dir() -> PathBuf {
    repo().join("tests/fixtures")
}

/// A fresh directory for one test's binaries and recordings.
pub fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Compiles `tests/fixtures/<source>` into `dir/<output>` with frame pointers.
pub fn compile(dir: &Path, source: &str, output: &str, extra: &[&str]) -> PathBuf {
    let out = dir.join(output);
    let status = Command::new("gcc")
        .args(["-O2", "-g", "-fno-omit-frame-pointer"])
        .arg(fixtures_dir().join(source))
        .arg("-o")
        .arg(&out)
        .args(extra)
        .status()
        .expect("gcc runs");
    assert!(status.success(), "gcc failed for {source}");
    out
}

/// Compiles `tests/fixtures/<source>` into the shared library `dir/<output>`.
pub fn compile_library(dir: &Path, source: &str, output: &str, extra: &[&str]) -> PathBuf {
    compile(
        dir,
        source,
        output,
        &[&["-shared", "-fPIC"], extra].concat(),
    )
}

pub fn glass(args: &[&str]) -> Output {
    Command::new(GLASS).args(args).output().expect("glass runs")
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Records `command` with glass at `hz`, asserting success.
pub fn record(recording: &Path, hz: u32, command: &[&str]) -> Output {
    record_with(recording, hz, &[], command)
}

/// Records with extra options (`--backend ptrace`, `--unwind fp`, ...).
pub fn record_with(recording: &Path, hz: u32, options: &[&str], command: &[&str]) -> Output {
    let hz = hz.to_string();
    let mut args = vec!["record", "-F", &hz, "-o", recording.to_str().unwrap()];
    args.extend_from_slice(options);
    args.push("--");
    args.extend_from_slice(command);
    let output = glass(&args);
    assert!(
        output.status.success(),
        "glass record failed: {}",
        stderr(&output)
    );
    output
}

/// `glass report RECORDING ARGS` with its command adjusted first by `configure` (an
/// environment variable, say), asserting success.
pub fn report_output(
    recording: &Path,
    args: &[&str],
    configure: impl FnOnce(&mut Command),
) -> Output {
    let mut command = Command::new(GLASS);
    command.arg("report").arg(recording).args(args);
    configure(&mut command);
    let output = command.output().expect("glass runs");
    assert!(
        output.status.success(),
        "glass report {} {args:?}: {}",
        recording.display(),
        stderr(&output)
    );
    output
}

/// What `glass report RECORDING ARGS` prints, asserting success.
pub fn report(recording: &Path, args: &[&str]) -> String {
    stdout(&report_output(recording, args, |_| {}))
}

/// `glass report --format folded` as (stack frames root first, count).
pub fn folded(recording: &Path, extra: &[&str]) -> Vec<(Vec<String>, u64)> {
    let mut args = vec!["report", recording.to_str().unwrap(), "--format", "folded"];
    args.extend_from_slice(extra);
    let output = glass(&args);
    assert!(
        output.status.success(),
        "glass report failed: {}",
        stderr(&output)
    );
    stdout(&output)
        .lines()
        .filter(|line| !line.is_empty())
        .map(|line| {
            let (stack, count) = line.rsplit_once(' ').expect("folded line has a count");
            (
                stack.split(';').map(str::to_string).collect(),
                count.parse().expect("count"),
            )
        })
        .collect()
}

/// How far a share (percent) measured from `samples` samples may stray from the true
/// `percent` by chance before a test calls it wrong: four standard errors of a binomial
/// share (about one run in 16 000), and never less than `floor` points (the bias the
/// test accepts). A sampled split is a count, not a measurement: its noise shrinks only
/// with more samples, so a fixed bound fails now and then on a short or slow run.
pub fn share_tolerance(percent: f64, samples: u64, floor: f64) -> f64 {
    let p = (percent / 100.0).clamp(0.0, 1.0);
    let standard_error = 100.0 * (p * (1.0 - p) / samples.max(1) as f64).sqrt();
    (4.0 * standard_error).max(floor)
}

/// Waits (20 s at most) until a recording being written has `bytes` bytes: samples are
/// in it, however slowly a loaded machine got glass started.
pub fn wait_for_recording(path: &Path, bytes: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::fs::metadata(path).map_or(0, |m| m.len()) < bytes {
        assert!(
            std::time::Instant::now() < deadline,
            "{} did not reach {bytes} bytes in 20 s",
            path.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

pub fn total(stacks: &[(Vec<String>, u64)]) -> u64 {
    stacks.iter().map(|(_, n)| n).sum()
}

/// Samples whose stack contains `function`, and whose leaf is `function`.
pub fn samples_in(stacks: &[(Vec<String>, u64)], function: &str) -> u64 {
    stacks
        .iter()
        .filter(|(frames, _)| frames.iter().any(|f| f == function))
        .map(|(_, n)| n)
        .sum()
}

pub fn self_samples(stacks: &[(Vec<String>, u64)]) -> BTreeMap<String, u64> {
    let mut by_leaf = BTreeMap::new();
    for (frames, n) in stacks {
        *by_leaf
            .entry(frames.last().cloned().unwrap_or_default())
            .or_insert(0) += n;
    }
    by_leaf
}

/// Asserts a failure is one clear line with the given exit code and no panic.
pub fn assert_clean_failure(output: &Output, code: i32, needle: &str) {
    let err = stderr(output);
    assert_eq!(output.status.code(), Some(code), "stderr: {err}");
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "expected one line, got: {err}"
    );
    assert!(err.starts_with("glass: "), "{err}");
    assert!(err.contains(needle), "expected {needle:?} in: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// The ptrace sampler counts wall-clock time: a target that waits for a CPU is sampled
/// where it waits. Tests that check a known split hold this lock so that two sampled
/// workloads of the same test binary never compete for the two cores.
pub fn exclusive() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Builds guests/`guest` (its build.sh) into `dir` with the script's further `args`;
/// returns `dir`.
pub fn build_guest_image(guest: &str, dir: &Path, args: &[&str]) -> PathBuf {
    let script = repo().join("guests").join(guest).join("build.sh");
    let output = Command::new(&script)
        .arg(dir)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{} runs: {e}", script.display()));
    assert!(
        output.status.success(),
        "guests/{guest}/build.sh failed (./x test installs what it needs): {}",
        stderr(&output)
    );
    dir.to_path_buf()
}

/// How many rounds a campaign-style test (many kills, cycles or mutants) runs: `short` in
/// the suite, which must stay inside CI's time, and `full` when `./x bench soak` runs it
/// with GLASS_SOAK=1 (docs/testing.md). The checks of each round are the same either way.
pub fn campaign(short: usize, full: usize) -> usize {
    if std::env::var_os("GLASS_SOAK").is_some_and(|v| v != "0") {
        full
    } else {
        short
    }
}

/// Installs Debian's `package` (`apt-get update`, then `install`), as ./x installs what
/// it needs: the tests run as root on Debian.
pub fn apt_install(package: &str) {
    for args in [
        &["update", "-qq"][..],
        &["install", "-y", "-qq", package][..],
    ] {
        let status = Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(std::process::Stdio::null())
            .status()
            .expect("apt-get runs (Debian; root)");
        assert!(status.success(), "apt-get {args:?} failed");
    }
}

/// perf's self share (percent of all samples) of each user-space symbol in `perf_data`
/// (`perf report --no-children --sort sym`): the `[.]` rows, the kernel's left out.
pub fn perf_user_self_shares(perf_data: &Path) -> std::collections::HashMap<String, f64> {
    let report = Command::new("perf")
        .args(["report", "-i"])
        .arg(perf_data)
        .args(["--no-children", "--sort", "sym", "--stdio", "-g", "none"])
        .output()
        .expect("perf runs");
    let mut shares = std::collections::HashMap::new();
    for line in stdout(&report).lines() {
        // "    36.34%  [.] _PyEval_EvalFrameDefault"
        let Some((percent, rest)) = line.trim().split_once('%') else {
            continue;
        };
        let Ok(percent) = percent.trim().parse::<f64>() else {
            continue;
        };
        if let Some(name) = rest.trim().strip_prefix("[.] ") {
            *shares.entry(name.trim().to_string()).or_insert(0.0) += percent;
        }
    }
    shares
}

mod procfs;
#[allow(unused_imports)]
pub use procfs::*;

mod attached;
#[allow(unused_imports)]
pub use attached::*;

/// The last whole `split ...` line of a guest console. Consoles are copied while the
/// guest writes them, so the last line may be cut anywhere (a CI run's was): a line
/// without its newline is never read, so a cut number is never taken for a count.
pub fn last_split_line(console: &str) -> Option<&str> {
    console[..console.rfind('\n').map_or(0, |end| end + 1)]
        .lines()
        .rev()
        .find(|l| l.starts_with("split "))
}

mod guest_vm;
#[allow(unused_imports)]
pub use guest_vm::*;

mod linux_work;
#[allow(unused_imports)]
pub use linux_work::*;

mod arm_vm;
#[allow(unused_imports)]
pub use arm_vm::*;

mod trace_counts;
#[allow(unused_imports)]
pub use trace_counts::*;

/// Lets `nobody` reach `dir` (every directory above it searchable) and write in it, for
/// tests that run glass as an unprivileged user.
pub fn open_to_nobody(dir: &Path) {
    let _ = Command::new("chmod")
        .args(["-R", "a+rwX"])
        .arg(dir)
        .status();
    let mut parent = dir.parent();
    while let Some(p) = parent {
        let _ = Command::new("chmod").arg("a+x").arg(p).status();
        parent = p.parent();
    }
}

/// `glass ARGS` as the user `nobody`.
pub fn glass_as_nobody(args: &[&str]) -> Output {
    Command::new("setpriv")
        .args([
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            "--reset-env",
        ])
        .arg(GLASS)
        .args(args)
        .output()
        .expect("setpriv runs")
}

/// The machine's perf_event_paranoid level (2, the kernel's default, if unreadable).
pub fn perf_event_paranoid() -> i32 {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(2)
}

/// The `glass __trace-guardian` watching glass's attachment to `pid`.
pub fn trace_guardian_of(pid: i32) -> Option<i32> {
    let wanted = format!("__trace-guardian\0--pid\0{pid}\0");
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let candidate: i32 = entry.file_name().to_str()?.parse().ok()?;
            let command = std::fs::read(entry.path().join("cmdline")).ok()?;
            String::from_utf8_lossy(&command)
                .contains(&wanted)
                .then_some(candidate)
        })
}

/// How many rounds of tests/fixtures/python_split.py last about `seconds` under `python`
/// on this machine: a fixed count ran 0.3 s on one host and too short to sample on
/// another, so tests that need a recording of some size time three rounds first.
pub fn python_split_rounds(python: &str, seconds: f64) -> String {
    let script = fixtures_dir().join("python_split.py");
    let started = std::time::Instant::now();
    let status = Command::new(python)
        .args([script.to_str().unwrap(), "3"])
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "{python} python_split.py 3: {status}");
    let per_round = started.elapsed().as_secs_f64() / 3.0;
    ((seconds / per_round).ceil() as u64)
        .clamp(3, 10_000)
        .to_string()
}

/// `glass report --format calls`: (calls, median time per call in ns) per function.
pub fn calls_and_self(recording: &Path) -> std::collections::BTreeMap<String, (u64, f64)> {
    calls_table(recording)
        .into_iter()
        .map(|row| (row.name, (row.calls, row.median_ns)))
        .collect()
}

/// One line of `glass report --format calls`.
pub struct CallsRow {
    pub name: String,
    pub calls: u64,
    pub total_ns: f64,
    pub median_ns: f64,
}

/// `glass report --format calls` of a recording, row by row.
pub fn calls_table(recording: &Path) -> Vec<CallsRow> {
    let output = glass(&["report", recording.to_str().unwrap(), "--format", "calls"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let unit = |value: &str, unit: &str| -> Option<f64> {
        let v: f64 = value.parse().ok()?;
        Some(match unit {
            "ns" => v,
            "µs" => v * 1e3,
            "ms" => v * 1e6,
            "s" => v * 1e9,
            _ => return None,
        })
    };
    stdout(&output)
        .lines()
        .filter_map(|line| {
            // calls, total, self, self cycles, min, p50, ...; the name last.
            let f: Vec<&str> = line.split_whitespace().collect();
            Some(CallsRow {
                calls: f.first()?.parse().ok()?,
                total_ns: unit(f.get(1)?, f.get(2)?)?,
                median_ns: unit(f.get(8)?, f.get(9)?)?,
                name: f.last()?.to_string(),
            })
        })
        .collect()
}
