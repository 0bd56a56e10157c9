//! `--format calls`: per function, how often and how long: count, total, self, and the
//! distribution of single calls (min, median, 99th percentile, max), in time and cycles.

use std::collections::HashMap;
use std::io::{self, Write};

use super::model::{human_cycles, CallTrace};

#[derive(Debug, Default, Clone)]
pub struct FunctionStats {
    pub calls: u64,
    /// Inclusive time, recursion counted once.
    pub total: u64,
    pub self_time: u64,
    /// Inclusive cycles of every call, sorted.
    pub each: Vec<u64>,
    pub unwound: u64,
    /// Per hardware counter, its total increase over the calls (recursion counted once).
    pub counters: Vec<u64>,
}

impl FunctionStats {
    pub fn percentile(&self, p: f64) -> u64 {
        if self.each.is_empty() {
            return 0;
        }
        let rank = ((p / 100.0) * (self.each.len() - 1) as f64).round() as usize;
        self.each[rank.min(self.each.len() - 1)]
    }
}

pub fn stats(trace: &CallTrace) -> HashMap<u32, FunctionStats> {
    let mut stats: HashMap<u32, FunctionStats> = HashMap::new();
    for (index, call) in trace.calls.iter().enumerate() {
        let s = stats.entry(call.function).or_default();
        s.calls += 1;
        s.self_time += call.self_cycles();
        s.each.push(call.cycles());
        s.unwound += call.unwound as u64;
        if !trace.is_nested_in_itself(index) {
            s.total += call.cycles();
            let values = trace.counters_of(index);
            s.counters.resize(values.len(), 0);
            for (sum, value) in s.counters.iter_mut().zip(values) {
                *sum += value;
            }
        }
    }
    for s in stats.values_mut() {
        s.each.sort_unstable();
    }
    stats
}

pub fn write_calls(
    trace: &CallTrace,
    header: &str,
    limit: usize,
    out: &mut dyn Write,
) -> io::Result<()> {
    writeln!(out, "{header}")?;
    let stats = stats(trace);
    let mut rows: Vec<(&u32, &FunctionStats)> = stats.iter().collect();
    rows.sort_by(|a, b| b.1.total.cmp(&a.1.total).then(a.0.cmp(b.0)));
    let counter_columns: String = trace
        .counter_names
        .iter()
        .map(|name| format!(" {:>14}", format!("{name}/call")))
        .collect();
    writeln!(
        out,
        "{:>10} {:>11} {:>11} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}{counter_columns}  function",
        "calls", "total", "self", "self cyc", "min", "p50", "p50 cyc", "p99", "max"
    )?;
    for (function, s) in rows.into_iter().take(limit) {
        let unwound = if s.unwound > 0 {
            format!("  ({} unwound)", s.unwound)
        } else {
            String::new()
        };
        let counters: String = s
            .counters
            .iter()
            .map(|&sum| format!(" {:>14}", human_cycles(sum / s.calls.max(1))))
            .collect();
        writeln!(
            out,
            "{:>10} {:>11} {:>11} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}{counters}  {}{unwound}",
            s.calls,
            trace.duration(s.total),
            trace.duration(s.self_time),
            human_cycles(s.self_time),
            trace.duration(s.each[0]),
            trace.duration(s.percentile(50.0)),
            human_cycles(s.percentile(50.0)),
            trace.duration(s.percentile(99.0)),
            trace.duration(*s.each.last().unwrap()),
            trace.name(*function)
        )?;
    }
    Ok(())
}
