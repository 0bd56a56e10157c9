//! The interactive SVG flame graph, drawn by inferno from the folded stacks (its SVG
//! carries the hover details, click-to-zoom and search of Brendan Gregg's original).

use std::io::{self, Write};

use crate::folded::folded_lines;
use crate::Profile;

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
