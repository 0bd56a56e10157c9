//! The top table: per function, the share of samples it was running in (self) and the
//! share it was on the stack for (total, counted once per sample even when recursive).
//! Self time goes to the innermost function that was not inlined, as in perf; inlined
//! functions appear with their total.

use rustc_hash::{FxHashMap, FxHashSet};
use std::io::{self, Write};

use crate::model::{StackIndex, StringIndex, ThreadRow};
use crate::{Exporter, Model, ReportError, TRUNCATED_FRAME};

struct Row<'a> {
    function: &'a str,
    self_samples: u64,
    total_samples: u64,
}

/// One table for the samples of the threads `keep` accepts: its rows, best first, and
/// the samples it counts. Worked out on the model's interned stacks and names, so a
/// report of many samples never builds their stacks as strings.
fn rows<'a>(model: &'a Model, keep: impl Fn(&ThreadRow) -> bool) -> (Vec<Row<'a>>, u64) {
    let mut by_stack: FxHashMap<Option<StackIndex>, u64> = FxHashMap::default();
    let mut samples = 0;
    for thread in model.threads.iter().filter(|thread| keep(thread)) {
        for sample in &thread.samples {
            *by_stack.entry(sample.stack).or_insert(0) += sample.weight;
            samples += sample.weight;
        }
    }
    let mut self_counts: FxHashMap<StringIndex, u64> = FxHashMap::default();
    let mut total_counts: FxHashMap<StringIndex, u64> = FxHashMap::default();
    let mut seen = FxHashSet::default();
    let mut frames = Vec::new();
    for (stack, count) in by_stack {
        model.stack_frames(stack, &mut frames);
        let rows = frames.iter().map(|&frame| &model.frames[frame as usize]);
        if let Some(leaf) = rows.clone().rev().find(|row| row.inline_depth == 0) {
            *self_counts.entry(leaf.function).or_insert(0) += count;
        }
        seen.clear();
        for row in rows {
            if model.string(row.function) != TRUNCATED_FRAME && seen.insert(row.function) {
                *total_counts.entry(row.function).or_insert(0) += count;
            }
        }
    }
    let mut rows: Vec<Row> = total_counts
        .into_iter()
        .map(|(function, total_samples)| Row {
            function: model.string(function),
            self_samples: self_counts.get(&function).copied().unwrap_or(0),
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
        Ok(self.write_tables(model, out)?)
    }
}

impl Top {
    fn write_tables(&self, model: &Model, out: &mut dyn Write) -> io::Result<()> {
        writeln!(out, "{}", self.header)?;
        let samples: u64 = model
            .threads
            .iter()
            .flat_map(|thread| &thread.samples)
            .map(|sample| sample.weight)
            .sum();
        if model.off_cpu_ns > 0 {
            let on_cpu = samples - model.off_cpu_weight;
            writeln!(
                out,
                "on-CPU: {on_cpu} samples; off-CPU: {:.3} s blocked, weighed as {} samples (under [off-cpu])",
                model.off_cpu_ns as f64 / 1e9,
                model.off_cpu_weight
            )?;
        }
        if model.truncated_samples > 0 {
            writeln!(
                out,
                "note: {} of {samples} samples have a truncated stack ({}; shown under {TRUNCATED_FRAME} in folded and flame graph output)",
                model.truncated_samples,
                crate::truncation_causes(
                    model.truncated_samples,
                    model.truncated_cut,
                    model.truncated_at_depth
                )
            )?;
        }
        if self.split_threads {
            for (tid, name) in model.thread_names() {
                let (rows, samples) = rows(model, |thread| {
                    thread.tid == tid && model.string(thread.name) == name
                });
                writeln!(out, "\nthread {name} (tid {tid}): {samples} samples")?;
                table(model, &rows, samples, self.limit, out)?;
            }
            Ok(())
        } else {
            let (rows, samples) = rows(model, |_| true);
            writeln!(out)?;
            table(model, &rows, samples, self.limit, out)
        }
    }
}

fn table(
    model: &Model,
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
        let module = model
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
