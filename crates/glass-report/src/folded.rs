//! Brendan Gregg's collapsed stacks: `root;caller;callee COUNT`, one line per distinct
//! stack, readable by flamegraph.pl, inferno, speedscope and most flame graph tools.

use std::io::{self, Write};

use crate::{Exporter, Model, Profile, ReportError};

pub fn folded_lines(profile: &Profile) -> Vec<String> {
    profile
        .stacks
        .iter()
        .map(|stack| {
            // ';' separates frames: a name containing one (rare C++ templates) must not
            // split into two frames.
            let frames: Vec<String> = stack.frames.iter().map(|f| f.replace(';', ":")).collect();
            format!("{} {}", frames.join(";"), stack.count)
        })
        .collect()
}

pub fn write_folded(profile: &Profile, out: &mut dyn Write) -> io::Result<()> {
    for line in folded_lines(profile) {
        writeln!(out, "{line}")?;
    }
    Ok(())
}

/// Collapsed stacks of a sampled recording.
pub struct Folded {
    /// Each thread under its own frame below the process.
    pub split_threads: bool,
}

impl Exporter for Folded {
    fn write(&self, model: &Model, out: &mut dyn Write) -> Result<(), ReportError> {
        crate::Format::Folded.check(model.source)?;
        Ok(write_folded(
            &Profile::from_model(model, self.split_threads),
            out,
        )?)
    }
}
