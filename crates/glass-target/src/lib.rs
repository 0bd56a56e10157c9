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
pub mod inject;
pub mod launch;
pub mod perf;
pub mod procfs;
pub mod ptrace;
mod regs;
pub mod stop_mark;
pub mod xen;

pub use regs::SampleRegs;

#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("no process with pid {0}")]
    NoSuchProcess(i32),
    #[error("cannot trace pid {0}: {reason}", reason = attach_reason(*.1))]
    Attach(i32, i32),
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
    #[error("{0}")]
    Io(std::io::Error),
}

impl TargetError {
    /// Whether the user asked for something impossible (as opposed to a failure while
    /// doing it).
    pub fn is_bad_input(&self) -> bool {
        !matches!(self, TargetError::Io(_))
    }
}

fn attach_reason(code: i32) -> String {
    match code {
        libc::EPERM => "operation not permitted (a kernel thread, a process already being traced, \
                        or one this user may not trace: run as its owner or as root, and check \
                        /proc/sys/kernel/yama/ptrace_scope)"
            .to_string(),
        code => std::io::Error::from_raw_os_error(code).to_string(),
    }
}
