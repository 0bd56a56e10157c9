//! `glass report`: read a recording, symbolize it, and write one output format.

use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::path::Path;

use glass_format::{FormatError, Record, Recording};
use glass_report::calltrace::{self, scan};
use glass_report::model::Unit;
use glass_report::{Exporter, Format, Model, ModelOptions, ReportError, Source};

use crate::error::{Failure, Result};
use crate::ReportArgs;

/// Reads a recording for a command: a file glass cannot read at all is bad input; a
/// damaged or truncated one is reported with a warning and used as far as it goes.
pub fn open_recording(path: &Path) -> Result<Recording> {
    let recording = glass_format::read_file(path).map_err(|error| unreadable(path, error))?;
    warn_damage(path, &recording, !recording.trace_chunks.is_empty());
    Ok(recording)
}

/// A file glass cannot read at all: bad input.
fn unreadable(path: &Path, error: FormatError) -> Failure {
    match error {
        FormatError::Io(message) => Failure::bad_input(format!(
            "cannot read {}: {}",
            path.display(),
            strip_os_error(&message)
        )),
        other => Failure::bad_input(format!("{}: {other}", path.display())),
    }
}

/// A damaged or truncated recording is used as far as it goes, with a warning.
fn warn_damage(path: &Path, recording: &Recording, has_calls: bool) {
    if let Some(damage) = &recording.damage {
        let kept = if has_calls {
            "the call records".to_string()
        } else {
            format!("the {} samples", recording.samples.len())
        };
        eprintln!(
            "glass: warning: {}: {damage}; using {kept} before it",
            path.display()
        );
    }
}

/// Whether the file's first record says it is a `glass trace` recording (false when it
/// cannot be read: the full path says why).
pub fn is_trace_file(path: &Path) -> bool {
    // The meta record comes first and is small: the file's first 64 KiB hold it.
    let mut head = Vec::new();
    let read = File::open(path).and_then(|file| file.take(64 << 10).read_to_end(&mut head));
    read.is_ok()
        && glass_format::Reader::new(&head)
            .ok()
            .and_then(|mut reader| reader.next())
            .is_some_and(|record| {
                matches!(record, Ok(Record::Meta(meta)) if meta.backend == glass_format::Backend::Trace)
            })
}

/// A `glass trace` recording summed while it streams by, with `jobs` decoding workers
/// (default one per CPU); damage is warned about, as [`open_recording`] does.
pub fn scan_trace(path: &Path, jobs: Option<u32>, wanted: &scan::Wanted) -> Result<scan::Scan> {
    let jobs = jobs.map_or_else(
        || std::thread::available_parallelism().map_or(1, usize::from),
        |jobs| jobs as usize,
    );
    let scan = scan::scan_file(path, jobs, wanted).map_err(|error| unreadable(path, error))?;
    warn_damage(path, &scan.recording, scan.chunks > 0);
    Ok(scan)
}

/// `--format calls`, `tree`, `invocations` and `flamegraph` of a trace, summed while the
/// file streams by (see `glass_report::calltrace::scan`): the calls themselves are never
/// built.
fn streamed_report(args: &ReportArgs, format: Format) -> Result<()> {
    let wanted = scan::Wanted {
        paths: matches!(format, Format::Tree | Format::Flamegraph),
        root: args.root.clone().filter(|_| format == Format::Invocations),
    };
    let scan = scan_trace(&args.input, args.jobs, &wanted)?;
    let recording = &scan.recording;
    let names: std::collections::HashMap<u32, String> = recording
        .trace_functions
        .iter()
        .map(|f| (f.id, f.name.clone()))
        .collect();
    // A root that was not traced is refused before the output is created.
    if let Some(name) = &wanted.root {
        calltrace::invocations::root_id(&names, name)
            .map_err(|error| Failure::bad_input(error.to_string()))?;
    }
    let summary = recording.trace_summary.clone().unwrap_or_default();
    let mut out = create(&args.output)?;
    if summary.tsc_hz == 0 {
        eprintln!("glass: warning: the recording has no cycle rate: times are in cycles");
    }
    let header = calltrace::header_of(
        recording,
        scan.calls,
        scan.threads.len(),
        scan.span(),
        summary.tsc_hz,
    );
    let context = calltrace::calls::TableContext {
        names: &names,
        tsc_hz: summary.tsc_hz,
        counter_names: &summary.counters,
    };
    let paths = scan.paths.unwrap_or_default();
    let written = match format {
        Format::Tree => {
            let limit = args.limit.unwrap_or(TREE_LINES);
            calltrace::tree::write_tree(&paths, &context, &header, limit, &mut out)
        }
        Format::Invocations => {
            let limit = args.limit.unwrap_or(INVOCATION_LINES);
            let name = wanted.root.as_deref().unwrap_or_default();
            calltrace::invocations::write_invocations(
                &scan.invocations,
                &context,
                &header,
                name,
                limit,
                &mut out,
            )
            .map_err(|error| match error {
                ReportError::Io(error) => error,
                other => io::Error::other(other.to_string()),
            })
        }
        Format::Flamegraph => {
            let folded = paths.folded(|f| context.name(f).to_string(), summary.tsc_hz);
            let unit = if summary.tsc_hz == 0 { "cycles" } else { "ns" };
            glass_report::write_folded_as_flamegraph(&folded, &header, unit, &mut out)
        }
        _ => {
            let limit = args.limit.unwrap_or(usize::MAX);
            calltrace::calls::write_table(&scan.stats, &context, &header, limit, &mut out)
        }
    }
    .and_then(|()| out.flush());
    match written {
        Ok(()) => Ok(()),
        // `glass report | head` is not a failure.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(Failure::runtime(format!("writing the report failed: {e}"))),
    }
}

/// Lines of `--format tree` unless --limit says otherwise.
const TREE_LINES: usize = 200;
/// Rows of `--format invocations` unless --limit says otherwise.
const INVOCATION_LINES: usize = 20;

fn strip_os_error(message: &str) -> &str {
    message.split(" (os error").next().unwrap_or(message)
}

/// A sampled or traced recording, as the model every format is a view of.
fn model_of(recording: &Recording, options: &ModelOptions) -> Model {
    if is_trace(recording) {
        Model::from_trace(recording, calltrace::CallTrace::build(recording))
    } else {
        Model::build(recording, options)
    }
}

fn is_trace(recording: &Recording) -> bool {
    recording
        .meta
        .as_ref()
        .is_some_and(|m| m.backend == glass_format::Backend::Trace)
}

pub fn run(args: &ReportArgs) -> Result<()> {
    if args.format == Some(Format::Invocations) && args.root.is_none() {
        return Err(Failure::bad_input(
            "--format invocations needs --root FUNCTION (e.g. --root process_batch)",
        ));
    }
    if args.diff.is_none()
        && matches!(
            args.format,
            None | Some(Format::Calls | Format::Tree | Format::Flamegraph | Format::Invocations)
        )
        && is_trace_file(&args.input)
    {
        return streamed_report(args, args.format.unwrap_or(Format::Calls));
    }
    let recording = open_recording(&args.input)?;
    let before = args.diff.as_deref().map(open_recording).transpose()?;
    let is_trace = is_trace(&recording);
    let source = if is_trace {
        Source::Calls
    } else {
        Source::Samples
    };
    let format = args.format.unwrap_or(match (&before, is_trace) {
        (Some(_), _) => Format::Diff,
        (None, true) => Format::Calls,
        (None, false) => Format::Top,
    });
    format
        .check(source)
        .map_err(|error| Failure::bad_input(format!("{}: {error}", args.input.display())))?;
    match (&before, format) {
        (None, Format::Diff) => {
            return Err(Failure::bad_input(ReportError::NoBaseline.to_string()));
        }
        (Some(_), format) if format != Format::Diff => {
            return Err(Failure::bad_input(format!(
                "--diff BEFORE.glass draws a differential flame graph: it goes with --format diff, not {}",
                format.name()
            )));
        }
        (Some(before), _) if self::is_trace(before) != is_trace => {
            return Err(Failure::bad_input(format!(
                "--diff: {} and {} are not of one kind (one holds samples, the other calls)",
                args.diff.as_deref().unwrap_or(Path::new("")).display(),
                args.input.display()
            )));
        }
        _ => {}
    }
    // Open the output before the (possibly long) symbolization, so a bad path fails fast.
    let mut out = create(&args.output)?;
    let options = ModelOptions {
        tid: args.tid,
        no_idle: args.no_idle,
    };
    let mut model = model_of(&recording, &options);
    for warning in std::mem::take(&mut model.warnings) {
        eprintln!("glass: warning: {warning}");
    }
    if model.unit == Unit::Cycles {
        eprintln!("glass: warning: the recording has no cycle rate: times are in cycles");
    }
    if let (Some(tid), Source::Samples) = (args.tid, source) {
        if model.samples == 0 {
            eprintln!(
                "glass: warning: no samples of thread {tid} in {}",
                args.input.display()
            );
        }
    }
    let before = before.map(|recording| {
        let options = ModelOptions {
            tid: None,
            no_idle: args.no_idle,
        };
        let mut model = model_of(&recording, &options);
        for warning in std::mem::take(&mut model.warnings) {
            eprintln!("glass: warning: {warning}");
        }
        model
    });
    // What the recording holds, for the headers and titles.
    let header = match &model.calls {
        Some(trace) => calltrace::header(&recording, trace),
        None => header(&recording, &model, &args.input),
    };
    let title = match &model.calls {
        Some(_) => header.clone(),
        None => title(&recording),
    };
    let exporter: Box<dyn Exporter + '_> = match format {
        Format::Top => Box::new(glass_report::Top {
            header,
            split_threads: args.threads,
            limit: args.limit.unwrap_or(30),
        }),
        Format::Folded => Box::new(glass_report::Folded {
            split_threads: args.threads,
        }),
        Format::Flamegraph => Box::new(glass_report::Flamegraph {
            title,
            split_threads: args.threads,
        }),
        Format::Pprof => Box::new(glass_report::Pprof { title }),
        Format::Speedscope => Box::new(glass_report::Speedscope { title }),
        Format::Firefox => Box::new(glass_report::Firefox { title }),
        Format::Diff => match &before {
            Some(before) => Box::new(glass_report::DiffFlamegraph {
                before,
                title: format!(
                    "glass: {} against {}",
                    args.input.display(),
                    args.diff.as_deref().unwrap_or(Path::new("")).display()
                ),
            }),
            None => return Err(Failure::bad_input(ReportError::NoBaseline.to_string())),
        },
        Format::Calls => Box::new(calltrace::CallsReport {
            header,
            limit: args.limit.unwrap_or(usize::MAX),
        }),
        Format::Tree => Box::new(calltrace::TreeReport {
            header,
            limit: args.limit.unwrap_or(TREE_LINES),
        }),
        Format::Invocations => Box::new(calltrace::InvocationsReport {
            header,
            root: args.root.clone().unwrap_or_default(),
            limit: args.limit.unwrap_or(INVOCATION_LINES),
        }),
        Format::Chrome => Box::new(calltrace::ChromeReport {
            header,
            losses: calltrace::losses(&recording),
        }),
    };
    let written = exporter
        .write(&model, &mut out)
        .and_then(|()| out.flush().map_err(ReportError::from));
    // glass ends next: freeing the recording and the model piece by piece would only
    // add to the report's time (a tenth of a short report's).
    drop(exporter);
    std::mem::forget(model);
    std::mem::forget(before);
    std::mem::forget(recording);
    match written {
        Ok(()) => Ok(()),
        // `glass report | head` is not a failure.
        Err(e) if e.is_broken_pipe() => Ok(()),
        Err(ReportError::Root(message)) => Err(Failure::bad_input(message)),
        Err(e) if e.is_bad_input() => {
            Err(Failure::bad_input(format!("{}: {e}", args.input.display())))
        }
        Err(e) => Err(Failure::runtime(format!("writing the report failed: {e}"))),
    }
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

fn title(recording: &Recording) -> String {
    match &recording.meta {
        Some(meta)
            if matches!(
                meta.backend,
                glass_format::Backend::GdbStub | glass_format::Backend::Xen
            ) =>
        {
            format!(
                "glass: guest {}",
                recording.processes.first().map_or("", |p| p.name.as_str())
            )
        }
        Some(meta) if !meta.command.is_empty() => format!("glass: {}", meta.command.join(" ")),
        Some(meta) => format!("glass: pid {}", meta.target_pid),
        None => "glass".to_string(),
    }
}

fn header(recording: &Recording, model: &Model, path: &Path) -> String {
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
        "{}: {}, {}{duration}{lost}",
        title(recording),
        glass_report::count(model.samples, "sample"),
        glass_report::count(model.thread_names().len() as u64, "thread"),
    ) + &format!(" ({})", path.display())
}
