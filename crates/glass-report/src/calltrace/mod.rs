//! Reports of a `glass trace` recording: the calls rebuilt once ([`model`]), then one
//! module per output format. Every format states what was lost.

pub mod calls;
pub mod chrome;
pub mod invocations;
pub mod model;
pub mod paths;
pub mod scan;
pub mod tree;

use std::io::Write;

use glass_format::Recording;

pub use model::{Call, CallTrace};

/// One line saying what the recording holds and what it is missing.
pub fn header(recording: &Recording, trace: &CallTrace) -> String {
    header_of(
        recording,
        trace.calls.len() as u64,
        trace.threads.len(),
        trace.last.saturating_sub(trace.first),
        trace.tsc_hz,
    )
}

/// [`header`] from the figures alone: calls, threads, the span of the records (cycles).
/// The traced program's command line: the launched one, or (`--pid`) the attached
/// process's, which its Process record holds.
pub fn target_command(recording: &Recording) -> String {
    let Some(meta) = &recording.meta else {
        return String::new();
    };
    if !meta.command.is_empty() {
        return meta.command.join(" ");
    }
    recording
        .processes
        .iter()
        .find(|p| p.pid == meta.target_pid)
        .map(|p| p.name.clone())
        .unwrap_or_default()
}

pub fn header_of(
    recording: &Recording,
    calls: u64,
    threads: usize,
    span: u64,
    tsc_hz: u64,
) -> String {
    let command = target_command(recording);
    let rate = if tsc_hz == 0 {
        "cycle rate unknown: times in cycles".to_string()
    } else {
        format!("{:.3} GHz cycle counter", tsc_hz as f64 / 1e9)
    };
    format!(
        "glass trace: {command}: {}, {}, {}; {}; {rate}",
        crate::count(calls, "call"),
        crate::count(threads as u64, "thread"),
        model::duration(tsc_hz, span),
        losses(recording)
    )
}

/// What the probes could not record, in words.
pub fn losses(recording: &Recording) -> String {
    let Some(s) = recording
        .trace_summary
        .as_ref()
        .filter(|_| recording.complete)
    else {
        return "the recording ended early (glass stopped before the program): losses unknown"
            .to_string();
    };
    let mut parts = Vec::new();
    if s.lost > 0 {
        parts.push(format!(
            "{} records lost (ring full or write failed)",
            s.lost
        ));
    }
    if s.no_area_lost > 0 {
        parts.push(format!(
            "{} records lost (threads beyond --max-threads)",
            s.no_area_lost
        ));
    }
    if s.skipped > 0 {
        parts.push(format!(
            "{} calls not traced (signal inside a probe)",
            s.skipped
        ));
    }
    if s.unwound > 0 {
        parts.push(format!(
            "{} calls ended by longjmp or an exception",
            s.unwound
        ));
    }
    if parts.is_empty() {
        "no records lost".to_string()
    } else {
        parts.join(", ")
    }
}

/// Folded stacks of traced functions weighted by self time in nanoseconds (cycles when
/// the rate is unknown), for the flame graph.
pub fn folded(trace: &CallTrace) -> Vec<String> {
    paths::PathTree::of_calls(trace).folded(|f| trace.name(f).to_string(), trace.tsc_hz)
}

/// The calls of a model built from a `glass trace` recording.
fn calls_of(model: &crate::Model, format: crate::Format) -> Result<&CallTrace, crate::ReportError> {
    format.check(model.source)?;
    model.calls.as_ref().ok_or(crate::ReportError::NeedsCalls {
        format: format.name(),
    })
}

/// `--format calls`.
pub struct CallsReport {
    pub header: String,
    pub limit: usize,
}

impl crate::Exporter for CallsReport {
    fn write(&self, model: &crate::Model, out: &mut dyn Write) -> Result<(), crate::ReportError> {
        let trace = calls_of(model, crate::Format::Calls)?;
        Ok(calls::write_calls(trace, &self.header, self.limit, out)?)
    }
}

/// `--format tree`.
pub struct TreeReport {
    pub header: String,
    pub limit: usize,
}

impl crate::Exporter for TreeReport {
    fn write(&self, model: &crate::Model, out: &mut dyn Write) -> Result<(), crate::ReportError> {
        let trace = calls_of(model, crate::Format::Tree)?;
        let context = calls::TableContext {
            names: &trace.names,
            tsc_hz: trace.tsc_hz,
            counter_names: &trace.counter_names,
        };
        let paths = paths::PathTree::of_calls(trace);
        Ok(tree::write_tree(
            &paths,
            &context,
            &self.header,
            self.limit,
            out,
        )?)
    }
}

/// `--format invocations --root FUNCTION`.
pub struct InvocationsReport {
    pub header: String,
    pub root: String,
    pub limit: usize,
}

impl crate::Exporter for InvocationsReport {
    fn write(&self, model: &crate::Model, out: &mut dyn Write) -> Result<(), crate::ReportError> {
        let trace = calls_of(model, crate::Format::Invocations)?;
        let root = invocations::root_id(&trace.names, &self.root)?;
        let context = calls::TableContext {
            names: &trace.names,
            tsc_hz: trace.tsc_hz,
            counter_names: &trace.counter_names,
        };
        invocations::write_invocations(
            &invocations::invocations(trace, root),
            &context,
            &self.header,
            &self.root,
            self.limit,
            out,
        )
    }
}

/// `--format chrome`.
pub struct ChromeReport {
    pub header: String,
    pub losses: String,
}

impl crate::Exporter for ChromeReport {
    fn write(&self, model: &crate::Model, out: &mut dyn Write) -> Result<(), crate::ReportError> {
        let trace = calls_of(model, crate::Format::Chrome)?;
        Ok(chrome::write_chrome(
            trace,
            &self.header,
            &self.losses,
            out,
        )?)
    }
}
