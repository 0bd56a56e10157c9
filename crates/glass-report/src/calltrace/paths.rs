//! Calls merged by call path (the functions from a thread's outermost traced call down
//! to the call): calls, inclusive and self time per path. `--format tree` draws it and
//! a trace's flame graph is its self times. Its size is that of the distinct paths, not
//! of the calls, so [`super::scan`] sums it while the file streams by; it is also made
//! from a built [`CallTrace`] (the diff of two traces), the same way.
//!
//! Each path remembers its first call as (thread index, the call's ordinal among its
//! thread's calls): paths of equal time are drawn in the order their first calls came
//! in the recording, whichever worker or order summed them.

use rustc_hash::FxHashMap;

use super::model::CallTrace;

/// The node every thread's outermost calls hang under.
pub const ROOT: u32 = 0;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathNode {
    pub function: u32,
    pub parent: u32,
    pub calls: u64,
    /// Inclusive cycles of the calls of this path.
    pub total: u64,
    /// Cycles outside traced callees.
    pub self_time: u64,
    /// The first call of the path: (thread index, ordinal of the call in its thread).
    pub first: (u32, u64),
}

#[derive(Debug, Clone)]
pub struct PathTree {
    /// Parents before their children; node 0 is the root.
    pub nodes: Vec<PathNode>,
    index: FxHashMap<(u32, u32), u32>,
}

impl Default for PathTree {
    fn default() -> PathTree {
        PathTree {
            nodes: vec![PathNode {
                function: u32::MAX,
                parent: ROOT,
                calls: 0,
                total: 0,
                self_time: 0,
                first: (0, 0),
            }],
            index: FxHashMap::default(),
        }
    }
}

impl PathTree {
    /// The node of `function` called under `parent`, made if new.
    #[inline]
    pub fn child(&mut self, parent: u32, function: u32, first: (u32, u64)) -> u32 {
        let next = self.nodes.len() as u32;
        let node = *self.index.entry((parent, function)).or_insert(next);
        if node == next {
            self.nodes.push(PathNode {
                function,
                parent,
                calls: 0,
                total: 0,
                self_time: 0,
                first,
            });
        } else if first < self.nodes[node as usize].first {
            self.nodes[node as usize].first = first;
        }
        node
    }

    /// A call of path `node` ended: `cycles` inclusive, `children` in traced callees.
    #[inline]
    pub fn close(&mut self, node: u32, cycles: u64, children: u64) {
        let n = &mut self.nodes[node as usize];
        n.calls += 1;
        n.total += cycles;
        n.self_time += cycles.saturating_sub(children);
    }

    /// Adds another part's paths (other threads).
    pub fn merge(&mut self, other: PathTree) {
        // Parents come before their children, so each parent is already mapped.
        let mut mapped = vec![ROOT; other.nodes.len()];
        for (i, node) in other.nodes.into_iter().enumerate().skip(1) {
            let here = self.child(mapped[node.parent as usize], node.function, node.first);
            let n = &mut self.nodes[here as usize];
            n.calls += node.calls;
            n.total += node.total;
            n.self_time += node.self_time;
            mapped[i] = here;
        }
    }

    /// The paths of a built trace.
    pub fn of_calls(trace: &CallTrace) -> PathTree {
        let mut tree = PathTree::default();
        let mut node_of_call: Vec<u32> = Vec::with_capacity(trace.calls.len());
        let mut thread = usize::MAX;
        let mut ordinal = 0u64;
        for call in &trace.calls {
            if call.thread != thread {
                (thread, ordinal) = (call.thread, 0);
            }
            let parent = call.parent.map_or(ROOT, |p| node_of_call[p]);
            let node = tree.child(parent, call.function, (thread as u32, ordinal));
            tree.close(node, call.cycles(), call.children);
            node_of_call.push(node);
            ordinal += 1;
        }
        tree
    }

    /// Each node's children, largest total first (then first call first).
    pub fn children(&self) -> Vec<Vec<u32>> {
        let mut children = vec![Vec::new(); self.nodes.len()];
        for (i, node) in self.nodes.iter().enumerate().skip(1) {
            children[node.parent as usize].push(i as u32);
        }
        for list in &mut children {
            list.sort_by(|&a, &b| {
                let (a, b) = (&self.nodes[a as usize], &self.nodes[b as usize]);
                b.total.cmp(&a.total).then(a.first.cmp(&b.first))
            });
        }
        children
    }

    /// Folded stacks weighted by self time, in nanoseconds at `tsc_hz` (cycles when 0),
    /// paths of the same names merged, weights under one unit left out, sorted. Paths
    /// are written from a walk of the tree with one path buffer, and end at
    /// [`MAX_DEPTH`](crate::MAX_DEPTH): a node there is drawn as
    /// [`DEEPER_FRAME`](crate::DEEPER_FRAME) with its whole subtree's time, so the lines
    /// take at most `MAX_DEPTH` names each, whatever the depth of the calls.
    pub fn folded(&self, name: impl Fn(u32) -> String, tsc_hz: u64) -> Vec<String> {
        let mut children: Vec<Vec<u32>> = vec![Vec::new(); self.nodes.len()];
        for (i, node) in self.nodes.iter().enumerate().skip(1) {
            children[node.parent as usize].push(i as u32);
        }
        let mut names: FxHashMap<u32, String> = FxHashMap::default();
        let mut weights: FxHashMap<String, u64> = FxHashMap::default();
        let mut path = String::new();
        // (node, its depth (0 under the root), the path's length before its name)
        let mut stack: Vec<(u32, usize, usize)> = children[ROOT as usize]
            .iter()
            .rev()
            .map(|&n| (n, 0, 0))
            .collect();
        while let Some((node, depth, before)) = stack.pop() {
            path.truncate(before);
            if depth > 0 {
                path.push(';');
            }
            let n = &self.nodes[node as usize];
            let weight = if depth == crate::MAX_DEPTH {
                path.push_str(crate::DEEPER_FRAME);
                n.total
            } else {
                let name = names.entry(n.function).or_insert_with(|| name(n.function));
                path.push_str(name);
                let below = path.len();
                stack.extend(
                    children[node as usize]
                        .iter()
                        .rev()
                        .map(|&c| (c, depth + 1, below)),
                );
                n.self_time
            };
            match weights.get_mut(path.as_str()) {
                Some(sum) => *sum += weight,
                None => {
                    weights.insert(path.clone(), weight);
                }
            }
        }
        let mut lines: Vec<String> = weights
            .into_iter()
            .map(|(path, cycles)| {
                let weight = if tsc_hz == 0 {
                    cycles as f64
                } else {
                    super::model::ns(tsc_hz, cycles)
                };
                (path, weight)
            })
            .filter(|(_, w)| *w >= 1.0)
            .map(|(mut path, w)| {
                path.push(' ');
                path.push_str(&(w.round() as u64).to_string());
                path
            })
            .collect();
        lines.sort_unstable();
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merging_keeps_the_first_call_and_sums_the_figures() {
        let mut a = PathTree::default();
        let outer = a.child(ROOT, 5, (1, 0));
        let inner = a.child(outer, 6, (1, 1));
        a.close(inner, 10, 0);
        a.close(outer, 30, 10);
        let mut b = PathTree::default();
        let inner_first = b.child(ROOT, 6, (0, 0));
        b.close(inner_first, 4, 0);
        let outer = b.child(ROOT, 5, (0, 1));
        let inner = b.child(outer, 6, (0, 2));
        b.close(inner, 2, 0);
        b.close(outer, 3, 2);
        a.merge(b);
        let node = |tree: &PathTree, path: &[u32]| {
            let mut at = ROOT;
            for &f in path {
                at = tree.index[&(at, f)];
            }
            tree.nodes[at as usize].clone()
        };
        let outer = node(&a, &[5]);
        assert_eq!((outer.calls, outer.total, outer.self_time), (2, 33, 21));
        assert_eq!(outer.first, (0, 1));
        assert_eq!(node(&a, &[5, 6]).total, 12);
        assert_eq!(node(&a, &[6]).first, (0, 0));
        // Outer (33) before the lone inner (4) under the root.
        let children = a.children();
        let names: Vec<u32> = children[ROOT as usize]
            .iter()
            .map(|&c| a.nodes[c as usize].function)
            .collect();
        assert_eq!(names, [5, 6]);
        let folded = a.folded(|f| format!("f{f}"), 0);
        assert_eq!(folded, ["f5 21", "f5;f6 12", "f6 4"]);
    }
}
