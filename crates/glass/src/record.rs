//! `glass record`: the sampling loop.
//!
//! One thread does everything, because ptrace requests must come from the tracing
//! thread: it waits on three descriptors (the tick timer, the target's reports, and
//! SIGINT/SIGTERM/SIGHUP), takes a sample at each tick, and only after the target runs
//! again does the work that can wait: checking addresses against the module map,
//! reading /proc, writing the file.
//!
//! The tick timer is a `timerfd` with absolute periodic expiry: deadlines are computed
//! from the start, never from the last wake-up, so the rate does not drift, and a tick
//! that comes too late shows up as a count of missed deadlines.

use std::collections::HashMap;
use std::fs::File;
use std::io::BufWriter;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use glass_format::{Meta, Module, Process, ProcessKind, Summary, Thread, ThreadExit, Writer};
use glass_target::procfs::{self, Mapping};
use glass_target::ptrace::{ProcessTarget, TargetEvent, Tick};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

use crate::error::{Failure, Result};
use crate::RecordArgs;

/// How often the file is flushed and thread names are re-read.
const HOUSEKEEPING_PERIOD: Duration = Duration::from_millis(500);
/// The module map of a process is re-read at most this often when samples show
/// addresses outside every known mapping (code mapped by dlopen, a JIT).
const MAPS_REFRESH_PERIOD: Duration = Duration::from_millis(20);

pub fn run(args: &RecordArgs) -> Result<i32> {
    if let Some(cpu) = args.sampler_cpu {
        // Check the CPU before starting anything; pin only after launching, so the
        // target does not inherit the sampler's core.
        check_cpu(cpu)?;
    }
    let file = create_output(&args.output)?;
    // Block the signals glass waits for before any target exists, so they arrive as
    // descriptor reads and never interrupt a half-written record.
    let stop_signals = stop_signal_fd()?;

    let target = match args.pid {
        Some(pid) => ProcessTarget::attach(pid),
        None => ProcessTarget::launch(&args.command),
    };
    let target = target.map_err(|error| {
        let _ = std::fs::remove_file(&args.output);
        if error.is_bad_input() {
            Failure::bad_input(error.to_string())
        } else {
            Failure::runtime(error.to_string())
        }
    })?;

    if let Some(cpu) = args.sampler_cpu {
        pin_to_cpu(cpu)?;
    }
    let writer = Writer::new(BufWriter::with_capacity(256 << 10, file))
        .map_err(|e| write_failure(&args.output, &e))?;
    let mut recorder = Recorder::new(args, target, writer);
    let outcome = recorder.record(&stop_signals);
    recorder.finish(outcome)
}

fn create_output(path: &Path) -> Result<File> {
    File::create(path).map_err(|error| {
        Failure::bad_input(format!(
            "cannot write {}: {}",
            path.display(),
            error_text(&error)
        ))
    })
}

fn error_text(error: &std::io::Error) -> String {
    let text = error.to_string();
    text.split(" (os error").next().unwrap_or(&text).to_string()
}

fn write_failure(path: &Path, error: &std::io::Error) -> Failure {
    Failure::runtime(format!(
        "writing {} failed: {}",
        path.display(),
        error_text(error)
    ))
}

fn stop_signal_fd() -> Result<SignalFd> {
    let mut mask = SigSet::empty();
    for signal in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        mask.add(signal);
    }
    mask.thread_block()
        .and_then(|()| SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC))
        .map_err(|e| Failure::runtime(format!("cannot set up signal handling: {e}")))
}

fn check_cpu(cpu: usize) -> Result<()> {
    let allowed = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))
        .map_err(|e| Failure::runtime(format!("cannot read CPU affinity: {e}")))?;
    if allowed.is_set(cpu).unwrap_or(false) {
        Ok(())
    } else {
        Err(Failure::bad_input(format!(
            "--sampler-cpu {cpu}: no such CPU available to glass"
        )))
    }
}

fn pin_to_cpu(cpu: usize) -> Result<()> {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu)
        .map_err(|_| Failure::bad_input(format!("--sampler-cpu {cpu}: no such CPU")))?;
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
        .map_err(|e| Failure::bad_input(format!("--sampler-cpu {cpu}: cannot run there: {e}")))
}

/// A periodic CLOCK_MONOTONIC timer with absolute deadlines.
fn tick_timer(frequency_hz: u32) -> Result<OwnedFd> {
    // SAFETY: plain system calls on a descriptor we own.
    unsafe {
        let fd = libc::timerfd_create(
            libc::CLOCK_MONOTONIC,
            libc::TFD_CLOEXEC | libc::TFD_NONBLOCK,
        );
        if fd < 0 {
            return Err(Failure::runtime(format!(
                "timerfd: {}",
                std::io::Error::last_os_error()
            )));
        }
        let fd = OwnedFd::from_raw_fd(fd);
        let period_ns = 1_000_000_000u64 / frequency_hz as u64;
        let mut now: libc::timespec = std::mem::zeroed();
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now);
        let first = now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64 + period_ns;
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: (period_ns / 1_000_000_000) as i64,
                tv_nsec: (period_ns % 1_000_000_000) as i64,
            },
            it_value: libc::timespec {
                tv_sec: (first / 1_000_000_000) as i64,
                tv_nsec: (first % 1_000_000_000) as i64,
            },
        };
        if libc::timerfd_settime(
            fd.as_raw_fd(),
            libc::TFD_TIMER_ABSTIME,
            &spec,
            std::ptr::null_mut(),
        ) < 0
        {
            return Err(Failure::runtime(format!(
                "timerfd: {}",
                std::io::Error::last_os_error()
            )));
        }
        Ok(fd)
    }
}

/// Expirations since the last read (0 if none).
fn read_expirations(fd: &OwnedFd) -> u64 {
    let mut count = 0u64;
    // SAFETY: reads 8 bytes into `count`.
    let n = unsafe { libc::read(fd.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
    if n == 8 {
        count
    } else {
        0
    }
}

/// Why the recording ended.
enum Outcome {
    TargetExited,
    DurationElapsed,
    Signalled(i32),
    WriteFailed(std::io::Error),
}

/// What is known of one process's executable mappings, and which of them the file has.
#[derive(Default, Clone)]
struct ModuleMap {
    mappings: Vec<Mapping>,
    last_refresh: Option<Instant>,
}

impl ModuleMap {
    fn contains(&self, address: u64) -> bool {
        let index = self.mappings.partition_point(|m| m.start <= address);
        index > 0 && address < self.mappings[index - 1].end
    }
}

struct Recorder<'a> {
    args: &'a RecordArgs,
    target: ProcessTarget,
    writer: Writer<BufWriter<File>>,
    origin: Instant,
    modules: HashMap<i32, ModuleMap>,
    build_ids: HashMap<String, Vec<u8>>,
    thread_names: HashMap<i32, String>,
    threads_seen: usize,
    processes_seen: usize,
    ticks: u64,
    samples: u64,
    lost: u64,
    missed_deadlines: u64,
    stopped_per_tick: Vec<u64>,
}

impl<'a> Recorder<'a> {
    fn new(args: &'a RecordArgs, target: ProcessTarget, writer: Writer<BufWriter<File>>) -> Self {
        Recorder {
            args,
            target,
            writer,
            origin: Instant::now(),
            modules: HashMap::new(),
            build_ids: HashMap::new(),
            thread_names: HashMap::new(),
            threads_seen: 0,
            processes_seen: 0,
            ticks: 0,
            samples: 0,
            lost: 0,
            missed_deadlines: 0,
            stopped_per_tick: Vec::new(),
        }
    }

    fn now_ns(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    fn record(&mut self, stop_signals: &SignalFd) -> Outcome {
        match self.record_inner(stop_signals) {
            Ok(outcome) => outcome,
            Err(error) => Outcome::WriteFailed(error),
        }
    }

    fn record_inner(&mut self, stop_signals: &SignalFd) -> std::io::Result<Outcome> {
        self.write_start()?;
        let timer =
            tick_timer(self.args.frequency).map_err(|f| std::io::Error::other(f.message))?;
        let deadline = self
            .args
            .duration
            .map(|s| self.origin + Duration::from_secs_f64(s.max(0.0)));
        let mut tick = Tick::default();
        let mut next_housekeeping = Instant::now() + HOUSEKEEPING_PERIOD;
        loop {
            self.write_events()?;
            if self.target.leader_status().is_some() {
                return Ok(Outcome::TargetExited);
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Ok(Outcome::DurationElapsed);
            }
            if now >= next_housekeeping {
                next_housekeeping = now + HOUSEKEEPING_PERIOD;
                self.refresh_thread_names()?;
                self.writer.flush()?;
            }
            let mut fds = [
                libc::pollfd {
                    fd: timer.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: self.target.report_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: stop_signals.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            let wait_ms = deadline.map_or(500, |d| {
                d.saturating_duration_since(now).as_millis().min(500) as i32 + 1
            });
            // SAFETY: three valid pollfds.
            let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, wait_ms) };
            if ready <= 0 {
                continue;
            }
            if fds[2].revents != 0 {
                if let Ok(Some(info)) = stop_signals.read_signal() {
                    return Ok(Outcome::Signalled(info.ssi_signo as i32));
                }
            }
            if fds[1].revents != 0 {
                self.target.handle_reports();
            }
            if fds[0].revents != 0 {
                let expirations = read_expirations(&timer);
                if expirations == 0 {
                    continue;
                }
                self.missed_deadlines += expirations - 1;
                self.target
                    .sample(&mut tick, self.origin, self.args.max_depth as usize);
                self.ticks += 1;
                self.lost += tick.lost as u64;
                if !tick.samples.is_empty() {
                    self.stopped_per_tick.push(tick.stopped_ns);
                }
                self.write_tick(&tick)?;
            }
        }
    }

    fn write_start(&mut self) -> std::io::Result<()> {
        let start_unix_ns = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        self.writer.meta(&Meta {
            start_unix_ns,
            backend: "ptrace".into(),
            unwind: "fp".into(),
            frequency_hz: self.args.frequency,
            max_depth: self.args.max_depth,
            target_pid: self.target.leader as u32,
            command: self.args.command.clone(),
            hostname: std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_default(),
            glass_version: env!("CARGO_PKG_VERSION").into(),
        })?;
        let leader = self.target.leader;
        self.write_process(leader, 0, ProcessKind::Attached, 0)?;
        for (pid, tid) in self.target.threads() {
            self.note_thread(pid, tid)?;
        }
        Ok(())
    }

    fn write_process(
        &mut self,
        pid: i32,
        parent: i32,
        kind: ProcessKind,
        time_ns: u64,
    ) -> std::io::Result<()> {
        self.processes_seen += 1;
        let name = procfs::thread_name(pid, pid);
        self.writer.process(&Process {
            time_ns,
            pid: pid as u32,
            parent_pid: parent.max(0) as u32,
            kind,
            name,
        })?;
        match kind {
            ProcessKind::Forked => {
                // The child starts with its parent's mappings; readers copy them too.
                let inherited = self.modules.get(&parent).cloned().unwrap_or_default();
                self.modules.insert(pid, inherited);
            }
            ProcessKind::Attached | ProcessKind::Exec => {
                self.modules.insert(pid, ModuleMap::default());
                self.refresh_modules(pid, time_ns)?;
            }
        }
        Ok(())
    }

    /// Re-reads /proc/PID/maps and writes the mappings the file does not have yet.
    fn refresh_modules(&mut self, pid: i32, time_ns: u64) -> std::io::Result<()> {
        let Ok(current) = procfs::executable_mappings(pid) else {
            return Ok(());
        };
        let known = self.modules.entry(pid).or_default();
        known.last_refresh = Some(Instant::now());
        let new: Vec<Mapping> = current
            .iter()
            .filter(|m| !known.mappings.contains(m))
            .cloned()
            .collect();
        known.mappings = current;
        for mapping in new {
            let build_id = self.build_id(pid, &mapping);
            self.writer.module(&Module {
                time_ns,
                pid: pid as u32,
                start: mapping.start,
                end: mapping.end,
                file_offset: mapping.file_offset,
                build_id,
                path: mapping.path.clone(),
            })?;
        }
        Ok(())
    }

    fn build_id(&mut self, pid: i32, mapping: &Mapping) -> Vec<u8> {
        if mapping.path.starts_with('[') {
            return Vec::new();
        }
        if let Some(id) = self.build_ids.get(&mapping.path) {
            return id.clone();
        }
        // A deleted or replaced file is still readable through the mapping itself.
        let via_mapping = format!(
            "/proc/{pid}/map_files/{:x}-{:x}",
            mapping.start, mapping.end
        );
        let path = if mapping.deleted {
            via_mapping.as_str()
        } else {
            mapping.path.as_str()
        };
        let id = glass_symbols::build_id(Path::new(path)).unwrap_or_default();
        if !mapping.deleted {
            self.build_ids.insert(mapping.path.clone(), id.clone());
        }
        id
    }

    fn note_thread(&mut self, pid: i32, tid: i32) -> std::io::Result<()> {
        self.threads_seen += 1;
        self.write_thread_name(pid, tid, procfs::thread_name(pid, tid))
    }

    fn write_thread_name(&mut self, pid: i32, tid: i32, name: String) -> std::io::Result<()> {
        self.writer.thread(&Thread {
            time_ns: self.now_ns(),
            pid: pid as u32,
            tid: tid as u32,
            name: name.clone(),
        })?;
        self.thread_names.insert(tid, name);
        Ok(())
    }

    /// Threads often name themselves after they start: write names that changed.
    fn refresh_thread_names(&mut self) -> std::io::Result<()> {
        for (pid, tid) in self.target.threads() {
            let name = procfs::thread_name(pid, tid);
            if !name.is_empty() && self.thread_names.get(&tid) != Some(&name) {
                self.write_thread_name(pid, tid, name)?;
            }
        }
        Ok(())
    }

    fn write_events(&mut self) -> std::io::Result<()> {
        let events: Vec<(Instant, TargetEvent)> = self.target.take_events().collect();
        for (seen, event) in events {
            // Stamped when the kernel reported it, not when written: samples taken in
            // between must fall after an exec, not before it.
            let time_ns = seen.saturating_duration_since(self.origin).as_nanos() as u64;
            match event {
                TargetEvent::ThreadStarted { pid, tid } => self.note_thread(pid, tid)?,
                TargetEvent::ThreadExited { pid, tid } => {
                    self.writer.thread_exit(&ThreadExit {
                        time_ns,
                        pid: pid as u32,
                        tid: tid as u32,
                    })?;
                }
                TargetEvent::ProcessForked { parent, child } => {
                    self.write_process(child, parent, ProcessKind::Forked, time_ns)?;
                    self.note_thread(child, child)?;
                }
                TargetEvent::ProcessExec { pid } => {
                    self.write_process(pid, 0, ProcessKind::Exec, time_ns)?;
                    self.thread_names.remove(&pid);
                    self.refresh_thread_names()?;
                }
                TargetEvent::ProcessExited { pid, .. } => {
                    self.modules.remove(&pid);
                }
            }
        }
        Ok(())
    }

    /// Everything here runs after the target has resumed.
    fn write_tick(&mut self, tick: &Tick) -> std::io::Result<()> {
        for sample in &tick.samples {
            if !self.thread_names.contains_key(&sample.tid) {
                self.note_thread(sample.pid, sample.tid)?;
            }
            let frames = tick.frames_of(sample);
            self.check_modules(sample.pid, frames)?;
            let flags = if sample.truncated {
                glass_format::SAMPLE_TRUNCATED
            } else {
                0
            } | if sample.in_syscall {
                glass_format::SAMPLE_IN_SYSCALL
            } else {
                0
            };
            self.writer.sample(
                sample.time_ns,
                sample.pid as u32,
                sample.tid as u32,
                sample.stopped_ns,
                flags,
                frames,
            )?;
            self.samples += 1;
        }
        Ok(())
    }

    /// Re-reads the module map (rate limited) when a sample holds an address outside
    /// every known mapping: that is how code mapped after the start (the libraries the
    /// dynamic loader maps, dlopen, a JIT) gets into the recording.
    fn check_modules(&mut self, pid: i32, frames: &[u64]) -> std::io::Result<()> {
        let map = self.modules.entry(pid).or_default();
        if frames.iter().all(|&a| map.contains(a)) {
            return Ok(());
        }
        if map
            .last_refresh
            .is_none_or(|t| t.elapsed() >= MAPS_REFRESH_PERIOD)
        {
            self.refresh_modules(pid, self.now_ns())?;
        }
        Ok(())
    }

    fn finish(mut self, outcome: Outcome) -> Result<i32> {
        let _ = self.refresh_thread_names();
        self.target.detach();
        let _ = self.write_events();
        let duration_ns = self.now_ns();
        let summary = self.summary(duration_ns);
        let written = match &outcome {
            Outcome::WriteFailed(_) => Ok(()),
            _ => self
                .writer
                .summary(&summary)
                .and_then(|()| self.writer.end()),
        };
        let _ = self.writer.flush();
        if let Outcome::WriteFailed(error) = &outcome {
            return Err(write_failure(&self.args.output, error));
        }
        written.map_err(|e| write_failure(&self.args.output, &e))?;
        if !self.args.quiet {
            self.print_summary(&summary, &outcome);
        }
        Ok(match (self.args.pid, summary.exit_status) {
            (None, status) if status >= 0 => status,
            _ => 0,
        })
    }

    fn summary(&self, duration_ns: u64) -> Summary {
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
            duration_ns,
            samples: self.samples,
            ticks: self.ticks,
            threads: self.threads_seen as u32,
            processes: self.processes_seen as u32,
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
            exit_status: self.target.leader_status().unwrap_or(-1),
        }
    }

    fn print_summary(&self, s: &Summary, outcome: &Outcome) {
        let us = |ns: u64| ns as f64 / 1000.0;
        let seconds = s.duration_ns as f64 / 1e9;
        let size = std::fs::metadata(&self.args.output)
            .map(|m| m.len())
            .unwrap_or(0);
        let ended = match outcome {
            Outcome::TargetExited => "target exited".to_string(),
            Outcome::DurationElapsed => "duration elapsed; target detached and running".to_string(),
            Outcome::Signalled(signal) => format!(
                "stopped by {}; target detached",
                Signal::try_from(*signal)
                    .map(|s| s.as_str())
                    .unwrap_or("a signal")
            ),
            Outcome::WriteFailed(_) => "write failed".to_string(),
        };
        eprintln!(
            "glass: {} samples, {} threads in {} processes, {:.2} s at {} Hz ({}) -> {} ({} KiB)",
            s.samples,
            s.threads,
            s.processes,
            seconds,
            self.args.frequency,
            ended,
            self.args.output.display(),
            size.div_ceil(1024)
        );
        eprintln!(
            "glass: target stopped per sample: mean {:.1} us, p50 {:.1} us, p99 {:.1} us, max {:.1} us; overhead {:.3}% of wall time; missed deadlines {}; lost samples {}",
            us(s.stopped_mean_ns),
            us(s.stopped_p50_ns),
            us(s.stopped_p99_ns),
            us(s.stopped_max_ns),
            if s.duration_ns > 0 { s.stopped_total_ns as f64 * 100.0 / s.duration_ns as f64 } else { 0.0 },
            s.missed_deadlines,
            s.lost_samples
        );
    }
}
