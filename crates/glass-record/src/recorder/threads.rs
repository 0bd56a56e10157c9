//! The processes and threads a recording met: the names the file has for each thread
//! (written again only when a thread renames itself), which threads have samples, and
//! the samples the kernel dropped per thread. The summary counts them and the CLI names
//! the threads that lost samples.

// Looked up for every sample: foldhash, not SipHash (which showed in glass's profile of
// itself in a Xen dom0).
use foldhash::{HashMap, HashSet};

#[derive(Default)]
pub(super) struct Threads {
    /// The name the file has for each thread.
    names: HashMap<i32, String>,
    seen: HashSet<i32>,
    /// Threads with at least one sample: the count the reports give.
    sampled: HashSet<i32>,
    processes: HashSet<i32>,
    /// Per (pid, tid): samples the kernel dropped (perf backend).
    lost: HashMap<(i32, i32), u64>,
}

impl Threads {
    pub(super) fn process_seen(&mut self, pid: i32) {
        self.processes.insert(pid);
    }

    /// A process started again (attached, or exec'd): its main thread's name is
    /// written again.
    pub(super) fn process_replaced(&mut self, pid: i32) {
        self.names.remove(&pid);
    }

    /// The processes met, by pid.
    pub(super) fn processes(&self) -> Vec<i32> {
        let mut pids: Vec<i32> = self.processes.iter().copied().collect();
        pids.sort_unstable();
        pids
    }

    pub(super) fn process_count(&self) -> u32 {
        self.processes.len() as u32
    }

    pub(super) fn seen(&mut self, tid: i32) {
        self.seen.insert(tid);
    }

    pub(super) fn seen_count(&self) -> u32 {
        self.seen.len() as u32
    }

    /// Whether `name` is one to write for `tid`: not empty, and not the one the file has.
    pub(super) fn is_new_name(&self, tid: i32, name: &str) -> bool {
        !name.is_empty() && self.names.get(&tid).is_none_or(|known| known != name)
    }

    /// The file has `name` for `tid` now.
    pub(super) fn named(&mut self, tid: i32, name: String) {
        self.names.insert(tid, name);
        self.seen.insert(tid);
    }

    pub(super) fn is_named(&self, tid: i32) -> bool {
        self.names.contains_key(&tid)
    }

    pub(super) fn sampled(&mut self, tid: i32) {
        self.sampled.insert(tid);
    }

    pub(super) fn sampled_count(&self) -> u32 {
        self.sampled.len() as u32
    }

    pub(super) fn lost_by(&mut self, pid: i32, tid: i32, count: u64) {
        *self.lost.entry((pid, tid)).or_insert(0) += count;
    }

    /// Samples lost per thread, most first: (pid, tid, thread name, count).
    pub(super) fn lost_by_thread(&self) -> Vec<(i32, i32, String, u64)> {
        let mut lost: Vec<_> = self
            .lost
            .iter()
            .map(|(&(pid, tid), &count)| {
                let name = self.names.get(&tid).cloned().unwrap_or_default();
                (pid, tid, name, count)
            })
            .collect();
        lost.sort_by(|a, b| b.3.cmp(&a.3).then(a.1.cmp(&b.1)));
        lost
    }
}
