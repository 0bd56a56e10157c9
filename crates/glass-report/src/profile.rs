//! The aggregated view of a [`Model`] the top, folded and flame graph outputs are made
//! from: distinct symbolized stacks (root first, below the process and, when split, the
//! thread) with their sample counts.

use std::collections::HashMap;

use glass_format::Recording;
use rustc_hash::FxHashMap;

use crate::model::{FrameIndex, Model, ModelOptions, StackIndex, StringIndex};

#[derive(Debug, Clone, Default)]
pub struct ProfileOptions {
    /// Put each thread under its own frame (`name/tid`) below the process.
    pub split_threads: bool,
    /// Keep only this thread.
    pub tid: Option<u32>,
    /// Leave out samples of halted (idle) VM guest vCPUs.
    pub no_idle: bool,
}

impl ProfileOptions {
    pub fn model_options(&self) -> ModelOptions {
        ModelOptions {
            tid: self.tid,
            no_idle: self.no_idle,
        }
    }
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
    /// Time blocked (`--off-cpu` recordings), and the samples' worth it is counted as.
    pub off_cpu_ns: u64,
    pub off_cpu_weight: u64,
    /// How many frames at the root of every stack are the process (and thread) names
    /// rather than functions.
    pub context_frames: usize,
    /// The module of each function, for the tables.
    pub function_modules: HashMap<String, String>,
    /// Threads seen, with their names, for per-thread tables.
    pub threads: Vec<(u32, String)>,
    pub warnings: Vec<String>,
}

impl Profile {
    /// Builds the model of a recording and aggregates it.
    pub fn build(recording: &Recording, options: &ProfileOptions) -> Profile {
        let mut model = Model::build(recording, &options.model_options());
        let mut profile = Profile::from_model(&model, options.split_threads);
        profile.warnings = std::mem::take(&mut model.warnings);
        profile
    }

    /// Sums the samples of a model by stack (under the process, and the thread when
    /// `split_threads`).
    pub fn from_model(model: &Model, split_threads: bool) -> Profile {
        // Count by (process, thread, stack) first: few distinct keys, cheap to expand.
        let mut by_stack: FxHashMap<(StringIndex, Option<usize>, Option<StackIndex>), u64> =
            FxHashMap::default();
        for (index, thread) in model.threads.iter().enumerate() {
            let thread_key = split_threads.then_some(index);
            for sample in &thread.samples {
                *by_stack
                    .entry((thread.process, thread_key, sample.stack))
                    .or_insert(0) += sample.weight;
            }
        }
        // Stacks of different addresses name the same functions: sum them by names
        // (string indices, each with its inlined bit), and make strings once per stack.
        let mut counts: FxHashMap<Vec<u64>, u64> = FxHashMap::default();
        let mut frame_indices: Vec<FrameIndex> = Vec::new();
        let mut key: Vec<u64> = Vec::new();
        for ((process, thread, stack), count) in by_stack {
            key.clear();
            key.push(u64::from(process));
            // A thread is told apart by its row (u64::MAX: none); names come later.
            key.push(thread.map_or(u64::MAX, |t| t as u64));
            model.stack_frames(stack, &mut frame_indices);
            for &frame in &frame_indices {
                let row = &model.frames[frame as usize];
                key.push(u64::from(row.function) << 1 | u64::from(row.inline_depth > 0));
            }
            match counts.get_mut(&key) {
                Some(total) => *total += count,
                None => {
                    counts.insert(key.clone(), count);
                }
            }
        }
        let mut stacks: Vec<Stack> = counts
            .into_iter()
            .map(|(key, count)| {
                let mut frames = vec![model.string(key[0] as StringIndex).to_string()];
                if key[1] != u64::MAX {
                    let thread = &model.threads[key[1] as usize];
                    frames.push(format!("{}/{}", model.string(thread.name), thread.tid));
                }
                let mut inlined = vec![false; frames.len()];
                for &frame in &key[2..] {
                    frames.push(model.string((frame >> 1) as StringIndex).to_string());
                    inlined.push(frame & 1 != 0);
                }
                Stack {
                    frames,
                    inlined,
                    count,
                }
            })
            .collect();
        stacks.sort_by(|a, b| a.frames.cmp(&b.frames));
        Profile {
            stacks,
            samples: model
                .threads
                .iter()
                .flat_map(|t| &t.samples)
                .map(|s| s.weight)
                .sum(),
            truncated_samples: model.truncated_samples,
            off_cpu_ns: model.off_cpu_ns,
            off_cpu_weight: model.off_cpu_weight,
            context_frames: if split_threads { 2 } else { 1 },
            function_modules: model.function_modules.clone(),
            threads: model.thread_names(),
            warnings: Vec::new(),
        }
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
