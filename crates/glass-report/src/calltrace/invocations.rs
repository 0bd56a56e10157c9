//! `--format invocations --root F`: LProfile's per-packet view. One row per call of F,
//! slowest first, with the time of each traced callee inside it, and what made it slow:
//! the callee whose time exceeds its median over all calls of F by the most.

use std::collections::HashMap;
use std::io::Write;

use super::calls::{Durations, TableContext};
use super::model::{human_cycles, CallTrace};

/// One call of the root (not inside another call of it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    pub tid: u32,
    /// Cycles since the recording's first record.
    pub start: u64,
    pub cycles: u64,
    /// Its callees: `count` entries of `Invocations::parts[part]` from `first`.
    pub part: u32,
    pub first: usize,
    pub count: u32,
}

/// Callee times of many invocations, packed one after another (a vector per
/// invocation would cost an allocation and its slack for each of millions of rows).
#[derive(Debug, Default, Clone)]
pub struct Callees {
    functions: Vec<u32>,
    cycles: Vec<u64>,
}

impl Callees {
    pub fn len(&self) -> usize {
        self.functions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.functions.is_empty()
    }

    pub fn push(&mut self, function: u32, cycles: u64) {
        self.functions.push(function);
        self.cycles.push(cycles);
    }
}

/// The invocations of a root, by start: per invocation of the root, the inclusive cycles
/// of each callee function inside it (a function's time counts at its outermost call),
/// by function id.
#[derive(Debug, Default)]
pub struct Invocations {
    pub rows: Vec<Invocation>,
    pub parts: Vec<Callees>,
}

impl Invocations {
    /// `row`'s callees: (function id, inclusive cycles), by function id.
    pub fn callees(&self, row: &Invocation) -> impl Iterator<Item = (u32, u64)> + '_ {
        let part = &self.parts[row.part as usize];
        let range = row.first..row.first + row.count as usize;
        part.functions[range.clone()]
            .iter()
            .copied()
            .zip(part.cycles[range].iter().copied())
    }
}

/// The traced function `--root` names (the lowest id of that name).
pub fn root_id(names: &HashMap<u32, String>, root_name: &str) -> Result<u32, crate::ReportError> {
    names
        .iter()
        .filter(|(_, name)| name.as_str() == root_name)
        .map(|(&id, _)| id)
        .min()
        .ok_or_else(|| {
            crate::ReportError::Root(format!(
                "--root {root_name}: no traced function of that name"
            ))
        })
}

/// The invocations of `root` in a built trace, by start time.
pub fn invocations(trace: &CallTrace, root: u32) -> Invocations {
    let children = trace.children();
    let mut roots: Vec<usize> = (0..trace.calls.len())
        .filter(|&i| trace.calls[i].function == root && !trace.is_nested_in_itself(i))
        .collect();
    roots.sort_by_key(|&i| trace.calls[i].start);
    let mut packed = Callees::default();
    let rows = roots
        .into_iter()
        .map(|call| {
            let mut callees: HashMap<u32, u64> = HashMap::new();
            // Depth-first over the subtree; a function's time counts at its outermost call.
            let mut stack: Vec<(usize, Vec<u32>)> =
                children[call].iter().map(|&c| (c, Vec::new())).collect();
            while let Some((index, open)) = stack.pop() {
                let c = &trace.calls[index];
                let mut open = open;
                if !open.contains(&c.function) {
                    *callees.entry(c.function).or_default() += c.cycles();
                    open.push(c.function);
                }
                for &child in &children[index] {
                    stack.push((child, open.clone()));
                }
            }
            let c = &trace.calls[call];
            let mut callees: Vec<(u32, u64)> = callees.into_iter().collect();
            callees.sort_unstable();
            let first = packed.len();
            for &(function, cycles) in &callees {
                packed.push(function, cycles);
            }
            Invocation {
                tid: trace.threads[c.thread].1,
                start: c.start - trace.first,
                cycles: c.cycles(),
                part: 0,
                first,
                count: callees.len() as u32,
            }
        })
        .collect();
    Invocations {
        rows,
        parts: vec![packed],
    }
}

fn median(values: &mut [u64]) -> u64 {
    if values.is_empty() {
        return 0;
    }
    values.sort_unstable();
    values[values.len() / 2]
}

/// The table: a summary line, then the `limit` slowest invocations (numbered by start,
/// from 0), each with what made it slow and its largest callees.
pub fn write_invocations(
    invocations: &Invocations,
    context: &TableContext,
    header: &str,
    root_name: &str,
    limit: usize,
    out: &mut dyn Write,
) -> Result<(), crate::ReportError> {
    let all = &invocations.rows;
    writeln!(out, "{header}")?;
    if all.is_empty() {
        writeln!(out, "{root_name} was never called")?;
        return Ok(());
    }
    let mut durations: Vec<u64> = all.iter().map(|i| i.cycles).collect();
    let root_median = median(&mut durations);
    // Per callee, the median of its time over every invocation (0 where it was not
    // called): counted as calls' durations are, not listed (a list per callee of every
    // invocation would be most of the report's memory).
    let mut times: HashMap<u32, Durations> = HashMap::new();
    for invocation in all {
        for (function, cycles) in invocations.callees(invocation) {
            times.entry(function).or_default().add(cycles);
        }
    }
    let rank = all.len() as u64 / 2;
    let medians: HashMap<u32, u64> = times
        .into_iter()
        .map(|(function, mut durations)| {
            durations.finish();
            let zeros = all.len() as u64 - durations.len();
            let median = rank.checked_sub(zeros).map_or(0, |r| durations.nth(r));
            (function, median)
        })
        .collect();
    writeln!(
        out,
        "{} calls of {root_name}; median {} ({} cycles), slowest {}",
        all.len(),
        context.duration(root_median),
        human_cycles(root_median),
        context.duration(*durations.last().unwrap())
    )?;
    writeln!(
        out,
        "{:<8} {:>8} {:>12} {:>11} {:>10}  {:<36}  callees",
        "call", "tid", "start", "duration", "cycles", "slow because (vs median)"
    )?;
    let mut rows: Vec<(usize, &Invocation)> = all.iter().enumerate().collect();
    rows.sort_by(|(a_number, a), (b_number, b)| {
        b.cycles.cmp(&a.cycles).then(a_number.cmp(b_number))
    });
    for (number, invocation) in rows.into_iter().take(limit) {
        let because = invocations
            .callees(invocation)
            .map(|(f, t)| (f, t.saturating_sub(medians[&f])))
            .filter(|&(_, excess)| excess > 0)
            .max_by_key(|&(f, excess)| (excess, std::cmp::Reverse(f)))
            .map(|(f, excess)| format!("{} +{}", context.name(f), context.duration(excess)))
            .unwrap_or_else(|| "-".to_string());
        let mut callees: Vec<(u32, u64)> = invocations.callees(invocation).collect();
        callees.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let callees: Vec<String> = callees
            .into_iter()
            .take(6)
            .map(|(f, t)| format!("{} {}", context.name(f), context.duration(t)))
            .collect();
        writeln!(
            out,
            "{:<8} {:>8} {:>12} {:>11} {:>10}  {:<36}  {}",
            format!("#{number}"),
            invocation.tid,
            format!("+{}", context.duration(invocation.start)),
            context.duration(invocation.cycles),
            human_cycles(invocation.cycles),
            because,
            callees.join(", ")
        )?;
    }
    Ok(())
}
