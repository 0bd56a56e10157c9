//! The recording's one error type: every failure is one line for the user and an exit
//! code (2 for usage or bad input, 1 for a runtime failure), never a panic.

use std::fmt;

#[derive(Debug)]
pub struct Failure {
    pub exit_code: i32,
    pub message: String,
}

impl Failure {
    /// The user asked for something that cannot be done as asked (exit 2).
    pub fn bad_input(message: impl Into<String>) -> Self {
        Failure {
            exit_code: 2,
            message: message.into(),
        }
    }

    /// Something went wrong while doing what was asked (exit 1).
    pub fn runtime(message: impl Into<String>) -> Self {
        Failure {
            exit_code: 1,
            message: message.into(),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

pub type Result<T> = std::result::Result<T, Failure>;
