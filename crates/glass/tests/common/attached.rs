//! What the tests of `glass trace --pid` check in a traced process: its code bytes before
//! and after, the session it maps, and what `glass report --format calls` counts.

use std::collections::BTreeMap;
use std::path::Path;

use super::{glass, stderr, stdout};

/// The bytes of every executable mapping of `file` in `pid`.
pub fn code_of(pid: i32, file: &Path) -> Vec<(u64, Vec<u8>)> {
    let file = std::fs::canonicalize(file).unwrap();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut code = Vec::new();
    for line in maps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 6 || !fields[1].contains('x') || Path::new(fields[5]) != file {
            continue;
        }
        let (start, end) = fields[0].split_once('-').unwrap();
        let start = u64::from_str_radix(start, 16).unwrap();
        let end = u64::from_str_radix(end, 16).unwrap();
        let mut bytes = vec![0; (end - start) as usize];
        std::os::unix::fs::FileExt::read_exact_at(&mem, &mut bytes, start).unwrap();
        code.push((start, bytes));
    }
    assert!(
        !code.is_empty(),
        "no code of {} in pid {pid}",
        file.display()
    );
    code
}

/// `glass report --format calls`: calls per function.
pub fn reported_calls(recording: &Path) -> BTreeMap<String, u64> {
    let output = glass(&["report", recording.to_str().unwrap(), "--format", "calls"]);
    assert!(output.status.success(), "{}", stderr(&output));
    stdout(&output)
        .lines()
        .filter_map(|line| {
            // A function whose calls were cut short says so after its name:
            // "main.risky  (600 unwound)".
            let line = match line.rsplit_once("  (") {
                Some((before, note)) if note.ends_with(')') => before,
                _ => line,
            };
            let fields: Vec<&str> = line.split_whitespace().collect();
            Some((fields.last()?.to_string(), fields.first()?.parse().ok()?))
        })
        .collect()
}

/// The worker's mapping of a glass session: its path (as /proc/PID/maps shows it) and
/// the mapped file's metadata (through /proc/PID/map_files, so the file glass unlinked
/// once the worker had mapped it).
pub fn session_mapping(pid: i32) -> Option<(String, std::fs::Metadata)> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let line = maps.lines().find(|l| l.contains("/glass-trace-"))?;
    let range = line.split_whitespace().next().unwrap();
    let path = line.split_whitespace().nth(5).unwrap().to_string();
    let meta = std::fs::metadata(format!("/proc/{pid}/map_files/{range}")).unwrap();
    Some((path, meta))
}

/// Asserts who `pid` is, as the kernel sees it: real, effective, saved and filesystem
/// ids all nobody's (and nogroup's), as a server's worker that dropped root.
pub fn assert_runs_as_nobody(pid: i32) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    for key in ["Uid:", "Gid:"] {
        let ids = status.lines().find(|l| l.starts_with(key)).unwrap();
        assert_eq!(
            ids.split_whitespace().skip(1).collect::<Vec<_>>(),
            ["65534"; 4],
            "pid {pid}: {ids}"
        );
    }
}
