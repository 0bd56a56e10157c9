//! DWARF CFI unwinding with framehop over every CFI source of every module, per address:
//! `.eh_frame` (with `.eh_frame_hdr`) where it covers an address, `.debug_frame` where
//! only it does ([`crate::cfi`]); frame pointers (or, in the first frame, the return
//! address at the stack pointer) where no FDE covers an address (framehop does that).
//!
//! The same unwinder serves a live thread (stack words read from a [`StackWindow`]) and
//! a snapshot read back from a recording (stack words from the snapshot's bytes).
//!
//! One per architecture, chosen by value ([`Arch`]): framehop's x86-64 or AArch64
//! unwinder over the same modules. On AArch64, a leaf in code no FDE covers is walked by
//! frame records ([`crate::aarch64::walk_frame_records`]) rather than framehop's
//! fallback, which takes the link register as the caller's return address even where
//! the function already saved it (the caller then appears twice); the modules' function
//! symbols tell the two cases apart.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use framehop::aarch64::{CacheAarch64, UnwinderAarch64};
use framehop::x86_64::{CacheX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder};
use object::{Object, ObjectSegment, ObjectSymbol, SymbolKind};

use crate::cfi::{self, CfiSources, ImageCfi, Source};
use crate::fp::WalkEnd;
use crate::leaf_step::{self, LeafMemo, LeafSteps};
use crate::{Arch, UnwindRegs};

type SectionBytes = Arc<[u8]>;

/// framehop's unwinder and rule cache for one architecture.
enum ArchUnwinder {
    X86_64(UnwinderX86_64<SectionBytes>, CacheX86_64),
    Aarch64(UnwinderAarch64<SectionBytes>, CacheAarch64),
}

impl ArchUnwinder {
    fn new(arch: Arch) -> Self {
        match arch {
            Arch::X86_64 => ArchUnwinder::X86_64(UnwinderX86_64::new(), CacheX86_64::new()),
            Arch::Aarch64 => ArchUnwinder::Aarch64(UnwinderAarch64::new(), CacheAarch64::new()),
        }
    }

    fn arch(&self) -> Arch {
        match self {
            ArchUnwinder::X86_64(..) => Arch::X86_64,
            ArchUnwinder::Aarch64(..) => Arch::Aarch64,
        }
    }

    fn add_module(&mut self, module: Module<SectionBytes>) {
        match self {
            ArchUnwinder::X86_64(unwinder, _) => unwinder.add_module(module),
            ArchUnwinder::Aarch64(unwinder, _) => unwinder.add_module(module),
        }
    }

    fn reset_cache(&mut self) {
        match self {
            ArchUnwinder::X86_64(_, cache) => *cache = CacheX86_64::new(),
            ArchUnwinder::Aarch64(_, cache) => *cache = CacheAarch64::new(),
        }
    }
}

impl Clone for ArchUnwinder {
    /// The rule cache starts empty.
    fn clone(&self) -> Self {
        match self {
            ArchUnwinder::X86_64(unwinder, _) => {
                ArchUnwinder::X86_64(unwinder.clone(), CacheX86_64::new())
            }
            ArchUnwinder::Aarch64(unwinder, _) => {
                ArchUnwinder::Aarch64(unwinder.clone(), CacheAarch64::new())
            }
        }
    }
}

/// The unwind tables of one process's modules, and framehop's rule cache.
pub struct DwarfUnwinder {
    unwinder: ArchUnwinder,
    /// Each mapping added, with its file's CFI sources.
    modules: Vec<(Range<u64>, CfiSources)>,
    /// Process addresses an FDE covers, sorted by start: code outside them, in a mapping
    /// whose file has CFI (`modules`), is unwound by a guess (see `walk`).
    described: Vec<Range<u64>>,
    /// AArch64: the modules' function symbols (process addresses, sorted), which tell
    /// whether the link register still holds the leaf's return address.
    function_starts: Vec<u64>,
    /// x86-64: the leaf's step, per sampled pc ([`DwarfUnwinder::caller_of_leaf`]).
    leaf_steps: LeafSteps,
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
            modules: self.modules.clone(),
            described: self.described.clone(),
            function_starts: self.function_starts.clone(),
            leaf_steps: self.leaf_steps.clone(),
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
    /// For code of the architecture glass runs on (a process it samples).
    pub fn new() -> Self {
        Self::for_arch(Arch::host())
    }

    pub fn for_arch(arch: Arch) -> Self {
        DwarfUnwinder {
            unwinder: ArchUnwinder::new(arch),
            modules: Vec::new(),
            described: Vec::new(),
            function_starts: Vec::new(),
            leaf_steps: LeafSteps::default(),
        }
    }

    pub fn arch(&self) -> Arch {
        self.unwinder.arch()
    }

    /// Whether `a` and `b` lie in the same function of a module (by its symbols); false
    /// where the symbols do not tell.
    pub fn same_function(&self, a: u64, b: u64) -> bool {
        let start_of = |address: u64| {
            let index = self.function_starts.partition_point(|&s| s <= address);
            (index > 0).then(|| self.function_starts[index - 1])
        };
        match (start_of(a), start_of(b)) {
            (Some(x), Some(y)) => x == y && self.modules.iter().any(|(r, _)| r.contains(&a)),
            _ => false,
        }
    }

    /// Whether a module (a whole mapping) starting at this address was added.
    pub fn has_module(&self, start: u64) -> bool {
        self.modules.iter().any(|(r, _)| r.start == start)
    }

    /// Adds the executable mapping `[start, end)` of `file` (mapped from `file_offset`),
    /// and says which CFI sources the file has. A module whose file cannot be read is
    /// left out: addresses in it then unwind by frame pointers.
    pub fn add_module(
        &mut self,
        file: &Path,
        start: u64,
        end: u64,
        file_offset: u64,
    ) -> Result<CfiSources, ModuleError> {
        let data = std::fs::read(file).map_err(|e| ModuleError::Unreadable(e.to_string()))?;
        self.add_module_bytes(&file.to_string_lossy(), &data, start, end, file_offset)
    }

    /// As [`DwarfUnwinder::add_module`], from the file's bytes.
    ///
    /// Every CFI source of the file is used, per address: the mapping is cut into a few
    /// sub-ranges ([`crate::cfi`]), each a framehop module given only the sections of
    /// its source — `.eh_frame` (with `.eh_frame_hdr`) where it has an FDE for the
    /// address, `.debug_frame` (only the FDEs of that sub-range) where only it has one.
    /// Each module's base is the lowest address it needs (its sub-range and its FDEs),
    /// so code linked high (a kernel at 0xffffffff80000000) is within framehop's 32-bit
    /// offsets.
    pub fn add_module_bytes(
        &mut self,
        name: &str,
        data: &[u8],
        start: u64,
        end: u64,
        file_offset: u64,
    ) -> Result<CfiSources, ModuleError> {
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
        let svma = svma_at_start..svma_at_start.wrapping_add(end.wrapping_sub(start));

        // Unwind tables come from files glass does not control: a parser panic leaves
        // the module without CFI.
        let modules = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            modules_for(name, &elf, svma, bias)
        }))
        .map_err(|_| ModuleError::NotElf("unreadable unwind tables".into()))?;
        let (modules, sources, described) = modules;
        for module in modules {
            self.unwinder.add_module(module);
        }
        if self.arch() == Arch::Aarch64 {
            self.function_starts.extend(
                elf.symbols()
                    .filter(|s| s.kind() == SymbolKind::Text && s.address() != 0)
                    .map(|s| s.address().wrapping_add(bias))
                    .filter(|a| (start..end).contains(a)),
            );
            self.function_starts.sort_unstable();
            self.function_starts.dedup();
        }
        self.described.extend(described);
        self.described.sort_by_key(|r| r.start);
        self.modules.push((start..end, sources));
        self.leaf_steps.clear();
        Ok(sources)
    }

    /// A module known only by a symbol table (a kernel's kallsyms or System.map, an
    /// `nm -n` listing): no unwind tables, but its function starts, which AArch64's
    /// frame-record walk needs to tell a link register into the leaf's own function (a
    /// call that returned) from its caller's return address.
    pub fn add_symbol_table(&mut self, start: u64, end: u64, function_starts: &[u64]) {
        if self.arch() == Arch::Aarch64 {
            self.function_starts.extend(
                function_starts
                    .iter()
                    .copied()
                    .filter(|a| (start..end).contains(a)),
            );
            self.function_starts.sort_unstable();
            self.function_starts.dedup();
        }
        self.modules.push((start..end, CfiSources::default()));
    }

    /// The CFI sources of the file of the module added at `start`.
    pub fn cfi_sources(&self, start: u64) -> Option<CfiSources> {
        self.modules
            .iter()
            .find(|(r, _)| r.start == start)
            .map(|(_, sources)| *sources)
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
        if self.arch() == Arch::Aarch64 && is_undescribed(&self.described, regs.ip + 1) {
            // No FDE for the leaf: frame records, with the link register where the leaf
            // has not saved it (see the module comment).
            return crate::aarch64::walk_frame_records(
                regs,
                read_word,
                max_depth,
                frames,
                &|a, b| self.same_function(a, b),
            );
        }
        let (modules, described) = (&self.modules, &self.described);
        let unwinder = &mut self.unwinder;
        // Unwind tables come from files glass does not control: should the parser below
        // panic on one (the fuzz test found such a case in gimli), the sample ends
        // truncated instead of taking the recorder down.
        let walked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // A signed return address framehop reads is stripped where the result is
            // code of a module: a plain stack word (a saved register, data) is kept.
            let va_bits = regs.va_bits;
            let mut read_stack = |addr: u64| {
                let word = read_word(addr).ok_or(())?;
                let stripped = crate::aarch64::strip_pac(word, va_bits);
                Ok(
                    if stripped != word && modules.iter().any(|(r, _)| r.contains(&stripped)) {
                        stripped
                    } else {
                        word
                    },
                )
            };
            let ends_stack = |frames: &Vec<u64>| {
                frames.len() > start + 1 && {
                    let last = frames[frames.len() - 1];
                    modules
                        .iter()
                        .any(|(range, sources)| range.contains(&last) && !sources.is_empty())
                        && is_undescribed(described, last)
                }
            };
            match unwinder {
                ArchUnwinder::X86_64(unwinder, cache) => {
                    let start_regs = crate::x86_64::framehop_regs(regs);
                    let iter = unwinder.iter_frames(regs.ip, start_regs, cache, &mut read_stack);
                    collect_frames(iter, max_depth, start, frames, ends_stack)
                }
                ArchUnwinder::Aarch64(unwinder, cache) => {
                    let start_regs = crate::aarch64::framehop_regs(regs);
                    let iter = unwinder.iter_frames(regs.ip, start_regs, cache, &mut read_stack);
                    collect_frames(iter, max_depth, start, frames, ends_stack)
                }
            }
        }));
        walked.unwrap_or_else(|_| {
            self.unwinder.reset_cache();
            if frames.len() == start {
                frames.push(regs.ip);
            }
            WalkEnd::Unreadable
        })
    }
}

impl DwarfUnwinder {
    /// x86-64: one step of the CFI walk, from the sampled instruction: the caller's
    /// registers (the leaf's return address as ip, its CFA as sp, rbp as the leaf's rules
    /// restore it). A walk that goes on by frame records from there has the leaf right
    /// whatever it did with rbp (an assembly leaf without a frame, a prologue not yet
    /// run). None on AArch64, where no FDE covers the leaf, or where the step fails.
    pub fn caller_of_leaf(
        &mut self,
        regs: UnwindRegs,
        read_word: &mut dyn FnMut(u64) -> Option<u64>,
    ) -> Option<UnwindRegs> {
        let memo = match self.leaf_steps.get(regs.ip) {
            Some(memo) => memo,
            None => {
                let memo = if is_undescribed(&self.described, regs.ip + 1) {
                    LeafMemo::Undescribed
                } else {
                    leaf_step::probe(regs.ip, |regs, read| self.framehop_step(regs, read))
                        .map_or(LeafMemo::AskFramehop, LeafMemo::Step)
                };
                self.leaf_steps.insert(regs.ip, memo);
                memo
            }
        };
        match memo {
            LeafMemo::Undescribed => None,
            LeafMemo::Step(step) => step.take(regs, read_word),
            LeafMemo::AskFramehop => self.framehop_step(regs, read_word),
        }
    }

    /// [`DwarfUnwinder::caller_of_leaf`]'s step, never remembered: framehop's, where an
    /// FDE covers the leaf (what the remembered steps are checked against).
    pub fn framehop_leaf_step(
        &mut self,
        regs: UnwindRegs,
        read_word: &mut dyn FnMut(u64) -> Option<u64>,
    ) -> Option<UnwindRegs> {
        if is_undescribed(&self.described, regs.ip + 1) {
            return None;
        }
        self.framehop_step(regs, read_word)
    }

    /// framehop's step from the leaf (None on AArch64).
    fn framehop_step(
        &mut self,
        regs: UnwindRegs,
        read_word: &mut dyn FnMut(u64) -> Option<u64>,
    ) -> Option<UnwindRegs> {
        let ArchUnwinder::X86_64(unwinder, cache) = &mut self.unwinder else {
            return None;
        };
        // As in `walk`: unwind tables from files glass does not control must not take the
        // recorder down.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut caller = crate::x86_64::framehop_regs(regs);
            let mut read_stack = |address: u64| read_word(address).ok_or(());
            let address = FrameAddress::from_instruction_pointer(regs.ip);
            match unwinder.unwind_frame(address, &mut caller, cache, &mut read_stack) {
                Ok(Some(return_address)) => {
                    Some(UnwindRegs::new(return_address, caller.sp(), caller.bp()))
                }
                _ => None,
            }
        }))
        .unwrap_or_else(|_| {
            self.unwinder.reset_cache();
            None
        })
    }
}

/// Runs framehop's iterator into `frames` (at most `max_depth` past `start`).
/// `ends_stack(frames)`: a failed unwind there ends the stack rather than truncating
/// it — the frame that could not be unwound is in code without CFI of an image that
/// has CFI: entry code (a kernel's boot stub calling a `noreturn` main that never saved
/// the frame pointer register, a thread's start routine), where the frame-pointer guess
/// found no frame because there is none.
fn collect_frames<U, F>(
    mut iter: framehop::UnwindIterator<'_, '_, '_, U, F>,
    max_depth: usize,
    start: usize,
    frames: &mut Vec<u64>,
    ends_stack: impl Fn(&Vec<u64>) -> bool,
) -> WalkEnd
where
    U: Unwinder,
    F: FnMut(u64) -> Result<u64, ()>,
{
    loop {
        if frames.len() - start >= max_depth {
            return WalkEnd::DepthLimit;
        }
        match iter.next() {
            Ok(Some(FrameAddress::InstructionPointer(ip))) => frames.push(ip),
            Ok(Some(FrameAddress::ReturnAddress(ra))) => frames.push(ra.get()),
            Ok(None) => return WalkEnd::Complete,
            Err(_) if ends_stack(frames) => return WalkEnd::Complete,
            Err(_) => return WalkEnd::BadFramePointer,
        }
    }
}

/// Whether the return address `address` lies in code no FDE covers (`described`: the
/// covered ranges, sorted by start).
fn is_undescribed(described: &[Range<u64>], address: u64) -> bool {
    let lookup = address.wrapping_sub(1);
    let index = described.partition_point(|r| r.start <= lookup);
    !described[..index]
        .iter()
        .rev()
        .take(64)
        .any(|r| r.contains(&lookup))
}

/// The framehop modules for the mapping `svma` (file addresses) of `elf`, loaded at
/// `svma + bias`, the file's CFI sources, and the process addresses its FDEs cover.
fn modules_for(
    name: &str,
    elf: &object::File,
    svma: Range<u64>,
    bias: u64,
) -> (Vec<Module<SectionBytes>>, CfiSources, Vec<Range<u64>>) {
    let cfi = ImageCfi::read(elf);
    let sources = cfi.sources();
    let range = |name: &str| cfi::section(elf, name).map(|(range, _)| range);
    let bytes = |name: &str| {
        cfi::section(elf, name)
            .map(|(_, data)| Arc::<[u8]>::from(&*data))
            .filter(|d| !d.is_empty())
    };
    let eh_frame = bytes(".eh_frame");
    let eh_frame_hdr = bytes(".eh_frame_hdr");
    let mut runs = cfi::plan(svma.clone(), &cfi.eh_frame, &cfi.debug_frame);
    if runs.is_empty() && eh_frame.is_some() {
        // No FDE in this mapping: as before, the whole of it with `.eh_frame` (framehop
        // finds no FDE and falls back).
        runs.push((svma.clone(), Source::EhFrame));
    }
    let eh_lowest = cfi.eh_frame.iter().map(|f| f.start).min();
    let mut covered: Vec<Range<u64>> = cfi
        .eh_frame
        .iter()
        .chain(&cfi.debug_frame)
        .filter(|f| f.start < svma.end && f.end > svma.start && f.start < f.end)
        .map(|f| f.start.wrapping_add(bias)..f.end.wrapping_add(bias))
        .collect();
    covered.sort_by_key(|r| r.start);
    let mut modules = Vec::new();
    for (run, source) in runs {
        let mut info = ExplicitModuleSectionInfo {
            text_svma: range(".text"),
            got_svma: range(".got"),
            ..Default::default()
        };
        let base_svma = match source {
            Source::EhFrame => {
                info.eh_frame_svma = range(".eh_frame");
                info.eh_frame = eh_frame.clone();
                info.eh_frame_hdr_svma = range(".eh_frame_hdr");
                info.eh_frame_hdr = eh_frame_hdr.clone();
                // Without `.eh_frame_hdr` framehop indexes every FDE relative to the
                // base, so the base is below all of them.
                run.start.min(eh_lowest.unwrap_or(run.start))
            }
            Source::DebugFrame => {
                let fdes: Vec<cfi::Fde> = cfi
                    .debug_frame
                    .iter()
                    .filter(|f| f.start < run.end && f.end > run.start)
                    .copied()
                    .collect();
                let Some(subset) = cfi
                    .debug_frame_data
                    .as_deref()
                    .and_then(|data| cfi::debug_frame_subset(data, &fdes))
                else {
                    continue;
                };
                info.debug_frame = Some(Arc::from(subset));
                fdes.iter().map(|f| f.start).fold(run.start, u64::min)
            }
        };
        info.base_svma = base_svma;
        let avma = run.start.wrapping_add(bias)..run.end.wrapping_add(bias);
        modules.push(Module::new(
            name.to_string(),
            avma,
            base_svma.wrapping_add(bias),
            info,
        ));
    }
    (modules, sources, covered)
}
