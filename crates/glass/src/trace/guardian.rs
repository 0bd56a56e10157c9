//! The guardian of `glass trace --pid`: a small process that outlives glass and leaves
//! the target as glass would have if glass dies (SIGKILL, the OOM killer) while attached.
//!
//! It is glass's own binary run again (`__trace-guardian`, hidden), started through
//! glass-record's [`Guardian`] (see crates/glass-record/src/guardian.rs for why a re-run
//! and not a fork, and how the pipe tells it that glass died). glass writes `done` once
//! the target is detached and the recording written; EOF without it means glass died,
//! and the guardian then
//! 1. removes the session file glass created in /dev/shm, if the runtime had not yet
//!    mapped it and glass not yet unlinked it (a sparse file of up to the rings' size);
//! 2. takes glass's probes out of the target, exactly as the next `glass trace --pid`
//!    would on finding a dead glass's ledger (see `attach::take_over`), after waiting for
//!    the kernel to release the target from the dead tracer.
//!
//! Every state a SIGKILL can leave is safe for the target without it: injected calls
//! restore the thread themselves, and a thread is never single-stepped. The guardian
//! only stops the probes from costing the target time and /dev/shm from holding space.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use glass_record::guardian::Guardian;

use crate::error::{Failure, Result};

/// How long the guardian waits for the kernel to release the target from the dead glass.
const RELEASE_WAIT: Duration = Duration::from_secs(5);

/// `glass __trace-guardian` (hidden): started by `glass trace --pid`, never by hand.
#[derive(clap::Args, Debug, Clone)]
pub struct TraceGuardianArgs {
    /// The process glass attaches to
    #[arg(long)]
    pid: i32,
    /// The session file glass created for it
    #[arg(long)]
    session: PathBuf,
}

/// Starts the guardian for `pid`, whose session file is `session`.
pub fn start(pid: i32, session: &Path) -> Result<Guardian> {
    Guardian::spawn(
        "__trace-guardian",
        &[
            "--pid".to_string(),
            pid.to_string(),
            "--session".to_string(),
            session.display().to_string(),
        ],
    )
    .map_err(|e| {
        Failure::runtime(format!(
            "cannot start the guardian that leaves pid {pid} as it was if glass dies: {e} (nothing was changed)"
        ))
    })
}

/// The guardian process.
pub fn run(args: &TraceGuardianArgs) -> Result<i32> {
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
            return Ok(0);
        }
    }
    // EOF without `done`: glass died.
    let died = Instant::now();
    let pid = args.pid;
    let removed = std::fs::remove_file(&args.session).is_ok();
    let mut taken = super::attach::take_over(pid);
    // The kernel lets the dead glass's tracees go only after it closed its files (the
    // pipe): until then they are still its own.
    while matches!(&taken, Err(e) if e.message.contains("already being traced by pid"))
        && died.elapsed() < RELEASE_WAIT
    {
        std::thread::sleep(Duration::from_millis(5));
        taken = super::attach::take_over(pid);
    }
    let file = match removed {
        true => format!(", removed {}", args.session.display()),
        false => String::new(),
    };
    match taken {
        Ok(Some(_)) => eprintln!(
            "glass: glass ended while tracing pid {pid}; its guardian took the probes out in {:.1} ms{file}",
            died.elapsed().as_secs_f64() * 1e3
        ),
        Ok(None) => eprintln!(
            "glass: glass ended while tracing pid {pid}; its guardian found nothing to take out{file}"
        ),
        Err(failure) => eprintln!(
            "glass: glass ended while tracing pid {pid}; its guardian could not take the probes out: {} (the next glass trace --pid {pid} will){file}",
            failure.message
        ),
    }
    Ok(0)
}
