//! `glass record`: placeholder.
use crate::error::{Failure, Result};
use crate::RecordArgs;

pub fn run(_args: &RecordArgs) -> Result<i32> {
    Err(Failure::runtime("record is not built yet"))
}
