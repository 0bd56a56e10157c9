//! `glass record`: its arguments turned into [`RecordOptions`], the recording itself
//! done by the `glass-record` library, and what the user reads printed here.

use glass_report::count;
use std::path::Path;

use glass_format::Backend;
use glass_record::{CaptureMode, Notes, Outcome, RecordOptions, Recorded};
use nix::sys::signal::Signal;

use crate::error::{Failure, Result};
use crate::RecordArgs;

/// Warnings always; figures unless `--quiet`.
pub struct Stderr {
    pub quiet: bool,
}

impl Notes for Stderr {
    fn warn(&mut self, text: &str) {
        eprintln!("glass: warning: {text}");
    }

    fn figure(&mut self, text: &str) {
        if !self.quiet {
            eprintln!("glass: {text}");
        }
    }
}

pub fn run(args: &RecordArgs) -> Result<i32> {
    let options = options(args);
    let mut notes = Stderr { quiet: args.quiet };
    let recorded = glass_record::record(&options, &mut notes)?;
    if !args.quiet {
        print_summary(args, Some(&args.output), &recorded);
        print_lost(&recorded.lost_by_thread);
        print_kernel(&recorded);
    }
    if matches!(recorded.outcome, Outcome::StubLost) && args.gdb.is_some() {
        // The recording is kept (ended cleanly), but it ended early: a runtime failure.
        return Err(Failure::runtime(format!(
            "the GDB stub at {} went away mid-recording; {} kept the {} samples taken before",
            args.gdb.as_deref().unwrap_or_default(),
            args.output.display(),
            recorded.summary.samples
        )));
    }
    Ok(recorded.exit_status)
}

/// The library's options from the command line's (`glass top` takes the same).
pub fn options(args: &RecordArgs) -> RecordOptions {
    RecordOptions {
        output: args.output.clone(),
        frequency: args.frequency,
        duration: args.duration,
        max_depth: args.max_depth,
        pid: args.pid,
        gdb: args.gdb.clone(),
        qmp: args.qmp.clone(),
        libvirt: args.libvirt.clone(),
        xen: args.xen.clone(),
        symbols: args.symbols.clone(),
        guest_memory: args.guest_memory.clone(),
        guest_btf: args.guest_btf.clone(),
        guest_root: args.guest_root.clone(),
        vm: args.vm,
        keep_vm: args.keep_vm,
        no_translation_cache: args.no_translation_cache,
        max_stopped: args.max_stopped,
        clock: args.clock,
        sampler_cpu: args.sampler_cpu,
        backend: args.backend,
        unwind: args.unwind,
        capture: args.capture,
        stack_size: args.stack_size,
        ring_kib: args.ring_kib,
        kernel: if args.no_kernel {
            Some(false)
        } else if args.kernel {
            Some(true)
        } else {
            None
        },
        off_cpu: args.off_cpu,
        no_idle: args.no_idle,
        no_python: args.no_python,
        command: args.command.clone(),
    }
}

/// Whether kernel stacks (and off-CPU time) were recorded, and why not; Python frames.
fn print_kernel(recorded: &glass_record::Recorded) {
    if let Some(python) = &recorded.python {
        eprintln!("glass: {python}");
    }
    match &recorded.kernel_stacks {
        None => {}
        Some(Ok(samples)) => eprintln!(
            "glass: kernel stacks recorded: {samples} samples with kernel frames (named from /proc/kallsyms, kept in the recording)"
        ),
        Some(Err(why)) => eprintln!("glass: kernel stacks not recorded: {why}"),
    }
    if recorded.off_cpu_samples > 0 {
        let on_cpu = recorded.summary.samples - recorded.off_cpu_samples;
        eprintln!(
            "glass: off-CPU: {:.3} s blocked in {} samples; on-CPU: {on_cpu} samples (about {:.3} s at {} Hz)",
            recorded.off_cpu_ns as f64 / 1e9,
            recorded.off_cpu_samples,
            on_cpu as f64 / recorded.frequency.max(1) as f64,
            recorded.frequency
        );
    }
}

/// Which threads the kernel dropped samples of (the ten that lost most).
fn print_lost(lost: &[(i32, i32, String, u64)]) {
    if lost.is_empty() {
        return;
    }
    let shown: Vec<String> = lost
        .iter()
        .take(10)
        .map(|(_, tid, name, count)| format!("{name}/{tid} {count}"))
        .collect();
    let more = if lost.len() > 10 {
        format!(", {} more threads", lost.len() - 10)
    } else {
        String::new()
    };
    eprintln!(
        "glass: lost samples by thread (the ring was full; as the kernel counted): {}{more}",
        shown.join(", ")
    );
}

/// What the recording cost and how it ended, on stderr; `output`: the file written.
pub fn print_summary(args: &RecordArgs, output: Option<&Path>, recorded: &Recorded) {
    let (s, outcome, backend) = (&recorded.summary, &recorded.outcome, &recorded.backend);
    let vm_fate = recorded.vm_fate.as_deref();
    let us = |ns: u64| ns as f64 / 1000.0;
    let signal_name = |signal: i32| {
        Signal::try_from(signal)
            .map(|s| s.as_str())
            .unwrap_or("a signal")
    };
    let ended = match (outcome, vm_fate) {
        // A VM glass launched: what ended the recording, then what became of the VM.
        (Outcome::TargetExited, Some(fate)) => fate.to_string(),
        (Outcome::StubLost, Some(fate)) => format!("GDB stub connection lost; {fate}"),
        (Outcome::DurationElapsed, Some(fate)) => format!("duration elapsed; {fate}"),
        (Outcome::Signalled(signal), Some(fate)) => {
            format!("stopped by {}; {fate}", signal_name(*signal))
        }
        (Outcome::TargetExited, None) => "target exited".to_string(),
        (Outcome::StubLost, None) => "GDB stub connection lost".to_string(),
        (Outcome::DurationElapsed, None) => {
            "duration elapsed; target detached and running".to_string()
        }
        (Outcome::Signalled(signal), None) => {
            format!("stopped by {}; target detached", signal_name(*signal))
        }
        (Outcome::WriteFailed(_), _) => "write failed".to_string(),
    };
    let capture = match args.capture {
        CaptureMode::Frames => "",
        CaptureMode::Raw => ", raw stacks",
    };
    let written = output.map_or(String::new(), |path| {
        let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        format!(" -> {} ({} KiB)", path.display(), size.div_ceil(1024))
    });
    // The threads the reports count are those with samples; others seen are said apart.
    let threads = if recorded.threads_sampled == s.threads {
        count(s.threads, "thread")
    } else {
        format!(
            "{} ({} seen)",
            count(recorded.threads_sampled, "thread"),
            s.threads
        )
    };
    eprintln!(
        "glass: {}, {threads} in {}, {:.2} s at {} Hz, {backend} backend{capture} ({ended}){written}",
        count(s.samples, "sample"),
        count(s.processes, "process"),
        s.duration_ns as f64 / 1e9,
        args.frequency,
    );
    if let (Some(asked), Outcome::DurationElapsed) = (args.duration, outcome) {
        // The recording's time beyond -d is said: the set-up before sampling began (the
        // duration counts from there), the stop after, and what the end took to write.
        let t = &recorded.timing;
        let secs = |ns: u64| ns as f64 / 1e9;
        eprintln!(
            "glass: -d {asked}: sampled {:.2} s; before it {:.2} s setting up (launch or attach, unwind tables), after it {:.2} s stopping; then {:.2} s writing the end (kernel symbols, JIT files)",
            secs(t.sampling_ns),
            secs(t.setting_up_ns),
            secs(t.stopping_ns),
            secs(t.writing_end_ns)
        );
    }
    if *backend == Backend::Perf {
        eprintln!(
            "glass: target stopped per sample: 0 us (the kernel copies registers and stack at the interrupt; the target never stops); lost samples {}",
            s.lost_samples
        );
        return;
    }
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
