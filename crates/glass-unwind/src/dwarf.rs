//! DWARF CFI unwinding with framehop over `.eh_frame` / `.eh_frame_hdr` / `.debug_frame`
//! of every module, falling back to frame pointers per frame where a module has no CFI
//! for an address (framehop does that itself).
//!
//! The same unwinder serves a live thread (stack words read from a [`StackWindow`]) and
//! a snapshot read back from a recording (stack words from the snapshot's bytes).

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder};
use object::{Object, ObjectSection, ObjectSegment};

use crate::fp::WalkEnd;
use crate::UnwindRegs;

type SectionBytes = Arc<[u8]>;

/// The unwind tables of one process's modules, and framehop's rule cache.
pub struct DwarfUnwinder {
    unwinder: UnwinderX86_64<SectionBytes>,
    cache: CacheX86_64,
    modules: Vec<Range<u64>>,
}

impl Default for DwarfUnwinder {
    fn default() -> Self {
        Self::new()
    }
}

impl Clone for DwarfUnwinder {
    fn clone(&self) -> Self {
        DwarfUnwinder {
            unwinder: self.unwinder.clone(),
            cache: CacheX86_64::new(),
            modules: self.modules.clone(),
        }
    }
}

/// Why a module's unwind tables could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModuleError {
    Unreadable(String),
    NotElf(String),
    /// The mapped file offset lies in no loadable segment of the file on disk (the file
    /// was replaced).
    NoSegment,
}

impl std::fmt::Display for ModuleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ModuleError::Unreadable(e) => write!(f, "cannot read: {e}"),
            ModuleError::NotElf(e) => write!(f, "not an ELF file: {e}"),
            ModuleError::NoSegment => f.write_str("mapping does not match the file's segments"),
        }
    }
}

impl DwarfUnwinder {
    pub fn new() -> Self {
        DwarfUnwinder {
            unwinder: UnwinderX86_64::new(),
            cache: CacheX86_64::new(),
            modules: Vec::new(),
        }
    }

    /// Whether a module covering this start address was added.
    pub fn has_module(&self, start: u64) -> bool {
        self.modules.iter().any(|r| r.start == start)
    }

    /// Adds the executable mapping `[start, end)` of `file` (mapped from `file_offset`).
    /// A module whose file cannot be read is left out: addresses in it then unwind by
    /// frame pointers.
    pub fn add_module(
        &mut self,
        file: &Path,
        start: u64,
        end: u64,
        file_offset: u64,
    ) -> Result<(), ModuleError> {
        let data = std::fs::read(file).map_err(|e| ModuleError::Unreadable(e.to_string()))?;
        self.add_module_bytes(&file.to_string_lossy(), &data, start, end, file_offset)
    }

    /// As [`DwarfUnwinder::add_module`], from the file's bytes.
    pub fn add_module_bytes(
        &mut self,
        name: &str,
        data: &[u8],
        start: u64,
        end: u64,
        file_offset: u64,
    ) -> Result<(), ModuleError> {
        let elf = object::File::parse(data).map_err(|e| ModuleError::NotElf(e.to_string()))?;
        // The load bias: where the segment holding `file_offset` landed, minus where the
        // file says it should be.
        let segment = elf
            .segments()
            .find(|s| {
                let (offset, size) = s.file_range();
                file_offset >= offset && file_offset < offset + size.max(1)
            })
            .ok_or(ModuleError::NoSegment)?;
        let (segment_offset, _) = segment.file_range();
        let svma_at_start = segment.address() + (file_offset - segment_offset);
        let bias = start.wrapping_sub(svma_at_start);

        let section = |name: &str| -> (Option<Range<u64>>, Option<SectionBytes>) {
            match elf.section_by_name(name) {
                Some(s) => {
                    let range = s.address()..s.address() + s.size();
                    let bytes = s
                        .data()
                        .ok()
                        .filter(|d| !d.is_empty())
                        .map(Arc::<[u8]>::from);
                    (Some(range), bytes)
                }
                None => (None, None),
            }
        };
        let (text_svma, text) = section(".text");
        let (eh_frame_svma, eh_frame) = section(".eh_frame");
        let (eh_frame_hdr_svma, eh_frame_hdr) = section(".eh_frame_hdr");
        let (_, debug_frame) = section(".debug_frame");
        let (got_svma, _) = section(".got");
        let info = ExplicitModuleSectionInfo {
            base_svma: 0,
            text_svma,
            text,
            got_svma,
            eh_frame_svma,
            eh_frame,
            eh_frame_hdr_svma,
            eh_frame_hdr,
            debug_frame,
            ..Default::default()
        };
        let module = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            Module::new(name.to_string(), start..end, bias, info)
        }))
        .map_err(|_| ModuleError::NotElf("unreadable unwind tables".into()))?;
        self.unwinder.add_module(module);
        self.modules.push(start..end);
        Ok(())
    }

    /// Appends the instruction pointer and the return addresses to `frames`. `read_word`
    /// reads 8 bytes of the stack (None where unreadable).
    pub fn walk(
        &mut self,
        regs: UnwindRegs,
        read_word: &mut dyn FnMut(u64) -> Option<u64>,
        max_depth: usize,
        frames: &mut Vec<u64>,
    ) -> WalkEnd {
        let start = frames.len();
        let (unwinder, cache) = (&self.unwinder, &mut self.cache);
        // Unwind tables come from files glass does not control: should the parser below
        // panic on one (the fuzz test found such a case in gimli), the sample ends
        // truncated instead of taking the recorder down.
        let walked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut read_stack = |addr: u64| read_word(addr).ok_or(());
            let unwind_regs = UnwindRegsX86_64::new(regs.ip, regs.sp, regs.fp);
            let mut iter = unwinder.iter_frames(regs.ip, unwind_regs, cache, &mut read_stack);
            loop {
                if frames.len() - start >= max_depth {
                    return WalkEnd::DepthLimit;
                }
                match iter.next() {
                    Ok(Some(FrameAddress::InstructionPointer(ip))) => frames.push(ip),
                    Ok(Some(FrameAddress::ReturnAddress(ra))) => frames.push(ra.get()),
                    Ok(None) => return WalkEnd::Complete,
                    Err(_) => return WalkEnd::BadFramePointer,
                }
            }
        }));
        walked.unwrap_or_else(|_| {
            self.cache = CacheX86_64::new();
            if frames.len() == start {
                frames.push(regs.ip);
            }
            WalkEnd::Unreadable
        })
    }
}
