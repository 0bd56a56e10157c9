//! How a target is stopped, read and resumed: one module per backend.
//!
//! - [`ptrace`]: Linux processes, every thread and every forked child.
//!
//! A backend hands the sampler a [`ptrace::Tick`] of raw samples (addresses, thread,
//! time, stopped time) and a stream of [`ptrace::TargetEvent`]s; it never symbolizes.

pub mod arch;
pub mod attach;
pub mod gdbstub;
pub mod guest;
pub mod guest_code;
pub mod guest_os;
pub mod host_cpu;
pub mod inject;
pub mod launch;
pub mod libvirt;
pub mod perf;
pub mod procfs;
pub mod ptrace;
pub mod python;
pub mod qmp;
mod regs;
pub mod stop_mark;
pub mod thread_state;
pub mod xen;

pub use regs::SampleRegs;

/// A test hook: when `GLASS_TEST_STOP_AT` names `step`, glass stops itself (SIGSTOP)
/// there, so that a test can kill it (or let it go on) at exactly that step instead of
/// hoping a timed signal lands in it. Read once; costs nothing otherwise.
pub fn test_hook(step: &str) {
    static STOP_AT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let wanted = STOP_AT.get_or_init(|| std::env::var("GLASS_TEST_STOP_AT").ok());
    if wanted.as_deref() == Some(step) {
        eprintln!("glass: test hook: stopped at {step}");
        // SAFETY: raising a signal on this process.
        unsafe { libc::raise(libc::SIGSTOP) };
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("no process with pid {0}")]
    NoSuchProcess(i32),
    #[error("cannot trace pid {0}: {reason}", reason = attach_reason(*.0, *.1))]
    Attach(i32, i32),
    #[error("pid {0} is already being traced by pid {1} ({2}); a process has one tracer at a time: detach that one first")]
    TracedBy(i32, i32, String),
    #[error("command not found: {0}")]
    CommandNotFound(String),
    #[error("command is not executable: {0}")]
    CommandNotExecutable(String),
    #[error("cannot run {0}: {1}")]
    Exec(String, std::io::Error),
    /// An argument for exec that holds a NUL byte (the argument itself). Other bad input
    /// is [`TargetError::BadInput`].
    #[error("argument contains a NUL byte: {0:?}")]
    BadArgument(String),
    /// Input glass cannot use; the text is the whole message and says what is wrong
    /// (`--vm needs -kernel in the QEMU command or --symbols`).
    #[error("{0}")]
    BadInput(String),
    /// A thread glass held did not stop in the time glass gives it (exiting, or stuck in
    /// the kernel); the text says which.
    #[error("{0}")]
    TimedOut(String),
    /// The kernel says a thread glass seized is not its tracee to wait for (ECHILD);
    /// seen while it let the tracees of a glass that died go.
    #[error("{0}")]
    NotTracee(std::io::Error),
    #[error("{0}")]
    Io(std::io::Error),
}

impl TargetError {
    /// Whether the user asked for something impossible (as opposed to a failure while
    /// doing it).
    pub fn is_bad_input(&self) -> bool {
        !matches!(
            self,
            TargetError::Io(_) | TargetError::TimedOut(_) | TargetError::NotTracee(_)
        )
    }
}

fn attach_reason(pid: i32, code: i32) -> String {
    match code {
        // perf_event_open and /proc/PID/mem refuse a process of another user this way.
        libc::EACCES => format!(
            "permission denied: {} and glass runs as uid {}; run glass as that user, or as root (or with CAP_SYS_PTRACE; the perf backend also wants CAP_PERFMON or /proc/sys/kernel/perf_event_paranoid at -1)",
            owner_of(pid),
            unsafe { libc::geteuid() }
        ),
        libc::EPERM => "operation not permitted (a kernel thread, a process already being traced, \
                        or one this user may not trace: run as its owner or as root, and check \
                        /proc/sys/kernel/yama/ptrace_scope)"
            .to_string(),
        code => std::io::Error::from_raw_os_error(code).to_string(),
    }
}

/// "it runs as uid N", from /proc/PID/status (its real uid).
fn owner_of(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("Uid:"))?;
            Some(format!(
                "it runs as uid {}",
                line.split_whitespace().nth(1)?
            ))
        })
        .unwrap_or_else(|| "it runs as another user".to_string())
}
