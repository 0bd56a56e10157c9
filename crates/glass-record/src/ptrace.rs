//! The ptrace backend's loop.
//!
//! One thread does everything, because ptrace requests must come from the tracing
//! thread: under the shared loop ([`super::driver`]) it serves the target's reports,
//! takes a sample at each tick, and only after the target runs again does the work that
//! can wait (unwinding copied stacks, module maps, writing).

use std::time::Instant;

use glass_format::{Arch, Backend, ProcessKind};
use glass_target::ptrace::{Capture, ProcessTarget, TargetEvent, Tick};
use glass_target::stop_mark::StopMark;
use glass_target::TargetError;
use nix::sys::signalfd::SignalFd;

use super::driver::{drive, Clock, Gathered, LateTicks, Sampler};
use super::event::Event;
use super::python::Python;
use super::recorder::Recorder as Sink;
use super::{finish, unwind_name, Outcome};
use crate::{CaptureMode, UnwindMode};
use crate::{Recorded, Result};

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
    // Before the first tick: a glass that holds threads stopped past the stop bound
    // (stopped itself, or stalled) is killed by its guardian, and the kernel lets them
    // run. Started after the target, so the guardian never inherits anything of it.
    let mark = StopMark::create().map_err(TargetError::Io)?;
    let guardian = super::guardian::Guardian::start_ptrace(&mark, sink.stop_bound)?;
    target.set_stop_mark(mark, sink.stop_bound);
    if let Some(cpu) = args.sampler_cpu {
        super::pin_to_cpu(cpu).map_err(TargetError::Io)?;
    }
    let outcome = match run(&mut sink, &mut target, stop_signals) {
        Ok(outcome) => outcome,
        Err(error) => Outcome::WriteFailed(error),
    };
    let _ = sink.refresh_thread_names(&target.threads());
    target.detach();
    guardian.done();
    let _ = write_events(&mut sink, &mut target, None);
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
    sink.handle(Event::process(
        target.leader,
        0,
        ProcessKind::Attached,
        0,
        true,
    ))?;
    for (pid, tid) in target.threads() {
        sink.handle(Event::thread(pid, tid))?;
    }
    let mut sampler = PtraceSampler {
        target,
        tick: Tick::default(),
        capture,
        python: (!args.no_python).then(Python::default),
    };
    sink.sampling_began();
    let outcome = drive(
        &mut sampler,
        sink,
        Some(stop_signals),
        Clock::Wall(args.frequency, LateTicks::Skip),
        args.duration,
    );
    sink.sampling_ended();
    sink.python_frames_outcome(sampler.python.as_ref().and_then(Python::note));
    outcome
}

/// The ptrace backend under the shared loop.
struct PtraceSampler<'t> {
    target: &'t mut ProcessTarget,
    tick: Tick,
    capture: Capture,
    /// Python frames, unless `--no-python`.
    python: Option<Python>,
}

impl<'a> Sampler<Sink<'a>> for PtraceSampler<'_> {
    fn fds(&self) -> Vec<i32> {
        vec![self.target.report_fd()]
    }

    fn gather(&mut self, sink: &mut Sink<'a>) -> std::io::Result<Gathered> {
        write_events(sink, self.target, self.python.as_mut())?;
        Ok(Gathered::ended_if(self.target.leader_status().is_some()))
    }

    fn serve(&mut self, _sink: &mut Sink<'a>, _ready: &[bool]) -> std::io::Result<()> {
        self.target.handle_reports();
        Ok(())
    }

    fn tick(
        &mut self,
        sink: &mut Sink<'a>,
        missed: u64,
    ) -> std::io::Result<std::result::Result<u64, Outcome>> {
        sink.deadlines_missed(missed);
        let tick = &mut self.tick;
        self.target.sample(tick, sink.origin, self.capture);
        sink.samples_lost(tick.lost as u64);
        if !tick.samples.is_empty() {
            sink.tick(tick.stopped_ns);
        }
        // Events the tick handled (an exec, a new thread) precede its samples.
        write_events(sink, self.target, self.python.as_mut())?;
        write_tick(sink, self.target, &self.tick, self.python.as_mut())?;
        if let Some(python) = &mut self.python {
            python.look(self.target, sink.ticks());
        }
        Ok(Ok(self.tick.stopped_ns))
    }

    fn housekeeping(&mut self, sink: &mut Sink<'a>) -> std::io::Result<()> {
        sink.refresh_thread_names(&self.target.threads())?;
        sink.flush()
    }
}

/// Everything here runs after the target has resumed.
fn write_tick(
    sink: &mut Sink,
    target: &mut ProcessTarget,
    tick: &Tick,
    mut python: Option<&mut Python>,
) -> std::io::Result<()> {
    let mut frames = Vec::new();
    for sample in &tick.samples {
        if !sink.knows_thread(sample.tid) {
            sink.handle(Event::thread(sample.pid, sample.tid))?;
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
                frames.clear();
                frames.extend_from_slice(tick.frames_of(sample));
                sink.recover_leaf_caller(sample.pid, sample.regs, sample.top, &mut frames)?;
                sink.handle(Event::Frames {
                    pid: sample.pid,
                    tid: sample.tid,
                    time_ns: sample.time_ns,
                    stopped_ns: sample.stopped_ns,
                    flags,
                    frames: &frames,
                })?;
            }
            _ => {
                let wanted = sink.handle(Event::Stack {
                    pid: sample.pid,
                    tid: sample.tid,
                    time_ns: sample.time_ns,
                    stopped_ns: sample.stopped_ns,
                    flags: if sample.in_syscall {
                        glass_format::SAMPLE_IN_SYSCALL
                    } else {
                        0
                    },
                    regs: sample.regs,
                    stack: tick.stack_of(sample),
                    other_stacks: &[],
                    space: None,
                })?;
                if wanted > sample.stack_len {
                    target.want_stack_copy(sample.tid, wanted);
                }
            }
        }
        if let Some(python) = python.as_deref_mut() {
            python.write(sink, sample, tick.python_of(sample))?;
        }
    }
    Ok(())
}

fn write_events(
    sink: &mut Sink,
    target: &mut ProcessTarget,
    mut python: Option<&mut Python>,
) -> std::io::Result<()> {
    let events: Vec<(Instant, TargetEvent)> = target.take_events().collect();
    for (seen, event) in events {
        // Stamped when the kernel reported it, not when written: samples taken in
        // between must fall after an exec, not before it.
        let time_ns = sink.ns_since_origin(seen);
        match event {
            TargetEvent::ThreadStarted { pid, tid } => {
                sink.handle(Event::thread(pid, tid))?;
            }
            TargetEvent::ThreadExited { pid, tid } => {
                sink.handle(Event::ThreadExit { pid, tid, time_ns })?;
            }
            TargetEvent::ProcessForked { parent, child } => {
                sink.handle(Event::process(
                    child,
                    parent,
                    ProcessKind::Forked,
                    time_ns,
                    false,
                ))?;
                sink.handle(Event::thread(child, child))?;
            }
            TargetEvent::ProcessExec { pid } => {
                if let Some(python) = python.as_deref_mut() {
                    python.forget(target, pid);
                }
                sink.handle(Event::process(pid, 0, ProcessKind::Exec, time_ns, true))?;
                sink.refresh_thread_names(&target.threads())?;
            }
            TargetEvent::ProcessExited { pid, .. } => {
                if let Some(python) = python.as_deref_mut() {
                    python.forget(target, pid);
                }
                sink.handle(Event::ProcessExit { pid })?;
            }
        }
    }
    Ok(())
}
