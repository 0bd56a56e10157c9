//! The guardian: a small process that outlives glass and lets the VM run if glass dies.
//!
//! QEMU (7.2 here) keeps a VM stopped when its debugger's connection closes, so a glass
//! killed while the VM is stopped for a sample (SIGKILL, the OOM killer) would leave it
//! frozen; and the QEMU that `--vm` launched would be orphaned. Before sampling starts,
//! glass starts the guardian and keeps the only write end of a pipe whose read end is
//! the guardian's standard input. The write end is close-on-exec, so neither the
//! guardian nor QEMU holds it: the guardian reads EOF exactly when glass is gone. A
//! glass that ends normally (whatever ended the recording: `-d`, a signal, the guest
//! powering off, a broken stub connection, an error) first leaves the VM as it should,
//! then writes `done`, and the guardian exits without touching anything. EOF without
//! `done` means glass died: the guardian connects to the stub (QEMU accepts a new
//! connection once the dead one is closed; retried for a bounded time) and detaches,
//! which lets the VM run. For `--vm` it then ends QEMU (SIGTERM, SIGKILL after a grace
//! period), unless `--keep-vm`, which leaves the VM running.
//!
//! The guardian is glass's own binary run again (`/proc/self/exe __guardian ...`, a
//! hidden subcommand), not a fork of glass: a forked copy would inherit every
//! descriptor glass holds (the output file, its 256 KiB of buffered records, the guest
//! RAM, signalfds, the stub connection) and would have to close them all and never
//! unwind (a panic's unwinding would flush a second copy of the buffered records into
//! the recording); after exec it holds only the pipe and the standard streams. It runs
//! in a session of its own (so Ctrl-C at the terminal, SIGHUP when the terminal goes
//! and a kill of glass's process group do not reach it) and ignores SIGINT, SIGTERM and
//! SIGHUP. It waits in one blocking read: nothing on the sample path involves it.
//!
//! For a Xen domain (`--xen`) there is no connection to break: glass marks in a page
//! shared with the guardian (a memfd it inherits) when it holds the domain paused, and
//! a guardian that reads EOF while the mark is set unpauses the domain.
//!
//! The pipe carries lines: `vm PID` (written by QEMU's process itself, between fork and
//! exec, so a glass killed at any moment after QEMU exists has told the guardian which
//! process to end) and `done`.

use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use glass_target::gdbstub::client::Client;
use glass_target::xen::{Hypervisor, PauseMark};
use glass_target::TargetError;

/// How long the guardian keeps trying to reach the stub after glass died.
const CONNECT_FOR: Duration = Duration::from_secs(15);
/// How long QEMU has to end after SIGTERM before SIGKILL.
pub(crate) const QEMU_GRACE: Duration = Duration::from_secs(3);

/// `glass __guardian` (hidden): started by `glass record --gdb/--vm`, never by hand.
#[derive(clap::Args, Debug, Clone)]
pub struct GuardianArgs {
    /// The GDB stub to detach through if glass dies
    #[arg(long, required_unless_present = "xen")]
    stub: Option<String>,
    /// A Xen domain to unpause if glass dies holding it paused (`--xen`)
    #[arg(long, requires = "pause_mark")]
    xen: Option<u32>,
    /// With --xen: the inherited descriptor of glass's pause mark
    #[arg(long)]
    pause_mark: Option<i32>,
    /// glass launches the VM (`--vm`): QEMU's process writes `vm PID` into the pipe
    #[arg(long)]
    launched: bool,
    /// With --launched: leave the VM running (`--keep-vm`) instead of ending QEMU
    #[arg(long)]
    keep_vm: bool,
}

/// glass's side: the pipe's write end and the guardian process.
pub struct Guardian {
    pipe: Option<std::fs::File>,
    child: Child,
}

impl Guardian {
    /// Starts the guardian for the stub at `stub`. `launched`: glass is about to launch
    /// the VM (QEMU's process reports itself through [`Guardian::pipe_fd`]).
    pub fn start(stub: &str, launched: bool, keep_vm: bool) -> Result<Guardian, TargetError> {
        let mut args = vec!["--stub".to_string(), stub.to_string()];
        if launched {
            args.push("--launched".into());
        }
        if keep_vm {
            args.push("--keep-vm".into());
        }
        Self::start_with(&args)
    }

    /// Starts the guardian for Xen domain `domid`: if glass dies while `mark` says it
    /// holds the domain paused, the guardian unpauses it.
    pub fn start_xen(domid: u32, mark: &PauseMark) -> Result<Guardian, TargetError> {
        Self::start_with(&[
            "--xen".to_string(),
            domid.to_string(),
            "--pause-mark".to_string(),
            mark.raw_fd().to_string(),
        ])
    }

    fn start_with(args: &[String]) -> Result<Guardian, TargetError> {
        Self::spawn("__guardian", args).map_err(|e| {
            TargetError::Io(std::io::Error::other(format!(
                "cannot start the guardian that lets the VM run if glass dies: {e}"
            )))
        })
    }

    /// Starts glass's hidden `subcommand` with `args` as a guardian (in a session of its
    /// own, deaf to SIGINT, SIGTERM and SIGHUP, its standard input the pipe glass holds
    /// the only write end of): `glass trace --pid` has one of its own.
    pub fn spawn(subcommand: &str, args: &[String]) -> std::io::Result<Guardian> {
        let (read_end, write_end) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let mut command = Command::new("/proc/self/exe");
        command
            .arg0("glass")
            .arg(subcommand)
            // A test's stop hook is glass's, not its guardian's.
            .env_remove("GLASS_TEST_STOP_AT")
            .args(args)
            .stdin(Stdio::from(read_end))
            .stdout(Stdio::null());
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            command.pre_exec(|| {
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // Ignored dispositions survive exec: the guardian is deaf to these from
                // its first instruction. Then nothing stays blocked (glass blocks them).
                for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                    libc::signal(signal, libc::SIG_IGN);
                }
                let empty: libc::sigset_t = std::mem::zeroed();
                libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
                Ok(())
            });
        }
        let child = command.spawn()?;
        Ok(Guardian {
            pipe: Some(std::fs::File::from(write_end)),
            child,
        })
    }

    /// The pipe's write end (close-on-exec), for QEMU's process to report its pid.
    pub fn pipe_fd(&self) -> RawFd {
        self.pipe.as_ref().map_or(-1, |p| p.as_raw_fd())
    }

    /// The recording ended and glass left the VM as it should: the guardian exits
    /// without touching anything. (Dropping a `Guardian` without this — a panic — lets
    /// the guardian resume the VM, the safe side.)
    pub fn done(mut self) {
        if let Some(mut pipe) = self.pipe.take() {
            let _ = pipe.write_all(b"done\n");
        }
        // It exits at once; reap it so it does not linger as a zombie, without waiting
        // on it for long if it does not.
        let until = Instant::now() + Duration::from_millis(500);
        while Instant::now() < until {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// Between fork and exec of QEMU: writes `vm PID` into the guardian's pipe
/// (async-signal-safe: no allocation).
pub fn report_vm_pid(pipe: RawFd) {
    let mut line = *b"vm                      ";
    let mut digits = [0u8; 20];
    // SAFETY: getpid has no arguments.
    let mut pid = unsafe { libc::getpid() } as u64;
    let mut n = 0;
    loop {
        digits[n] = b'0' + (pid % 10) as u8;
        n += 1;
        pid /= 10;
        if pid == 0 {
            break;
        }
    }
    for i in 0..n {
        line[3 + i] = digits[n - 1 - i];
    }
    line[3 + n] = b'\n';
    // SAFETY: writes our own buffer to a descriptor we inherited.
    unsafe { libc::write(pipe, line.as_ptr().cast(), 4 + n) };
}

/// The guardian process.
pub fn run(args: &GuardianArgs) -> crate::Result<i32> {
    // Already ignored since exec (see `start`); again in case someone runs it by hand.
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: setting a disposition.
        unsafe { libc::signal(signal, libc::SIG_IGN) };
    }
    // Mapped now, while glass certainly holds its end.
    let xen_mark = match args.pause_mark {
        Some(fd) => Some(PauseMark::inherit(fd).map_err(|e| {
            crate::Failure::runtime(format!("guardian: cannot map glass's pause mark: {e}"))
        })?),
        None => None,
    };
    let mut vm: Option<(i32, Option<OwnedFd>)> = None;
    let mut pending = Vec::new();
    let mut buf = [0u8; 256];
    loop {
        // SAFETY: reads into our buffer from standard input (the pipe).
        let n = unsafe { libc::read(0, buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        if n <= 0 {
            break;
        }
        pending.extend_from_slice(&buf[..n as usize]);
        while let Some(end) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line[..end]).into_owned();
            if line == "done" {
                return Ok(0);
            }
            if let Some(pid) = line.strip_prefix("vm ").and_then(|p| p.parse::<i32>().ok()) {
                // A pidfd now, while QEMU certainly exists: later signals cannot reach
                // another process that reused the pid.
                vm = Some((pid, pidfd_open(pid)));
            }
        }
    }
    // EOF without `done`: glass died.
    let died = Instant::now();
    if let (Some(domid), Some(mark)) = (args.xen, xen_mark) {
        return Ok(unpause_xen(domid, &mark, died));
    }
    let stub = args.stub.clone().unwrap_or_default();
    if args.launched {
        let Some((pid, pidfd)) = vm else {
            // glass died before launching QEMU: there is no VM.
            return Ok(0);
        };
        if !args.keep_vm {
            // The VM is to end with the recording: SIGTERM ends QEMU whether the VM is
            // running or stopped, so no detach first.
            let how = end_qemu(pidfd.as_ref());
            let _ = std::fs::remove_file(&stub);
            eprintln!(
                "glass: glass ended without finishing the recording; its guardian {how} (QEMU pid {pid}, {:.0} ms later)",
                died.elapsed().as_secs_f64() * 1e3
            );
            return Ok(0);
        }
        match let_run(&stub, pidfd.as_ref()) {
            Ok(()) => eprintln!(
                "glass: glass ended without finishing the recording; its guardian let the VM run in {:.1} ms (left running, --keep-vm: QEMU pid {pid}, GDB stub at {})",
                died.elapsed().as_secs_f64() * 1e3,
                stub
            ),
            Err(error) => eprintln!(
                "glass: glass ended without finishing the recording; its guardian could not let the VM run (QEMU pid {pid}): {error}"
            ),
        }
        return Ok(0);
    }
    match let_run(&stub, None) {
        Ok(()) => eprintln!(
            "glass: glass ended without finishing the recording; its guardian let the VM run in {:.1} ms",
            died.elapsed().as_secs_f64() * 1e3
        ),
        Err(error) => eprintln!(
            "glass: glass ended without finishing the recording; its guardian could not let the VM run: {error}"
        ),
    }
    Ok(0)
}

/// glass died: unpauses Xen domain `domid` if glass held it paused. Returns the exit code.
fn unpause_xen(domid: u32, mark: &PauseMark, died: Instant) -> i32 {
    if !mark.held() {
        // Between samples: the domain runs.
        return 0;
    }
    let unpaused = Hypervisor::open()
        .map_err(|e| e.to_string())
        .and_then(|mut hv| {
            hv.unpause(domid)
                .map_err(|errno| std::io::Error::from_raw_os_error(errno).to_string())
        });
    match unpaused {
        Ok(()) => {
            mark.set(false);
            eprintln!(
                "glass: glass ended without finishing the recording; its guardian unpaused Xen domain {domid} in {:.1} ms",
                died.elapsed().as_secs_f64() * 1e3
            );
            0
        }
        Err(error) => {
            eprintln!(
                "glass: glass ended without finishing the recording; its guardian could not unpause Xen domain {domid}: {error} (run: xl unpause {domid})"
            );
            1
        }
    }
}

/// Connects to the stub and detaches (the VM runs), retrying for a bounded time: QEMU
/// takes the new connection once it has seen the dead one close. Gives up early if the
/// launched QEMU is gone.
fn let_run(stub: &str, qemu: Option<&OwnedFd>) -> std::result::Result<(), String> {
    let until = Instant::now() + CONNECT_FOR;
    let mut last = String::new();
    while Instant::now() < until {
        if qemu.is_some_and(|fd| exited(fd, 0)) {
            return Err("QEMU has exited".into());
        }
        match Client::connect(stub).and_then(|mut client| client.detach()) {
            Ok(()) => return Ok(()),
            Err(error) => last = error.to_string(),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(last)
}

/// SIGTERM, then SIGKILL after the grace period. Returns what it did.
fn end_qemu(pidfd: Option<&OwnedFd>) -> &'static str {
    let Some(pidfd) = pidfd else {
        return "found QEMU already gone";
    };
    if exited(pidfd, 0) {
        return "found QEMU already gone";
    }
    pidfd_signal(pidfd, libc::SIGTERM);
    if exited(pidfd, QEMU_GRACE.as_millis() as i32) {
        return "shut the VM down";
    }
    pidfd_signal(pidfd, libc::SIGKILL);
    let _ = exited(pidfd, 2000);
    "killed QEMU (it did not end on SIGTERM)"
}

fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open has no memory arguments.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    // SAFETY: a fresh descriptor we own.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn pidfd_signal(pidfd: &OwnedFd, signal: i32) {
    // SAFETY: no memory arguments besides a null siginfo.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
}

/// Whether the process ended (its pidfd polls readable) within `timeout_ms`.
fn exited(pidfd: &OwnedFd, timeout_ms: i32) -> bool {
    let mut poll = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut poll, 1, timeout_ms) > 0 }
}
