//! One error type for the whole command line, shared with the recording library: every
//! failure is one line on stderr and an exit code (2 for usage or bad input, 1 for a
//! runtime failure), never a panic.

pub use glass_record::{Failure, Result};
