//! Seizing a running process and choosing the thread glass runs its calls in: the
//! process's own loader functions (dlopen, dlsym, mmap, munmap), the code a thread must
//! not be stopped in to run them (the dynamic loader, the rest of libc unless it waits
//! in a system call), and whether the process is gone.

use std::path::{Path, PathBuf};
use std::time::Duration;

use glass_target::attach::Attachment;
use glass_target::inject::LibcCalls;
use glass_target::procfs::Mapping;
use glass_target::thread_state::{thread_state, WAITING_SYSCALLS};
use object::{Object, ObjectSegment, ObjectSymbol};

use super::*;

/// An address range of the target and what it is.
#[derive(Clone, Copy)]
pub(super) struct Span {
    pub(super) start: u64,
    pub(super) end: u64,
}

pub(super) fn within(spans: &[Span], address: u64) -> bool {
    spans.iter().any(|s| address >= s.start && address < s.end)
}

/// Symbols a library exports, read from its file once (outside any stopped window),
/// to be found in a process where it is mapped.
pub(super) struct FileSymbols {
    /// The file; empty for the probe runtime glass embeds (crate::embedded).
    pub(super) file: PathBuf,
    pub(super) segments: Vec<(u64, u64, u64)>,
    /// File addresses, in the order asked for.
    pub(super) addresses: Vec<Option<u64>>,
}

impl FileSymbols {
    pub(super) fn read(file: &Path, names: &[&str]) -> Option<Self> {
        let bytes = std::fs::read(file).ok()?;
        Self::parse(&bytes, file, names)
    }

    /// The probe runtime glass embeds.
    pub(super) fn runtime(names: &[&str]) -> Option<Self> {
        Self::parse(crate::embedded::bytes(), Path::new(""), names)
    }

    fn parse(bytes: &[u8], file: &Path, names: &[&str]) -> Option<Self> {
        let elf = object::File::parse(bytes).ok()?;
        let mut addresses = vec![None; names.len()];
        for symbol in elf.dynamic_symbols().filter(|s| s.is_definition()) {
            if let Some(i) = names.iter().position(|n| symbol.name() == Ok(n)) {
                addresses[i].get_or_insert(symbol.address());
            }
        }
        Some(FileSymbols {
            file: file.to_path_buf(),
            segments: elf
                .segments()
                .map(|s| (s.file_range().0, s.address(), s.file_range().1))
                .collect(),
            addresses,
        })
    }

    /// The symbols' addresses in a process where `mapping` maps this file.
    pub(super) fn at(&self, mapping: &Mapping) -> Vec<Option<u64>> {
        let bias = glass_target::procfs::load_bias(mapping, &self.segments);
        self.addresses
            .iter()
            .map(|a| Some(a.as_ref()?.wrapping_add(bias?)))
            .collect()
    }

    /// Where this file is mapped in `pid`, and the symbols' addresses there.
    pub(super) fn in_process(&self, pid: i32) -> Option<Vec<Option<u64>>> {
        if self.file.as_os_str().is_empty() {
            let mappings = glass_target::procfs::executable_mappings(pid).ok()?;
            let mapping = mappings
                .iter()
                .find(|m| crate::embedded::is_mapping(&m.path))?;
            return Some(self.at(mapping));
        }
        let canonical = std::fs::canonicalize(&self.file).ok()?;
        let mappings = glass_target::procfs::executable_mappings(pid).ok()?;
        let mapping = mappings
            .iter()
            .find(|m| std::fs::canonicalize(&m.path).ok().as_ref() == Some(&canonical))?;
        Some(self.at(mapping))
    }
}

pub(super) fn file_name(path: &str) -> String {
    Path::new(path)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The executable spans of the mappings whose file name starts with one of `prefixes`.
pub(super) fn spans_of(mappings: &[Mapping], prefixes: &[&str]) -> Vec<Span> {
    mappings
        .iter()
        .filter(|m| prefixes.iter().any(|p| file_name(&m.path).starts_with(p)))
        .map(|m| Span {
            start: m.start,
            end: m.end,
        })
        .collect()
}

/// The probe runtime's code in the process: a thread in it is let run until it is out
/// (see `safe_point::Leave`).
pub(super) fn runtime_text(mappings: &[Mapping]) -> Vec<Span> {
    mappings
        .iter()
        .filter(|m| m.path.contains("libglass_probe"))
        .map(|m| Span {
            start: m.start,
            end: m.end,
        })
        .collect()
}

/// Where the thread injected calls run in must not be stopped, besides the loader: in the
/// probe runtime or in anonymous code (an earlier glass's trampolines among it). The
/// calls would run; but that thread is held while glass moves every other one out of
/// the code it changes, and it could not be moved itself. Under emulation a thread that
/// calls a traced function in a loop is inside its probe a good part of the time.
pub(super) fn not_for_calls(mappings: &[Mapping]) -> Vec<Span> {
    let mut spans = spans_of(mappings, &["ld-linux", "ld-2.", "ld64"]);
    spans.extend(runtime_text(mappings));
    spans.extend(
        mappings
            .iter()
            .filter(|m| m.path == "[anon]")
            .map(|m| Span {
                start: m.start,
                end: m.end,
            }),
    );
    spans
}

/// The process's `dlopen`, `dlerror` and `dlsym`, and the `mmap` and `munmap` its
/// system calls are made through.
pub(super) struct LoaderFunctions {
    pub(super) dlopen: u64,
    pub(super) dlerror: u64,
    pub(super) dlsym: Option<u64>,
    /// libc's memfd_create and close, to hand the probe runtime over (attach/runtime.rs).
    pub(super) memfd_create: Option<u64>,
    pub(super) close: Option<u64>,
    pub(super) calls: LibcCalls,
}

pub(super) fn loader_functions(pid: i32, mappings: &[Mapping]) -> Option<LoaderFunctions> {
    let mut candidates: Vec<&Mapping> = mappings
        .iter()
        .filter(|m| {
            let name = file_name(&m.path);
            m.path.starts_with('/') && (name.starts_with("libc.so") || name.starts_with("libdl"))
        })
        .collect();
    candidates.dedup_by(|a, b| a.path == b.path);
    for mapping in candidates {
        // The file as the target sees it (its mount namespace may differ).
        let mut file = PathBuf::from(format!("/proc/{pid}/root{}", mapping.path));
        if !file.exists() {
            file = PathBuf::from(&mapping.path);
        }
        let names = [
            "dlopen",
            "dlerror",
            "dlsym",
            "mmap",
            "munmap",
            "memfd_create",
            "close",
        ];
        let Some(symbols) = FileSymbols::read(&file, &names) else {
            continue;
        };
        if let [Some(dlopen), Some(dlerror), dlsym, Some(mmap), Some(munmap), memfd_create, close] =
            symbols.at(mapping)[..]
        {
            return Some(LoaderFunctions {
                dlopen,
                dlerror,
                dlsym,
                memfd_create,
                close,
                calls: LibcCalls { mmap, munmap },
            });
        }
    }
    None
}

/// Stops one thread at a safe point to run the loader in; every other thread runs.
pub(super) fn pick_loader_thread(
    attachment: &mut Attachment,
    unsafe_code: &[Span],
    libc: &[Span],
    go_g_offset: Option<i64>,
) -> Result<i32> {
    for round in 0..400 {
        for tid in attachment.tids() {
            match attachment.stop(tid) {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) => return Err(e.into()),
            }
            let Ok(state) = thread_state(tid) else {
                attachment.resume(tid);
                continue;
            };
            let waiting = state.syscall.is_some_and(|n| WAITING_SYSCALLS.contains(&n));
            // In a Go program, not on a goroutine's small stack (see go_stacks).
            let own_stack = go_g_offset.is_none_or(|offset| {
                !super::go_stacks::on_goroutine_stack(attachment.pid(), &state, offset)
            });
            let safe =
                !within(unsafe_code, state.pc) && (!within(libc, state.pc) || waiting) && own_stack;
            if safe || round == 399 {
                return Ok(tid);
            }
            attachment.resume(tid);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Err(Failure::runtime(
        "no thread of the process could be stopped",
    ))
}

pub(super) fn process_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .and_then(|rest| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X"),
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn finds_dlopen_in_this_process() {
        let pid = std::process::id() as i32;
        let mappings = glass_target::procfs::executable_mappings(pid).unwrap();
        let loader = loader_functions(pid, &mappings).expect("glibc >= 2.34");
        assert_eq!(loader.dlopen, libc::dlopen as *const () as u64);
        assert_eq!(loader.dlerror, libc::dlerror as *const () as u64);
        assert_eq!(loader.dlsym, Some(libc::dlsym as *const () as u64));
    }
}
