//! Each sampled process's module map: its executable mappings as the file has them, and
//! the unwind tables of the modules mapped there. A map follows its process (a fork
//! inherits it, an exec empties it) and learns of code mapped later from the events or,
//! for a host process, from /proc when samples fall outside it. Apart from the recorder
//! because the walks read it and the records of the modules come from it, and neither
//! needs the rest of the sink.

use std::collections::HashMap;
use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use glass_format::{Arch, Module, ProcessKind};
use glass_target::procfs::Mapping;
use glass_unwind::DwarfUnwinder;

use super::Output;
use crate::UnwindMode;

/// The module map of a process is re-read at most this often when samples show
/// addresses outside every known mapping (code mapped by dlopen, a JIT).
const MAPS_REFRESH_PERIOD: Duration = Duration::from_millis(20);

/// One process's executable mappings, as the file has them, and its unwind tables.
#[derive(Clone)]
pub(super) struct AddressSpace {
    mappings: Vec<Mapping>,
    last_refresh: Option<Instant>,
    pub(super) unwinder: DwarfUnwinder,
}

impl AddressSpace {
    fn new(arch: Arch) -> Self {
        AddressSpace {
            mappings: Vec::new(),
            last_refresh: None,
            unwinder: DwarfUnwinder::for_arch(arch),
        }
    }

    pub(super) fn contains(&self, address: u64) -> bool {
        let index = self.mappings.partition_point(|m| m.start <= address);
        index > 0 && address < self.mappings[index - 1].end
    }
}

/// The address spaces of the recording's processes, by pid.
pub(super) struct ModuleMaps {
    /// (Looked up for every sample: foldhash, not SipHash.)
    spaces: foldhash::HashMap<i32, AddressSpace>,
    /// Build ids by path, read once per file (not for a deleted file: another may take
    /// its path).
    build_ids: HashMap<String, Vec<u8>>,
    unwind: UnwindMode,
    /// The sampled code's architecture (told by the meta record).
    arch: Arch,
}

impl ModuleMaps {
    pub(super) fn new(unwind: UnwindMode) -> Self {
        ModuleMaps {
            spaces: foldhash::HashMap::default(),
            build_ids: HashMap::new(),
            unwind,
            arch: Arch::host(),
        }
    }

    /// The meta record names the sampled code's architecture: address spaces made from
    /// here on unwind for it.
    pub(super) fn set_arch(&mut self, arch: Arch) {
        self.arch = arch;
    }

    pub(super) fn arch(&self) -> Arch {
        self.arch
    }

    /// The address space of `pid` (made empty on first use).
    pub(super) fn space(&mut self, pid: i32) -> &mut AddressSpace {
        let arch = self.arch;
        self.spaces
            .entry(pid)
            .or_insert_with(|| AddressSpace::new(arch))
    }

    /// A process appears: a forked child starts with its parent's mappings (readers copy
    /// them too); an attached or exec'd process with none yet.
    pub(super) fn process_appears(&mut self, pid: i32, parent: i32, kind: ProcessKind) {
        let space = match kind {
            ProcessKind::Forked => self
                .spaces
                .get(&parent)
                .cloned()
                .unwrap_or_else(|| AddressSpace::new(self.arch)),
            ProcessKind::Attached | ProcessKind::Exec => AddressSpace::new(self.arch),
        };
        self.spaces.insert(pid, space);
    }

    pub(super) fn forget(&mut self, pid: i32) {
        self.spaces.remove(&pid);
    }

    /// Whether the map of `pid` has `mapping` already.
    pub(super) fn has(&mut self, pid: i32, mapping: &Mapping) -> bool {
        self.space(pid).mappings.contains(mapping)
    }

    /// Whether `frames` hold an address outside every known mapping of `pid` (and
    /// outside the kernel) and its map was not re-read within the refresh period: code
    /// mapped after the start, for the caller to read the map again.
    pub(super) fn wants_refresh(&mut self, pid: i32, frames: &[u64]) -> bool {
        let space = self.space(pid);
        let outside = !frames
            .iter()
            .all(|&a| space.contains(a) || glass_format::is_kernel_address(a));
        outside
            && space
                .last_refresh
                .is_none_or(|t| t.elapsed() >= MAPS_REFRESH_PERIOD)
    }

    /// The map of `pid` is being read again from /proc now.
    pub(super) fn refreshing(&mut self, pid: i32) {
        self.space(pid).last_refresh = Some(Instant::now());
    }

    /// Records a mapping the map of `pid` does not have yet, loads its unwind tables,
    /// and adds it to the map (older mappings it overlaps give way).
    pub(super) fn add(
        &mut self,
        pid: i32,
        mapping: Mapping,
        time_ns: u64,
        output: &mut dyn Output,
    ) -> io::Result<()> {
        let build_id = self.build_id(pid, &mapping);
        output.module(&Module {
            time_ns,
            pid: pid as u32,
            start: mapping.start,
            end: mapping.end,
            file_offset: mapping.file_offset,
            build_id,
            path: mapping.path.clone(),
        })?;
        // With frame pointers only, AArch64 still needs the modules' function symbols
        // (to tell a leaf's unsaved link register from one it saved).
        let wants_tables = self.unwind != UnwindMode::Fp || self.arch == Arch::Aarch64;
        let space = self.space(pid);
        if wants_tables
            && !mapping.path.starts_with('[')
            && !space.unwinder.has_module(mapping.start)
        {
            load_tables(&mut space.unwinder, pid, &mapping);
        }
        // Overlapping older mappings (an unmapped and reused range) give way.
        space
            .mappings
            .retain(|m| m.end <= mapping.start || m.start >= mapping.end);
        let at = space.mappings.partition_point(|m| m.start < mapping.start);
        space.mappings.insert(at, mapping);
        Ok(())
    }

    fn build_id(&mut self, pid: i32, mapping: &Mapping) -> Vec<u8> {
        if mapping.path.starts_with('[') {
            return Vec::new();
        }
        if let Some(id) = self.build_ids.get(&mapping.path) {
            return id.clone();
        }
        let id =
            glass_symbols::build_id(Path::new(&readable_path(pid, mapping))).unwrap_or_default();
        if !mapping.deleted {
            self.build_ids.insert(mapping.path.clone(), id.clone());
        }
        id
    }
}

/// Loads the unwind tables of the module `mapping` maps. A module whose tables cannot be
/// read unwinds by frame pointers; a symbol table (a guest kernel's kallsyms) still
/// gives its function starts.
fn load_tables(unwinder: &mut DwarfUnwinder, pid: i32, mapping: &Mapping) {
    let path = readable_path(pid, mapping);
    let added = unwinder.add_module(
        Path::new(&path),
        mapping.start,
        mapping.end,
        mapping.file_offset,
    );
    if let Err(glass_unwind::dwarf::ModuleError::NotElf(_)) = added {
        if let Some(table) = glass_symbols::nm_table(&path) {
            // The mapping starts at the table's first symbol, or above it by a
            // relocated (KASLR) kernel's slide.
            let slide = mapping.start.wrapping_sub(table.first().map_or(0, |s| s.0));
            let starts: Vec<u64> = table.iter().map(|s| s.0.wrapping_add(slide)).collect();
            unwinder.add_symbol_table(mapping.start, mapping.end, &starts);
        }
    }
}

/// A path that reads the mapped file: a deleted or replaced file is still readable
/// through the mapping itself.
fn readable_path(pid: i32, mapping: &Mapping) -> String {
    if mapping.deleted {
        format!(
            "/proc/{pid}/map_files/{:x}-{:x}",
            mapping.start, mapping.end
        )
    } else {
        mapping.path.clone()
    }
}
