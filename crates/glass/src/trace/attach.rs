//! `glass trace --pid`: instrument a running process, trace, and leave it as it was.
//!
//! Attach:
//! 1. seize every thread (without stopping them); pick one thread at a *safe point* —
//!    in the program's own code, or waiting in a system call, never inside the dynamic
//!    loader or elsewhere in libc, where it may hold the locks `dlopen` takes — and
//!    stop only that one;
//! 2. in it, call the process's own `dlopen` on the probe runtime and the runtime's
//!    `glass_probe_attach` on the session, while the other threads run on (a thread
//!    holding a lock `dlopen` needs must be able to release it); build and write the
//!    trampolines (unreachable yet) and the ledger (see `ledger`);
//! 3. stop every thread; move any thread whose instruction pointer lies strictly inside
//!    bytes about to be replaced out of them (single steps); write the entry jumps; let
//!    every thread go. No thread can return into replaced bytes: a call is only ever
//!    displaced as the last instruction, so its return address is the end of the patch.
//!    x86 keeps instruction fetch coherent with stores, and each thread re-enters user
//!    space through the kernel, which serialises it.
//!
//! Detach (at the end of `-d`, on SIGINT/SIGTERM/SIGHUP):
//! 1. stop every thread; step any thread out of the probe runtime and the trampolines;
//! 2. put back every patched byte and GOT slot; give every hijacked return address of a
//!    call in flight back to its frame (those calls finish in the original code, their
//!    ends unrecorded); clear each thread's area word; call `glass_probe_detach`, which
//!    unmaps the session;
//! 3. let every thread go, and drain the rings.
//!
//! The trampolines stay mapped (a thread may be returning through one), and the runtime
//! stays loaded: attaching again reuses it. Between attach and detach glass is not the
//! process's tracer, so if glass dies there the process runs on untouched by ptrace; its
//! probes find the rings full and drop records, and never wait; the next glass to
//! attach finds the dead one's ledger and takes its probes out first.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use glass_format::TraceSummary;
use glass_target::attach::{registers, Attachment};
use glass_target::inject::{CallArg, LibcCalls, StoppedProcess};
use glass_target::procfs::Mapping;
use glass_probe_abi::session::SessionMemory;
use object::{Object, ObjectSegment, ObjectSymbol};

use super::ledger::{self, Ledger};
use super::owner::{self, Credentials};
use super::{install, select, CounterChoice};
use crate::error::{Failure, Result};
use crate::TraceArgs;
use glass_record::driver::{drive, Clock, Gathered, Sampler};
use glass_record::{create_output, monotonic_now_ns, stop_signal_fd, Outcome};

/// Longest an injected call (dlopen) may take before glass gives up.
const CALL_LIMIT: Duration = Duration::from_secs(10);

/// System calls a thread may be waiting in while glass uses it to load the runtime:
/// waits that hold no lock of libc's (read, poll, sleep, futex, wait, accept, ...).
const WAITING_SYSCALLS: &[i64] = &[
    0, 7, 23, 34, 35, 43, 45, 47, 61, 128, 130, 202, 230, 232, 247, 270, 271, 281, 288,
];

/// What glass finds in the runtime it loads: how to join and leave a session, the
/// table of the real unwinder functions, and the unwinder hooks (in the order of that
/// table: the runtime's REAL_FUNCTIONS).
const RUNTIME_SYMBOLS: [&str; 10] = [
    "glass_probe_attach",
    "glass_probe_detach",
    "glass_probe_real_functions",
    "glass_probe_ledger",
    "glass_probe_landing",
    "_Unwind_RaiseException",
    "_Unwind_Resume",
    "_Unwind_Resume_or_Rethrow",
    "_Unwind_ForcedUnwind",
    "__cxa_begin_catch",
];
const LEDGER: usize = 3;
const LANDING: usize = 4;
const FIRST_HOOK: usize = 5;

/// The GOT slots through which the process's modules call the C++ unwinder's entry
/// points: (slot address, index of the hooked function). When preloaded, the runtime
/// interposes these functions; loaded with dlopen it cannot, so glass points the slots
/// at its hooks, or an exception thrown through an instrumented frame would meet a
/// hijacked return address the unwinder cannot read past, and terminate the program.
fn unwinder_slots(pid: i32, mappings: &[Mapping]) -> Vec<(u64, usize)> {
    let names: Vec<String> = RUNTIME_SYMBOLS[FIRST_HOOK..]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut seen = std::collections::HashSet::new();
    let mut slots = Vec::new();
    for mapping in mappings {
        let name = file_name(&mapping.path);
        if !mapping.path.starts_with('/')
            || name.starts_with("libgcc_s")
            || name.starts_with("ld-linux")
            || !seen.insert(mapping.path.clone())
        {
            continue;
        }
        let file = PathBuf::from(format!("/proc/{pid}/root{}", mapping.path));
        let Ok(bytes) = std::fs::read(&file).or_else(|_| std::fs::read(&mapping.path)) else {
            continue;
        };
        let Ok(elf) = object::File::parse(&*bytes) else {
            continue;
        };
        let found = select::got_slots(&elf, &names);
        if found.is_empty() {
            continue;
        }
        let segments: Vec<(u64, u64, u64)> = elf
            .segments()
            .map(|s| (s.file_range().0, s.address(), s.file_range().1))
            .collect();
        let Some(bias) = glass_target::procfs::load_bias(mapping, &segments) else {
            continue;
        };
        for (symbol, slot) in found {
            if let Some(which) = names.iter().position(|n| *n == symbol) {
                slots.push((slot.wrapping_add(bias), which));
            }
        }
    }
    slots
}

/// Tells the runtime where the real unwinder functions are (as the loader binds them:
/// `dlsym`), and returns the slot writes that send the process's calls to its hooks:
/// (slot, hook address).
fn unwinder_hooks(
    process: &StoppedProcess,
    slots: &[(u64, usize)],
    runtime_at: &[u64],
    dlsym: Option<u64>,
) -> Result<Vec<(u64, u64)>> {
    let pid = process.pid();
    let (Some(dlsym), false) = (dlsym, slots.is_empty()) else {
        return Ok(Vec::new());
    };
    let table = runtime_at[2];
    let mut writes = Vec::new();
    for (which, name) in RUNTIME_SYMBOLS[FIRST_HOOK..].iter().enumerate() {
        if !slots.iter().any(|&(_, w)| w == which) {
            continue;
        }
        let real = resolve(process, dlsym, name)?;
        if real == 0 {
            continue;
        }
        process
            .write(table + 8 * which as u64, &real.to_le_bytes())
            .map_err(|e| {
                Failure::runtime(format!("cannot set up the runtime in pid {pid}: {e}"))
            })?;
        let hook = runtime_at[FIRST_HOOK + which];
        writes.extend(
            slots
                .iter()
                .filter(|&&(_, w)| w == which)
                .map(|&(slot, _)| (slot, hook)),
        );
    }
    Ok(writes)
}

/// An address range of the target and what it is.
#[derive(Clone, Copy)]
struct Span {
    start: u64,
    end: u64,
}

fn within(spans: &[Span], address: u64) -> bool {
    spans.iter().any(|s| address >= s.start && address < s.end)
}

/// Symbols a library exports, read from its file once (outside any stopped window),
/// to be found in a process where it is mapped.
struct FileSymbols {
    file: PathBuf,
    segments: Vec<(u64, u64, u64)>,
    /// File addresses, in the order asked for.
    addresses: Vec<Option<u64>>,
}

impl FileSymbols {
    fn read(file: &Path, names: &[&str]) -> Option<Self> {
        let bytes = std::fs::read(file).ok()?;
        let elf = object::File::parse(&*bytes).ok()?;
        let mut addresses = vec![None; names.len()];
        for symbol in elf.dynamic_symbols().filter(|s| s.is_definition()) {
            if let Some(i) = names.iter().position(|n| symbol.name() == Ok(n)) {
                addresses[i].get_or_insert(symbol.address());
            }
        }
        Some(FileSymbols {
            file: file.to_path_buf(),
            segments: elf
                .segments()
                .map(|s| (s.file_range().0, s.address(), s.file_range().1))
                .collect(),
            addresses,
        })
    }

    /// The symbols' addresses in a process where `mapping` maps this file.
    fn at(&self, mapping: &Mapping) -> Vec<Option<u64>> {
        let bias = glass_target::procfs::load_bias(mapping, &self.segments);
        self.addresses
            .iter()
            .map(|a| Some(a.as_ref()?.wrapping_add(bias?)))
            .collect()
    }

    /// Where this file is mapped in `pid`, and the symbols' addresses there.
    fn in_process(&self, pid: i32) -> Option<Vec<Option<u64>>> {
        let canonical = std::fs::canonicalize(&self.file).ok()?;
        let mappings = glass_target::procfs::executable_mappings(pid).ok()?;
        let mapping = mappings
            .iter()
            .find(|m| std::fs::canonicalize(&m.path).ok().as_ref() == Some(&canonical))?;
        Some(self.at(mapping))
    }
}

fn file_name(path: &str) -> String {
    Path::new(path)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The executable spans of the mappings whose file name starts with one of `prefixes`.
fn spans_of(mappings: &[Mapping], prefixes: &[&str]) -> Vec<Span> {
    mappings
        .iter()
        .filter(|m| prefixes.iter().any(|p| file_name(&m.path).starts_with(p)))
        .map(|m| Span {
            start: m.start,
            end: m.end,
        })
        .collect()
}

/// The process's `dlopen`, `dlerror` and `dlsym`, and the `mmap` and `munmap` its
/// system calls are made through.
struct LoaderFunctions {
    dlopen: u64,
    dlerror: u64,
    dlsym: Option<u64>,
    calls: LibcCalls,
}

fn loader_functions(pid: i32, mappings: &[Mapping]) -> Option<LoaderFunctions> {
    let mut candidates: Vec<&Mapping> = mappings
        .iter()
        .filter(|m| {
            let name = file_name(&m.path);
            m.path.starts_with('/') && (name.starts_with("libc.so") || name.starts_with("libdl"))
        })
        .collect();
    candidates.dedup_by(|a, b| a.path == b.path);
    for mapping in candidates {
        // The file as the target sees it (its mount namespace may differ).
        let mut file = PathBuf::from(format!("/proc/{pid}/root{}", mapping.path));
        if !file.exists() {
            file = PathBuf::from(&mapping.path);
        }
        let names = ["dlopen", "dlerror", "dlsym", "mmap", "munmap"];
        let Some(symbols) = FileSymbols::read(&file, &names) else {
            continue;
        };
        if let [Some(dlopen), Some(dlerror), dlsym, Some(mmap), Some(munmap)] =
            symbols.at(mapping)[..]
        {
            return Some(LoaderFunctions {
                dlopen,
                dlerror,
                dlsym,
                calls: LibcCalls { mmap, munmap },
            });
        }
    }
    None
}

/// Stops one thread at a safe point to run the loader in; every other thread runs.
fn pick_loader_thread(
    attachment: &mut Attachment,
    unsafe_code: &[Span],
    libc: &[Span],
) -> Result<i32> {
    for round in 0..400 {
        for tid in attachment.tids() {
            match attachment.stop(tid) {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) => return Err(Failure::runtime(e.to_string())),
            }
            let Ok(regs) = registers(tid) else {
                attachment.resume(tid);
                continue;
            };
            let waiting = WAITING_SYSCALLS.contains(&(regs.orig_rax as i64));
            let safe = !within(unsafe_code, regs.rip) && (!within(libc, regs.rip) || waiting);
            if safe || round == 399 {
                return Ok(tid);
            }
            attachment.resume(tid);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Err(Failure::runtime(
        "no thread of the process could be stopped",
    ))
}

/// Where the landing of injected calls can go without a system call to map it: the
/// first 64-byte boundary past the end of an executable segment of a file the process
/// maps (the C library first), when the rest of that mapping's last page holds it. Those
/// bytes are mapped executable but belong to no function, so nothing else runs them.
/// glass borrows them while attached and puts the file's bytes back when it detaches.
struct LandingSite {
    at: u64,
    /// The bytes there, as the file has them.
    original: Vec<u8>,
}

fn landing_site(pid: i32) -> Option<LandingSite> {
    let room = glass_target::inject::landing_code(glass_target::inject::xstate_kind()).len();
    let mut mappings = glass_target::procfs::executable_mappings(pid).ok()?;
    mappings.retain(|m| m.path.starts_with('/') && !m.deleted);
    mappings.sort_by_key(|m| !file_name(&m.path).starts_with("libc.so"));
    for mapping in &mappings {
        let mut file = PathBuf::from(format!("/proc/{pid}/root{}", mapping.path));
        if !file.exists() {
            file = PathBuf::from(&mapping.path);
        }
        let Ok(bytes) = std::fs::read(&file) else {
            continue;
        };
        let Ok(elf) = object::File::parse(&*bytes) else {
            continue;
        };
        let segments: Vec<(u64, u64, u64)> = elf
            .segments()
            .map(|s| (s.file_range().0, s.address(), s.file_range().1))
            .collect();
        let Some(bias) = glass_target::procfs::load_bias(mapping, &segments) else {
            continue;
        };
        for segment in elf.segments() {
            let executable = matches!(segment.flags(), object::SegmentFlags::Elf { p_flags, .. } if p_flags.0 & object::elf::PF_X.0 != 0);
            let end = segment
                .address()
                .wrapping_add(segment.size())
                .wrapping_add(bias);
            let at = end.next_multiple_of(64);
            if !executable || end <= mapping.start || at + room as u64 > mapping.end {
                continue;
            }
            // Past the file's end the mapping reads zeros.
            let offset = (mapping.file_offset + (at - mapping.start)) as usize;
            let mut original = bytes.get(offset..).unwrap_or_default().to_vec();
            original.resize(room, 0);
            original.truncate(room);
            return Some(LandingSite { at, original });
        }
    }
    None
}

/// Puts back the bytes a landing borrowed (see [`LandingSite`]) once no injected call
/// needs it any more, and tells the runtime there is none.
fn return_landing(process: &StoppedProcess, landing_word: u64) {
    if let Some(site) = landing_site(process.pid()).filter(|s| s.at == process.landing()) {
        let _ = process.write(site.at, &site.original);
        let _ = process.write(landing_word, &0u64.to_le_bytes());
    }
}

/// Reads a C string of the target.
fn read_c_string(process: &StoppedProcess, address: u64) -> String {
    let mut text = Vec::new();
    for chunk in 0..8u64 {
        let Ok(bytes) = process.read(address + chunk * 64, 64) else {
            break;
        };
        if let Some(end) = bytes.iter().position(|&b| b == 0) {
            text.extend_from_slice(&bytes[..end]);
            break;
        }
        text.extend_from_slice(&bytes);
    }
    String::from_utf8_lossy(&text).into_owned()
}

/// Where a stopped thread resumes: its instruction pointer and, when it was stopped in a
/// system call the kernel will restart (rax still holds -ERESTARTSYS, -ERESTARTNOINTR,
/// -ERESTARTNOHAND or -ERESTART_RESTARTBLOCK), the 2-byte `syscall` before it, to which
/// the kernel moves it back when it runs again: a thread blocked right after bytes glass
/// replaces would otherwise restart inside the new ones. Both must be outside code glass
/// changes.
fn resume_points(regs: &libc::user_regs_struct) -> [u64; 2] {
    const RESTARTING: [i64; 4] = [-512, -513, -514, -516];
    let restarts = (regs.orig_rax as i64) >= 0 && RESTARTING.contains(&(regs.rax as i64));
    [
        regs.rip,
        regs.rip.wrapping_sub(if restarts { 2 } else { 0 }),
    ]
}

/// How many times glass stops every thread looking for a moment when none is where it
/// must not be (inside the probe runtime or the trampolines, at detach), letting them
/// run 1 ms between tries. The probes never block, so a thread is seldom there twice.
const SAFE_POINT_TRIES: usize = 500;

/// Places threads must not resume in, and where each place of them moves a thread to.
struct Leave<'a> {
    /// Where a thread must not resume: it is moved (see `moves`).
    inside: &'a dyn Fn(u64) -> bool,
    /// Where a thread must not be at all, and cannot be moved from: the threads are let
    /// run until none is there.
    spans: &'a [Span],
    moves: &'a std::collections::HashMap<u64, u64>,
}

/// With every thread stopped: moves each thread whose resume points lie where
/// `leave.inside` says to the same place in the other copy of the code (`leave.moves`):
/// into the trampolines' relocated instructions before the patches are written, back
/// into the original code before they are taken out. Never single-steps: a thread being
/// stepped when glass dies is killed by the kernel. Returns how many were moved, or
/// (nothing changed) the threads inside `leave.spans` or that could not be moved.
fn move_out(
    attachment: &Attachment,
    leave: &Leave,
) -> Result<std::result::Result<usize, Vec<i32>>> {
    let mut planned = Vec::new();
    let mut in_the_way = Vec::new();
    for tid in attachment.tids() {
        let Ok(regs) = registers(tid) else {
            continue;
        };
        let points = resume_points(&regs);
        if points.iter().any(|&p| within(leave.spans, p)) {
            in_the_way.push(tid);
            continue;
        }
        if !points.into_iter().any(leave.inside) {
            continue;
        }
        // The thread's own instruction pointer moves; a restart the kernel has yet to
        // make goes 2 bytes back from there, to the other copy's `syscall`.
        match leave.moves.get(&regs.rip) {
            Some(&to) => planned.push((tid, libc::user_regs_struct { rip: to, ..regs })),
            None => in_the_way.push(tid),
        }
    }
    if !in_the_way.is_empty() {
        return Ok(Err(in_the_way));
    }
    for (tid, regs) in &planned {
        glass_target::attach::set_registers(*tid, regs)
            .map_err(|e| Failure::runtime(format!("cannot move thread {tid}: {e}")))?;
    }
    Ok(Ok(planned.len()))
}

/// Stops every thread with none left where `leave` says (those that can be are moved,
/// see [`move_out`]); returns how many were moved. The threads in the way (in the probe
/// runtime, or between two instructions a move cannot map) are let run for a moment on
/// their own, the others held, and stopped again: the probes never block, so a thread
/// is out of them in microseconds. Every so often all of them run (all but `keep`), in
/// case one waits for another.
fn stop_at_safe_points(
    attachment: &mut Attachment,
    leave: &Leave,
    keep: Option<i32>,
) -> Result<usize> {
    for attempt in 0..SAFE_POINT_TRIES {
        attachment
            .stop_all()
            .map_err(|e| Failure::runtime(e.to_string()))?;
        let in_the_way = match move_out(attachment, leave)? {
            Ok(moved) => return Ok(moved),
            Err(in_the_way) => in_the_way,
        };
        let let_run = match attempt % 10 {
            9 => attachment.tids(),
            _ => in_the_way,
        };
        // The thread injected calls run in stays where it was found safe for them.
        for tid in let_run {
            if Some(tid) != keep {
                attachment.resume(tid);
            }
        }
        std::thread::sleep(Duration::from_micros(if attempt % 10 == 9 {
            1000
        } else {
            100
        }));
    }
    Err(Failure::runtime(
        "a thread stayed inside code glass must change or take out (blocked in a system call there)",
    ))
}

/// The moves that take threads out of the trampolines: `moves` read backwards.
fn moves_back(moves: impl Iterator<Item = (u64, u64)>) -> std::collections::HashMap<u64, u64> {
    moves
        .map(|(original, relocated)| (relocated, original))
        .collect()
}

fn process_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .and_then(|rest| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X"),
        Err(_) => true,
    }
}

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
}

pub fn run(
    args: &TraceArgs,
    pid: i32,
    patterns: &[String],
    libcalls: &[String],
    counters: Vec<CounterChoice>,
    counters_note: String,
) -> Result<i32> {
    if pid <= 0 || !Path::new(&format!("/proc/{pid}/task")).exists() {
        return Err(Failure::bad_input(format!("no process with pid {pid}")));
    }
    if pid == std::process::id() as i32 {
        return Err(Failure::bad_input("glass cannot trace itself"));
    }
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).map_err(|e| {
        Failure::bad_input(format!(
            "cannot read the program of pid {pid}: {e} (a kernel thread, or a process this user may not trace)"
        ))
    })?;
    let program = if exe.exists() {
        exe.clone()
    } else {
        PathBuf::from(format!("/proc/{pid}/exe"))
    };
    let main_module =
        select::read_module(&program, patterns, libcalls).map_err(Failure::bad_input)?;
    if main_module.matched == 0 && main_module.libcalls.is_empty() && args.lib.is_empty() {
        return Err(Failure::bad_input(format!(
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
    if !counters_note.is_empty() {
        eprintln!("glass: --pmc: {counters_note}; recording time only");
    }
    let modules = super::choose_modules(pid, main_module, patterns, libcalls, args)?;
    let runtime = super::probe_runtime()?;
    let runtime_symbols = FileSymbols::read(&runtime, &RUNTIME_SYMBOLS)
        .filter(|s| s.addresses.iter().all(Option::is_some))
        .ok_or_else(|| {
            Failure::runtime(format!(
                "{} lacks glass_probe_attach and the other entry points glass calls (a stale build?)",
                runtime.display()
            ))
        })?;
    let unwinder_slots = unwinder_slots(pid, &mappings);
    let configs: Vec<(u32, u64)> = counters.iter().map(|c| c.1).collect();
    let file = create_output(&args.output)?;
    // The session file is the process's user's (mode 0600): a worker that dropped
    // root must still be able to open it.
    let user = Credentials::of_process(pid)
        .map_err(|e| Failure::bad_input(format!("cannot read who pid {pid} runs as: {e}")))?;
    let session = SessionMemory::create(
        args.max_threads as usize,
        args.ring_size,
        &configs,
        Some(user.owner()),
    )
    .map_err(|e| Failure::runtime(format!("cannot create the trace rings: {e}")))?;
    // Told `done` when this function returns, whatever it returns: by then nothing is
    // patched or everything is taken out again. Only a glass that dies (or panics)
    // leaves the guardian something to do.
    let _guardian = GuardianDone(Some(super::guardian::start(pid, session.path())?));
    let stop_signals = stop_signal_fd()?;
    let clock_start = (glass_probe_abi::rdtsc(), monotonic_now_ns());

    // -- Attach ------------------------------------------------------------------------
    let mut attachment = Attachment::seize(pid).map_err(|e| {
        if e.is_bad_input() {
            Failure::bad_input(e.to_string())
        } else {
            Failure::runtime(e.to_string())
        }
    })?;
    let loader_code = spans_of(&mappings, &["ld-linux", "ld-2.", "ld64"]);
    let libc_code = spans_of(&mappings, &["libc.so", "libc-", "libdl"]);
    let loader_tid = pick_loader_thread(&mut attachment, &loader_code, &libc_code)?;
    glass_target::test_hook("attach-safe-point");
    let loader_stopped = Instant::now();
    let mut process = StoppedProcess::for_thread(pid, loader_tid)
        .map_err(|e| Failure::runtime(format!("cannot open the memory of pid {pid}: {e}")))?;
    process.use_libc(loader.calls);
    let runtime_at = load_runtime(&process, &runtime_symbols, &loader)?;
    glass_target::test_hook("attach-runtime");
    let trap = process.landing();
    let leave = runtime_at[1];
    // A ledger is a predecessor's, alive (refused) or dead (its probes taken out).
    if let Some(writer) = recover(&mut attachment, &process, &runtime_at)? {
        if !args.quiet {
            eprintln!(
                "glass: pid {pid} still had the probes of glass pid {writer}, which died attached: taken out"
            );
        }
    }
    // From here on a ledger names this glass: if it dies, its guardian or the next glass
    // knows whose session the runtime holds.
    let provisional = Ledger {
        writer_pid: std::process::id() as u64,
        writer_start: ledger::start_time(std::process::id() as u64).unwrap_or(0),
        trap,
        ..Ledger::default()
    };
    let provisional_at = leave_ledger(&process, &provisional, runtime_at[LEDGER])?;
    let forget_provisional = || {
        let _ = process.write(runtime_at[LEDGER], &0u64.to_le_bytes());
        process.unmap(provisional_at.0, provisional_at.1);
    };
    glass_target::test_hook("attach-ledger");
    let joined =
        join_session(&process, &runtime_at, &session).inspect_err(|_| forget_provisional())?;
    if joined == -(libc::EBUSY as i64) {
        forget_provisional();
        return Err(Failure::bad_input(format!(
            "pid {pid} is already being traced (its probe runtime has a session that no glass left a ledger for: a `glass trace` that launched it?)"
        )));
    }
    if joined != 0 {
        forget_provisional();
        return Err(Failure::runtime(owner::refusal(
            pid,
            session.path(),
            &user,
            -joined as i32,
        )));
    }
    // The target has mapped the rings; nobody else needs the name.
    session.unlink();
    let mut all_stopped = Instant::now();
    let mut moved = 0;
    let mut patch = || -> Result<_> {
        let Some((_, enter)) = session.runtime() else {
            return Err(Failure::runtime(
                "the probe runtime did not join the session",
            ));
        };
        let mappings = glass_target::procfs::executable_mappings(pid)
            .map_err(|e| Failure::runtime(format!("cannot read the mappings of pid {pid}: {e}")))?;
        let runtime_text: Vec<Span> = mappings
            .iter()
            .filter(|m| m.path.contains("libglass_probe"))
            .map(|m| Span {
                start: m.start,
                end: m.end,
            })
            .collect();
        bind_lazy_slots(&process, &modules, &mappings, loader.dlsym)?;
        let hooks = unwinder_hooks(&process, &unwinder_slots, &runtime_at, loader.dlsym)?;
        let biases = super::biases(pid, &modules)?;
        let ranges: Vec<(u64, u64)> = modules
            .iter()
            .zip(&biases)
            .flat_map(|(module, &bias)| install::overwritten_ranges(module, bias))
            .collect();
        // Trampolines are built and written while the other threads run; only the
        // patches wait for every thread to stop.
        let (installed, skipped, prepared) =
            super::prepare_all(&process, enter, &modules, &biases)?;
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
        // What a later glass needs to take it all out should this one die attached.
        let ledger = Ledger {
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
        };
        let ledger_at = leave_ledger(&process, &ledger, runtime_at[LEDGER])?;
        process.unmap(provisional_at.0, provisional_at.1);
        glass_target::test_hook("attach-prepared");
        all_stopped = Instant::now();
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
        moved = stop_at_safe_points(&mut attachment, &leave, Some(loader_tid))?;
        glass_target::test_hook("attach-stopped");
        let undo = super::commit_all(&process, &prepared)?;
        glass_target::test_hook("attach-patched");
        let mut undo = undo;
        // The unwinder's GOT slots are the last module's patches (pushed last above).
        let hooks_undo = undo.pop().expect("the unwinder hooks' patches");
        Ok((
            installed,
            skipped,
            undo,
            hooks_undo,
            runtime_text,
            ledger_at,
        ))
    };
    let (installed, skipped, undo, hooks_undo, runtime_text, ledger_at) = match patch() {
        Ok(done) => done,
        Err(failure) => {
            // Nothing is patched (commit_all undoes its part): the runtime lets the
            // session go and stays loaded, idle.
            let _ = leave_runtime(&process, leave);
            attachment.release();
            return Err(failure);
        }
    };
    attachment.release();
    let attach_stop_ns = all_stopped.elapsed().as_nanos() as u64;
    let loader_stop_ns = (all_stopped - loader_stopped).as_nanos() as u64;
    drop(process);
    if !args.quiet {
        super::print_instrumented(&installed, &skipped);
        eprintln!(
            "glass: attached to pid {pid}: every thread stopped {:.2} ms to patch ({moved} moved out of the bytes replaced); thread {loader_tid} stopped {:.2} ms more to load the runtime (the others ran)",
            attach_stop_ns as f64 / 1e6,
            loader_stop_ns as f64 / 1e6,
        );
    }
    let attached = Attached {
        undo,
        hooks_undo,
        landing: trap,
        libc: loader.calls,
        landing_word: runtime_at[LANDING],
        leave,
        runtime_text,
        ledger_at,
        ledger_slot: runtime_at[LEDGER],
    };

    let command: Vec<String> = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| {
            c.split(|&b| b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect()
        })
        .unwrap_or_default();
    let mut out = super::start_output(
        file,
        pid,
        &command,
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
    let why = match outcome {
        Outcome::TargetExited => "the process exited",
        Outcome::Signalled(libc::SIGINT) => "SIGINT",
        Outcome::Signalled(libc::SIGTERM) => "SIGTERM",
        Outcome::Signalled(_) => "SIGHUP",
        _ => "the duration ran out",
    };

    // -- Detach ------------------------------------------------------------------------
    let mut summary = TraceSummary {
        exit_status: -1,
        attach_stop_ns,
        ..TraceSummary::default()
    };
    let detach_result = if process_gone(pid) {
        Ok(None)
    } else {
        detach(pid, &attached, session.mapped_at()).map(|detached| {
            summary.detach_stop_ns = detached.stopped_ns;
            summary.in_flight_at_detach = detached.in_flight;
            Some(detached)
        })
    };
    super::drain_once(&session, true, &mut words, &mut out);
    if !args.quiet {
        match &detach_result {
            Ok(None) => eprintln!("glass: pid {pid} exited while traced"),
            Ok(Some(detached)) => eprintln!(
                "glass: detached from pid {pid} ({why}): every thread stopped {:.2} ms to restore ({} moved out of the trampolines); one stopped {:.2} ms more to unmap the rings; {} calls in flight finish untimed",
                detached.stopped_ns as f64 / 1e6,
                detached.moved,
                detached.unmap_ns as f64 / 1e6,
                detached.in_flight
            ),
            Err(_) => {}
        }
    }
    super::finish_output(
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
    Ok(0)
}

/// Loads the runtime into the process (reusing, where an earlier attach left them, the
/// runtime and the landing of injected calls); returns where the RUNTIME_SYMBOLS are.
fn load_runtime(
    process: &StoppedProcess,
    runtime: &FileSymbols,
    loader: &LoaderFunctions,
) -> Result<Vec<u64>> {
    let pid = process.pid();
    let failed = |what: &str, e: std::io::Error| {
        Failure::runtime(format!(
            "cannot {what} in pid {pid}: {e} (nothing was patched)"
        ))
    };
    let loaded_before = runtime
        .in_process(pid)
        .and_then(|a| a.into_iter().collect::<Option<Vec<u64>>>());
    if let Some(at) = &loaded_before {
        let landing = process.read_u64(at[LANDING]).unwrap_or(0);
        process.reuse_landing(landing);
    }
    if process.landing() == 0 {
        let placed = landing_site(pid).is_some_and(|site| {
            process.reuse_landing(site.at) || process.place_landing(site.at).is_ok()
        });
        if !placed {
            process
                .map_landing()
                .map_err(|e| failed("map the landing of injected calls", e))?;
        }
    }
    let mut path = runtime.file.display().to_string().into_bytes();
    path.push(0);
    let handle = process
        .call(
            loader.dlopen,
            &[CallArg::Bytes(&path), CallArg::Value(libc::RTLD_NOW as u64)],
            CALL_LIMIT,
        )
        .map_err(|e| failed("load the probe runtime", e))?;
    if handle == 0 {
        let message = process
            .call(loader.dlerror, &[], CALL_LIMIT)
            .ok()
            .filter(|&m| m != 0)
            .map(|m| read_c_string(process, m))
            .unwrap_or_default();
        return Err(Failure::runtime(format!(
            "pid {pid} could not load the probe runtime: {message} (nothing was patched)"
        )));
    }
    let Some(runtime_at) = runtime
        .in_process(pid)
        .and_then(|a| a.into_iter().collect::<Option<Vec<u64>>>())
    else {
        return Err(Failure::runtime(format!(
            "cannot find the probe runtime in pid {pid} after loading it"
        )));
    };
    process
        .write(runtime_at[LANDING], &process.landing().to_le_bytes())
        .map_err(|e| failed("set up the probe runtime", e))?;
    Ok(runtime_at)
}

/// `dlsym(RTLD_DEFAULT, name)` in the process: where the loader would bind `name`.
fn resolve(process: &StoppedProcess, dlsym: u64, name: &str) -> Result<u64> {
    let mut symbol = name.as_bytes().to_vec();
    symbol.push(0);
    process
        .call(
            dlsym,
            &[CallArg::Value(0), CallArg::Bytes(&symbol)],
            CALL_LIMIT,
        )
        .map_err(|e| {
            Failure::runtime(format!(
                "cannot resolve {name} in pid {}: {e}",
                process.pid()
            ))
        })
}

/// Has the runtime join `session`: 0, or a negative errno (EBUSY: it has a session).
fn join_session(
    process: &StoppedProcess,
    runtime_at: &[u64],
    session: &SessionMemory,
) -> Result<i64> {
    let mut path = session.path().display().to_string().into_bytes();
    path.push(0);
    let joined = process
        .call(runtime_at[0], &[CallArg::Bytes(&path)], CALL_LIMIT)
        .map_err(|e| {
            Failure::runtime(format!(
                "cannot start the probe runtime in pid {}: {e} (nothing was patched)",
                process.pid()
            ))
        })?;
    Ok(joined as i64)
}

/// `--libcalls` on a process bound lazily: a slot still pointing at its PLT stub would
/// be rewritten by the loader at its first call, hook and all, so glass binds it first
/// (the address `dlsym` gives, as the loader would).
fn bind_lazy_slots(
    process: &StoppedProcess,
    modules: &[select::ModuleChoice],
    mappings: &[Mapping],
    dlsym: Option<u64>,
) -> Result<()> {
    let pid = process.pid();
    let Some(dlsym) = dlsym else {
        return Ok(());
    };
    let biases = super::biases(pid, modules)?;
    for (module, &bias) in modules.iter().zip(&biases) {
        let own: Vec<&Mapping> = mappings
            .iter()
            .filter(|m| {
                std::fs::canonicalize(&m.path).ok() == std::fs::canonicalize(&module.path).ok()
            })
            .collect();
        for (name, slot) in &module.libcalls {
            let slot = slot.wrapping_add(bias);
            let Ok(value) = process.read_u64(slot) else {
                continue;
            };
            if !own.iter().any(|m| value >= m.start && value < m.end) {
                continue;
            }
            let address = resolve(process, dlsym, name)?;
            if address != 0 {
                process.write(slot, &address.to_le_bytes()).map_err(|e| {
                    Failure::runtime(format!("cannot bind {name} in pid {pid}: {e}"))
                })?;
            }
        }
    }
    Ok(())
}

/// Has the runtime let the session go.
fn leave_runtime(process: &StoppedProcess, leave: u64) -> Result<()> {
    let pid = process.pid();
    let left = process.call(leave, &[], CALL_LIMIT);
    left.map_err(|e| Failure::runtime(format!("cannot end the session in pid {pid}: {e}")))?;
    Ok(())
}

/// What detaching took.
struct Detached {
    /// Every thread stopped.
    stopped_ns: u64,
    /// One thread stopped longer, to unmap the session.
    unmap_ns: u64,
    /// Calls in flight, given their return addresses back.
    in_flight: u64,
    /// Threads stepped out of the probes and trampolines.
    moved: usize,
}

/// Writes the ledger into a mapping of its own in the process and points the runtime's
/// word at it; returns the mapping (address, length).
fn leave_ledger(process: &StoppedProcess, ledger: &Ledger, slot: u64) -> Result<(u64, u64)> {
    let pid = process.pid();
    let bytes = ledger.encode();
    let len = (bytes.len() as u64).next_multiple_of(4096);
    let at = process
        .map_anonymous(len, libc::PROT_READ | libc::PROT_WRITE)
        .map_err(|e| Failure::runtime(format!("cannot map the ledger in pid {pid}: {e}")))?;
    process
        .write(at, &bytes)
        .and_then(|()| process.write(slot, &at.to_le_bytes()))
        .map_err(|e| Failure::runtime(format!("cannot write the ledger in pid {pid}: {e}")))?;
    Ok((at, len))
}

/// The first half of taking instrumentation out: every thread stopped wherever it is,
/// the bytes `undo` lists put back, every thread (but `keep`) let go again. No thread
/// enters a probe after this but through a trampoline it was already in or the exit of
/// a call in flight, so the second half finds the threads out of the probes at once
/// (waiting for that with the entries still patched can take forever: on a machine
/// whose rdtsc traps to the hypervisor, a thread calling a traced function in a loop is
/// stopped just after the probe's rdtsc nearly every time). Returns how long every
/// thread was stopped.
fn restore_code(
    attachment: &mut Attachment,
    process: &StoppedProcess,
    undo: &[install::Undo],
    keep: Option<i32>,
) -> Result<Duration> {
    let pid = process.pid();
    attachment
        .stop_all()
        .map_err(|e| Failure::runtime(e.to_string()))?;
    let stopped = Instant::now();
    let restored = install::uninstall(process, undo)
        .map_err(|e| Failure::runtime(format!("cannot restore the code of pid {pid}: {e}")));
    let held = stopped.elapsed();
    for tid in attachment.tids() {
        if Some(tid) != keep {
            attachment.resume(tid);
        }
    }
    restored?;
    glass_target::test_hook("detach-code-restored");
    // Long enough for a thread to finish the probe it was in.
    std::thread::sleep(Duration::from_millis(1));
    Ok(held)
}

/// The second half (after [`restore_code`]), with every thread stopped outside the
/// runtime and the trampolines: gives every call in flight (the shadow stacks of the
/// session the runtime mapped at `session_at`, read through the process's memory) its
/// real return address, and clears each thread's area word. Returns the calls in flight.
fn take_out(process: &StoppedProcess, tids: &[i32], session_at: u64) -> Result<u64> {
    use glass_probe_abi::{area, header};
    let pid = process.pid();
    let word = |at: u64| process.read_u64(at).unwrap_or(0);
    let stub = word(session_at + header::EXIT_STUB as u64);
    let areas = word(session_at + header::NEXT_AREA as u64)
        .min(word(session_at + header::AREA_COUNT as u64));
    let stride = word(session_at + header::AREA_STRIDE as u64);
    // Calls in flight return straight to their callers: the slots get their addresses
    // back, the innermost first (tail calls share a slot; the outermost entry holds
    // the real address).
    let mut in_flight = 0;
    for index in 0..areas {
        let base = session_at + header::SIZE as u64 + index * stride;
        if word(base + area::PID as u64) != pid as u64 {
            continue;
        }
        let depth = word(base + area::DEPTH as u64).min(area::SHADOW_CAPACITY as u64);
        let Ok(entries) = process.read(
            base + area::SHADOW as u64,
            depth as usize * area::SHADOW_ENTRY,
        ) else {
            continue;
        };
        in_flight += depth;
        for entry in entries.chunks_exact(area::SHADOW_ENTRY).rev() {
            let slot = u64::from_le_bytes(entry[..8].try_into().unwrap());
            let real = &entry[8..16];
            if word(slot) == stub {
                let _ = process.write(slot, real);
            }
        }
        let _ = process.write(base + area::DEPTH as u64, &0u64.to_le_bytes());
    }
    // Each thread claims a fresh area in the next session. (An offset of 0 would be the
    // thread's own TCB pointer: never written.)
    let offset = word(session_at + header::TLS_OFFSET as u64);
    for &tid in tids.iter().filter(|_| offset != 0) {
        if let Ok(regs) = registers(tid) {
            let _ = process.write(regs.fs_base.wrapping_add(offset), &0u64.to_le_bytes());
        }
    }
    Ok(in_flight)
}

/// If the runtime holds a ledger, another glass attached: while it lives, the process is
/// refused (one line, exit 2); if it died, its instrumentation is taken out (every thread
/// stopped, then all but the loader thread let go) and the runtime lets its session go.
/// Returns the dead glass's pid, or None when there was no ledger.
fn recover(
    attachment: &mut Attachment,
    process: &StoppedProcess,
    runtime_at: &[u64],
) -> Result<Option<u64>> {
    let pid = process.pid();
    let ledger_at = process.read_u64(runtime_at[LEDGER]).unwrap_or(0);
    let ledger = match ledger_at {
        0 => None,
        at => Ledger::read(process, at).ok().flatten(),
    };
    let Some((ledger, ledger_len)) = ledger else {
        return Ok(None);
    };
    if ledger.writer_alive() && ledger.writer_pid != std::process::id() as u64 {
        return Err(Failure::bad_input(format!(
            "pid {pid} is already being traced by glass pid {}: one glass at a time",
            ledger.writer_pid
        )));
    }
    glass_target::test_hook("recover");
    // A ledger without a session (its glass died before the runtime joined one, or
    // before it patched anything) has nothing to put back.
    if ledger.session != 0 {
        let mappings = glass_target::procfs::executable_mappings(pid).unwrap_or_default();
        let runtime_text: Vec<Span> = mappings
            .iter()
            .filter(|m| m.path.contains("libglass_probe"))
            .map(|m| Span {
                start: m.start,
                end: m.end,
            })
            .collect();
        let regions: Vec<Span> = ledger
            .regions
            .iter()
            .map(|&(start, len)| Span {
                start,
                end: start + len,
            })
            .collect();
        let late =
            ledger.restore.len() - (ledger.unwinder_hooks as usize).min(ledger.restore.len());
        let (code, hooks) = ledger.restore.split_at(late);
        let undo = |restore: &[(u64, Vec<u8>)]| install::Undo {
            restore: restore.to_vec(),
            region: (0, 0),
            moves: Vec::new(),
        };
        restore_code(attachment, process, &[undo(code)], Some(process.tid()))?;
        let back = moves_back(ledger.moves.iter().copied());
        let inside = |rip: u64| within(&regions, rip);
        let leave = Leave {
            inside: &inside,
            spans: &runtime_text,
            moves: &back,
        };
        stop_at_safe_points(attachment, &leave, Some(process.tid()))?;
        install::uninstall(process, &[undo(hooks)])
            .map_err(|e| Failure::runtime(format!("cannot restore the GOT of pid {pid}: {e}")))?;
        take_out(process, &attachment.tids(), ledger.session)?;
    }
    // Ends the session if the runtime joined one (ENOENT if not).
    process
        .call(runtime_at[1], &[], CALL_LIMIT)
        .map_err(|e| Failure::runtime(format!("cannot end the old session in pid {pid}: {e}")))?;
    let _ = process.write(runtime_at[LEDGER], &0u64.to_le_bytes());
    // An older glass's trap page; glass's landing now stays for the process's life.
    if ledger.trap != 0 && ledger.trap != process.landing() {
        process.unmap(ledger.trap, 4096);
    }
    process.unmap(ledger_at, ledger_len);
    attachment.resume_all_but(process.tid());
    Ok(Some(ledger.writer_pid))
}

/// What the guardian does when glass died: if pid's runtime holds a dead glass's ledger,
/// takes that glass's instrumentation out, as the next attach would (and nothing else:
/// no runtime is loaded, no session joined). Returns the dead glass's pid, or None when
/// there was nothing to take out.
pub fn take_over(pid: i32) -> Result<Option<u64>> {
    let runtime = super::probe_runtime()?;
    let Some(runtime_symbols) = FileSymbols::read(&runtime, &RUNTIME_SYMBOLS) else {
        return Ok(None);
    };
    let Some(runtime_at) = runtime_symbols
        .in_process(pid)
        .and_then(|a| a.into_iter().collect::<Option<Vec<u64>>>())
    else {
        return Ok(None);
    };
    let mem = std::fs::File::open(format!("/proc/{pid}/mem"))
        .map_err(|e| Failure::runtime(format!("cannot read the memory of pid {pid}: {e}")))?;
    let word = |at: u64| {
        let mut bytes = [0u8; 8];
        std::os::unix::fs::FileExt::read_exact_at(&mem, &mut bytes, at)
            .map(|()| u64::from_le_bytes(bytes))
            .unwrap_or(0)
    };
    if word(runtime_at[LEDGER]) == 0 {
        return Ok(None);
    }
    let mappings = glass_target::procfs::executable_mappings(pid)
        .map_err(|e| Failure::runtime(format!("cannot read the mappings of pid {pid}: {e}")))?;
    let Some(loader) = loader_functions(pid, &mappings) else {
        return Ok(None);
    };
    let mut attachment = Attachment::seize(pid).map_err(|e| Failure::runtime(e.to_string()))?;
    let loader_code = spans_of(&mappings, &["ld-linux", "ld-2.", "ld64"]);
    let libc_code = spans_of(&mappings, &["libc.so", "libc-", "libdl"]);
    let loader_tid = pick_loader_thread(&mut attachment, &loader_code, &libc_code)?;
    let mut process = StoppedProcess::for_thread(pid, loader_tid)
        .map_err(|e| Failure::runtime(format!("cannot open the memory of pid {pid}: {e}")))?;
    process.use_libc(loader.calls);
    if !process.reuse_landing(word(runtime_at[LANDING])) {
        let placed = landing_site(pid).is_some_and(|site| {
            process.reuse_landing(site.at) || process.place_landing(site.at).is_ok()
        });
        if !placed {
            process
                .map_landing()
                .map_err(|e| Failure::runtime(format!("cannot map a landing in pid {pid}: {e}")))?;
        }
    }
    let taken = recover(&mut attachment, &process, &runtime_at);
    return_landing(&process, runtime_at[LANDING]);
    attachment.release();
    taken
}

/// Takes the instrumentation out.
fn detach(pid: i32, attached: &Attached, session_at: u64) -> Result<Detached> {
    let mut attachment = Attachment::seize(pid).map_err(|e| {
        Failure::runtime(format!(
            "cannot stop pid {pid} to detach: {e}; its probes stay in place, recording nothing"
        ))
    })?;
    let writer = StoppedProcess::for_thread(pid, pid)
        .map_err(|e| Failure::runtime(format!("cannot open the memory of pid {pid}: {e}")))?;
    let code_held = restore_code(&mut attachment, &writer, &attached.undo, None)?;
    let regions: Vec<Span> = attached
        .undo
        .iter()
        .filter(|u| u.region.1 > 0)
        .map(|u| Span {
            start: u.region.0,
            end: u.region.0 + u.region.1,
        })
        .collect();
    let back = moves_back(attached.undo.iter().flat_map(|u| u.moves.iter().copied()));
    let inside = |rip: u64| within(&regions, rip);
    let leave = Leave {
        inside: &inside,
        spans: &attached.runtime_text,
        moves: &back,
    };
    let moved = stop_at_safe_points(&mut attachment, &leave, None)?;
    let stopped = Instant::now();
    glass_target::test_hook("detach-stopped");
    let tids = attachment.tids();
    let mut process = StoppedProcess::for_thread(pid, tids[0])
        .map_err(|e| Failure::runtime(format!("cannot open the memory of pid {pid}: {e}")))?;
    process.use_libc(attached.libc);
    process.reuse_landing(attached.landing);
    install::uninstall(&process, std::slice::from_ref(&attached.hooks_undo))
        .map_err(|e| Failure::runtime(format!("cannot restore the GOT of pid {pid}: {e}")))?;
    let in_flight = take_out(&process, &tids, session_at)?;
    glass_target::test_hook("detach-restored");
    // Only the runtime's own state is left, which no thread can reach any more: the
    // others go now, and one stays to unmap the session and the ledger.
    attachment.release_all_but(tids[0]);
    let all_stopped = stopped.elapsed().as_nanos() as u64;
    let _ = process.write(attached.ledger_slot, &0u64.to_le_bytes());
    let (ledger_at, ledger_len) = attached.ledger_at;
    process.unmap(ledger_at, ledger_len);
    let left = leave_runtime(&process, attached.leave);
    return_landing(&process, attached.landing_word);
    left?;
    attachment.release();
    Ok(Detached {
        stopped_ns: all_stopped + code_held.as_nanos() as u64,
        unmap_ns: stopped.elapsed().as_nanos() as u64 - all_stopped,
        in_flight,
        moved,
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_dlopen_in_this_process() {
        let pid = std::process::id() as i32;
        let mappings = glass_target::procfs::executable_mappings(pid).unwrap();
        let loader = loader_functions(pid, &mappings).expect("glibc >= 2.34");
        assert_eq!(loader.dlopen, libc::dlopen as *const () as u64);
        assert_eq!(loader.dlerror, libc::dlerror as *const () as u64);
        assert_eq!(loader.dlsym, Some(libc::dlsym as *const () as u64));
    }
}
