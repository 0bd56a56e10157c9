//! `glass trace` in a glass built for another architecture than x86-64 (the aarch64 build
//! that runs in Xen on ARM64's dom0 for `glass record --xen`): function tracing patches
//! x86-64 machine code (glass-tracer, glass-patch), so the command refuses in one line.

use crate::error::{Failure, Result};
use crate::TraceArgs;

fn refused() -> Failure {
    Failure::bad_input(format!(
        "glass trace patches x86-64 code; this glass is built for {}",
        std::env::consts::ARCH
    ))
}

#[derive(clap::Args, Debug, Clone)]
pub struct TraceGuardianArgs {}

pub fn run(_args: &TraceArgs) -> Result<i32> {
    Err(refused())
}

pub fn guard(_args: &TraceGuardianArgs) -> Result<i32> {
    Err(refused())
}
