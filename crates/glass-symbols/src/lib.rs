//! Offline symbolization: turn (module, address) into function names, after the target
//! is gone.
//!
//! Names come from DWARF with inline frames when the file has it, else from `.symtab`,
//! else `.dynsym` (a stripped binary keeps its exported names), else `module+0xoffset`.
//! Files are checked against the build id recorded at sampling time, so a binary that
//! was rebuilt since shows offsets rather than wrong names. The parsing is done by
//! `addr2line` (which uses `gimli` and `object`); this crate only maps process addresses
//! to file addresses and caches.

use std::collections::HashMap;
use std::path::Path;
use std::rc::Rc;

use object::{Object, ObjectSegment};

/// The GNU build id of an ELF file, read through a memory map (only the notes are
/// touched, so this is cheap even for large files).
pub fn build_id(path: &Path) -> Option<Vec<u8>> {
    let file = std::fs::File::open(path).ok()?;
    // SAFETY: read-only map; a file truncated underneath us could fault, which is why
    // callers pass files the target itself has mapped.
    let map = unsafe { memmap2::Mmap::map(&file) }.ok()?;
    let elf = object::File::parse(&*map).ok()?;
    elf.build_id().ok().flatten().map(<[u8]>::to_vec)
}

/// One frame of a symbolized address. An address inside inlined code yields several,
/// outermost first.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Frame {
    pub function: String,
    /// The module's file name (no directory).
    pub module: String,
    /// This frame was inlined into the one before it.
    pub inlined: bool,
}

/// What the recording says about the module an address lies in.
#[derive(Debug, Clone, Copy)]
pub struct ModuleRef<'a> {
    pub path: &'a str,
    pub build_id: &'a [u8],
    /// Where the mapping starts in the process, and from which file offset.
    pub start: u64,
    pub file_offset: u64,
}

/// An opened module file.
struct ModuleFile {
    /// None when the file is missing, unreadable, not ELF or a different build.
    loader: Option<addr2line::Loader>,
    /// Loadable segments: (file offset, file size, virtual address).
    segments: Vec<(u64, u64, u64)>,
    basename: String,
}

impl ModuleFile {
    /// The file's virtual address (what its symbols and DWARF use) for a file offset.
    fn address_for_offset(&self, offset: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|(file_offset, size, _)| offset >= *file_offset && offset < file_offset + size)
            .map(|(file_offset, _, vaddr)| vaddr + (offset - file_offset))
    }
}

/// Symbolizes addresses of many modules, opening each file once and remembering every
/// answer.
#[derive(Default)]
pub struct Symbolizer {
    files: HashMap<(String, Vec<u8>), Rc<ModuleFile>>,
    answers: HashMap<(String, u64, u64, u64), Rc<[Frame]>>,
    /// Warnings for the user, one per module (build id mismatch, unreadable file).
    pub warnings: Vec<String>,
}

fn basename(path: &str) -> String {
    path.rsplit('/').next().unwrap_or(path).to_string()
}

impl Symbolizer {
    pub fn new() -> Self {
        Self::default()
    }

    fn open(&mut self, module: &ModuleRef) -> Rc<ModuleFile> {
        let key = (module.path.to_string(), module.build_id.to_vec());
        if let Some(file) = self.files.get(&key) {
            return file.clone();
        }
        let basename = basename(module.path);
        let mut opened = ModuleFile {
            loader: None,
            segments: Vec::new(),
            basename,
        };
        // Pseudo-files ([vdso], [anon], ...) have nothing on disk.
        if !module.path.starts_with('[') {
            match self.inspect(module) {
                Ok(segments) => {
                    opened.segments = segments;
                    match addr2line::Loader::new(module.path) {
                        Ok(loader) => opened.loader = Some(loader),
                        Err(error) => self.warnings.push(format!(
                            "{}: cannot read symbols ({error}); showing offsets",
                            module.path
                        )),
                    }
                }
                Err(reason) => self
                    .warnings
                    .push(format!("{}: {reason}; showing offsets", module.path)),
            }
        }
        let file = Rc::new(opened);
        self.files.insert(key, file.clone());
        file
    }

    /// Checks the file on disk is the one that was mapped, and reads its segments.
    fn inspect(&self, module: &ModuleRef) -> Result<Vec<(u64, u64, u64)>, String> {
        let file = std::fs::File::open(module.path).map_err(|e| format!("cannot open ({e})"))?;
        // SAFETY: read-only map of a regular file.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| format!("cannot map ({e})"))?;
        let elf = object::File::parse(&*map).map_err(|e| format!("not an ELF file ({e})"))?;
        let on_disk = elf.build_id().ok().flatten().unwrap_or(&[]);
        if !module.build_id.is_empty() && on_disk != module.build_id {
            return Err("changed since recording (build id differs)".to_string());
        }
        Ok(elf
            .segments()
            .map(|s| {
                let (offset, size) = s.file_range();
                (offset, size, s.address())
            })
            .collect())
    }

    /// The frames for `address` in `module`. `is_return_address` marks an address taken
    /// from the stack: it points after the call, so the call instruction (one byte
    /// before) is what is looked up.
    pub fn symbolize(
        &mut self,
        module: &ModuleRef,
        address: u64,
        is_return_address: bool,
    ) -> Rc<[Frame]> {
        let probe = if is_return_address {
            address.saturating_sub(1)
        } else {
            address
        };
        let key = (
            module.path.to_string(),
            module.start,
            module.file_offset,
            probe,
        );
        if let Some(frames) = self.answers.get(&key) {
            return frames.clone();
        }
        let file = self.open(module);
        let offset = probe
            .wrapping_sub(module.start)
            .wrapping_add(module.file_offset);
        let frames: Rc<[Frame]> = match (file.loader.as_ref(), file.address_for_offset(offset)) {
            (Some(loader), Some(svma)) => lookup(loader, svma, &file.basename).into(),
            (_, svma) => {
                let shown = svma.unwrap_or(offset);
                vec![Frame {
                    function: format!("{}+0x{shown:x}", file.basename),
                    module: file.basename.clone(),
                    inlined: false,
                }]
                .into()
            }
        };
        self.answers.insert(key, frames.clone());
        frames
    }
}

fn lookup(loader: &addr2line::Loader, svma: u64, module: &str) -> Vec<Frame> {
    let mut frames = Vec::new();
    if let Ok(mut iter) = loader.find_frames(svma) {
        // addr2line yields the innermost (inlined) function first.
        while let Ok(Some(frame)) = iter.next() {
            if let Some(function) = frame.function.as_ref() {
                if let Ok(name) = function.demangle() {
                    frames.push(name.into_owned());
                }
            }
        }
    }
    if frames.is_empty() {
        if let Some(symbol) = loader.find_symbol(svma) {
            frames.push(addr2line::demangle_auto(symbol.into(), None).into_owned());
        }
    }
    if frames.is_empty() {
        frames.push(format!("{module}+0x{svma:x}"));
    }
    frames
        .into_iter()
        .rev()
        .enumerate()
        .map(|(i, function)| Frame {
            function,
            module: module.to_string(),
            inlined: i > 0,
        })
        .collect()
}
