//! `--format invocations --root F`: LProfile's per-packet view. One row per call of F,
//! slowest first, with the time of each traced callee inside it, and what made it slow:
//! the callee whose time exceeds its median over all calls of F by the most.

use std::collections::HashMap;
use std::io::Write;

use super::model::{human_cycles, CallTrace};

pub struct Invocation {
    /// Order of this call among the calls of the root (by start time).
    pub number: usize,
    pub call: usize,
    /// Inclusive cycles per callee function inside this call (recursion counted once).
    pub callees: HashMap<u32, u64>,
}

pub fn invocations(trace: &CallTrace, root: u32) -> Vec<Invocation> {
    let children = trace.children();
    let mut roots: Vec<usize> = (0..trace.calls.len())
        .filter(|&i| trace.calls[i].function == root && !trace.is_nested_in_itself(i))
        .collect();
    roots.sort_by_key(|&i| trace.calls[i].start);
    roots
        .into_iter()
        .enumerate()
        .map(|(number, call)| {
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
            Invocation {
                number,
                call,
                callees,
            }
        })
        .collect()
}

fn median(values: &mut [u64]) -> u64 {
    if values.is_empty() {
        return 0;
    }
    values.sort_unstable();
    values[values.len() / 2]
}

pub fn write_invocations(
    trace: &CallTrace,
    header: &str,
    root_name: &str,
    limit: usize,
    out: &mut dyn Write,
) -> Result<(), crate::ReportError> {
    let Some(root) = trace
        .names
        .iter()
        .filter(|(_, name)| name.as_str() == root_name)
        .map(|(&id, _)| id)
        .min()
    else {
        return Err(crate::ReportError::Root(format!(
            "--root {root_name}: no traced function of that name"
        )));
    };
    let all = invocations(trace, root);
    writeln!(out, "{header}")?;
    if all.is_empty() {
        writeln!(out, "{root_name} was never called")?;
        return Ok(());
    }
    let mut durations: Vec<u64> = all.iter().map(|i| trace.calls[i.call].cycles()).collect();
    let root_median = median(&mut durations);
    let mut medians: HashMap<u32, u64> = HashMap::new();
    let functions: std::collections::BTreeSet<u32> =
        all.iter().flat_map(|i| i.callees.keys().copied()).collect();
    for function in functions {
        let mut values: Vec<u64> = all
            .iter()
            .map(|i| i.callees.get(&function).copied().unwrap_or(0))
            .collect();
        medians.insert(function, median(&mut values));
    }
    writeln!(
        out,
        "{} calls of {root_name}; median {} ({} cycles), slowest {}",
        all.len(),
        trace.duration(root_median),
        human_cycles(root_median),
        trace.duration(*durations.last().unwrap())
    )?;
    writeln!(
        out,
        "{:<8} {:>8} {:>12} {:>11} {:>10}  {:<36}  callees",
        "call", "tid", "start", "duration", "cycles", "slow because (vs median)"
    )?;
    let mut rows: Vec<&Invocation> = all.iter().collect();
    rows.sort_by(|a, b| {
        trace.calls[b.call]
            .cycles()
            .cmp(&trace.calls[a.call].cycles())
            .then(a.number.cmp(&b.number))
    });
    for invocation in rows.into_iter().take(limit) {
        let call = &trace.calls[invocation.call];
        let because = invocation
            .callees
            .iter()
            .map(|(&f, &t)| (f, t.saturating_sub(medians[&f])))
            .filter(|&(_, excess)| excess > 0)
            .max_by_key(|&(f, excess)| (excess, std::cmp::Reverse(f)))
            .map(|(f, excess)| format!("{} +{}", trace.name(f), trace.duration(excess)))
            .unwrap_or_else(|| "-".to_string());
        let mut callees: Vec<(&u32, &u64)> = invocation.callees.iter().collect();
        callees.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let callees: Vec<String> = callees
            .into_iter()
            .take(6)
            .map(|(&f, &t)| format!("{} {}", trace.name(f), trace.duration(t)))
            .collect();
        writeln!(
            out,
            "{:<8} {:>8} {:>12} {:>11} {:>10}  {:<36}  {}",
            format!("#{}", invocation.number),
            trace.threads[call.thread].1,
            format!("+{}", trace.duration(call.start - trace.first)),
            trace.duration(call.cycles()),
            human_cycles(call.cycles()),
            because,
            callees.join(", ")
        )?;
    }
    Ok(())
}
