//! `--format chrome`: the Chrome trace-event JSON that Perfetto and chrome://tracing
//! open: one complete ("X") event per call on its thread's timeline.

use std::io::{self, Write};

use super::model::CallTrace;

fn json_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

pub fn write_chrome(
    trace: &CallTrace,
    header: &str,
    losses: &str,
    out: &mut dyn Write,
) -> io::Result<()> {
    let micros = |cycles: u64| {
        if trace.tsc_hz == 0 {
            cycles as f64 / 1000.0
        } else {
            cycles as f64 * 1e6 / trace.tsc_hz as f64
        }
    };
    writeln!(out, "{{\"displayTimeUnit\":\"ns\",\"otherData\":{{\"glass\":{},\"losses\":{}}},\"traceEvents\":[", json_string(header), json_string(losses))?;
    let mut first = true;
    for (pid, tid) in &trace.threads {
        if !first {
            writeln!(out, ",")?;
        }
        first = false;
        write!(
            out,
            "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{pid},\"tid\":{tid},\"args\":{{\"name\":\"thread {tid}\"}}}}"
        )?;
    }
    for call in &trace.calls {
        let (pid, tid) = trace.threads[call.thread];
        if !first {
            writeln!(out, ",")?;
        }
        first = false;
        write!(
            out,
            "{{\"name\":{},\"ph\":\"X\",\"ts\":{:.3},\"dur\":{:.3},\"pid\":{pid},\"tid\":{tid},\"args\":{{\"cycles\":{}{}}}}}",
            json_string(trace.name(call.function)),
            micros(call.start - trace.first),
            micros(call.cycles()),
            call.cycles(),
            if call.unwound { ",\"unwound\":true" } else if call.incomplete { ",\"incomplete\":true" } else { "" }
        )?;
    }
    writeln!(out, "\n]}}")
}
