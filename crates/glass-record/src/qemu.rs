//! `glass record --vm -- qemu-system-x86_64|qemu-system-aarch64 ARGS`: the QEMU launcher. glass starts the VM
//! with a private GDB stub (a unix socket) and guest RAM shared with glass, then samples
//! it with the same loop as `--gdb` ([`super::gdb`]), and ends the VM with the recording
//! unless `--keep-vm`.
//!
//! The guest's RAM is a memfd glass creates, sized, and hands to QEMU as an inherited
//! descriptor (`mem-path=/proc/self/fd/N,share=on`, which QEMU 7.2 opens like any file):
//! it never has a name in the file system, so no other user can read the guest's memory
//! and nothing is left behind whenever glass ends. QEMU runs in a process group of its
//! own, so Ctrl-C at the terminal reaches glass (which ends the recording and then the
//! VM) and not QEMU; a [`Guardian`] lets the VM run, or ends QEMU, if glass is killed.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use glass_format::Backend;
use glass_target::TargetError;
use nix::sys::signal::Signal;
use nix::sys::signalfd::SignalFd;

use super::finish_with;
use super::guardian::{report_vm_pid, Guardian, QEMU_GRACE};
use super::guest::{sample_guest, RamSource, Vmm};
use super::recorder::Recorder as Sink;
use crate::{Recorded, Result};

/// `--vm -- qemu-system-x86_64 ARGS`: launch QEMU with a private stub and shared RAM.
pub fn record(
    sink: Sink,
    stop_signals: &SignalFd,
) -> std::result::Result<Result<Recorded>, TargetError> {
    let args = sink.args;
    let command = &args.command;
    if command.is_empty() {
        return Err(TargetError::CommandNotFound(String::new()));
    }
    let value_of = |flag: &str| {
        command
            .iter()
            .position(|a| a == flag)
            .and_then(|i| command.get(i + 1))
            .cloned()
    };
    if value_of("-gdb").is_some() || command.iter().any(|a| a.contains("memory-backend")) {
        return Err(TargetError::BadInput(
            "--vm adds its own -gdb and memory backend: leave them out, or use --gdb to attach"
                .into(),
        ));
    }
    let symbols = match (&args.symbols, value_of("-kernel")) {
        (Some(symbols), _) => symbols.clone(),
        (None, Some(kernel)) => std::path::PathBuf::from(kernel),
        (None, None) => {
            return Err(TargetError::BadInput(
                "--vm needs -kernel in the QEMU command or --symbols".into(),
            ))
        }
    };
    let ram_mib = value_of("-m").map_or(Ok(128), |m| parse_mib(&m))?;
    let ram = guest_ram_memfd(ram_mib << 20).map_err(|e| {
        TargetError::Io(std::io::Error::other(format!(
            "cannot create the guest's RAM ({ram_mib} MiB): {e}"
        )))
    })?;
    let socket = std::env::temp_dir().join(format!("glass-vm-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&socket);
    let address = socket.to_string_lossy().into_owned();
    // Before QEMU exists: from the moment it does, a killed glass is covered.
    let mark = glass_target::stop_mark::StopMark::create().map_err(TargetError::Io)?;
    let guardian = Guardian::start(&address, true, args.keep_vm, &mark, sink.stop_bound)?;
    let result = launch_and_sample(
        sink,
        stop_signals,
        (&guardian, &mark),
        &socket,
        (&ram, ram_mib),
        &symbols,
    );
    // The VM is as it must be left (running, or ended): the guardian has nothing to do.
    guardian.done();
    result
}

fn launch_and_sample(
    sink: Sink,
    stop_signals: &SignalFd,
    (guardian, mark): (&Guardian, &glass_target::stop_mark::StopMark),
    socket: &std::path::Path,
    (ram_fd, ram_mib): (&OwnedFd, u64),
    symbols: &std::path::Path,
) -> std::result::Result<Result<Recorded>, TargetError> {
    use std::os::unix::process::CommandExt;
    let args = sink.args;
    let command = &args.command;
    let program = &command[0];
    let ram_raw = ram_fd.as_raw_fd();
    let pipe = guardian.pipe_fd();
    let mut qemu = std::process::Command::new(program);
    qemu.args(&command[1..])
        .arg("-object")
        .arg(format!(
            "memory-backend-file,id=glass-ram,size={ram_mib}M,mem-path=/proc/self/fd/{ram_raw},share=on"
        ))
        .args(["-machine", "memory-backend=glass-ram"])
        .arg("-gdb")
        .arg(format!("unix:{},server=on,wait=off", socket.display()))
        // Ctrl-C at the terminal goes to glass's process group only: glass ends the
        // recording, then the VM.
        .process_group(0);
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        qemu.pre_exec(move || {
            // The RAM descriptor is the one thing QEMU inherits on purpose.
            glass_target::launch::prepare_vmm_child(ram_raw)?;
            report_vm_pid(pipe);
            Ok(())
        });
    }
    let mut child = qemu.spawn().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => TargetError::CommandNotFound(program.clone()),
        _ => TargetError::Exec(program.clone(), e),
    })?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !listening(socket) {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(TargetError::BadInput(format!(
                "the VM did not start: {program} exited before its GDB stub came up ({status})"
            )));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(TargetError::Io(std::io::Error::other(
                "the VM did not start: QEMU's GDB stub did not come up within 30 s (QEMU killed)",
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let ram = std::path::PathBuf::from(format!("/proc/self/fd/{ram_raw}"));
    let address = socket.to_string_lossy().into_owned();
    let qemu_cpu_before = process_cpu_ns(child.id());
    let sampling_started = Instant::now();
    let result = sample_guest(
        sink,
        &address,
        RamSource::File(ram),
        symbols,
        stop_signals,
        Vmm::Launched(&mut child),
        mark,
    );
    let qemu_cpu = process_cpu_ns(child.id())
        .zip(qemu_cpu_before)
        .map(|(after, before)| after.saturating_sub(before));
    let result = result.map(|(sink, outcome, _)| {
        let stopped_ns = sink.summary(None).stopped_total_ns;
        let running_ns = (sampling_started.elapsed().as_nanos() as u64).saturating_sub(stopped_ns);
        if let Some(warning) = qemu_cpu.and_then(|cpu| oversubscribed_warning(cpu, running_ns)) {
            sink.notes.warn(&warning);
        }
        (sink, outcome)
    });
    let exited = child.try_wait().ok().flatten();
    let fate = match exited {
        Some(status) => ended_by_itself(status),
        // Its stub stays, for `glass record --gdb` later (QEMU removes it when it ends).
        None if args.keep_vm => format!(
            "VM left running (--keep-vm): QEMU pid {}, GDB stub at {}",
            child.id(),
            socket.display()
        ),
        None => end_qemu(&mut child),
    };
    if exited.is_some() || !args.keep_vm {
        let _ = std::fs::remove_file(socket);
    }
    let (sink, outcome) = result.map_err(|error| with_fate(error, &fate))?;
    let status = exited.map(|s| s.code().unwrap_or(1));
    Ok(finish_with(
        sink,
        outcome,
        status,
        Backend::GdbStub,
        Some(fate),
    ))
}

/// CPU time (ns) a process has used, from /proc/PID/stat (utime + stime).
fn process_cpu_ns(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no memory arguments.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Some(ticks * 1_000_000_000 / hz)
}

/// Said at the end when QEMU's threads kept every host CPU available to it busy while
/// the VM ran: QEMU's main loop, which stops the VM at glass's request, then waits for a
/// CPU (up to a scheduler tick, 4 ms here) while the guest runs on, and it waits when the
/// vCPUs are busy but not when they idle, so samples drift from the code that follows an
/// idle period to later code. Measured: an AArch64 guest whose busy time splits 60/30/10
/// by its own clock came out 42/44/14 at 997 Hz with two busy vCPUs under multi-threaded
/// TCG on two host CPUs; 60/30/10 with one vCPU, or with `-accel tcg,thread=single`.
fn oversubscribed_warning(qemu_cpu_ns: u64, running_ns: u64) -> Option<String> {
    let cpus = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))
        .map(|set| {
            (0..nix::sched::CpuSet::count())
                .filter(|&c| set.is_set(c).unwrap_or(false))
                .count()
        })
        .unwrap_or(1);
    oversubscribed(qemu_cpu_ns, running_ns, cpus)
}

/// The warning for QEMU having used `qemu_cpu_ns` of CPU over `running_ns` on `cpus`.
fn oversubscribed(qemu_cpu_ns: u64, running_ns: u64, cpus: usize) -> Option<String> {
    let cpus = cpus.max(1);
    let used = qemu_cpu_ns as f64 / running_ns.max(1) as f64;
    (used >= 0.85 * cpus as f64).then(|| {
        format!(
            "QEMU kept all {cpus} host CPUs busy while the VM ran ({used:.1} CPUs): with every CPU taken it stops the VM late (up to a scheduler tick), later while its vCPUs are busy than while they idle, so code that follows an idle period is under-sampled; give the VM fewer busy vCPUs than host CPUs, or -accel tcg,thread=single (docs/guests.md)"
        )
    })
}

/// Whether a unix socket listens at `path`. QEMU binds its stub's socket (the file
/// appears) before it calls listen(): a connection in between is refused.
fn listening(path: &std::path::Path) -> bool {
    let Ok(table) = std::fs::read_to_string("/proc/net/unix") else {
        return path.exists();
    };
    let name = format!(" {}", path.display());
    table.lines().skip(1).any(|line| {
        // Num RefCount Protocol Flags Type St Inode Path; Flags has __SO_ACCEPTCON.
        line.ends_with(&name)
            && line
                .split_whitespace()
                .nth(3)
                .and_then(|flags| u32::from_str_radix(flags, 16).ok())
                .is_some_and(|flags| flags & 0x0001_0000 != 0)
    })
}

/// An error that ended the recording early, with what became of the VM.
fn with_fate(error: TargetError, fate: &str) -> TargetError {
    match error {
        TargetError::Io(e) => TargetError::Io(std::io::Error::other(format!("{e} ({fate})"))),
        other if other.is_bad_input() => TargetError::BadInput(format!("{other} ({fate})")),
        other => other,
    }
}

/// A memfd of `bytes` for the guest's RAM, close-on-exec (QEMU's process alone clears
/// that flag on its copy).
fn guest_ram_memfd(bytes: u64) -> std::io::Result<OwnedFd> {
    // SAFETY: a constant name; the flags are valid.
    let fd = unsafe { libc::memfd_create(c"glass-vm-ram".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sizes our own descriptor.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), bytes as libc::off_t) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fd)
}

/// What the recording's end says about a VM that ended on its own.
fn ended_by_itself(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(0), _) => "guest powered off (QEMU exited with status 0)".to_string(),
        (Some(code), _) => format!("VM ended on its own (QEMU exited with status {code})"),
        (None, Some(signal)) => format!(
            "VM ended: QEMU was killed by {}",
            Signal::try_from(signal).map_or("a signal", |s| s.as_str())
        ),
        (None, None) => "VM ended".to_string(),
    }
}

/// Ends the VM glass launched: SIGTERM, then SIGKILL after a grace period.
fn end_qemu(child: &mut std::process::Child) -> String {
    // SAFETY: signalling our own child (not yet reaped, so the pid is still QEMU's).
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let until = Instant::now() + QEMU_GRACE;
    while Instant::now() < until {
        if !matches!(child.try_wait(), Ok(None)) {
            return "VM shut down".to_string();
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = child.kill();
    let _ = child.wait();
    format!(
        "VM killed (QEMU did not end within {} s of SIGTERM)",
        QEMU_GRACE.as_secs()
    )
}

/// QEMU's `-m` value in MiB (`64`, `64M`, `1G`, `size=512M`).
fn parse_mib(text: &str) -> std::result::Result<u64, TargetError> {
    let value = text
        .split(',')
        .next()
        .unwrap_or(text)
        .trim_start_matches("size=");
    let (number, unit) = value.split_at(
        value
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(value.len()),
    );
    let number: u64 = number
        .parse()
        .map_err(|_| TargetError::BadInput(format!("-m {text}: not a size")))?;
    match unit {
        "" | "M" | "m" | "MB" | "MiB" => Ok(number),
        "G" | "g" | "GB" | "GiB" => Ok(number * 1024),
        _ => Err(TargetError::BadInput(format!("-m {text}: unknown unit"))),
    }
}

#[cfg(test)]
mod tests {
    use super::oversubscribed;

    #[test]
    fn the_warning_comes_when_qemu_took_nearly_every_cpu() {
        let second = 1_000_000_000;
        // 1.9 of 2 CPUs over a second: oversubscribed, said with the remedy.
        let warning = oversubscribed(19 * second / 10, second, 2).unwrap();
        assert!(warning.contains("all 2 host CPUs busy"), "{warning}");
        assert!(warning.contains("(1.9 CPUs)"), "{warning}");
        assert!(warning.contains("thread=single"), "{warning}");
        // 1.2 of 2 CPUs (one busy vCPU, or a host shared with other work): no warning.
        assert_eq!(oversubscribed(12 * second / 10, second, 2), None);
        // The threshold: 85% of the CPUs glass may use.
        assert!(oversubscribed(17 * second / 10, second, 2).is_some());
        assert!(oversubscribed(169 * second / 100, second, 2).is_none());
        assert!(oversubscribed(85 * second / 100, second, 1).is_some());
        // A recording that never ran the VM says nothing absurd.
        assert_eq!(oversubscribed(0, 0, 2), None);
    }
}
