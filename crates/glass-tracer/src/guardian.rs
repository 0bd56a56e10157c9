//! The guardian of `glass trace --pid`: a small process that outlives glass and leaves
//! the target as glass would have if glass dies (SIGKILL, the OOM killer) while attached.
//!
//! It is glass's own binary run again (`__trace-guardian`, hidden, whose command line
//! calls [`watch`] and prints what it did), started through
//! glass-record's [`Guardian`] (see crates/glass-record/src/guardian.rs for why a re-run
//! and not a fork, and how the pipe tells it that glass died). glass writes `done` once
//! the target is detached and the recording written; EOF without it means glass died,
//! and the guardian then
//! 1. removes the session files glass created in /dev/shm (or /tmp), known by glass's
//!    pid in their name, if glass had not yet unlinked them (a sparse file of up to the
//!    rings' size); a glass whose guardian died with it leaves them to the next glass
//!    trace --pid, which removes those of glasses that no longer run;
//! 2. takes glass's probes out of the target, exactly as the next `glass trace --pid`
//!    would on finding a dead glass's ledger (see `attach::take_over`), after waiting for
//!    the kernel to release the target from the dead tracer.
//!
//! Every state a SIGKILL can leave is safe for the target without it: injected calls
//! restore the thread themselves, and a thread is never single-stepped. The guardian
//! only stops the probes from costing the target time and /dev/shm from holding space.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use glass_record::guardian::Guardian;

use crate::error::{Failure, Result};

/// How long the guardian waits for the kernel to release the target from the dead glass.
const RELEASE_WAIT: Duration = Duration::from_secs(5);

/// Starts the guardian for `pid`. It knows this glass's session files by their name
/// (`glass-trace-<glass pid>-…`), so it is started before they exist.
pub fn start(pid: i32) -> Result<Guardian> {
    Guardian::spawn(
        "__trace-guardian",
        &[
            "--pid".to_string(),
            pid.to_string(),
            "--glass".to_string(),
            std::process::id().to_string(),
        ],
        None,
    )
    .map_err(|e| {
        Failure::runtime(format!(
            "cannot start the guardian that leaves pid {pid} as it was if glass dies: {e} (nothing was changed)"
        ))
    })
}

/// Where session files are made (see glass_probe_abi::session).
const SESSION_DIRS: [&str; 2] = ["/dev/shm", "/tmp"];

/// The session files of glass `glass_pid` (`glass-trace-<pid>-…`), and their glass's pid.
fn session_files(glass_pid: Option<u32>) -> Vec<(PathBuf, u32)> {
    let mut found = Vec::new();
    for dir in SESSION_DIRS {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(pid) = name
                .strip_prefix("glass-trace-")
                .and_then(|rest| rest.split('-').next())
                .and_then(|pid| pid.parse::<u32>().ok())
            else {
                continue;
            };
            if glass_pid.is_none_or(|wanted| wanted == pid) {
                found.push((entry.path(), pid));
            }
        }
    }
    found
}

/// Removes the session files of glasses that no longer run (their guardian was killed
/// with them): a target that mapped one keeps its mapping; the name only holds space.
pub fn remove_dead_sessions() {
    for (file, pid) in session_files(None) {
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok();
        let dead = state.as_deref().is_none_or(|stat| {
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .is_some_and(|s| s == "Z" || s == "X")
        });
        if dead {
            let _ = std::fs::remove_file(file);
        }
    }
}

/// What the guardian did when glass died.
#[derive(Debug)]
pub enum Watched {
    /// glass said `done`: nothing to do.
    Done,
    /// glass died; `took_out`: the dead glass's probes were taken out (Some(ms)), or there
    /// were none (None); `removed`: the session files of glass it removed.
    Died {
        took_out: Option<f64>,
        removed: Vec<PathBuf>,
    },
    /// glass died and its probes could not be taken out (the next attach will).
    Failed { why: String, removed: Vec<PathBuf> },
}

/// The guardian process (`glass __trace-guardian`): waits for glass's (`glass_pid`)
/// `done` or death on its standard input, and undoes what a dead glass left in `pid`.
pub fn watch(pid: i32, glass_pid: u32) -> Watched {
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: setting a disposition.
        unsafe { libc::signal(signal, libc::SIG_IGN) };
    }
    let mut input = Vec::new();
    let mut buf = [0u8; 64];
    loop {
        // SAFETY: reads into our buffer from standard input (the pipe).
        let n = unsafe { libc::read(0, buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        if n <= 0 {
            break;
        }
        input.extend_from_slice(&buf[..n as usize]);
        if input.split(|&b| b == b'\n').any(|line| line == b"done") {
            return Watched::Done;
        }
    }
    // EOF without `done`: glass died.
    let died = Instant::now();
    let removed: Vec<PathBuf> = session_files(Some(glass_pid))
        .into_iter()
        .filter(|(file, _)| std::fs::remove_file(file).is_ok())
        .map(|(file, _)| file)
        .collect();
    let mut taken = crate::attach::take_over(pid);
    // The kernel lets the dead glass's tracees go only after it closed its files (the
    // pipe), so a take-over that begins at once can meet them still held. Tried again
    // within the same wait (recovery follows the ledger, so a second try finishes what a
    // first began), on the failures that hold-over causes:
    // - TracedByAnother: a thread is still the dead glass's ("already being traced by
    //   pid N").
    // - NotTracee: waitpid said a thread just seized is not glass's ("No child
    //   processes"), seen once each in a fresh-clone run and 1 of 3 runs after it of
    //   trace_states' kill-at-recover step; not reproduced in 18 runs since, 4 of them
    //   with the CPUs kept busy.
    // Other failures are not the hold-over's, and are said at once.
    while matches!(
        taken,
        Err(Failure::TracedByAnother(_) | Failure::NotTracee(_))
    ) && died.elapsed() < RELEASE_WAIT
    {
        std::thread::sleep(Duration::from_millis(5));
        taken = crate::attach::take_over(pid);
    }
    match taken {
        Ok(Some(_)) => Watched::Died {
            took_out: Some(died.elapsed().as_secs_f64() * 1e3),
            removed,
        },
        Ok(None) => Watched::Died {
            took_out: None,
            removed,
        },
        Err(failure) => Watched::Failed {
            why: failure.to_string(),
            removed,
        },
    }
}
