//! `glass trace` as a library, as glass-record is `glass record`'s: [`TraceOptions`] in,
//! [`Traced`] out, and what the user should hear on the way through [`TraceNotes`] (the
//! command line prints; this crate never does). Launch mode starts a program with the
//! probe runtime preloaded, stops it at its entry point, patches the chosen functions
//! (and GOT slots), lets it run, and drains the per-thread rings into a `.glass` file
//! until it exits; `--pid` attaches to a running process, traces, and leaves it as it
//! was (see `attach`).
//!
//! - `select`: which functions of each module, and why not the others ([`SkipReason`]);
//! - `install`: writing trampolines and patches into the stopped process (and taking
//!   them out);
//! - `attach/`: `--pid`, in `seize`, `safe_point`, `runtime`, `detach` and `recover`;
//!   `ledger`: what a glass that dies attached leaves for the next one; `guardian`: the
//!   process that undoes it at once if glass dies; `owner`: the session file given to
//!   the process's user, and why it could not map it when it cannot;
//! - this file: the options, the session from launch to the summary, and the drain loop.
//
// x86-64 and AArch64 processes; guests of either (see guest/).

mod attach;
pub mod embedded;
mod error;
mod goroutines;
pub mod guardian;
mod guest;
mod install;
mod ledger;
mod owner;
mod replay;
mod select;

pub use error::{Failure, Result};
pub use install::Installed;
pub use select::SkipReason;

/// What to trace, and how (the command line's options, parsed).
#[derive(Debug, Clone, Default)]
pub struct TraceOptions {
    /// The recording to write.
    pub output: PathBuf,
    /// Globs over function names.
    pub functions: Vec<String>,
    /// Globs over the library functions to time through the GOT.
    pub libcalls: Vec<String>,
    /// Globs over the file names of loaded libraries whose functions are patched too.
    pub lib: Vec<String>,
    /// Hardware counters to read per record (a comma-separated list).
    pub pmc: Option<String>,
    /// Records per thread's ring (a power of two of at least 1024).
    pub ring_size: usize,
    /// Threads that get a ring.
    pub max_threads: u32,
    /// Attach to this running process instead of launching `command`.
    pub pid: Option<i32>,
    /// With `pid`: detach after this many seconds.
    pub duration: Option<f64>,
    /// The program to launch, and its arguments.
    pub command: Vec<String>,
    /// `command` is a QEMU to launch: its guest's functions are traced.
    pub vm: bool,
    /// Native functions keep the return-address probe even where return-site probes fit
    /// (`--exit-probe return-address`); Go functions take return-site probes always.
    pub return_address_probe: bool,
    /// The guest's symbols (`--vm`: else `-kernel`'s file; `--qmp`, `--libvirt`:
    /// required).
    pub symbols: Option<PathBuf>,
    /// Attach to the VM of the QEMU whose QMP socket this is.
    pub qmp: Option<String>,
    /// Attach to the VM of this libvirt domain (its QEMU's monitor, through virsh).
    pub libvirt: Option<String>,
    /// Attach to the VM behind this GDB stub (`host:port` or a unix socket path).
    pub gdb: Option<String>,
    /// With `gdb`: `GPA,SIZE`, guest RAM the guest does not use, for glass's region.
    pub guest_scratch: Option<String>,
    /// Attach to this Xen PVH/HVM domain (a domid or a name), from dom0.
    pub xen: Option<String>,
}

/// What a trace did.
#[derive(Debug, Clone)]
pub struct Traced {
    /// The launched program's exit status (0 for `--pid`).
    pub exit_status: i32,
    /// The recording's final summary.
    pub summary: TraceSummary,
    /// Call records written.
    pub records: u64,
    /// The records are timed by AArch64's generic timer (CNTVCT_EL0, its frequency
    /// known), not by a time-stamp counter whose rate glass measured.
    pub generic_timer: bool,
}

/// A function glass did not patch, and why.
#[derive(Debug, Clone)]
pub struct Skip {
    pub module: String,
    /// Its runtime address.
    pub address: u64,
    pub name: String,
    pub reason: SkipReason,
}

/// How attaching went (`--pid`).
#[derive(Debug, Clone)]
pub struct AttachReport {
    pub pid: i32,
    /// Every thread was stopped this long to write the patches.
    pub stopped_ns: u64,
    /// Threads moved out of the bytes replaced.
    pub moved: usize,
    /// The thread the runtime was loaded in, and how much longer it was stopped.
    pub loader_tid: i32,
    pub loader_stopped_ns: u64,
}

/// How detaching went (`--pid`).
#[derive(Debug, Clone)]
pub struct DetachReport {
    pub pid: i32,
    /// What ended the trace: "the duration ran out", "SIGINT", ...
    pub why: &'static str,
    /// Every thread stopped (both halves), threads moved out of the trampolines, how
    /// much longer one thread was stopped to unmap the rings, calls in flight.
    pub stopped_ns: u64,
    pub moved: usize,
    pub unmap_ns: u64,
    pub in_flight: u64,
}

/// What the user should hear while glass traces (the command line prints these).
pub trait TraceNotes {
    /// A warning or a fact, one line.
    fn note(&mut self, line: &str);
    /// What was instrumented and what was not, once the patches are written.
    fn instrumented(&mut self, installed: &[Installed], skipped: &[Skip]);
    /// `--pid`: attached (the target runs instrumented from now on).
    fn attached(&mut self, report: &AttachReport);
    /// `--pid`: detached (None: process `pid` exited while traced).
    fn detached(&mut self, pid: i32, report: Option<&DetachReport>);
}

use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use glass_format::{
    Meta, Process, ProcessKind, Record, TraceFunction, TraceSkipped, TraceSummary, Writer,
};
use glass_probe_abi::session::SessionMemory;
use glass_target::inject::{shell_status, StoppedProcess};

use glass_record::driver::{drive, Clock, Gathered, Sampler};
use glass_record::{error_text, monotonic_now_ns};

/// Traces as `args` say, telling `notes` what the user should hear on the way.
pub fn trace(args: &TraceOptions, notes: &mut dyn TraceNotes) -> Result<Traced> {
    let patterns = args.functions.clone();
    let libcalls = args.libcalls.clone();
    if patterns.is_empty() && libcalls.is_empty() {
        return Err(Failure::bad_input(
            "nothing to trace: give functions with -f (globs, e.g. -f 'parse_*,main') or --libcalls",
        ));
    }
    if !args.ring_size.is_power_of_two() || args.ring_size < 1024 {
        return Err(Failure::bad_input(
            "--ring-size must be a power of two of at least 1024 records",
        ));
    }
    if args.vm {
        return guest::run(args, notes);
    }
    if args.qmp.is_some() || args.libvirt.is_some() {
        return guest::attach::run(args, notes);
    }
    if let Some(address) = &args.gdb {
        return guest::gdb::run(args, notes, address);
    }
    if let Some(domain) = &args.xen {
        return guest::xen::run(args, notes, domain);
    }
    let (counters, counters_note) = choose_counters(args)?;
    if let Some(pid) = args.pid {
        return attach::run(
            args,
            notes,
            pid,
            &patterns,
            &libcalls,
            counters,
            counters_note,
        );
    }
    let program = glass_target::launch::resolve_command(&args.command[0])
        .map_err(|e| Failure::bad_input(e.to_string()))?;
    let main_module = select::read_module(
        &program,
        &patterns,
        &libcalls,
        args.pmc.is_some(),
        !args.return_address_probe,
    )
    .map_err(Failure::bad_input)?;
    if let Some(note) = main_module.far_note() {
        notes.note(&note);
    }
    if main_module.matched == 0 && main_module.libcalls.is_empty() && args.lib.is_empty() {
        return Err(Failure::NothingToPatch(format!(
            "no function of {} matches {}{}",
            program.display(),
            patterns.join(","),
            if libcalls.is_empty() {
                String::new()
            } else {
                format!(" and it calls none of {}", libcalls.join(","))
            }
        )));
    }
    if !counters_note.is_empty() {
        notes.note(&format!("--pmc: {counters_note}; recording time only"));
    }
    let configs: Vec<(u32, u64)> = counters.iter().map(|c| c.1).collect();
    // Kept open until the target exits: a program it starts preloads the runtime too.
    let runtime = embedded::memfd()?;
    let output = glass_record::PendingOutput::open(&args.output)?;
    let session = SessionMemory::create(args.max_threads as usize, args.ring_size, &configs, None)
        .map_err(|e| Failure::runtime(format!("cannot create the trace rings: {e}")))?;
    let mut preload = format!(
        "/proc/{}/fd/{}",
        std::process::id(),
        std::os::fd::AsRawFd::as_raw_fd(&runtime)
    );
    if let Ok(existing) = std::env::var("LD_PRELOAD") {
        preload = format!("{preload}:{existing}");
    }
    let mut env = vec![
        ("LD_PRELOAD".to_string(), preload),
        (
            "GLASS_TRACE_SHM".to_string(),
            session.path().display().to_string(),
        ),
    ];
    if !libcalls.is_empty() {
        // Every GOT slot bound before the program starts: a lazily bound slot would be
        // overwritten by the loader at its first call.
        env.push(("LD_BIND_NOW".to_string(), "1".to_string()));
    }
    let clock_start = (glass_probe_abi::rdtsc(), monotonic_now_ns());
    let process =
        StoppedProcess::launch_to_entry(&args.command, &env).map_err(Failure::starting)?;
    let pid = process.pid();
    // The target has mapped the rings; nobody else needs the name.
    session.unlink();
    let set_up = set_up(
        &process,
        &session,
        main_module,
        &patterns,
        &libcalls,
        args,
        notes,
    );
    // Refused (a static program, nothing patchable) or not, the program has been
    // reached: only now is a recording already at the output path replaced.
    let (installed, skipped, file) = match set_up.and_then(|(installed, skipped)| {
        Ok((installed, skipped, output.start().map_err(Failure::from)?))
    }) {
        Ok(done) => done,
        Err(failure) => {
            process.kill();
            return Err(failure);
        }
    };
    // Where code lies, while the process is there to ask: if it dies of a fault, glass
    // says in which.
    let code_at_start = glass_target::procfs::executable_mappings(pid).unwrap_or_default();
    if let Err(e) = process.detach() {
        return Err(Failure::runtime(format!("cannot let pid {pid} go: {e}")));
    }
    // Ctrl-C reaches the target too; glass drains until it has exited.
    // SAFETY: ignoring a signal in glass, after the target was started.
    unsafe { libc::signal(libc::SIGINT, libc::SIG_IGN) };
    notes.instrumented(&installed, &skipped);

    let mut out = start_output(
        file,
        pid,
        &args.command,
        false,
        &installed,
        &skipped,
        &counters,
        &counters_note,
        &session,
        clock_start,
    );
    let exit_status = drain_until_exit(&session, pid, &mut out);
    if let Some((died, signal, pc, address)) = session.fatal_fault() {
        notes.note(&fault_line(
            died as i32,
            (signal, pc, address),
            &code_at_start,
            &installed,
        ));
    }
    let summary = TraceSummary {
        exit_status,
        ..TraceSummary::default()
    };
    let (summary, records) = finish_output(
        args,
        out,
        &session,
        clock_start,
        summary,
        installed.len(),
        skipped.len(),
        &counters,
        counters_note,
    )?;
    Ok(Traced {
        exit_status: exit_status.max(0),
        summary,
        records,
        generic_timer: cfg!(target_arch = "aarch64"),
    })
}

/// The line for a launched program that died of a fault its runtime noted: where, and
/// whether that was glass's code (its trampolines or probe runtime) or the program's.
fn fault_line(
    pid: i32,
    (signal, pc, address): (u32, u64, u64),
    mappings: &[glass_target::procfs::Mapping],
    installed: &[install::Installed],
) -> String {
    let name = match signal as i32 {
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGILL => "SIGILL",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        _ => "a fault",
    };
    let traced = installed
        .iter()
        .find(|f| pc >= f.address && pc < f.address + f.size.max(1));
    let mapping = mappings.iter().find(|m| pc >= m.start && pc < m.end);
    let place = match (traced, mapping) {
        (Some(f), _) => format!(
            "in its own code, in {}+{:#x} (a traced function)",
            f.name,
            pc - f.address
        ),
        (None, Some(m)) if m.path.contains("libglass_probe") => {
            "inside glass's probe runtime: a glass fault (the exit stub's ud2 means a return glass had no entry for)".into()
        }
        (None, Some(m)) if m.path == "[anon]" => {
            "inside anonymous code: glass's trampolines, or code the program generated".into()
        }
        (None, Some(m)) => format!("in {}+{:#x}", m.path, pc - m.start + m.file_offset),
        (None, None) => "outside the code mapped when it started".into(),
    };
    format!("pid {pid} died of {name} at pc {pc:#x} {place} (faulting address {address:#x})")
}

/// The recording's first records: what was instrumented and skipped, and a first
/// summary with the cycle rate measured so far (set-up took milliseconds), so a
/// recording cut short (glass killed, disk full) still converts cycles to time; the
/// one written at the end replaces it.
#[allow(clippy::too_many_arguments)]
fn start_output(
    file: std::fs::File,
    pid: i32,
    command: &[String],
    attached: bool,
    installed: &[install::Installed],
    skipped: &Skipped,
    counters: &[CounterChoice],
    counters_note: &str,
    session: &SessionMemory,
    clock_start: (u64, u64),
) -> Output {
    let start_unix_ns = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mut out = Output::new(file, 1 + counters.len() as u64);
    out.goroutines = Some(goroutines::Goroutines::new(session.tsc_start()));
    out.write(&Record::Meta(Meta {
        start_unix_ns,
        backend: glass_format::Backend::Trace,
        arch: glass_format::Arch::host(),
        unwind: String::new(),
        frequency_hz: 0,
        max_depth: 0,
        target_pid: pid as u32,
        // Empty for --pid, as `glass record --pid` writes it (the format's meaning): the
        // process's command line goes in its Process record.
        command: if attached {
            Vec::new()
        } else {
            command.to_vec()
        },
        hostname: std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_default(),
        glass_version: env!("CARGO_PKG_VERSION").into(),
        capture: "calls".into(),
    }));
    if attached {
        out.write(&Record::Process(Process {
            time_ns: 0,
            pid: pid as u32,
            parent_pid: 0,
            kind: ProcessKind::Attached,
            name: command.join(" "),
        }));
    }
    write_instrumented(&mut out, installed, skipped);
    let now = (glass_probe_abi::rdtsc(), monotonic_now_ns());
    out.write(&Record::TraceSummary(TraceSummary {
        tsc_hz: ((now.0 - clock_start.0) as f64 * 1e9 / (now.1 - clock_start.1).max(1) as f64)
            as u64,
        tsc_start: session.tsc_start(),
        patched: installed.len() as u32,
        not_patched: skipped.len() as u32,
        counters: counters.iter().map(|c| c.0.clone()).collect(),
        counters_note: counters_note.to_string(),
        exit_status: -1,
        ..TraceSummary::default()
    }));
    // On disk at once: a glass killed before its buffer fills leaves a readable file
    // that names what it instrumented.
    out.flush();
    out
}

/// What was instrumented and what was not, as the recording keeps them.
fn write_instrumented(out: &mut Output, installed: &[install::Installed], skipped: &[Skip]) {
    for function in installed {
        out.write(&Record::TraceFunction(TraceFunction {
            id: function.id,
            module: function.module.clone(),
            address: function.address,
            size: function.size,
            name: function.name.clone(),
            probe: function.probe.name().to_string(),
        }));
    }
    for skip in skipped {
        out.write(&Record::TraceSkipped(TraceSkipped {
            module: skip.module.clone(),
            address: skip.address,
            name: skip.name.clone(),
            reason: skip.reason.to_string(),
            kind: skip.reason.kind().to_string(),
        }));
    }
}

/// The final summary (`summary` brings what only the caller knows: the exit status,
/// the stopped times of an attachment) and the end; returns the summary and the count
/// of call records written.
#[allow(clippy::too_many_arguments)]
fn finish_output(
    args: &TraceOptions,
    mut out: Output,
    session: &SessionMemory,
    clock_start: (u64, u64),
    mut summary: TraceSummary,
    patched: usize,
    not_patched: usize,
    counters: &[CounterChoice],
    counters_note: String,
) -> Result<(TraceSummary, u64)> {
    let mut clock_end = (glass_probe_abi::rdtsc(), monotonic_now_ns());
    if clock_end.1 - clock_start.1 < 50_000_000 {
        std::thread::sleep(Duration::from_millis(50));
        clock_end = (glass_probe_abi::rdtsc(), monotonic_now_ns());
    }
    summary.tsc_hz =
        ((clock_end.0 - clock_start.0) as f64 * 1e9 / (clock_end.1 - clock_start.1) as f64) as u64;
    summary.tsc_start = session.tsc_start();
    summary.no_area_lost = session.no_area_lost();
    summary.threads = session.claimed() as u32;
    summary.patched = patched as u32;
    summary.not_patched = not_patched as u32;
    summary.counters = counters.iter().map(|c| c.0.clone()).collect();
    summary.counters_note = counters_note;
    summary.duration_ns = clock_end.1 - clock_start.1;
    for index in 0..session.claimed() {
        let stats = session.stats(index);
        summary.lost += stats.lost;
        summary.unwound += stats.unwound;
        summary.skipped += stats.skipped;
    }
    summary.lost += out.lost_words / out.stride;
    out.write(&Record::TraceSummary(summary.clone()));
    out.write(&Record::End);
    out.flush();
    let file = out
        .keep
        .as_ref()
        .and_then(|keep| glass_record::OutputFile::new(&args.output, keep).ok());
    if let Some(error) = &out.failed {
        // The writer's buffer is dropped first: what it still held is lost either way.
        out.writer = None;
        let kept = file.as_ref().map_or(String::new(), |file| {
            file.seal(&[Record::TraceSummary(summary.clone())])
        });
        return Err(Failure::runtime(format!(
            "writing {} failed: {}; {} call records lost (the target ran on{}){kept}",
            args.output.display(),
            error_text(error),
            out.lost_words / out.stride,
            if summary.exit_status >= 0 {
                format!(" to the end, exit status {}", summary.exit_status)
            } else {
                String::new()
            }
        )));
    }
    // (A file removed alone is written again; the warning is not the tracer's to print.)
    if let Some(file) = &file {
        file.check_kept()?;
    }
    Ok((summary, out.records))
}

/// A counter to record: its name and perf_event (type, config).
type CounterChoice = (String, (u32, u64));

/// The counters `--pmc` asks for, if the machine has them; else why not.
fn choose_counters(args: &TraceOptions) -> Result<(Vec<CounterChoice>, String)> {
    let Some(list) = &args.pmc else {
        return Ok((Vec::new(), String::new()));
    };
    if cfg!(target_arch = "aarch64") {
        return Err(Failure::bad_input(format!(
            "--pmc {list}: hardware counters are read by the x86-64 probes only so far; on AArch64 glass trace records time (the generic timer)"
        )));
    }
    let wanted = glass_probe_abi::pmc::parse_list(list).map_err(Failure::bad_input)?;
    if wanted.len() > glass_probe_abi::MAX_COUNTERS {
        return Err(Failure::bad_input(format!(
            "--pmc: at most {} counters at once",
            glass_probe_abi::MAX_COUNTERS
        )));
    }
    // Test hook: a machine without a PMU still runs the counter path end to end, each
    // counter standing in as the software task clock (its page has no rdpmc index, so
    // the probe reads the page's offset word).
    if std::env::var_os("GLASS_TRACE_TEST_SOFTWARE_COUNTERS").is_some() {
        // PERF_TYPE_SOFTWARE, PERF_COUNT_SW_TASK_CLOCK.
        let software = (1, 1);
        return Ok((
            wanted
                .iter()
                .map(|c| (c.name().to_string(), software))
                .collect(),
            String::new(),
        ));
    }
    Ok(match glass_probe_abi::pmc::availability(&wanted) {
        Ok(()) => (
            wanted
                .iter()
                .map(|c| (c.name().to_string(), c.perf_type_config()))
                .collect(),
            String::new(),
        ),
        Err(why) => (Vec::new(), why),
    })
}

type Skipped = Vec<Skip>;

/// The modules to patch: the program, and the loaded libraries `--lib` names.
fn choose_modules(
    pid: i32,
    main_module: select::ModuleChoice,
    patterns: &[String],
    libcalls: &[String],
    args: &TraceOptions,
    notes: &mut dyn TraceNotes,
) -> Result<Vec<select::ModuleChoice>> {
    let mappings = glass_target::procfs::executable_mappings(pid)
        .map_err(|e| Failure::runtime(format!("cannot read the mappings of pid {pid}: {e}")))?;
    let mut modules = vec![main_module];
    for pattern in &args.lib {
        let mut found = false;
        for mapping in &mappings {
            let name = Path::new(&mapping.path)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if !mapping.path.starts_with('/')
                || !glass_patch::glob_match(pattern, &name)
                || modules[1..].iter().any(|m| m.path == mapping.path)
                || mapping.path.contains("libglass_probe")
            {
                continue;
            }
            found = true;
            let module = select::read_module(
                Path::new(&mapping.path),
                patterns,
                libcalls,
                args.pmc.is_some(),
                !args.return_address_probe,
            )
            .map_err(Failure::bad_input)?;
            modules.push(module);
        }
        if !found {
            notes.note(&format!(
                "warning: --lib {pattern}: no library of that name is loaded by {}",
                modules[0].path
            ));
        }
    }
    if !args.lib.is_empty() && modules.len() == 1 {
        return Err(Failure::bad_input(format!(
            "--lib {}: no library of that name is loaded by {}",
            args.lib.join(","),
            modules[0].path
        )));
    }
    Ok(modules)
}

/// The load bias of each module in the process.
fn biases(pid: i32, modules: &[select::ModuleChoice]) -> Result<Vec<u64>> {
    let mappings = glass_target::procfs::executable_mappings(pid)
        .map_err(|e| Failure::runtime(format!("cannot read the mappings of pid {pid}: {e}")))?;
    modules
        .iter()
        .map(|module| {
            install::load_bias(module, &mappings).ok_or_else(|| {
                Failure::runtime(format!("cannot find where {} is loaded", module.path))
            })
        })
        .collect()
}

/// The runtime's probes in the target, once it has mapped the session.
pub(crate) fn probes(session: &SessionMemory) -> Option<install::Probes> {
    let (_, enter) = session.runtime()?;
    let (site_enter, site_exit, site_return) = session.site_probes();
    Some(install::Probes {
        enter,
        site_enter,
        site_exit,
        site_return,
    })
}

/// Builds every module's trampolines (see [`install::prepare`]); what will be installed,
/// skipped, and the patches to commit.
fn prepare_all(
    process: &StoppedProcess,
    probes: install::Probes,
    modules: &[select::ModuleChoice],
    biases: &[u64],
) -> Result<(Vec<install::Installed>, Skipped, Vec<install::Outcome>)> {
    let pid = process.pid();
    let mut installed = Vec::new();
    let mut skipped = Vec::new();
    let mut prepared = Vec::new();
    let mut next_id = 0u32;
    for (module, &bias) in modules.iter().zip(biases) {
        let mut outcome =
            install::prepare(process, probes, module, bias, next_id).map_err(|e| {
                Failure::runtime(format!("cannot patch {} in pid {pid}: {e}", module.path))
            })?;
        next_id += outcome.installed.len() as u32;
        installed.append(&mut outcome.installed);
        skipped.append(&mut outcome.skipped);
        prepared.push(outcome);
    }
    if installed.is_empty() {
        return Err(Failure::NothingToPatch(nothing_patchable(&skipped)));
    }
    Ok((installed, skipped, prepared))
}

/// The line for a trace with nothing to patch: the first five reasons.
pub(crate) fn nothing_patchable(skipped: &[Skip]) -> String {
    let reasons: Vec<String> = skipped
        .iter()
        .take(5)
        .map(|skip| format!("{}: {}", skip.name, skip.reason))
        .collect();
    format!(
        "none of the matching functions can be patched ({})",
        reasons.join("; ")
    )
}

/// Writes every module's patches (every thread stopped); how to undo them.
fn commit_all(
    process: &StoppedProcess,
    prepared: &[install::Outcome],
) -> Result<Vec<install::Undo>> {
    let mut undo = Vec::new();
    for outcome in prepared {
        match install::commit(process, outcome) {
            Ok(done) => undo.push(done),
            Err(e) => {
                let _ = install::uninstall(process, &undo);
                return Err(Failure::runtime(format!(
                    "cannot patch pid {}: {e}",
                    process.pid()
                )));
            }
        }
    }
    Ok(undo)
}

/// Everything done while the launched target is stopped at its entry point.
fn set_up(
    process: &StoppedProcess,
    session: &SessionMemory,
    main_module: select::ModuleChoice,
    patterns: &[String],
    libcalls: &[String],
    args: &TraceOptions,
    notes: &mut dyn TraceNotes,
) -> Result<(Vec<install::Installed>, Skipped)> {
    let pid = process.pid();
    let Some(probes) = probes(session) else {
        return Err(Failure::bad_input(format!(
            "the probe runtime did not load into {} (a statically linked program cannot preload it)",
            main_module.path
        )));
    };
    if let Some(offset) = main_module.go_g_offset {
        session.set_go_g_offset(offset);
    }
    let modules = choose_modules(pid, main_module, patterns, libcalls, args, notes)?;
    let biases = biases(pid, &modules)?;
    let (installed, skipped, prepared) = prepare_all(process, probes, &modules, &biases)?;
    commit_all(process, &prepared)?;
    Ok((installed, skipped))
}

/// Drains every thread's ring until the target has exited; returns its exit status.
/// Under the shared loop of glass-record (`driver`): the probes take the samples, so
/// there is no clock; a turn that drained a lot goes on at once, an idle one waits half
/// a millisecond.
fn drain_until_exit(session: &SessionMemory, pid: i32, out: &mut Output) -> i32 {
    let mut drain = LaunchDrain {
        session,
        pid,
        words: Vec::with_capacity(1 << 16),
        status: 0,
    };
    // Draining never fails (the file's errors are counted in `out`), and the loop ends
    // only when the target has.
    let _ = drive(&mut drain, out, None, Clock::None(DRAIN_WAKE), None);
    shell_status(drain.status)
}

/// How long a drain loop waits when the rings were nearly empty.
pub(crate) const DRAIN_WAKE: Duration = Duration::from_micros(500);
/// Records drained in one turn above which the next turn starts at once.
pub(crate) const DRAIN_BUSY: usize = 4096;

/// The launched target's rings, drained until it exits.
struct LaunchDrain<'s> {
    session: &'s SessionMemory,
    pid: i32,
    words: Vec<u64>,
    status: i32,
}

impl Sampler<Output> for LaunchDrain<'_> {
    fn gather(&mut self, out: &mut Output) -> std::io::Result<Gathered> {
        // SAFETY: reaping our own child without blocking.
        let ended =
            unsafe { libc::waitpid(self.pid, &mut self.status, libc::WNOHANG | libc::__WALL) }
                == self.pid
                && (libc::WIFEXITED(self.status) || libc::WIFSIGNALED(self.status));
        let drained = drain_once(self.session, ended, &mut self.words, out);
        Ok(Gathered {
            ended: ended.then_some(glass_record::Outcome::TargetExited),
            more: drained >= DRAIN_BUSY,
        })
    }
}

fn drain_once(session: &SessionMemory, all: bool, words: &mut Vec<u64>, out: &mut Output) -> usize {
    out.begin_turn();
    let mut total = 0;
    for index in 0..session.claimed() {
        if !session.is_ready(index) {
            continue;
        }
        words.clear();
        let count = session.drain(index, all, words);
        if count == 0 {
            continue;
        }
        total += count;
        let stats = session.stats(index);
        out.thread_chunk(stats.pid, stats.tid, words);
    }
    out.end_turn(all);
    total
}

/// The file, which may fail (a full disk): then records are counted as lost and the
/// rings keep being drained, so the target never notices.
struct Output {
    writer: Option<Writer<BufWriter<std::fs::File>>>,
    /// The file held open apart from the writer: to end it cleanly after a failed
    /// write, and to see at the end that it is still there.
    keep: Option<std::fs::File>,
    failed: Option<std::io::Error>,
    lost_words: u64,
    records: u64,
    /// Words per record: 1, plus one per counter.
    stride: u64,
    /// A process's Go probes' records, on their way to per-goroutine streams (none in
    /// guest traces).
    goroutines: Option<goroutines::Goroutines>,
    /// The process the goroutines belong to.
    goroutines_pid: u32,
}

impl Output {
    fn new(file: std::fs::File, stride: u64) -> Self {
        let keep = file.try_clone().ok();
        match Writer::new(BufWriter::with_capacity(1 << 20, file)) {
            Ok(writer) => Output {
                writer: Some(writer),
                keep,
                failed: None,
                lost_words: 0,
                records: 0,
                stride,
                goroutines: None,
                goroutines_pid: 0,
            },
            Err(e) => Output {
                writer: None,
                keep,
                failed: Some(e),
                lost_words: 0,
                records: 0,
                stride,
                goroutines: None,
                goroutines_pid: 0,
            },
        }
    }

    fn write(&mut self, record: &Record) {
        if let Some(writer) = &mut self.writer {
            if let Err(e) = writer.write(record) {
                self.failed = Some(e);
                self.writer = None;
            }
        }
    }

    /// The words one thread's ring held: Go probes' records wait for their goroutine's
    /// stream (see [`goroutines`]), the rest are written as they are.
    fn thread_chunk(&mut self, pid: u32, tid: u32, words: &[u64]) {
        let Some(goroutines) = &mut self.goroutines else {
            return self.chunk(pid, tid, words);
        };
        if words
            .iter()
            .all(|&word| word >> glass_probe_abi::KEYED_BIT == 0)
        {
            return self.chunk(pid, tid, words);
        }
        let plain = goroutines.split(tid, words);
        self.goroutines_pid = pid;
        if !plain.is_empty() {
            self.chunk(pid, tid, &plain);
        }
    }

    fn begin_turn(&mut self) {
        if let Some(goroutines) = &mut self.goroutines {
            goroutines.begin_turn(glass_probe_abi::rdtsc());
        }
    }

    /// Writes the goroutines' streams that are complete up to this turn.
    fn end_turn(&mut self, all: bool) {
        let Some(mut goroutines) = self.goroutines.take() else {
            return;
        };
        let pid = self.goroutines_pid;
        goroutines.end_turn(all, |tid, words| self.chunk(pid, tid, words));
        self.goroutines = Some(goroutines);
    }

    fn chunk(&mut self, pid: u32, tid: u32, words: &[u64]) {
        let Some(writer) = &mut self.writer else {
            self.lost_words += words.len() as u64;
            return;
        };
        match writer.trace_chunk(pid, tid, words) {
            Ok(()) => self.records += words.len() as u64 / self.stride,
            Err(e) => {
                self.lost_words += words.len() as u64;
                self.failed = Some(e);
                self.writer = None;
            }
        }
    }

    fn flush(&mut self) {
        if let Some(writer) = &mut self.writer {
            if let Err(e) = writer.flush() {
                self.failed = Some(e);
            }
        }
    }
}
