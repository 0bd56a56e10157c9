//! The probe runtime, embedded in glass (build.rs builds it), and the sealed memfd it is
//! handed to a target from: nothing is installed beside glass and nothing is written to
//! disk. A launched program preloads `/proc/<glass>/fd/<n>` (it runs as glass's user); an
//! attached process, which may run as another user or in another mount or pid namespace,
//! gets its own memfd, filled and sealed by glass through `/proc/<pid>/fd/<n>`, and loads
//! `/proc/self/fd/<n>` (attach/runtime.rs).

use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::error::{Failure, Result};

static BYTES: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libglass_probe.so"));

/// The runtime's bytes.
pub fn bytes() -> &'static [u8] {
    BYTES
}

/// The memfd name the runtime is loaded under, unique to these bytes: a process's maps
/// show `/memfd:<name> (deleted)`, which is how glass finds this runtime there, and a
/// runtime another glass build left in a process is not mistaken for it.
pub fn name() -> String {
    // FNV-1a: stable across Rust versions, unlike std's hasher.
    let hash = BYTES.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    format!("libglass_probe-{hash:016x}.so")
}

/// Is `mapping_path` (as /proc/<pid>/maps names it) this runtime?
pub fn is_mapping(mapping_path: &str) -> bool {
    let Some(rest) = mapping_path.strip_prefix("/memfd:") else {
        return false;
    };
    rest.strip_suffix(" (deleted)").unwrap_or(rest) == name()
}

/// Seals a memfd that holds the runtime: no write, resize or later unsealing.
pub fn seal(fd: &impl AsRawFd) -> std::io::Result<()> {
    let seals = libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;
    // SAFETY: fcntl on an open descriptor.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A sealed, close-on-exec memfd in glass holding the runtime.
pub fn memfd() -> Result<OwnedFd> {
    let failed = |e: std::io::Error| {
        Failure::runtime(format!(
            "cannot put the probe runtime in a memfd (memfd_create, Linux 3.17 or later): {e}"
        ))
    };
    let name = std::ffi::CString::new(name()).expect("no NUL in the name");
    // SAFETY: memfd_create with a NUL-terminated name.
    let fd =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(failed(std::io::Error::last_os_error()));
    }
    // SAFETY: a descriptor memfd_create just returned, owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut file = std::fs::File::from(fd);
    file.write_all(BYTES).map_err(failed)?;
    seal(&file).map_err(failed)?;
    Ok(file.into())
}
