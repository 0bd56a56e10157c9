//! Starting a command so that a backend can attach to it before it runs: the child is
//! forked, waits on a pipe until the backend has attached (ptrace) or opened its events
//! (perf), then execs. An exec failure travels back through a close-on-exec pipe.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;

use crate::TargetError;

/// A forked child waiting to exec its command.
pub struct PausedChild {
    pub pid: i32,
    program: String,
    go: Option<OwnedFd>,
    exec_error: OwnedFd,
}

/// In the child glass forks to exec a VMM (QEMU), between fork and exec: an empty signal
/// mask (glass blocks the signals it waits for), SIGTTOU and SIGTTIN ignored (a background
/// process group that sets up the terminal, `-serial stdio`, would be stopped and the VM
/// never run), and `inherit` (the guest's RAM, or glass's region) kept open across the
/// exec: the one descriptor the VMM is meant to get. Async-signal-safe calls only.
///
/// # Safety
/// Call only in a forked child before it execs (`CommandExt::pre_exec`).
pub unsafe fn prepare_vmm_child(inherit: std::os::fd::RawFd) -> io::Result<()> {
    // SAFETY: the caller is a forked child; these calls are async-signal-safe.
    unsafe {
        let empty: libc::sigset_t = std::mem::zeroed();
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        libc::signal(libc::SIGTTOU, libc::SIG_IGN);
        libc::signal(libc::SIGTTIN, libc::SIG_IGN);
        if libc::fcntl(inherit, libc::F_SETFD, 0) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Resolves a command the way execvp would, so that a missing command is an error
/// before anything is started.
pub fn resolve_command(command: &str) -> Result<PathBuf, TargetError> {
    use std::os::unix::fs::PermissionsExt;
    let is_executable = |path: &std::path::Path| {
        std::fs::metadata(path)
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    };
    if command.contains('/') {
        let path = PathBuf::from(command);
        if !path.exists() {
            return Err(TargetError::CommandNotFound(command.to_string()));
        }
        if !is_executable(&path) {
            return Err(TargetError::CommandNotExecutable(command.to_string()));
        }
        return Ok(path);
    }
    let search = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&search)
        .map(|dir| dir.join(command))
        .find(|candidate| is_executable(candidate))
        .ok_or_else(|| TargetError::CommandNotFound(command.to_string()))
}

/// Forks a child that will exec `argv` once released. Must be called while glass is
/// single-threaded.
pub fn spawn_paused(argv: &[String]) -> Result<PausedChild, TargetError> {
    spawn_paused_with_env(argv, &[])
}

/// [`spawn_paused`], with `env` added to (or replacing in) glass's environment.
pub fn spawn_paused_with_env(
    argv: &[String],
    env: &[(String, String)],
) -> Result<PausedChild, TargetError> {
    let program = argv
        .first()
        .ok_or(TargetError::CommandNotFound(String::new()))?;
    let path = resolve_command(program)?;
    let to_c = |s: &str| CString::new(s).map_err(|_| TargetError::BadArgument(s.to_string()));
    let c_path = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| TargetError::BadArgument(program.clone()))?;
    let c_args = argv
        .iter()
        .map(|a| to_c(a))
        .collect::<Result<Vec<_>, _>>()?;
    let mut c_argv: Vec<*const libc::c_char> = c_args.iter().map(|a| a.as_ptr()).collect();
    c_argv.push(std::ptr::null());
    let mut c_env = Vec::new();
    for (key, value) in std::env::vars_os() {
        if env
            .iter()
            .any(|(k, _)| key.as_encoded_bytes() == k.as_bytes())
        {
            continue;
        }
        let mut entry = key.into_encoded_bytes();
        entry.push(b'=');
        entry.extend_from_slice(value.as_encoded_bytes());
        c_env.push(CString::new(entry).map_err(|_| {
            TargetError::BadInput("an environment variable holds a NUL byte".into())
        })?);
    }
    for (key, value) in env {
        c_env.push(to_c(&format!("{key}={value}"))?);
    }
    let mut c_envp: Vec<*const libc::c_char> = c_env.iter().map(|a| a.as_ptr()).collect();
    c_envp.push(std::ptr::null());

    let pipe =
        || nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| TargetError::Io(e.into()));
    let (go_read, go_write) = pipe()?;
    let (err_read, err_write) = pipe()?;

    // SAFETY: glass is single-threaded here; the child only makes async-signal-safe calls
    // before exec.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(TargetError::Io(io::Error::last_os_error()));
    }
    if child == 0 {
        unsafe {
            // glass blocks the signals it waits for; the command must not inherit that.
            let empty: libc::sigset_t = std::mem::zeroed();
            libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
            libc::close(go_write.as_raw_fd());
            let mut byte = 0u8;
            while libc::read(go_read.as_raw_fd(), (&mut byte as *mut u8).cast(), 1) < 0 {}
            libc::execve(c_path.as_ptr(), c_argv.as_ptr(), c_envp.as_ptr());
            let code = *libc::__errno_location();
            libc::write(err_write.as_raw_fd(), (&code as *const i32).cast(), 4);
            libc::_exit(127);
        }
    }
    Ok(PausedChild {
        pid: child,
        program: program.clone(),
        go: Some(go_write),
        exec_error: err_read,
    })
}

impl PausedChild {
    /// Lets the child exec and waits until it has (or has failed to).
    pub fn release(mut self) -> Result<(), TargetError> {
        drop(self.go.take());
        let mut code = [0u8; 4];
        let n = nix::unistd::read(&self.exec_error, &mut code).unwrap_or(0);
        if n == 4 {
            return Err(TargetError::Exec(
                self.program.clone(),
                io::Error::from_raw_os_error(i32::from_ne_bytes(code)),
            ));
        }
        Ok(())
    }

    /// Kills and reaps a child that will not be released.
    pub fn abandon(self) {
        // SAFETY: our own child, still waiting before exec.
        unsafe { libc::kill(self.pid, libc::SIGKILL) };
        drop(self.go);
        let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(self.pid), None);
    }
}
