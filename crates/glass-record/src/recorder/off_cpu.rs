//! Off-CPU time (`--off-cpu`): a thread's block is written as samples of the stack it
//! blocked in, their stopped-time field holding how long it stayed blocked. A block
//! longer than that 32-bit field holds is written as several samples, and the figures
//! count the samples and the time they stand for.

#[derive(Default)]
pub(super) struct OffCpuTime {
    samples: u64,
    ns: u64,
}

impl OffCpuTime {
    /// A block from `time_ns` for `blocked_ns`, as the samples that stand for it: each
    /// (its time, its length).
    pub(super) fn parts(time_ns: u64, blocked_ns: u64) -> impl Iterator<Item = (u64, u32)> {
        let (mut at, mut left) = (time_ns, blocked_ns);
        std::iter::from_fn(move || {
            (left > 0).then(|| {
                let part = left.min(u32::MAX as u64);
                let sample = (at, part as u32);
                at += part;
                left -= part;
                sample
            })
        })
    }

    /// One part of a block was written.
    pub(super) fn written(&mut self, blocked_ns: u32) {
        self.ns += u64::from(blocked_ns);
        self.samples += 1;
    }

    /// The off-CPU samples written, and the time they stand for.
    pub(super) fn counts(&self) -> (u64, u64) {
        (self.samples, self.ns)
    }
}
