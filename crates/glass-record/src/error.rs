//! The recording's one error type: every failure is one line for the user, never a
//! panic, and of a kind its callers act on (the command line derives its exit code from
//! the kind; a recording that fails at run time keeps what it wrote whole).

/// Why a recording was not made or not finished, by kind; the text is the whole line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    /// The user asked for something that cannot be done as asked: an option, a path, a
    /// target glass cannot use.
    #[error("{0}")]
    BadInput(String),
    /// The process is held by another tracer (a debugger, a `glass trace`), and a
    /// process has one tracer at a time.
    #[error("{0}")]
    TracedByAnother(String),
    /// Something went wrong while doing what was asked (a full disk, a target or stub
    /// that died).
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

    /// The same failure, its line followed by `more` (what became of the file, or of
    /// the VM glass launched).
    pub fn followed_by(self, more: &str) -> Self {
        match self {
            Failure::BadInput(line) => Failure::BadInput(line + more),
            Failure::TracedByAnother(line) => Failure::TracedByAnother(line + more),
            Failure::Runtime(line) => Failure::Runtime(line + more),
        }
    }
}

pub type Result<T> = std::result::Result<T, Failure>;
