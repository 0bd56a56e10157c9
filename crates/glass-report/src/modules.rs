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
        self.find_depth(pid, time_ns, address, 0)
    }

    fn find_depth(&self, pid: u32, time_ns: u64, address: u64, depth: u32) -> Option<&Module> {
        let history = self.processes.get(&pid)?;
        // The map in force began at the last exec (or attach) before the sample.
        let epoch = history
            .epochs
            .iter()
            .copied()
            .filter(|&t| t <= time_ns)
            .max();
        let found = history
            .modules
            .iter()
            .rev()
            // Mappings are recorded when glass first sees code in them, which can be just
            // after the first sample in them: within an epoch, time does not exclude.
            .filter(|m| epoch.is_none_or(|e| m.time_ns >= e))
            .find(|m| address >= m.start && address < m.end);
        if found.is_some() {
            return found;
        }
        // Without an exec of its own, a forked child still runs its parent's code.
        match (history.forked_from, epoch) {
            (Some((parent, fork_time)), None) if depth < 64 => {
                self.find_depth(parent, fork_time.min(time_ns), address, depth + 1)
            }
            _ => None,
        }
    }
}
