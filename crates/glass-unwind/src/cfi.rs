//! Which call-frame information (CFI) an ELF image has, and where: the address ranges of
//! the FDEs in `.eh_frame` and in `.debug_frame`, and the plan that gives each address
//! of a mapping the source to unwind it with.
//!
//! Code built with `-fno-asynchronous-unwind-tables` (kernels, unikernels such as
//! Unikraft, and programs built that way) has the CFI of its C functions only in
//! `.debug_frame`, while a small `.eh_frame` (with `.eh_frame_hdr`) covers the assembly
//! stubs, the C runtime's start files or the PLT. framehop reads one source per module,
//! `.eh_frame` when there is one, so [`plan`] cuts a mapping into a few sub-ranges, each
//! unwound with one source: `.eh_frame` where one of its FDEs covers the address,
//! `.debug_frame` where only one of its FDEs does. An address neither covers goes with
//! the sub-range before it (framehop then finds no FDE for it and falls back, as it does
//! in a module with a single source).

use std::borrow::Cow;
use std::collections::HashMap;
use std::ops::Range;

use gimli::{
    BaseAddresses, CieOrFde, DebugFrame, EhFrame, EndianSlice, LittleEndian, UnwindSection,
};
use object::{Object, ObjectSection, ObjectSegment, SegmentFlags};

/// How many FDEs (one per function, or per part of one) each CFI source of an ELF image
/// has, counting only FDEs that cover code of the image (`.debug_frame` keeps, at
/// address 0, the FDEs of functions the linker discarded).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CfiSources {
    pub eh_frame_fdes: usize,
    pub debug_frame_fdes: usize,
}

impl CfiSources {
    /// No CFI at all: the image unwinds by frame pointers only.
    pub fn is_empty(&self) -> bool {
        self.eh_frame_fdes == 0 && self.debug_frame_fdes == 0
    }
}

/// `.eh_frame (N FDEs), .debug_frame (M FDEs)`, naming only the sources present, or
/// `none: frame pointers only`.
impl std::fmt::Display for CfiSources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_empty() {
            return f.write_str("none: frame pointers only");
        }
        let mut parts = Vec::new();
        if self.eh_frame_fdes > 0 {
            parts.push(format!(".eh_frame ({} FDEs)", self.eh_frame_fdes));
        }
        if self.debug_frame_fdes > 0 {
            parts.push(format!(".debug_frame ({} FDEs)", self.debug_frame_fdes));
        }
        f.write_str(&parts.join(", "))
    }
}

/// The CFI sources of the ELF image `elf_bytes` (the whole file's bytes): how many FDEs
/// of `.eh_frame` and of `.debug_frame` cover its code. Bytes that are not an ELF file,
/// or unreadable tables, count as no CFI.
pub fn cfi_sources(elf_bytes: &[u8]) -> CfiSources {
    let Ok(elf) = object::File::parse(elf_bytes) else {
        return CfiSources::default();
    };
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        ImageCfi::read(&elf).sources()
    }))
    .unwrap_or_default()
}

/// One FDE: the addresses it covers, where it is in its section, and its CIE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fde {
    pub start: u64,
    pub end: u64,
    pub offset: usize,
    pub cie_offset: usize,
}

/// The FDEs of an image's two CFI sources, and what is needed to use them.
pub(crate) struct ImageCfi<'data> {
    pub eh_frame: Vec<Fde>,
    pub debug_frame: Vec<Fde>,
    /// `.debug_frame`'s bytes (decompressed if the file compresses it).
    pub debug_frame_data: Option<Cow<'data, [u8]>>,
    /// The executable parts of the image (svma).
    pub code: Vec<Range<u64>>,
}

/// Where a section lies and what it holds.
pub(crate) fn section<'data>(
    elf: &object::File<'data>,
    name: &str,
) -> Option<(Range<u64>, Cow<'data, [u8]>)> {
    let section = elf.section_by_name(name)?;
    let data = section.uncompressed_data().ok()?;
    Some((section.address()..section.address() + section.size(), data))
}

/// gimli's base addresses for pointers in `.eh_frame` (pc-relative, text- or
/// data-relative).
pub(crate) fn bases(elf: &object::File) -> BaseAddresses {
    let start = |name| elf.section_by_name(name).map_or(0, |s| s.address());
    BaseAddresses::default()
        .set_eh_frame(start(".eh_frame"))
        .set_eh_frame_hdr(start(".eh_frame_hdr"))
        .set_text(start(".text"))
        .set_got(start(".got"))
}

impl<'data> ImageCfi<'data> {
    pub fn read(elf: &object::File<'data>) -> Self {
        let bases = bases(elf);
        let eh_frame = section(elf, ".eh_frame")
            .map(|(_, data)| {
                let mut section = EhFrame::new(&data, LittleEndian);
                section.set_address_size(8);
                fdes(&section, &bases)
            })
            .unwrap_or_default();
        let debug_frame_data = section(elf, ".debug_frame").map(|(_, data)| data);
        let debug_frame = debug_frame_data
            .as_deref()
            .map(|data| {
                let mut section = DebugFrame::new(data, LittleEndian);
                section.set_address_size(8);
                fdes(&section, &bases)
            })
            .unwrap_or_default();
        ImageCfi {
            eh_frame,
            debug_frame,
            debug_frame_data,
            code: code_ranges(elf),
        }
    }

    pub fn sources(&self) -> CfiSources {
        let in_code = |fdes: &[Fde]| {
            fdes.iter()
                .filter(|f| {
                    self.code
                        .iter()
                        .any(|c| f.start >= c.start && f.start < c.end)
                })
                .count()
        };
        CfiSources {
            eh_frame_fdes: in_code(&self.eh_frame),
            debug_frame_fdes: in_code(&self.debug_frame),
        }
    }
}

/// The executable PT_LOAD segments, or, in a file without segments, the code sections.
fn code_ranges(elf: &object::File) -> Vec<Range<u64>> {
    let segments: Vec<Range<u64>> = elf
        .segments()
        .filter(|s| {
            matches!(s.flags(), SegmentFlags::Elf { p_flags, .. } if p_flags.0 & object::elf::PF_X.0 != 0)
        })
        .map(|s| s.address()..s.address().saturating_add(s.size()))
        .collect();
    if !segments.is_empty() {
        return segments;
    }
    elf.sections()
        .filter(|s| s.kind() == object::SectionKind::Text)
        .map(|s| s.address()..s.address().saturating_add(s.size()))
        .collect()
}

/// Every FDE of a CFI section with a non-empty range, in section order; stops at the
/// first entry that cannot be parsed (the tables come from files glass does not
/// control).
fn fdes<'a, S>(section: &S, bases: &BaseAddresses) -> Vec<Fde>
where
    S: UnwindSection<EndianSlice<'a, LittleEndian>>,
    S::Offset: gimli::UnwindOffset<usize>,
{
    let mut out = Vec::new();
    let mut entries = section.entries(bases);
    let mut last_cie = None;
    while let Ok(Some(entry)) = entries.next() {
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let parsed = partial.parse(|section, bases, offset| {
            if let Some(cie) = &last_cie {
                if gimli::UnwindOffset::into(offset) == gimli::CommonInformationEntry::offset(cie) {
                    return Ok(cie.clone());
                }
            }
            let cie = section.cie_from_offset(bases, offset)?;
            last_cie = Some(cie.clone());
            Ok(cie)
        });
        let Ok(fde) = parsed else {
            continue;
        };
        let start = fde.initial_address();
        if fde.len() == 0 {
            continue;
        }
        out.push(Fde {
            start,
            end: start.saturating_add(fde.len()),
            offset: fde.offset(),
            cie_offset: fde.cie().offset(),
        });
    }
    out
}

/// A CFI source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    EhFrame,
    DebugFrame,
}

/// Cuts `range` into consecutive, disjoint sub-ranges covering all of it, each with the
/// source that unwinds it: `.eh_frame` where one of `eh_frame` covers an address,
/// `.debug_frame` where only one of `debug_frame` does. Neighbouring stretches of one
/// source make one sub-range (the addresses between them, covered by neither, go with
/// it), so there are as few sub-ranges as there are alternations between sources.
/// Empty when no FDE of either covers anything in `range`.
pub(crate) fn plan(
    range: Range<u64>,
    eh_frame: &[Fde],
    debug_frame: &[Fde],
) -> Vec<(Range<u64>, Source)> {
    let clip = |fdes: &[Fde]| -> Vec<Range<u64>> {
        let mut ranges: Vec<Range<u64>> = fdes
            .iter()
            .map(|f| f.start.max(range.start)..f.end.min(range.end))
            .filter(|r| r.start < r.end)
            .collect();
        ranges.sort_by_key(|r| r.start);
        merge(ranges)
    };
    let eh = clip(eh_frame);
    let debug_only = subtract(&clip(debug_frame), &eh);
    let mut stretches: Vec<(Range<u64>, Source)> = eh
        .into_iter()
        .map(|r| (r, Source::EhFrame))
        .chain(debug_only.into_iter().map(|r| (r, Source::DebugFrame)))
        .collect();
    stretches.sort_by_key(|(r, _)| r.start);
    let mut runs: Vec<(Range<u64>, Source)> = Vec::new();
    for (stretch, source) in stretches {
        match runs.last_mut() {
            Some((_, last)) if *last == source => {}
            Some((last_range, _)) => {
                last_range.end = stretch.start;
                runs.push((stretch.start..range.end, source));
            }
            None => runs.push((range.start..range.end, source)),
        }
    }
    runs
}

/// Sorted ranges with overlapping or touching ones joined.
fn merge(ranges: Vec<Range<u64>>) -> Vec<Range<u64>> {
    let mut out: Vec<Range<u64>> = Vec::with_capacity(ranges.len());
    for r in ranges {
        match out.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

/// `ranges` minus `holes` (both sorted, disjoint).
fn subtract(ranges: &[Range<u64>], holes: &[Range<u64>]) -> Vec<Range<u64>> {
    let mut out = Vec::new();
    let mut h = 0;
    for r in ranges {
        let mut start = r.start;
        while h < holes.len() && holes[h].end <= start {
            h += 1;
        }
        let mut k = h;
        while start < r.end {
            match holes.get(k) {
                Some(hole) if hole.start < r.end => {
                    if hole.start > start {
                        out.push(start..hole.start);
                    }
                    start = start.max(hole.end);
                    k += 1;
                }
                _ => {
                    out.push(start..r.end);
                    break;
                }
            }
        }
    }
    out
}

/// The length of the CFI entry at `offset` (its length field included), and where and
/// how wide its CIE pointer is; None if it does not fit in `data`.
fn entry_at(data: &[u8], offset: usize) -> Option<(usize, usize, usize)> {
    let word = |at: usize, n: usize| -> Option<u64> {
        let bytes = data.get(at..at.checked_add(n)?)?;
        let mut value = [0u8; 8];
        value[..n].copy_from_slice(bytes);
        Some(u64::from_le_bytes(value))
    };
    let length = word(offset, 4)?;
    let (header, length, id_size) = match length {
        0xffff_ffff => (12, word(offset + 4, 8)?, 8),
        0xffff_fff0.. => return None,
        _ => (4, length, 4),
    };
    let total = usize::try_from(length).ok()?.checked_add(header)?;
    if offset.checked_add(total)? > data.len() || (length as usize) < id_size {
        return None;
    }
    Some((total, offset + header, id_size))
}

/// A `.debug_frame` holding only `fdes` (entries of `data`) and the CIEs they use, with
/// each FDE's CIE pointer rewritten; None if an entry cannot be copied.
pub(crate) fn debug_frame_subset(data: &[u8], fdes: &[Fde]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let mut cies: HashMap<usize, usize> = HashMap::new();
    for fde in fdes {
        if cies.contains_key(&fde.cie_offset) {
            continue;
        }
        let (len, _, _) = entry_at(data, fde.cie_offset)?;
        cies.insert(fde.cie_offset, out.len());
        out.extend_from_slice(&data[fde.cie_offset..fde.cie_offset + len]);
    }
    for fde in fdes {
        let (len, id_at, id_size) = entry_at(data, fde.offset)?;
        let at = out.len();
        out.extend_from_slice(&data[fde.offset..fde.offset + len]);
        let cie = cies[&fde.cie_offset] as u64;
        let id_at = at + (id_at - fde.offset);
        out[id_at..id_at + id_size].copy_from_slice(&cie.to_le_bytes()[..id_size]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fde(start: u64, end: u64) -> Fde {
        Fde {
            start,
            end,
            offset: 0,
            cie_offset: 0,
        }
    }

    #[test]
    fn plan_prefers_eh_frame_and_merges_neighbours_of_one_source() {
        // eh: [0x20,0x30) [0x100,0x110) [0x118,0x120); debug: [0x40,0x60) [0x60,0x80)
        // [0x100,0x120) (all but [0x110,0x118) shadowed) [0x200,0x240).
        let eh = [fde(0x20, 0x30), fde(0x100, 0x110), fde(0x118, 0x120)];
        let debug = [
            fde(0x40, 0x60),
            fde(0x60, 0x80),
            fde(0x100, 0x120),
            fde(0x200, 0x240),
            fde(0, 0x10),
        ];
        let runs = plan(0x10..0x300, &eh, &debug);
        assert_eq!(
            runs,
            vec![
                (0x10..0x40, Source::EhFrame),
                (0x40..0x100, Source::DebugFrame),
                (0x100..0x110, Source::EhFrame),
                (0x110..0x118, Source::DebugFrame),
                (0x118..0x200, Source::EhFrame),
                (0x200..0x300, Source::DebugFrame),
            ]
        );
        // One source only: one run over the whole range; none: no run.
        assert_eq!(
            plan(0x10..0x300, &[], &debug),
            vec![(0x10..0x300, Source::DebugFrame)]
        );
        assert_eq!(
            plan(0x10..0x300, &eh, &[]),
            vec![(0x10..0x300, Source::EhFrame)]
        );
        assert!(plan(0x400..0x500, &eh, &debug).is_empty());
    }

    #[test]
    fn subtract_cuts_holes() {
        assert_eq!(
            subtract(&[0..10, 20..30], &[2..4, 8..22, 25..26]),
            vec![0..2, 4..8, 22..25, 26..30]
        );
        let one = |start: u64, end: u64| vec![Range { start, end }];
        assert_eq!(subtract(&one(0, 10), &[]), one(0, 10));
        assert!(subtract(&one(5, 10), &one(0, 20)).is_empty());
    }

    #[test]
    fn sources_are_named() {
        let both = CfiSources {
            eh_frame_fdes: 3,
            debug_frame_fdes: 8,
        };
        assert_eq!(
            both.to_string(),
            ".eh_frame (3 FDEs), .debug_frame (8 FDEs)"
        );
        assert_eq!(
            CfiSources::default().to_string(),
            "none: frame pointers only"
        );
        assert_eq!(cfi_sources(b"not an ELF file"), CfiSources::default());
    }
}
