//! Why a trace was not made or not finished, by the kinds its callers act on: the
//! command line derives its exit code from the kind, and the guardian tries a take-over
//! again only on the kinds that pass while the kernel lets a dead glass's hold go.

use glass_target::TargetError;

/// A failure of `glass trace`, by kind; the text is the whole line the user sees.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    /// The user asked for something that cannot be done as asked: an option, a
    /// program, a process glass cannot trace.
    #[error("{0}")]
    BadInput(String),
    /// None of the functions asked for is there to patch (no symbol matches, or every
    /// match is refused).
    #[error("{0}")]
    NothingToPatch(String),
    /// The process is another tracer's: a debugger, a live glass (its ledger, or a
    /// session of the runtime it launched with), or a glass that died and whose hold the
    /// kernel has not let go yet.
    #[error("{0}")]
    TracedByAnother(String),
    /// The process went away while glass held it.
    #[error("{0}")]
    TargetGone(String),
    /// A thread glass seized is not its tracee to wait for (ECHILD); seen while the
    /// kernel let the tracees of a glass that died go.
    #[error("{0}")]
    NotTracee(String),
    /// A thread did not stop in the time glass gives it.
    #[error("{0}")]
    TimedOut(String),
    /// Anything else that went wrong while doing what was asked.
    #[error("{0}")]
    Runtime(String),
}

impl Failure {
    /// [`Failure::BadInput`].
    pub fn bad_input(line: impl Into<String>) -> Self {
        Failure::BadInput(line.into())
    }

    /// [`Failure::Runtime`].
    pub fn runtime(line: impl Into<String>) -> Self {
        Failure::Runtime(line.into())
    }

    /// glass-target's refusal to start on a target (to launch it, to seize it): what it
    /// counts as the user's input is [`Failure::BadInput`], as is a process that is gone
    /// before glass held it (the pid named is no process).
    pub(crate) fn starting(error: TargetError) -> Self {
        match error {
            TargetError::TracedBy(..) => Failure::TracedByAnother(error.to_string()),
            _ if error.is_bad_input() => Failure::BadInput(error.to_string()),
            _ => Failure::Runtime(error.to_string()),
        }
    }
}

/// A failure of glass-target's while glass holds the process (seizing it again, stopping
/// its threads, waiting for them): a runtime failure, of the kind it says.
impl From<TargetError> for Failure {
    fn from(error: TargetError) -> Self {
        let line = error.to_string();
        match error {
            TargetError::TracedBy(..) => Failure::TracedByAnother(line),
            TargetError::NoSuchProcess(_) => Failure::TargetGone(line),
            TargetError::NotTracee(_) => Failure::NotTracee(line),
            TargetError::TimedOut(_) => Failure::TimedOut(line),
            _ => Failure::Runtime(line),
        }
    }
}

/// What glass-tracer borrows from glass-record (the output file, signal handling, the
/// guardian) fails as a recording does.
impl From<glass_record::Failure> for Failure {
    fn from(failure: glass_record::Failure) -> Self {
        match failure {
            glass_record::Failure::BadInput(line) => Failure::BadInput(line),
            glass_record::Failure::TracedByAnother(line) => Failure::TracedByAnother(line),
            glass_record::Failure::Runtime(line) => Failure::Runtime(line),
        }
    }
}

pub type Result<T> = std::result::Result<T, Failure>;
