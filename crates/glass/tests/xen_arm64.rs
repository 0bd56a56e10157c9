//! `glass record --xen` on Xen on ARM64: Xen 4.17 (Debian's arm64 build) and an arm64 dom0
//! boot under qemu-system-aarch64 (guests/xen-arm64: kit.sh builds the kit, run.sh boots it
//! and runs a script in dom0), and `xen_arm64_dom0.sh` drives the aarch64 build of glass
//! there against the demo unikernel of guests/aarch64 as a 2-vCPU domU: its CFI-only build,
//! its frame-record build, and the endings of glass. Xen and dom0 boot once for this file
//! (about 10 s to dom0's script, 2-3 minutes in all); every test checks its part of what
//! the script left in the output directory.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use common::*;

/// The dom0 script's output directory; a broken environment fails every test with why.
fn xen_run() -> &'static Path {
    static RUN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match RUN.get_or_init(boot_and_run) {
        Ok(out) => out,
        Err(error) => panic!("the nested Xen on ARM64 run failed: {error}"),
    }
}

fn boot_and_run() -> Result<PathBuf, String> {
    let glass = aarch64_glass_built()?;
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    // The kit (Xen, Debian's arm64 kernel and packages) is kept across runs.
    let kit = tmp.join("xen-arm64-kit");
    let built = Command::new(repo().join("guests/xen-arm64/kit.sh"))
        .arg(&kit)
        .status()
        .map_err(|e| format!("guests/xen-arm64/kit.sh: {e}"))?;
    if !built.success() {
        return Err("guests/xen-arm64/kit.sh failed".into());
    }
    let out = scratch("xen-arm64-run");
    std::fs::write(out.join("env"), format!("GLASS={}\n", glass.display())).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/xen_arm64_dom0.sh");
    // 10 s to dom0's script, two xl creates, 30 s of recording and 5 endings: ~3 minutes;
    // 600 s bounds a run whose environment broke (run.sh kills QEMU then: exit 124).
    let status = Command::new(repo().join("guests/xen-arm64/run.sh"))
        .arg(&kit)
        .arg(script)
        .arg(&out)
        .arg("600")
        .env("GLASS_XEN_ARM64_BIND", glass.parent().unwrap())
        .status()
        .map_err(|e| format!("guests/xen-arm64/run.sh: {e}"))?;
    let log = std::fs::read_to_string(out.join("script.log")).unwrap_or_default();
    eprintln!("dom0 script log:\n{log}");
    if !status.success() {
        return Err(format!(
            "guests/xen-arm64/run.sh exited with {status}; logs in {}",
            out.display()
        ));
    }
    Ok(out)
}

fn read(out: &Path, name: &str) -> String {
    std::fs::read_to_string(out.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The guest's cumulative ticks (alpha, beta, gamma, halted, all) from the `time=` field
/// of the last whole split line of a console log.
fn ticks(console: &str) -> Option<[f64; 5]> {
    let text = last_split_line(console)?
        .split_whitespace()
        .find_map(|f| f.strip_prefix("time="))?;
    let v: Vec<f64> = text.split('/').filter_map(|n| n.parse().ok()).collect();
    (v.len() == 5).then(|| [v[0], v[1], v[2], v[3], v[4]])
}

/// The guest's own alpha/beta/gamma split (shares of busy time) and halted share (of all
/// time) over the recording: the difference of its last lines before and after.
fn own_split(out: &Path, variant: &str) -> [f64; 4] {
    let before = read(out, &format!("{variant}.console.before"));
    let after = read(out, &format!("{variant}.console"));
    let start = ticks(&before).unwrap_or_else(|| panic!("no split line with time=: {before}"));
    let end = ticks(&after).unwrap_or_else(|| panic!("no split line with time=: {after}"));
    let d: Vec<f64> = (0..5).map(|i| end[i] - start[i]).collect();
    let busy = d[0] + d[1] + d[2];
    assert!(
        busy > 0.0 && d[4] > 0.0,
        "no work between {start:?} and {end:?}"
    );
    [
        d[0] * 100.0 / busy,
        d[1] * 100.0 / busy,
        d[2] * 100.0 / busy,
        d[3] * 100.0 / d[4],
    ]
}

/// What every recording of the unikernel must show: it ran, per-vCPU separation, the
/// split within the statistical tolerance of the guest's own, whole stacks, idle named.
fn check_profile(variant: &str) -> Vec<(Vec<String>, u64)> {
    let out = xen_run();
    let err = read(out, &format!("{variant}.err"));
    assert_eq!(read(out, &format!("{variant}.rc")).trim(), "0", "{err}");
    assert!(err.contains("ARM64"), "{err}");
    assert!(err.contains("in one multicall per sample"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let recording = out.join(format!("{variant}.glass"));
    let info = stdout(&glass(&["info", recording.to_str().unwrap()]));
    assert!(info.contains("Xen guest"), "{info}");
    assert!(info.contains("aarch64"), "{info}");
    let stacks = folded(&recording, &["--threads"]);

    // vCPU 1 runs delta only, and none of vCPU 0's work shows there.
    let vcpu1: u64 = stacks
        .iter()
        .filter(|(f, _)| f[1].starts_with("vcpu1/"))
        .map(|(_, n)| n)
        .sum();
    let delta = under(&stacks, "vcpu1/", "delta");
    assert!(delta >= 50, "{variant}: {stacks:?}");
    assert!(
        delta as f64 >= 0.97 * vcpu1 as f64,
        "{variant}: {delta} of {vcpu1} vcpu1 samples in delta"
    );
    assert!(
        under(&stacks, "vcpu1/", "secondary_entry") as f64 >= 0.97 * vcpu1 as f64,
        "{variant}: vcpu1's stacks not rooted at secondary_entry: {stacks:?}"
    );
    assert_eq!(under(&stacks, "vcpu1/", "dispatch"), 0, "{variant}");
    assert_eq!(under(&stacks, "vcpu0/", "delta"), 0, "{variant}");

    // vCPU 0's busy split against the guest's own over the same window.
    let own = own_split(out, variant);
    let busy = under(&stacks, "vcpu0/", "dispatch");
    // Under nested TCG a stop costs ms (tens to hundreds on a loaded host): a 53 Hz
    // recording got 4-12 samples a second per vCPU; the tolerance widens with fewer.
    assert!(busy >= 50, "{variant}: {busy} busy samples: {stacks:?}");
    let shares = ["alpha", "beta", "gamma"]
        .map(|function| under(&stacks, "vcpu0/", function) as f64 * 100.0 / busy as f64);
    eprintln!(
        "{variant}: glass's split of {busy} busy samples {shares:.1?}, the guest's own {own:.1?}"
    );
    for (index, function) in ["alpha", "beta", "gamma"].iter().enumerate() {
        let tolerance = share_tolerance(own[index], busy, 3.0);
        assert!(
            (shares[index] - own[index]).abs() <= tolerance,
            "{variant}: {function}: glass {:.1}% vs the guest's own {:.1}% ({tolerance:.1} points allowed)",
            shares[index],
            own[index]
        );
    }
    // Whole stacks: every busy sample reaches the entry point.
    let rooted: u64 = stacks
        .iter()
        .filter(|(f, _)| {
            f.windows(4)
                .any(|w| w == ["kernel_entry", "kmain", "run", "dispatch"])
        })
        .map(|(_, n)| n)
        .sum();
    assert!(
        rooted as f64 >= 0.97 * busy as f64,
        "{variant}: {rooted} of {busy} busy samples rooted at kernel_entry;kmain;run;dispatch"
    );
    // The leaves under their callers (the link register where the leaf kept it).
    for chain in [
        ["dispatch", "alpha", "spin_block"],
        ["dispatch", "gamma", "mix_block"],
    ] {
        let leaf = under(&stacks, "vcpu0/", chain[2]);
        let whole: u64 = stacks
            .iter()
            .filter(|(f, _)| f.windows(3).any(|w| w == chain))
            .map(|(_, n)| n)
            .sum();
        assert!(
            leaf >= 5 && whole as f64 >= 0.97 * leaf as f64,
            "{variant}: {whole} of {leaf} samples in {} under {}",
            chain[2],
            chain[..2].join(";")
        );
    }
    // Idle: what the guest counts as halted runs from its wfi until it runs again: blocked
    // (Xen's getvcpuinfo: [halted]) and then runnable, waiting for pCPU 1, or paused
    // offline when its timer fired during glass's pause (most 4 ms waits end inside a
    // 20-40 ms pause under nested TCG). Its share of vCPU 0's samples is under idle_wait,
    // and every [halted] sample is there.
    let vcpu0: u64 = stacks
        .iter()
        .filter(|(f, _)| f[1].starts_with("vcpu0/"))
        .map(|(_, n)| n)
        .sum();
    let halted = under(&stacks, "vcpu0/", "[halted]");
    let halted_in_idle: u64 = stacks
        .iter()
        .filter(|(f, _)| {
            f.iter().any(|x| x == "idle_wait") && f.last().is_some_and(|x| x == "[halted]")
        })
        .map(|(_, n)| n)
        .sum();
    assert_eq!(
        halted_in_idle, halted,
        "{variant}: [halted] outside idle_wait: {stacks:?}"
    );
    let idle = under(&stacks, "vcpu0/", "idle_wait");
    let idle_share = idle as f64 * 100.0 / vcpu0 as f64;
    eprintln!(
        "{variant}: idle_wait {idle_share:.1}% of vcpu0's {vcpu0} samples ({halted} [halted]), the guest's own halted {:.1}%",
        own[3]
    );
    // The guest's halted time and glass's samples of it do not measure quite the same
    // thing under nested TCG: the guest counts runnable-but-waiting and paused time by
    // its own clock, which glass's pauses shift (seen: 29.3% against 36.0% at host load
    // 14, 37.0-38.9% against 30.0-30.1% in a fresh-clone ./x test). So this bound is
    // the statistical one or 12 points, whichever is wider: it still fails when idle is
    // lost (0%) or taken for work, which is what it is here for.
    assert!(
        (idle_share - own[3]).abs() <= share_tolerance(own[3], vcpu0, 12.0),
        "{variant}: idle_wait {idle_share:.1}% of vcpu0's samples vs the guest's own halted {:.1}%",
        own[3]
    );
    assert!(
        under(&stacks, "vcpu0/", "[unknown]") as f64 <= 0.01 * busy as f64,
        "{variant}: {stacks:?}"
    );
    stacks
}

/// beta's 80-deep recursion (about 48 KiB of stack in 4 KiB pages) whole, the first
/// sample in it always: read in sample order from the speedscope export.
fn check_deep_stacks(variant: &str, stacks: &[(Vec<String>, u64)]) {
    let beta = under(stacks, "vcpu0/", "beta");
    let deep: u64 = stacks
        .iter()
        .filter(|(f, _)| {
            f.windows(2).any(|w| w == ["dispatch", "beta"])
                && f.iter().filter(|x| *x == "descend").count() == 80
        })
        .map(|(_, n)| n)
        .sum();
    assert!(beta >= 20, "{variant}: {beta} beta samples");
    // Later copies are sized from recent walks (glass-record's guest loop) and may be
    // cut after a long shallow spell: the bound of the QEMU AArch64 test.
    assert!(
        deep as f64 >= 0.9 * beta as f64,
        "{variant}: {deep} of {beta} samples in beta hold all 80 descend frames"
    );
    let out = xen_run();
    let path = out.join(format!("{variant}.speedscope.json"));
    let output = glass(&[
        "report",
        out.join(format!("{variant}.glass")).to_str().unwrap(),
        "--format",
        "speedscope",
        "-o",
        path.to_str().unwrap(),
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let json: glass_report::serde_json::Value =
        glass_report::serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let frames: Vec<&str> = json["shared"]["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    let vcpu0 = json["profiles"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"].as_str().is_some_and(|n| n.contains(" vcpu0 ")))
        .unwrap_or_else(|| panic!("no vcpu0 profile"));
    let samples: Vec<Vec<&str>> = vcpu0["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|stack| {
            stack
                .as_array()
                .unwrap()
                .iter()
                .map(|i| frames[i.as_u64().unwrap() as usize])
                .collect()
        })
        .collect();
    // The first sample in beta's recursion is whole (from kernel_entry down), and so is
    // the first at its bottom (spin_units under 80 descend frames).
    let first_beta = samples
        .iter()
        .find(|s| s.contains(&"descend"))
        .unwrap_or_else(|| panic!("{variant}: no sample in descend on vcpu0"));
    assert!(
        first_beta.first() == Some(&"kernel_entry") && !first_beta.contains(&"[truncated]"),
        "{variant}: the first sample in beta: {first_beta:?}"
    );
    let first_bottom = samples
        .iter()
        .find(|s| s.contains(&"descend") && s.last() == Some(&"spin_units"))
        .unwrap_or_else(|| panic!("{variant}: no sample at beta's bottom on vcpu0"));
    let depth = first_bottom.iter().filter(|f| **f == "descend").count();
    assert!(
        depth == 80 && first_bottom.first() == Some(&"kernel_entry"),
        "{variant}: the first sample at beta's bottom: {first_bottom:?}"
    );
}

#[test]
fn the_arm64_unikernel_without_frame_pointers_is_profiled_by_its_cfi() {
    let stacks = check_profile("nofp");
    check_deep_stacks("nofp", &stacks);
    let err = read(xen_run(), "nofp.err");
    assert!(
        err.lines()
            .any(|l| l.contains("unwind tables of") && l.contains(".eh_frame (")),
        "{err}"
    );
}

#[test]
fn the_arm64_unikernel_with_frame_records_only_is_profiled_whole() {
    let stacks = check_profile("fp");
    check_deep_stacks("fp", &stacks);
}

#[test]
fn a_blocked_arm64_vcpu_is_halted() {
    // Either build's recording: a vCPU Xen reports blocked (its wfi trapped) is [halted]
    // (under idle_wait, checked per build above).
    let out = xen_run();
    let halted: u64 = ["nofp", "fp"]
        .iter()
        .map(|v| {
            under(
                &folded(&out.join(format!("{v}.glass")), &["--threads"]),
                "vcpu0/",
                "[halted]",
            )
        })
        .sum();
    assert!(halted > 0, "no [halted] sample in either recording");
}

#[test]
fn the_arm64_domain_runs_after_every_ending_of_glass() {
    let out = xen_run();
    let endings = read(out, "endings.txt");
    let lines: Vec<&str> = endings.lines().collect();
    assert_eq!(lines.len(), 5, "{endings}");
    for line in &lines {
        let state = line
            .split("state=")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .unwrap_or("");
        assert!(!state.is_empty(), "domain gone: {line}");
        assert!(!state.contains('p'), "paused after glass ended: {line}");
        assert!(line.contains("progressed=yes"), "{line}");
    }
    for (n, signal) in ["INT", "TERM"].iter().enumerate() {
        let line = lines[n];
        assert!(line.starts_with(signal) && line.contains("rc=0"), "{line}");
        let recording = out.join(format!("end.{n}.{signal}.glass"));
        let stacks = folded(&recording, &[]);
        assert!(total(&stacks) > 0, "{signal}: nothing recorded");
    }
}

/// The `text fnv=` hashes the exact-count guest printed of its own .text, in order.
fn text_hashes(console: &str) -> Vec<&str> {
    console
        .lines()
        .filter_map(|l| l.trim().strip_prefix("text fnv="))
        .collect()
}

/// `glass trace --xen` with the aarch64 glass in the ARM64 dom0: the exact-count build
/// of the demo traced from its idle before the work to its idle after 20 rounds, every
/// call of vCPU 0's functions timed by the generic timer; the guest's own hash of its
/// .text changed while traced and as before after each trace and after glass was
/// SIGKILLed while tracing (its guardian put the code back); a second trace in the
/// first one's region.
#[test]
fn the_arm64_unikernel_has_every_call_timed_from_dom0_and_is_left_as_found() {
    let out = xen_run();
    let err = read(out, "trace.exact.err");
    assert_eq!(read(out, "trace.exact.rc").trim(), "0", "{err}");
    let late = std::fs::read_to_string(out.join("trace.exact.late")).unwrap_or_default();
    assert!(late.is_empty(), "{late}{err}");
    assert!(err.contains("instrumented 6 functions, skipped 0"), "{err}");
    assert!(err.contains(" 0 lost"), "{err}");
    // Counted from the raw records, not the report.
    let exact = counts(&out.join("trace.exact.glass"));
    for f in ["dispatch", "alpha", "beta", "gamma", "spin_block"] {
        assert_eq!(exact.entries.get(f), Some(&20), "{f}: {:?}", exact.entries);
    }
    assert_eq!(
        exact.entries.get("descend"),
        Some(&1600),
        "{:?}",
        exact.entries
    );
    assert_eq!(exact.exits, exact.entries, "every call returned");
    assert!(exact.unwound.is_empty(), "{:?}", exact.unwound);
    let info = stdout(&glass(&[
        "info",
        out.join("trace.exact.glass").to_str().unwrap(),
    ]));
    // Timed by the guest's generic timer, at the rate dom0 reads (62.5 MHz: QEMU's).
    assert!(info.contains("cycle counter 0.062 GHz"), "{info}");
    let calls = read(out, "trace.exact.calls");
    assert!(calls.contains("no records lost"), "{calls}");
    // The region hangs from a free entry of the guest's own level-2 table, within a
    // branch of the code (the recording's note, which the report repeats).
    assert!(calls.contains("of the guest's level-2 table"), "{calls}");

    let console = read(out, "trace.console");
    let hashes = text_hashes(&console);
    let before = *hashes.first().expect("a text hash");
    // Printed at the idle before the work, then with each split line: 3 during the exact
    // rounds (after rounds 5, 10 and 15), which glass had patched.
    let exact_at = console.find("exact rounds=").expect("the exact rounds");
    let patched = text_hashes(&console[..exact_at]);
    assert_eq!(patched.len(), 4, "{console}");
    assert!(patched[1..].iter().all(|&h| h != before), "{console}");
    // After each trace and after glass was killed: as before.
    for when in ["exact", "kill", "again"] {
        let after = read(out, &format!("trace.text.after.{when}"));
        assert_eq!(after.trim(), before, "{when}: {console}");
    }

    let killed = read(out, "trace.kill.err");
    assert!(
        killed.contains("test hook: stopped at guest-tracing"),
        "{killed}"
    );
    assert!(
        killed.contains("its guardian put back the 6 patched ranges"),
        "{killed}"
    );
    let again = read(out, "trace.again.err");
    assert_eq!(read(out, "trace.again.rc").trim(), "0", "{again}");
    assert!(
        again.contains("in glass's region of an earlier trace"),
        "{again}"
    );
    assert!(again.contains(" 0 lost"), "{again}");
    // The killed trace's calls after its last read (while its glass was stopped, until
    // its guardian put the code back) are still in the ring: read and set aside, not
    // taken for this trace's. (Taken, they once showed a round whose gamma came after
    // the code went back: a dispatch without its gamma.)
    assert!(again.contains("set aside "), "{again}");
    let again = counts(&out.join("trace.again.glass"));
    let count = |f: &str| again.entries.get(f).copied().unwrap_or(0);
    assert!(count("dispatch") >= 10, "{:?}", again.entries);
    // One round: dispatch calls alpha, beta and gamma once each, alpha spin_block, beta
    // 80 descend frames; a round under way at attach or detach is not counted whole.
    for f in ["alpha", "beta", "gamma"] {
        assert!(
            count(f).abs_diff(count("dispatch")) <= 1,
            "{f}: {:?}",
            again.entries
        );
    }
    assert!(
        count("alpha").abs_diff(count("spin_block")) <= 1,
        "{:?}",
        again.entries
    );
    assert!(
        count("descend").abs_diff(80 * count("beta")) <= 80,
        "{:?}",
        again.entries
    );
}
