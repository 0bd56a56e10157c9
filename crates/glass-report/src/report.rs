//! `glass report` as a library: from a recording's path and the options to the bytes of
//! one format, with every decision the report makes on the way — the format a recording
//! defaults to and the ones it refuses, whether a trace is summed while it streams by
//! ([`calltrace::scan`]: `calls`, `tree`, `invocations`, a trace's flame graph) or read
//! whole into the [`Model`] every other format is a view of, and which [`Exporter`]
//! writes. The command line only parses the options, prints the warnings it is handed,
//! and turns a [`Failure`] into its exit code.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use glass_format::{FormatError, Record, Recording};

use crate::calltrace::{self, scan};
use crate::model::Unit;
use crate::{Exporter, Format, Model, ModelOptions, ReportError, Source};

/// Lines of `--format tree` unless `limit` says otherwise.
const TREE_LINES: usize = 200;
/// Rows of `--format invocations` unless `limit` says otherwise.
const INVOCATION_LINES: usize = 20;
/// Rows of the top table unless `limit` says otherwise.
const TOP_ROWS: usize = 30;

/// What to report, as `glass report`'s options say it.
#[derive(Debug, Clone, Default)]
pub struct ReportOptions {
    pub input: PathBuf,
    /// Standard output when None.
    pub output: Option<PathBuf>,
    /// Top for samples, calls for a trace, diff with a baseline, when None.
    pub format: Option<Format>,
    /// `--format invocations`: the function whose calls are the rows.
    pub root: Option<String>,
    /// The recording before the change (`--format diff`).
    pub diff: Option<PathBuf>,
    pub threads: bool,
    pub tid: Option<u32>,
    pub limit: Option<usize>,
    pub no_idle: bool,
    /// Workers decoding a streamed trace (default one per CPU).
    pub jobs: Option<u32>,
}

/// Why a report was not written, by whose fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    /// The input or the options (exit 2).
    #[error("{0}")]
    BadInput(String),
    /// The machine: writing failed (exit 1).
    #[error("{0}")]
    Runtime(String),
}

/// Reads a recording: a file glass cannot read at all is bad input; a damaged or
/// truncated one is used as far as it goes, with a warning.
pub fn open_recording(path: &Path, warn: &mut dyn FnMut(&str)) -> Result<Recording, Failure> {
    let recording = glass_format::read_file(path).map_err(|error| unreadable(path, error))?;
    warn_damage(path, &recording, !recording.trace_chunks.is_empty(), warn);
    Ok(recording)
}

/// A file glass cannot read at all: bad input.
fn unreadable(path: &Path, error: FormatError) -> Failure {
    match error {
        FormatError::Io(message) => Failure::BadInput(format!(
            "cannot read {}: {}",
            path.display(),
            strip_os_error(&message)
        )),
        other => Failure::BadInput(format!("{}: {other}", path.display())),
    }
}

/// A damaged or truncated recording is used as far as it goes, with a warning.
fn warn_damage(path: &Path, recording: &Recording, has_calls: bool, warn: &mut dyn FnMut(&str)) {
    // What the recorder warned of that makes the profile less than it seems.
    for note in &recording.notes {
        warn(&format!(
            "{}: recorded with a warning: {note}",
            path.display()
        ));
    }
    if let Some(summary) = recording.damage_summary() {
        let kept = if has_calls {
            "the call records".to_string()
        } else {
            format!(
                "the {} samples",
                recording.samples.len() + recording.snapshots.len()
            )
        };
        // Damaged blocks are skipped, the blocks behind them read; anything else ends
        // the reading.
        let read = match recording.damaged.iter().any(|d| !d.ends_reading()) {
            true => "of the intact blocks",
            false => "before it",
        };
        warn(&format!(
            "{}: {summary}; using {kept} {read}",
            path.display()
        ));
    }
}

/// Whether the file's first record says it is a `glass trace` recording (false when it
/// cannot be read: the full path says why).
pub fn is_trace_file(path: &Path) -> bool {
    // The meta record comes first, in the first block.
    let Ok(file) = File::open(path) else {
        return false;
    };
    glass_format::stream::Stream::new(file)
        .ok()
        .and_then(|mut stream| stream.find(|item| !matches!(item, Err(e) if !e.ends_reading())))
        .is_some_and(|item| {
            matches!(item, Ok(glass_format::stream::Item::Record(Record::Meta(meta))) if meta.backend == glass_format::Backend::Trace)
        })
}

/// A `glass trace` recording summed while it streams by, with `jobs` decoding workers
/// (default one per CPU); damage is warned about, as [`open_recording`] does.
pub fn scan_trace(
    path: &Path,
    jobs: Option<u32>,
    wanted: &scan::Wanted,
    warn: &mut dyn FnMut(&str),
) -> Result<scan::Scan, Failure> {
    let jobs = jobs.map_or_else(
        || std::thread::available_parallelism().map_or(1, usize::from),
        |jobs| jobs as usize,
    );
    let scan = scan::scan_file(path, jobs, wanted).map_err(|error| unreadable(path, error))?;
    warn_damage(path, &scan.recording, scan.chunks > 0, warn);
    Ok(scan)
}

/// Writes the report `options` ask for; warnings go to `warn` (one line each, without
/// a prefix).
pub fn run(options: &ReportOptions, warn: &mut dyn FnMut(&str)) -> Result<(), Failure> {
    if options.format == Some(Format::Invocations) && options.root.is_none() {
        return Err(Failure::BadInput(
            "--format invocations needs --root FUNCTION (e.g. --root process_batch)".into(),
        ));
    }
    if options.diff.is_none()
        && matches!(
            options.format,
            None | Some(Format::Calls | Format::Tree | Format::Flamegraph | Format::Invocations)
        )
        && is_trace_file(&options.input)
    {
        return streamed(options, options.format.unwrap_or(Format::Calls), warn);
    }
    whole(options, warn)
}

/// `--format calls`, `tree`, `invocations` and `flamegraph` of a trace, summed while the
/// file streams by (see [`calltrace::scan`]): the calls themselves are never built.
fn streamed(
    options: &ReportOptions,
    format: Format,
    warn: &mut dyn FnMut(&str),
) -> Result<(), Failure> {
    let wanted = scan::Wanted {
        paths: matches!(format, Format::Tree | Format::Flamegraph),
        root: options
            .root
            .clone()
            .filter(|_| format == Format::Invocations),
    };
    let scan = scan_trace(&options.input, options.jobs, &wanted, warn)?;
    let recording = &scan.recording;
    let names: std::collections::HashMap<u32, String> = recording
        .trace_functions
        .iter()
        .map(|f| (f.id, f.name.clone()))
        .collect();
    // A root that was not traced is refused before the output is created.
    if let Some(name) = &wanted.root {
        calltrace::invocations::root_id(&names, name)
            .map_err(|error| Failure::BadInput(error.to_string()))?;
    }
    let summary = recording.trace_summary.clone().unwrap_or_default();
    let mut out = create(&options.output)?;
    if summary.tsc_hz == 0 {
        warn("the recording has no cycle rate: times are in cycles");
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
            let limit = options.limit.unwrap_or(TREE_LINES);
            calltrace::tree::write_tree(&paths, &context, &header, limit, &mut out)
        }
        Format::Invocations => {
            let limit = options.limit.unwrap_or(INVOCATION_LINES);
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
            crate::write_folded_as_flamegraph(&folded, &header, unit, &mut out)
        }
        _ => {
            let limit = options.limit.unwrap_or(usize::MAX);
            calltrace::calls::write_table(&scan.stats, &context, &header, limit, &mut out)
        }
    }
    .and_then(|()| out.flush());
    match written {
        Ok(()) => Ok(()),
        // `glass report | head` is not a failure.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(Failure::Runtime(format!("writing the report failed: {e}"))),
    }
}

/// Every format from the model of the whole recording.
fn whole(options: &ReportOptions, warn: &mut dyn FnMut(&str)) -> Result<(), Failure> {
    let recording = open_recording(&options.input, warn)?;
    let before = options
        .diff
        .as_deref()
        .map(|path| open_recording(path, warn))
        .transpose()?;
    let is_trace = is_trace(&recording);
    let source = if is_trace {
        Source::Calls
    } else {
        Source::Samples
    };
    let format = options.format.unwrap_or(match (&before, is_trace) {
        (Some(_), _) => Format::Diff,
        (None, true) => Format::Calls,
        (None, false) => Format::Top,
    });
    format
        .check(source)
        .map_err(|error| Failure::BadInput(format!("{}: {error}", options.input.display())))?;
    match (&before, format) {
        (None, Format::Diff) => {
            return Err(Failure::BadInput(ReportError::NoBaseline.to_string()));
        }
        (Some(_), format) if format != Format::Diff => {
            return Err(Failure::BadInput(format!(
                "--diff BEFORE.glass draws a differential flame graph: it goes with --format diff, not {}",
                format.name()
            )));
        }
        (Some(before), _) if self::is_trace(before) != is_trace => {
            return Err(Failure::BadInput(format!(
                "--diff: {} and {} are not of one kind (one holds samples, the other calls)",
                options.diff.as_deref().unwrap_or(Path::new("")).display(),
                options.input.display()
            )));
        }
        _ => {}
    }
    // Open the output before the (possibly long) symbolization, so a bad path fails fast.
    let mut out = create(&options.output)?;
    let model_options = ModelOptions {
        tid: options.tid,
        no_idle: options.no_idle,
    };
    let mut model = model_of(&recording, &model_options);
    for warning in std::mem::take(&mut model.warnings) {
        warn(&warning);
    }
    if model.unit == Unit::Cycles {
        warn("the recording has no cycle rate: times are in cycles");
    }
    if let (Some(tid), Source::Samples) = (options.tid, source) {
        if model.samples == 0 {
            warn(&format!(
                "no samples of thread {tid} in {}",
                options.input.display()
            ));
        }
    }
    let before = before.map(|recording| {
        let model_options = ModelOptions {
            tid: None,
            no_idle: options.no_idle,
        };
        let mut model = model_of(&recording, &model_options);
        for warning in std::mem::take(&mut model.warnings) {
            warn(&warning);
        }
        model
    });
    let exporter = exporter(options, format, &recording, &model, before.as_ref())?;
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
        Err(ReportError::Root(message)) => Err(Failure::BadInput(message)),
        Err(e) if e.is_bad_input() => Err(Failure::BadInput(format!(
            "{}: {e}",
            options.input.display()
        ))),
        Err(e) => Err(Failure::Runtime(format!("writing the report failed: {e}"))),
    }
}

/// The exporter of `format`, with the header and title of what the recording holds.
fn exporter<'a>(
    options: &ReportOptions,
    format: Format,
    recording: &Recording,
    model: &Model,
    before: Option<&'a Model>,
) -> Result<Box<dyn Exporter + 'a>, Failure> {
    let header = match &model.calls {
        Some(trace) => calltrace::header(recording, trace),
        None => header(recording, model, &options.input),
    };
    let title = match &model.calls {
        Some(_) => header.clone(),
        None => title(recording),
    };
    Ok(match format {
        Format::Top => Box::new(crate::Top {
            header,
            split_threads: options.threads,
            limit: options.limit.unwrap_or(TOP_ROWS),
        }),
        Format::Folded => Box::new(crate::Folded {
            split_threads: options.threads,
        }),
        Format::Flamegraph => Box::new(crate::Flamegraph {
            title,
            split_threads: options.threads,
        }),
        Format::Pprof => Box::new(crate::Pprof { title }),
        Format::Speedscope => Box::new(crate::Speedscope { title }),
        Format::Firefox => Box::new(crate::Firefox { title }),
        Format::Diff => match before {
            Some(before) => Box::new(crate::DiffFlamegraph {
                before,
                title: format!(
                    "glass: {} against {}",
                    options.input.display(),
                    options.diff.as_deref().unwrap_or(Path::new("")).display()
                ),
            }),
            None => return Err(Failure::BadInput(ReportError::NoBaseline.to_string())),
        },
        Format::Calls => Box::new(calltrace::CallsReport {
            header,
            limit: options.limit.unwrap_or(usize::MAX),
        }),
        Format::Tree => Box::new(calltrace::TreeReport {
            header,
            limit: options.limit.unwrap_or(TREE_LINES),
        }),
        Format::Invocations => Box::new(calltrace::InvocationsReport {
            header,
            root: options.root.clone().unwrap_or_default(),
            limit: options.limit.unwrap_or(INVOCATION_LINES),
        }),
        Format::Chrome => Box::new(calltrace::ChromeReport {
            header,
            losses: calltrace::losses(recording),
        }),
    })
}

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

fn create(path: &Option<PathBuf>) -> Result<Box<dyn Write>, Failure> {
    Ok(match path {
        Some(path) => Box::new(BufWriter::new(File::create(path).map_err(|e| {
            Failure::BadInput(format!(
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
        crate::count(model.samples, "sample"),
        crate::count(model.thread_names().len() as u64, "thread"),
    ) + &format!(" ({})", path.display())
}
