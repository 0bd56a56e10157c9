//! The one poll loop every backend runs under: the sampling clock, the backend's own
//! descriptors, SIGINT/SIGTERM/SIGHUP, the duration, and periodic housekeeping. A
//! backend is a [`Sampler`]: it says which descriptors mean work for it, takes a sample
//! when the clock ticks, and reports what happened as events to the
//! [`Recorder`](crate::recorder::Recorder). The loop alone decides when the recording
//! ends, so every backend ends the same ways.

use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use nix::sys::signalfd::SignalFd;

use crate::recorder::Recorder;
use crate::{poll_readable, take_stop_signal, Outcome, Ticker};

/// How often `housekeeping` runs (flushing, thread names).
const HOUSEKEEPING_PERIOD: Duration = Duration::from_millis(500);

/// One backend's side of the loop.
pub trait Sampler {
    /// Descriptors whose readiness means work for [`Sampler::serve`].
    fn fds(&self) -> Vec<i32>;

    /// Runs at the top of every turn: hand over what the backend gathered (events,
    /// kernel-made samples) and say whether the target has ended.
    fn gather(&mut self, recorder: &mut Recorder) -> std::io::Result<Option<Outcome>>;

    /// Some of [`Sampler::fds`] are readable (`ready`, in their order).
    fn serve(&mut self, _recorder: &mut Recorder, _ready: &[bool]) -> std::io::Result<()> {
        Ok(())
    }

    /// The clock ticked: take a sample of the target. Returns how long the target was
    /// held stopped, or how the recording ends (the target went away mid-sample).
    fn tick(
        &mut self,
        recorder: &mut Recorder,
    ) -> std::io::Result<std::result::Result<u64, Outcome>>;

    /// Every half second or so.
    fn housekeeping(&mut self, recorder: &mut Recorder) -> std::io::Result<()> {
        recorder.flush()
    }
}

/// When samples are taken.
pub enum Clock {
    /// glass takes them at this rate, spaced in wall-clock time.
    Wall(u32),
    /// glass takes them at this rate, spaced in the target's running time: a VM guest's
    /// clocks stand still while it is stopped (see [`Ticker::postpone`]).
    Running(u32),
    /// The kernel takes them: no clock here; the loop wakes at least this often.
    None { wake_ms: i32 },
}

/// Runs `sampler` until the target ends, the duration elapses, a stop signal arrives,
/// or writing fails.
pub fn drive(
    sampler: &mut dyn Sampler,
    recorder: &mut Recorder,
    stop_signals: &SignalFd,
    clock: Clock,
) -> std::io::Result<Outcome> {
    let (mut ticker, postpone, idle_wake_ms) = match clock {
        Clock::Wall(hz) => (Some(Ticker::new(hz)?), false, 500),
        Clock::Running(hz) => (Some(Ticker::new(hz)?), true, 500),
        Clock::None { wake_ms } => (None, false, wake_ms),
    };
    // `-d` counts sampling time: from now, after the set-up (reading a large image's
    // unwind tables can take a while).
    let deadline = recorder
        .args
        .duration
        .map(|s| Instant::now() + Duration::from_secs_f64(s.max(0.0)));
    let mut next_housekeeping = Instant::now() + HOUSEKEEPING_PERIOD;
    // Polled: the ticker (if any), the backend's descriptors, the stop signals.
    let mut fds: Vec<i32> = ticker.iter().map(|t| t.fd()).collect();
    let first_backend_fd = fds.len();
    fds.extend(sampler.fds());
    fds.push(stop_signals.as_raw_fd());
    loop {
        if let Some(outcome) = sampler.gather(recorder)? {
            return Ok(outcome);
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return Ok(Outcome::DurationElapsed);
        }
        if now >= next_housekeeping {
            next_housekeeping = now + HOUSEKEEPING_PERIOD;
            sampler.housekeeping(recorder)?;
        }
        let wait_ms = deadline.map_or(idle_wake_ms, |d| {
            (d.saturating_duration_since(now).as_millis() as i32).min(idle_wake_ms) + 1
        });
        let ready = poll_readable(&fds, wait_ms);
        if ready[ready.len() - 1] {
            if let Some(signal) = take_stop_signal(stop_signals) {
                return Ok(Outcome::Signalled(signal));
            }
        }
        let backend_ready = &ready[first_backend_fd..ready.len() - 1];
        if backend_ready.iter().any(|&r| r) {
            sampler.serve(recorder, backend_ready)?;
        }
        let Some(ticker) = ticker.as_mut() else {
            continue;
        };
        if !ready[0] {
            continue;
        }
        let Some(missed) = ticker.fired() else {
            continue;
        };
        recorder.missed_deadlines += missed;
        match sampler.tick(recorder)? {
            Ok(stopped_ns) if postpone => ticker.postpone(stopped_ns),
            Ok(_) => {}
            Err(outcome) => return Ok(outcome),
        }
    }
}
