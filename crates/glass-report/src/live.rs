//! The sample model kept up to date while a recording runs (`glass top`): the same
//! [`Model`] the reports are views of, with records appended in the order the recorder
//! writes them. That order is time order, so each process's module map is simply the
//! mappings seen so far (replaced at an exec, copied at a fork) rather than the
//! time-indexed [`ModuleTimeline`](crate::ModuleTimeline) a finished recording needs;
//! every sample is then appended by [`Model::add_sample`], exactly as `glass report`
//! appends it (the same names, the same glass frames, off-CPU samples weighed by their
//! blocked time, the same depth bound). [`LiveModel::prune`] drops the samples that fell
//! out of a sliding window; the interned tables only grow, by the distinct addresses.

use std::collections::HashMap;

use glass_format::{GuestTask, KernelSymbols, Meta, Module, Process, ProcessKind};

use crate::guest_tasks::{self, GuestTasks};
use crate::model::{Model, Namer, SampleIn, Source, Unit};

pub struct LiveModel {
    pub model: Model,
    namer: Namer,
    modules: Vec<Module>,
    /// Per process, its mappings (indexes into `modules`) sorted by start.
    spaces: HashMap<u32, Vec<usize>>,
    /// Per process, the program it runs now.
    process_names: HashMap<u32, String>,
    /// Per thread, its name now.
    pub thread_names: HashMap<u32, String>,
    /// The kernel's symbols, asked for at the first kernel frame.
    kernel: Option<KernelSymbols>,
    kernel_source: Box<dyn FnMut() -> KernelSymbols>,
    /// The tasks a VM guest's vCPUs ran (`--guest-btf`).
    guest_tasks: GuestTasks,
}

impl LiveModel {
    /// `kernel_symbols` is called once, at the first kernel address a sample holds (a
    /// live recording has no `KernelSymbols` record yet: the machine's own are read).
    pub fn new(kernel_symbols: Box<dyn FnMut() -> KernelSymbols>) -> LiveModel {
        LiveModel {
            model: Model::empty(Source::Samples, Unit::Nanoseconds),
            namer: Namer::new(None),
            modules: Vec::new(),
            spaces: HashMap::new(),
            process_names: HashMap::new(),
            thread_names: HashMap::new(),
            kernel: None,
            kernel_source: kernel_symbols,
            guest_tasks: GuestTasks::default(),
        }
    }

    pub fn meta(&mut self, meta: &Meta) {
        self.model.set_meta(Some(meta));
        self.namer.set_meta(meta);
    }

    pub fn process(&mut self, process: &Process) {
        match process.kind {
            ProcessKind::Forked => {
                let inherited = self
                    .spaces
                    .get(&process.parent_pid)
                    .cloned()
                    .unwrap_or_default();
                self.spaces.insert(process.pid, inherited);
            }
            ProcessKind::Exec | ProcessKind::Attached => {
                self.spaces.insert(process.pid, Vec::new());
            }
        }
        if !process.name.is_empty() {
            self.process_names.insert(process.pid, process.name.clone());
        }
    }

    pub fn module(&mut self, module: Module) {
        self.namer.symbolizer.note_module(module.pid, &module.path);
        let index = self.modules.len();
        let (pid, start, end) = (module.pid, module.start, module.end);
        self.modules.push(module);
        let modules = &self.modules;
        let space = self.spaces.entry(pid).or_default();
        // An unmapped and reused range: the older mapping gives way.
        space.retain(|&m| modules[m].end <= start || modules[m].start >= end);
        let at = space.partition_point(|&m| modules[m].start < start);
        space.insert(at, index);
    }

    /// A Python code object, which later samples' Python frames name.
    pub fn py_code(&mut self, code: glass_format::PyCode) {
        self.namer.py_codes.insert((code.pid, code.id), code);
    }

    pub fn thread(&mut self, tid: u32, name: &str) {
        if !name.is_empty() {
            self.thread_names.insert(tid, name.to_string());
        }
    }

    /// A vCPU runs another guest task from here on.
    pub fn guest_task(&mut self, task: GuestTask) {
        self.guest_tasks.add(task);
    }

    /// Appends a sample; returns the model's thread row it went to.
    pub fn sample(&mut self, sample: &SampleIn) -> usize {
        // A VM guest's kernel addresses are the guest's, named from its image or map
        // (this machine's kallsyms would name them wrongly).
        if self.kernel.is_none()
            && !self.namer.is_guest()
            && sample
                .frames
                .iter()
                .any(|&a| glass_format::is_kernel_address(a))
        {
            self.kernel = Some((self.kernel_source)());
        }
        let process = self
            .process_names
            .get(&sample.pid)
            .cloned()
            .unwrap_or_else(|| format!("pid {}", sample.pid));
        let mut thread_name = self
            .thread_names
            .get(&sample.tid)
            .map_or("thread", String::as_str)
            .to_string();
        let task = self.guest_tasks.at(sample.pid, sample.tid, sample.time_ns);
        let guest_user = task.and_then(guest_tasks::user_frame);
        let process = match task {
            Some(task) => {
                thread_name = guest_tasks::thread_label(&thread_name, task);
                guest_tasks::process_label(task)
            }
            None => process,
        };
        let sample = &SampleIn {
            guest_user: guest_user.as_deref(),
            ..*sample
        };
        let (modules, spaces) = (&self.modules, &self.spaces);
        let space = spaces.get(&sample.pid);
        // A guest process's user addresses are in its own modules (--guest-root).
        let user_space = task
            .and_then(GuestTask::user_space)
            .and_then(|pid| spaces.get(&pid));
        let mut module_of = |address: u64| {
            let space = match user_space {
                Some(user) if !glass_format::is_kernel_address(address) => user,
                _ => space?,
            };
            let at = space.partition_point(|&m| modules[m].start <= address);
            let index = *space.get(at.checked_sub(1)?)?;
            (address < modules[index].end).then(|| (index, &modules[index]))
        };
        self.model.add_sample(
            &mut self.namer,
            sample,
            &process,
            &thread_name,
            self.kernel.as_ref(),
            &mut module_of,
        )
    }

    /// Drops every sample older than `start` (ns).
    pub fn prune(&mut self, start: u64) {
        for thread in &mut self.model.threads {
            thread.samples.retain(|s| s.time >= start);
        }
    }

    /// Warnings the symbolizer has not handed out yet.
    pub fn take_warnings(&mut self) -> Vec<String> {
        std::mem::take(&mut self.namer.symbolizer.warnings)
    }
}
