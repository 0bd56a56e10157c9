//! The interactive SVG flame graph, drawn by inferno from the folded stacks (its SVG
//! carries the hover details, click-to-zoom and search of Brendan Gregg's original).

use std::io::{self, Write};

use crate::folded::folded_lines;
use crate::model::{Source, Unit};
use crate::{Exporter, Model, Profile, ReportError};

pub fn write_flamegraph(profile: &Profile, title: &str, out: &mut dyn Write) -> io::Result<()> {
    write_folded_as_flamegraph(&folded_lines(profile), title, "samples", out)
}

/// Draws folded lines (`a;b;c count`); `count_name` is what the counts are.
pub fn write_folded_as_flamegraph(
    lines: &[String],
    title: &str,
    count_name: &str,
    out: &mut dyn Write,
) -> io::Result<()> {
    let mut options = inferno::flamegraph::Options::default();
    options.title = title.to_string();
    options.count_name = count_name.to_string();
    if lines.is_empty() {
        // inferno refuses an empty profile; an empty graph says the same thing plainly.
        options.subtitle = Some(format!("no {count_name}"));
        let placeholder = [format!("no {count_name} 1")];
        return inferno::flamegraph::from_lines(
            &mut options,
            placeholder.iter().map(String::as_str),
            out,
        )
        .map_err(|e| io::Error::other(e.to_string()));
    }
    inferno::flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), out)
        .map_err(|e| io::Error::other(e.to_string()))
}

/// The flame graph of a sampled recording (samples), or of a trace (self time).
pub struct Flamegraph {
    pub title: String,
    /// Each thread under its own frame below the process (samples).
    pub split_threads: bool,
}

impl Exporter for Flamegraph {
    fn write(&self, model: &Model, out: &mut dyn Write) -> Result<(), ReportError> {
        match (&model.calls, model.source) {
            (Some(trace), Source::Calls) => {
                let unit = if model.unit == Unit::Cycles {
                    "cycles"
                } else {
                    "ns"
                };
                Ok(write_folded_as_flamegraph(
                    &crate::calltrace::folded(trace),
                    &self.title,
                    unit,
                    out,
                )?)
            }
            _ => Ok(write_flamegraph(
                &Profile::from_model(model, self.split_threads),
                &self.title,
                out,
            )?),
        }
    }
}

/// The folded lines a model's flame graph is drawn from: its stacks below the process
/// (samples), or its traced calls by self time (traces).
pub(crate) fn folded_lines_of(model: &Model) -> Vec<String> {
    match (&model.calls, model.source) {
        (Some(trace), Source::Calls) => crate::calltrace::folded(trace),
        _ => folded_lines(&Profile::from_model(model, false)),
    }
}
