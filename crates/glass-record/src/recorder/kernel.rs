//! The kernel frames the samples held: their addresses are kept while the recording
//! runs and named from /proc/kallsyms once, when it ends (the report may run where that
//! kernel does not), and the recording says whether kernel stacks were recorded at all.

use std::collections::HashSet;
use std::io;

use super::Output;

#[derive(Default)]
pub(super) struct KernelFrames {
    addresses: HashSet<u64>,
    /// Samples that held kernel frames.
    samples: u64,
    /// perf backend: whether kernel stacks are recorded, or why not.
    recorded: Option<Result<(), String>>,
}

impl KernelFrames {
    /// A sample's kernel frames (none: a sample of user code only).
    pub(super) fn note(&mut self, frames: &[u64]) {
        if !frames.is_empty() {
            self.samples += 1;
            self.addresses.extend(frames);
        }
    }

    pub(super) fn samples(&self) -> u64 {
        self.samples
    }

    pub(super) fn set_recorded(&mut self, recorded: Result<(), String>) {
        self.recorded = Some(recorded);
    }

    /// Whether kernel stacks were recorded (with how many samples held kernel frames),
    /// or why not; None where the backend does not say.
    pub(super) fn recorded(&self) -> Option<Result<u64, String>> {
        self.recorded
            .clone()
            .map(|recorded| recorded.map(|()| self.samples))
    }

    /// Writes the names of the kernel functions the frames fall in.
    pub(super) fn write_symbols(&self, output: &mut dyn Output) -> io::Result<()> {
        if self.addresses.is_empty() {
            return Ok(());
        }
        let addresses: Vec<u64> = self.addresses.iter().copied().collect();
        output.kernel_symbols(&glass_target::perf::kernel_symbols(&addresses))
    }
}
