//! Recording, as a library: the CLI's `glass record` and `glass top` (a live view, which
//! takes the records through [`recorder::Output`] with [`record_to`]) hand it
//! [`RecordOptions`] and a [`Notes`] to tell the user things, and get back a
//! [`Recorded`]. Set-up shared by the backends, then one module per backend:
//!
//! - [`perf`]: the kernel samples the target (cpu-clock) and copies its registers and
//!   stack; the target is never stopped. The default where perf_event_open is allowed.
//! - [`ptrace`]: glass stops each thread at every tick, copies what it needs, resumes.
//! - [`guest`]: a VM guest through a `glass_target::guest::GuestBackend` (a VMM's GDB
//!   stub for `--gdb`); [`qemu`] launches QEMU for `--vm` and samples it with the same
//!   loop; [`guardian`] outlives glass and lets the VM run (or ends the QEMU `--vm`
//!   launched) if glass is killed. What the guest's OS keeps in its memory (a Linux
//!   kernel's tasks, user mappings, unwind tables, slide) the loop asks through one
//!   `glass_target::guest_os::GuestOs`, which `guest_os` picks (glass-linux-guest's).
//! - [`monitor`]: `--qmp`/`--libvirt`, a QEMU that runs already, through its monitor
//!   (a GDB stub enabled for the recording, RAM read from QEMU's memory), same loop.
//! - [`xen`]: a Xen guest from dom0 through the hypervisor
//!   (`glass_target::xen::XenBackend`), sampled by the same loop as `guest`.
//!
//! All hand their samples to a [`recorder::Recorder`], which unwinds, keeps module maps,
//! and writes the file after the target has its CPU back.

/// std's `eprintln!` panics when standard error is gone (a closed pipe); the guardian
/// that prints with it is what must outlive glass and let a target run. As the CLI's
/// (`glass/src/main.rs`), this one drops what cannot be written, and shadows std's in
/// every module below.
macro_rules! eprintln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

pub mod driver;
mod error;
pub mod event;
pub mod guardian;
mod guest;
mod guest_image;
mod guest_os;
mod monitor;
mod perf;
mod ptrace;
mod python;
mod qemu;
pub mod recorder;
mod xen;

use std::fs::File;
use std::io::BufWriter;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use driver::LateTicks;
use glass_format::{Backend, Writer};
use glass_target::TargetError;
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

pub use error::{Failure, Result};
use recorder::Recorder as Sink;

/// What `glass record` was asked to do (the CLI's arguments, parsed).
#[derive(Debug, Clone)]
pub struct RecordOptions {
    pub output: PathBuf,
    pub frequency: u32,
    pub duration: Option<f64>,
    pub max_depth: u32,
    pub pid: Option<i32>,
    pub gdb: Option<String>,
    /// A running QEMU's QMP socket (`--qmp`): attached without a restart.
    pub qmp: Option<String>,
    /// A running libvirt domain (`--libvirt`): its QEMU attached without a restart.
    pub libvirt: Option<String>,
    /// A Xen domain (id or name) to sample from dom0.
    pub xen: Option<String>,
    pub symbols: Option<PathBuf>,
    pub guest_memory: Option<PathBuf>,
    /// A Linux guest kernel's BTF (a copy of its /sys/kernel/btf/vmlinux): each guest
    /// sample's task read and recorded.
    pub guest_btf: Option<PathBuf>,
    /// A copy of a Linux guest's filesystem (`--guest-root`): user-mode samples are
    /// walked with the binaries found there.
    pub guest_root: Option<PathBuf>,
    pub vm: bool,
    pub keep_vm: bool,
    pub no_translation_cache: bool,
    /// Xen: the most of wall time (percent) the domain may be held stopped on average
    /// (`None`: the default budget).
    pub max_stopped: Option<f64>,
    /// VM guests: whose time the rate counts (`None`: the guest's running time).
    pub clock: Option<SampleClock>,
    pub sampler_cpu: Option<usize>,
    pub backend: BackendChoice,
    pub unwind: UnwindMode,
    pub capture: CaptureMode,
    pub stack_size: Option<u32>,
    /// perf backend: ring data KiB per CPU (a power of two); default sized from the rate
    /// and the stack size.
    pub ring_kib: Option<u32>,
    /// perf backend: kernel frames (`None`: where permitted).
    pub kernel: Option<bool>,
    /// perf backend: time blocked, from context switches.
    pub off_cpu: bool,
    pub no_idle: bool,
    /// Do not read Python frames (ptrace backend).
    pub no_python: bool,
    pub command: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendChoice {
    Auto,
    Perf,
    Ptrace,
}

/// Whose seconds a VM guest's sampling rate counts (`--clock`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SampleClock {
    /// The guest's running time, as perf's cpu-clock counts a task's own: the time glass
    /// holds the guest stopped is not counted, so every second of the guest's own time is
    /// sampled alike however long its stops take.
    Running,
    /// Wall-clock time, as uniprof's loop and most external samplers count: F stops per
    /// wall second, whatever they cost the guest. Code whose stops take longer is
    /// sampled more often per second of the guest's own time.
    Wall,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum UnwindMode {
    Auto,
    Fp,
    Dwarf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CaptureMode {
    Frames,
    Raw,
}

/// What a recording tells its user while it runs and at its end: warnings (always
/// shown) and figures (the cost summary, which the CLI's `--quiet` hides). A live view
/// shows them in its own way instead of on stderr.
pub trait Notes {
    fn warn(&mut self, text: &str);
    fn figure(&mut self, text: &str);
}

/// A finished recording.
pub struct Recorded {
    pub summary: glass_format::Summary,
    /// Threads with samples (the summary's `threads` counts every thread seen).
    pub threads_sampled: u32,
    /// Where the recording's time went (the summary's duration is all of it to the
    /// summary): set-up before sampling, sampling, stopping after it; then the time
    /// spent writing the end (kernel symbols, JIT files), after the summary.
    pub timing: Timing,
    pub outcome: Outcome,
    pub backend: Backend,
    /// What became of a VM `--vm` launched.
    pub vm_fate: Option<String>,
    /// The exit status `glass record` ends with (the launched command's, else 0).
    pub exit_status: i32,
    /// Samples the kernel dropped, per thread, most first: (pid, tid, name, count).
    pub lost_by_thread: Vec<(i32, i32, String, u64)>,
    /// perf backend: kernel stacks recorded (with how many samples held kernel
    /// frames), or why not.
    pub kernel_stacks: Option<std::result::Result<u64, String>>,
    /// Off-CPU samples (`--off-cpu`) and the time they stand for.
    pub off_cpu_samples: u64,
    pub off_cpu_ns: u64,
    /// The sampling rate.
    pub frequency: u32,
    /// What became of Python frames (interpreters found, samples with them, failures,
    /// or why a Python process's were not read); None: no Python met, or not asked.
    pub python: Option<String>,
}

/// Where a recording's time went, in ns.
#[derive(Debug, Clone, Copy, Default)]
pub struct Timing {
    pub setting_up_ns: u64,
    pub sampling_ns: u64,
    pub stopping_ns: u64,
    pub writing_end_ns: u64,
}

/// Why the recording ended.
pub enum Outcome {
    TargetExited,
    /// The connection to a VM's GDB stub broke while recording.
    StubLost,
    DurationElapsed,
    Signalled(i32),
    WriteFailed(std::io::Error),
}

/// The longest glass may hold its target stopped in one stop (a sample, the handshake
/// with a GDB stub, a detach) unless GLASS_STOP_BOUND_MS says otherwise. Past it, glass's
/// guardian frees the target by killing glass (see [`guardian`]).
pub const DEFAULT_STOP_BOUND: Duration = Duration::from_millis(50);
/// The environment variable that sets the stop bound, in milliseconds.
pub const STOP_BOUND_VARIABLE: &str = "GLASS_STOP_BOUND_MS";
/// The bounds of the bound: below 5 ms a loaded machine's scheduling alone would trip it.
const STOP_BOUND_MS: std::ops::RangeInclusive<u64> = 5..=60_000;

/// The stop bound: GLASS_STOP_BOUND_MS (whole milliseconds, 5 to 60000), else
/// [`DEFAULT_STOP_BOUND`].
pub fn stop_bound() -> Result<Duration> {
    let Some(value) = std::env::var_os(STOP_BOUND_VARIABLE) else {
        return Ok(DEFAULT_STOP_BOUND);
    };
    let text = value.to_string_lossy();
    match text.trim().parse::<u64>() {
        Ok(ms) if STOP_BOUND_MS.contains(&ms) => Ok(Duration::from_millis(ms)),
        _ => Err(Failure::bad_input(format!(
            "{STOP_BOUND_VARIABLE}={text}: the stop bound must be a whole number of milliseconds from {} to {} (default {})",
            STOP_BOUND_MS.start(),
            STOP_BOUND_MS.end(),
            DEFAULT_STOP_BOUND.as_millis()
        ))),
    }
}

/// Records as `args` says, into the file `args.output` names; notes go to `notes`.
pub fn record(args: &RecordOptions, notes: &mut dyn Notes) -> Result<Recorded> {
    let backend = prepare(args, notes)?;
    let staged = StagedOutput::create(&args.output)?;
    let file = staged
        .file
        .try_clone()
        .map_err(|e| write_failure(&args.output, &e))?;
    let kept = OutputFile::new(&args.output, &file)?;
    // Block the signals glass waits for before any target exists, so they arrive as
    // descriptor reads and never interrupt a half-written record.
    let stop_signals = stop_signal_fd()?;
    // The sink flushes at least every FLUSH_PERIOD after the target runs again, so a
    // glass killed mid-recording loses at most that much; the header goes out at once.
    let mut writer = Writer::new(BufWriter::with_capacity(256 << 10, file))
        .map_err(|e| write_failure(&args.output, &e))?;
    writer
        .flush()
        .map_err(|e| write_failure(&args.output, &e))?;
    let recorded = start_named(
        args,
        backend,
        Box::new(writer),
        (staged.written_at(), staged.rename()),
        notes,
        &stop_signals,
    );
    // A run that recorded something and never wrote its Meta (it ended before the
    // target was reached, at a runtime failure) still takes the path: what it wrote is
    // what the user asked for. One refused before it recorded anything has had its file
    // removed, and leaves what was at the path as it was.
    if matches!(
        recorded,
        Err(Failure::BadInput(_) | Failure::TracedByAnother(_))
    ) {
        staged.discard();
    } else {
        staged.settle()?;
    }
    match recorded {
        Ok(recorded) => {
            if let Some(warning) = kept.check_kept()? {
                notes.warn(&warning);
            }
            Ok(recorded)
        }
        // A runtime failure (a full disk, a target or stub that died): the file keeps
        // what was written whole, ended cleanly.
        Err(failure @ Failure::Runtime(_)) => Err(failure.followed_by(&kept.seal(&[]))),
        Err(failure) => Err(failure),
    }
}

/// [`record`], with the records going to `output` instead (a live view, which may
/// write a file of its own: `file`, removed if the target cannot be started). The
/// caller blocks SIGINT/SIGTERM/SIGHUP in every thread it starts (the recording ends
/// on the first that arrives) and sends one of them to end the recording.
pub fn record_to<'a>(
    args: &'a RecordOptions,
    output: Box<dyn recorder::Output + 'a>,
    file: Option<&Path>,
    notes: &'a mut dyn Notes,
) -> Result<Recorded> {
    let backend = prepare(args, notes)?;
    let stop_signals = stop_signal_fd()?;
    start_named(args, backend, output, (file, None), notes, &stop_signals)
}

/// Checks what can be checked before anything starts; the backend to use.
fn prepare(args: &RecordOptions, notes: &mut dyn Notes) -> Result<BackendChoice> {
    stop_bound()?;
    if let Some(cpu) = args.sampler_cpu {
        // Check the CPU before starting anything; pin only after launching, so the
        // target does not inherit the sampler's core.
        check_cpu(cpu)?;
    }
    let backend = match args.backend {
        BackendChoice::Ptrace => BackendChoice::Ptrace,
        BackendChoice::Perf => {
            if !glass_target::perf::available() {
                return Err(Failure::runtime(
                    "--backend perf: perf_event_open is not permitted here (see /proc/sys/kernel/perf_event_paranoid); use --backend ptrace",
                ));
            }
            BackendChoice::Perf
        }
        // Python frames are read from a thread held stopped: a Python target is
        // sampled with ptrace unless told otherwise (see `python`).
        BackendChoice::Auto if !args.no_python && python::is_python_target(args) => {
            BackendChoice::Ptrace
        }
        BackendChoice::Auto if glass_target::perf::available() => BackendChoice::Perf,
        BackendChoice::Auto => BackendChoice::Ptrace,
    };
    if backend == BackendChoice::Perf && !args.no_python && python::is_python_target(args) {
        notes.warn(
            "Python frames are not read with the perf backend (it never stops the target, so the interpreter's frame chain cannot be read consistently): the default backend for a Python target, ptrace, reads them",
        );
    }
    let guest = args.vm
        || args.gdb.is_some()
        || args.xen.is_some()
        || args.qmp.is_some()
        || args.libvirt.is_some();
    if let (Some(clock), false) = (args.clock, guest) {
        let clock = format!("{clock:?}").to_lowercase();
        return Err(Failure::bad_input(format!(
            "--clock {clock} applies to VM guests (a process is sampled on the kernel's cpu-clock with perf, on wall time with ptrace)"
        )));
    }
    let kernel_options = match (args.off_cpu, args.kernel) {
        (true, _) => Some("--off-cpu"),
        (false, Some(true)) => Some("--kernel"),
        _ => None,
    };
    if let Some(option) = kernel_options {
        if guest || args.backend == BackendChoice::Ptrace {
            return Err(Failure::bad_input(format!(
                "{option} needs the perf backend (not --backend ptrace or a VM guest)"
            )));
        }
        if backend == BackendChoice::Ptrace {
            notes.warn(&format!(
                "{option} ignored: perf_event_open is not permitted here, so the ptrace backend samples user stacks only"
            ));
        }
    }
    Ok(backend)
}

/// Runs the backend `args` asks for, its records going to `output`.
/// Starts the backend with the records going to `output`. `file` is the file they are
/// written to, removed if the target cannot be started; `rename`, (that file, the path
/// the user named), moves it there once the target is reached.
fn start_named<'a>(
    args: &'a RecordOptions,
    backend: BackendChoice,
    output: Box<dyn recorder::Output + 'a>,
    (file, rename): (Option<&Path>, Option<(PathBuf, PathBuf)>),
    notes: &'a mut dyn Notes,
    stop_signals: &SignalFd,
) -> Result<Recorded> {
    let mut sink = Sink::new(args, output, notes, stop_bound()?);
    if let Some((from, to)) = rename {
        sink.name_output_when_started(from, to);
    }
    let start_failed = |error: TargetError| {
        if let Some(file) = file {
            let _ = std::fs::remove_file(file);
        }
        match error {
            TargetError::TracedBy(..) => Failure::TracedByAnother(error.to_string()),
            _ if error.is_bad_input() => Failure::bad_input(error.to_string()),
            _ => Failure::runtime(error.to_string()),
        }
    };
    if args.vm {
        return qemu::record(sink, stop_signals).map_err(start_failed)?;
    }
    if args.gdb.is_some() {
        return guest::record(sink, stop_signals).map_err(start_failed)?;
    }
    if args.xen.is_some() {
        return xen::record(sink, stop_signals).map_err(start_failed)?;
    }
    if args.qmp.is_some() || args.libvirt.is_some() {
        return monitor::record(sink, stop_signals).map_err(start_failed)?;
    }
    match backend {
        BackendChoice::Perf => perf::record(sink, stop_signals).map_err(start_failed)?,
        _ => ptrace::record(sink, stop_signals).map_err(start_failed)?,
    }
}

/// The name the file records for the unwinder in use.
fn unwind_name(mode: UnwindMode) -> &'static str {
    match mode {
        UnwindMode::Auto => "auto (CFI, frame pointers where there is none)",
        UnwindMode::Dwarf => "dwarf",
        UnwindMode::Fp => "fp",
    }
}

/// The recording's end, common to the backends: summary, end marker, the printed
/// figures, and the exit status to return.
fn finish(
    sink: Sink,
    outcome: Outcome,
    exit_status: Option<i32>,
    backend: Backend,
) -> Result<Recorded> {
    finish_with(sink, outcome, exit_status, backend, None)
}

/// [`finish`], saying what became of the VM `--vm` launched (`vm_fate`: "VM shut down",
/// "VM left running (--keep-vm)...", "guest powered off...").
fn finish_with(
    mut sink: Sink,
    outcome: Outcome,
    exit_status: Option<i32>,
    backend: Backend,
    vm_fate: Option<String>,
) -> Result<Recorded> {
    let summary = sink.summary(exit_status);
    let end_began = std::time::Instant::now();
    let written = match &outcome {
        Outcome::WriteFailed(_) => Ok(()),
        _ => sink.finish(&summary),
    };
    let timing = match sink.sampling_window() {
        (Some(began), ended) => {
            let ended = ended
                .unwrap_or(summary.duration_ns)
                .min(summary.duration_ns);
            Timing {
                setting_up_ns: began,
                sampling_ns: ended.saturating_sub(began),
                stopping_ns: summary.duration_ns.saturating_sub(ended),
                writing_end_ns: end_began.elapsed().as_nanos() as u64,
            }
        }
        _ => Timing::default(),
    };
    let _ = sink.flush();
    let with_fate = |failure: Failure| match &vm_fate {
        Some(fate) => failure.followed_by(&format!(" ({fate})")),
        None => failure,
    };
    if let Outcome::WriteFailed(error) = &outcome {
        return Err(with_fate(write_failure(&sink.args.output, error)));
    }
    written.map_err(|e| with_fate(write_failure(&sink.args.output, &e)))?;
    let exit_status = match (sink.args.pid, summary.exit_status) {
        (None, status) if status >= 0 => status,
        _ => 0,
    };
    let (off_cpu_samples, off_cpu_ns) = sink.off_cpu();
    Ok(Recorded {
        timing,
        threads_sampled: sink.threads_sampled(),
        summary,
        outcome,
        backend,
        vm_fate,
        exit_status,
        lost_by_thread: sink.lost_by_thread(),
        kernel_stacks: sink.kernel_stacks(),
        off_cpu_samples,
        off_cpu_ns,
        frequency: sink.args.frequency,
        python: sink.python_outcome(),
    })
}

pub fn create_output(path: &Path) -> Result<File> {
    File::create(path).map_err(|error| {
        Failure::bad_input(format!(
            "cannot write {}: {}",
            path.display(),
            error_text(&error)
        ))
    })
}

/// Where `glass record` writes: a new file beside the path the user named
/// (`.NAME.PID.partial`), renamed over it when the target is reached (the recorder's
/// Meta record). A run refused before that (no such domain, a process that is gone, a
/// second tracer) removes its own file and leaves a recording already at the path
/// whole. A path that names no regular file (a device, a pipe) is written directly.
struct StagedOutput {
    path: PathBuf,
    /// The file being written, when it is not the path itself.
    temp: Option<PathBuf>,
    file: File,
}

impl StagedOutput {
    fn create(path: &Path) -> Result<StagedOutput> {
        let cannot = |error: std::io::Error| {
            Failure::bad_input(format!(
                "cannot write {}: {}",
                path.display(),
                error_text(&error)
            ))
        };
        let staged = match std::fs::metadata(path) {
            // A recording there already: it must be writable (checked without
            // touching it), and stays as it is until this run records.
            Ok(meta) if meta.is_file() => {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(path)
                    .map_err(cannot)?;
                true
            }
            Ok(_) => false,
            Err(_) => true,
        };
        let temp = path.file_name().filter(|_| staged).map(|name| {
            path.with_file_name(format!(
                ".{}.{}.partial",
                name.to_string_lossy(),
                std::process::id()
            ))
        });
        if let Some(temp) = temp {
            // A directory glass cannot create the file in fails below, as before.
            if let Ok(file) = File::create(&temp) {
                return Ok(StagedOutput {
                    path: path.to_path_buf(),
                    temp: Some(temp),
                    file,
                });
            }
        }
        Ok(StagedOutput {
            path: path.to_path_buf(),
            temp: None,
            file: create_output(path)?,
        })
    }

    /// The file the records go to.
    fn written_at(&self) -> Option<&Path> {
        Some(self.temp.as_deref().unwrap_or(&self.path))
    }

    fn rename(&self) -> Option<(PathBuf, PathBuf)> {
        self.temp.clone().map(|temp| (temp, self.path.clone()))
    }

    /// A refused run: its own file goes, if it never took the path.
    fn discard(&self) {
        if let Some(temp) = &self.temp {
            let _ = std::fs::remove_file(temp);
        }
    }

    /// After the run: the records at the path, if they are not there yet.
    fn settle(&self) -> Result<()> {
        match &self.temp {
            Some(temp) if temp.exists() => {
                std::fs::rename(temp, &self.path).map_err(|e| write_failure(&self.path, &e))
            }
            _ => Ok(()),
        }
    }
}

/// The output file, opened to learn early that glass can write it, but not yet
/// truncated: a run refused before it records anything (bad input found once the
/// target is reached, say) leaves a recording already at that path whole, and removes
/// the empty file it created. [`PendingOutput::start`] truncates it when recording
/// begins.
pub struct PendingOutput {
    path: PathBuf,
    file: Option<File>,
    created: bool,
}

impl PendingOutput {
    pub fn open(path: &Path) -> Result<PendingOutput> {
        let created = !path.exists();
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|error| {
                Failure::bad_input(format!(
                    "cannot write {}: {}",
                    path.display(),
                    error_text(&error)
                ))
            })?;
        Ok(PendingOutput {
            path: path.to_path_buf(),
            file: Some(file),
            created,
        })
    }

    /// Recording begins: the file, emptied (a regular file: a device such as /dev/full
    /// or a pipe has nothing to empty, as `O_TRUNC` leaves them be).
    pub fn start(mut self) -> Result<File> {
        let file = self.file.take().expect("started once");
        if file.metadata().is_ok_and(|m| m.is_file()) {
            file.set_len(0)
                .map_err(|error| write_failure(&self.path, &error))?;
        }
        Ok(file)
    }
}

impl Drop for PendingOutput {
    fn drop(&mut self) {
        if self.file.take().is_some() && self.created {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The recording's file as glass created it, held open: to end it cleanly when writing
/// failed ([`OutputFile::seal`]), and to find out whether it was removed while glass
/// wrote it ([`OutputFile::check_kept`]): writes into a removed file succeed, and glass
/// once said "wrote …" of a file that was gone.
pub struct OutputFile {
    path: PathBuf,
    identity: (u64, u64),
    keep: File,
}

impl OutputFile {
    pub fn new(path: &Path, file: &File) -> Result<OutputFile> {
        use std::os::unix::fs::MetadataExt;
        let failed = |e: std::io::Error| write_failure(path, &e);
        let keep = file.try_clone().map_err(failed)?;
        let meta = keep.metadata().map_err(failed)?;
        Ok(OutputFile {
            path: path.to_path_buf(),
            identity: (meta.dev(), meta.ino()),
            keep,
        })
    }

    /// Whether the path still names the file glass writes.
    fn in_place(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.identity)
    }

    /// After writing failed (its writer dropped): cuts the file after its last whole
    /// block and ends it there with `last`; what was kept, to add to the failure's line.
    pub fn seal(&self, last: &[glass_format::Record]) -> String {
        if !self.in_place() {
            return String::new();
        }
        match glass_format::seal(&self.keep, last) {
            Ok(sealed) if sealed.cut > 0 => format!(
                "; kept the {} records written whole ({} bytes, ended cleanly), cut {} bytes of a block written in part",
                sealed.records, sealed.bytes, sealed.cut
            ),
            Ok(sealed) => format!(
                "; kept the {} records written whole ({} bytes, ended cleanly)",
                sealed.records, sealed.bytes
            ),
            Err(e) => format!(
                "; the file could not be ended cleanly ({}): it reads as cut off after its last whole block",
                error_text(&e)
            ),
        }
    }

    /// After a recording: the file must still be where it was written. Removed alone,
    /// it is written again from the open copy (`Some`: the warning to give); removed
    /// with its directory, the recording is lost: a runtime failure, never "wrote …".
    pub fn check_kept(&self) -> Result<Option<String>> {
        if self.in_place() {
            return Ok(None);
        }
        let len = self.keep.metadata().map_or(0, |m| m.len());
        let rewritten =
            File::open(format!("/proc/self/fd/{}", self.keep.as_raw_fd())).and_then(|mut from| {
                let mut to = File::create(&self.path)?;
                std::io::copy(&mut from, &mut to)?;
                to.sync_all()
            });
        match rewritten {
            Ok(()) => Ok(Some(format!(
                "{} was removed while glass wrote it: written again from glass's open copy ({len} bytes)",
                self.path.display()
            ))),
            Err(e) => Err(Failure::runtime(format!(
                "{} was removed while glass wrote it, and cannot be written again ({}): the recording ({len} bytes) is lost",
                self.path.display(),
                error_text(&e)
            ))),
        }
    }
}

pub fn error_text(error: &std::io::Error) -> String {
    let text = error.to_string();
    text.split(" (os error").next().unwrap_or(&text).to_string()
}

pub fn write_failure(path: &Path, error: &std::io::Error) -> Failure {
    Failure::runtime(format!(
        "writing {} failed: {}",
        path.display(),
        error_text(error)
    ))
}

pub fn stop_signal_fd() -> Result<SignalFd> {
    let mut mask = SigSet::empty();
    for signal in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        mask.add(signal);
    }
    mask.thread_block()
        .and_then(|()| SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC))
        .map_err(|e| Failure::runtime(format!("cannot set up signal handling: {e}")))
}

fn check_cpu(cpu: usize) -> Result<()> {
    let allowed = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))
        .map_err(|e| Failure::runtime(format!("cannot read CPU affinity: {e}")))?;
    if allowed.is_set(cpu).unwrap_or(false) {
        Ok(())
    } else {
        Err(Failure::bad_input(format!(
            "--sampler-cpu {cpu}: no such CPU available to glass"
        )))
    }
}

fn pin_to_cpu(cpu: usize) -> std::io::Result<()> {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu).map_err(std::io::Error::from)?;
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).map_err(std::io::Error::from)
}

/// A SIGINT/SIGTERM/SIGHUP waiting on the descriptor, if any.
pub fn take_stop_signal(stop_signals: &SignalFd) -> Option<i32> {
    stop_signals
        .read_signal()
        .ok()
        .flatten()
        .map(|info| info.ssi_signo as i32)
}

/// The sampling clock: a CLOCK_MONOTONIC `timerfd` armed at absolute deadlines computed
/// from the start (no drift; deadlines that passed unserved are counted as missed).
///
/// Each deadline is moved by a pseudo-random jitter of up to a quarter period either way
/// (the average rate stays exact): a workload that repeats with a period near a multiple
/// of the sampling period would otherwise be sampled at the same phase every time and
/// its profile skewed (seen here: 65/24/11 for a 60/30/10 loop at 999 Hz).
pub struct Ticker {
    fd: OwnedFd,
    start_ns: u64,
    period_ns: u64,
    next: u64,
    late: LateTicks,
    /// The stopped time the budget of [`LateTicks::TakeOne`] still allows: it grows by
    /// the budget's share of wall time (up to [`STOPPED_CREDIT_CAP_NS`] x that share),
    /// each stop spends its length, and a tick waits while it is below zero (a token
    /// bucket, as of `credit_at_ns`).
    credit_ns: f64,
    credit_at_ns: u64,
    /// How long after its deadline the last tick [`Ticker::fired`].
    fired_late_ns: u64,
    /// The budget held later deadlines back this many times, by this much in all.
    budget_holds: u64,
    budget_held_ns: u64,
    /// [`LateTicks::TakeOne`]: how close to a deadline the loop stops sleeping and spins
    /// for it instead, as uniprof's loop does (twice the median of short sleeps measured
    /// at the start: at the shortest one alone, 190-210 us in the nested Xen's dom0, the
    /// sleeps before the spin woke past the deadline anyway); 0 once spinning is given up.
    spin_ns: u64,
    /// Ticks taken while spinning, and their lateness in all: spinning is given up
    /// where it does not keep ticks prompt (a dom0 that shares its pCPU with a guest vCPU
    /// is preempted while it spins, and credit2 charges it for spinning).
    spun_ticks: u64,
    spun_late_ns: u64,
    /// Whether the loop came to wait for the next deadline before it passed (None: not
    /// yet asked since the last tick; [`Ticker::due`] asks). Spinning is judged only by
    /// the ticks it could have made prompt: at 997 Hz in the nested dom0 a tick whose
    /// deadline passed while the last sample was still being recorded is late whatever
    /// the loop does, and counting those gave spinning up in 5 runs of 6, leaving sleeps
    /// that woke 220-320 us late on average.
    arrived_in_time: std::cell::Cell<Option<bool>>,
    /// [`LateTicks::TakeEvery`]: ticks taken late, right after the one before.
    back_to_back: u64,
}

/// [`LateTicks::TakeEvery`]: the most deadlines it takes back to back after a stall.
pub const CATCH_UP_MOST: u64 = 8;

/// The ticks spinning is judged by (after the first few, which the recording's start
/// makes late), and the mean lateness (as a share of the period) past which it is given
/// up.
const SPIN_TRIAL: std::ops::Range<u64> = 16..80;
const SPIN_GIVE_UP_SHARE: u64 = 4;

/// What a clock did with its deadlines, for the summary: how often and how long the
/// stopped-time budget held them back (the deadlines that passed unserved are counted as
/// missed by the recorder).
#[derive(Clone, Copy, Debug, Default)]
pub struct Schedule {
    pub period: Duration,
    pub budget_holds: u64,
    pub budget_held: Duration,
    /// How close to each deadline the loop spun at the end (zero: it slept, or gave
    /// spinning up).
    pub spin: Duration,
    /// [`LateTicks::TakeEvery`]: deadlines taken late, right after the one before.
    pub back_to_back: u64,
}

impl Schedule {
    /// The deadlines the budget's holds stood for.
    pub fn deadlines_held(&self) -> f64 {
        self.budget_held.as_secs_f64() / self.period.as_secs_f64().max(1e-12)
    }
}

/// The wall time whose share of stopping the budget may save up: enough that the long
/// tail of a nested Xen's pauses is not held back while the average keeps within the
/// budget, too little for a burst to matter (at 25%, 50 ms of stopping: under sustained
/// load, 6.5 ms pauses, it is spent within eight stops, and each later one waits out three
/// times its length). At 50 ms (12.5 ms of stopping) each single pause longer than that,
/// a stop's p99 under TCG on a loaded host (12-33 ms), held the next deadlines back by
/// four times its excess, though the average stayed within the budget; the summary counts
/// the deadlines held back.
const STOPPED_CREDIT_CAP_NS: f64 = 200_000_000.0;

/// The median of a few 1 us sleeps, measured: how late a sleep usually wakes.
fn median_sleep_ns() -> u64 {
    let mut sleeps: Vec<u64> = (0..15)
        .map(|_| {
            let before = monotonic_now_ns();
            std::thread::sleep(Duration::from_micros(1));
            monotonic_now_ns() - before
        })
        .collect();
    sleeps.sort_unstable();
    sleeps[sleeps.len() / 2]
}

pub fn monotonic_now_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes the timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// splitmix64: a well-mixed value per tick number.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Ticker {
    pub fn new(frequency_hz: u32, late: LateTicks) -> std::io::Result<Self> {
        // SAFETY: creates a descriptor we own.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_CLOEXEC | libc::TFD_NONBLOCK,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut ticker = Ticker {
            // SAFETY: a fresh descriptor.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            start_ns: monotonic_now_ns(),
            period_ns: 1_000_000_000u64 / frequency_hz.max(1) as u64,
            next: 1,
            // A budget of nothing would never earn back a stop: at least 1%.
            late: match late {
                LateTicks::TakeOne { stopped_budget } => LateTicks::TakeOne {
                    stopped_budget: stopped_budget.max(0.01),
                },
                skip => skip,
            },
            // Full at the start, as a token bucket is: the first stops are the coldest
            // (each page and unwind table met for the first time; 20 ms in the nested
            // Xen), and an empty bucket held 3-11 deadlines of 800 back at 101 Hz.
            credit_ns: match late {
                LateTicks::TakeOne { stopped_budget } => {
                    STOPPED_CREDIT_CAP_NS * stopped_budget.max(0.01)
                }
                LateTicks::Skip | LateTicks::TakeEvery => 0.0,
            },
            credit_at_ns: monotonic_now_ns(),
            fired_late_ns: 0,
            budget_holds: 0,
            budget_held_ns: 0,
            spin_ns: match late {
                LateTicks::TakeOne { .. } | LateTicks::TakeEvery => 2 * median_sleep_ns(),
                LateTicks::Skip => 0,
            },
            spun_ticks: 0,
            spun_late_ns: 0,
            arrived_in_time: std::cell::Cell::new(None),
            back_to_back: 0,
        };
        ticker.arm()?;
        Ok(ticker)
    }

    /// How long the loop may sleep before it spins for the next deadline (zero: spin
    /// now); None where it does not spin (it sleeps until the timer fires).
    pub fn sleep_before_spin(&self) -> Option<Duration> {
        if self.spin_ns == 0 {
            return None;
        }
        let spin_from = self.deadline(self.next).saturating_sub(self.spin_ns);
        Some(Duration::from_nanos(
            spin_from.saturating_sub(monotonic_now_ns()),
        ))
    }

    pub fn fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    pub fn schedule(&self) -> Schedule {
        Schedule {
            period: Duration::from_nanos(self.period_ns),
            budget_holds: self.budget_holds,
            budget_held: Duration::from_nanos(self.budget_held_ns),
            spin: Duration::from_nanos(self.spin_ns),
            back_to_back: self.back_to_back,
        }
    }

    fn deadline(&self, n: u64) -> u64 {
        let quarter = (self.period_ns / 4).max(1);
        let jitter = (mix(n) % (2 * quarter)) as i64 - quarter as i64;
        (self.start_ns + n * self.period_ns).saturating_add_signed(jitter)
    }

    fn arm(&mut self) -> std::io::Result<()> {
        let at = self.deadline(self.next);
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: (at / 1_000_000_000) as i64,
                tv_nsec: (at % 1_000_000_000) as i64,
            },
        };
        // SAFETY: arms our own timer.
        if unsafe {
            libc::timerfd_settime(
                self.fd.as_raw_fd(),
                libc::TFD_TIMER_ABSTIME,
                &spec,
                std::ptr::null_mut(),
            )
        } < 0
        {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Whether a late deadline is to be taken now, without waiting for the timer: in a
    /// Xen dom0 even a wait for a timer already due lets the pCPU go (the timer's
    /// interrupt comes back through Xen).
    pub fn due(&self) -> bool {
        let passed = self.deadline(self.next) <= monotonic_now_ns();
        if self.arrived_in_time.get().is_none() {
            self.arrived_in_time.set(Some(!passed));
        }
        matches!(self.late, LateTicks::TakeOne { .. } | LateTicks::TakeEvery) && passed
    }

    /// The loop slept for the timer and it woke it: how long after the deadline. Under
    /// nested TCG a dom0 sharing its pCPU with a guest vCPU came back 1-4 ms late for
    /// sub-millisecond waits (Xen's credit2 lets the vCPU run out its 1 ms rate limit,
    /// and the timer comes back through Xen), which bounds the rate more than anything
    /// glass does: the summary says so.
    /// (Measured by [`Ticker::fired`] from the time it reads anyway: in a Xen dom0 on
    /// Xen's clocksource every clock read is a system call.)
    pub fn lateness(&self) -> Duration {
        Duration::from_nanos(self.fired_late_ns)
    }

    /// Moves every later deadline by `ns`: the schedule then counts only the time the
    /// target ran. A VM guest's clocks stand still while glass holds it stopped, so with
    /// wall-clock deadlines the code where stops take longer would get more samples per
    /// second of the guest's own time than the rest (seen here: a deep recursion read
    /// through 48 KiB of stack copies at 38% of the samples for 31% of the guest's time).
    /// Then as [`Ticker::spend`].
    pub fn postpone(&mut self, ns: u64) {
        self.start_ns = self.start_ns.saturating_add(ns);
        self.spend(ns);
    }

    /// A stop of `ns` was taken: its length is spent from the stopped-time budget (if
    /// any), and the next deadline is armed, held back while the budget is spent.
    pub fn spend(&mut self, ns: u64) {
        let now = monotonic_now_ns();
        if let LateTicks::TakeOne { stopped_budget } = self.late {
            // The stop spends its length from the budget's credit; while the credit is
            // below zero the next tick waits (under load a pause can take milliseconds:
            // 58% of wall time stopped at 80-160 stops/s in a loaded run, the split 7
            // points off, and the guest's own clocks run on through it). A token bucket
            // rather than a gap after every stop: at 997 Hz the jitter makes half the
            // gaps shorter than three stops, and spacing each of them cost stops the
            // average budget allowed.
            let credit = self.credit(now, stopped_budget) - ns as f64;
            self.credit_ns = credit;
            self.credit_at_ns = now;
            if credit < 0.0 {
                let earliest = now.saturating_add((-credit / stopped_budget) as u64);
                let next = self.deadline(self.next);
                if next < earliest {
                    self.start_ns = self.start_ns.saturating_add(earliest - next);
                    self.budget_holds += 1;
                    self.budget_held_ns += earliest - next;
                }
            }
        }
        let _ = self.arm();
    }

    /// The budget's credit at `now`: what it was, plus the budget's share of the time
    /// since, up to the cap.
    fn credit(&self, now: u64, budget: f64) -> f64 {
        let earned = now.saturating_sub(self.credit_at_ns) as f64 * budget;
        (self.credit_ns + earned).min(STOPPED_CREDIT_CAP_NS * budget)
    }

    /// After the descriptor polled readable: `Some(missed deadlines)` when a tick is
    /// due, `None` for a spurious wake-up. The next tick is armed here unless `arm` is
    /// false: a clock of the target's running time, or one with a budget, arms it in
    /// [`Ticker::postpone`] or [`Ticker::spend`] once the sample is taken, and arming twice cost a system call per sample (in a Xen
    /// dom0 under TCG, tens of microseconds each).
    pub fn fired(&mut self, arm: bool) -> Option<u64> {
        // The descriptor only wakes the loop: a tick is due when its deadline has passed
        // (a late one taken at once is due before the timer has told it).
        let mut count = 0u64;
        // SAFETY: reads 8 bytes into `count`.
        let _ = unsafe { libc::read(self.fd.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
        let now = monotonic_now_ns();
        if self.deadline(self.next) > now {
            return None;
        }
        self.fired_late_ns = now - self.deadline(self.next);
        let in_time = self.arrived_in_time.take().unwrap_or(true);
        if self.spin_ns > 0 && in_time {
            self.spun_ticks += 1;
            if SPIN_TRIAL.contains(&self.spun_ticks) {
                self.spun_late_ns += self.fired_late_ns;
            }
            let judged = SPIN_TRIAL.end - SPIN_TRIAL.start;
            if self.spun_ticks == SPIN_TRIAL.end
                && self.spun_late_ns / judged > self.period_ns / SPIN_GIVE_UP_SHARE
            {
                self.spin_ns = 0;
            }
        }
        let mut missed = 0;
        self.next += 1;
        if self.late == LateTicks::TakeEvery {
            while self.deadline(self.next + CATCH_UP_MOST) <= now {
                self.next += 1;
                missed += 1;
            }
            if self.deadline(self.next) <= now {
                self.back_to_back += 1;
            }
            if arm {
                let _ = self.arm();
            }
            return Some(missed);
        }
        while self.deadline(self.next) <= now {
            self.next += 1;
            missed += 1;
        }
        if missed > 0
            && matches!(self.late, LateTicks::TakeOne { stopped_budget }
                if self.credit(now, stopped_budget) >= 0.0)
        {
            // The latest deadline that passed is armed: the timer fires at once.
            self.next -= 1;
            missed -= 1;
        }
        if arm {
            let _ = self.arm();
        }
        Some(missed)
    }
}

#[cfg(test)]
mod ticker_tests {
    use super::{LateTicks, Ticker};

    /// A ticker with the default budget (as for Xen), once its first tick has come.
    fn budgeted_after_first_tick(hz: u32) -> Ticker {
        let ticker = Ticker::new(
            hz,
            LateTicks::TakeOne {
                stopped_budget: 0.25,
            },
        )
        .unwrap();
        assert!(readable_within(&ticker, 5000), "the first tick never came");
        ticker
    }

    fn readable_within(ticker: &Ticker, ms: i32) -> bool {
        let mut poll = libc::pollfd {
            fd: ticker.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut poll, 1, ms) > 0 }
    }

    #[test]
    fn spinning_is_judged_only_by_ticks_the_loop_came_in_time_to_wait_for() {
        let mut ticker = budgeted_after_first_tick(1000);
        let spin = ticker.schedule().spin;
        assert!(!spin.is_zero(), "a budgeted ticker spins");
        // Each sample's recording outlasts the next deadline: late before the loop waits.
        for _ in 0..100 {
            std::thread::sleep(std::time::Duration::from_millis(2));
            assert!(ticker.due());
            ticker.fired(true);
        }
        assert_eq!(
            ticker.schedule().spin,
            spin,
            "given up for ticks it could not help"
        );
        // The loop came in time, and the tick still came late (a pCPU taken away while
        // it spun): counted, and spinning is given up.
        for _ in 0..100 {
            while ticker.due() {
                ticker.fired(true);
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
            ticker.fired(true);
        }
        assert!(ticker.schedule().spin.is_zero(), "never given up");
    }

    #[test]
    fn taking_every_deadline_runs_a_backlog_back_to_back_up_to_its_bound() {
        use super::CATCH_UP_MOST;
        let mut ticker = Ticker::new(1000, LateTicks::TakeEvery).unwrap();
        assert!(readable_within(&ticker, 5000), "the first tick never came");
        assert_eq!(ticker.fired(true), Some(0));
        // Stops of 4 ms, then of 30 ms: the deadlines that passed meanwhile (measured,
        // since a loaded machine sleeps longer) are taken back to back up to the bound,
        // and only the older ones count as missed.
        for stop_ms in [4, 30] {
            let slept = std::time::Instant::now();
            std::thread::sleep(std::time::Duration::from_millis(stop_ms));
            let passed = slept.elapsed().as_secs_f64() * 1000.0;
            let (mut taken, mut missed) = (0u64, 0u64);
            while ticker.due() {
                missed += ticker.fired(true).expect("a due tick fires");
                taken += 1;
            }
            let most = CATCH_UP_MOST as f64 + 1.0;
            assert!(
                (taken as f64 - passed.min(most)).abs() <= 2.0,
                "{taken} taken back to back after {passed:.1} ms"
            );
            let older = (passed - most).max(0.0);
            assert!(
                (missed as f64 - older).abs() <= 3.0,
                "{missed} missed after {passed:.1} ms"
            );
        }
        assert!(ticker.schedule().back_to_back >= CATCH_UP_MOST);
    }

    #[test]
    fn a_late_tick_taken_one_at_a_time_fires_again_at_once() {
        let mut ticker = budgeted_after_first_tick(1000);
        std::thread::sleep(std::time::Duration::from_millis(20));
        // About 20 deadlines passed: one is taken now, one armed at once, the rest missed.
        let missed = ticker.fired(true).expect("a tick was due");
        assert!((10..=30).contains(&missed), "{missed} missed");
        assert!(
            ticker.due(),
            "the latest passed deadline is not due at once"
        );
        // Taken at once, it counts no more missed (the one after it is not due yet, or
        // barely: never a burst).
        assert!(ticker.fired(true).expect("a tick was due") <= 1);
    }

    #[test]
    fn a_long_stop_waits_until_the_budget_is_earned_back() {
        let mut ticker = budgeted_after_first_tick(100);
        assert!(ticker.fired(false).is_some());
        // 250 ms stopped after ~300 ms of running: the credit saved (50 ms at most) is
        // far short, and the rest takes ~800 ms more at 25%.
        std::thread::sleep(std::time::Duration::from_millis(300));
        ticker.postpone(250_000_000);
        assert!(
            !ticker.due() && !readable_within(&ticker, 700),
            "ticked before the budget was earned back"
        );
        assert!(readable_within(&ticker, 5000), "no tick after the wait");
        let missed = ticker.fired(true).expect("a tick was due");
        assert!(
            missed <= 1,
            "{missed} missed: the wait is not counted as missed ticks"
        );
    }

    #[test]
    fn a_short_gap_is_allowed_while_the_budget_holds_on_average() {
        let mut ticker = budgeted_after_first_tick(1000);
        assert!(ticker.fired(false).is_some());
        // The full bucket the ticker starts with spent (not overspent: no hold).
        ticker.postpone(49_000_000);
        // 100 ms of running saved 25 ms of stopping: a 2 ms stop spends part of it
        // and the next tick keeps its deadline (0.75-1.25 ms on), where spacing every
        // stop would hold it 6 ms.
        std::thread::sleep(std::time::Duration::from_millis(100));
        let taken = ticker.fired(false);
        assert!(taken.is_some(), "a deadline had passed");
        ticker.postpone(2_000_000);
        assert!(
            readable_within(&ticker, 4),
            "the budget's saved credit did not let the next tick come on time"
        );
    }

    #[test]
    fn a_stop_is_followed_by_enough_running_to_keep_within_the_budget() {
        let mut ticker = budgeted_after_first_tick(1000);
        assert!(ticker.fired(false).is_some());
        // The bucket starts full: 50 ms of stopping at 25%. A first stop of 20 ms
        // spends part of it, and the next tick keeps its deadline (on the wall clock: a
        // running clock would also move it by the stop).
        ticker.spend(20_000_000);
        assert!(
            readable_within(&ticker, 10),
            "a full bucket held the first stops back"
        );
        assert!(ticker.fired(false).is_some());
        // A 50 ms stop spends the rest and 20 ms more: the next tick comes 80 ms on.
        ticker.spend(50_000_000);
        assert!(
            !ticker.due() && !readable_within(&ticker, 50),
            "ticked within 2.5x the stop past the bucket"
        );
        assert!(readable_within(&ticker, 5000), "no tick after the gap");
    }

    #[test]
    fn a_tick_taken_unarmed_waits_for_the_postponement_to_arm_the_next() {
        let mut ticker = Ticker::new(1000, LateTicks::Skip).unwrap();
        assert!(readable_within(&ticker, 5000), "the first tick never came");
        assert!(ticker.fired(false).is_some());
        // Nothing armed: no tick however long one waits.
        assert!(!readable_within(&ticker, 50), "armed although told not to");
        ticker.postpone(0);
        assert!(
            readable_within(&ticker, 5000),
            "postpone did not arm the next tick"
        );
        assert!(ticker.fired(true).is_some());
        assert!(
            readable_within(&ticker, 5000),
            "fired(true) did not arm the next tick"
        );
    }
}
