//! One error type for the whole command line: each library's failure, or the command
//! line's own refusal, printed as one line on stderr, never a panic. The exit code is
//! decided here, and only here, from the failure's kind: 2 for usage or bad input, 1 for
//! a failure while doing what was asked.

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// The command line refused what it was given (a path, an option).
    #[error("{0}")]
    BadInput(String),
    /// The command line failed while doing what was asked.
    #[error("{0}")]
    Runtime(String),
    #[error(transparent)]
    Record(#[from] glass_record::Failure),
    #[error(transparent)]
    Trace(#[from] glass_tracer::Failure),
    #[error(transparent)]
    Report(#[from] glass_report::report::Failure),
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

    /// The process's exit code: 2 when the user asked for what cannot be done as asked
    /// (a process another tracer holds, functions that are not there to patch, among
    /// them), 1 when doing it failed.
    pub fn exit_code(&self) -> u8 {
        const BAD_INPUT: u8 = 2;
        const RUNTIME: u8 = 1;
        match self {
            Failure::BadInput(_) => BAD_INPUT,
            Failure::Runtime(_) => RUNTIME,
            Failure::Record(failure) => {
                use glass_record::Failure::*;
                match failure {
                    BadInput(_) | TracedByAnother(_) => BAD_INPUT,
                    Runtime(_) => RUNTIME,
                }
            }
            Failure::Trace(failure) => {
                use glass_tracer::Failure::*;
                match failure {
                    BadInput(_) | NothingToPatch(_) | TracedByAnother(_) => BAD_INPUT,
                    TargetGone(_) | NotTracee(_) | TimedOut(_) | Runtime(_) => RUNTIME,
                }
            }
            Failure::Report(failure) => {
                use glass_report::report::Failure::*;
                match failure {
                    BadInput(_) => BAD_INPUT,
                    Runtime(_) => RUNTIME,
                }
            }
        }
    }
}

pub type Result<T> = std::result::Result<T, Failure>;
