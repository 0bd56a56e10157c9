//! The ptrace backend's loop.
//!
//! One thread does everything, because ptrace requests must come from the tracing
//! thread: it waits on three descriptors (the tick timer, the target's reports, and
//! SIGINT/SIGTERM/SIGHUP), takes a sample at each tick, and only after the target runs
//! again does the work that can wait (unwinding copied stacks, module maps, writing).
//!
//! The tick timer is a `timerfd` with absolute periodic expiry: deadlines are computed
//! from the start, never from the last wake-up, so the rate does not drift, and a tick
//! that comes too late shows up as a count of missed deadlines.

use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use glass_format::{Arch, Backend, ProcessKind};
use glass_target::ptrace::{Capture, ProcessTarget, TargetEvent, Tick};
use glass_target::TargetError;
use nix::sys::signalfd::SignalFd;

use super::recorder::Recorder as Sink;
use super::{finish, poll_readable, take_stop_signal, unwind_name, Outcome, Ticker};
use crate::{CaptureMode, UnwindMode};
use crate::{Recorded, Result};

/// How often the file is flushed and thread names are re-read.
const HOUSEKEEPING_PERIOD: Duration = Duration::from_millis(500);

pub fn record(
    mut sink: Sink,
    stop_signals: &SignalFd,
) -> std::result::Result<Result<Recorded>, TargetError> {
    let args = sink.args;
    let mut target = match args.pid {
        Some(pid) => ProcessTarget::attach(pid)?,
        None => ProcessTarget::launch(&args.command)?,
    };
    if let Some(limit) = args.stack_size {
        target.set_stack_limit(limit as usize);
    }
    if let Some(cpu) = args.sampler_cpu {
        super::pin_to_cpu(cpu).map_err(TargetError::Io)?;
    }
    let outcome = match run(&mut sink, &mut target, stop_signals) {
        Ok(outcome) => outcome,
        Err(error) => Outcome::WriteFailed(error),
    };
    let _ = sink.refresh_thread_names(&target.threads());
    target.detach();
    let _ = write_events(&mut sink, &mut target);
    Ok(finish(
        sink,
        outcome,
        target.leader_status(),
        Backend::Ptrace,
    ))
}

fn run(
    sink: &mut Sink,
    target: &mut ProcessTarget,
    stop_signals: &SignalFd,
) -> std::io::Result<Outcome> {
    let args = sink.args;
    // Frame pointers are walked while the thread is stopped (the walk decides what to
    // read); any other unwinding works on a stack copy after the thread resumes.
    let capture = match (args.unwind, args.capture) {
        (UnwindMode::Fp, CaptureMode::Frames) => Capture::FramePointers {
            max_depth: args.max_depth as usize,
        },
        _ => Capture::StackCopy,
    };
    sink.write_meta(
        Backend::Ptrace,
        Arch::host(),
        unwind_name(args.unwind),
        target.leader,
    )?;
    sink.process(target.leader, 0, ProcessKind::Attached, 0, true)?;
    for (pid, tid) in target.threads() {
        sink.thread(pid, tid)?;
    }
    let mut timer = Ticker::new(args.frequency)?;
    let deadline = args
        .duration
        .map(|s| sink.origin + Duration::from_secs_f64(s.max(0.0)));
    let mut tick = Tick::default();
    let mut next_housekeeping = Instant::now() + HOUSEKEEPING_PERIOD;
    loop {
        write_events(sink, target)?;
        if target.leader_status().is_some() {
            return Ok(Outcome::TargetExited);
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return Ok(Outcome::DurationElapsed);
        }
        if now >= next_housekeeping {
            next_housekeeping = now + HOUSEKEEPING_PERIOD;
            sink.refresh_thread_names(&target.threads())?;
            sink.flush()?;
        }
        let wait_ms = deadline.map_or(500, |d| {
            d.saturating_duration_since(now).as_millis().min(500) as i32 + 1
        });
        let ready = poll_readable(
            &[timer.fd(), target.report_fd(), stop_signals.as_raw_fd()],
            wait_ms,
        );
        if ready[2] {
            if let Some(signal) = take_stop_signal(stop_signals) {
                return Ok(Outcome::Signalled(signal));
            }
        }
        if ready[1] {
            target.handle_reports();
        }
        if ready[0] {
            let Some(missed) = timer.fired() else {
                continue;
            };
            sink.missed_deadlines += missed;
            target.sample(&mut tick, sink.origin, capture);
            sink.lost += tick.lost as u64;
            if !tick.samples.is_empty() {
                sink.tick(tick.stopped_ns);
            }
            // Events the tick handled (an exec, a new thread) precede its samples.
            write_events(sink, target)?;
            write_tick(sink, target, &tick)?;
        }
    }
}

/// Everything here runs after the target has resumed.
fn write_tick(sink: &mut Sink, target: &mut ProcessTarget, tick: &Tick) -> std::io::Result<()> {
    for sample in &tick.samples {
        if !sink.knows_thread(sample.tid) {
            sink.thread(sample.pid, sample.tid)?;
        }
        match sample.stack_len {
            0 if sample.count > 0 => {
                let flags = if sample.truncated {
                    glass_format::SAMPLE_TRUNCATED
                } else {
                    0
                } | if sample.in_syscall {
                    glass_format::SAMPLE_IN_SYSCALL
                } else {
                    0
                };
                sink.frames_sample(
                    sample.pid,
                    sample.tid,
                    sample.time_ns,
                    sample.stopped_ns,
                    flags,
                    tick.frames_of(sample),
                )?;
            }
            _ => {
                let wanted = sink.stack_sample(
                    sample.pid,
                    sample.tid,
                    sample.time_ns,
                    sample.stopped_ns,
                    if sample.in_syscall {
                        glass_format::SAMPLE_IN_SYSCALL
                    } else {
                        0
                    },
                    sample.regs,
                    tick.stack_of(sample),
                )?;
                if wanted > sample.stack_len {
                    target.want_stack_copy(sample.tid, wanted);
                }
            }
        }
    }
    Ok(())
}

fn write_events(sink: &mut Sink, target: &mut ProcessTarget) -> std::io::Result<()> {
    let events: Vec<(Instant, TargetEvent)> = target.take_events().collect();
    for (seen, event) in events {
        // Stamped when the kernel reported it, not when written: samples taken in
        // between must fall after an exec, not before it.
        let time_ns = sink.ns_since_origin(seen);
        match event {
            TargetEvent::ThreadStarted { pid, tid } => sink.thread(pid, tid)?,
            TargetEvent::ThreadExited { pid, tid } => sink.thread_exit(pid, tid, time_ns)?,
            TargetEvent::ProcessForked { parent, child } => {
                sink.process(child, parent, ProcessKind::Forked, time_ns, false)?;
                sink.thread(child, child)?;
            }
            TargetEvent::ProcessExec { pid } => {
                sink.process(pid, 0, ProcessKind::Exec, time_ns, true)?;
                sink.refresh_thread_names(&target.threads())?;
            }
            TargetEvent::ProcessExited { pid, .. } => sink.process_exit(pid),
        }
    }
    Ok(())
}
