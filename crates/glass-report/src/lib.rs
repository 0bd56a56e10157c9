//! From a recording to what a person reads: one in-memory [`Profile`] (symbolized
//! stacks with counts) built once, and one module per output format, each a function
//! from the profile to bytes.

pub mod calltrace;
mod flamegraph;
mod folded;
mod modules;
mod profile;
mod raw;
mod top;

pub use flamegraph::write_flamegraph;
pub use folded::write_folded;
pub use modules::ModuleTimeline;
pub use profile::{Profile, ProfileOptions, Stack};
pub use raw::unwind_snapshots;
pub use top::write_top;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// A table of functions by self and total share
    Top,
    /// Brendan Gregg's collapsed stacks, one line per distinct stack
    Folded,
    /// An interactive SVG flame graph (hover, zoom, search)
    Flamegraph,
    /// glass trace: per function, calls and time (total, self, min, p50, p99, max)
    Calls,
    /// glass trace: the call tree, calls merged by path
    Tree,
    /// glass trace: one row per call of --root, slowest first, split by callee
    Invocations,
    /// glass trace: Chrome trace-event JSON (Perfetto, chrome://tracing)
    Chrome,
}

/// Marks the outermost frames a stack walk could not reach.
pub const TRUNCATED_FRAME: &str = "[truncated]";
/// An address in no known module.
pub const UNKNOWN_FRAME: &str = "[unknown]";
/// The leaf frame of a VM guest's vCPU sampled halted (idle).
pub const HALTED_FRAME: &str = "[halted]";
/// The only frame of a vCPU sampled before it ran the guest image.
pub const FIRMWARE_FRAME: &str = "[firmware]";
