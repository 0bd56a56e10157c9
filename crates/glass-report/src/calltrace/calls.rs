//! `--format calls`: per function, how often and how long: count, total, self, and the
//! distribution of single calls (min, median, 99th percentile, max), in time and cycles.
//! The table is made from [`FunctionStats`], which [`stats`] sums from a built
//! [`CallTrace`] and [`super::scan`] sums straight from the file.

use std::collections::HashMap;
use std::io::{self, Write};

use super::model::{human_cycles, CallTrace};

/// The exact distribution of call durations (cycles). Most calls of a function last a
/// few hundred cycles and many last exactly as long as others, so short durations are
/// counted in a dense array indexed by the duration (8 bytes per distinct value up to
/// the longest, not per call); longer ones are kept one by one. Percentiles are exact.
#[derive(Debug, Default, Clone)]
pub struct Durations {
    dense: Vec<u64>,
    /// Durations of `DENSE` cycles or more, sorted by [`Durations::finish`].
    long: Vec<u64>,
    count: u64,
}

impl Durations {
    /// Durations below this are counted by value.
    const DENSE: u64 = 4096;

    #[inline]
    pub fn add(&mut self, cycles: u64) {
        self.count += 1;
        if cycles < Self::DENSE {
            let index = cycles as usize;
            if index >= self.dense.len() {
                let len = (index + 1)
                    .next_power_of_two()
                    .clamp(64, Self::DENSE as usize);
                self.dense.resize(len, 0);
            }
            self.dense[index] += 1;
        } else {
            self.long.push(cycles);
        }
    }

    pub fn merge(&mut self, other: Durations) {
        if other.dense.len() > self.dense.len() {
            self.dense.resize(other.dense.len(), 0);
        }
        for (sum, n) in self.dense.iter_mut().zip(other.dense) {
            *sum += n;
        }
        self.long.extend(other.long);
        self.count += other.count;
    }

    /// Sorts the long durations; call once all are added.
    pub fn finish(&mut self) {
        self.long.sort_unstable();
    }

    pub fn len(&self) -> u64 {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The `rank`-th shortest duration (0-based), after [`Durations::finish`].
    pub fn nth(&self, mut rank: u64) -> u64 {
        for (cycles, &n) in self.dense.iter().enumerate() {
            if rank < n {
                return cycles as u64;
            }
            rank -= n;
        }
        self.long
            .get(rank as usize)
            .or(self.long.last())
            .copied()
            .unwrap_or(0)
    }

    pub fn min(&self) -> u64 {
        self.nth(0)
    }

    pub fn max(&self) -> u64 {
        self.nth(self.count.saturating_sub(1))
    }

    /// The duration at percentile `p`: the nearest rank, as a sorted list gives it.
    pub fn percentile(&self, p: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = ((p / 100.0) * (self.count - 1) as f64).round() as u64;
        self.nth(rank.min(self.count - 1))
    }
}

#[derive(Debug, Default, Clone)]
pub struct FunctionStats {
    pub calls: u64,
    /// Inclusive time, recursion counted once.
    pub total: u64,
    pub self_time: u64,
    /// Inclusive cycles of every call.
    pub durations: Durations,
    pub unwound: u64,
    /// Per hardware counter, its total increase over the calls (recursion counted once).
    pub counters: Vec<u64>,
}

impl FunctionStats {
    pub fn percentile(&self, p: f64) -> u64 {
        self.durations.percentile(p)
    }

    /// Adds another part's figures (the same function on other threads).
    pub fn merge(&mut self, other: FunctionStats) {
        self.calls += other.calls;
        self.total += other.total;
        self.self_time += other.self_time;
        self.unwound += other.unwound;
        self.durations.merge(other.durations);
        if other.counters.len() > self.counters.len() {
            self.counters.resize(other.counters.len(), 0);
        }
        for (sum, value) in self.counters.iter_mut().zip(other.counters) {
            *sum += value;
        }
    }
}

pub fn stats(trace: &CallTrace) -> HashMap<u32, FunctionStats> {
    let mut stats: HashMap<u32, FunctionStats> = HashMap::new();
    for (index, call) in trace.calls.iter().enumerate() {
        let s = stats.entry(call.function).or_default();
        s.calls += 1;
        s.self_time += call.self_cycles();
        // As the scan does: a call still under way when the trace ended has no duration.
        if !call.incomplete || call.unwound {
            s.durations.add(call.cycles());
        }
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
        s.durations.finish();
    }
    stats
}

/// What the tables (calls, tree) need besides the figures: names, the cycle rate, the
/// counters.
pub struct TableContext<'a> {
    pub names: &'a HashMap<u32, String>,
    pub tsc_hz: u64,
    pub counter_names: &'a [String],
}

impl TableContext<'_> {
    pub fn duration(&self, cycles: u64) -> String {
        super::model::duration(self.tsc_hz, cycles)
    }

    pub fn name(&self, function: u32) -> &str {
        self.names
            .get(&function)
            .map_or("[unknown]", String::as_str)
    }
}

pub fn write_calls(
    trace: &CallTrace,
    header: &str,
    limit: usize,
    out: &mut dyn Write,
) -> io::Result<()> {
    let context = TableContext {
        names: &trace.names,
        tsc_hz: trace.tsc_hz,
        counter_names: &trace.counter_names,
    };
    write_table(&stats(trace), &context, header, limit, out)
}

/// The table, functions by total time (then id), at most `limit` rows.
pub fn write_table(
    stats: &HashMap<u32, FunctionStats>,
    context: &TableContext,
    header: &str,
    limit: usize,
    out: &mut dyn Write,
) -> io::Result<()> {
    writeln!(out, "{header}")?;
    // Every instrumented function has a row: one never called says so with 0 calls.
    let never_called = FunctionStats::default();
    let mut rows: Vec<(&u32, &FunctionStats)> = stats.iter().collect();
    rows.extend(
        context
            .names
            .keys()
            .filter(|id| !stats.contains_key(id))
            .map(|id| (id, &never_called)),
    );
    rows.sort_by(|a, b| b.1.total.cmp(&a.1.total).then(a.0.cmp(b.0)));
    let counter_columns: String = context
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
        if s.calls == 0 {
            writeln!(
                out,
                "{:>10} {:>11} {:>11} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}{}  {}",
                0,
                "-",
                "-",
                "-",
                "-",
                "-",
                "-",
                "-",
                "-",
                context
                    .counter_names
                    .iter()
                    .map(|_| format!(" {:>14}", "-"))
                    .collect::<String>(),
                context.name(*function)
            )?;
            continue;
        }
        // No call of it ended inside the trace: no duration to show.
        let whole = |text: String| {
            if s.durations.is_empty() {
                "-".to_string()
            } else {
                text
            }
        };
        writeln!(
            out,
            "{:>10} {:>11} {:>11} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}{counters}  {}{unwound}",
            s.calls,
            context.duration(s.total),
            context.duration(s.self_time),
            human_cycles(s.self_time),
            whole(context.duration(s.durations.min())),
            whole(context.duration(s.percentile(50.0))),
            whole(human_cycles(s.percentile(50.0))),
            whole(context.duration(s.percentile(99.0))),
            whole(context.duration(s.durations.max())),
            context.name(*function)
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_give_the_ranks_a_sorted_list_gives() {
        let mut values: Vec<u64> = (0..5000u64).map(|i| (i * 7919) % 9000).collect();
        values.extend([0, 0, 4095, 4096, 1 << 40]);
        let (mut a, mut b) = (Durations::default(), Durations::default());
        for (i, &v) in values.iter().enumerate() {
            if i % 3 == 0 {
                a.add(v)
            } else {
                b.add(v)
            }
        }
        a.merge(b);
        a.finish();
        values.sort_unstable();
        assert_eq!(a.len(), values.len() as u64);
        for (rank, &v) in values.iter().enumerate() {
            assert_eq!(a.nth(rank as u64), v, "rank {rank}");
        }
        assert_eq!((a.min(), a.max()), (0, 1 << 40));
        let rank = ((0.99) * (values.len() - 1) as f64).round() as usize;
        assert_eq!(a.percentile(99.0), values[rank]);
    }
}
