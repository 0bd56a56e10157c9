//! `--format diff` (`glass report --diff BEFORE.glass AFTER.glass`): a differential
//! flame graph, as inferno's `difffolded` and Brendan Gregg's differential flame graphs.
//! The graph is the AFTER profile (frame widths are its samples); each frame is red where
//! it grew from BEFORE and blue where it shrank, the deeper the colour the larger the
//! change. BEFORE is scaled to AFTER's total first (inferno's `--normalize`), so two
//! recordings of different lengths compare by share. Stacks are compared without the
//! process frame, so a rebuilt program under another name still lines up.

use std::io::Write;

use crate::flamegraph::folded_lines_of;
use crate::model::{Model, Source, Unit};
use crate::{Exporter, ReportError};

pub struct DiffFlamegraph<'a> {
    /// The recording before the change.
    pub before: &'a Model,
    pub title: String,
}

/// The stacks of a model without their process frame, folded (`a;b;c count`).
fn stacks(model: &Model) -> String {
    let mut text = String::new();
    for line in folded_lines_of(model) {
        let line = match model.source {
            Source::Samples => line.split_once(';').map_or(line.as_str(), |(_, rest)| rest),
            Source::Calls => line.as_str(),
        };
        text.push_str(line);
        text.push('\n');
    }
    text
}

/// inferno's differential folded lines: `stack BEFORE AFTER`.
pub fn diff_folded(before: &Model, after: &Model) -> Result<Vec<String>, ReportError> {
    let options = inferno::differential::Options {
        normalize: true,
        strip_hex: false,
    };
    let mut lines = Vec::new();
    inferno::differential::from_readers(
        options,
        stacks(before).as_bytes(),
        stacks(after).as_bytes(),
        &mut lines,
    )?;
    Ok(String::from_utf8_lossy(&lines)
        .lines()
        .map(str::to_string)
        .collect())
}

impl Exporter for DiffFlamegraph<'_> {
    fn write(&self, model: &Model, out: &mut dyn Write) -> Result<(), ReportError> {
        let lines = diff_folded(self.before, model)?;
        let count_name = match (model.source, model.unit) {
            (Source::Samples, _) => "samples",
            (Source::Calls, Unit::Nanoseconds) => "ns",
            (Source::Calls, Unit::Cycles) => "cycles",
        };
        let mut options = inferno::flamegraph::Options::default();
        options.title = self.title.clone();
        options.subtitle =
            Some("red: more than before, blue: less (before scaled to the same total)".into());
        options.count_name = count_name.to_string();
        // (An empty recording, a damaged one say, leaves only lines of before's stacks,
        // none of AFTER's: inferno draws no graph of those either.)
        if lines.iter().all(|line| line.ends_with(" 0")) {
            options.subtitle = Some(format!("no {count_name}"));
            let placeholder = [format!("no {count_name} 1 1")];
            inferno::flamegraph::from_lines(
                &mut options,
                placeholder.iter().map(String::as_str),
                out,
            )
            .map_err(|e| ReportError::Flamegraph(e.to_string()))?;
            return Ok(());
        }
        inferno::flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), out)
            .map_err(|e| ReportError::Flamegraph(e.to_string()))?;
        Ok(())
    }
}
