//! `glass`: the command line. One module per subcommand; this file only parses the
//! arguments, checks the paths and pids they name, and turns failures into one line and
//! an exit code.

/// std's `eprintln!` panics when standard error is gone (a closed pipe: `glass record …
/// 2>&1 | head -1`). glass must never die of a message, least of all while it holds a
/// target: this one drops what cannot be written. (Shadows std's in every module below.)
macro_rules! eprintln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// As `eprintln!`, for standard output (`info` and `report` end by SIGPIPE instead, as
/// Unix filters do: see `end_quietly_on_closed_pipe`).
macro_rules! println {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

mod error;
mod info;
mod inputs;
mod record;
mod report;
mod top;
mod trace;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use glass_record::{BackendChoice, CaptureMode, SampleClock, UnwindMode};

/// `glass trace --exit-probe`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ExitProbe {
    Auto,
    ReturnAddress,
}

#[derive(Parser)]
#[command(
    name = "glass",
    version,
    about = "A transparent, low-overhead profiler: sample stacks from outside the target"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Sample the stacks of a new or running process
    Record(RecordArgs),
    /// Symbolize a recording and print or write a profile
    Report(ReportArgs),
    /// Show what a recording holds and what it cost the target
    Info(InfoArgs),
    /// Time every call of chosen functions of a program glass launches, or of a running
    /// process (--pid), which is left as it was when glass detaches
    Trace(TraceArgs),
    /// A live view of where a process or VM guest spends its time (sampled as `glass
    /// record` samples), refreshed every second; --batch prints it as text
    #[command(mut_arg("output", top::optional_output))]
    Top(top::TopArgs),
    /// Internal: started by `glass record` (ptrace, VM guests, Xen); frees the target if
    /// glass dies or holds it stopped past the stop bound (GLASS_STOP_BOUND_MS)
    #[command(name = "__guardian", hide = true)]
    Guardian(glass_record::guardian::GuardianArgs),
    /// Internal: started by `glass trace --pid`; takes the probes out if glass dies
    #[command(name = "__trace-guardian", hide = true)]
    TraceGuardian(trace::TraceGuardianArgs),
}

#[derive(Args, Debug, Clone)]
#[command(group(clap::ArgGroup::new("attached_or_vm").args(["pid", "vm", "qmp", "libvirt", "gdb", "xen"]).multiple(true)))]
#[command(group(clap::ArgGroup::new("vm_or_qmp").args(["vm", "qmp", "libvirt", "gdb", "xen"]).multiple(true)))]
pub struct TraceArgs {
    /// Output recording
    #[arg(short, long, default_value = "trace.glass")]
    pub output: PathBuf,
    /// Functions to instrument: comma-separated globs over symbol names (`*` for all)
    #[arg(short = 'f', long = "functions")]
    pub functions: Option<String>,
    /// Calls into shared libraries to time, through the program's GOT: comma-separated
    /// globs (malloc,free,mem*)
    #[arg(long)]
    pub libcalls: Option<String>,
    /// Also instrument the -f functions of these loaded libraries: comma-separated globs
    /// over file names (libc.so*,libpython3*)
    #[arg(long, value_delimiter = ',')]
    pub lib: Vec<String>,
    /// Hardware counters to read per record (cycles,instructions,branches,branch-misses,
    /// cache-references,cache-misses); time only where the machine has none
    #[arg(long)]
    pub pmc: Option<String>,
    /// Records each thread's ring holds (a power of two)
    #[arg(long, default_value_t = 1 << 20)]
    pub ring_size: usize,
    /// How native code's calls are timed at their exit: `auto` patches each return where
    /// the function's code allows (calls and returns stay paired for the CPU; a call ended
    /// by longjmp or an exception is seen by the next record), and replaces the return
    /// address elsewhere; `return-address` replaces it everywhere. Go functions always get
    /// return probes
    #[arg(long, value_enum, default_value_t = ExitProbe::Auto)]
    pub exit_probe: ExitProbe,
    /// Threads that get a ring; probes of further threads are counted as lost
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub max_threads: u32,
    /// Do not print what was instrumented and the summary
    #[arg(short, long)]
    pub quiet: bool,
    /// Attach to this running process (all its threads), trace, and detach: every
    /// patched byte restored, the process never restarted
    #[arg(short, long, conflicts_with = "command")]
    pub pid: Option<i32>,
    /// With --pid, --vm, --qmp, --libvirt, --gdb or --xen: end after this many seconds
    /// (default: on Ctrl-C, SIGTERM, or when the process or VM ends)
    #[arg(short, long, requires = "attached_or_vm", value_parser = inputs::parse_duration)]
    pub duration: Option<f64>,
    /// The command is a QEMU (qemu-system-x86_64) to launch: time the guest's functions
    /// from outside, through glass's own GDB stub and a memory region the guest does not
    /// know (docs/guests.md)
    #[arg(long, conflicts_with = "pid")]
    pub vm: bool,
    /// Attach to a running QEMU through its QMP socket: glass adds its region (the VM needs
    /// a free memory slot: -m SIZE,slots=1,maxmem=...) and a GDB stub of its own, traces
    /// for --duration or until Ctrl-C, and puts every patched byte back
    #[arg(long, conflicts_with_all = ["pid", "vm", "command"], requires = "symbols")]
    pub qmp: Option<String>,
    /// Attach to a running libvirt domain's QEMU, through libvirt (virsh
    /// qemu-monitor-command), as --qmp does: the domain needs a free memory slot
    /// (<maxMemory slots='1' ...> in its XML)
    #[arg(long, value_name = "DOMAIN", conflicts_with_all = ["pid", "vm", "command", "qmp"], requires = "symbols")]
    pub libvirt: Option<String>,
    /// Attach to a running VM through its GDB stub (QEMU's -gdb or -s: host:port or a
    /// unix socket path), as --qmp does, with glass's region in guest RAM the guest does
    /// not use (--guest-scratch); the ring is drained in short stops every 20 ms
    #[arg(long, value_name = "ADDRESS", conflicts_with_all = ["pid", "vm", "command", "qmp", "libvirt"], requires_all = ["symbols", "guest_scratch"])]
    pub gdb: Option<String>,
    /// With --gdb: GPA,SIZE (e.g. 0x3e00000,2M), 2 MiB of guest RAM on a 2 MiB boundary
    /// that the guest does not use, for glass's trampolines and ring
    #[arg(long, value_name = "GPA,SIZE", requires = "gdb")]
    pub guest_scratch: Option<String>,
    /// Attach to a running Xen PVH or HVM domain (its id or name), from dom0: glass adds
    /// 2 MiB of memory to it for its region, patches with the domain paused, drains while
    /// it runs, and puts every patched byte back
    #[arg(long, value_name = "DOMID|NAME", conflicts_with_all = ["pid", "vm", "command", "qmp", "libvirt", "gdb"], requires = "symbols")]
    pub xen: Option<String>,
    /// With --vm, --qmp, --libvirt, --gdb or --xen: the guest's symbols (with --vm,
    /// default: the file QEMU's -kernel names)
    #[arg(long, requires = "vm_or_qmp")]
    pub symbols: Option<PathBuf>,
    /// The command to launch and trace
    #[arg(last = true, required_unless_present_any = ["pid", "qmp", "libvirt", "gdb", "xen"])]
    pub command: Vec<String>,
}

#[derive(Args, Debug, Clone)]
pub struct RecordArgs {
    /// Output recording
    #[arg(short, long, default_value = "prof.glass")]
    pub output: PathBuf,
    /// Sampling frequency in Hz
    #[arg(short = 'F', long = "frequency", default_value_t = 99, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub frequency: u32,
    /// Stop after this many seconds (default: until the target exits or Ctrl-C)
    #[arg(short, long, value_parser = inputs::parse_duration)]
    pub duration: Option<f64>,
    /// Deepest stack to walk; deeper stacks are marked truncated
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub max_depth: u32,
    /// Sample this running process (all its threads); it keeps running afterwards
    #[arg(short, long, conflicts_with = "command")]
    pub pid: Option<i32>,
    /// Sample a VM guest through its VMM's GDB stub (host:port, or a unix socket path)
    #[arg(long, conflicts_with_all = ["command", "pid"], requires = "symbols")]
    pub gdb: Option<String>,
    /// Sample a running QEMU through its QMP socket (-qmp unix:PATH,server=on,wait=off),
    /// without a restart: glass enables a GDB stub for the recording and removes it
    #[arg(long, value_name = "SOCKET", conflicts_with_all = ["command", "pid", "gdb", "vm", "xen", "libvirt"], requires = "symbols")]
    pub qmp: Option<String>,
    /// Sample a running libvirt domain's QEMU (as virsh names it), without a restart or a
    /// change to its XML
    #[arg(long, value_name = "DOMAIN", conflicts_with_all = ["command", "pid", "gdb", "vm", "xen"], requires = "symbols")]
    pub libvirt: Option<String>,
    /// Sample a Xen guest from dom0 through the hypervisor (its domain id or name, as
    /// `xl list` shows them); the domain runs on when the recording ends
    #[arg(long, value_name = "DOMID|NAME", conflicts_with_all = ["command", "pid", "gdb", "vm"], requires = "symbols")]
    pub xen: Option<String>,
    /// The guest's ELF image, for symbols and unwind tables (with --gdb, --vm, --qmp,
    /// --libvirt or --xen)
    #[arg(long)]
    pub symbols: Option<PathBuf>,
    /// The file backing the guest's RAM (QEMU memory-backend-file or memfd with
    /// share=on), mapped read-only so stacks are read without stub round trips
    #[arg(long, requires = "gdb")]
    pub guest_memory: Option<PathBuf>,
    /// A Linux guest kernel's BTF (a copy of its /sys/kernel/btf/vmlinux, given as its
    /// kallsyms is given with --symbols): each sample names the guest process it ran in
    #[arg(
        long,
        value_name = "FILE",
        requires = "symbols",
        conflicts_with = "xen"
    )]
    pub guest_btf: Option<PathBuf>,
    /// A copy of a Linux guest's filesystem (its binaries at their guest paths): with
    /// --guest-btf, user-mode samples are walked through the process's own page tables
    /// and named from DIR's binaries (else shown as `[user] comm`)
    #[arg(long, value_name = "DIR")]
    pub guest_root: Option<PathBuf>,
    /// Launch the VM given after `--` (a qemu-system-x86_64 command line) with a private
    /// GDB stub and shared guest RAM, and sample it; symbols default to its -kernel
    #[arg(long, conflicts_with_all = ["pid", "gdb"])]
    pub vm: bool,
    /// With --vm: leave the VM running when the recording ends
    #[arg(long, requires = "vm")]
    pub keep_vm: bool,
    /// Walk the guest's page tables afresh for every read (to measure what the
    /// translation cache saves)
    #[arg(long)]
    pub no_translation_cache: bool,
    /// With --xen: the most of wall time the domain is held stopped, on average (default
    /// 25, as perf's perf_cpu_time_max_percent; 100 takes every stop dom0 can, at the
    /// cost of the guest's time)
    #[arg(long, value_name = "PERCENT", requires = "xen", value_parser = parse_percent)]
    pub max_stopped: Option<f64>,
    /// VM guests: whose seconds the rate counts. running (the default): the guest's own
    /// running time, as perf's cpu-clock counts a task's, so every second of the guest is
    /// sampled alike; wall: wall-clock seconds, as uniprof counts, so F stops a wall
    /// second whatever they cost the guest
    #[arg(long, value_enum)]
    pub clock: Option<SampleClock>,
    /// Pin the sampling thread to this CPU (keep it off the target's core)
    #[arg(long)]
    pub sampler_cpu: Option<usize>,
    /// How samples are taken: perf (the kernel copies registers and stack; the target
    /// never stops), ptrace (glass stops each thread), auto (perf where permitted)
    #[arg(long, value_enum, default_value_t = BackendChoice::Auto)]
    pub backend: BackendChoice,
    /// How stacks are unwound: dwarf (CFI from .eh_frame/.debug_frame), fp (frame
    /// pointers), auto (CFI where present, frame pointers elsewhere, per frame)
    #[arg(long, value_enum, default_value_t = UnwindMode::Auto)]
    pub unwind: UnwindMode,
    /// What is stored: frames (unwound while recording) or raw (registers and a
    /// compacted stack copy, unwound by the report)
    #[arg(long, value_enum, default_value_t = CaptureMode::Frames)]
    pub capture: CaptureMode,
    /// Stack bytes copied per sample. perf backend: what the kernel copies (default
    /// 16384, at most 65528). ptrace and VM guests: the most a copy may grow to (default
    /// 262144); each thread's or vCPU's copy is sized from what its last walk needed
    #[arg(long, value_parser = parse_stack_size)]
    pub stack_size: Option<u32>,
    /// perf backend: ring buffer KiB per CPU (a power of two). Default: enough for half a
    /// second of samples at the rate and stack size (perf's -m)
    #[arg(long, value_name = "KIB", value_parser = parse_ring_kib)]
    pub ring_kib: Option<u32>,
    /// perf backend: record the kernel's frames of each sample under the user stack,
    /// named from /proc/kallsyms (the default where perf_event_paranoid and privileges
    /// allow; the summary says whether they were recorded, and why not)
    #[arg(long, overrides_with = "no_kernel")]
    pub kernel: bool,
    /// perf backend: no kernel frames
    #[arg(long, overrides_with = "kernel")]
    pub no_kernel: bool,
    /// perf backend: also record where threads block and for how long (a sample at each
    /// switch off the CPU, weighted by the time until the thread runs again; reports
    /// show it under `[off-cpu]`). Needs kernel sampling
    #[arg(long)]
    pub off_cpu: bool,
    /// VM guests: leave out samples of vCPUs halted in the guest's idle loop (`hlt`;
    /// Xen: blocked in SCHEDOP_block/poll)
    #[arg(long)]
    pub no_idle: bool,
    /// Do not read Python frames. By default, in a CPython 3.11, 3.12 or 3.13 process (ptrace
    /// backend, which a Python target gets unless --backend perf), each thread's Python
    /// frames are read while it is stopped and shown in place of the interpreter's
    /// `_PyEval_EvalFrameDefault` frames
    #[arg(long)]
    pub no_python: bool,
    /// Do not print the cost summary at the end
    #[arg(short, long)]
    pub quiet: bool,
    /// The command to launch and sample
    #[arg(last = true, required_unless_present_any = ["pid", "gdb", "xen", "qmp", "libvirt"])]
    pub command: Vec<String>,
}

/// A power of two from 4 KiB (a page) to 1 GiB.
fn parse_ring_kib(text: &str) -> Result<u32, String> {
    let kib: u32 = text.parse().map_err(|_| format!("not a number: {text}"))?;
    if !(4..=1 << 20).contains(&kib) || !kib.is_power_of_two() {
        return Err("must be a power of two between 4 and 1048576".to_string());
    }
    Ok(kib)
}

/// A share of time in percent, above 0 and at most 100 (NaN and infinities refused).
fn parse_percent(text: &str) -> Result<f64, String> {
    let percent: f64 = text
        .parse()
        .map_err(|_| format!("not a percentage: {text}"))?;
    if !(percent > 0.0 && percent <= 100.0) {
        return Err("must be a percentage above 0 and at most 100".to_string());
    }
    Ok(percent)
}

/// A multiple of 8 (the kernel's requirement for perf; words for the others), at most
/// 16 MiB (the perf backend checks its own lower limit).
fn parse_stack_size(text: &str) -> Result<u32, String> {
    let size: u32 = text.parse().map_err(|_| format!("not a number: {text}"))?;
    if size < 64 || !size.is_multiple_of(8) || size > 16 << 20 {
        return Err("must be a multiple of 8 between 64 and 16777216".to_string());
    }
    Ok(size)
}

#[derive(Args, Debug, Clone)]
pub struct ReportArgs {
    /// The recording to read
    pub input: PathBuf,
    /// Output format (default: top for samples, calls for a trace)
    #[arg(long, value_enum)]
    pub format: Option<glass_report::Format>,
    /// With --format invocations: the function whose calls are the rows
    #[arg(long)]
    pub root: Option<String>,
    /// Write here instead of standard output
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Split the profile by thread
    #[arg(long)]
    pub threads: bool,
    /// Keep only this thread
    #[arg(long)]
    pub tid: Option<u32>,
    /// Rows in the top, calls and invocations tables; lines of the tree
    #[arg(long)]
    pub limit: Option<usize>,
    /// Leave out samples of halted (idle) VM guest vCPUs
    #[arg(long)]
    pub no_idle: bool,
    /// Compare with this earlier recording: `--diff BEFORE.glass AFTER.glass` draws a
    /// differential flame graph of AFTER (red: grew, blue: shrank)
    #[arg(long, value_name = "BEFORE")]
    pub diff: Option<PathBuf>,
    /// Threads decoding a trace's call records for --format calls (default: one per
    /// CPU); each traced thread's records are decoded by one of them
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=256))]
    pub jobs: Option<u32>,
}

#[derive(Args, Debug, Clone)]
pub struct InfoArgs {
    /// The recording to read
    pub input: PathBuf,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            use clap::error::ErrorKind;
            if matches!(
                error.kind(),
                ErrorKind::ValueValidation | ErrorKind::InvalidValue
            ) {
                // One line, as every error of glass: clap's first line says it all
                // ("invalid value 'inf' for '--duration <DURATION>': must be ...").
                let text = error.render().to_string();
                let line: Vec<&str> = text
                    .lines()
                    .take_while(|l| !l.trim().is_empty())
                    .map(str::trim)
                    .collect();
                let line = line.join(" ");
                eprintln!("glass: {}", line.strip_prefix("error: ").unwrap_or(&line));
                return ExitCode::from(2);
            }
            let code = if error.use_stderr() { 2 } else { 0 };
            let _ = error.print();
            return ExitCode::from(code);
        }
    };
    let result = match cli.command {
        Command::Record(args) => inputs::check_record(&args).and_then(|()| record::run(&args)),
        Command::Report(args) => {
            end_quietly_on_closed_pipe();
            inputs::check_report(&args).and_then(|()| report::run(&args).map(|()| 0))
        }
        Command::Info(args) => {
            end_quietly_on_closed_pipe();
            inputs::check_recording(&args.input).and_then(|()| info::run(&args).map(|()| 0))
        }
        Command::Trace(args) => inputs::check_trace(&args).and_then(|()| trace::run(&args)),
        Command::Top(args) => inputs::check_record(&args.record).and_then(|()| top::run(&args)),
        Command::Guardian(args) => glass_record::guardian::run(&args).map_err(Into::into),
        Command::TraceGuardian(args) => trace::guard(&args),
    };
    match result {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(failure) => {
            // (`info` and `report` end by SIGPIPE on a closed output: not for this
            // line, which has nowhere to go when standard error is the closed pipe.)
            // SAFETY: sets one signal's disposition; no handler runs.
            unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
            eprintln!("glass: {failure}");
            ExitCode::from(failure.exit_code())
        }
    }
}

/// `glass report … | head`: a reader that stops early ends glass as it ends any Unix
/// filter, by SIGPIPE, instead of a panic on the failed write (Rust ignores SIGPIPE).
/// Only for the commands that merely print: a recording must never die of it.
fn end_quietly_on_closed_pipe() {
    // SAFETY: restores the default disposition of one signal, before any thread exists.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
}
