//! `glass report`: its options handed to glass-report's `report` (which reads the
//! recording, chooses the streamed or the whole-recording path and the exporter, and
//! writes), its warnings printed, its failure turned into an exit code.

use std::path::Path;

use glass_format::Recording;
use glass_report::calltrace::scan;
use glass_report::report::{self as library, ReportOptions};

use crate::error::{Failure, Result};
use crate::ReportArgs;

fn warn(text: &str) {
    eprintln!("glass: warning: {text}");
}

/// Reads a recording for a command: a file glass cannot read at all is bad input; a
/// damaged or truncated one is reported with a warning and used as far as it goes.
pub fn open_recording(path: &Path) -> Result<Recording> {
    library::open_recording(path, &mut warn).map_err(Failure::from)
}

/// Whether the file's first record says it is a `glass trace` recording.
pub fn is_trace_file(path: &Path) -> bool {
    library::is_trace_file(path)
}

/// A `glass trace` recording summed while it streams by (damage warned about).
pub fn scan_trace(path: &Path, jobs: Option<u32>, wanted: &scan::Wanted) -> Result<scan::Scan> {
    library::scan_trace(path, jobs, wanted, &mut warn).map_err(Failure::from)
}

pub fn run(args: &ReportArgs) -> Result<()> {
    let options = ReportOptions {
        input: args.input.clone(),
        output: args.output.clone(),
        format: args.format,
        root: args.root.clone(),
        diff: args.diff.clone(),
        threads: args.threads,
        tid: args.tid,
        limit: args.limit,
        no_idle: args.no_idle,
        jobs: args.jobs,
    };
    library::run(&options, &mut warn).map_err(Failure::from)
}
