//! The top table: per function, the share of samples it was running in (self) and the
//! share it was on the stack for (total, counted once per sample even when recursive).
//! Self time goes to the innermost function that was not inlined, as in perf; inlined
//! functions appear with their total.

use std::collections::{HashMap, HashSet};
use std::io::{self, Write};

use crate::{Exporter, Model, Profile, ReportError, TRUNCATED_FRAME};

struct Row<'a> {
    function: &'a str,
    self_samples: u64,
    total_samples: u64,
}

/// One table for the stacks whose thread frame is `thread` (or all stacks).
fn rows<'a>(profile: &'a Profile, thread: Option<&str>) -> (Vec<Row<'a>>, u64) {
    let mut self_counts: HashMap<&str, u64> = HashMap::new();
    let mut total_counts: HashMap<&str, u64> = HashMap::new();
    let mut samples = 0;
    for stack in &profile.stacks {
        if let Some(thread) = thread {
            if stack.frames.get(1).map(String::as_str) != Some(thread) {
                continue;
            }
        }
        samples += stack.count;
        let functions = profile.functions(stack);
        if let Some(leaf) = profile.self_function(stack) {
            *self_counts.entry(leaf).or_insert(0) += stack.count;
        }
        let mut seen = HashSet::new();
        for function in functions {
            if function != TRUNCATED_FRAME && seen.insert(function.as_str()) {
                *total_counts.entry(function).or_insert(0) += stack.count;
            }
        }
    }
    let mut rows: Vec<Row> = total_counts
        .into_iter()
        .map(|(function, total_samples)| Row {
            function,
            self_samples: self_counts.get(function).copied().unwrap_or(0),
            total_samples,
        })
        .collect();
    rows.sort_by(|a, b| {
        (b.self_samples, b.total_samples, a.function).cmp(&(
            a.self_samples,
            a.total_samples,
            b.function,
        ))
    });
    (rows, samples)
}

/// The top table of a sampled recording.
pub struct Top {
    /// What was recorded, printed above the tables.
    pub header: String,
    /// One table per thread.
    pub split_threads: bool,
    /// Rows per table.
    pub limit: usize,
}

impl Exporter for Top {
    fn write(&self, model: &Model, out: &mut dyn Write) -> Result<(), ReportError> {
        crate::Format::Top.check(model.source)?;
        let profile = Profile::from_model(model, self.split_threads);
        Ok(write_top(
            &profile,
            &self.header,
            self.split_threads,
            self.limit,
            out,
        )?)
    }
}

/// `header` is printed above the tables (what was recorded); `limit` rows per table.
pub fn write_top(
    profile: &Profile,
    header: &str,
    split_threads: bool,
    limit: usize,
    out: &mut dyn Write,
) -> io::Result<()> {
    writeln!(out, "{header}")?;
    if profile.off_cpu_ns > 0 {
        let on_cpu = profile.samples - profile.off_cpu_weight;
        writeln!(
            out,
            "on-CPU: {on_cpu} samples; off-CPU: {:.3} s blocked, weighed as {} samples (under [off-cpu])",
            profile.off_cpu_ns as f64 / 1e9,
            profile.off_cpu_weight
        )?;
    }
    if profile.truncated_samples > 0 {
        writeln!(
            out,
            "note: {} of {} samples have a truncated stack (shown under {TRUNCATED_FRAME} in folded and flame graph output)",
            profile.truncated_samples, profile.samples
        )?;
    }
    if split_threads {
        for (tid, name) in &profile.threads {
            let key = format!("{name}/{tid}");
            let (rows, samples) = rows(profile, Some(&key));
            writeln!(out, "\nthread {name} (tid {tid}): {samples} samples")?;
            table(profile, &rows, samples, limit, out)?;
        }
        Ok(())
    } else {
        let (rows, samples) = rows(profile, None);
        writeln!(out)?;
        table(profile, &rows, samples, limit, out)
    }
}

fn table(
    profile: &Profile,
    rows: &[Row],
    samples: u64,
    limit: usize,
    out: &mut dyn Write,
) -> io::Result<()> {
    writeln!(
        out,
        "{:>7} {:>7} {:>9} {:>9}  {:<40} module",
        "self%", "total%", "self", "total", "function"
    )?;
    let percent = |n: u64| {
        if samples == 0 {
            0.0
        } else {
            n as f64 * 100.0 / samples as f64
        }
    };
    for row in rows.iter().take(limit) {
        let module = profile
            .function_modules
            .get(row.function)
            .map(String::as_str)
            .unwrap_or("");
        writeln!(
            out,
            "{:>6.2}% {:>6.2}% {:>9} {:>9}  {:<40} {}",
            percent(row.self_samples),
            percent(row.total_samples),
            row.self_samples,
            row.total_samples,
            row.function,
            module
        )?;
    }
    if rows.len() > limit {
        writeln!(
            out,
            "... {} more functions (--limit N shows more)",
            rows.len() - limit
        )?;
    }
    Ok(())
}
