//! `--format tree`: the call tree, calls merged by path (as `uftrace graph` shows it):
//! total time and calls per node, children by total time.

use std::io::{self, Write};

use super::calls::TableContext;
use super::paths::{PathTree, ROOT};

pub fn write_tree(
    tree: &PathTree,
    context: &TableContext,
    header: &str,
    limit: usize,
    out: &mut dyn Write,
) -> io::Result<()> {
    writeln!(out, "{header}")?;
    writeln!(out, "{:>11} {:>10}  function", "total", "calls")?;
    let children = tree.children();
    let mut lines = 0;
    let mut stack: Vec<(u32, usize)> = children[ROOT as usize]
        .iter()
        .rev()
        .map(|&n| (n, 0))
        .collect();
    while let Some((node, depth)) = stack.pop() {
        if lines == limit {
            writeln!(out, "... (more lines: raise --limit)")?;
            break;
        }
        lines += 1;
        let n = &tree.nodes[node as usize];
        writeln!(
            out,
            "{:>11} {:>10}  {}{}",
            context.duration(n.total),
            n.calls,
            "  ".repeat(depth),
            context.name(n.function)
        )?;
        stack.extend(
            children[node as usize]
                .iter()
                .rev()
                .map(|&c| (c, depth + 1)),
        );
    }
    Ok(())
}
