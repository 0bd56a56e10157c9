//! `glass record --qmp SOCKET` and `--libvirt DOMAIN`: a QEMU that runs already, started
//! without `-gdb` and without a shared memory backend, sampled without a restart.
//!
//! Through its monitor (QMP, or libvirt's access to it: `glass_target::qmp`,
//! `glass_target::libvirt`) glass checks that the VM runs and has no GDB stub of its own
//! (a debugger's, which glass must not take over), starts its guardian, enables a stub
//! on a private unix socket (HMP `gdbserver`), finds the guest's RAM in QEMU's own
//! address space (the `memory` flat view and `gpa2hva`, read with process_vm_readv;
//! the stub's `m` packets where QEMU's memory cannot be read), and samples with the
//! loop every VM guest uses ([`super::guest`]). At the end the VM runs on and the stub
//! is removed (`gdbserver none`); if glass dies, its guardian removes it and lets the
//! VM run (`cont` if the stub left it stopped). How a VM that ended did so comes from the
//! monitor: QMP's SHUTDOWN event, libvirt's domain state.

use glass_format::Backend;
use glass_mem::{PhysicalMemory, ProcessRam};
use glass_target::qmp::{existing_stub, ram_ranges, Monitor, MonitorError};
use glass_target::stop_mark::StopMark;
use glass_target::TargetError;
use nix::sys::signalfd::SignalFd;

use super::finish_with;
use super::guardian::Guardian;
use super::guest::{sample_guest, RamSource, Vmm};
use super::recorder::Recorder as Sink;
use crate::{Recorded, Result};

fn target_error(error: MonitorError) -> TargetError {
    match error {
        MonitorError::BadInput(text) => TargetError::BadInput(text),
        MonitorError::TimedOut(text) | MonitorError::Failed(text) => {
            TargetError::Io(std::io::Error::other(text))
        }
    }
}

/// Opens the monitor `--qmp` or `--libvirt` names, and the guardian's arguments for it.
pub fn open_monitor(
    qmp: Option<&str>,
    libvirt: Option<&str>,
) -> std::result::Result<(Box<dyn Monitor>, Vec<String>), TargetError> {
    match (qmp, libvirt) {
        (Some(path), _) => Ok((
            Box::new(glass_target::qmp::Qmp::connect(path).map_err(target_error)?),
            vec!["--qmp".into(), path.into()],
        )),
        (None, Some(domain)) => Ok((
            Box::new(glass_target::libvirt::Libvirt::open(domain).map_err(target_error)?),
            vec!["--libvirt".into(), domain.into()],
        )),
        (None, None) => Err(TargetError::BadInput("--qmp or --libvirt needed".into())),
    }
}

pub fn record(
    sink: Sink,
    stop_signals: &SignalFd,
) -> std::result::Result<Result<Recorded>, TargetError> {
    let args = sink.args;
    // A bad --symbols is said before anything in QEMU changes.
    super::guest_image::GuestImage::load(
        args.symbols.as_deref().unwrap_or(std::path::Path::new("")),
    )?;
    let (mut monitor, guardian_args) = open_monitor(args.qmp.as_deref(), args.libvirt.as_deref())?;
    let named = monitor.describe();
    let status = monitor.status().map_err(target_error)?;
    if status != "running" {
        return Err(TargetError::BadInput(format!(
            "{named}: the VM is {status} (glass samples a running VM and leaves it as it found it: resume it first)"
        )));
    }
    let chardevs = monitor.hmp("info chardev").map_err(target_error)?;
    match existing_stub(&chardevs) {
        Some((true, filename)) => {
            return Err(TargetError::BadInput(format!(
                "{named}: QEMU's GDB stub ({filename}) is in use by a debugger; glass cannot sample through it while it is: detach the debugger first"
            )))
        }
        Some((false, filename)) => {
            return Err(TargetError::BadInput(format!(
                "{named}: QEMU already has a GDB stub ({filename}), which glass does not replace: sample through it with --gdb ADDRESS, or remove it (HMP: gdbserver none)"
            )))
        }
        None => {}
    }
    let pid = monitor.qemu_pid();
    may_trace(pid, &named)?;
    // QEMU creates the socket (with its user and umask: only its user and root can
    // connect); glass reaches it through QEMU's own root, which is the same path unless
    // QEMU runs in a mount namespace of its own.
    let socket = std::env::temp_dir().join(format!("glass-gdb-{}.sock", std::process::id()));
    let reached = std::path::PathBuf::from(format!("/proc/{pid}/root{}", socket.display()));
    let address = reached.to_string_lossy().into_owned();
    let mark = StopMark::create().map_err(TargetError::Io)?;
    // Before the stub exists: from then on a glass that dies leaves it to the guardian.
    let guardian = Guardian::start_monitored(&address, guardian_args, &mark, sink.stop_bound)?;
    let result = enable_and_sample(sink, stop_signals, &mut *monitor, &socket, &address, &mark);
    guardian.done();
    let _ = std::fs::remove_file(&reached);
    result
}

fn enable_and_sample(
    sink: Sink,
    stop_signals: &SignalFd,
    monitor: &mut dyn Monitor,
    socket: &std::path::Path,
    address: &str,
    mark: &StopMark,
) -> std::result::Result<Result<Recorded>, TargetError> {
    let args = sink.args;
    let symbols = args.symbols.clone().unwrap_or_default();
    let named = monitor.describe();
    let said = monitor
        .hmp(&format!(
            "gdbserver unix:{},server=on,wait=off",
            socket.display()
        ))
        .map_err(target_error)?;
    if !said.contains("Waiting for gdb connection") {
        let _ = monitor.hmp("gdbserver none");
        return Err(TargetError::Io(std::io::Error::other(format!(
            "{named}: QEMU did not start a GDB stub: {}",
            said.trim().replace('\n', "; ")
        ))));
    }
    let pid = monitor.qemu_pid();
    let ram = match ram_ranges(monitor)
        .map_err(|e| e.to_string())
        .and_then(|ranges| ProcessRam::open(pid, ranges).map_err(|e| crate::error_text(&e)))
    {
        Ok(ram) => {
            let source = glass_format::GuestRam::Process {
                pid: pid as u32,
                blocks: ram.ranges().len() as u32,
                bytes: ram.size(),
            };
            RamSource::Process(Box::new(ram) as Box<dyn PhysicalMemory>, source)
        }
        Err(why) => {
            sink.notes.warn(&format!(
                "cannot read QEMU's memory (pid {pid}): {why}; guest memory is read through the GDB stub's m packets (slower stops)"
            ));
            RamSource::Stub
        }
    };
    let pidfd = super::guardian::pidfd_open(pid);
    let sampled = sample_guest(
        sink,
        address,
        ram,
        &symbols,
        stop_signals,
        Vmm::Monitored { monitor, pidfd },
        mark,
    );
    // The VM runs (or has ended): the stub glass added goes.
    let removed = monitor.hmp("gdbserver none");
    let (sink, outcome, fate) = sampled?;
    let fate = match (fate, removed) {
        (Some(fate), _) => fate,
        (None, Ok(_)) => format!("VM running, the GDB stub glass enabled removed ({named})"),
        (None, Err(error)) => {
            sink.notes.warn(&format!(
                "could not remove the GDB stub glass enabled: {error} (remove it: HMP gdbserver none)"
            ));
            format!("VM running ({named})")
        }
    };
    Ok(finish_with(
        sink,
        outcome,
        None,
        Backend::GdbStub,
        Some(fate),
    ))
}

/// glass reads QEMU's memory and connects to the stub QEMU creates (with QEMU's user
/// and umask): it must be QEMU's user or root. Said before anything is enabled.
fn may_trace(pid: i32, named: &str) -> std::result::Result<(), TargetError> {
    // SAFETY: geteuid has no arguments.
    let me = unsafe { libc::geteuid() };
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let owner: Option<u32> = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|uids| uids.split_whitespace().nth(1))
        .and_then(|euid| euid.parse().ok());
    match owner {
        Some(owner) if me != 0 && owner != me => Err(TargetError::BadInput(format!(
            "{named}: QEMU (pid {pid}) runs as uid {owner}: glass may not read its memory or use its stub as uid {me}; run glass as QEMU's user or as root"
        ))),
        _ => Ok(()),
    }
}
