//! What can go wrong writing a report.

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// Writing the output failed (a closed pipe included: callers may ignore that).
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The format needs stacks sampled at a rate; the recording holds calls.
    #[error("a `glass trace` recording has calls, not samples: {hint}")]
    NeedsSamples { hint: &'static str },
    /// The format needs a `glass trace` recording.
    #[error("--format {format} needs a `glass trace` recording; this one holds samples")]
    NeedsCalls { format: &'static str },
    /// `--format invocations` without `--root`, or a root that was not traced.
    #[error("{0}")]
    Root(String),
    /// The flame graph library refused its input.
    #[error("flame graph: {0}")]
    Flamegraph(String),
    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// A differential graph needs the recording before the change.
    #[error("--format diff needs --diff BEFORE.glass (the recording before the change)")]
    NoBaseline,
}

impl ReportError {
    /// The input, not the machine, is at fault: a usage error rather than a failure.
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            ReportError::NeedsSamples { .. }
                | ReportError::NeedsCalls { .. }
                | ReportError::Root(_)
                | ReportError::NoBaseline
        )
    }

    pub fn is_broken_pipe(&self) -> bool {
        matches!(self, ReportError::Io(e) if e.kind() == io::ErrorKind::BrokenPipe)
    }
}
