//! JIT code: frames in anonymous executable memory are named from the runtime's
//! /tmp/perf-PID.map and jitdump files.
//! - a small C "JIT" (tests/fixtures/jit/jitgen.c) describes its code in a jitdump only:
//!   its two functions named, at their known 3:1 split;
//! - node, with both `--perf-basic-prof` (perf map) and `--perf-prof` (jitdump), recorded
//!   by glass and by `perf record -g` at the same time: the hot JS function named, with
//!   its share within 3 points of perf's, through the perf map and through the jitdump
//!   alone.

mod common;
use common::*;

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `glass report` top rows: function -> (self %, self samples, module).
fn top_rows(recording: &Path) -> HashMap<String, (f64, u64, String)> {
    let top = glass(&["report", recording.to_str().unwrap(), "--limit", "100000"]);
    assert!(top.status.success(), "{}", stderr(&top));
    let mut rows = HashMap::new();
    // "  62.64%  62.64%       456       456  JS:*fibHot /tmp/x/fib.js:3:16   perf-1.map"
    for line in stdout(&top).lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() >= 6 && fields[0].ends_with('%') && fields[1].ends_with('%') {
            let (Ok(percent), Ok(samples)) = (
                fields[0].trim_end_matches('%').parse::<f64>(),
                fields[2].parse::<u64>(),
            ) else {
                continue;
            };
            let function = fields[4..fields.len() - 1].join(" ");
            let module = fields[fields.len() - 1].to_string();
            rows.insert(function, (percent, samples, module));
        }
    }
    rows
}

#[cfg(target_arch = "x86_64")]
#[test]
fn code_described_only_by_a_jitdump_is_named() {
    let _alone = exclusive();
    let dir = scratch("jit_jitdump_c");
    let program = dir.join("jitgen");
    let status = Command::new("gcc")
        .args(["-O2", "-fno-omit-frame-pointer", "-o"])
        .arg(&program)
        .arg(fixtures_dir().join("jit/jitgen.c"))
        .status()
        .unwrap();
    assert!(status.success());
    let recording = dir.join("jitgen.glass");
    // In its own directory: jitgen writes jit-PID.dump where it runs.
    let output = Command::new(GLASS)
        .args(["record", "-q", "-F", "999", "-o"])
        .arg(&recording)
        .arg("--")
        .arg(&program)
        .arg("3")
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let pid = stdout(&output)
        .split_whitespace()
        .nth(1)
        .unwrap()
        .to_string();
    let rows = top_rows(&recording);
    let dump = format!("jit-{pid}.dump");
    let (hot, hot_samples, hot_module) = rows.get("jit_hot").cloned().unwrap_or_default();
    let (cold, cold_samples, cold_module) = rows.get("jit_cold").cloned().unwrap_or_default();
    let samples = hot_samples + cold_samples;
    assert!(samples >= 50, "jit_hot and jit_cold named in: {rows:?}");
    assert_eq!(
        (hot_module.as_str(), cold_module.as_str()),
        (&*dump, &*dump)
    );
    // No sample in the JIT code is left unnamed, or named after the stale range the
    // later records override.
    assert!(
        !rows
            .keys()
            .any(|f| f.starts_with("[anon]") || f == "stale_fn"),
        "{rows:?}"
    );
    // The loops run 3:1: the split is 75% give or take sampling noise (five standard
    // deviations for the samples the machine allowed, ~3000 when idle; at least 5 points).
    let split = 100.0 * hot / (hot + cold);
    let tolerance = (5.0 * 100.0 * (0.75 * 0.25 / samples as f64).sqrt()).max(5.0);
    assert!(
        (split - 75.0).abs() < tolerance,
        "jit_hot {hot}% jit_cold {cold}% of {samples} samples"
    );
    // The recording keeps what the file named when the recording ended: with the file
    // gone (runtimes delete theirs at exit), the report names the code as before.
    std::fs::remove_file(dir.join(&dump)).unwrap();
    let again = top_rows(&recording);
    for function in ["jit_hot", "jit_cold"] {
        assert_eq!(
            again.get(function).map(|row| (row.1, row.2.clone())),
            rows.get(function).map(|row| (row.1, row.2.clone())),
            "{function} without the jitdump file: {again:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

const WORKLOAD: &str = "
// Two recursive functions sharing the work about 70/30, interleaved finely so that any
// window of the run has the same split.
function fibHot(n) { return n < 2 ? n : fibHot(n - 1) + fibHot(n - 2); }
function fibCold(n) { return n < 2 ? n : fibCold(n - 1) + fibCold(n - 2); }
const end = Date.now() + 60 * 1000;
let sink = 0;
while (Date.now() < end) {
  for (let i = 0; i < 7; i++) sink += fibHot(18);
  for (let i = 0; i < 3; i++) sink += fibCold(18);
}
console.log(sink);
";

/// perf's self shares per symbol, user space only (perf also samples the kernel, glass
/// does not): renormalized over the user-space rows.
fn perf_user_shares(perf_data: &Path) -> HashMap<String, f64> {
    // Rows like "    67.71%  [.] JS:*fibHot /tmp/jitx/fib.js:3:16".
    let mut shares = perf_user_self_shares(perf_data);
    let user: f64 = shares.values().sum();
    for share in shares.values_mut() {
        *share *= 100.0 / user;
    }
    shares
}

#[test]
fn node_hot_function_named_as_perf_names_it_with_its_share() {
    let _alone = exclusive();
    if Command::new("node").arg("--version").output().is_err() {
        eprintln!("node is not installed: skipped");
        return;
    }
    let dir = scratch("jit_node");
    let script = dir.join("fib.js");
    std::fs::write(&script, WORKLOAD).unwrap();
    // jit-PID.dump goes to node's working directory.
    let node = Command::new("node")
        .args(["--perf-basic-prof", "--perf-prof"])
        .arg(&script)
        .current_dir(&dir)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let pid = node.id();
    let perf_map = format!("/tmp/perf-{pid}.map");
    /// Stops node and removes its perf map, however the test ends.
    struct Cleanup(std::process::Child, String);
    impl Cleanup {
        fn stop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    impl Drop for Cleanup {
        fn drop(&mut self) {
            self.stop();
            let _ = std::fs::remove_file(&self.1);
        }
    }
    // Until node has compiled the hot loop (its optimized code is in the map).
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&perf_map).is_ok_and(|m| m.contains("JS:*fibCold")) {
        assert!(Instant::now() < deadline, "node wrote no {perf_map}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut node = Cleanup(node, perf_map.clone());

    // Both samplers on the same run, for the same seconds, at the same rate (high
    // enough that sampling noise stays well inside the 3 points on a busy machine).
    let seconds = "6";
    let perf_data = dir.join("perf.data");
    let perf = Command::new("perf")
        .args(["record", "-q", "-g", "-F", "2999", "-o"])
        .arg(&perf_data)
        .args(["-p", &pid.to_string(), "--", "sleep", seconds])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("perf is installed (./x test installs linux-perf)");
    let recording = dir.join("node.glass");
    let output = glass(&[
        "record",
        "-q",
        "-F",
        "2999",
        "-d",
        seconds,
        "--pid",
        &pid.to_string(),
        "-o",
        recording.to_str().unwrap(),
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let perf = perf.wait_with_output().unwrap();
    assert!(
        perf.status.success(),
        "perf record: {}",
        String::from_utf8_lossy(&perf.stderr)
    );
    // Its perf map stays until the end of the test, for perf report and glass report.
    node.stop();
    let perf_shares = perf_user_shares(&perf_data);
    let hot_name = perf_shares
        .keys()
        .find(|name| name.starts_with("JS:*fibHot"))
        .cloned()
        .unwrap_or_else(|| panic!("perf names no JS:*fibHot: {perf_shares:?}"));
    let perf_hot = perf_shares[&hot_name];

    let check = |rows: &HashMap<String, (f64, u64, String)>, source: &str| {
        let (glass_hot, samples, module) = rows
            .get(&hot_name)
            .cloned()
            .unwrap_or_else(|| panic!("glass names no {hot_name} ({source}): {rows:?}"));
        eprintln!(
            "{hot_name}: glass {glass_hot:.2}% ({samples} samples, {source}), perf {perf_hot:.2}%"
        );
        assert!(samples > 600, "{samples} samples of {hot_name}");
        assert_eq!(module, source, "{hot_name}'s module");
        assert!(
            (glass_hot - perf_hot).abs() <= 3.0,
            "{hot_name}: glass {glass_hot:.2}% ({source}), perf {perf_hot:.2}%"
        );
        // The hot function is the hot one.
        let cold = rows
            .iter()
            .find(|(name, _)| name.starts_with("JS:*fibCold"))
            .map_or(0.0, |(_, row)| row.0);
        assert!(
            glass_hot > cold + 20.0,
            "fibHot {glass_hot}% fibCold {cold}%"
        );
    };
    // The perf map and the jitdump (mapped by node, so in the recording) both name the
    // code; the recording keeps what they named when it ended, under the jitdump's name.
    let dump = format!("jit-{pid}.dump");
    check(&top_rows(&recording), &dump);
    // Without the files (node deletes neither, other runtimes do): named from the copy.
    std::fs::remove_file(dir.join(&dump)).unwrap();
    std::fs::remove_file(&perf_map).unwrap();
    check(&top_rows(&recording), &dump);
    let _ = std::fs::remove_dir_all(&dir);
}
