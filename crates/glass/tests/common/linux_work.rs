//! The Linux kit's workload (guests/linux: `userspin` and `dd` on vCPU 0, each one's
//! ticks printed every second) read from its serial log, and glass's per-process split
//! (`--guest-btf`) held to it: shared by the tests that profile that guest however it
//! was started (under `--vm`, over QMP, through libvirt).

use std::path::Path;

use super::*;

/// A `name=NUMBER` field of a line the guest printed.
pub fn field(line: &str, name: &str) -> Option<u64> {
    line.split_whitespace()
        .find_map(|f| f.strip_prefix(name))
        .and_then(|v| v.parse::<u64>().ok())
}

/// The `glass-work up=.. spin=TICKS dd=TICKS idle1=..` lines of the guest's serial log.
pub fn work_lines(serial: &Path) -> Vec<(u64, u64)> {
    let text = std::fs::read_to_string(serial).unwrap_or_default();
    // Only whole lines: the log is read while the guest writes it, and a line cut after
    // `dd=1` would read as a count.
    let whole = &text[..text.rfind('\n').map_or(0, |end| end + 1)];
    whole
        .lines()
        .filter(|line| line.starts_with("glass-work "))
        .filter_map(|line| Some((field(line, "spin=")?, field(line, "dd=")?)))
        .collect()
}

/// `glass-truth spin_pid=P dd_pid=P spin=TICKS dd=TICKS hz=100`: the pids and the
/// whole run's ticks.
pub fn truth(serial: &Path) -> Option<(u32, u32, u64, u64)> {
    let text = std::fs::read_to_string(serial).ok()?;
    let line = text.lines().find(|l| l.starts_with("glass-truth "))?;
    Some((
        field(line, "spin_pid=")? as u32,
        field(line, "dd_pid=")? as u32,
        field(line, "spin=")?,
        field(line, "dd=")?,
    ))
}

/// userspin's functions (guests/linux/spin.c), outermost first.
pub const USERSPIN_CHAIN: [&str; 4] = ["_start", "main", "spin_outer", "spin_inner"];

/// userspin-dyn's user samples (the thread label `dyn_label` names it) and those
/// walked through libc: `_start`, libc's frames (at least one), then `main;spin_outer;
/// spin_inner`.
pub fn dyn_walked(recording: &Path, dyn_label: &str) -> (u64, u64) {
    let (mut user, mut walked) = (0, 0);
    for (frames, count) in folded(recording, &["--threads"]) {
        let thread = frames.get(1).map_or("", String::as_str);
        if !thread.contains(dyn_label) {
            continue;
        }
        let code: Vec<&str> = frames.iter().skip(2).map(String::as_str).collect();
        let leaf = code.last().copied().unwrap_or("");
        if leaf.starts_with("[user] ") || USERSPIN_CHAIN.contains(&leaf) {
            user += count;
        }
        if code.len() >= 5 && code[0] == "_start" && code.ends_with(&USERSPIN_CHAIN[1..]) {
            walked += count;
        }
    }
    (user, walked)
}

/// At least 90% of userspin-dyn's user samples walked through libc (`--guest-root`).
pub fn check_dyn_walked(recording: &Path) {
    let (user, walked) = dyn_walked(recording, "userspin-dyn (pid ");
    eprintln!(
        "{}: {walked} of {user} user samples of userspin-dyn walked to _start;...libc...;main;spin_outer;spin_inner",
        recording.display()
    );
    assert!(
        user >= 100 && walked * 10 >= user * 9,
        "only {walked} of {user} user samples of userspin-dyn walked through libc"
    );
}

/// Samples per guest process label, from [`per_process`].
pub struct Split {
    pub spin: u64,
    pub dd: u64,
    /// userspin's samples in its user space: the leaf `[user] userspin`, or one of its
    /// functions (`--guest-root`).
    pub spin_user: u64,
    /// Those walked whole: `spin_inner` under `spin_outer` under `main`, from `_start`
    /// or `main` on.
    pub spin_walked: u64,
    /// dd's samples whose leaf is `[user] dd` (its user code not walked), and those
    /// whose stack holds a frame of busybox (walked with its binary).
    pub dd_user: u64,
    pub dd_busybox: u64,
}

/// Samples per guest process label (`userspin (pid 52)`), from `--threads` folded
/// stacks (the thread frame is `vcpuN: comm (pid N)/tid`), and those of `spin` in its
/// user space.
pub fn per_process(recording: &Path, spin: &str, dd: &str) -> Split {
    let stacks = folded(recording, &["--threads"]);
    let (mut spin_samples, mut dd_samples, mut spin_user, mut spin_walked) = (0, 0, 0, 0);
    let (mut dd_user, mut dd_busybox) = (0, 0);
    for (frames, count) in &stacks {
        let thread = frames.get(1).map_or("", String::as_str);
        if thread.starts_with("vcpu0: ") && thread.contains(spin) {
            spin_samples += count;
            let code: Vec<&str> = frames.iter().skip(2).map(String::as_str).collect();
            let leaf = code.last().copied().unwrap_or("");
            if leaf == "[user] userspin" || USERSPIN_CHAIN.contains(&leaf) {
                spin_user += count;
            }
            let whole = code.ends_with(&USERSPIN_CHAIN[1..])
                && (code.len() == 3 || (code.len() == 4 && code[0] == USERSPIN_CHAIN[0]));
            if whole {
                spin_walked += count;
            }
        }
        if thread.starts_with("vcpu0: ") && thread.contains(dd) {
            dd_samples += count;
            if frames.last().is_some_and(|leaf| leaf == "[user] dd") {
                dd_user += count;
            }
            if frames.iter().any(|f| f.starts_with("busybox+")) {
                dd_busybox += count;
            }
        }
    }
    Split {
        spin: spin_samples,
        dd: dd_samples,
        spin_user,
        spin_walked,
        dd_user,
        dd_busybox,
    }
}

/// The split glass saw against the guest's own, and the names every report shows;
/// `walked`: recorded with `--guest-root`, userspin's user stacks are walked whole.
/// `floor`: the least tolerance in points, for runs whose samples are not independent
/// (see arm64_processes_under_vm).
#[allow(clippy::too_many_arguments)]
pub fn check_split(
    recording: &Path,
    spin_pid: u32,
    dd_pid: u32,
    true_spin: u64,
    true_dd: u64,
    walked: bool,
    floor: f64,
) {
    let spin = format!("userspin (pid {spin_pid})");
    let dd = format!("dd (pid {dd_pid})");
    let split = per_process(recording, &spin, &dd);
    let (spin_samples, dd_samples, spin_user) = (split.spin, split.dd, split.spin_user);
    let samples = spin_samples + dd_samples;
    assert!(
        samples >= 300,
        "too few samples of the two processes: {spin_samples} {spin}, {dd_samples} {dd}"
    );
    let measured = 100.0 * spin_samples as f64 / samples as f64;
    let expected = 100.0 * true_spin as f64 / (true_spin + true_dd) as f64;
    let tolerance = share_tolerance(expected, samples, floor);
    eprintln!(
        "{}: {spin} {spin_samples}, {dd} {dd_samples}: {measured:.1}% against the guest's {expected:.1}% ({true_spin}:{true_dd} ticks), tolerance {tolerance:.1}",
        recording.display()
    );
    assert!(
        (measured - expected).abs() <= tolerance,
        "userspin's share {measured:.1}% is not the guest's {expected:.1}% within {tolerance:.1}"
    );
    // userspin spins in user space: its samples are mostly its own code, named by the
    // process (the kernel's part is interrupts).
    assert!(
        spin_user * 10 >= spin_samples * 7,
        "{spin_user} of {spin_samples} samples of {spin} in its user space"
    );
    if walked {
        // Walked through the process's own page tables with its binary's CFI: each one
        // whole, but a sample may fall where a walk cannot go on (measured here: 790 of
        // 790 on arm64, 821 of 821 on x86-64 at 197 Hz, before the wide margin).
        eprintln!(
            "{}: {} of {spin_user} user samples of {spin} walked to _start;main;spin_outer;spin_inner",
            recording.display(),
            split.spin_walked
        );
        assert!(
            split.spin_walked * 10 >= spin_user * 9,
            "only {} of {spin_user} user samples of {spin} show spin_inner under spin_outer under main",
            split.spin_walked
        );
    }
    let top = glass(&[
        "report",
        recording.to_str().unwrap(),
        "--threads",
        "--limit",
        "3",
    ]);
    let text = stdout(&top);
    for name in [&spin, &dd] {
        assert!(
            text.contains(&format!("thread vcpu0: {name} (tid 1)")),
            "--threads names no vcpu0: {name}:\n{text}"
        );
    }
    let info = stdout(&glass(&["info", recording.to_str().unwrap()]));
    assert!(info.contains("guest: "), "{info}");
    for name in [&spin, &dd] {
        assert!(
            info.lines()
                .any(|line| line.trim_start().ends_with(name.as_str())),
            "glass info lists no {name}:\n{info}"
        );
    }
}
