//! The files that name a process's JIT code and its vDSO, kept in the recording: the
//! jitdump files a process maps (runtimes map them for profilers to find) and
//! `/tmp/perf-PID.map` are copied as the recording ends (they grow while the process
//! runs, runtimes may delete them at exit, and a later process may reuse the pid); the
//! vDSO's functions are read from the process's memory when its mapping is first seen
//! (it is no file the report could read, and the report may run on another kernel).

use std::io;
use std::path::PathBuf;

use glass_format::JitMap;
use glass_target::procfs::Mapping;

use super::Output;

#[derive(Default)]
pub(super) struct JitFiles {
    /// Jitdump files the processes mapped.
    jitdumps_mapped: Vec<(i32, String)>,
    /// Per process, its vDSO's functions as a perf map (glass_symbols::vdso).
    vdso_maps: Vec<(i32, String)>,
}

impl JitFiles {
    /// A mapping new to `pid`'s module map: a jitdump file to copy at the end, or the
    /// vDSO, read now from the process's memory where it is a host process
    /// (`host_process`).
    pub(super) fn mapped(&mut self, pid: i32, mapping: &Mapping, host_process: bool) {
        if glass_symbols::jit::is_jitdump_marker(&mapping.path) {
            self.jitdumps_mapped.push((pid, mapping.path.clone()));
        }
        if host_process && glass_symbols::vdso::is_vdso(&mapping.path) {
            let mut image = vec![0u8; (mapping.end - mapping.start) as usize];
            let read = std::fs::File::open(format!("/proc/{pid}/mem")).and_then(|mem| {
                std::os::unix::fs::FileExt::read_exact_at(&mem, &mut image, mapping.start)
            });
            if let Some(map) = read
                .ok()
                .and_then(|()| glass_symbols::vdso::perf_map(&image, mapping.start))
            {
                self.vdso_maps.retain(|(p, _)| *p != pid);
                self.vdso_maps.push((pid, map));
            }
        }
    }

    /// Writes the vDSOs' perf maps, and what the JIT description files of each of
    /// `pids` name as they are now.
    pub(super) fn keep(&mut self, output: &mut dyn Output, pids: &[i32]) -> io::Result<()> {
        for (pid, text) in std::mem::take(&mut self.vdso_maps) {
            output.jit_map(&JitMap {
                pid: pid as u32,
                name: glass_symbols::vdso::MODULE.to_string(),
                text,
            })?;
        }
        for &pid in pids {
            let mapped: Vec<PathBuf> = self
                .jitdumps_mapped
                .iter()
                .filter(|(p, _)| *p == pid)
                .map(|(_, path)| path.into())
                .collect();
            let Some(text) = glass_symbols::jit::snapshot(pid as u32, &mapped) else {
                continue;
            };
            // Named after the file that names the code: the jitdump where there is one.
            let name = glass_symbols::jit::files_for_pid(pid as u32)
                .into_iter()
                .chain(mapped)
                .filter_map(|path| path.file_name().map(|n| n.to_string_lossy().into_owned()))
                .find(|name| name.starts_with("jit-"))
                .unwrap_or_else(|| format!("perf-{pid}.map"));
            output.jit_map(&JitMap {
                pid: pid as u32,
                name,
                text,
            })?;
        }
        Ok(())
    }
}
