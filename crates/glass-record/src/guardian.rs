//! The guardian: a small process that outlives glass, lets the VM run if glass dies, and
//! bounds how long any one stop glass holds may last.
//!
//! QEMU (7.2 here) keeps a VM stopped when its debugger's connection closes, so a glass
//! killed while the VM is stopped for a sample (SIGKILL, the OOM killer) would leave it
//! frozen; and the QEMU that `--vm` launched would be orphaned. Before sampling starts,
//! glass starts the guardian and keeps the only write end of a pipe whose read end is
//! the guardian's standard input. The write end is close-on-exec, so neither the
//! guardian nor QEMU holds it: the guardian reads EOF exactly when glass is gone. A
//! glass that ends normally (whatever ended the recording: `-d`, a signal, the guest
//! powering off, a broken stub connection, an error) first leaves the target as it
//! should, then writes `done`, and the guardian exits without touching anything. EOF
//! without `done` means glass died: the guardian connects to the stub (QEMU accepts a
//! new connection once the dead one is closed; retried for a bounded time) and detaches,
//! which lets the VM run. For `--vm` it then ends QEMU (SIGTERM, SIGKILL after a grace
//! period), unless `--keep-vm`, which leaves the VM running.
//!
//! The stop bound. A glass that is alive but does not finish a stop (stopped by
//! SIGSTOP or Ctrl-Z, stalled) would hold its target stopped for as long as that lasts:
//! before the bound (issue 21), a SIGSTOP of glass held the VM paused for the whole stop
//! in 4 of 6 runs, and left a thread of a ptrace-sampled process stopped in 10 of 10. So
//! glass marks, in a page shared with the guardian ([`StopMark`], a memfd it inherits),
//! the monotonic time at which it began holding the target stopped, and clears it once
//! the target runs: around each sample, the stub's handshake (from its first answer)
//! and the detach (`--gdb`, `--vm`), the Xen pause, each ptrace tick. The guardian looks at the mark every 5 ms
//! (a tenth of the bound if that is less) while it waits on the pipe; a stop that has
//! outlived the bound (50 ms, or GLASS_STOP_BOUND_MS: 5 to 60000) with glass stalled in
//! it (see [`stalled`]: stopped, or half the bound of CPU spent in the one stop; not
//! asleep waiting for the target or its VMM to answer, which glass's own timeouts bound,
//! nor waiting for a CPU) gets glass SIGKILLed
//! through a pidfd taken at start, and then the death path above frees the target: the
//! detach for a VM (or the end of the QEMU that `--vm` launched, as when glass dies),
//! the unpause for Xen; for ptrace the kernel itself releases every tracee of a dead
//! tracer (glass's own PTRACE_INTERRUPT cannot be undone by another process). A launched
//! program runs on, as whenever glass dies. A SIGKILLed glass cannot write, so the
//! guardian says it in one line on stderr (the bound, how long the stop had lasted,
//! what it did), and the recording is what glass had flushed (a readable prefix without
//! an end marker). Nothing on the sample path waits for the guardian: glass's side is
//! two stores to the shared word.
//!
//! Not covered: a glass stopped between samples holds no ptrace stop of its own, but a
//! traced thread that then needs its tracer (a signal to re-deliver, a new thread or
//! process, an exec) waits in a ptrace stop until glass runs again, as before.
//!
//! The guardian is glass's own binary run again (`/proc/self/exe __guardian ...`, a
//! hidden subcommand), not a fork of glass: a forked copy would inherit every
//! descriptor glass holds (the output file, its 256 KiB of buffered records, the guest
//! RAM, signalfds, the stub connection) and would have to close them all and never
//! unwind (a panic's unwinding would flush a second copy of the buffered records into
//! the recording); after exec it holds only the pipe, the stop mark and the standard
//! streams. It runs in a session of its own (so Ctrl-C at the terminal, SIGHUP when the
//! terminal goes and a kill of glass's process group do not reach it) and ignores
//! SIGINT, SIGTERM and SIGHUP.
//!
//! For a Xen domain (`--xen`) there is no connection to break: a guardian that reads
//! EOF while the mark is set unpauses the domain; with it clear it touches nothing.
//!
//! The pipe carries lines: `vm PID` (written by QEMU's process itself, between fork and
//! exec, so a glass killed at any moment after QEMU exists has told the guardian which
//! process to end), `done`, and the ledger of code `glass trace` patched in a guest
//! (`code ADDR HEX`, `back FROM TO`: glass_target's [`CodeLedger`]), written before the
//! first patched byte: a guardian that holds one puts that code back through the stub
//! (VM stopped, vCPUs moved out of the relocated copies, the code read again) before it
//! lets the VM run.

use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use glass_target::gdbstub::client::let_run;
use glass_target::gdbstub::ledger::CodeLedger;
use glass_target::qmp::unhook;
use glass_target::stop_mark::{monotonic_ns, StopMark};
use glass_target::xen::{Hypervisor, Unpaused};
use glass_target::TargetError;

/// How long the guardian keeps trying to reach the stub after glass died.
const CONNECT_FOR: Duration = Duration::from_secs(15);
/// How long QEMU has to end after SIGTERM before SIGKILL.
pub(crate) const QEMU_GRACE: Duration = Duration::from_secs(3);
/// The longest the guardian sleeps between two looks at the stop mark.
const LOOK_EVERY: Duration = Duration::from_millis(5);

/// `glass __guardian` (hidden): started by `glass record`, never by hand.
#[derive(clap::Args, Debug, Clone)]
pub struct GuardianArgs {
    /// The GDB stub to detach through if glass dies
    #[arg(long, required_unless_present_any = ["xen", "ptrace"])]
    stub: Option<String>,
    /// A Xen domain to unpause if glass dies holding it paused (`--xen`)
    #[arg(long)]
    xen: Option<u32>,
    /// glass samples processes with ptrace: the kernel releases its tracees when it dies
    #[arg(long, conflicts_with_all = ["stub", "xen"])]
    ptrace: bool,
    /// The inherited descriptor of glass's stop mark
    #[arg(long)]
    stop_mark: i32,
    /// The stop bound in milliseconds: a stop glass holds longer is ended by killing glass
    #[arg(long)]
    bound_ms: u64,
    /// glass's pid (the guardian's parent)
    #[arg(long)]
    glass: i32,
    /// glass enabled the stub through this QMP socket (`--qmp`): the guardian removes it
    #[arg(long, requires = "stub", conflicts_with = "libvirt")]
    qmp: Option<String>,
    /// glass enabled the stub through libvirt (`--libvirt`): the guardian removes it
    #[arg(long, requires = "stub")]
    libvirt: Option<String>,
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
    /// the VM (QEMU's process reports itself through [`Guardian::pipe_fd`]). `mark` says
    /// when glass holds the VM stopped; `bound`: for how long it may.
    pub fn start(
        stub: &str,
        launched: bool,
        keep_vm: bool,
        mark: &StopMark,
        bound: Duration,
    ) -> Result<Guardian, TargetError> {
        let mut args = vec!["--stub".to_string(), stub.to_string()];
        if launched {
            args.push("--launched".into());
        }
        if keep_vm {
            args.push("--keep-vm".into());
        }
        Self::start_with(args, mark, bound, "lets the VM run if glass dies")
    }

    /// Starts the guardian for a QEMU glass attached through its monitor (`--qmp`,
    /// `--libvirt`, given in `monitor_args`), whose stub at `stub` glass enables: if glass
    /// dies, the guardian removes the stub and lets the VM run.
    pub fn start_monitored(
        stub: &str,
        monitor_args: Vec<String>,
        mark: &StopMark,
        bound: Duration,
    ) -> Result<Guardian, TargetError> {
        let mut args = vec!["--stub".to_string(), stub.to_string()];
        args.extend(monitor_args);
        Self::start_with(
            args,
            mark,
            bound,
            "removes the GDB stub glass enables and lets the VM run if glass dies",
        )
    }

    /// Starts the guardian for Xen domain `domid`: if glass dies while `mark` says it
    /// holds the domain paused, the guardian unpauses it.
    pub fn start_xen(
        domid: u32,
        mark: &StopMark,
        bound: Duration,
    ) -> Result<Guardian, TargetError> {
        let args = vec!["--xen".to_string(), domid.to_string()];
        Self::start_with(args, mark, bound, "unpauses the domain if glass dies")
    }

    /// Starts the guardian for the ptrace backend: it kills a glass that holds threads
    /// stopped past `bound` (the kernel then lets them run).
    pub fn start_ptrace(mark: &StopMark, bound: Duration) -> Result<Guardian, TargetError> {
        let args = vec!["--ptrace".to_string()];
        Self::start_with(
            args,
            mark,
            bound,
            "bounds how long the target stays stopped",
        )
    }

    fn start_with(
        mut args: Vec<String>,
        mark: &StopMark,
        bound: Duration,
        role: &str,
    ) -> Result<Guardian, TargetError> {
        args.extend([
            "--stop-mark".to_string(),
            mark.raw_fd().to_string(),
            "--bound-ms".to_string(),
            bound.as_millis().to_string(),
            "--glass".to_string(),
            std::process::id().to_string(),
        ]);
        Self::spawn("__guardian", &args, Some(mark.raw_fd())).map_err(|e| {
            TargetError::Io(std::io::Error::other(format!(
                "cannot start the guardian that {role}: {e}"
            )))
        })
    }

    /// Starts glass's hidden `subcommand` with `args` as a guardian (in a session of its
    /// own, deaf to SIGINT, SIGTERM and SIGHUP, its standard input the pipe glass holds
    /// the only write end of, inheriting the stop mark if there is one): `glass trace
    /// --pid` has one of its own.
    pub fn spawn(
        subcommand: &str,
        args: &[String],
        mark: Option<RawFd>,
    ) -> std::io::Result<Guardian> {
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
            command.pre_exec(move || {
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
                // The stop mark is close-on-exec (nothing else glass starts gets it):
                // the guardian inherits it on purpose.
                if let Some(mark) = mark {
                    if libc::fcntl(mark, libc::F_SETFD, 0) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
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
    /// Hands the guardian the code glass is about to patch: if glass dies from now on,
    /// the guardian puts it back before it lets the VM run.
    pub fn tell(&mut self, ledger: &CodeLedger) -> std::io::Result<()> {
        match self.pipe.as_mut() {
            Some(pipe) => pipe.write_all(ledger.lines().as_bytes()),
            None => Ok(()),
        }
    }

    pub fn pipe_fd(&self) -> RawFd {
        self.pipe.as_ref().map_or(-1, |p| p.as_raw_fd())
    }

    /// The recording ended and glass left the target as it should: the guardian exits
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

/// What the guardian saw glass do.
enum Ending {
    /// EOF without `done`: glass died (SIGKILL, the OOM killer, a crash).
    Died,
    /// glass held its target stopped past the bound and the guardian killed it; how long
    /// the stop had lasted when it did.
    Killed(Duration),
}

impl Ending {
    /// The start of the one line the guardian prints.
    fn cause(&self, held: &str, bound: Duration) -> String {
        match self {
            Ending::Died => "glass ended without finishing the recording".into(),
            Ending::Killed(stopped) => format!(
                "glass held {held} stopped for {:.0} ms, past the stop bound of {} ms ({}): its guardian killed it, and the recording ends there (readable up to its last flush)",
                stopped.as_secs_f64() * 1e3,
                bound.as_millis(),
                crate::STOP_BOUND_VARIABLE
            ),
        }
    }
}

/// The guardian process.
pub fn run(args: &GuardianArgs) -> crate::Result<i32> {
    // Already ignored since exec (see `start`); again in case someone runs it by hand.
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: setting a disposition.
        unsafe { libc::signal(signal, libc::SIG_IGN) };
    }
    // Its looks must come on time on a loaded machine (it sleeps between them, a few
    // microseconds of work each): a higher priority where permitted (root), else as is.
    // With autogroup scheduling the guardian's session (its own, see `spawn`) is a
    // group of its own, whose weight its nice value does not change: set both.
    // SAFETY: no memory arguments.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, -10) };
    let _ = std::fs::write("/proc/self/autogroup", "-10");
    // Mapped now, while glass certainly holds its end.
    let mark = StopMark::inherit(args.stop_mark).map_err(|e| {
        crate::Failure::runtime(format!("guardian: cannot map glass's stop mark: {e}"))
    })?;
    let bound = Duration::from_millis(args.bound_ms);
    // A pidfd of glass, taken while glass is certainly our parent (checked after: a
    // glass already gone would have left us to another parent), so that the kill below
    // cannot reach a process that reused its pid.
    let glass = pidfd_open(args.glass)
        // SAFETY: getppid has no arguments.
        .filter(|_| unsafe { libc::getppid() } == args.glass);
    let Some((vm, ending, ledger)) = watch(args, &mark, bound, glass.as_ref()) else {
        return Ok(0);
    };
    // EOF without `done`: glass died, or `watch` killed it.
    let died = Instant::now();
    if args.ptrace {
        // The kernel detached every tracee of the dead glass and let it run; a launched
        // program runs on, as it does whenever glass dies.
        if matches!(ending, Ending::Killed(_)) {
            eprintln!(
                "glass: {}; the kernel let its threads run",
                ending.cause("threads of its target", bound)
            );
        }
        return Ok(0);
    }
    if let Some(domid) = args.xen {
        if !ledger.is_empty() {
            return Ok(put_back_xen(domid, &mark, &ledger, died, &ending, bound));
        }
        return Ok(unpause_xen(domid, &mark, died, &ending, bound));
    }
    Ok(let_vm_run(args, vm, &ending, &ledger, bound, died))
}

/// The QEMU `--vm` launched, as glass told the guardian: its pid, and a pidfd of it.
type LaunchedVm = (i32, Option<OwnedFd>);

/// Watches glass until its pipe ends: kills glass when it is stalled in a stop past the
/// bound, and takes in what glass writes (`vm PID`, the ledger). None when glass said
/// `done`; else the launched QEMU (its pid, a pidfd of it), how glass ended, and the
/// code it had patched.
fn watch(
    args: &GuardianArgs,
    mark: &StopMark,
    bound: Duration,
    glass: Option<&OwnedFd>,
) -> Option<(Option<LaunchedVm>, Ending, CodeLedger)> {
    let mut ledger = CodeLedger::default();
    let look_every = (bound / 10).clamp(Duration::from_millis(1), LOOK_EVERY);
    let mut vm: Option<LaunchedVm> = None;
    let mut ending = Ending::Died;
    let mut watched: Option<Watched> = None;
    let mut pending = Vec::new();
    let mut buf = [0u8; 256];
    loop {
        if matches!(ending, Ending::Died) {
            if let Some(since) = mark.since_ns() {
                let stopped = Duration::from_nanos(monotonic_ns().saturating_sub(since));
                // Watched (glass's CPU time read: four system calls) only once it has
                // lasted a look: most stops end within a millisecond, and reading for
                // each one the guardian happened to see cost dom0 CPU per sample at
                // 997 Hz. The CPU spent in the first look is then not counted, a tenth
                // of the bound at most.
                if stopped >= look_every && watched.as_ref().is_none_or(|w| w.since != since) {
                    watched = Some(Watched {
                        since,
                        cpu_ns: cpu_ns(args.glass, mark.thread()),
                    });
                }
                // Read again just before the kill: the same stop, still held.
                if stopped > bound
                    && watched
                        .as_ref()
                        .is_some_and(|w| stalled(args.glass, mark, since, bound, w))
                    && mark.since_ns() == Some(since)
                {
                    if let Some(glass) = glass {
                        pidfd_signal(glass, libc::SIGKILL);
                        ending = Ending::Killed(stopped);
                    }
                }
            }
        }
        // Every few ms while glass lives (fewer once it is being killed: EOF comes).
        let mut poll = libc::pollfd {
            fd: 0,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let ready = unsafe { libc::poll(&mut poll, 1, look_every.as_millis() as i32) };
        if ready <= 0 {
            // Nothing yet (or an interrupted poll): look at the mark again.
            continue;
        }
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
                return None;
            }
            if let Some(pid) = line.strip_prefix("vm ").and_then(|p| p.parse::<i32>().ok()) {
                // A pidfd now, while QEMU certainly exists: later signals cannot reach
                // another process that reused the pid.
                vm = Some((pid, pidfd_open(pid)));
            } else {
                ledger.take_line(&line);
            }
        }
    }
    Some((vm, ending, ledger))
}

/// glass died holding a QEMU VM: removes the stub glass enabled through the monitor,
/// ends the QEMU `--vm` launched (unless `--keep-vm`), or lets the VM run through its
/// stub. Returns the exit code.
fn let_vm_run(
    args: &GuardianArgs,
    vm: Option<LaunchedVm>,
    ending: &Ending,
    ledger: &CodeLedger,
    bound: Duration,
    died: Instant,
) -> i32 {
    let mut cause = ending.cause("the VM", bound);
    let stub = args.stub.clone().unwrap_or_default();
    // A QEMU `--vm` launched ends with glass: its code needs no putting back.
    let vm_ends = args.launched && !args.keep_vm;
    if !ledger.is_empty() && !vm_ends {
        match ledger.put_back_through(&stub, Instant::now() + CONNECT_FOR) {
            Ok(moved) => cause.push_str(&format!(
                "; its guardian put back the {} patched code ranges ({moved} vCPUs moved out of the trampolines)",
                ledger.code.len()
            )),
            Err(error) => cause.push_str(&format!(
                "; its guardian could NOT put back the code glass patched: {error}"
            )),
        }
    }
    if args.qmp.is_some() || args.libvirt.is_some() {
        let until = Instant::now() + CONNECT_FOR;
        match unhook(args.qmp.as_deref(), args.libvirt.as_deref(), until) {
            Ok(what) => eprintln!(
                "glass: {cause}; its guardian {what} in {:.1} ms",
                died.elapsed().as_secs_f64() * 1e3
            ),
            Err(error) => eprintln!(
                "glass: {cause}; its guardian could not remove the GDB stub glass enabled or let the VM run: {error} (HMP: gdbserver none, then cont)"
            ),
        }
        return 0;
    }
    if args.launched {
        let Some((pid, pidfd)) = vm else {
            // glass died before launching QEMU: there is no VM.
            return 0;
        };
        if !args.keep_vm {
            // The VM is to end with the recording: SIGTERM ends QEMU whether the VM is
            // running or stopped, so no detach first.
            let how = end_qemu(pidfd.as_ref());
            let _ = std::fs::remove_file(&stub);
            eprintln!(
                "glass: {cause}; its guardian {how} (QEMU pid {pid}, {:.0} ms later)",
                died.elapsed().as_secs_f64() * 1e3
            );
            return 0;
        }
        let mut gone = || pidfd.as_ref().is_some_and(|fd| exited(fd, 0));
        match let_run(&stub, Instant::now() + CONNECT_FOR, &mut gone) {
            Ok(()) => eprintln!(
                "glass: {cause}; its guardian let the VM run in {:.1} ms (left running, --keep-vm: QEMU pid {pid}, GDB stub at {})",
                died.elapsed().as_secs_f64() * 1e3,
                stub
            ),
            Err(error) => eprintln!(
                "glass: {cause}; its guardian could not let the VM run (QEMU pid {pid}): {error}"
            ),
        }
        return 0;
    }
    match let_run(&stub, Instant::now() + CONNECT_FOR, &mut || false) {
        Ok(()) => eprintln!(
            "glass: {cause}; its guardian let the VM run in {:.1} ms",
            died.elapsed().as_secs_f64() * 1e3
        ),
        Err(error) => {
            eprintln!("glass: {cause}; its guardian could not let the VM run: {error}")
        }
    }
    0
}

/// glass died: unpauses Xen domain `domid` if glass held it paused. Returns the exit code.
fn unpause_xen(
    domid: u32,
    mark: &StopMark,
    died: Instant,
    ending: &Ending,
    bound: Duration,
) -> i32 {
    let cause = ending.cause(&format!("Xen domain {domid}"), bound);
    if !mark.held() {
        // Between samples: the domain runs.
        if matches!(ending, Ending::Killed(_)) {
            eprintln!("glass: {cause}; the domain was running");
        }
        return 0;
    }
    let unpaused = Hypervisor::unpause_left(domid);
    match unpaused {
        Ok(Unpaused::WasRunning) => {
            mark.end();
            eprintln!(
                "glass: {cause}; its pause had not taken effect: Xen domain {domid} was not paused, and runs"
            );
            0
        }
        Ok(Unpaused::Unpaused) => {
            mark.end();
            eprintln!(
                "glass: {cause}; its guardian unpaused Xen domain {domid} in {:.1} ms",
                died.elapsed().as_secs_f64() * 1e3
            );
            0
        }
        Err(error) => {
            eprintln!(
                "glass: {cause}; its guardian could not unpause Xen domain {domid}: {error} (run: xl unpause {domid})"
            );
            1
        }
    }
}

/// `glass trace --xen` died with the domain patched: with the domain paused (its own
/// pause, nested in any glass held), puts the code back as glass's detach does, lets
/// the domain run, and releases glass's pause if it held one. Returns the exit code.
fn put_back_xen(
    domid: u32,
    mark: &StopMark,
    ledger: &CodeLedger,
    died: Instant,
    ending: &Ending,
    bound: Duration,
) -> i32 {
    let cause = ending.cause(&format!("Xen domain {domid}"), bound);
    let put_back = (|| {
        let (mut code, _) = glass_target::xen::code::XenCode::open(&domid.to_string(), None)
            .map_err(|e| e.to_string())?;
        let mut regs = vec![
            glass_target::arch::VcpuRegs::zeroed(glass_target::guest::Arch::X86_64);
            glass_target::guest_code::GuestCode::vcpu_count(&code)
        ];
        glass_target::guest_code::GuestCode::stop_with_registers(&mut code, &mut regs)?;
        let moved = ledger.put_back(&mut code);
        let resumed = glass_target::guest_code::GuestCode::resume(&mut code);
        let moved = moved?;
        resumed?;
        Ok::<usize, String>(moved)
    })();
    let released = if mark.held() {
        let released = Hypervisor::unpause_left(domid);
        mark.end();
        released.map(|_| ())
    } else {
        Ok(())
    };
    match (put_back, released) {
        (Ok(moved), Ok(())) => {
            eprintln!(
                "glass: {cause}; its guardian put back the {} patched ranges of Xen domain {domid} ({moved} vCPUs moved out of the trampolines) and let it run, in {:.1} ms",
                ledger.code.len(),
                died.elapsed().as_secs_f64() * 1e3
            );
            0
        }
        (Err(error), _) => {
            eprintln!(
                "glass: {cause}; its guardian could not put back the code glass patched in Xen domain {domid}: {error}"
            );
            1
        }
        (Ok(_), Err(error)) => {
            eprintln!(
                "glass: {cause}; its guardian put the code back but could not unpause Xen domain {domid}: {error} (run: xl unpause {domid})"
            );
            1
        }
    }
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

/// What the guardian knows of the stop glass holds: when it began (the mark's time),
/// and the CPU time glass's thread had used when the guardian first saw it held for a
/// look or longer.
struct Watched {
    since: u64,
    cpu_ns: u64,
}

/// Whether glass, holding the stop that began at `since` past the bound, is stalled in
/// it: stopped (SIGSTOP, Ctrl-Z, a debugger: `T`, `t`), or it has spent half the bound
/// of CPU time in this one stop (a loop that does not end). Not stalled: asleep in a
/// system call (`S`), waiting for the target or its VMM to answer (a stop reply behind
/// QEMU's disk flush, a thread slow to stop, a QEMU itself stopped), which glass's own
/// timeouts bound and killing it would not shorten; nor runnable but waiting for a CPU
/// on a loaded machine, nor in a kernel wait: it lets the target go as soon as it runs.
/// The thread is the one that began the stop.
fn stalled(glass: i32, mark: &StopMark, since: u64, bound: Duration, watched: &Watched) -> bool {
    let tid = mark.thread();
    match state_of(glass, tid) {
        Some('T' | 't') => true,
        Some('R' | 'D') => {
            watched.since == since
                && cpu_ns(glass, tid).saturating_sub(watched.cpu_ns) >= bound.as_nanos() as u64 / 2
        }
        // Asleep; or gone (EOF follows).
        _ => false,
    }
}

/// CPU time thread `tid` of `pid` has used (/proc/PID/task/TID/schedstat), in ns.
fn cpu_ns(pid: i32, tid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat"))
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The state letter of thread `tid` of process `pid` (R, S, D, T, t, Z), if it exists.
fn state_of(pid: i32, tid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

pub(crate) fn pidfd_open(pid: i32) -> Option<OwnedFd> {
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
pub(crate) fn exited(pidfd: &OwnedFd, timeout_ms: i32) -> bool {
    let mut poll = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut poll, 1, timeout_ms) > 0 }
}
