//! Whose the session file is: `glass trace --pid` gives it to the user the process runs
//! as (a server's worker has usually dropped root for `nobody`), and when the process's
//! runtime still cannot map it, says in one line why and what to do.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use glass_probe_abi::session::Owner;

/// Who a process is to the kernel's permission checks on files: its filesystem uid and
/// gid (the effective ones, unless it called setfsuid) and its supplementary groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

impl Credentials {
    /// From `/proc/PID/status` (`Uid:` and `Gid:` give real, effective, saved and
    /// filesystem ids, in that order).
    pub fn of_process(pid: i32) -> std::io::Result<Credentials> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let ids = |key: &str| -> Vec<u32> {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .map(|rest| {
                    rest.split_whitespace()
                        .filter_map(|n| n.parse().ok())
                        .collect()
                })
                .unwrap_or_default()
        };
        let (uid, gid) = (ids("Uid:"), ids("Gid:"));
        match (uid.get(3), gid.get(3)) {
            (Some(&uid), Some(&gid)) => Ok(Credentials {
                uid,
                gid,
                groups: ids("Groups:"),
            }),
            _ => Err(std::io::Error::other(format!(
                "no Uid and Gid lines in /proc/{pid}/status"
            ))),
        }
    }

    pub fn owner(&self) -> Owner {
        Owner {
            uid: self.uid,
            gid: self.gid,
        }
    }

    /// Does the mode of `file` give this user all of `access` (a mask of the owner's
    /// bits: 0o100 to search a directory, 0o600 to read and write a file)?
    fn may(&self, file: &std::fs::Metadata, access: u32) -> bool {
        let mode = file.mode();
        if self.uid == 0 {
            true
        } else if file.uid() == self.uid {
            mode & access == access
        } else if file.gid() == self.gid || self.groups.contains(&file.gid()) {
            mode & (access >> 3) == access >> 3
        } else {
            mode & (access >> 6) == access >> 6
        }
    }

    /// "uid 65534 (nobody), gid 65534"
    fn describe(&self) -> String {
        let name = user_name(self.uid).map_or(String::new(), |n| format!(" ({n})"));
        format!("uid {}{name}, gid {}", self.uid, self.gid)
    }
}

/// The name /etc/passwd (or NSS) gives `uid`.
fn user_name(uid: u32) -> Option<String> {
    let mut buffer = vec![0 as libc::c_char; 4096];
    // SAFETY: getpwuid_r fills `entry` with pointers into `buffer`, both ours and alive
    // while the name is copied out.
    unsafe {
        let mut entry: libc::passwd = std::mem::zeroed();
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        let status = libc::getpwuid_r(
            uid,
            &mut entry,
            buffer.as_mut_ptr(),
            buffer.len(),
            &mut found,
        );
        if status != 0 || found.is_null() || entry.pw_name.is_null() {
            return None;
        }
        Some(
            std::ffi::CStr::from_ptr(entry.pw_name)
                .to_string_lossy()
                .into_owned(),
        )
    }
}

fn errno_name(errno: i32) -> Option<&'static str> {
    Some(match errno {
        libc::EACCES => "EACCES",
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EMFILE => "EMFILE",
        libc::ENFILE => "ENFILE",
        libc::ENOMEM => "ENOMEM",
        libc::ENODEV => "ENODEV",
        libc::EPROTO => "EPROTO",
        libc::EBUSY => "EBUSY",
        _ => return None,
    })
}

/// Why `pid` sees other files than glass at the same path, if it does: another mount
/// namespace, or a chroot.
fn elsewhere(pid: i32) -> Option<String> {
    let ours = std::fs::read_link("/proc/self/ns/mnt").ok()?;
    let theirs = std::fs::read_link(format!("/proc/{pid}/ns/mnt")).ok()?;
    if ours != theirs {
        return Some(format!(
            "pid {pid} runs in another mount namespace than glass (a container, or a service with a /dev/shm of its own)"
        ));
    }
    let root = std::fs::read_link(format!("/proc/{pid}/root")).ok()?;
    (root != Path::new("/")).then(|| format!("pid {pid} is chrooted to {}", root.display()))
}

/// The first directory on the way to `file` that `user` may not pass through, with its
/// metadata.
fn blocking_directory(file: &Path, user: &Credentials) -> Option<(String, std::fs::Metadata)> {
    let mut ancestors: Vec<&Path> = file.ancestors().skip(1).collect();
    ancestors.reverse();
    ancestors.into_iter().find_map(|dir| {
        let meta = std::fs::metadata(dir).ok()?;
        (!user.may(&meta, 0o100)).then(|| (dir.display().to_string(), meta))
    })
}

/// The line for a runtime in `pid` that could not map the session `file` glass gave
/// to `given` (`errno`: what the runtime's open, fstat or mmap failed with).
pub fn refusal(pid: i32, file: &Path, given: &Credentials, errno: i32) -> String {
    let now = Credentials::of_process(pid).unwrap_or_else(|_| given.clone());
    let path = file.display();
    let elsewhere = matches!(errno, libc::ENOENT | libc::EACCES | libc::EPERM)
        .then(|| elsewhere(pid))
        .flatten();
    let (why, what_to_do) = match errno {
        _ if elsewhere.is_some() => (
            format!("{} and cannot reach {path} there", elsewhere.unwrap_or_default()),
            format!("run glass where the process is (nsenter --target {pid} --mount --root glass trace --pid {pid} ...) with the glass binary present there, or trace the program by launching it under glass"),
        ),
        libc::ENOENT => (
            format!("{path} was removed before the process opened it"),
            "attach again, and keep other programs from cleaning /dev/shm and /tmp meanwhile".to_string(),
        ),
        libc::EACCES | libc::EPERM if now.uid != given.uid || now.gid != given.gid => (
            format!("the process changed its user to {} after glass gave the file to {}", now.describe(), given.describe()),
            "attach again".to_string(),
        ),
        libc::EACCES | libc::EPERM => {
            let file_meta = std::fs::metadata(file).ok();
            let mode = |m: &std::fs::Metadata| {
                format!("mode {:04o}, owner uid {}, gid {}", m.mode() & 0o7777, m.uid(), m.gid())
            };
            match (file_meta, blocking_directory(file, &now)) {
                (Some(meta), _) if !now.may(&meta, 0o600) => (
                    format!("the file ({}) does not let that user read and write it", mode(&meta)),
                    "run glass as root, or as that user".to_string(),
                ),
                (_, Some((dir, meta))) => (
                    format!("{dir} ({}) does not let that user through", mode(&meta)),
                    format!("make {dir} searchable for it (chmod o+x {dir}; /dev/shm is normally mode 1777)"),
                ),
                _ => (
                    "the file and every directory above it let that user through, so a security module (AppArmor, SELinux) or a seccomp filter of the process denies the open".to_string(),
                    "allow the process to open files in that directory, or trace the program by launching it under glass".to_string(),
                ),
            }
        }
        libc::EMFILE | libc::ENFILE => (
            "the process (EMFILE) or the system (ENFILE) has no file descriptor left".to_string(),
            format!("raise its limit (prlimit --pid {pid} --nofile=...) or close files, and attach again"),
        ),
        libc::ENOMEM => (
            "the process has no room in its address space for the rings (its RLIMIT_AS?)".to_string(),
            format!("lower --max-threads or --ring-size, or raise its limit (prlimit --pid {pid} --as=...)"),
        ),
        libc::ENODEV => (
            "the filesystem of the file cannot be mapped".to_string(),
            "make /dev/shm a tmpfs".to_string(),
        ),
        libc::EPROTO => (
            "the file is not a session the runtime loaded in the process understands (a libglass_probe.so of another glass version, loaded by an earlier attach, stays loaded)".to_string(),
            "trace it with the glass that first attached to it, or restart it".to_string(),
        ),
        _ => (String::new(), String::new()),
    };
    // "Permission denied (EACCES)" rather than "Permission denied (os error 13)".
    let error = std::io::Error::from_raw_os_error(errno).to_string();
    let error = match (error.split(" (os error").next(), errno_name(errno)) {
        (Some(text), Some(name)) => format!("{text} ({name})"),
        _ => error,
    };
    let mut line = format!(
        "the probe runtime in pid {pid} (running as {}) could not map the session {path}: {error}",
        now.describe(),
    );
    if !why.is_empty() {
        line += &format!(": {why}; {what_to_do}");
    }
    line + " (nothing was patched)"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process_s_credentials() {
        let me = Credentials::of_process(std::process::id() as i32).unwrap();
        // SAFETY: plain system calls without arguments.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        assert_eq!((me.uid, me.gid), (uid, gid));
    }
}
