//! `glass info`: placeholder until the report pipeline lands.
use crate::error::{Failure, Result};
use crate::InfoArgs;

pub fn run(_args: &InfoArgs) -> Result<()> {
    Err(Failure::runtime("info is not built yet"))
}
