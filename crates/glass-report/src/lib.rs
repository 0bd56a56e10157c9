//! Aggregation of recordings into call trees, one module per output format.

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// A table of functions by self and total share
    Top,
    /// Brendan Gregg's collapsed stacks, one line per distinct stack
    Folded,
    /// An interactive SVG flame graph (hover, zoom, search)
    Flamegraph,
}
