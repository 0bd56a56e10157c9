//! The probe runtime in the process: where injected calls land (the landing, borrowed
//! from the unused tail of an executable mapping), loading the runtime with the
//! process's own dlopen, joining and leaving the session, binding lazy GOT slots,
//! sending the unwinder's GOT slots to the runtime's hooks, and the ledger's mapping.

use std::path::PathBuf;
use std::time::Duration;

use glass_target::inject::{CallArg, StoppedProcess};
use glass_target::procfs::Mapping;
use object::{Object, ObjectSegment};

use super::*;

/// Longest an injected call (dlopen) may take before glass gives up.
pub(super) const CALL_LIMIT: Duration = Duration::from_secs(10);

/// What glass finds in the runtime it loads: how to join and leave a session, the
/// table of the real unwinder functions, and the unwinder hooks (in the order of that
/// table: the runtime's REAL_FUNCTIONS).
pub(super) const RUNTIME_SYMBOLS: [&str; 10] = [
    "glass_probe_attach",
    "glass_probe_detach",
    "glass_probe_real_functions",
    "glass_probe_ledger",
    "glass_probe_landing",
    "_Unwind_RaiseException",
    "_Unwind_Resume",
    "_Unwind_Resume_or_Rethrow",
    "_Unwind_ForcedUnwind",
    "__cxa_begin_catch",
];
pub(super) const LEDGER: usize = 3;
pub(super) const LANDING: usize = 4;
pub(super) const FIRST_HOOK: usize = 5;

/// The GOT slots through which the process's modules call the C++ unwinder's entry
/// points: (slot address, index of the hooked function). When preloaded, the runtime
/// interposes these functions; loaded with dlopen it cannot, so glass points the slots
/// at its hooks, or an exception thrown through an instrumented frame would meet a
/// hijacked return address the unwinder cannot read past, and terminate the program.
pub(super) fn unwinder_slots(pid: i32, mappings: &[Mapping]) -> Vec<(u64, usize)> {
    let names: Vec<String> = RUNTIME_SYMBOLS[FIRST_HOOK..]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut seen = std::collections::HashSet::new();
    let mut slots = Vec::new();
    for mapping in mappings {
        let name = file_name(&mapping.path);
        if !mapping.path.starts_with('/')
            || name.starts_with("libgcc_s")
            || name.starts_with("ld-linux")
            || !seen.insert(mapping.path.clone())
        {
            continue;
        }
        let file = PathBuf::from(format!("/proc/{pid}/root{}", mapping.path));
        let Ok(bytes) = std::fs::read(&file).or_else(|_| std::fs::read(&mapping.path)) else {
            continue;
        };
        let Ok(elf) = object::File::parse(&*bytes) else {
            continue;
        };
        let found = select::got_slots(&elf, &names);
        if found.is_empty() {
            continue;
        }
        let segments: Vec<(u64, u64, u64)> = elf
            .segments()
            .map(|s| (s.file_range().0, s.address(), s.file_range().1))
            .collect();
        let Some(bias) = glass_target::procfs::load_bias(mapping, &segments) else {
            continue;
        };
        for (symbol, slot) in found {
            if let Some(which) = names.iter().position(|n| *n == symbol) {
                slots.push((slot.wrapping_add(bias), which));
            }
        }
    }
    slots
}

/// Tells the runtime where the real unwinder functions are (as the loader binds them:
/// `dlsym`), and returns the slot writes that send the process's calls to its hooks:
/// (slot, hook address).
pub(super) fn unwinder_hooks(
    process: &StoppedProcess,
    slots: &[(u64, usize)],
    runtime_at: &[u64],
    dlsym: Option<u64>,
) -> Result<Vec<(u64, u64)>> {
    let pid = process.pid();
    let (Some(dlsym), false) = (dlsym, slots.is_empty()) else {
        return Ok(Vec::new());
    };
    let table = runtime_at[2];
    let mut writes = Vec::new();
    for (which, name) in RUNTIME_SYMBOLS[FIRST_HOOK..].iter().enumerate() {
        if !slots.iter().any(|&(_, w)| w == which) {
            continue;
        }
        let real = resolve(process, dlsym, name)?;
        if real == 0 {
            continue;
        }
        process
            .write(table + 8 * which as u64, &real.to_le_bytes())
            .map_err(|e| {
                Failure::runtime(format!("cannot set up the runtime in pid {pid}: {e}"))
            })?;
        let hook = runtime_at[FIRST_HOOK + which];
        writes.extend(
            slots
                .iter()
                .filter(|&&(_, w)| w == which)
                .map(|&(slot, _)| (slot, hook)),
        );
    }
    Ok(writes)
}

/// Where the landing of injected calls can go without a system call to map it: the
/// first 64-byte boundary past the end of an executable segment of a file the process
/// maps (the C library first), when the rest of that mapping's last page holds it. Those
/// bytes are mapped executable but belong to no function, so nothing else runs them.
/// glass borrows them while attached and puts the file's bytes back when it detaches.
pub(super) struct LandingSite {
    pub(super) at: u64,
    /// The bytes there, as the file has them.
    pub(super) original: Vec<u8>,
}

pub(super) fn landing_site(pid: i32) -> Option<LandingSite> {
    let room = glass_target::inject::landing_bytes().len();
    let mut mappings = glass_target::procfs::executable_mappings(pid).ok()?;
    mappings.retain(|m| m.path.starts_with('/') && !m.deleted);
    mappings.sort_by_key(|m| !file_name(&m.path).starts_with("libc.so"));
    for mapping in &mappings {
        let mut file = PathBuf::from(format!("/proc/{pid}/root{}", mapping.path));
        if !file.exists() {
            file = PathBuf::from(&mapping.path);
        }
        let Ok(bytes) = std::fs::read(&file) else {
            continue;
        };
        let Ok(elf) = object::File::parse(&*bytes) else {
            continue;
        };
        let segments: Vec<(u64, u64, u64)> = elf
            .segments()
            .map(|s| (s.file_range().0, s.address(), s.file_range().1))
            .collect();
        let Some(bias) = glass_target::procfs::load_bias(mapping, &segments) else {
            continue;
        };
        for segment in elf.segments() {
            let executable = matches!(segment.flags(), object::SegmentFlags::Elf { p_flags, .. } if p_flags.0 & object::elf::PF_X.0 != 0);
            let end = segment
                .address()
                .wrapping_add(segment.size())
                .wrapping_add(bias);
            let at = end.next_multiple_of(64);
            if !executable || end <= mapping.start || at + room as u64 > mapping.end {
                continue;
            }
            // Past the file's end the mapping reads zeros.
            let offset = (mapping.file_offset + (at - mapping.start)) as usize;
            let mut original = bytes.get(offset..).unwrap_or_default().to_vec();
            original.resize(room, 0);
            original.truncate(room);
            return Some(LandingSite { at, original });
        }
    }
    None
}

/// Puts back the bytes a landing borrowed (see [`LandingSite`]) once no injected call
/// needs it any more, and tells the runtime there is none.
pub(super) fn return_landing(process: &StoppedProcess, landing_word: u64) {
    if let Some(site) = landing_site(process.pid()).filter(|s| s.at == process.landing()) {
        let _ = process.write(site.at, &site.original);
        let _ = process.write(landing_word, &0u64.to_le_bytes());
    }
}

/// Reads a C string of the target.
pub(super) fn read_c_string(process: &StoppedProcess, address: u64) -> String {
    let mut text = Vec::new();
    for chunk in 0..8u64 {
        let Ok(bytes) = process.read(address + chunk * 64, 64) else {
            break;
        };
        if let Some(end) = bytes.iter().position(|&b| b == 0) {
            text.extend_from_slice(&bytes[..end]);
            break;
        }
        text.extend_from_slice(&bytes);
    }
    String::from_utf8_lossy(&text).into_owned()
}

/// Loads the runtime into the process (reusing, where an earlier attach left them, the
/// runtime and the landing of injected calls); returns where the RUNTIME_SYMBOLS are.
pub(super) fn load_runtime(
    process: &StoppedProcess,
    runtime: &FileSymbols,
    loader: &LoaderFunctions,
) -> Result<Vec<u64>> {
    let pid = process.pid();
    let failed = |what: &str, e: std::io::Error| {
        Failure::runtime(format!(
            "cannot {what} in pid {pid}: {e} (nothing was patched)"
        ))
    };
    let loaded_before = runtime
        .in_process(pid)
        .and_then(|a| a.into_iter().collect::<Option<Vec<u64>>>());
    if let Some(at) = &loaded_before {
        let landing = process.read_u64(at[LANDING]).unwrap_or(0);
        process.reuse_landing(landing);
    }
    if process.landing() == 0 {
        let placed = landing_site(pid).is_some_and(|site| {
            process.reuse_landing(site.at) || process.place_landing(site.at).is_ok()
        });
        if !placed {
            process
                .map_landing()
                .map_err(|e| failed("map the landing of injected calls", e))?;
        }
    }
    let handed = match &loaded_before {
        Some(_) => None,
        None => Some(hand_over(process, loader)?),
    };
    let handle = match &handed {
        // dlopen of the same file again: the runtime's handle, counted once more.
        None => 1,
        Some(handed) => {
            let mut path = handed.path.clone().into_bytes();
            path.push(0);
            let handle = process
                .call(
                    loader.dlopen,
                    &[CallArg::Bytes(&path), CallArg::Value(libc::RTLD_NOW as u64)],
                    CALL_LIMIT,
                )
                .map_err(|e| failed("load the probe runtime", e));
            if let (Some(fd), Some(close)) = (handed.target_fd, loader.close) {
                // The loader keeps its mapping; the descriptor is not the program's.
                let _ = process.call(close, &[CallArg::Value(fd)], CALL_LIMIT);
            }
            handle?
        }
    };
    if handle == 0 {
        let message = process
            .call(loader.dlerror, &[], CALL_LIMIT)
            .ok()
            .filter(|&m| m != 0)
            .map(|m| read_c_string(process, m))
            .unwrap_or_default();
        return Err(Failure::runtime(format!(
            "pid {pid} could not load the probe runtime: {message} (nothing was patched)"
        )));
    }
    let Some(runtime_at) = runtime
        .in_process(pid)
        .and_then(|a| a.into_iter().collect::<Option<Vec<u64>>>())
    else {
        return Err(Failure::runtime(format!(
            "cannot find the probe runtime in pid {pid} after loading it"
        )));
    };
    process
        .write(runtime_at[LANDING], &process.landing().to_le_bytes())
        .map_err(|e| failed("set up the probe runtime", e))?;
    Ok(runtime_at)
}

/// Where the process loads the runtime from.
struct Handed {
    path: String,
    /// The process's memfd, closed once loaded.
    target_fd: Option<u64>,
    /// glass's memfd, where the process opens glass's (kept until the load is done).
    _glass_fd: Option<std::os::fd::OwnedFd>,
}

/// Puts the embedded runtime where the process can load it: a memfd of its own (its
/// memfd_create, injected), which glass fills and seals through /proc/<pid>/fd/<n>, to be
/// opened as /proc/self/fd/<n>: that path works whatever user the process runs as and
/// whatever its mount and pid namespaces. A process whose libc has no memfd_create
/// (glibc before 2.27) opens glass's own sealed memfd instead, which only a process of
/// glass's user can.
fn hand_over(process: &StoppedProcess, loader: &LoaderFunctions) -> Result<Handed> {
    let pid = process.pid();
    let own = || -> Result<Handed> {
        let fd = crate::embedded::memfd()?;
        Ok(Handed {
            path: format!(
                "/proc/{}/fd/{}",
                std::process::id(),
                std::os::fd::AsRawFd::as_raw_fd(&fd)
            ),
            target_fd: None,
            _glass_fd: Some(fd),
        })
    };
    let Some(memfd_create) = loader.memfd_create else {
        return own();
    };
    let mut name = crate::embedded::name().into_bytes();
    name.push(0);
    let fd = process
        .call(
            memfd_create,
            &[
                CallArg::Bytes(&name),
                CallArg::Value((libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) as u64),
            ],
            CALL_LIMIT,
        )
        .map_err(|e| {
            Failure::runtime(format!(
                "cannot create a memfd for the probe runtime in pid {pid}: {e} (nothing was patched)"
            ))
        })?;
    // An int: the upper half of the register is not the callee's to define.
    let fd = fd as u32 as i32;
    if fd < 0 {
        // memfd_create returned -1 (a seccomp filter, a descriptor limit): glass's own.
        return own();
    }
    let fd = fd as u64;
    let filled = (|| -> std::io::Result<()> {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .open(format!("/proc/{pid}/fd/{fd}"))?;
        std::io::Write::write_all(&mut file, crate::embedded::bytes())?;
        crate::embedded::seal(&file)
    })();
    if let Err(e) = filled {
        if let Some(close) = loader.close {
            let _ = process.call(close, &[CallArg::Value(fd)], CALL_LIMIT);
        }
        return Err(Failure::runtime(format!(
            "cannot fill pid {pid}'s memfd with the probe runtime: {e} (nothing was patched)"
        )));
    }
    Ok(Handed {
        path: format!("/proc/self/fd/{fd}"),
        target_fd: Some(fd),
        _glass_fd: None,
    })
}

/// `dlsym(RTLD_DEFAULT, name)` in the process: where the loader would bind `name`.
pub(super) fn resolve(process: &StoppedProcess, dlsym: u64, name: &str) -> Result<u64> {
    let mut symbol = name.as_bytes().to_vec();
    symbol.push(0);
    process
        .call(
            dlsym,
            &[CallArg::Value(0), CallArg::Bytes(&symbol)],
            CALL_LIMIT,
        )
        .map_err(|e| {
            Failure::runtime(format!(
                "cannot resolve {name} in pid {}: {e}",
                process.pid()
            ))
        })
}

/// Has the runtime join `session`: 0, or a negative errno (EBUSY: it has a session).
pub(super) fn join_session(
    process: &StoppedProcess,
    runtime_at: &[u64],
    session: &SessionMemory,
) -> Result<i64> {
    let mut path = session.path().display().to_string().into_bytes();
    path.push(0);
    let joined = process
        .call(runtime_at[0], &[CallArg::Bytes(&path)], CALL_LIMIT)
        .map_err(|e| {
            Failure::runtime(format!(
                "cannot start the probe runtime in pid {}: {e} (nothing was patched)",
                process.pid()
            ))
        })?;
    Ok(joined as i64)
}

/// `--libcalls` on a process bound lazily: a slot still pointing at its PLT stub would
/// be rewritten by the loader at its first call, hook and all, so glass binds it first
/// (the address `dlsym` gives, as the loader would).
pub(super) fn bind_lazy_slots(
    process: &StoppedProcess,
    modules: &[select::ModuleChoice],
    mappings: &[Mapping],
    dlsym: Option<u64>,
) -> Result<()> {
    let pid = process.pid();
    let Some(dlsym) = dlsym else {
        return Ok(());
    };
    let biases = crate::biases(pid, modules)?;
    for (module, &bias) in modules.iter().zip(&biases) {
        let own: Vec<&Mapping> = mappings
            .iter()
            .filter(|m| {
                std::fs::canonicalize(&m.path).ok() == std::fs::canonicalize(&module.path).ok()
            })
            .collect();
        for (name, slot) in &module.libcalls {
            let slot = slot.wrapping_add(bias);
            let Ok(value) = process.read_u64(slot) else {
                continue;
            };
            if !own.iter().any(|m| value >= m.start && value < m.end) {
                continue;
            }
            let address = resolve(process, dlsym, name)?;
            if address != 0 {
                process.write(slot, &address.to_le_bytes()).map_err(|e| {
                    Failure::runtime(format!("cannot bind {name} in pid {pid}: {e}"))
                })?;
            }
        }
    }
    Ok(())
}

/// Has the runtime let the session go.
pub(super) fn leave_runtime(process: &StoppedProcess, leave: u64) -> Result<()> {
    let pid = process.pid();
    let left = process.call(leave, &[], CALL_LIMIT);
    left.map_err(|e| Failure::runtime(format!("cannot end the session in pid {pid}: {e}")))?;
    Ok(())
}

/// Writes the ledger into a mapping of its own in the process and points the runtime's
/// word at it; returns the mapping (address, length).
pub(super) fn leave_ledger(
    process: &StoppedProcess,
    ledger: &Ledger,
    slot: u64,
) -> Result<(u64, u64)> {
    let pid = process.pid();
    let bytes = ledger.encode();
    let len = (bytes.len() as u64).next_multiple_of(4096);
    let at = process
        .map_anonymous(len, libc::PROT_READ | libc::PROT_WRITE)
        .map_err(|e| Failure::runtime(format!("cannot map the ledger in pid {pid}: {e}")))?;
    process
        .write(at, &bytes)
        .and_then(|()| process.write(slot, &at.to_le_bytes()))
        .map_err(|e| Failure::runtime(format!("cannot write the ledger in pid {pid}: {e}")))?;
    Ok((at, len))
}
