//! `glass trace --pid`: instrument a running process, trace, and leave it as it was,
//! whatever its threads are doing and whatever happens to glass.
//!
//! Attach (`seize`, `runtime`, `safe_point`):
//! 1. start the guardian; seize every thread (without stopping them); pick one thread at
//!    a *safe point* — in the program's own code, or waiting in a system call, never
//!    inside the dynamic loader or elsewhere in libc, where it may hold the locks
//!    `dlopen` takes — and stop only that one;
//! 2. in it, with every call returning to the landing, call the process's own `dlopen`
//!    on the probe runtime, leave a ledger naming this glass, and call the runtime's
//!    `glass_probe_attach` on the session, while the other threads run on (a thread
//!    holding a lock `dlopen` needs must be able to release it); build and write the
//!    trampolines (unreachable yet) and the full ledger (see `ledger`);
//! 3. stop every thread; move any thread whose instruction pointer (or pending system
//!    call restart) lies strictly inside bytes about to be replaced to the same place
//!    in the relocated copy; write the entry jumps; let every thread go. No thread can
//!    return into replaced bytes: a call is only ever displaced as the last instruction,
//!    so its return address is the end of the patch. x86 keeps instruction fetch
//!    coherent with stores, and each thread re-enters user space through the kernel,
//!    which serialises it.
//!
//! Detach (`detach`; at the end of `-d`, on SIGINT/SIGTERM/SIGHUP), in two halves:
//! 1. stop every thread wherever it is; put back every patched byte but the unwinder's
//!    GOT slots; let them run a moment (out of the probes: nothing enters them now);
//! 2. stop every thread where none is in the runtime (threads in it run alone until
//!    out; threads in a trampoline are moved back to the original code); put back the
//!    unwinder's GOT slots, give every hijacked return address of a call in flight back
//!    to its frame (those calls finish in the original code, their ends unrecorded);
//!    clear each thread's area word; call `glass_probe_detach`, which unmaps the
//!    session; give back the landing's bytes; let every thread go, and drain the rings.
//!
//! What glass may change in a thread's registers, and when:
//! - only in a ptrace stop glass caused, and only (a) the loader thread's, for an
//!   injected call, restored before the thread is let go (by glass, or by the landing
//!   itself if glass dies: see `glass_target::inject`), and (b) any thread's
//!   instruction pointer, moved between a patched function's original bytes and their
//!   relocated copy at an instruction boundary the copy maps exactly;
//! - never a single step (a thread whose tracer dies in one is killed by the kernel),
//!   never code written where another thread may run it;
//! - an interrupted system call the kernel is to restart is restarted exactly once: the
//!   loader thread's registers are put in their restarted form before the first call.
//!
//! The trampolines stay mapped (a thread may be returning through one), and the runtime
//! stays loaded: attaching again reuses it. Between attach and detach glass is not the
//! process's tracer, so if glass dies there the process runs on untouched by ptrace; its
//! probes find the rings full and drop records, and never wait; its guardian, or else
//! the next glass to attach, finds the dead one's ledger and takes its probes out
//! (`recover`).

mod detach;
mod go_stacks;
mod recover;
mod runtime;
mod safe_point;
mod seize;

pub use recover::take_over;

use detach::*;
use recover::*;
use runtime::*;
use safe_point::*;
use seize::*;

use std::path::{Path, PathBuf};
use std::time::Instant;

use glass_format::TraceSummary;
use glass_probe_abi::session::SessionMemory;
use glass_target::attach::Attachment;
use glass_target::inject::{LibcCalls, StoppedProcess};
use glass_target::procfs::Mapping;

use super::ledger::{self, Ledger};
use super::owner::{self, Credentials};
use super::{install, select, CounterChoice};
use crate::error::{Failure, Result};
use crate::{AttachReport, DetachReport, TraceNotes, TraceOptions, Traced};
use glass_record::driver::{drive, Clock, Gathered, Sampler};
use glass_record::{monotonic_now_ns, stop_signal_fd, Outcome};

/// Tells the guardian that glass leaves the target as it should (not on a panic, after
/// which the guardian takes the probes out).
struct GuardianDone(Option<glass_record::guardian::Guardian>);

impl Drop for GuardianDone {
    fn drop(&mut self) {
        if let Some(guardian) = self.0.take().filter(|_| !std::thread::panicking()) {
            guardian.done();
        }
    }
}

/// What the attachment set up, for the detach.
struct Attached {
    undo: Vec<install::Undo>,
    /// The unwinder's GOT slots sent to the runtime's hooks: they go back only with the
    /// hijacked return addresses (an exception thrown in between would meet one the real
    /// unwinder cannot read past).
    hooks_undo: install::Undo,
    /// The ledger's mapping (address, length), and the runtime's word pointing to it.
    ledger_at: (u64, u64),
    ledger_slot: u64,
    /// Where injected calls return to (see glass_target::inject::landing_code), and
    /// the C library's functions they make system calls with.
    landing: u64,
    libc: LibcCalls,
    /// The runtime's word that keeps the landing's address.
    landing_word: u64,
    /// The runtime's glass_probe_detach in the process.
    leave: u64,
    runtime_text: Vec<Span>,
    /// A Go program's goroutine offset: injected calls avoid goroutines' stacks.
    go_g_offset: Option<i64>,
}

/// `glass trace --pid`: the phases of the module's first comment, in order.
pub fn run(
    args: &TraceOptions,
    notes: &mut dyn TraceNotes,
    pid: i32,
    patterns: &[String],
    libcalls: &[String],
    counters: Vec<CounterChoice>,
    counters_note: String,
) -> Result<Traced> {
    let Target {
        main_module,
        mappings,
        loader,
    } = examine(args, pid, patterns, libcalls)?;
    if let Some(note) = main_module.far_note() {
        notes.note(&note);
    }
    if !counters_note.is_empty() {
        notes.note(&format!("--pmc: {counters_note}; recording time only"));
    }
    let modules = super::choose_modules(pid, main_module, patterns, libcalls, args, notes)?;
    // Said before the process is touched: a refusal leaves no runtime, ledger or
    // session behind for the next attach to find.
    refuse_if_nothing_patchable(&modules)?;
    let runtime_symbols = embedded_runtime()?;
    let unwinder_slots = unwinder_slots(pid, &mappings);
    let configs: Vec<(u32, u64)> = counters.iter().map(|c| c.1).collect();
    let output = glass_record::PendingOutput::open(&args.output)?;
    // The session file is the process's user's (mode 0600): a worker that dropped
    // root must still be able to open it.
    let user = Credentials::of_process(pid)
        .map_err(|e| Failure::bad_input(format!("cannot read who pid {pid} runs as: {e}")))?;
    // Started before the session file exists (it removes this glass's files by name):
    // told `done` when this function returns, whatever it returns: by then nothing is
    // patched or everything is taken out again. Only a glass that dies (or panics)
    // leaves the guardian something to do.
    super::guardian::remove_dead_sessions();
    let _guardian = GuardianDone(Some(super::guardian::start(pid)?));
    let session = SessionMemory::create(
        args.max_threads as usize,
        args.ring_size,
        &configs,
        Some(user.owner()),
    )
    .map_err(|e| Failure::runtime(format!("cannot create the trace rings: {e}")))?;
    let stop_signals = stop_signal_fd()?;
    let clock_start = (glass_probe_abi::rdtsc(), monotonic_now_ns());

    // Every refusal of bad input is behind: a recording already at the output path is
    // replaced from here.
    let file = output.start()?;

    // -- Attach ------------------------------------------------------------------------
    let go_g_offset = modules.iter().find_map(|module| module.go_g_offset);
    let mut held = hold_loader_thread(pid, &mappings, &loader, go_g_offset)?;
    let joined = join(&mut held, &runtime_symbols, &loader, &session, &user, notes)?;
    let patched = match patch(
        &mut held,
        &joined,
        &modules,
        &unwinder_slots,
        &loader,
        &session,
    ) {
        Ok(patched) => patched,
        Err(failure) => {
            // Nothing is patched (commit_all undoes its part): the runtime lets the
            // session go and stays loaded, idle, with no ledger naming this glass (the
            // next attach would take it for a dead glass's).
            let _ = held
                .process
                .write(joined.runtime_at[LEDGER], &0u64.to_le_bytes());
            let _ = leave_runtime(&held.process, joined.leave());
            held.attachment.release();
            return Err(failure);
        }
    };
    held.attachment.release();
    let attach_stop_ns = patched.all_stopped.elapsed().as_nanos() as u64;
    let loader_stop_ns = (patched.all_stopped - held.loader_stopped).as_nanos() as u64;
    let loader_tid = held.process.tid();
    drop(held);
    let (installed, skipped) = (patched.installed, patched.skipped);
    notes.instrumented(&installed, &skipped);
    notes.attached(&AttachReport {
        pid,
        stopped_ns: attach_stop_ns,
        moved: patched.moved,
        loader_tid,
        loader_stopped_ns: loader_stop_ns,
    });
    let attached = Attached {
        undo: patched.undo,
        hooks_undo: patched.hooks_undo,
        landing: joined.trap,
        libc: loader.calls,
        landing_word: joined.runtime_at[LANDING],
        leave: joined.leave(),
        runtime_text: patched.runtime_text,
        ledger_at: patched.ledger_at,
        ledger_slot: joined.runtime_at[LEDGER],
        go_g_offset,
    };
    let mut out = super::start_output(
        file,
        pid,
        &command_line(pid),
        true,
        &installed,
        &skipped,
        &counters,
        &counters_note,
        &session,
        clock_start,
    );

    // -- Trace -------------------------------------------------------------------------
    let mut drain = AttachDrain {
        session: &session,
        pid,
        words: Vec::with_capacity(1 << 16),
    };
    // Draining never fails (the file's errors are counted in `out`).
    let outcome = drive(
        &mut drain,
        &mut out,
        Some(&stop_signals),
        Clock::None(super::DRAIN_WAKE),
        args.duration,
    )
    .unwrap_or(Outcome::DurationElapsed);
    let mut words = drain.words;
    let why = ended_by(outcome);

    // -- Detach ------------------------------------------------------------------------
    let mut summary = TraceSummary {
        exit_status: -1,
        attach_stop_ns,
        ..TraceSummary::default()
    };
    let detach_result = detach_unless_gone(pid, &attached, &session, &mut summary);
    super::drain_once(&session, true, &mut words, &mut out);
    match &detach_result {
        Ok(None) => notes.detached(pid, None),
        Ok(Some(detached)) => notes.detached(pid, Some(&detached.report(pid, why))),
        Err(_) => {}
    }
    let (summary, records) = super::finish_output(
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
    detach_result?;
    Ok(Traced {
        exit_status: 0,
        summary,
        records,
        generic_timer: cfg!(target_arch = "aarch64"),
    })
}

/// What glass learns of the process before it touches it.
struct Target {
    main_module: select::ModuleChoice,
    mappings: Vec<Mapping>,
    loader: LoaderFunctions,
}

/// Whether `pid` can be traced as asked, found without touching it: a process other
/// than glass, whose program has functions that match, and whose C library has the
/// `dlopen` the runtime is loaded with.
fn examine(
    args: &TraceOptions,
    pid: i32,
    patterns: &[String],
    libcalls: &[String],
) -> Result<Target> {
    if pid <= 0 || !Path::new(&format!("/proc/{pid}/task")).exists() {
        return Err(Failure::bad_input(format!("no process with pid {pid}")));
    }
    if pid == std::process::id() as i32 {
        return Err(Failure::bad_input("glass cannot trace itself"));
    }
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).map_err(|e| {
        Failure::bad_input(format!(
            "cannot read the program of pid {pid}: {e} (a kernel thread, or a process of another user: run glass as its owner, or as root or with CAP_SYS_PTRACE)"
        ))
    })?;
    let program = if exe.exists() {
        exe.clone()
    } else {
        PathBuf::from(format!("/proc/{pid}/exe"))
    };
    let main_module = select::read_module(
        &program,
        patterns,
        libcalls,
        args.pmc.is_some(),
        !args.return_address_probe,
    )
    .map_err(Failure::bad_input)?;
    if main_module.matched == 0 && main_module.libcalls.is_empty() && args.lib.is_empty() {
        return Err(Failure::NothingToPatch(format!(
            "no function of {} matches {}",
            program.display(),
            patterns.join(",")
        )));
    }
    let mappings = glass_target::procfs::executable_mappings(pid)
        .map_err(|e| Failure::bad_input(format!("cannot read the mappings of pid {pid}: {e}")))?;
    let Some(loader) = loader_functions(pid, &mappings) else {
        return Err(Failure::bad_input(format!(
            "pid {pid} ({}) has no dlopen to load the probe runtime with: it is statically linked, or its C library is not glibc 2.34 or later and it did not load libdl; it was not touched",
            program.display()
        )));
    };
    Ok(Target {
        main_module,
        mappings,
        loader,
    })
}

/// Every thread seized, and the one the runtime is loaded in stopped at a safe point.
struct Held {
    attachment: Attachment,
    process: StoppedProcess,
    loader_stopped: Instant,
}

/// Attach, step 1: seizes every thread (none stopped) and stops one at a safe point
/// (never in the dynamic loader, nor elsewhere in libc unless it waits in a system
/// call) to load the runtime in.
fn hold_loader_thread(
    pid: i32,
    mappings: &[Mapping],
    loader: &LoaderFunctions,
    go_g_offset: Option<i64>,
) -> Result<Held> {
    let mut attachment = Attachment::seize(pid).map_err(Failure::starting)?;
    let loader_code = not_for_calls(mappings);
    let libc_code = spans_of(mappings, &["libc.so", "libc-", "libdl"]);
    let loader_tid = pick_loader_thread(&mut attachment, &loader_code, &libc_code, go_g_offset)?;
    glass_target::test_hook("attach-safe-point");
    let loader_stopped = Instant::now();
    let mut process = StoppedProcess::for_thread(pid, loader_tid)
        .map_err(|e| Failure::runtime(format!("cannot open the memory of pid {pid}: {e}")))?;
    process.use_libc(loader.calls);
    process.answer_peers_during_calls(&attachment.tids());
    Ok(Held {
        attachment,
        process,
        loader_stopped,
    })
}

/// The runtime loaded and in the session, and the ledger naming this glass.
struct Joined {
    /// Where the RUNTIME_SYMBOLS are in the process.
    runtime_at: Vec<u64>,
    /// Where injected calls return to (glass's landing, as the runtime was loaded).
    trap: u64,
    /// The provisional ledger's mapping (address, length), until the full one is written.
    provisional_at: (u64, u64),
}

impl Joined {
    /// The runtime's glass_probe_detach.
    fn leave(&self) -> u64 {
        self.runtime_at[1]
    }
}

/// Attach, step 2, in the loader thread while the others run: loads the runtime, takes
/// out what a dead glass left (a live one's ledger refuses), leaves a ledger naming this
/// glass, and has the runtime join the session.
fn join(
    held: &mut Held,
    runtime_symbols: &FileSymbols,
    loader: &LoaderFunctions,
    session: &SessionMemory,
    user: &Credentials,
    notes: &mut dyn TraceNotes,
) -> Result<Joined> {
    let process = &held.process;
    let pid = process.pid();
    let runtime_at = load_runtime(process, runtime_symbols, loader)?;
    glass_target::test_hook("attach-runtime");
    let trap = process.landing();
    // A ledger is a predecessor's, alive (refused) or dead (its probes taken out).
    if let Some(writer) = recover(&mut held.attachment, process, &runtime_at)? {
        notes.note(&format!(
            "pid {pid} still had the probes of glass pid {writer}, which died attached: taken out"
        ));
    }
    // From here on a ledger names this glass: if it dies, its guardian or the next glass
    // knows whose session the runtime holds.
    let provisional = Ledger {
        writer_pid: std::process::id() as u64,
        writer_start: ledger::start_time(std::process::id() as u64).unwrap_or(0),
        trap,
        ..Ledger::default()
    };
    let provisional_at = leave_ledger(process, &provisional, runtime_at[LEDGER])?;
    let forget_provisional = || {
        let _ = process.write(runtime_at[LEDGER], &0u64.to_le_bytes());
        process.unmap(provisional_at.0, provisional_at.1);
    };
    glass_target::test_hook("attach-ledger");
    // A join that failed as a call (it did not return in time) may still join: the
    // ledger stays, so whoever comes next can end that session.
    let joined = join_session(process, &runtime_at, session)?;
    if joined == -(libc::EBUSY as i64) {
        forget_provisional();
        return Err(Failure::TracedByAnother(format!(
            "pid {pid} is already being traced (its probe runtime has a session that no glass left a ledger for: a `glass trace` that launched it?)"
        )));
    }
    if joined != 0 {
        forget_provisional();
        return Err(Failure::runtime(owner::refusal(
            pid,
            session.path(),
            user,
            -joined as i32,
        )));
    }
    // The target has mapped the rings; nobody else needs the name.
    session.unlink();
    Ok(Joined {
        runtime_at,
        trap,
        provisional_at,
    })
}

/// What the patches changed, and how long every thread was held for them.
struct Patched {
    installed: Vec<install::Installed>,
    skipped: Vec<crate::Skip>,
    undo: Vec<install::Undo>,
    hooks_undo: install::Undo,
    runtime_text: Vec<Span>,
    ledger_at: (u64, u64),
    /// When every thread was stopped for the patches.
    all_stopped: Instant,
    /// Threads moved out of the bytes replaced.
    moved: usize,
}

/// Refuses, in the one line a launched trace gives, an attach none of whose functions,
/// short functions or library calls can be patched.
fn refuse_if_nothing_patchable(modules: &[select::ModuleChoice]) -> Result<()> {
    let nothing = modules.iter().all(select::ModuleChoice::nothing_to_patch);
    if !nothing {
        return Ok(());
    }
    let skipped: Vec<crate::Skip> = modules
        .iter()
        .flat_map(|m| {
            m.skipped.iter().map(|(function, reason)| crate::Skip {
                module: m.path.clone(),
                address: function.address,
                name: function.name.clone(),
                reason: reason.clone(),
            })
        })
        .collect();
    Err(Failure::NothingToPatch(super::nothing_patchable(&skipped)))
}

/// Attach, step 3: builds and writes the trampolines and the full ledger while the
/// other threads run, then stops every thread at a safe point (moving any inside bytes
/// about to be replaced into their relocated copy) and writes the entry jumps. On a
/// failure nothing is patched.
fn patch(
    held: &mut Held,
    joined: &Joined,
    modules: &[select::ModuleChoice],
    unwinder_slots: &[(u64, usize)],
    loader: &LoaderFunctions,
    session: &SessionMemory,
) -> Result<Patched> {
    let process = &held.process;
    let pid = process.pid();
    let runtime_at = &joined.runtime_at;
    let Some(probes) = super::probes(session) else {
        return Err(Failure::runtime(
            "the probe runtime did not join the session",
        ));
    };
    if let Some(offset) = modules.iter().find_map(|module| module.go_g_offset) {
        session.set_go_g_offset(offset);
    }
    let mappings = glass_target::procfs::executable_mappings(pid)
        .map_err(|e| Failure::runtime(format!("cannot read the mappings of pid {pid}: {e}")))?;
    let runtime_text = runtime_text(&mappings);
    bind_lazy_slots(process, modules, &mappings, loader.dlsym)?;
    let hooks = unwinder_hooks(process, unwinder_slots, runtime_at, loader.dlsym)?;
    let biases = super::biases(pid, modules)?;
    let ranges: Vec<(u64, u64)> = modules
        .iter()
        .zip(&biases)
        .flat_map(|(module, &bias)| install::overwritten_ranges(module, bias))
        .collect();
    // Trampolines are built and written while the other threads run; only the
    // patches wait for every thread to stop.
    let (installed, skipped, prepared) = super::prepare_all(process, probes, modules, &biases)?;
    // The unwinder's GOT slots are committed with the rest, as one more module's
    // patches.
    let mut prepared = prepared;
    let mut hook_patches = Vec::new();
    for (slot, hook) in hooks {
        let original = process
            .read(slot, 8)
            .map_err(|e| Failure::runtime(format!("cannot read the GOT of pid {pid}: {e}")))?;
        hook_patches.push((slot, hook.to_le_bytes().to_vec(), original));
    }
    prepared.push(install::Outcome {
        installed: Vec::new(),
        skipped: Vec::new(),
        patches: hook_patches,
        region: (0, 0),
        moves: Vec::new(),
    });
    let ledger_at = leave_ledger(
        process,
        &full_ledger(&prepared, session, joined.trap),
        runtime_at[LEDGER],
    )?;
    process.unmap(joined.provisional_at.0, joined.provisional_at.1);
    glass_target::test_hook("attach-prepared");
    let all_stopped = Instant::now();
    let moves = prepared
        .iter()
        .flat_map(|o| o.moves.iter().copied())
        .collect();
    let inside = |rip: u64| {
        ranges
            .iter()
            .any(|&(start, len)| rip > start && rip < start + len)
    };
    let leave = Leave {
        inside: &inside,
        spans: &[],
        moves: &moves,
    };
    // Threads made while the injected calls ran are held like the rest.
    held.attachment.adopt(&process.take_new_peers());
    let moved = stop_at_safe_points(&mut held.attachment, &leave, Some(process.tid()))?;
    glass_target::test_hook("attach-stopped");
    let (installed, skipped) = leave_sites_functions_goroutines_are_in(
        process,
        modules,
        &biases,
        &inside,
        installed,
        skipped,
        &mut prepared,
    );
    let undo = super::commit_all(process, &prepared)?;
    glass_target::test_hook("attach-patched");
    let mut undo = undo;
    // The unwinder's GOT slots are the last module's patches (pushed last above).
    let hooks_undo = undo.pop().expect("the unwinder hooks' patches");
    Ok(Patched {
        installed,
        skipped,
        undo,
        hooks_undo,
        runtime_text,
        ledger_at,
        all_stopped,
        moved,
    })
}

/// Takes out of `prepared` every patch of a Go function a goroutine is parked inside
/// (see `go_stacks`): such a function is skipped. Every thread is stopped.
fn leave_sites_functions_goroutines_are_in(
    process: &StoppedProcess,
    modules: &[select::ModuleChoice],
    biases: &[u64],
    inside: &dyn Fn(u64) -> bool,
    mut installed: Vec<install::Installed>,
    mut skipped: super::Skipped,
    prepared: &mut [install::Outcome],
) -> (Vec<install::Installed>, super::Skipped) {
    for (module, &bias) in modules.iter().zip(biases) {
        let Some(allgs) = module.go_allgs else {
            continue;
        };
        for pc in go_stacks::planted_pcs(process, allgs.wrapping_add(bias), inside) {
            let Some(index) = installed.iter().position(|f| {
                f.module == module.path && pc > f.address && pc < f.address + f.size + 16
            }) else {
                continue;
            };
            let function = installed.remove(index);
            let span = function.address..function.address + function.size + 16;
            for outcome in prepared.iter_mut() {
                outcome.patches.retain(|(at, _, _)| !span.contains(at));
                outcome.moves.retain(|(from, _)| !span.contains(from));
            }
            skipped.push(crate::Skip {
                module: function.module.clone(),
                address: function.address,
                name: function.name.clone(),
                reason: select::SkipReason::GoroutineInside { pc },
            });
        }
    }
    (installed, skipped)
}

/// What a later glass needs to take it all out should this one die attached.
fn full_ledger(prepared: &[install::Outcome], session: &SessionMemory, trap: u64) -> Ledger {
    Ledger {
        writer_pid: std::process::id() as u64,
        writer_start: ledger::start_time(std::process::id() as u64).unwrap_or(0),
        session: session.mapped_at(),
        trap,
        regions: prepared
            .iter()
            .map(|o| o.region)
            .filter(|r| r.1 > 0)
            .collect(),
        restore: prepared
            .iter()
            .flat_map(|o| {
                o.patches
                    .iter()
                    .map(|(at, _, original)| (*at, original.clone()))
            })
            .collect(),
        moves: prepared
            .iter()
            .flat_map(|o| o.moves.iter().copied())
            .collect(),
        unwinder_hooks: prepared.last().map_or(0, |o| o.patches.len() as u64),
    }
}

/// The process's command line, for the recording's header.
fn command_line(pid: i32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| {
            c.split(|&b| b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The probe runtime glass embeds, with every entry point glass calls.
fn embedded_runtime() -> Result<FileSymbols> {
    FileSymbols::runtime(&RUNTIME_SYMBOLS)
        .filter(|s| s.addresses.iter().all(Option::is_some))
        .ok_or_else(|| {
            Failure::runtime(
                "the embedded probe runtime lacks glass_probe_attach and the other entry points glass calls (a broken build)",
            )
        })
}

/// Detach, unless the process exited while traced (None); the summary gets its figures.
fn detach_unless_gone(
    pid: i32,
    attached: &Attached,
    session: &SessionMemory,
    summary: &mut TraceSummary,
) -> Result<Option<Detached>> {
    if process_gone(pid) {
        return Ok(None);
    }
    let detached = detach(pid, attached, session.mapped_at())?;
    summary.detach_stop_ns = detached.stopped_ns;
    summary.in_flight_at_detach = detached.in_flight;
    Ok(Some(detached))
}

/// What ended the trace, in the detach's words.
fn ended_by(outcome: Outcome) -> &'static str {
    match outcome {
        Outcome::TargetExited => "the process exited",
        Outcome::Signalled(libc::SIGINT) => "SIGINT",
        Outcome::Signalled(libc::SIGTERM) => "SIGTERM",
        Outcome::Signalled(_) => "SIGHUP",
        _ => "the duration ran out",
    }
}

/// An attached process's rings, drained until it exits, the duration runs out or a stop
/// signal arrives (the shared loop of glass-record decides which).
struct AttachDrain<'s> {
    session: &'s SessionMemory,
    pid: i32,
    words: Vec<u64>,
}

impl Sampler<super::Output> for AttachDrain<'_> {
    fn gather(&mut self, out: &mut super::Output) -> std::io::Result<Gathered> {
        if process_gone(self.pid) {
            return Ok(Gathered::ended_if(true));
        }
        let drained = super::drain_once(self.session, false, &mut self.words, out);
        Ok(Gathered {
            ended: None,
            more: drained >= super::DRAIN_BUSY,
        })
    }
}
