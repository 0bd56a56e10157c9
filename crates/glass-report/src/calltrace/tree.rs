//! `--format tree`: the call tree, calls merged by path (as `uftrace graph` shows it):
//! total time and calls per node, children by total time.

use std::collections::HashMap;
use std::io::{self, Write};

use super::model::CallTrace;

#[derive(Default)]
struct Node {
    function: u32,
    calls: u64,
    total: u64,
    children: Vec<usize>,
}

pub fn write_tree(
    trace: &CallTrace,
    header: &str,
    limit: usize,
    out: &mut dyn Write,
) -> io::Result<()> {
    writeln!(out, "{header}")?;
    // Node 0 is the root that holds every thread's outermost calls.
    let mut nodes = vec![Node::default()];
    let mut index_of: HashMap<(usize, u32), usize> = HashMap::new();
    let mut node_of_call = Vec::with_capacity(trace.calls.len());
    for call in &trace.calls {
        let parent = call.parent.map_or(0, |p| node_of_call[p]);
        let next = nodes.len();
        let node = *index_of.entry((parent, call.function)).or_insert(next);
        if node == next {
            nodes.push(Node {
                function: call.function,
                ..Node::default()
            });
            nodes[parent].children.push(node);
        }
        nodes[node].calls += 1;
        nodes[node].total += call.cycles();
        node_of_call.push(node);
    }
    writeln!(out, "{:>11} {:>10}  function", "total", "calls")?;
    let mut lines = 0;
    let mut stack: Vec<(usize, usize)> = Vec::new();
    let mut roots = nodes[0].children.clone();
    roots.sort_by(|a, b| nodes[*b].total.cmp(&nodes[*a].total));
    stack.extend(roots.into_iter().rev().map(|n| (n, 0)));
    while let Some((node, depth)) = stack.pop() {
        if lines == limit {
            writeln!(out, "... (more lines: raise --limit)")?;
            break;
        }
        lines += 1;
        let n = &nodes[node];
        writeln!(
            out,
            "{:>11} {:>10}  {}{}",
            trace.duration(n.total),
            n.calls,
            "  ".repeat(depth),
            trace.name(n.function)
        )?;
        let mut children = n.children.clone();
        children.sort_by(|a, b| nodes[*b].total.cmp(&nodes[*a].total));
        stack.extend(children.into_iter().rev().map(|c| (c, depth + 1)));
    }
    Ok(())
}
