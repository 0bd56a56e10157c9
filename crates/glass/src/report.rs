//! `glass report`: read a recording, symbolize it, and write one output format.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;

use glass_format::{FormatError, Recording};
use glass_report::{Format, Profile, ProfileOptions};

use crate::error::{Failure, Result};
use crate::ReportArgs;

/// Reads a recording for a command: a file glass cannot read at all is bad input; a
/// damaged or truncated one is reported with a warning and used as far as it goes.
pub fn open_recording(path: &Path) -> Result<Recording> {
    let recording = glass_format::read_file(path).map_err(|error| match error {
        FormatError::Io(message) => Failure::bad_input(format!(
            "cannot read {}: {}",
            path.display(),
            strip_os_error(&message)
        )),
        other => Failure::bad_input(format!("{}: {other}", path.display())),
    })?;
    if let Some(damage) = &recording.damage {
        let kept = if recording.trace_chunks.is_empty() {
            format!("the {} samples", recording.samples.len())
        } else {
            "the call records".to_string()
        };
        eprintln!(
            "glass: warning: {}: {damage}; using {kept} before it",
            path.display()
        );
    }
    Ok(recording)
}

fn strip_os_error(message: &str) -> &str {
    message.split(" (os error").next().unwrap_or(message)
}

pub fn run(args: &ReportArgs) -> Result<()> {
    let recording = open_recording(&args.input)?;
    let is_trace = recording
        .meta
        .as_ref()
        .is_some_and(|m| m.backend == glass_format::Backend::Trace);
    let format = args
        .format
        .unwrap_or(if is_trace { Format::Calls } else { Format::Top });
    let trace_only = matches!(
        format,
        Format::Calls | Format::Tree | Format::Invocations | Format::Chrome
    );
    if trace_only && !is_trace {
        return Err(Failure::bad_input(format!(
            "{}: --format {} needs a `glass trace` recording; this one holds samples",
            args.input.display(),
            format_name(format)
        )));
    }
    if is_trace && matches!(format, Format::Top | Format::Folded) {
        return Err(Failure::bad_input(format!(
            "{}: a `glass trace` recording has calls, not samples: use --format calls, tree, invocations, chrome or flamegraph",
            args.input.display()
        )));
    }
    if format == Format::Invocations && args.root.is_none() {
        return Err(Failure::bad_input(
            "--format invocations needs --root FUNCTION (e.g. --root process_batch)",
        ));
    }
    if is_trace {
        return run_trace(args, &recording, format);
    }
    // Open the output before the (possibly long) symbolization, so a bad path fails fast.
    let mut out: Box<dyn Write> = match &args.output {
        Some(path) => Box::new(BufWriter::new(File::create(path).map_err(|e| {
            Failure::bad_input(format!(
                "cannot write {}: {}",
                path.display(),
                strip_os_error(&e.to_string())
            ))
        })?)),
        None => Box::new(BufWriter::new(io::stdout().lock())),
    };
    let options = ProfileOptions {
        split_threads: args.threads,
        tid: args.tid,
        no_idle: args.no_idle,
    };
    let profile = Profile::build(&recording, &options);
    for warning in &profile.warnings {
        eprintln!("glass: warning: {warning}");
    }
    if let Some(tid) = args.tid {
        if profile.samples == 0 {
            eprintln!(
                "glass: warning: no samples of thread {tid} in {}",
                args.input.display()
            );
        }
    }
    let written = match format {
        Format::Top => glass_report::write_top(
            &profile,
            &header(&recording, &profile, &args.input),
            args.threads,
            args.limit.unwrap_or(30),
            &mut out,
        ),
        Format::Folded => glass_report::write_folded(&profile, &mut out),
        Format::Flamegraph => {
            glass_report::write_flamegraph(&profile, &title(&recording), &mut out)
        }
        Format::Calls | Format::Tree | Format::Invocations | Format::Chrome => unreachable!(),
    };
    match written.and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        // `glass report | head` is not a failure.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(Failure::runtime(format!("writing the report failed: {e}"))),
    }
}

fn format_name(format: Format) -> String {
    use clap::ValueEnum;
    format
        .to_possible_value()
        .map(|v| v.get_name().to_string())
        .unwrap_or_default()
}

fn create(path: &Option<std::path::PathBuf>) -> Result<Box<dyn Write>> {
    Ok(match path {
        Some(path) => Box::new(BufWriter::new(File::create(path).map_err(|e| {
            Failure::bad_input(format!(
                "cannot write {}: {}",
                path.display(),
                strip_os_error(&e.to_string())
            ))
        })?)),
        None => Box::new(BufWriter::new(io::stdout().lock())),
    })
}

/// The reports of a `glass trace` recording.
fn run_trace(args: &ReportArgs, recording: &Recording, format: Format) -> Result<()> {
    use glass_report::calltrace;
    let mut out = create(&args.output)?;
    let trace = calltrace::CallTrace::build(recording);
    if trace.tsc_hz == 0 {
        eprintln!("glass: warning: the recording has no cycle rate: times are in cycles");
    }
    let header = calltrace::header(recording, &trace);
    let written = match format {
        Format::Calls => calltrace::calls::write_calls(
            &trace,
            &header,
            args.limit.unwrap_or(usize::MAX),
            &mut out,
        ),
        Format::Tree => {
            calltrace::tree::write_tree(&trace, &header, args.limit.unwrap_or(200), &mut out)
        }
        Format::Invocations => {
            let root = args.root.as_deref().unwrap_or_default();
            calltrace::invocations::write_invocations(
                &trace,
                &header,
                root,
                args.limit.unwrap_or(20),
                &mut out,
            )
            .map_err(|message| {
                if message.starts_with("--root") {
                    Failure::bad_input(message)
                } else {
                    Failure::runtime(format!("writing the report failed: {message}"))
                }
            })?;
            Ok(())
        }
        Format::Chrome => calltrace::chrome::write_chrome(
            &trace,
            &header,
            &calltrace::losses(recording),
            &mut out,
        ),
        Format::Flamegraph => calltrace::write_flamegraph(recording, &trace, &mut out),
        Format::Top | Format::Folded => unreachable!(),
    };
    match written.and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(Failure::runtime(format!("writing the report failed: {e}"))),
    }
}

fn title(recording: &Recording) -> String {
    match &recording.meta {
        Some(meta) if meta.backend == glass_format::Backend::GdbStub => format!(
            "glass: guest {}",
            recording.processes.first().map_or("", |p| p.name.as_str())
        ),
        Some(meta) if !meta.command.is_empty() => format!("glass: {}", meta.command.join(" ")),
        Some(meta) => format!("glass: pid {}", meta.target_pid),
        None => "glass".to_string(),
    }
}

fn header(recording: &Recording, profile: &Profile, path: &Path) -> String {
    let duration = recording
        .summary
        .as_ref()
        .map(|s| format!(", {:.2} s", s.duration_ns as f64 / 1e9))
        .unwrap_or_default();
    let lost = recording
        .summary
        .as_ref()
        .filter(|s| s.lost_samples > 0)
        .map(|s| format!(", {} samples lost", s.lost_samples))
        .unwrap_or_default();
    format!(
        "{}: {} samples, {} threads{duration}{lost}",
        title(recording),
        profile.samples,
        profile.threads.len(),
    ) + &format!(" ({})", path.display())
}
