//! Which module an address belonged to at the time of a sample. Module records are per
//! process and time-stamped: an exec starts a new map, a fork starts with the parent's
//! map as it was at the fork, and code mapped later (dlopen) applies from its record on.

use std::collections::HashMap;

use glass_format::{Module, ProcessKind, Recording};

#[derive(Default)]
struct ProcessHistory {
    /// Mappings in recording order.
    modules: Vec<Module>,
    /// The last exec or attach: earlier mappings do not apply after it.
    epochs: Vec<u64>,
    /// The parent and the time of the fork, for a forked process.
    forked_from: Option<(u32, u64)>,
}

pub struct ModuleTimeline {
    processes: HashMap<u32, ProcessHistory>,
}

impl ModuleTimeline {
    pub fn new(recording: &Recording) -> Self {
        let mut processes: HashMap<u32, ProcessHistory> = HashMap::new();
        for process in &recording.processes {
            let history = processes.entry(process.pid).or_default();
            match process.kind {
                ProcessKind::Forked => {
                    history.forked_from = Some((process.parent_pid, process.time_ns))
                }
                ProcessKind::Exec | ProcessKind::Attached => history.epochs.push(process.time_ns),
            }
        }
        for module in &recording.modules {
            processes
                .entry(module.pid)
                .or_default()
                .modules
                .push(module.clone());
        }
        ModuleTimeline { processes }
    }

    /// The module containing `address` in process `pid` at `time_ns`.
    pub fn find(&self, pid: u32, time_ns: u64, address: u64) -> Option<&Module> {
        self.in_force(pid, time_ns)
            .into_iter()
            .find(|m| address >= m.start && address < m.end)
    }

    /// The start of the epoch (last exec or attach) a sample at `time_ns` falls in: with
    /// the pid, it names one address space.
    pub fn epoch(&self, pid: u32, time_ns: u64) -> Option<u64> {
        let history = self.processes.get(&pid)?;
        history
            .epochs
            .iter()
            .copied()
            .filter(|&t| t <= time_ns)
            .max()
    }

    /// Every mapping in force in `pid` at `time_ns`, latest recorded first.
    pub fn in_force(&self, pid: u32, time_ns: u64) -> Vec<&Module> {
        let mut found = Vec::new();
        self.collect(pid, time_ns, 0, &mut found);
        found
    }

    fn collect<'a>(&'a self, pid: u32, time_ns: u64, depth: u32, found: &mut Vec<&'a Module>) {
        let Some(history) = self.processes.get(&pid) else {
            return;
        };
        // The map in force began at the last exec (or attach) before the sample and
        // ends at the next one.
        let epoch = history
            .epochs
            .iter()
            .copied()
            .filter(|&t| t <= time_ns)
            .max();
        let next = history
            .epochs
            .iter()
            .copied()
            .filter(|&t| t > time_ns)
            .min();
        found.extend(
            history
                .modules
                .iter()
                .rev()
                // Mappings are recorded when glass first sees code in them, which can be
                // just after the first sample in them: within an epoch, time does not
                // exclude.
                .filter(|m| {
                    epoch.is_none_or(|e| m.time_ns >= e) && next.is_none_or(|n| m.time_ns < n)
                }),
        );
        // Without an exec of its own, a forked child still runs its parent's code.
        if let (Some((parent, fork_time)), None) = (history.forked_from, epoch) {
            if depth < 64 {
                self.collect(parent, fork_time.min(time_ns), depth + 1, found);
            }
        }
    }
}
