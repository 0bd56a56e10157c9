//! `glass info`: what a recording holds, how it was made, and what it cost the target.

use glass_report::count;
use std::collections::HashSet;
use std::time::{Duration, UNIX_EPOCH};

use glass_format::{SAMPLE_STACK_CUT, SAMPLE_TRUNCATED};

use crate::error::Result;
use crate::report::{is_trace_file, open_recording, scan_trace};
use crate::InfoArgs;

/// A UTC date and time from nanoseconds since the epoch (civil-from-days, H. Hinnant).
fn utc(ns: u64) -> String {
    let time = UNIX_EPOCH + Duration::from_nanos(ns);
    let secs = time
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + if month <= 2 { 1 } else { 0 };
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// A trace's call records: how many, and the threads (tids) they came from.
struct CallRecords {
    records: u64,
    threads: HashSet<u32>,
}

pub fn run(args: &InfoArgs) -> Result<()> {
    // A trace's call records are counted as the file streams by (they are most of it).
    let (recording, calls) = if is_trace_file(&args.input) {
        let scan = scan_trace(&args.input, None, &Default::default())?;
        let calls = CallRecords {
            records: scan.records,
            threads: scan.threads.iter().map(|&(_, tid)| tid).collect(),
        };
        (scan.recording, Some(calls))
    } else {
        (open_recording(&args.input)?, None)
    };
    file_info(args, &recording);
    if let Some(meta) = &recording.meta {
        println!(
            "recorded:    {} on {} by glass {}",
            utc(meta.start_unix_ns),
            meta.hostname,
            meta.glass_version
        );
        target_info(meta, &recording);
        if meta.backend == glass_format::Backend::Trace {
            trace_info(&recording, calls.as_ref());
            return Ok(());
        }
        println!(
            "sampling:    {} backend, {} code, {} unwinding, {} Hz, max depth {}, {} capture",
            meta.backend, meta.arch, meta.unwind, meta.frequency_hz, meta.max_depth, meta.capture
        );
    }
    contents_info(&recording);
    guest_processes(&recording);
    cost_info(&recording);
    kernel_info(&recording);
    if !recording.py_stacks.is_empty() {
        println!(
            "python:      {} samples with Python frames, {} code objects named",
            recording.py_stacks.len(),
            recording.py_codes.len()
        );
    }
    cfi_info(&recording);
    Ok(())
}

/// Microseconds, as the cost lines give them.
fn us(ns: u64) -> String {
    format!("{:.1} us", ns as f64 / 1000.0)
}

/// The file, whether it is whole, where it is damaged, and what reading it warned of.
fn file_info(args: &InfoArgs, recording: &glass_format::Recording) {
    println!(
        "file:        {} ({} bytes, format version {})",
        args.input.display(),
        recording.file_len,
        recording.version
    );
    match recording.damage_summary() {
        None => println!("state:       complete"),
        Some(summary) => println!("state:       {summary}"),
    }
    // Each damaged place (the first is in the state line), the first ten.
    for damage in recording.damaged.iter().skip(1).take(10) {
        println!("damage:      {damage}");
    }
    for note in &recording.notes {
        println!("warning:     {note}");
    }
}

/// What was recorded: a VM guest (and its RAM's source), or a process attached to or
/// launched.
fn target_info(meta: &glass_format::Meta, recording: &glass_format::Recording) {
    if matches!(
        meta.backend,
        glass_format::Backend::GdbStub | glass_format::Backend::Xen
    ) {
        let name = recording.processes.first().map_or("", |p| p.name.as_str());
        let vcpus = recording
            .threads
            .iter()
            .map(|t| t.tid)
            .collect::<HashSet<_>>()
            .len();
        match meta.command.is_empty() {
            true if meta.backend == glass_format::Backend::Xen => {
                println!(
                    "target:      Xen guest {name} through the hypervisor, {}",
                    count(vcpus as u64, "vCPU")
                )
            }
            true => {
                println!(
                    "target:      VM guest {name} through its GDB stub, {}",
                    count(vcpus as u64, "vCPU")
                )
            }
            false => println!(
                "target:      VM guest {name} ({}), {}",
                meta.command.join(" "),
                count(vcpus as u64, "vCPU")
            ),
        }
        // Absent in files written before glass recorded it.
        if let Some(ram) = &recording.guest_ram {
            println!("guest RAM:   {ram}");
        }
    } else if meta.command.is_empty() {
        let command = glass_report::calltrace::target_command(recording);
        if command.is_empty() {
            println!("target:      pid {} (attached)", meta.target_pid);
        } else {
            println!("target:      {command} (attached, pid {})", meta.target_pid);
        }
    } else {
        println!(
            "target:      {} (launched, pid {})",
            meta.command.join(" "),
            meta.target_pid
        );
    }
}

/// How many samples (and why some were cut short), snapshots, threads, processes and
/// module mappings the file holds.
fn contents_info(recording: &glass_format::Recording) {
    let max_depth = recording.meta.as_ref().map_or(0, |m| m.max_depth as usize);
    let truncated: Vec<&glass_format::Sample> = recording
        .samples
        .iter()
        .filter(|s| s.flags & SAMPLE_TRUNCATED != 0)
        .collect();
    let cut = truncated
        .iter()
        .filter(|s| s.flags & SAMPLE_STACK_CUT != 0)
        .count() as u64;
    let at_depth = truncated
        .iter()
        .filter(|s| s.flags & SAMPLE_STACK_CUT == 0 && max_depth > 0 && s.frames.len() >= max_depth)
        .count() as u64;
    let threads: HashSet<u32> = recording
        .samples
        .iter()
        .map(|s| s.tid)
        .chain(recording.snapshots.iter().map(|s| s.tid))
        .collect();
    let processes: HashSet<u32> = recording.processes.iter().map(|p| p.pid).collect();
    println!(
        "contents:    {} ({} truncated{}), {}, {} sampled, {}, {}",
        count(recording.samples.len() as u64, "sample"),
        truncated.len(),
        if truncated.is_empty() {
            String::new()
        } else {
            format!(
                ": {}",
                glass_report::truncation_causes(truncated.len() as u64, cut, at_depth)
            )
        },
        count(recording.snapshots.len() as u64, "raw stack snapshot"),
        count(threads.len() as u64, "thread"),
        count(processes.len() as u64, "process"),
        count(recording.modules.len() as u64, "module mapping")
    );
}

/// What the recording cost the target (the summary's figures), and its exit status.
fn cost_info(recording: &glass_format::Recording) {
    match &recording.summary {
        Some(s) => {
            let overhead = if s.duration_ns > 0 {
                s.stopped_total_ns as f64 * 100.0 / s.duration_ns as f64
            } else {
                0.0
            };
            println!(
                "duration:    {:.3} s, {} ticks, {} missed deadlines",
                s.duration_ns as f64 / 1e9,
                s.ticks,
                s.missed_deadlines
            );
            if recording
                .meta
                .as_ref()
                .is_some_and(|m| m.backend == glass_format::Backend::Perf)
            {
                println!("cost:        the target was never stopped: the kernel copied registers and stack at each sample");
            }
            println!(
                "cost:        target stopped per sample: mean {}, p50 {}, p99 {}, max {}",
                us(s.stopped_mean_ns),
                us(s.stopped_p50_ns),
                us(s.stopped_p99_ns),
                us(s.stopped_max_ns)
            );
            println!(
                "             overhead {overhead:.3}% of wall time ({} stopped in all)",
                us(s.stopped_total_ns)
            );
            println!("             lost samples {}", s.lost_samples);
            if !recording.thread_lost.is_empty() {
                let by_thread: Vec<String> = recording
                    .thread_lost
                    .iter()
                    .map(|l| format!("tid {} {}", l.tid, l.count))
                    .collect();
                println!("             lost by thread: {}", by_thread.join(", "));
            }
            if s.exit_status >= 0 {
                println!("exit status: {}", s.exit_status);
            }
        }
        None => println!("cost:        not recorded (the recorder did not finish the file)"),
    }
}

/// The kernel's functions kept, and the time threads spent off the CPU.
fn kernel_info(recording: &glass_format::Recording) {
    let kernel = &recording.kernel_symbols.symbols;
    if !kernel.is_empty() {
        let off_cpu = recording
            .samples
            .iter()
            .filter(|s| s.flags & glass_format::SAMPLE_OFF_CPU != 0);
        let (count, ns) = off_cpu.fold((0u64, 0u64), |(n, t), s| (n + 1, t + s.stopped_ns as u64));
        println!(
            "kernel:      {} kernel functions named (kept from /proc/kallsyms){}",
            kernel.len(),
            if count > 0 {
                format!(
                    "; off-CPU {count} samples, {:.3} s blocked",
                    ns as f64 / 1e9
                )
            } else {
                String::new()
            }
        );
    }
}

/// A VM guest's processes, as its tasks were read (`--guest-btf`): how many samples ran
/// in each, most first (a process's threads together, by pid and name).
fn guest_processes(recording: &glass_format::Recording) {
    if recording.guest_tasks.is_empty() {
        return;
    }
    let tasks = glass_report::guest_tasks::GuestTasks::new(recording);
    let mut by_process: std::collections::HashMap<String, u64> = Default::default();
    let mut unknown = 0u64;
    let sampled = recording
        .samples
        .iter()
        .map(|s| (s.pid, s.tid, s.time_ns))
        .chain(
            recording
                .snapshots
                .iter()
                .map(|s| (s.pid, s.tid, s.time_ns)),
        );
    for (pid, tid, time_ns) in sampled {
        match tasks.at(pid, tid, time_ns) {
            Some(task) => {
                *by_process
                    .entry(glass_report::guest_tasks::process_label(task))
                    .or_default() += 1
            }
            None => unknown += 1,
        }
    }
    let mut processes: Vec<(String, u64)> = by_process.into_iter().collect();
    processes.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    println!(
        "guest:       {} seen in the samples ({} of no known task); by samples:",
        count(processes.len() as u64, "process"),
        unknown
    );
    const SHOWN: usize = 20;
    for (name, samples) in processes.iter().take(SHOWN) {
        println!("             {samples:>8}  {name}");
    }
    if processes.len() > SHOWN {
        let rest: u64 = processes[SHOWN..].iter().map(|p| p.1).sum();
        println!(
            "             {rest:>8}  in {} more",
            count((processes.len() - SHOWN) as u64, "process")
        );
    }
}

/// Per module file of the recording, the CFI sources the unwinder has for it (read from
/// the file as it is now).
fn cfi_info(recording: &glass_format::Recording) {
    let mut seen = HashSet::new();
    let mut first = true;
    for module in &recording.modules {
        if module.path.starts_with('[') || !seen.insert(module.path.as_str()) {
            continue;
        }
        let what = match std::fs::read(&module.path) {
            Err(_) => "file missing".to_string(),
            Ok(bytes) => {
                let sources = glass_unwind::cfi_sources(&bytes);
                let changed = !module.build_id.is_empty()
                    && object::File::parse(&*bytes)
                        .ok()
                        .and_then(|elf| object::Object::build_id(&elf).ok().flatten())
                        .is_some_and(|id| id != module.build_id.as_slice());
                match changed {
                    true => format!("{sources} (the file changed since the recording)"),
                    false => sources.to_string(),
                }
            }
        };
        let label = if first { "cfi:" } else { "" };
        first = false;
        println!("{label:<13}{}: {what}", module.path);
    }
}

/// `glass info` of a `glass trace` recording.
fn trace_info(recording: &glass_format::Recording, calls: Option<&CallRecords>) {
    let (records, threads) = calls.map_or((0, 0), |c| (c.records, c.threads.len()));
    println!(
        "tracing:     {} instrumented, {} matched but not patched",
        count(recording.trace_functions.len() as u64, "function"),
        recording.trace_skipped.len()
    );
    let unnamed = recording
        .trace_functions
        .iter()
        .filter(|f| f.name.starts_with("sub_"))
        .count();
    if unnamed > 0 {
        println!(
            "             {} named by a symbol, {unnamed} only by an FDE (sub_<address>)",
            recording.trace_functions.len() - unnamed
        );
    }
    // How each function's calls are timed, each way with its own guarantees.
    let mut probes: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    for function in &recording.trace_functions {
        let probe = match function.probe.as_str() {
            "" => "not recorded",
            probe => probe,
        };
        probes.entry(probe).or_default().push(&function.name);
    }
    for (probe, names) in &probes {
        const SHOWN: usize = 5;
        let more = match names.len() > SHOWN {
            true => format!(", ... and {} more", names.len() - SHOWN),
            false => String::new(),
        };
        let shown: Vec<&str> = names.iter().take(SHOWN).copied().collect();
        println!(
            "             {} timed by {probe}: {}{more}",
            names.len(),
            shown.join(", ")
        );
    }
    let mut reasons: std::collections::BTreeMap<&str, usize> = Default::default();
    for skipped in &recording.trace_skipped {
        *reasons.entry(skipped.kind.as_str()).or_default() += 1;
    }
    for (reason, count) in reasons {
        println!("             {count} not patched: {reason}");
    }
    const LISTED: usize = 20;
    for skipped in recording.trace_skipped.iter().take(LISTED) {
        println!(
            "             - {} at {:#x}: {}",
            skipped.name, skipped.address, skipped.reason
        );
    }
    if recording.trace_skipped.len() > LISTED {
        println!(
            "             ... and {} more",
            recording.trace_skipped.len() - LISTED
        );
    }
    println!(
        "contents:    {} from {}",
        count(records, "call record"),
        count(threads as u64, "thread")
    );
    match &recording.trace_summary {
        Some(s) => {
            if recording.complete {
                println!(
                    "duration:    {:.3} s; cycle counter {:.3} GHz (measured)",
                    s.duration_ns as f64 / 1e9,
                    s.tsc_hz as f64 / 1e9
                );
                println!(
                    "losses:      {} records lost (ring full or write failed), {} lost (threads beyond --max-threads)",
                    s.lost, s.no_area_lost
                );
                println!(
                    "             {} calls not traced (signal inside a probe), {} calls ended by longjmp or an exception",
                    s.skipped, s.unwound
                );
            } else {
                println!(
                    "cycles:      counter {:.3} GHz (measured while setting up)",
                    s.tsc_hz as f64 / 1e9
                );
                println!("losses:      unknown (the tracer did not finish the file)");
            }
            if s.counters.is_empty() {
                let note = if s.counters_note.is_empty() {
                    "none requested".to_string()
                } else {
                    s.counters_note.clone()
                };
                println!("counters:    time only ({note})");
            } else {
                println!("counters:    {}", s.counters.join(", "));
            }
            if s.attach_stop_ns > 0 {
                println!(
                    "attached:    every thread stopped {:.3} ms to attach, {:.3} ms to detach; {} calls in flight at detach finished untimed",
                    s.attach_stop_ns as f64 / 1e6,
                    s.detach_stop_ns as f64 / 1e6,
                    s.in_flight_at_detach
                );
            }
            if s.exit_status >= 0 {
                println!("exit status: {}", s.exit_status);
            }
        }
        None => println!("losses:      unknown (the tracer did not finish the file)"),
    }
}
