//! What /proc says about a test's processes (state letter, CPU time), read one way for
//! every test that waits on a target or checks that it ran.

use std::fmt::Display;
use std::path::Path;

/// The state letter (R, S, T for stopped, t for a ptrace stop, Z) in a `stat` file of
/// /proc (a process's or one of its threads'), if the file is there.
pub fn state_of(stat: &Path) -> Option<char> {
    let stat = std::fs::read_to_string(stat).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// The state letter of process `pid`, if it exists.
pub fn process_state(pid: impl Display) -> Option<char> {
    state_of(Path::new(&format!("/proc/{pid}/stat")))
}

/// The fields of `/proc/PID/stat` after the command name (state first), 0 where missing.
fn stat_numbers(pid: impl Display) -> Vec<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(')').map_or(Vec::new(), |(_, rest)| {
        rest.split_whitespace()
            .map(|f| f.parse().unwrap_or(0))
            .collect()
    })
}

/// User plus system CPU time of process `pid` (all its threads), in clock ticks; 0 once
/// it is gone.
pub fn cpu_ticks(pid: impl Display) -> u64 {
    let fields = stat_numbers(pid);
    fields.get(11).copied().unwrap_or(0) + fields.get(12).copied().unwrap_or(0)
}

/// User CPU time alone of process `pid`, in clock ticks: what it ran of its own code.
pub fn user_ticks(pid: impl Display) -> u64 {
    stat_numbers(pid).get(11).copied().unwrap_or(0)
}
