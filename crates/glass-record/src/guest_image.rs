//! What glass needs to know of a VM guest's image before sampling it: its executable
//! segments (the one "module" of the guest), where its `hlt` instructions are (so a vCPU
//! sampled right after one is named halted, not busy), and whether its frames can be
//! named at all (a stripped image, or the 32-bit multiboot copy QEMU's `-kernel` wants,
//! names nothing: the user is told at record time, not after the recording).
//!
//! On x86-64, whether an instruction pointer follows a `hlt` is decided by decoding the
//! image's code with iced-x86 from the function symbol before it (or its segment's start
//! when there is none): the byte before the instruction pointer alone would also match
//! an instruction that merely ends in 0xf4. Only addresses after a 0xf4 byte are
//! decoded, once each (a large image is never decoded whole). AArch64 instructions are
//! one aligned word each: the word before the instruction pointer is a `wfi` or `wfe`,
//! or not.

use std::collections::HashMap;
use std::path::Path;

use glass_format::Arch;
use glass_target::procfs::Mapping;
use glass_target::TargetError;
use iced_x86::{Decoder, DecoderOptions, Mnemonic};
use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, SegmentFlags, SymbolKind};

pub struct GuestImage {
    /// The executable segments at their link addresses.
    pub mappings: Vec<Mapping>,
    /// The executable segments' bytes: (address, code).
    code: Vec<(u64, Vec<u8>)>,
    /// Function symbols and segment starts, sorted: where decoding may begin.
    starts: Vec<u64>,
    /// Addresses after a 0xf4 byte already decoded: whether a `hlt` ends there.
    after_hlt: HashMap<u64, bool>,
    /// Said once at record time when frames will not be named.
    pub naming_warning: Option<String>,
    /// Which unwind tables the image has (said at record time).
    pub cfi: glass_unwind::CfiSources,
    /// The image's architecture (None for a symbol table).
    pub arch: Option<Arch>,
    /// How far the running kernel lies above the symbol table (KASLR), once found.
    pub slide: Option<u64>,
}

/// AArch64's wait-for-interrupt and wait-for-event: a vCPU stopped after one is idle.
const AARCH64_WFI: u32 = 0xd503_207f;
const AARCH64_WFE: u32 = 0xd503_205f;

impl GuestImage {
    /// Reads an ELF image, or an `nm -n` / System.map table (one mapping over its text
    /// symbols, no code: frame pointers only, halts told from guest memory).
    pub fn load(path: &Path) -> Result<GuestImage, TargetError> {
        let bytes = std::fs::read(path)
            .map_err(|e| TargetError::BadInput(format!("{}: {e}", path.display())))?;
        if !bytes.starts_with(b"\x7fELF") {
            let table = glass_symbols::nm_table(&path.to_string_lossy()).ok_or_else(|| {
                TargetError::BadInput(format!(
                    "{}: neither an ELF file nor an nm -n symbol table",
                    path.display()
                ))
            })?;
            let start = table.first().map_or(0, |s| s.0);
            let end = table.last().map_or(start, |s| s.0 + s.1);
            return Ok(GuestImage {
                slide: None,
                mappings: vec![mapping(path, start, end, 0)],
                code: Vec::new(),
                starts: table.iter().map(|s| s.0).collect(),
                after_hlt: HashMap::new(),
                naming_warning: None,
                cfi: glass_unwind::CfiSources::default(),
                arch: None,
            });
        }
        let elf = object::File::parse(&*bytes).map_err(|e| {
            TargetError::BadInput(format!("{}: not an ELF file ({e})", path.display()))
        })?;
        let arch = match elf.architecture() {
            object::Architecture::X86_64 | object::Architecture::I386 => Arch::X86_64,
            object::Architecture::Aarch64 => Arch::Aarch64,
            other => {
                return Err(TargetError::BadInput(format!(
                    "{}: a {other:?} image; glass samples x86-64 and AArch64 guests",
                    path.display()
                )))
            }
        };
        let executable: Vec<_> = elf
            .segments()
            .filter(|s| matches!(s.flags(), SegmentFlags::Elf { p_flags, .. } if p_flags.0 & object::elf::PF_X.0 != 0))
            .collect();
        if executable.is_empty() {
            return Err(TargetError::BadInput(format!(
                "{}: no executable segment",
                path.display()
            )));
        }
        let mappings = executable
            .iter()
            .map(|s| mapping(path, s.address(), s.address() + s.size(), s.file_range().0))
            .collect();
        let mut starts: Vec<u64> = elf
            .symbols()
            .filter(|s| s.kind() == SymbolKind::Text && s.is_definition())
            .map(|s| s.address())
            .collect();
        starts.extend(executable.iter().map(|s| s.address()));
        starts.sort_unstable();
        starts.dedup();
        let code = executable
            .iter()
            .filter_map(|s| Some((s.address(), s.data().ok()?.to_vec())))
            .collect();
        let naming_warning = naming_problem(&elf).map(|problem| {
            format!(
                "{} {problem} (--symbols FILE.elf, or an nm -n table)",
                path.display()
            )
        });
        Ok(GuestImage {
            slide: None,
            mappings,
            code,
            starts,
            after_hlt: HashMap::new(),
            naming_warning,
            cfi: glass_unwind::cfi_sources(&bytes),
            arch: Some(arch),
        })
    }

    /// Refuses an image of another architecture than the guest's.
    pub fn check_arch(&self, path: &Path, guest: Arch) -> Result<(), TargetError> {
        match self.arch {
            Some(image) if image != guest => Err(TargetError::BadInput(format!(
                "{} is an {image} image but the guest runs {guest}: give the guest's own image",
                path.display()
            ))),
            _ => Ok(()),
        }
    }

    /// Whether the image is a symbol table that may be of a relocated kernel whose place
    /// is not known yet.
    pub fn may_slide(&self) -> bool {
        self.slide.is_none() && self.code.is_empty() && self.arch.is_none()
    }

    /// Moves the table to where the kernel runs (its mapping and function starts).
    pub fn apply_slide(&mut self, slide: u64) {
        self.slide = Some(slide);
        for mapping in &mut self.mappings {
            mapping.start = mapping.start.wrapping_add(slide);
            mapping.end = mapping.end.wrapping_add(slide);
        }
        for start in &mut self.starts {
            *start = start.wrapping_add(slide);
        }
        self.after_hlt.clear();
    }

    /// Whether `ip` lies in the image's code.
    pub fn contains(&self, ip: u64) -> bool {
        self.mappings.iter().any(|m| ip >= m.start && ip < m.end)
    }

    /// Whether a vCPU at `ip` has just executed one of the image's `hlt` instructions:
    /// it is halted (QEMU reports a halted vCPU's instruction pointer after the `hlt`).
    pub fn halted_at(&mut self, ip: u64) -> bool {
        let Some((base, bytes)) = self
            .code
            .iter()
            .find(|(base, bytes)| ip > *base && ip <= base + bytes.len() as u64)
        else {
            return false;
        };
        if self.arch == Some(Arch::Aarch64) {
            let at = (ip - base) as usize;
            return at >= 4
                && ip.is_multiple_of(4)
                && bytes
                    .get(at - 4..at)
                    .map(|w| u32::from_le_bytes(w.try_into().unwrap_or_default()))
                    .is_some_and(|word| word == AARCH64_WFI || word == AARCH64_WFE);
        }
        if bytes[(ip - 1 - base) as usize] != 0xf4 {
            return false;
        }
        if let Some(&known) = self.after_hlt.get(&ip) {
            return known;
        }
        let index = self.starts.partition_point(|&a| a < ip);
        let from = index
            .checked_sub(1)
            .map_or(*base, |i| self.starts[i].max(*base));
        let halted = hlt_ends_at(
            &bytes[(from - base) as usize..(ip - base) as usize],
            from,
            ip,
        );
        self.after_hlt.insert(ip, halted);
        halted
    }

    /// [`GuestImage::halted_at`] for an image without the code at `ip` (a symbol table:
    /// kallsyms, System.map): the instruction before `ip` is read from the guest's memory
    /// through `read` (bytes at a guest-virtual address; how many were read). Only kernel
    /// (upper-half) addresses, whose code is the same in every process, are read and
    /// their answer kept: idle is the kernel's.
    pub fn halted_in_memory(
        &mut self,
        arch: Arch,
        ip: u64,
        read: &mut dyn FnMut(u64, &mut [u8]) -> usize,
    ) -> bool {
        if self
            .code
            .iter()
            .any(|(base, bytes)| ip > *base && ip <= base + bytes.len() as u64)
        {
            return self.halted_at(ip);
        }
        if ip >> 63 == 0 {
            return false;
        }
        if let Some(&known) = self.after_hlt.get(&ip) {
            return known;
        }
        let halted = match arch {
            Arch::Aarch64 => {
                let mut word = [0u8; 4];
                ip.is_multiple_of(4)
                    && read(ip - 4, &mut word) == 4
                    && matches!(u32::from_le_bytes(word), AARCH64_WFI | AARCH64_WFE)
            }
            Arch::X86_64 => {
                // From the function's start where it is near, else the hlt byte alone.
                const MOST: u64 = 4096;
                let index = self.starts.partition_point(|&a| a < ip);
                let from = index
                    .checked_sub(1)
                    .map(|i| self.starts[i])
                    .filter(|&start| ip - start <= MOST)
                    .unwrap_or(ip - 1);
                let mut bytes = vec![0u8; (ip - from) as usize];
                read(from, &mut bytes) == bytes.len()
                    && bytes.last() == Some(&0xf4)
                    && hlt_ends_at(&bytes, from, ip)
            }
        };
        self.after_hlt.insert(ip, halted);
        halted
    }
}

/// Whether decoding `bytes` (code at `from`) yields a `hlt` that ends at `ip`.
fn hlt_ends_at(bytes: &[u8], from: u64, ip: u64) -> bool {
    let mut decoder = Decoder::with_ip(64, bytes, from, DecoderOptions::NONE);
    (&mut decoder)
        .into_iter()
        .any(|instruction| instruction.mnemonic() == Mnemonic::Hlt && instruction.next_ip() == ip)
}

fn mapping(path: &Path, start: u64, end: u64, file_offset: u64) -> Mapping {
    Mapping {
        start,
        end,
        file_offset,
        path: path.to_string_lossy().into_owned(),
        deleted: false,
    }
}

/// Why frames of this image will not be named (or not well), if so.
fn naming_problem(elf: &object::File) -> Option<&'static str> {
    let named = elf
        .symbols()
        .chain(elf.dynamic_symbols())
        .any(|s| s.kind() == SymbolKind::Text && s.is_definition());
    if !named {
        return Some(
            "has no function symbols (stripped): guest frames will show as addresses; give the image's unstripped 64-bit ELF",
        );
    }
    if !elf.is_64() && !built_32_bit(elf) {
        return Some(
            "is a 32-bit ELF (the multiboot copy QEMU's -kernel loads): symbols above 4 GiB and unwind tables may be lost; give the image's 64-bit ELF",
        );
    }
    None
}

/// An ELF32 whose debug information has 4-byte addresses was compiled as 32-bit code (a
/// 32-bit guest, guests/demo32), not converted from a 64-bit image by `objcopy -O
/// elf32-i386` (which keeps the 8-byte DWARF of the code inside). Read from the first
/// unit's header: its address size is at byte 10 (DWARF 2-4) or 7 (DWARF 5).
fn built_32_bit(elf: &object::File) -> bool {
    let Some(info) = elf
        .section_by_name(".debug_info")
        .and_then(|s| s.data().ok())
    else {
        return false;
    };
    let version = info.get(4..6).map(|v| u16::from_le_bytes([v[0], v[1]]));
    let at = if version == Some(5) { 7 } else { 10 };
    info.get(at) == Some(&4)
}
