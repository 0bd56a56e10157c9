//! What the command line names, checked before anything starts: durations that a
//! `Duration` can hold, paths that are files where glass needs a file, and pids glass
//! may stop. Each refusal is one line and exit 2.
//!
//! Why a stat before every open: opening a FIFO blocks until its other end opens
//! (`report FIFO`, `-o FIFO` with no reader hung glass), and a character device such as
//! /dev/zero never ends (`--symbols /dev/zero` read forever). `stat` never blocks.

use std::fs::Metadata;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use crate::error::{Failure, Result};
use crate::{RecordArgs, ReportArgs, TraceArgs};

/// The longest `-d` taken: a year. Longer is a typo (`-d 1e308`), and past about 584
/// years a `Duration` cannot hold it at all.
const MAX_SECONDS: f64 = 365.0 * 24.0 * 3600.0;

/// `-d SECONDS`: a finite number above 0 and at most a year (`inf`, `nan`, `1e308`,
/// negative and zero are refused; `nan` once quietly meant 0).
pub fn parse_duration(text: &str) -> std::result::Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(seconds) if seconds.is_finite() && seconds > 0.0 && seconds <= MAX_SECONDS => {
            Ok(seconds)
        }
        _ => Err(format!(
            "must be a number of seconds above 0 and at most {MAX_SECONDS} (a year)"
        )),
    }
}

pub fn check_record(args: &RecordArgs) -> Result<()> {
    if let Some(pid) = args.pid {
        check_pid(pid)?;
    }
    if let Some(symbols) = &args.symbols {
        check_input(symbols, "--symbols")?;
    }
    if let Some(memory) = &args.guest_memory {
        check_input(memory, "--guest-memory")?;
    }
    if let Some(btf) = &args.guest_btf {
        check_input(btf, "--guest-btf")?;
    }
    if let Some(root) = &args.guest_root {
        if args.guest_btf.is_none() {
            return Err(Failure::bad_input(format!(
                "{}: --guest-root needs --guest-btf (the guest kernel's BTF tells where a process's mappings are)",
                root.display()
            )));
        }
        if !root.is_dir() {
            return Err(Failure::bad_input(format!(
                "{}: not a directory (--guest-root wants a copy of the guest's filesystem)",
                root.display()
            )));
        }
    }
    // (glass top's empty -o stands for no file.)
    if !args.output.as_os_str().is_empty() {
        check_recording_output(&args.output)?;
    }
    Ok(())
}

pub fn check_trace(args: &TraceArgs) -> Result<()> {
    if let Some(pid) = args.pid {
        check_pid(pid)?;
    }
    check_recording_output(&args.output)
}

pub fn check_report(args: &ReportArgs) -> Result<()> {
    check_recording(&args.input)?;
    if let Some(before) = &args.diff {
        check_recording(before)?;
    }
    if let Some(output) = &args.output {
        check_report_output(output)?;
    }
    Ok(())
}

/// A recording to read: a regular file (a missing one is left to the reader, which
/// says so).
pub fn check_recording(path: &Path) -> Result<()> {
    check_input(path, "a recording")
}

fn check_input(path: &Path, what: &str) -> Result<()> {
    match std::fs::metadata(path) {
        Ok(meta) if !meta.is_file() => Err(Failure::bad_input(format!(
            "{}: {} (glass reads {what} from a regular file)",
            path.display(),
            kind_of(&meta)
        ))),
        _ => Ok(()),
    }
}

/// A recording is written into a regular file (a missing one is created; a character
/// device such as /dev/null or /dev/full is taken too): opening a FIFO would wait for a
/// reader, and a directory or socket cannot be written.
fn check_recording_output(path: &Path) -> Result<()> {
    match std::fs::metadata(path) {
        Ok(meta) if !meta.is_file() && !meta.file_type().is_char_device() => {
            Err(Failure::bad_input(format!(
                "cannot write {}: {} (a recording is written to a regular file)",
                path.display(),
                kind_of(&meta)
            )))
        }
        _ => Ok(()),
    }
}

/// A report may go to a pipe or a device (`-o /dev/stdout`), but not to a FIFO nobody
/// reads: opening it would wait for ever. Opened without blocking, such a FIFO fails
/// with ENXIO.
fn check_report_output(path: &Path) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let Ok(meta) = std::fs::metadata(path) else {
        return Ok(());
    };
    if meta.is_dir() {
        return Err(Failure::bad_input(format!(
            "cannot write {}: it is a directory",
            path.display()
        )));
    }
    if meta.file_type().is_fifo() {
        let opened = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path);
        if let Err(error) = opened {
            let why = match error.raw_os_error() {
                Some(libc::ENXIO) => "a FIFO that nobody reads".to_string(),
                _ => glass_record::error_text(&error),
            };
            return Err(Failure::bad_input(format!(
                "cannot write {}: {why}",
                path.display()
            )));
        }
    }
    Ok(())
}

fn kind_of(meta: &Metadata) -> &'static str {
    let kind = meta.file_type();
    if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// glass cannot stop itself, nor a process it runs under (the shell that waits for it:
/// stopping that one could stop glass's own terminal and its Ctrl-C).
fn check_pid(pid: i32) -> Result<()> {
    let own = std::process::id() as i32;
    if pid == own {
        return Err(Failure::bad_input(format!(
            "--pid {pid} is glass itself: give the pid of another process"
        )));
    }
    let mut ancestor = std::os::unix::process::parent_id() as i32;
    // The chain ends at pid 1 (or 0 outside a pid namespace's view); bounded for safety.
    for _ in 0..4096 {
        if ancestor <= 1 {
            break;
        }
        if ancestor == pid {
            return Err(Failure::bad_input(format!(
                "--pid {pid} is a process glass runs under (its parent or an ancestor): give the pid of another process"
            )));
        }
        match parent_of(ancestor) {
            Some(parent) => ancestor = parent,
            None => break,
        }
    }
    Ok(())
}

/// A process's parent from /proc/PID/stat (the field after the state, behind the
/// command name's last parenthesis: the name may hold spaces and parentheses).
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        for bad in [
            "inf", "-inf", "nan", "NaN", "1e308", "0", "-1", "", "x", "1e7s",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_duration("2.5"), Ok(2.5));
        assert_eq!(parse_duration("0.01"), Ok(0.01));
    }

    #[test]
    fn own_parent_is_found() {
        assert_eq!(
            parent_of(std::process::id() as i32),
            Some(std::os::unix::process::parent_id() as i32)
        );
    }
}
