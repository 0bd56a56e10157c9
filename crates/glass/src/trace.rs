//! `glass trace`: the options for glass-tracer and what it prints. The tracing itself —
//! launch, attach, patching, draining, detaching, the guardian — is the glass-tracer
//! library's (`TraceOptions` in, `Traced` out); this file turns the command line into
//! options and the library's notes into lines on stderr.

use glass_report::count;
use std::path::PathBuf;

use glass_tracer::{AttachReport, DetachReport, Installed, Skip, TraceNotes, TraceOptions};

use crate::error::Result;
use crate::TraceArgs;

fn split_list(list: &Option<String>) -> Vec<String> {
    list.as_deref()
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

pub fn run(args: &TraceArgs) -> Result<i32> {
    let options = TraceOptions {
        output: args.output.clone(),
        functions: split_list(&args.functions),
        libcalls: split_list(&args.libcalls),
        lib: args.lib.clone(),
        pmc: args.pmc.clone(),
        ring_size: args.ring_size,
        max_threads: args.max_threads,
        pid: args.pid,
        duration: args.duration,
        command: args.command.clone(),
        vm: args.vm,
        return_address_probe: args.exit_probe == crate::ExitProbe::ReturnAddress,
        symbols: args.symbols.clone(),
        qmp: args.qmp.clone(),
        libvirt: args.libvirt.clone(),
        gdb: args.gdb.clone(),
        guest_scratch: args.guest_scratch.clone(),
        xen: args.xen.clone(),
    };
    let mut notes = Printed { quiet: args.quiet };
    let traced = glass_tracer::trace(&options, &mut notes)?;
    if !args.quiet {
        let s = &traced.summary;
        // Records are timed by the CPU's counter: the time-stamp counter on x86-64, whose
        // rate glass measures, or AArch64's generic timer (CNTVCT_EL0, tens of MHz).
        let rate = if traced.generic_timer {
            format!("timer rate {:.1} MHz", s.tsc_hz as f64 / 1e6)
        } else {
            format!("cycle rate {:.3} GHz", s.tsc_hz as f64 / 1e9)
        };
        eprintln!(
            "glass: {} from {} in {:.2} s; {} lost, {} unwound, {} skipped; {rate}; wrote {}",
            count(traced.records, "record"),
            count(s.threads, "thread"),
            s.duration_ns as f64 / 1e9,
            s.lost + s.no_area_lost,
            s.unwound,
            s.skipped,
            args.output.display()
        );
    }
    Ok(traced.exit_status)
}

/// The library's notes as glass prints them (what was instrumented, attach and detach
/// only without --quiet; warnings always).
struct Printed {
    quiet: bool,
}

impl TraceNotes for Printed {
    fn note(&mut self, line: &str) {
        eprintln!("glass: {line}");
    }

    fn instrumented(&mut self, installed: &[Installed], skipped: &[Skip]) {
        if self.quiet {
            return;
        }
        let mut kinds: std::collections::BTreeMap<&str, usize> = Default::default();
        for skip in skipped {
            *kinds.entry(skip.reason.kind()).or_default() += 1;
        }
        let detail: Vec<String> = kinds.iter().map(|(k, n)| format!("{n} {k}")).collect();
        eprintln!(
            "glass: instrumented {}, skipped {}{}",
            count(installed.len() as u64, "function"),
            skipped.len(),
            if detail.is_empty() {
                String::new()
            } else {
                format!(" ({})", detail.join(", "))
            }
        );
    }

    fn attached(&mut self, a: &AttachReport) {
        if !self.quiet {
            eprintln!(
                "glass: attached to pid {}: every thread stopped {:.2} ms to patch ({} moved out of the bytes replaced); thread {} stopped {:.2} ms more to load the runtime (the others ran)",
                a.pid,
                a.stopped_ns as f64 / 1e6,
                a.moved,
                a.loader_tid,
                a.loader_stopped_ns as f64 / 1e6,
            );
        }
    }

    fn detached(&mut self, pid: i32, report: Option<&DetachReport>) {
        if self.quiet {
            return;
        }
        match report {
            None => eprintln!("glass: pid {pid} exited while traced"),
            Some(d) => eprintln!(
                "glass: detached from pid {} ({}): every thread stopped {:.2} ms to restore ({} moved out of the trampolines); one stopped {:.2} ms more to unmap the rings; {} calls in flight finish untimed",
                d.pid,
                d.why,
                d.stopped_ns as f64 / 1e6,
                d.moved,
                d.unmap_ns as f64 / 1e6,
                d.in_flight
            ),
        }
    }
}

/// `glass __trace-guardian` (hidden): started by `glass trace --pid`, never by hand.
#[derive(clap::Args, Debug, Clone)]
pub struct TraceGuardianArgs {
    /// The process glass attaches to
    #[arg(long)]
    pid: i32,
    /// The glass it watches (whose session files it removes)
    #[arg(long)]
    glass: u32,
}

/// The guardian: waits for glass, and says in one line what it did if glass died.
pub fn guard(args: &TraceGuardianArgs) -> Result<i32> {
    use glass_tracer::guardian::Watched;
    let pid = args.pid;
    let removed = |files: &[PathBuf]| {
        files
            .iter()
            .map(|file| format!(", removed {}", file.display()))
            .collect::<String>()
    };
    match glass_tracer::guardian::watch(pid, args.glass) {
        Watched::Done => {}
        Watched::Died {
            took_out: Some(ms),
            removed: file,
        } => eprintln!(
            "glass: glass ended while tracing pid {pid}; its guardian took the probes out in {ms:.1} ms{}",
            removed(&file)
        ),
        Watched::Died {
            took_out: None,
            removed: file,
        } => eprintln!(
            "glass: glass ended while tracing pid {pid}; its guardian found nothing to take out{}",
            removed(&file)
        ),
        Watched::Failed { why, removed: file } => eprintln!(
            "glass: glass ended while tracing pid {pid}; its guardian could not take the probes out: {why} (the next glass trace --pid {pid} will){}",
            removed(&file)
        ),
    }
    Ok(0)
}
