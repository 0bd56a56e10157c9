//! Which task of a VM guest's operating system each guest sample ran in (GuestTask
//! records, `glass record --guest-btf`): the record says a vCPU runs a task from its
//! time on, so a sample's task is the vCPU's last record at or before the sample.
//! Reports name the task as Linux users know it: `userspin (pid 52)` as the process,
//! `vcpu0: userspin (pid 52)` as the thread, and a sample in the task's user space
//! `[user] userspin` where its binaries were not given (`--guest-root`: then its user
//! frames are named from its own modules, [`GuestTask::user_space`]).

use std::collections::HashMap;

use glass_format::{GuestTask, Recording, GUEST_TASK_KERNEL_THREAD, GUEST_TASK_UNKNOWN};

/// The guest tasks of a whole recording, by vCPU.
#[derive(Default)]
pub struct GuestTasks {
    /// Per (pid, tid): (time, index into `tasks`), in time order.
    by_vcpu: HashMap<(u32, u32), Vec<(u64, usize)>>,
    tasks: Vec<GuestTask>,
}

impl GuestTasks {
    pub fn new(recording: &Recording) -> GuestTasks {
        let mut tasks = GuestTasks::default();
        for task in &recording.guest_tasks {
            tasks.add(task.clone());
        }
        for list in tasks.by_vcpu.values_mut() {
            list.sort_by_key(|&(time, _)| time);
        }
        tasks
    }

    /// A record read in file order (the live view's).
    pub fn add(&mut self, task: GuestTask) {
        self.by_vcpu
            .entry((task.pid, task.tid))
            .or_default()
            .push((task.time_ns, self.tasks.len()));
        self.tasks.push(task);
    }

    /// The task vCPU `tid` of `pid` ran at `time_ns` (None: unknown, or no record).
    pub fn at(&self, pid: u32, tid: u32, time_ns: u64) -> Option<&GuestTask> {
        let list = self.by_vcpu.get(&(pid, tid))?;
        let index = list.partition_point(|&(time, _)| time <= time_ns);
        let task = &self.tasks[list.get(index.checked_sub(1)?)?.1];
        (task.flags & GUEST_TASK_UNKNOWN == 0).then_some(task)
    }

    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }
}

/// The guest process, as a process name: `userspin (pid 52)`.
pub fn process_label(task: &GuestTask) -> String {
    format!("{} (pid {})", task.comm, task.task_tgid)
}

/// The guest task on a vCPU, as a thread name: `vcpu0: userspin (pid 52)`, with the
/// thread's own id where it is not the process's (`tid 53`).
pub fn thread_label(vcpu: &str, task: &GuestTask) -> String {
    if task.task_pid == task.task_tgid {
        format!("{vcpu}: {}", process_label(task))
    } else {
        format!(
            "{vcpu}: {} (pid {}, tid {})",
            task.comm, task.task_tgid, task.task_pid
        )
    }
}

/// The frame a sample in the task's user space is shown as (`[user] userspin`); None
/// for a kernel thread, which has none.
pub fn user_frame(task: &GuestTask) -> Option<String> {
    (task.flags & GUEST_TASK_KERNEL_THREAD == 0).then(|| format!("[user] {}", task.comm))
}
