//! `glass trace --pid` on an architecture whose injected calls glass-target does not
//! build yet (AArch64: see glass_target::inject): refused in one line. Launch mode,
//! which preloads the probe runtime instead of calling dlopen in the process, works.

use crate::error::{Failure, Result};
use crate::{CounterChoice, TraceNotes, TraceOptions, Traced};

fn refused() -> Failure {
    Failure::bad_input(format!(
        "glass trace --pid is built for x86-64 only so far (this glass is built for {}); launch the program under glass trace instead",
        std::env::consts::ARCH
    ))
}

pub fn run(
    _args: &TraceOptions,
    _notes: &mut dyn TraceNotes,
    _pid: i32,
    _patterns: &[String],
    _libcalls: &[String],
    _counters: Vec<CounterChoice>,
    _counters_note: String,
) -> Result<Traced> {
    Err(refused())
}

/// No `--pid` session can have left anything in a process here.
pub fn take_over(_pid: i32) -> Result<Option<u64>> {
    Ok(None)
}
