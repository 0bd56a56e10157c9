//! `glass trace --vm -f GLOBS -- qemu-system-x86_64 ARGS`: every call of chosen functions
//! of a guest kernel timed from outside the guest, nothing added to its image.
//!
//! glass launches QEMU with a GDB stub of its own and a 2 MiB RAM region the guest does
//! not know (a `pc-dimm` at guest-physical 4 GiB, outside the memory map the guest is
//! given, backed by a memfd glass shares). Once the guest runs its own code in long mode,
//! glass stops it and, with every vCPU stopped:
//! - maps the region into the guest's page tables at a virtual range it does not use:
//!   the top 2 GiB through a top-level entry that must be empty, with the page-table
//!   pages inside the region, reachable by `jmp rel32` from a kernel linked in the low
//!   2 GiB (`layout`);
//! - writes a call-style trampoline per function there (`glass_patch::call_trampoline`:
//!   no per-thread state, call and return kept paired), through the shared memfd: no
//!   code ran there, so QEMU holds no translation of it;
//! - writes each entry jump through the stub, which makes QEMU drop the translated code
//!   of those bytes (docs/guests.md), and moves a vCPU stopped inside them to their
//!   relocated copy;
//! - lets the VM run, and drains the region's ring from the shared memfd while it runs
//!   (`replay` turns its records into the process tracer's per-thread streams, one per
//!   guest stack).
//!
//! Functions that may read arguments from the stack are left alone, with the reason:
//! the trampoline's call shifts them (`glass_patch::stack_args`). The VM is glass's: it
//! ends with the trace (the run ends when the guest powers off, after `-d`, or on
//! Ctrl-C/SIGTERM), and QEMU is killed by the kernel if glass dies
//! (PR_SET_PDEATHSIG), so no VM is ever left stopped. glass-record's guardian bounds
//! the one stop glass holds (the patch): a glass stopped or stalled in it past the stop
//! bound is killed, and the VM with it.

mod aarch64;
pub(crate) mod attach;
pub(crate) mod gdb;
mod layout;
pub(crate) mod xen;

use std::io::Write as _;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use glass_format::{Meta, Record, TraceSummary};
use glass_patch::call_trampoline;
use glass_patch::stack_args::{argument_passing, Arguments};
use glass_record::monotonic_now_ns;
use glass_target::arch::VcpuRegs;
use glass_target::gdbstub::client::Client;
use glass_target::guest_code::GuestCode;

use crate::install::Installed;
use crate::replay;
use crate::select::{self, SkipReason};
use crate::{Failure, Output, Result, Skip, TraceNotes, TraceOptions, Traced};
use layout::Layout;

/// Set by SIGINT, SIGTERM and SIGHUP: the trace ends.
static ENDING: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    ENDING.store(true, Ordering::Relaxed);
}

/// SIGINT, SIGTERM and SIGHUP end the trace (the code is put back, the recording
/// finished) instead of killing glass; also where the shell that started glass in the
/// background had SIGINT ignored.
pub(crate) fn end_on_signals() {
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::signal(signal, on_signal as *const () as libc::sighandler_t);
        }
    }
}

pub(crate) fn run(args: &TraceOptions, notes: &mut dyn TraceNotes) -> Result<Traced> {
    let command = &args.command;
    let program = command
        .first()
        .ok_or_else(|| Failure::bad_input("--vm needs the QEMU command after --"))?;
    let name = Path::new(program)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let arch = if name.starts_with("qemu-system-x86_64") {
        glass_format::Arch::X86_64
    } else if name.starts_with("qemu-system-aarch64") {
        glass_format::Arch::Aarch64
    } else {
        return Err(Failure::bad_input(format!(
            "--vm traces the guests of qemu-system-x86_64 and qemu-system-aarch64 (-M virt), not {program}"
        )));
    };
    if arch == glass_format::Arch::Aarch64 {
        aarch64::check_command(command)?;
    }
    if !args.libcalls.is_empty() || !args.lib.is_empty() || args.pmc.is_some() {
        return Err(Failure::bad_input(
            "--libcalls, --lib and --pmc are for processes, not --vm",
        ));
    }
    let value_of = |flag: &str| {
        command
            .iter()
            .position(|a| a == flag)
            .and_then(|i| command.get(i + 1))
            .cloned()
    };
    if value_of("-gdb").is_some() || command.iter().any(|a| a.contains("pc-dimm")) {
        return Err(Failure::bad_input(
            "--vm adds its own -gdb and a pc-dimm for its region: leave them out",
        ));
    }
    let symbols = match (&args.symbols, value_of("-kernel")) {
        (Some(symbols), _) => symbols.clone(),
        (None, Some(kernel)) => PathBuf::from(kernel),
        (None, None) => {
            return Err(Failure::bad_input(
                "--vm needs -kernel in the QEMU command or --symbols",
            ))
        }
    };
    let ram_mib = match value_of("-m") {
        Some(m) => parse_ram_mib(&m).ok_or_else(|| {
            Failure::bad_input(format!(
                "--vm: cannot read -m {m} (give the RAM alone, e.g. -m 64 or -m 1G: glass adds the slot for its region)"
            ))
        })?,
        None => 128,
    };
    if arch == glass_format::Arch::X86_64 && ram_mib > MAX_RAM_MIB {
        return Err(Failure::bad_input(format!(
            "--vm: a guest of {ram_mib} MiB has RAM above 4 GiB, where glass puts its region (at most {MAX_RAM_MIB} MiB for now)"
        )));
    }
    let (choice, skipped) = choose_for(arch, &symbols, &args.functions)?;
    let file = glass_record::PendingOutput::open(&args.output)?;

    // x86-64: the memfd is the region (a pc-dimm); AArch64: the guest's RAM and the
    // region after it (see `aarch64`).
    let (region_offset, memfd_bytes, region_gpa) = match arch {
        glass_format::Arch::X86_64 => (0, layout::REGION_BYTES, REGION_GPA),
        glass_format::Arch::Aarch64 => {
            let (offset, total) = aarch64::ram_layout(ram_mib);
            (offset, total, aarch64::RAM_BASE + offset)
        }
    };
    let dtb = match arch {
        glass_format::Arch::Aarch64 => {
            Some(aarch64::write_device_tree(command, ram_mib, memfd_bytes)?)
        }
        glass_format::Arch::X86_64 => None,
    };
    let region = region_memfd(memfd_bytes)?;
    // SAFETY: glass's own memfd, sized; shared with QEMU, which maps it as guest RAM.
    let mut shared = unsafe {
        memmap2::MmapOptions::new()
            .offset(region_offset)
            .len(layout::REGION_BYTES as usize)
            .map_mut(&region)
    }
    .map_err(|e| Failure::runtime(format!("cannot map the trace region: {e}")))?;
    let socket = std::env::temp_dir().join(format!("glass-trace-vm-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&socket);
    // The stop bound: a glass stopped (SIGSTOP, Ctrl-Z) or stalled while it holds the VM
    // stopped is killed by its guardian, which then ends the VM, glass's own (as when
    // glass dies: QEMU reports its pid into the guardian's pipe before it execs).
    let mark =
        glass_target::stop_mark::StopMark::create().map_err(|e| Failure::runtime(e.to_string()))?;
    let guardian = glass_record::guardian::Guardian::start(
        &socket.to_string_lossy(),
        true,
        false,
        &mark,
        glass_record::stop_bound()?,
    )
    .map_err(|e| Failure::runtime(e.to_string()))?;
    let launched = launch(
        command,
        (ram_mib, memfd_bytes, dtb.as_deref()),
        &region,
        &socket,
        guardian.pipe_fd(),
    );
    let mut qemu = match launched {
        Ok(qemu) => qemu,
        Err(failure) => {
            if let Some(dtb) = &dtb {
                let _ = std::fs::remove_file(dtb);
            }
            return Err(failure);
        }
    };
    end_on_signals();
    let traced = trace_launched(
        args,
        notes,
        (&mut qemu, &mark),
        &socket,
        (&mut shared, region_gpa, arch == glass_format::Arch::Aarch64),
        (&symbols, choice, skipped),
        file,
    );
    let _ = std::fs::remove_file(&socket);
    if let Some(dtb) = &dtb {
        let _ = std::fs::remove_file(dtb);
    }
    if qemu.try_wait().ok().flatten().is_none() {
        let _ = qemu.kill();
        let _ = qemu.wait();
    }
    guardian.done();
    traced
}

/// The guest RAM above which `pc`'s RAM continues past 4 GiB, where the region goes.
const MAX_RAM_MIB: u64 = 2816;

/// Where QEMU puts the region: the start of `pc`'s device memory, 4 GiB.
const REGION_GPA: u64 = 1 << 32;

/// `-m`'s RAM in MiB: `64`, `64M`, `1G`, `size=64M`.
fn parse_ram_mib(value: &str) -> Option<u64> {
    let size = value.strip_prefix("size=").unwrap_or(value);
    if size.contains(',') {
        return None;
    }
    let (digits, unit) = match size.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((at, _)) => size.split_at(at),
        None => (size, "M"),
    };
    let number: u64 = digits.parse().ok()?;
    match unit {
        "M" | "m" | "MB" | "MiB" => Some(number),
        "G" | "g" | "GB" | "GiB" => number.checked_mul(1024),
        _ => None,
    }
}

/// The functions of a guest to patch, with their plans, and those left alone: an
/// x86-64 or AArch64 guest as its image (`symbols`) is.
fn choose(symbols: &Path, patterns: &[String]) -> Result<(select::ModuleChoice, Vec<Skip>)> {
    choose_for(image_arch(symbols)?, symbols, patterns)
}

/// The architecture of the guest image `symbols`.
fn image_arch(symbols: &Path) -> Result<glass_format::Arch> {
    use object::Object;
    let bytes = std::fs::read(symbols)
        .map_err(|e| Failure::bad_input(format!("cannot read {}: {e}", symbols.display())))?;
    let elf = object::File::parse(&*bytes)
        .map_err(|_| Failure::bad_input(format!("{} is not an ELF file", symbols.display())))?;
    match elf.architecture() {
        object::Architecture::X86_64 => Ok(glass_format::Arch::X86_64),
        object::Architecture::Aarch64 => Ok(glass_format::Arch::Aarch64),
        other => Err(Failure::bad_input(format!(
            "{} is built for {other:?}: glass traces x86-64 and AArch64 guests",
            symbols.display()
        ))),
    }
}

/// The architecture `choose` planned for.
fn choice_arch(choice: &select::ModuleChoice) -> glass_format::Arch {
    if choice.arm_patchable.is_empty() {
        glass_format::Arch::X86_64
    } else {
        glass_format::Arch::Aarch64
    }
}

/// The functions of a guest of `arch` to patch, with their plans, and those left alone.
fn choose_for(
    arch: glass_format::Arch,
    symbols: &Path,
    patterns: &[String],
) -> Result<(select::ModuleChoice, Vec<Skip>)> {
    let built_for = image_arch(symbols)?;
    if built_for != arch {
        return Err(Failure::bad_input(format!(
            "{} is an {built_for:?} image, the VM an {arch:?} one",
            symbols.display()
        )));
    }
    let mut choice = select::read_module_of(
        match arch {
            glass_format::Arch::X86_64 => object::Architecture::X86_64,
            glass_format::Arch::Aarch64 => object::Architecture::Aarch64,
        },
        symbols,
        patterns,
        &[],
        false,
        false,
    )
    .map_err(Failure::bad_input)?;
    if choice.matched == 0 {
        return Err(Failure::NothingToPatch(format!(
            "no function of {} matches {}",
            symbols.display(),
            patterns.join(",")
        )));
    }
    let bytes = std::fs::read(symbols)
        .map_err(|e| Failure::bad_input(format!("cannot read {}: {e}", symbols.display())))?;
    let elf = object::File::parse(&*bytes)
        .map_err(|_| Failure::bad_input(format!("{} is not an ELF file", symbols.display())))?;
    let arguments = argument_passing(&elf);
    let module = symbols.display().to_string();
    let mut skipped: Vec<Skip> = choice
        .skipped
        .drain(..)
        .map(|(function, reason)| Skip {
            module: module.clone(),
            address: function.address,
            name: function.name,
            reason,
        })
        .collect();
    // Why a function cannot be called from a trampoline: the trampoline's call shifts
    // arguments passed on the stack (on AArch64 by the 16 bytes of its frame record:
    // the x86-64 rule refuses whatever AAPCS64 may pass on the stack, see
    // glass_patch::aarch64_call).
    let unsafe_to_call = |function: &glass_patch::Function| -> Option<String> {
        if function.name.contains(".isra") || function.name.contains(".part") {
            Some("a compiler's clone, whose arguments are not the ones DWARF declares".into())
        } else {
            match arguments.get(&function.address) {
                Some(Arguments::InRegisters) => None,
                Some(Arguments::OnStack(why)) => Some(why.clone()),
                None => Some("no DWARF describes its arguments".into()),
            }
        }
    };
    // Functions whose arguments the trampoline's call would shift are left out, with
    // the reason; entry-patched functions and short ones (traced at their direct call
    // sites, each site's displacement turned to the function's trampoline, as in
    // processes) alike.
    let mut callable = |function: &glass_patch::Function| match unsafe_to_call(function) {
        Some(why) => {
            skipped.push(Skip {
                module: module.clone(),
                address: function.address,
                name: function.name.clone(),
                reason: SkipReason::StackArguments(why),
            });
            false
        }
        None => true,
    };
    let mut patchable = std::mem::take(&mut choice.patchable);
    patchable.retain(|(function, _, _)| callable(function));
    let mut redirected = std::mem::take(&mut choice.redirected);
    redirected.retain(|(function, _, _)| callable(function));
    let mut arm_patchable = std::mem::take(&mut choice.arm_patchable);
    arm_patchable.retain(|(function, _, _)| callable(function));
    if patchable.is_empty() && redirected.is_empty() && arm_patchable.is_empty() {
        return Err(Failure::NothingToPatch(format!(
            "{}; nothing in the VM was touched",
            crate::nothing_patchable(&skipped)
        )));
    }
    let most = usize::from(call_trampoline::MAX_ID) + 1;
    patchable.truncate(most);
    redirected.truncate(most - patchable.len());
    arm_patchable.truncate(most);
    choice.patchable = patchable;
    choice.redirected = redirected;
    choice.arm_patchable = arm_patchable;
    Ok((choice, skipped))
}

/// The bytes the image has where each patch goes, to check against the guest's own
/// before anything is written: a `--symbols` that is not the guest's image, or code
/// that was changed, would have glass run relocated copies of instructions the guest
/// does not have.
fn image_code(symbols: &Path, patches: &[(u64, Vec<u8>)]) -> Result<Vec<Vec<u8>>> {
    use object::{Object, ObjectSection};
    let bytes = std::fs::read(symbols)
        .map_err(|e| Failure::bad_input(format!("cannot read {}: {e}", symbols.display())))?;
    let elf = object::File::parse(&*bytes)
        .map_err(|_| Failure::bad_input(format!("{} is not an ELF file", symbols.display())))?;
    patches
        .iter()
        .map(|(at, patch)| {
            let len = patch.len() as u64;
            elf.sections()
                .filter(|s| s.address() <= *at && at + len <= s.address() + s.size())
                .find_map(|s| {
                    let data = s.data().ok()?;
                    let from = (at - s.address()) as usize;
                    data.get(from..from + len as usize).map(<[u8]>::to_vec)
                })
                .ok_or_else(|| {
                    Failure::bad_input(format!("{} has no code at {at:#x}", symbols.display()))
                })
        })
        .collect()
}

/// Whether the guest's code (`found`, read with the VM stopped) is the image's where
/// glass patches: else which function differs, as bad input (nothing was written).
fn check_code(
    symbols: &Path,
    found: &[(u64, Vec<u8>)],
    image: &[Vec<u8>],
    installed: &[Installed],
) -> Result<()> {
    for (((at, guest), image), function) in found.iter().zip(image).zip(installed) {
        if guest != image {
            return Err(Failure::bad_input(format!(
                "the guest's code at {at:#x} ({}) is not what {} has there: --symbols is not the image the guest runs (or its code was changed since); nothing was patched",
                function.name,
                symbols.display()
            )));
        }
    }
    Ok(())
}

/// The region's memory (`bytes`: on AArch64 the guest's RAM too): a memfd QEMU
/// inherits (it never has a name in the file system).
fn region_memfd(bytes: u64) -> Result<OwnedFd> {
    // SAFETY: memfd_create with a static name; the descriptor is owned at once.
    let fd = unsafe { libc::memfd_create(c"glass-trace-region".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(Failure::runtime(format!(
            "cannot create the trace region: {}",
            std::io::Error::last_os_error()
        )));
    }
    // SAFETY: fd was just created and is ours.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sizing our own memfd.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), bytes as libc::off_t) } != 0 {
        return Err(Failure::runtime(format!(
            "cannot size the trace region: {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(fd)
}

/// Starts QEMU with its stub on `socket` and the region as a pc-dimm (AArch64: as the
/// RAM's last 2 MiB, `total` bytes of it, with the device tree `dtb`); waits for the
/// stub.
fn launch(
    command: &[String],
    (ram_mib, total, dtb): (u64, u64, Option<&Path>),
    region: &OwnedFd,
    socket: &Path,
    guardian_pipe: std::os::fd::RawFd,
) -> Result<std::process::Child> {
    use std::os::unix::process::CommandExt;
    let program = &command[0];
    let raw = region.as_raw_fd();
    let mut qemu = std::process::Command::new(program);
    if dtb.is_some() {
        qemu.args(aarch64::arguments(command, raw, total, dtb));
    } else {
        let mut arguments: Vec<String> = Vec::with_capacity(command.len() + 10);
        let mut rest = command[1..].iter();
        while let Some(argument) = rest.next() {
            if argument == "-m" {
                rest.next();
                continue;
            }
            arguments.push(argument.clone());
        }
        qemu.args(&arguments)
            .arg("-m")
            .arg(format!("{ram_mib}M,slots=1,maxmem={}M", ram_mib + 1024))
            .arg("-object")
            .arg(format!(
                "memory-backend-file,id=glass-region,size={}M,mem-path=/proc/self/fd/{raw},share=on",
                layout::REGION_BYTES >> 20
            ))
            .arg("-device")
            .arg(format!(
                "pc-dimm,id=glass-dimm,memdev=glass-region,addr={REGION_GPA:#x}"
            ));
    }
    qemu.arg("-gdb")
        .arg(format!("unix:{},server=on,wait=off", socket.display()))
        // Ctrl-C at the terminal is glass's to handle: it ends the trace, then the VM.
        .process_group(0);
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        qemu.pre_exec(move || {
            // The VM is glass's: it must not outlive a glass that dies, stopped.
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            glass_target::launch::prepare_vmm_child(raw)?;
            glass_record::guardian::report_vm_pid(guardian_pipe);
            Ok(())
        });
    }
    let mut child = qemu.spawn().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Failure::bad_input(format!("{program}: not found")),
        _ => Failure::runtime(format!("cannot start {program}: {e}")),
    })?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::os::unix::net::UnixStream::connect(socket).is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(Failure::bad_input(format!(
                "the VM did not start: {program} exited before its GDB stub came up ({status})"
            )));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(Failure::runtime(
                "the VM did not start: QEMU's GDB stub did not come up within 30 s (QEMU killed)",
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(child)
}

fn stub_failure(what: &str, e: impl std::fmt::Display) -> Failure {
    Failure::runtime(format!("{what}: {e}"))
}

/// Patches the launched guest once it runs its own code, then drains until the VM ends.
fn trace_launched(
    args: &TraceOptions,
    notes: &mut dyn TraceNotes,
    (qemu, mark): (&mut std::process::Child, &glass_target::stop_mark::StopMark),
    socket: &Path,
    (shared, region_gpa, started_stopped): (&mut memmap2::MmapMut, u64, bool),
    (symbols, choice, skipped): (&Path, select::ModuleChoice, Vec<Skip>),
    output: glass_record::PendingOutput,
) -> Result<Traced> {
    let clock_start = (glass_probe_abi::rdtsc(), monotonic_now_ns());
    // A VM started stopped (`-S`: an AArch64 kernel loaded by QEMU itself reaches its
    // first traced call within milliseconds) stays so until the breakpoints are set.
    let connected = if started_stopped {
        Client::connect_held(&socket.to_string_lossy(), Some(mark))
    } else {
        Client::connect_marked(&socket.to_string_lossy(), Some(mark))
    };
    let mut client =
        connected.map_err(|e| stub_failure("cannot connect to the VM's GDB stub", e))?;
    mark.end();
    let vcpus = client.vcpus.len();
    let mut regs = vec![VcpuRegs::zeroed(client.arch()); vcpus];
    let entries: Vec<u64> = choice
        .patchable
        .iter()
        .map(|(_, plan, _)| plan.patch_at)
        .chain(
            choice
                .arm_patchable
                .iter()
                .map(|(_, plan, _)| plan.patch_at),
        )
        .collect();
    wait_for_guest(&mut client, qemu, &entries, &mut regs)?;
    // From the breakpoint's stop to the resume after patching, glass holds the VM.
    mark.begin();
    let arch = client.arch();
    let mut choice = choice;
    let mut skipped = skipped;
    let chosen = place_region(&mut client, &regs, region_gpa, &mut choice, &mut skipped);
    let counter_hz = counter_hz(&mut client, arch);
    let (layout, counter_hz) = match chosen.and_then(|layout| counter_hz.map(|hz| (layout, hz))) {
        Ok(chosen) => chosen,
        Err(failure) => {
            let _ = client.resume();
            mark.end();
            return Err(failure);
        }
    };
    if let Some(note) = choice.far_note() {
        notes.note(&note);
    }
    let layout::Installation {
        installed,
        patches,
        moves,
        ..
    } = match layout.install(
        &mut shared[..layout::IMAGE_BYTES as usize],
        &choice,
        symbols,
        &mut skipped,
    ) {
        Ok(done) => done,
        Err(why) => {
            let _ = client.resume();
            mark.end();
            return Err(Failure::runtime(why));
        }
    };
    // The guest's code is read and written through a vCPU that maps it (the stub's
    // memory packets go through the selected vCPU's translation: an AArch64 vCPU 1 that
    // PSCI has not started yet has its MMU off).
    let mapping = regs.iter().position(runs_own_code).unwrap_or(0);
    let patched = image_code(symbols, &patches).and_then(|image| {
        client
            .select(mapping)
            .map_err(|e| stub_failure("cannot select a vCPU", e))?;
        let mut found = Vec::with_capacity(patches.len());
        for (at, bytes) in &patches {
            let code = client
                .read_memory(*at, bytes.len())
                .map_err(|e| stub_failure("cannot read the guest's code", e))?;
            found.push((*at, code));
        }
        check_code(symbols, &found, &image, &installed)?;
        patch(&mut client, &layout, &patches, &moves)?;
        // Nothing refused: the recording begins (a failure here ends the VM, glass's).
        output.start().map_err(Failure::from)
    });
    let file = match patched {
        Ok(file) => file,
        Err(failure) => {
            let _ = client.resume();
            mark.end();
            return Err(failure);
        }
    };
    glass_target::test_hook("guest-vm-patched");
    client
        .resume()
        .map_err(|e| stub_failure("cannot let the VM run", e))?;
    mark.end();
    notes.instrumented(&installed, &skipped);

    let mut out = Output::new(file, 1);
    write_header(&mut out, args, (qemu.id(), arch), &installed, &skipped);
    let mut replay = replay::Replay::default();
    let mut ring = layout::RingReader::default();
    let pid = qemu.id();
    let why = drain_until(
        (
            &layout::Words(&shared[..]),
            &mut ring,
            &mut replay,
            &mut out,
        ),
        pid,
        args.duration,
        || {
            qemu.try_wait()
                .ok()
                .flatten()
                .map(|status| Ended::Exited(status.code().unwrap_or(1)))
        },
    );
    // What the guest wrote before it ended is in the memfd still.
    ring.drain(&layout::Words(&shared[..]), &mut replay);
    replay.take(|stack, words| out.chunk(pid, stack, words));
    if !matches!(why, Ended::Exited(_)) {
        // The VM ends with the trace: stopped first, so that what the guest wrote up to
        // now is all in the ring.
        let _ = client.stop();
        ring.drain(&layout::Words(&shared[..]), &mut replay);
        replay.take(|stack, words| out.chunk(qemu.id(), stack, words));
    }
    drop(client);
    let exit_status = match why {
        Ended::Exited(status) => status,
        Ended::Signal | Ended::Duration => 0,
    };
    let summary = finish(
        &mut out,
        args,
        (clock_start, counter_hz),
        &ring,
        &replay,
        installed.len(),
        skipped.len(),
        exit_status,
    )?;
    if replay.unmatched_exits > 0 || replay.in_flight() > 0 {
        notes.note(&format!(
            "{} calls were under way when the probes went in or when the VM ended: not timed",
            replay.unmatched_exits + replay.in_flight()
        ));
    }
    Ok(Traced {
        exit_status,
        records: out.records,
        summary,
        generic_timer: counter_hz.is_some(),
    })
}

enum Ended {
    Exited(i32),
    Signal,
    Duration,
}

/// Drains the ring into the recording while the guest runs, until the VM ends
/// (`ended`), a stop signal, or the duration.
fn drain_until(
    (region, ring, replay, out): (
        &dyn layout::RegionAccess,
        &mut layout::RingReader,
        &mut replay::Replay,
        &mut Output,
    ),
    pid: u32,
    duration: Option<f64>,
    mut ended: impl FnMut() -> Option<Ended>,
) -> Ended {
    let started = Instant::now();
    loop {
        let drained = ring.drain(region, replay);
        replay.take(|stack, words| out.chunk(pid, stack, words));
        if let Some(why) = ended() {
            return why;
        }
        if ENDING.load(Ordering::Relaxed) {
            return Ended::Signal;
        }
        if duration.is_some_and(|d| started.elapsed() >= Duration::from_secs_f64(d)) {
            return Ended::Duration;
        }
        if drained < 1024 {
            std::thread::sleep(region.drain_every());
        }
    }
}

/// The lowest and highest address of the code to patch: the functions' entries and
/// the call sites of those traced there.
fn text_span(choice: &select::ModuleChoice) -> (u64, u64) {
    let spans = choice
        .patchable
        .iter()
        .map(|(f, _, _)| (f.address, f.address + f.size))
        .chain(
            choice
                .arm_patchable
                .iter()
                .map(|(f, _, _)| (f.address, f.address + f.size)),
        )
        .chain(choice.redirected.iter().flat_map(|(_, _, sites)| {
            sites
                .iter()
                .map(|site| (site.at, site.at + u64::from(site.len)))
        }));
    let (low, high) = spans.fold((u64::MAX, 0), |(low, high), (start, end)| {
        (low.min(start), high.max(end))
    });
    (if high == 0 { 0 } else { low }, high)
}

/// Breakpoints glass sets to catch the guest's first call of a traced function.
const MAX_BREAKPOINTS: usize = 256;

/// Lets the guest boot until its first call of a function to trace: a breakpoint at each
/// one's patch (at most [`MAX_BREAKPOINTS`]; QEMU keeps them out of guest memory), so
/// that no call is missed and the vCPU that hit one runs the entry jump once patched.
/// Leaves the VM stopped, the breakpoints cleared, every vCPU's registers in `regs`.
fn wait_for_guest(
    client: &mut Client,
    qemu: &mut std::process::Child,
    entries: &[u64],
    regs: &mut [VcpuRegs],
) -> Result<()> {
    let caught = &entries[..entries.len().min(MAX_BREAKPOINTS)];
    let set = |client: &mut Client, set: bool| -> Result<()> {
        for &at in caught {
            client
                .breakpoint(at, set)
                .map_err(|e| stub_failure("cannot set a breakpoint in the guest", e))?;
        }
        Ok(())
    };
    client
        .stop()
        .map_err(|e| stub_failure("cannot stop the VM", e))?;
    set(client, true)?;
    client
        .resume()
        .map_err(|e| stub_failure("cannot let the VM run", e))?;
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let stopped = client
            .wait_for_stop(Duration::from_millis(100))
            .map_err(|e| match qemu.try_wait() {
                Ok(Some(status)) => Failure::bad_input(format!(
                    "the VM ended ({status}) before its guest called a function to trace"
                )),
                _ => stub_failure("the VM's GDB stub", e),
            })?;
        // A stop is the guest's first call only if a vCPU is at one of the breakpoints,
        // in long mode: multi-threaded TCG also reports stops that are not (measured:
        // one while the firmware was still loading the kernel, whose copy then wrote
        // over the patches).
        if stopped {
            client
                .stop_with_registers(regs)
                .map_err(|e| stub_failure("cannot read the vCPUs", e))?;
            let hit = regs
                .iter()
                .any(|r| caught.contains(&r.ip()) && runs_own_code(r));
            if hit {
                break;
            }
            client
                .resume()
                .map_err(|e| stub_failure("cannot let the VM run", e))?;
        }
        if ENDING.load(Ordering::Relaxed) || Instant::now() > deadline {
            client
                .stop()
                .map_err(|e| stub_failure("cannot stop the VM", e))?;
            set(client, false)?;
            return Err(Failure::runtime(
                "the guest called none of the functions to trace (glass waited for 300 s, or was told to end)",
            ));
        }
    }
    set(client, false)?;
    client
        .stop_with_registers(regs)
        .map_err(|e| stub_failure("cannot read the vCPUs", e))?;
    let long_mode = regs.iter().all(|r| !r.paging_on() || runs_own_code(r));
    if !long_mode {
        return Err(Failure::bad_input(
            "the guest runs the functions to trace outside long mode: glass traces 64-bit guests",
        ));
    }
    Ok(())
}

/// Whether a vCPU runs the guest's own code as glass patches it: x86-64 in long mode,
/// AArch64 with its MMU on.
fn runs_own_code(regs: &VcpuRegs) -> bool {
    match regs {
        VcpuRegs::X86_64(x) => x.long_mode(),
        VcpuRegs::Aarch64(a) => a.mmu_on(),
    }
}

/// With every vCPU stopped: the region's top-level entry, the entry jumps (through the
/// stub), and the vCPUs inside the replaced bytes moved to their relocated copies.
fn patch(
    target: &mut dyn GuestCode,
    layout: &Layout,
    patches: &[(u64, Vec<u8>)],
    moves: &[(u64, u64)],
) -> Result<()> {
    let (entry_at, entry) = layout.entry();
    let present = read_u64_physical(target, entry_at).map_err(Failure::runtime)?;
    if !layout.entry_is_free(present) {
        return Err(Failure::bad_input(format!(
            "the guest maps the place glass chose for its region now ({}): try again",
            layout.hang()
        )));
    }
    target
        .write_physical(entry_at, &entry.to_le_bytes())
        .map_err(|e| Failure::runtime(format!("cannot map glass's region in the guest: {e}")))?;
    // Before the jumps are written: a backend that lets the guest run a moment to have
    // a vCPU leave the bytes they replace (Xen) needs those bytes still whole. (None to
    // move, no vCPU is looked at; the stub's looks at every vCPU and selects one that
    // maps the code again for the writes.)
    if !moves.is_empty() {
        target.move_vcpus(moves).map_err(|e| {
            Failure::runtime(format!("cannot move a vCPU out of the patched bytes: {e}"))
        })?;
    }
    for (at, bytes) in patches {
        target
            .write_virtual(*at, bytes)
            .map_err(|e| Failure::runtime(format!("cannot write the guest's code: {e}")))?;
    }
    Ok(())
}

/// The u64 at guest-physical `address`.
fn read_u64_physical(target: &mut dyn GuestCode, address: u64) -> std::result::Result<u64, String> {
    let bytes = target.read_physical(address, 8)?;
    Ok(u64::from_le_bytes(
        bytes[..8].try_into().unwrap_or_default(),
    ))
}

/// CR3 (the table's address) of the first vCPU in long mode.
fn long_mode_cr3(regs: &[VcpuRegs]) -> Result<u64> {
    // Under multi-threaded TCG the vCPU that made the first traced call may run 64-bit
    // code while vCPU 0 is still in its 32-bit boot code (measured with the demo: vCPU 1
    // at checkpoint, vCPU 0 paging off); the other vCPUs load the same tables when they
    // get there.
    regs.iter()
        .find_map(|r| match r {
            VcpuRegs::X86_64(x) if x.long_mode() => Some(x.cr3 & 0x000f_ffff_ffff_f000),
            _ => None,
        })
        .ok_or_else(|| Failure::bad_input("no vCPU runs in long mode: glass traces 64-bit guests"))
}

/// The frequency of the clock an `arch` guest's records are timed by, where it is not
/// the host's time-stamp counter's: an AArch64 guest's generic timer (CNTFRQ_EL0).
fn counter_hz(target: &mut dyn GuestCode, arch: glass_format::Arch) -> Result<Option<u64>> {
    match arch {
        glass_format::Arch::X86_64 => Ok(None),
        glass_format::Arch::Aarch64 => target.counter_hz().map(Some).ok_or_else(|| {
            Failure::runtime("cannot read the guest's timer frequency (CNTFRQ_EL0)")
        }),
    }
}

/// The region's place in the guest that `target` reaches, stopped with `regs`, for the
/// functions `choice` plans. An AArch64 guest (see `aarch64`) whose tables have no free
/// entry within B's reach of its code has its functions planned again with far patches
/// (adrp, add, br x16) and the entry looked for within ±2 GiB; the functions the far
/// patch refuses join `skipped`.
fn place_region(
    target: &mut dyn GuestCode,
    regs: &[VcpuRegs],
    region_gpa: u64,
    choice: &mut select::ModuleChoice,
    skipped: &mut Vec<Skip>,
) -> Result<Layout> {
    let (low, high) = text_span(choice);
    if !matches!(regs.first(), Some(VcpuRegs::Aarch64(_))) {
        let cr3 = long_mode_cr3(regs)?;
        return Layout::choose(low, high, region_gpa, cr3, &mut |at| {
            read_u64_physical(target, at)
        })
        .map_err(Failure::bad_input);
    }
    let far = choice.far_patches();
    if let Some(layout) = aarch64::choose_layout(target, regs, (low, high), region_gpa, far)? {
        return Ok(layout);
    }
    let refused = |(low, high): (u64, u64)| {
        Failure::bad_input(format!(
            "the guest's level-2 tables have no free 2 MiB entry within ±2 GiB of the code to trace ({low:#x}..{high:#x}): no room for glass's region"
        ))
    };
    if far {
        return Err(refused((low, high)));
    }
    select::replan_far_at(
        choice,
        "the guest's level-2 tables have no free entry for glass's region within a B's ±128 MiB of the code",
    )
    .map_err(Failure::bad_input)?;
    let module = choice.path.clone();
    skipped.extend(choice.skipped.drain(..).map(|(function, reason)| Skip {
        module: module.clone(),
        address: function.address,
        name: function.name,
        reason,
    }));
    let span = text_span(choice);
    aarch64::choose_layout(target, regs, span, region_gpa, true)?.ok_or_else(|| refused(span))
}

/// The recording's first records: what is traced and what is not (a guest of `arch`).
fn write_header(
    out: &mut Output,
    args: &TraceOptions,
    (qemu_pid, arch): (u32, glass_format::Arch),
    installed: &[Installed],
    skipped: &[Skip],
) {
    let start_unix_ns = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    out.write(&Record::Meta(Meta {
        start_unix_ns,
        backend: glass_format::Backend::Trace,
        arch,
        unwind: String::new(),
        frequency_hz: 0,
        max_depth: 0,
        target_pid: qemu_pid,
        command: args.command.clone(),
        hostname: std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_default(),
        glass_version: env!("CARGO_PKG_VERSION").into(),
        capture: "calls".into(),
    }));
    crate::write_instrumented(out, installed, skipped);
    out.write(&Record::TraceSummary(TraceSummary {
        patched: installed.len() as u32,
        not_patched: skipped.len() as u32,
        exit_status: -1,
        ..TraceSummary::default()
    }));
    out.flush();
}

/// The final summary and the end of the recording, the records timed at `counter_hz`
/// where it is known (an AArch64 guest's CNTFRQ_EL0), else at the host's time-stamp
/// counter rate.
#[allow(clippy::too_many_arguments)]
fn finish(
    out: &mut Output,
    args: &TraceOptions,
    (clock_start, counter_hz): ((u64, u64), Option<u64>),
    ring: &layout::RingReader,
    replay: &replay::Replay,
    patched: usize,
    not_patched: usize,
    exit_status: i32,
) -> Result<TraceSummary> {
    let mut clock_end = (glass_probe_abi::rdtsc(), monotonic_now_ns());
    if clock_end.1 - clock_start.1 < 50_000_000 {
        std::thread::sleep(Duration::from_millis(50));
        clock_end = (glass_probe_abi::rdtsc(), monotonic_now_ns());
    }
    // Under TCG the guest's time-stamp counter is the host's plus an offset: the host's
    // rate is the guest's.
    let summary = TraceSummary {
        tsc_hz: counter_hz.unwrap_or(
            ((clock_end.0 - clock_start.0) as f64 * 1e9 / (clock_end.1 - clock_start.1) as f64)
                as u64,
        ),
        tsc_start: ring.first_tsc().saturating_sub(1 << 32),
        threads: replay.stacks() as u32,
        patched: patched as u32,
        not_patched: not_patched as u32,
        duration_ns: clock_end.1 - clock_start.1,
        lost: ring.dropped() + out.lost_words,
        exit_status,
        ..TraceSummary::default()
    };
    out.write(&Record::TraceSummary(summary.clone()));
    out.write(&Record::End);
    out.flush();
    if let Some(error) = &out.failed {
        return Err(Failure::runtime(format!(
            "writing {} failed: {}; {} call records lost",
            args.output.display(),
            glass_record::error_text(error),
            out.lost_words
        )));
    }
    let _ = std::io::stderr().flush();
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ram_sizes_read_as_qemu_reads_them() {
        assert_eq!(parse_ram_mib("64"), Some(64));
        assert_eq!(parse_ram_mib("64M"), Some(64));
        assert_eq!(parse_ram_mib("2G"), Some(2048));
        assert_eq!(parse_ram_mib("size=512M"), Some(512));
        assert_eq!(parse_ram_mib("64,slots=2,maxmem=1G"), None);
        assert_eq!(parse_ram_mib("lots"), None);
    }
}
