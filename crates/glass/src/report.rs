//! `glass report`: placeholder until the report pipeline lands.
use crate::error::{Failure, Result};
use crate::ReportArgs;

pub fn run(_args: &ReportArgs) -> Result<()> {
    Err(Failure::runtime("report is not built yet"))
}
