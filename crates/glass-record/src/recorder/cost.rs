//! What the recording cost and met, counted as it goes: ticks and how long each held the
//! target stopped, samples written, samples lost, deadlines missed, and when the
//! sampling loop ran. A live view is shown the running counts after every tick; the file
//! has them once, in the summary.

use glass_format::Summary;

use super::Progress;

#[derive(Default)]
pub(super) struct Cost {
    ticks: u64,
    samples: u64,
    lost: u64,
    missed_deadlines: u64,
    stopped_per_tick: Vec<u64>,
    /// When the sampling loop began and ended (ns since the origin).
    sampling: (Option<u64>, Option<u64>),
}

impl Cost {
    pub(super) fn sampling_began(&mut self, time_ns: u64) {
        self.sampling = (Some(time_ns), None);
    }

    pub(super) fn sampling_ended(&mut self, time_ns: u64) {
        self.sampling.1 = Some(time_ns);
    }

    pub(super) fn sampling_window(&self) -> (Option<u64>, Option<u64>) {
        self.sampling
    }

    pub(super) fn tick(&mut self, stopped_ns: u64) {
        self.ticks += 1;
        self.stopped_per_tick.push(stopped_ns);
    }

    pub(super) fn ticks(&self) -> u64 {
        self.ticks
    }

    pub(super) fn sample(&mut self) {
        self.samples += 1;
    }

    pub(super) fn lost(&mut self, count: u64) {
        self.lost += count;
    }

    pub(super) fn missed_deadlines(&mut self, count: u64) {
        self.missed_deadlines += count;
    }

    /// The running counts at `time_ns`; `tick_stopped_ns`: how long this tick held the
    /// target stopped (None for a flush).
    pub(super) fn progress(&self, tick_stopped_ns: Option<u64>, time_ns: u64) -> Progress {
        Progress {
            time_ns,
            tick_stopped_ns,
            ticks: self.ticks,
            lost: self.lost,
            missed_deadlines: self.missed_deadlines,
        }
    }

    /// The summary's counts and the statistics of the stopped times (the rest of the
    /// summary left at its default).
    pub(super) fn summary(&self) -> Summary {
        let mut stopped = self.stopped_per_tick.clone();
        stopped.sort_unstable();
        let total: u64 = stopped.iter().sum();
        let percentile = |p: f64| -> u64 {
            if stopped.is_empty() {
                0
            } else {
                stopped[((stopped.len() - 1) as f64 * p).round() as usize]
            }
        };
        Summary {
            samples: self.samples,
            ticks: self.ticks,
            missed_deadlines: self.missed_deadlines,
            stopped_mean_ns: if stopped.is_empty() {
                0
            } else {
                total / stopped.len() as u64
            },
            stopped_p50_ns: percentile(0.5),
            stopped_p99_ns: percentile(0.99),
            stopped_max_ns: stopped.last().copied().unwrap_or(0),
            stopped_total_ns: total,
            lost_samples: self.lost,
            ..Summary::default()
        }
    }
}
