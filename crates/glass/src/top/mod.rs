//! `glass top`: a live view of where a process or VM guest spends its time, like
//! `perf top` or `py-spy top`. It samples as `glass record` does (the same options and
//! backends, the same `glass-record` library and loop) but takes the records through
//! [`live::LiveOutput`] instead of writing a file (or as well, with `-o`).
//!
//! Two threads: the recording runs on the main thread exactly as in `glass record` (its
//! loop, ptrace requests and pinning belong there); the view thread ([`view`]) names the
//! addresses, keeps the sliding window and draws. The sampling thread only copies each
//! record into a channel after the target has its CPU back, so nothing the view does
//! (symbol files, the terminal) can hold up a sample.
//!
//! Quitting ends the recording as Ctrl-C ends `glass record` (SIGINT to glass): a
//! `--pid` target is detached and runs on, a `--vm` guest's QEMU is ended (kept with
//! `--keep-vm`), a `--gdb`/`--xen` guest runs on (the guardian as in record). A command
//! glass launched does not outlive glass top: when it exits, the command is ended if it
//! still runs, as the terminal's Ctrl-C would have ended it (SIGINT, and SIGKILL if it
//! is still there 2 s later).

mod live;
mod view;

use std::io::{BufWriter, IsTerminal};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::builder::TypedValueParser;
use clap::Args;
use glass_format::Writer;
use glass_record::recorder::Output;
use glass_record::{CaptureMode, Outcome};
use nix::sys::signal::{SigSet, Signal};

use crate::error::{Failure, Result};
use crate::RecordArgs;
use live::{LiveNotes, LiveOutput, Message};
use view::{Settings, Shared};

#[derive(Args, Debug, Clone)]
pub struct TopArgs {
    #[command(flatten)]
    pub record: RecordArgs,
    /// Seconds of samples the table covers (a sliding window)
    #[arg(long, default_value_t = 5.0, value_parser = parse_seconds)]
    pub window: f64,
    /// Seconds between refreshes of the table
    #[arg(long, default_value_t = 1.0, value_parser = parse_seconds)]
    pub interval: f64,
    /// Print the table as text every interval (and once more at the end) instead of
    /// drawing the interactive view: for a pipe or a log
    #[arg(long)]
    pub batch: bool,
    /// Rows per table with --batch
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
    /// Start with one row per thread and function (key t cycles the thread views)
    #[arg(long)]
    pub threads: bool,
}

/// `glass top`'s `-o`: no file unless given (record's default is prof.glass). An empty
/// path stands for none, so the flattened `RecordArgs` keeps its plain `PathBuf`.
pub fn optional_output(arg: clap::Arg) -> clap::Arg {
    arg.default_value("")
        .hide_default_value(true)
        .value_parser(clap::builder::OsStringValueParser::new().map(PathBuf::from))
        .help("Also write the recording to this file (default: none)")
}

fn parse_seconds(text: &str) -> std::result::Result<f64, String> {
    match text.parse::<f64>() {
        Ok(seconds) if seconds.is_finite() && (0.1..=3600.0).contains(&seconds) => Ok(seconds),
        _ => Err("must be a number of seconds between 0.1 and 3600".to_string()),
    }
}

pub fn run(args: &TopArgs) -> Result<i32> {
    let record = &args.record;
    if record.capture == CaptureMode::Raw {
        return Err(Failure::bad_input(
            "glass top shows unwound stacks: --capture raw is for glass record",
        ));
    }
    if !args.batch && !std::io::stdout().is_terminal() {
        return Err(Failure::bad_input(
            "standard output is not a terminal (glass top draws its view there): use --batch for a text table every interval",
        ));
    }
    let options = crate::record::options(record);
    let launched = record.pid.is_none()
        && record.gdb.is_none()
        && record.qmp.is_none()
        && record.libvirt.is_none()
        && record.xen.is_none()
        && !record.vm
        && !record.command.is_empty();
    let file_path = (!record.output.as_os_str().is_empty()).then(|| record.output.clone());
    // Before any thread exists: every thread inherits the block, so these signals reach
    // only the recording loop's descriptor (the view raises SIGINT to end it).
    let mut stop = SigSet::empty();
    for signal in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        stop.add(signal);
    }
    stop.thread_block()
        .map_err(|e| Failure::runtime(format!("cannot set up signal handling: {e}")))?;

    let mut kept = None;
    let file: Option<Box<dyn Output>> = match &file_path {
        Some(path) => {
            let file = glass_record::create_output(path)?;
            kept = Some(glass_record::OutputFile::new(path, &file)?);
            // The header goes out at once, as in `glass record`.
            let mut writer = Writer::new(BufWriter::with_capacity(256 << 10, file))
                .map_err(|e| glass_record::write_failure(path, &e))?;
            writer
                .flush()
                .map_err(|e| glass_record::write_failure(path, &e))?;
            Some(Box::new(writer))
        }
        None => None,
    };
    let shared = Arc::new(Shared::default());
    let settings = Settings {
        target: target_name(record),
        show_pid: launched,
        window: Duration::from_secs_f64(args.window),
        interval: Duration::from_secs_f64(args.interval),
        frequency: record.frequency,
        limit: args.limit,
        threads: args.threads,
        batch: args.batch,
    };
    let (to_view, messages) = mpsc::channel();
    // The view thread starts with every signal blocked: the backends wait for theirs
    // (SIGCHLD for ptrace reports and a launched command's end) on descriptors of the
    // main thread, and a process-directed signal delivered to another thread that does
    // not block it would never reach them (each ptrace stop would then wait for a
    // timeout instead of its report).
    let mask = SigSet::all()
        .thread_swap_mask(nix::sys::signal::SigmaskHow::SIG_BLOCK)
        .map_err(|e| Failure::runtime(format!("cannot set up signal handling: {e}")))?;
    let view = {
        let shared = shared.clone();
        std::thread::Builder::new()
            .name("glass-top-view".into())
            .spawn(move || view::run(messages, &settings, &shared))
    };
    mask.thread_set_mask()
        .map_err(|e| Failure::runtime(format!("cannot set up signal handling: {e}")))?;
    let view = view.map_err(|e| Failure::runtime(format!("cannot start the view: {e}")))?;
    let output = LiveOutput {
        to_view: to_view.clone(),
        file,
        target_pid: shared.target_pid.clone(),
        held: None,
    };
    let mut notes = LiveNotes {
        to_view: to_view.clone(),
        quiet: record.quiet,
    };
    let result =
        glass_record::record_to(&options, Box::new(output), file_path.as_deref(), &mut notes);
    // As `glass record` does (its writer is dropped by now): a file removed with its
    // directory is a failure, never "wrote …"; one that failed to be written (a full
    // disk) is ended cleanly after its last whole block.
    let result = match (result, &kept) {
        (Ok(recorded), Some(kept)) => match kept.check_kept() {
            Ok(Some(warning)) => {
                glass_record::Notes::warn(&mut notes, &warning);
                Ok(recorded)
            }
            Ok(None) => Ok(recorded),
            Err(failure) => Err(failure),
        },
        (Err(failure @ glass_record::Failure::Runtime(_)), Some(kept)) => {
            Err(failure.followed_by(&kept.seal(&[])))
        }
        (result, _) => result,
    };
    let (text, linger) = match &result {
        Ok(recorded) => match &recorded.outcome {
            Outcome::TargetExited => (
                format!("target exited (status {})", recorded.summary.exit_status),
                true,
            ),
            Outcome::DurationElapsed => ("duration elapsed".to_string(), true),
            Outcome::StubLost => ("GDB stub connection lost".to_string(), true),
            Outcome::Signalled(_) | Outcome::WriteFailed(_) => (String::new(), false),
        },
        Err(failure) => (failure.to_string(), false),
    };
    let _ = to_view.send(Message::Ended { text, linger });
    drop(to_view);
    let (messages, notes) = view
        .join()
        .unwrap_or_else(|_| (mpsc::channel().1, Vec::new()));
    let quit = shared.quit.load(Ordering::SeqCst);
    // A command glass top launched does not outlive the view (it would run on unseen
    // after the user quit, or after --duration, where glass record leaves it running).
    let ended_command = match launched && result.is_ok() {
        true => end_command(shared.target_pid.load(Ordering::SeqCst) as i32),
        false => None,
    };
    for line in notes {
        eprintln!("{line}");
    }
    // Notes sent after the view closed (the user quit while QEMU was being ended).
    for message in messages.try_iter() {
        if let Message::Note { warning, text } = message {
            eprintln!("{}", live::note_line(warning, &text));
        }
    }
    let recorded = result?;
    if !record.quiet {
        crate::record::print_summary(record, file_path.as_deref(), &recorded);
        if let Some(pid) = ended_command {
            eprintln!("glass: ended the command it launched (pid {pid})");
        }
    }
    Ok(if quit { 0 } else { recorded.exit_status })
}

/// The target as the header names it (short: the header holds more).
fn target_name(record: &RecordArgs) -> String {
    let base = |path: &str| path.rsplit('/').next().unwrap_or(path).to_string();
    let symbols = record
        .symbols
        .as_ref()
        .map(|p| base(&p.to_string_lossy()))
        .or_else(|| {
            // --vm's symbols default to its -kernel.
            let at = record.command.iter().position(|a| a == "-kernel")?;
            record.command.get(at + 1).map(|k| base(k))
        })
        .unwrap_or_default();
    if let Some(pid) = record.pid {
        let name = glass_target::procfs::thread_name(pid, pid);
        return format!("pid {pid} ({name})");
    }
    if let Some(address) = &record.gdb {
        return format!("VM guest at {address} ({symbols})");
    }
    if let Some(domain) = &record.xen {
        return format!("Xen domain {domain} ({symbols})");
    }
    if let Some(socket) = &record.qmp {
        return format!("QEMU at {socket} ({symbols})");
    }
    if let Some(domain) = &record.libvirt {
        return format!("libvirt domain {domain} ({symbols})");
    }
    let program = record.command.first().map_or(String::new(), |c| base(c));
    if record.vm {
        return format!("VM: {program} ({symbols})");
    }
    let mut shown = std::iter::once(program)
        .chain(record.command.iter().skip(1).cloned())
        .collect::<Vec<_>>()
        .join(" ");
    if shown.chars().count() > 48 {
        shown = shown.chars().take(47).collect::<String>() + "…";
    }
    shown
}

/// Ends the command glass launched (our child) if it still runs: SIGINT, as the
/// terminal's Ctrl-C would have sent it, then SIGKILL if it has not ended within 2 s;
/// reaped either way. Its pid if it had to be ended.
fn end_command(pid: i32) -> Option<i32> {
    if pid <= 0 {
        return None;
    }
    let reaped = || {
        let mut status = 0;
        // SAFETY: writes the status word; our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        // Not ours any more (already reaped), or gone now.
        r != 0
    };
    if reaped() {
        return None;
    }
    // SAFETY: signals our own child, not yet reaped (its pid cannot have been reused).
    unsafe { libc::kill(pid, libc::SIGINT) };
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        if reaped() {
            return Some(pid);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    // SAFETY: blocks until our child is gone.
    unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
    Some(pid)
}
