//! From a recording to what a person reads: one interned, timed [`Model`] (string,
//! module, frame and stack tables; per-thread samples with time and weight) built once,
//! and one module per output format, each an [`Exporter`] from the model to bytes;
//! [`report`] chooses among them (and between the whole model and a trace streamed)
//! as `glass report` asks. [`LiveModel`] keeps the same model up to date while a
//! recording runs (`glass top`).

pub mod calltrace;
mod diff;
mod error;
mod firefox;
mod flamegraph;
mod folded;
pub mod guest_tasks;
pub mod live;
pub mod model;
mod modules;
mod pprof;
mod profile;
mod raw;
pub mod report;
mod speedscope;
mod top;

use std::io::Write;

pub use diff::{diff_folded, DiffFlamegraph};
pub use error::ReportError;
pub use firefox::Firefox;
pub use flamegraph::{write_flamegraph, write_folded_as_flamegraph, Flamegraph};
pub use folded::{write_folded, Folded};
pub use live::LiveModel;
pub use model::{Model, ModelOptions, Source};
pub use modules::ModuleTimeline;
pub use pprof::Pprof;
pub use profile::{Profile, ProfileOptions, Stack};
pub use raw::unwind_snapshots;
pub use speedscope::Speedscope;
pub use top::Top;

/// For tests that read the JSON formats back.
#[doc(hidden)]
pub use serde_json;

/// One output format: writes a view of the model.
pub trait Exporter {
    fn write(&self, model: &Model, out: &mut dyn Write) -> Result<(), ReportError>;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// A table of functions by self and total share
    Top,
    /// Brendan Gregg's collapsed stacks, one line per distinct stack
    Folded,
    /// An interactive SVG flame graph (hover, zoom, search)
    Flamegraph,
    /// pprof's gzip'd profile.proto (go tool pprof, pprof's web UI)
    Pprof,
    /// speedscope's JSON (sampled per thread; evented for glass trace)
    Speedscope,
    /// The Firefox Profiler's processed profile JSON (profiler.firefox.com)
    Firefox,
    /// A differential flame graph of --diff BEFORE against this recording
    Diff,
    /// glass trace: per function, calls and time (total, self, min, p50, p99, max)
    Calls,
    /// glass trace: the call tree, calls merged by path
    Tree,
    /// glass trace: one row per call of --root, slowest first, split by callee
    Invocations,
    /// glass trace: Chrome trace-event JSON (Perfetto, chrome://tracing)
    Chrome,
}

impl Format {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Format::Top => "top",
            Format::Folded => "folded",
            Format::Flamegraph => "flamegraph",
            Format::Pprof => "pprof",
            Format::Speedscope => "speedscope",
            Format::Firefox => "firefox",
            Format::Diff => "diff",
            Format::Calls => "calls",
            Format::Tree => "tree",
            Format::Invocations => "invocations",
            Format::Chrome => "chrome",
        }
    }

    /// Whether the format can show a recording of this kind.
    pub fn check(self, source: Source) -> Result<(), ReportError> {
        match (self, source) {
            (Format::Calls | Format::Tree | Format::Invocations | Format::Chrome, Source::Samples) => {
                Err(ReportError::NeedsCalls { format: self.name() })
            }
            (Format::Top | Format::Folded | Format::Firefox, Source::Calls) => {
                Err(ReportError::NeedsSamples {
                    hint: "use --format calls, tree, invocations, chrome, flamegraph, pprof, speedscope or diff",
                })
            }
            _ => Ok(()),
        }
    }
}

/// The deepest stack any report shows, counted from the root (its outermost frame):
/// the model's stacks and the exporters' paths keep `MAX_DEPTH` frames and put every
/// deeper frame into one [`DEEPER_FRAME`] below them, whose self time is all the time
/// spent deeper. Written-out paths (folded lines, a flame graph's frames, the tree's
/// indentation) are as long as a stack is deep, so without a bound their size grows with
/// the square of the depth: a 4000-deep trace's flame graph took 163 MB and seconds, a
/// corrupted trace whose calls never closed 3.7 GB.
pub const MAX_DEPTH: usize = 1024;
/// Stands for every frame deeper than [`MAX_DEPTH`].
pub const DEEPER_FRAME: &str = "[deeper than 1024 frames]";

/// Marks the outermost frames a stack walk could not reach.
pub const TRUNCATED_FRAME: &str = "[truncated]";
/// An address in no known module.
pub const UNKNOWN_FRAME: &str = "[unknown]";
/// The leaf frame of a VM guest's vCPU sampled halted (idle).
pub const HALTED_FRAME: &str = "[halted]";
/// The only frame of a vCPU sampled before it ran the guest image.
pub const FIRMWARE_FRAME: &str = "[firmware]";
/// The root of the stacks of time spent blocked (perf backend, `--off-cpu`).
pub const OFF_CPU_FRAME: &str = "[off-cpu]";
/// The module the kernel's frames are shown in (as perf names it).
pub const KERNEL_MODULE: &str = "[kernel.kallsyms]";

/// How a kernel frame is named in every report and in `glass top`: `_[k]` is the
/// folded-stack convention for kernel frames (flame graphs colour them apart).
pub fn kernel_frame_name(symbol: &glass_format::KernelSymbol) -> String {
    if symbol.module.is_empty() {
        format!("{}_[k]", symbol.name)
    } else {
        format!("{} [{}]_[k]", symbol.name, symbol.module)
    }
}

/// `n` and the noun, singular for one (kept in glass-format, where the recorder's
/// figures find it too).
pub use glass_format::count;

/// Why stacks were truncated, in words: of `truncated`, `cut` needed more stack than the
/// recorder copied (a larger copy would reach further), `at_depth` reached the depth
/// limit, and the rest failed in code that keeps no frame (no CFI and no frame pointer
/// there: boot and entry stubs, hand-written assembly, frameless leaves under `--unwind
/// fp`).
pub fn truncation_causes(truncated: u64, cut: u64, at_depth: u64) -> String {
    let mut causes = Vec::new();
    if cut > 0 {
        causes.push(format!("{cut} where the stack copy was cut short"));
    }
    if at_depth > 0 {
        causes.push(format!("{at_depth} at the depth limit"));
    }
    let frameless = truncated.saturating_sub(cut + at_depth);
    if frameless > 0 {
        causes.push(format!(
            "{frameless} where the walk met code that keeps no frame"
        ));
    }
    causes.join(", ")
}
