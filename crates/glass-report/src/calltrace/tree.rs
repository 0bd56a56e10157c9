//! `--format tree`: the call tree, calls merged by path (as `uftrace graph` shows it):
//! total time and calls per node, children by total time. Calls deeper than
//! [`MAX_DEPTH`](crate::MAX_DEPTH) are one line, [`DEEPER_FRAME`](crate::DEEPER_FRAME),
//! with their time and calls (an indentation as deep as the calls would make the text
//! grow with the square of the depth).

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
        let below = &children[node as usize];
        if depth + 1 == crate::MAX_DEPTH && !below.is_empty() {
            // Everything deeper, as one line (the calls of its first level).
            let (total, calls) = below.iter().fold((0, 0), |(t, c), &b| {
                let b = &tree.nodes[b as usize];
                (t + b.total, c + b.calls)
            });
            if lines == limit {
                writeln!(out, "... (more lines: raise --limit)")?;
                break;
            }
            lines += 1;
            writeln!(
                out,
                "{:>11} {:>10}  {}{}",
                context.duration(total),
                calls,
                "  ".repeat(depth + 1),
                crate::DEEPER_FRAME
            )?;
            continue;
        }
        stack.extend(below.iter().rev().map(|&c| (c, depth + 1)));
    }
    Ok(())
}
