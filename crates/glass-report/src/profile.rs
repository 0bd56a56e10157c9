//! The one in-memory profile every format is made from: distinct symbolized stacks
//! (root first) with their sample counts.

use std::collections::HashMap;

use glass_format::{Recording, SAMPLE_FIRMWARE, SAMPLE_HALTED, SAMPLE_TRUNCATED};
use glass_symbols::{ModuleRef, Symbolizer};

use crate::modules::ModuleTimeline;
use crate::{FIRMWARE_FRAME, HALTED_FRAME, TRUNCATED_FRAME, UNKNOWN_FRAME};

#[derive(Debug, Clone, Default)]
pub struct ProfileOptions {
    /// Put each thread under its own frame (`name/tid`) below the process.
    pub split_threads: bool,
    /// Keep only this thread.
    pub tid: Option<u32>,
    /// Leave out samples of halted (idle) VM guest vCPUs.
    pub no_idle: bool,
}

/// One distinct stack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stack {
    /// Root first: the process, the thread (when split), then functions outermost first.
    pub frames: Vec<String>,
    /// Per frame: it was inlined into the frame before it (from DWARF).
    pub inlined: Vec<bool>,
    pub count: u64,
}

#[derive(Debug, Default)]
pub struct Profile {
    pub stacks: Vec<Stack>,
    /// Samples included.
    pub samples: u64,
    /// Samples whose stack walk ended early.
    pub truncated_samples: u64,
    /// How many frames at the root of every stack are the process (and thread) names
    /// rather than functions.
    pub context_frames: usize,
    /// The module of each function, for the tables.
    pub function_modules: HashMap<String, String>,
    /// Threads seen, with their names, for per-thread tables.
    pub threads: Vec<(u32, String)>,
    pub warnings: Vec<String>,
}

/// The name a process or thread had last (threads often name themselves after start).
fn last_names(recording: &Recording) -> (HashMap<u32, String>, HashMap<u32, String>) {
    let mut processes = HashMap::new();
    for process in &recording.processes {
        if !process.name.is_empty() {
            processes.insert(process.pid, process.name.clone());
        }
    }
    let mut threads = HashMap::new();
    for thread in &recording.threads {
        if !thread.name.is_empty() {
            threads.insert(thread.tid, thread.name.clone());
        }
    }
    (processes, threads)
}

impl Profile {
    pub fn build(recording: &Recording, options: &ProfileOptions) -> Profile {
        let timeline = ModuleTimeline::new(recording);
        let mut symbolizer = Symbolizer::new();
        let (process_names, thread_names) = last_names(recording);
        // The process name at each exec: a sample is named after the program it ran.
        let mut exec_names: HashMap<u32, Vec<(u64, String)>> = HashMap::new();
        for process in &recording.processes {
            exec_names
                .entry(process.pid)
                .or_default()
                .push((process.time_ns, process.name.clone()));
        }

        let mut counts: HashMap<(Vec<String>, Vec<bool>), u64> = HashMap::new();
        let mut profile = Profile {
            context_frames: if options.split_threads { 2 } else { 1 },
            ..Profile::default()
        };
        let mut threads_seen: HashMap<u32, String> = HashMap::new();
        let mut frames: Vec<String> = Vec::with_capacity(64);
        let mut inlined: Vec<bool> = Vec::with_capacity(64);
        let unwound = crate::raw::unwind_snapshots(recording);
        for sample in recording.samples.iter().chain(&unwound) {
            if options.tid.is_some_and(|tid| tid != sample.tid)
                || (options.no_idle && sample.flags & SAMPLE_HALTED != 0)
            {
                continue;
            }
            frames.clear();
            inlined.clear();
            let process = exec_names
                .get(&sample.pid)
                .and_then(|names| {
                    names
                        .iter()
                        .rev()
                        .find(|(t, _)| *t <= sample.time_ns)
                        .or(names.first())
                })
                .map(|(_, name)| name.clone())
                .filter(|name| !name.is_empty())
                .or_else(|| process_names.get(&sample.pid).cloned())
                .unwrap_or_else(|| format!("pid {}", sample.pid));
            frames.push(process);
            let thread_name = thread_names
                .get(&sample.tid)
                .cloned()
                .unwrap_or_else(|| "thread".to_string());
            threads_seen
                .entry(sample.tid)
                .or_insert_with(|| thread_name.clone());
            if options.split_threads {
                frames.push(format!("{thread_name}/{}", sample.tid));
            }
            if sample.flags & SAMPLE_TRUNCATED != 0 {
                profile.truncated_samples += 1;
                frames.push(TRUNCATED_FRAME.to_string());
            }
            // A vCPU still in its firmware runs no code of the image: its addresses
            // name nothing.
            let addresses = if sample.flags & SAMPLE_FIRMWARE != 0 {
                frames.push(FIRMWARE_FRAME.to_string());
                inlined.push(false);
                &[][..]
            } else {
                &sample.frames[..]
            };
            // Outermost frame first.
            for (index, &address) in addresses.iter().enumerate().rev() {
                let is_return = index > 0;
                match timeline.find(sample.pid, sample.time_ns, address) {
                    Some(module) => {
                        let module_ref = ModuleRef {
                            path: &module.path,
                            build_id: &module.build_id,
                            start: module.start,
                            file_offset: module.file_offset,
                        };
                        for frame in symbolizer.symbolize(&module_ref, address, is_return).iter() {
                            profile
                                .function_modules
                                .entry(frame.function.clone())
                                .or_insert_with(|| frame.module.clone());
                            frames.push(frame.function.clone());
                            inlined.push(frame.inlined);
                        }
                    }
                    None => {
                        frames.push(UNKNOWN_FRAME.to_string());
                        inlined.push(false);
                    }
                }
            }
            if sample.flags & SAMPLE_HALTED != 0 {
                frames.push(HALTED_FRAME.to_string());
                inlined.push(false);
            }
            // The context frames (process, thread, [truncated]) are never inlined.
            let context = frames.len() - inlined.len();
            inlined.splice(0..0, std::iter::repeat_n(false, context));
            *counts.entry((frames.clone(), inlined.clone())).or_insert(0) += 1;
            profile.samples += 1;
        }
        profile.stacks = counts
            .into_iter()
            .map(|((frames, inlined), count)| Stack {
                frames,
                inlined,
                count,
            })
            .collect();
        profile.stacks.sort_by(|a, b| a.frames.cmp(&b.frames));
        profile.threads = threads_seen.into_iter().collect();
        profile.threads.sort();
        profile.warnings = std::mem::take(&mut symbolizer.warnings);
        profile
    }

    /// The functions of a stack, without the process and thread frames.
    pub fn functions<'a>(&self, stack: &'a Stack) -> &'a [String] {
        &stack.frames[self.context_frames.min(stack.frames.len())..]
    }

    /// The function a stack's time counts as "self" for: the innermost one that was
    /// not inlined (as perf and the symbol table see it; inlined callees still count
    /// in the totals).
    pub fn self_function<'a>(&self, stack: &'a Stack) -> Option<&'a String> {
        let first = self.context_frames.min(stack.frames.len());
        (first..stack.frames.len())
            .rev()
            .find(|&i| !stack.inlined.get(i).copied().unwrap_or(false))
            .map(|i| &stack.frames[i])
    }
}
