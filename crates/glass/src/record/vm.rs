//! `glass record --vm -- qemu-system-x86_64 ARGS`: the QEMU launcher. glass starts the VM
//! with a private GDB stub (a unix socket) and guest RAM shared with glass, then samples
//! it with the same loop as `--gdb` ([`super::gdb`]), and ends the VM with the recording
//! unless `--keep-vm`.

use std::time::{Duration, Instant};

use glass_target::TargetError;
use nix::sys::signalfd::SignalFd;

use super::finish;
use super::gdb::{map_ram, sample_guest};
use super::sink::Sink;
use crate::error::Result;

/// `--vm -- qemu-system-x86_64 ARGS`: launch QEMU with a private stub and shared RAM.
pub fn record(
    sink: Sink,
    stop_signals: &SignalFd,
) -> std::result::Result<Result<i32>, TargetError> {
    use std::os::unix::process::CommandExt;
    let args = sink.args;
    let command = &args.command;
    let program = command
        .first()
        .ok_or_else(|| TargetError::CommandNotFound(String::new()))?;
    let value_of = |flag: &str| {
        command
            .iter()
            .position(|a| a == flag)
            .and_then(|i| command.get(i + 1))
            .cloned()
    };
    if value_of("-gdb").is_some() || command.iter().any(|a| a.contains("memory-backend")) {
        return Err(TargetError::BadArgument(
            "--vm adds its own -gdb and memory backend: leave them out, or use --gdb to attach"
                .into(),
        ));
    }
    let symbols = match (&args.symbols, value_of("-kernel")) {
        (Some(symbols), _) => symbols.clone(),
        (None, Some(kernel)) => std::path::PathBuf::from(kernel),
        (None, None) => {
            return Err(TargetError::BadArgument(
                "--vm needs -kernel in the QEMU command or --symbols".into(),
            ))
        }
    };
    let ram_mib = value_of("-m").map_or(Ok(128), |m| parse_mib(&m))?;
    let unique = format!("glass-vm-{}", std::process::id());
    let ram_path = std::path::PathBuf::from(format!("/dev/shm/{unique}"));
    let socket = std::env::temp_dir().join(format!("{unique}.sock"));
    let _ = std::fs::remove_file(&socket);
    let mut qemu = std::process::Command::new(program);
    qemu.args(&command[1..])
        .arg("-object")
        .arg(format!(
            "memory-backend-file,id=glass-ram,size={ram_mib}M,mem-path={},share=on",
            ram_path.display()
        ))
        .args(["-machine", "memory-backend=glass-ram"])
        .arg("-gdb")
        .arg(format!("unix:{},server=on,wait=off", socket.display()));
    // SAFETY: only resets the signal mask (glass blocks the signals it waits for).
    unsafe {
        qemu.pre_exec(|| {
            let empty: libc::sigset_t = std::mem::zeroed();
            libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
            Ok(())
        });
    }
    let mut child = qemu.spawn().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => TargetError::CommandNotFound(program.clone()),
        _ => TargetError::Exec(program.clone(), e),
    })?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !socket.exists() || !ram_path.exists() {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(TargetError::BadArgument(format!(
                "QEMU exited before its GDB stub came up ({status})"
            )));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(TargetError::Io(std::io::Error::other(
                "QEMU's GDB stub did not come up within 30 s",
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let ram = map_ram(&ram_path);
    // Both QEMU and glass have the RAM mapped: the name can go, nothing is left behind.
    let _ = std::fs::remove_file(&ram_path);
    let address = socket.to_string_lossy().into_owned();
    let result = ram.and_then(|ram| {
        sample_guest(
            sink,
            &address,
            Some(ram),
            &symbols,
            stop_signals,
            Some(&mut child),
        )
    });
    let _ = std::fs::remove_file(&socket);
    let exited = child.try_wait().ok().flatten();
    if exited.is_none() && !args.keep_vm {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let _ = child.wait();
    }
    let (sink, outcome) = result?;
    let status = exited.map(|s| s.code().unwrap_or(1));
    Ok(finish(sink, outcome, status, "gdbstub"))
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
        .map_err(|_| TargetError::BadArgument(format!("-m {text}: not a size")))?;
    match unit {
        "" | "M" | "m" | "MB" | "MiB" => Ok(number),
        "G" | "g" | "GB" | "GiB" => Ok(number * 1024),
        _ => Err(TargetError::BadArgument(format!("-m {text}: unknown unit"))),
    }
}
