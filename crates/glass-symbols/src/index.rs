//! The symbol index of a module: every address range of its code with the functions
//! running there (outermost first, then the ones inlined into it), and its symbol
//! table, in a flat file that is mapped and binary-searched.
//!
//! Why glass has its own: addr2line (what names frames otherwise) finds functions
//! lazily, parsing a compilation unit's DIEs when an address first falls in it, and
//! keeps nothing; a report of a new recording then pays for the whole debug file again
//! (libc's is 2.4 MB of compressed sections to inflate, libpython's 23 MB to walk),
//! which is most of a short report's time. The index is built once per build (from
//! every unit, with gimli) and kept in the symbol cache, so any later report of that
//! build looks each address up in microseconds. Sentry's symcache is the library for
//! such files, but it names frames by its own rules (symbol names over DWARF's, `.cold`
//! parts, aliases): glass's names must not depend on whether a cache exists, so the
//! index follows addr2line's rules exactly and the tests compare the two on every
//! address.
//!
//! addr2line's rules, as followed here: a function is a `DW_TAG_subprogram` with
//! addresses (low/high pc or ranges; empty ranges ignored), named by its linkage name,
//! else its name, else (whichever comes first in its attributes) the name of its
//! abstract origin or specification, followed up to 16 times; inlined calls are the
//! `DW_TAG_inlined_subroutine`s below it (not below a nested subprogram, which is a
//! function of its own), at depth n when inside n others; an address runs, at each
//! depth from 0 up, the inlined call of that depth whose range holds it, up to the
//! first depth with none. Names are demangled by the unit's language. Where DWARF names
//! nothing, the symbol table does: the last symbol at or before the address, within its
//! size (an unsized one reaches the next).
//!
//! Modules the index cannot describe as addr2line would (a supplementary `dwz` file,
//! split DWARF), and modules with more than 512 MB of `.debug_info` (indexing walks all
//! of it), are left to addr2line.
//!
//! File layout (little endian; tables 8-byte aligned): the magic, then nine u64
//! counts and offsets (see [`Layout`]); DWARF ranges (begin, end as u64 pairs) sorted
//! and disjoint, each with a u32 chain; chain starts (u32, one more than chains) into
//! chain items (u32 name indices, outermost first); symbol ranges (begin, end u64
//! pairs) with a u32 name each; name starts (u32, one more than names) into the UTF-8
//! name bytes.

use std::borrow::Cow;
use std::collections::HashMap;
use std::rc::Rc;

use object::{Object, ObjectSection};

const MAGIC: &[u8; 8] = b"glsidx01";

/// The largest `.debug_info` indexed (bytes, uncompressed).
const MAX_DEBUG_INFO: u64 = 512 << 20;

/// Below this much `.debug_info` (bytes), a module's units are walked on one thread.
const PARALLEL_WALK_BYTES: usize = 1 << 20;

/// The index of one module, over its file's bytes.
pub struct SymbolIndex<B: AsRef<[u8]>> {
    bytes: B,
    layout: Layout,
}

/// Where each table starts in the file, and its length.
#[derive(Debug, Clone, Copy)]
struct Layout {
    dwarf_ranges: (usize, usize),
    chain_of_range: usize,
    chain_starts: (usize, usize),
    chain_items: (usize, usize),
    symbol_ranges: (usize, usize),
    name_of_symbol: usize,
    name_starts: (usize, usize),
    name_bytes: (usize, usize),
}

const HEADER: usize = 8 + 9 * 8;

// Reads are bounds-checked, not trusted: a cache file damaged on disk may name
// frames wrongly (its structure is checked when parsed), but never makes glass panic.
fn u32_at(bytes: &[u8], offset: usize) -> u32 {
    bytes
        .get(offset..offset.saturating_add(4))
        .map_or(0, |b| u32::from_le_bytes(b.try_into().unwrap_or_default()))
}

fn u64_at(bytes: &[u8], offset: usize) -> u64 {
    bytes
        .get(offset..offset.saturating_add(8))
        .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or_default()))
}

/// What the index says of an address.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup<'a> {
    /// DWARF's functions, outermost first.
    Dwarf(Vec<&'a str>),
    /// The symbol table's function.
    Symbol(&'a str),
    /// Nothing names it.
    None,
}

impl<B: AsRef<[u8]>> SymbolIndex<B> {
    /// The index in `bytes`, if they hold a whole and consistent one.
    pub fn parse(bytes: B) -> Option<Self> {
        let data = bytes.as_ref();
        if data.len() < HEADER || data[..8] != MAGIC[..] {
            return None;
        }
        let field = |i: usize| u64_at(data, 8 + i * 8) as usize;
        let (ranges, chains, items, symbols, names, name_length) =
            (field(0), field(1), field(2), field(3), field(4), field(5));
        // Each table's size, in order; the file must hold exactly them.
        let sizes = [
            ranges.checked_mul(16)?,
            ranges.checked_mul(4)?,
            chains.checked_add(1)?.checked_mul(4)?,
            items.checked_mul(4)?,
            symbols.checked_mul(16)?,
            symbols.checked_mul(4)?,
            names.checked_add(1)?.checked_mul(4)?,
            name_length,
        ];
        let mut offsets = [0usize; 8];
        let mut at = HEADER;
        for (i, size) in sizes.iter().enumerate() {
            at = at.checked_add(7)? & !7;
            offsets[i] = at;
            at = at.checked_add(*size)?;
        }
        if at != data.len() || field(6) != 0 || field(7) != 0 || field(8) != 0 {
            return None;
        }
        let layout = Layout {
            dwarf_ranges: (offsets[0], ranges),
            chain_of_range: offsets[1],
            chain_starts: (offsets[2], chains),
            chain_items: (offsets[3], items),
            symbol_ranges: (offsets[4], symbols),
            name_of_symbol: offsets[5],
            name_starts: (offsets[6], names),
            name_bytes: (offsets[7], name_length),
        };
        Some(SymbolIndex { bytes, layout })
    }

    fn name(&self, index: u32) -> &str {
        let data = self.bytes.as_ref();
        let (starts, count) = self.layout.name_starts;
        if index as usize >= count {
            return "";
        }
        let begin = u32_at(data, starts + index as usize * 4) as usize;
        let end = u32_at(data, starts + index as usize * 4 + 4) as usize;
        let (base, length) = self.layout.name_bytes;
        if begin > end || end > length {
            return "";
        }
        std::str::from_utf8(&data[base + begin..base + end]).unwrap_or("")
    }

    /// The index's bytes, as given.
    pub fn bytes(&self) -> &B {
        &self.bytes
    }

    /// The range of a sorted (begin, end) table holding `address`.
    fn find(&self, (table, count): (usize, usize), address: u64) -> Option<usize> {
        let data = self.bytes.as_ref();
        let begin = |i: usize| u64_at(data, table + i * 16);
        // The first range beginning after the address; the one before may hold it.
        let (mut low, mut high) = (0, count);
        while low < high {
            let middle = (low + high) / 2;
            if begin(middle) <= address {
                low = middle + 1;
            } else {
                high = middle;
            }
        }
        let candidate = low.checked_sub(1)?;
        (address < u64_at(data, table + candidate * 16 + 8)).then_some(candidate)
    }

    /// The functions at file address `address`.
    pub fn lookup(&self, address: u64) -> Lookup<'_> {
        let data = self.bytes.as_ref();
        let l = &self.layout;
        if let Some(range) = self.find(l.dwarf_ranges, address) {
            let chain = (u32_at(data, l.chain_of_range + range * 4) as usize).min(l.chain_starts.1);
            let first = u32_at(data, l.chain_starts.0 + chain * 4) as usize;
            let end =
                (u32_at(data, l.chain_starts.0 + chain * 4 + 4) as usize).min(l.chain_items.1);
            return Lookup::Dwarf(
                (first.min(end)..end)
                    .map(|i| self.name(u32_at(data, l.chain_items.0 + i * 4)))
                    .collect(),
            );
        }
        match self.find(l.symbol_ranges, address) {
            Some(symbol) => Lookup::Symbol(self.name(u32_at(data, l.name_of_symbol + symbol * 4))),
            None => Lookup::None,
        }
    }
}

/// Builds the index of a module from its debug file (DWARF, when it has some) and its
/// function symbols (sorted, sized as the symbolizer sizes them), walking its DWARF on
/// up to `threads` threads (the same index whatever the number). None when the DWARF
/// is of a kind the index leaves to addr2line, or cannot be read.
pub fn build(debug_file: &str, symbols: &[(u64, u64, String)], threads: usize) -> Option<Vec<u8>> {
    let mut names = Names::default();
    let dwarf_ranges = dwarf_ranges(debug_file, &mut names, threads)?;
    let writer = Writer::default();
    // Symbol ranges: the last symbol at or before an address names it, within its
    // size; so each reaches at most the next symbol.
    let mut symbol_ranges = Vec::with_capacity(symbols.len());
    for (i, (address, size, name)) in symbols.iter().enumerate() {
        let end = if *size == 0 {
            u64::MAX
        } else {
            address.saturating_add(*size)
        };
        let end = symbols.get(i + 1).map_or(end, |next| end.min(next.0));
        if end > *address {
            symbol_ranges.push((*address, end, names.intern(name)));
        }
    }
    writer.finish(dwarf_ranges, symbol_ranges, names)
}

#[derive(Default)]
struct Names {
    index: HashMap<String, u32>,
    list: Vec<String>,
}

impl Names {
    fn intern(&mut self, name: &str) -> u32 {
        if let Some(&index) = self.index.get(name) {
            return index;
        }
        let index = self.list.len() as u32;
        self.list.push(name.to_string());
        self.index.insert(name.to_string(), index);
        index
    }
}

/// Disjoint sorted ranges, each with the names running there (outermost first).
type Ranges = Vec<(u64, u64, Vec<u32>)>;

type Slice<'a> = gimli::EndianSlice<'a, gimli::RunTimeEndian>;

/// Every range of DWARF functions in `path`; empty when it has no DWARF.
fn dwarf_ranges(path: &str, names: &mut Names, threads: usize) -> Option<Ranges> {
    let file = std::fs::File::open(path).ok()?;
    // SAFETY: read-only map of a regular file.
    let map = unsafe { memmap2::Mmap::map(&file) }.ok()?;
    let elf = object::File::parse(&*map).ok()?;
    // DWARF that refers to a supplementary file (dwz): addr2line's Loader follows it.
    // (Stripped Debian binaries keep the link with no DWARF left: nothing to follow.)
    let debug_info = elf
        .section_by_name(".debug_info")
        .filter(|s| s.size() > 0 && s.file_range().is_some());
    let has_dwarf = debug_info.is_some();
    // Indexing walks all of it (about 3 ms per MB): beyond this, a report looks up
    // only the units its addresses fall in, through addr2line, every time.
    if debug_info.is_some_and(|s| s.size() > MAX_DEBUG_INFO) {
        return None;
    }
    if has_dwarf
        && (elf.section_by_name(".gnu_debugaltlink").is_some()
            || elf.section_by_name(".debug_sup").is_some())
    {
        return None;
    }
    let endian = if elf.is_little_endian() {
        gimli::RunTimeEndian::Little
    } else {
        gimli::RunTimeEndian::Big
    };
    // Only what names functions and their ranges is inflated (not location lists,
    // address tables, macros: a third of a distribution's compressed debug file).
    let needed = |id: gimli::SectionId| {
        use gimli::SectionId::*;
        matches!(
            id,
            DebugInfo
                | DebugAbbrev
                | DebugStr
                | DebugStrOffsets
                | DebugLineStr
                | DebugAddr
                | DebugRanges
                | DebugRngLists
                | DebugLine
        )
    };
    let load = |id: gimli::SectionId| -> Result<Cow<[u8]>, ()> {
        Ok(
            match elf.section_by_name(id.name()).filter(|_| needed(id)) {
                Some(section) => section.uncompressed_data().map_err(|_| ())?,
                None => Cow::Borrowed(&[][..]),
            },
        )
    };
    // .debug_info is most of the inflating (one zlib stream): given threads, on one of
    // its own while this one inflates the rest.
    let (debug_info, sections) = std::thread::scope(|scope| {
        let debug_info = (threads > 1).then(|| scope.spawn(|| load(gimli::SectionId::DebugInfo)));
        let sections = gimli::DwarfSections::load(|id| match id {
            gimli::SectionId::DebugInfo if debug_info.is_some() => Ok(Cow::Borrowed(&[][..])),
            _ => load(id),
        });
        (debug_info.map(|handle| handle.join()), sections)
    });
    let mut sections = sections.ok()?;
    if let Some(debug_info) = debug_info {
        sections.debug_info = gimli::DebugInfo::from(debug_info.ok()?.ok()?);
    }
    let dwarf = sections.borrow(|section| gimli::EndianSlice::new(section, endian));
    let units = Walker::new(&dwarf)?.units;
    // Units are independent but for the names they borrow from each other: the walk
    // is split into contiguous stretches of units, one per core, each with a walker
    // of its own; their ranges and names are joined in unit order, so the index is
    // the one a single walk makes.
    let info_len = gimli::Section::reader(&dwarf.debug_info).len();
    let parts = if info_len < PARALLEL_WALK_BYTES {
        1
    } else {
        threads.clamp(1, 8)
    };
    // Each stretch begins at the first unit at or past its share of the bytes.
    let bounds: Vec<usize> = (0..parts)
        .map(|part| units.partition_point(|(offset, _)| *offset < info_len * part / parts))
        .chain([units.len()])
        .collect();
    let walk = |stretch: std::ops::Range<usize>, mut names: Names| {
        let mut walker = Walker::new(&dwarf)?;
        let mut ranges = Ranges::new();
        for unit in stretch {
            walker.unit_ranges(unit, &mut names, &mut ranges).ok()?;
        }
        Some((ranges, names))
    };
    // The first stretch is walked here, into the module's names; the others' names
    // are added to those afterwards, in order.
    let (first, others) = std::thread::scope(|scope| {
        let others: Vec<_> = (1..parts)
            .map(|part| {
                let stretch = bounds[part]..bounds[part + 1];
                let walk = &walk;
                scope.spawn(move || walk(stretch, Names::default()))
            })
            .collect();
        let first = walk(bounds[0]..bounds[1], std::mem::take(names));
        let others: Vec<_> = others
            .into_iter()
            .map(|handle| handle.join().ok().flatten())
            .collect();
        (first, others)
    });
    let (mut ranges, first_names) = first?;
    *names = first_names;
    for part in others {
        let (mut part_ranges, part_names) = part?;
        let global: Vec<u32> = part_names.list.iter().map(|n| names.intern(n)).collect();
        for (_, _, chain) in &mut part_ranges {
            for name in chain.iter_mut() {
                *name = global[*name as usize];
            }
        }
        ranges.append(&mut part_ranges);
    }
    // Functions of different units (or folded identical code) may overlap: the first
    // found keeps its addresses, as addr2line keeps the first unit's.
    ranges.sort_by_key(|range| range.0);
    let mut disjoint: Ranges = Vec::with_capacity(ranges.len());
    for (begin, end, chain) in ranges {
        let begin = disjoint.last().map_or(begin, |last| begin.max(last.1));
        if begin < end {
            disjoint.push((begin, end, chain));
        }
    }
    Some(disjoint)
}

/// A function or inlined call while its unit is walked.
struct Piece {
    ranges: Vec<(u64, u64)>,
    name: Option<u32>,
}

/// A function and the ranges of its inlined calls: (begin, end, depth, name).
struct Function {
    piece: Piece,
    inlined: Vec<(u64, u64, usize, Option<u32>)>,
}

struct Walker<'d, 'a> {
    dwarf: &'d gimli::Dwarf<Slice<'a>>,
    /// Every unit's header offset, in order, and the unit once parsed.
    units: Vec<(usize, gimli::UnitHeader<Slice<'a>>)>,
    parsed: HashMap<usize, Rc<gimli::Unit<Slice<'a>>>>,
    /// Each raw name (and language) once demangled and interned: a name recurs in
    /// every unit that inlines its function.
    interned: HashMap<(&'a [u8], Option<gimli::DwLang>), u32>,
}

impl<'d, 'a> Walker<'d, 'a> {
    fn new(dwarf: &'d gimli::Dwarf<Slice<'a>>) -> Option<Self> {
        let mut units = Vec::new();
        let mut headers = dwarf.units();
        while let Some(header) = headers.next().ok()? {
            match header.type_() {
                gimli::UnitType::Compilation | gimli::UnitType::Partial => {}
                // Skeleton units name their functions in .dwo files: addr2line's.
                gimli::UnitType::Skeleton(_) | gimli::UnitType::SplitCompilation(_) => return None,
                _ => continue,
            }
            let offset = header.offset().to_debug_info_offset(&header)?.0;
            units.push((offset, header));
        }
        Some(Walker {
            dwarf,
            units,
            parsed: HashMap::new(),
            interned: HashMap::new(),
        })
    }

    /// The address ranges and the name of a function or inlined call whose abbreviation
    /// was just read, reading its attributes in order.
    fn read_die(
        &mut self,
        entries: &mut gimli::EntriesRaw<'_, Slice<'a>>,
        abbrev: &gimli::Abbreviation,
        unit_index: usize,
        unit: gimli::UnitRef<Slice<'a>>,
    ) -> gimli::Result<(Vec<(u64, u64)>, Naming<'a>)> {
        let mut range = RangeAttributes::default();
        let mut naming = Naming::default();
        for spec in abbrev.attributes() {
            let attr = entries.read_attribute(*spec)?;
            range.read(unit, &attr)?;
            naming.read(self, unit_index, unit, &attr)?;
        }
        Ok((range.ranges(unit)?, naming))
    }

    /// The index of the name `naming` found, demangled by the unit's language.
    fn intern(
        &mut self,
        naming: Naming<'a>,
        names: &mut Names,
        language: Option<gimli::DwLang>,
    ) -> Option<u32> {
        let raw = naming.name?;
        let key = (raw.slice(), language);
        if let Some(&index) = self.interned.get(&key) {
            return Some(index);
        }
        let index = names.intern(&addr2line::demangle_auto(raw.to_string_lossy(), language));
        self.interned.insert(key, index);
        Some(index)
    }

    fn unit(&mut self, index: usize) -> gimli::Result<Rc<gimli::Unit<Slice<'a>>>> {
        if let Some(unit) = self.parsed.get(&index) {
            return Ok(unit.clone());
        }
        let unit = Rc::new(self.dwarf.unit(self.units[index].1)?);
        self.parsed.insert(index, unit.clone());
        Ok(unit)
    }

    /// The ranges of every function of unit `index`, with the names running in each,
    /// in one walk over its DIEs: a function's inlined calls are the ones below it and
    /// not below a function nested in it, as addr2line collects them.
    fn unit_ranges(
        &mut self,
        index: usize,
        names: &mut Names,
        out: &mut Ranges,
    ) -> gimli::Result<()> {
        let unit = self.unit(index)?;
        let unit_ref = gimli::UnitRef::new(self.dwarf, &unit);
        let language = language(&unit);
        // Functions with addresses, in the order of their DIEs.
        let mut functions: Vec<Function> = Vec::new();
        // The subprograms whose DIEs the walk is in: their depth, their function (None
        // without addresses), and the depths of the inlined calls open in them.
        let mut open: Vec<(isize, Option<usize>, Vec<isize>)> = Vec::new();
        let mut entries = unit.entries_raw(None)?;
        while !entries.is_empty() {
            let depth = entries.next_depth();
            while open.last().is_some_and(|(d, _, _)| *d >= depth) {
                open.pop();
            }
            if let Some((_, _, calls)) = open.last_mut() {
                while calls.last().is_some_and(|&d| d >= depth) {
                    calls.pop();
                }
            }
            let Some(abbrev) = entries.read_abbreviation()? else {
                continue;
            };
            match abbrev.tag() {
                gimli::DW_TAG_subprogram => {
                    let (ranges, naming) = self.read_die(&mut entries, abbrev, index, unit_ref)?;
                    let function = (!ranges.is_empty()).then(|| {
                        functions.push(Function {
                            piece: Piece {
                                ranges,
                                name: self.intern(naming, names, language),
                            },
                            inlined: Vec::new(),
                        });
                        functions.len() - 1
                    });
                    open.push((depth, function, Vec::new()));
                }
                gimli::DW_TAG_inlined_subroutine if !open.is_empty() => {
                    let (ranges, naming) = self.read_die(&mut entries, abbrev, index, unit_ref)?;
                    let Some((_, function, calls)) = open.last_mut() else {
                        continue;
                    };
                    if let Some(function) = function {
                        let name = self.intern(naming, names, language);
                        for (begin, end) in ranges {
                            functions[*function]
                                .inlined
                                .push((begin, end, calls.len(), name));
                        }
                    }
                    calls.push(depth);
                }
                _ => entries.skip_attributes(abbrev.attributes())?,
            }
        }
        // Which function an address finds is addr2line's binary search over the unit's
        // ranges sorted by beginning (functions folded into the same code overlap): the
        // same search, once per stretch between range edges, gives each function the
        // addresses it names.
        let mut addresses: Vec<(u64, u64, usize)> = Vec::new();
        for (i, function) in functions.iter().enumerate() {
            addresses.extend(
                function
                    .piece
                    .ranges
                    .iter()
                    .map(|&(begin, end)| (begin, end, i)),
            );
        }
        addresses.sort_unstable_by_key(|address| address.0);
        let mut owned: Vec<Vec<(u64, u64)>> = vec![Vec::new(); functions.len()];
        for (from, to) in stretches(addresses.iter().map(|a| (a.0, a.1))) {
            let found = addresses.binary_search_by(|a| {
                if from < a.0 {
                    std::cmp::Ordering::Greater
                } else if from >= a.1 {
                    std::cmp::Ordering::Less
                } else {
                    std::cmp::Ordering::Equal
                }
            });
            if let Ok(found) = found {
                let ranges = &mut owned[addresses[found].2];
                match ranges.last_mut() {
                    Some(last) if last.1 == from => last.1 = to,
                    _ => ranges.push((from, to)),
                }
            }
        }
        for (mut function, ranges) in functions.into_iter().zip(owned) {
            if !ranges.is_empty() {
                function.piece.ranges = ranges;
                flatten(&function.piece, function.inlined, out);
            }
        }
        Ok(())
    }

    /// The name of the DIE at `offset` in unit `unit_index`, by addr2line's rules for
    /// the DIE an abstract origin or specification points to.
    fn name_at(
        &mut self,
        unit_index: usize,
        offset: gimli::UnitOffset,
        recursion: usize,
    ) -> gimli::Result<Option<Slice<'a>>> {
        let dwarf = self.dwarf;
        let unit = self.unit(unit_index)?;
        let unit_ref = gimli::UnitRef::new(dwarf, &unit);
        let mut entries = unit.entries_raw(Some(offset))?;
        let Some(abbrev) = entries.read_abbreviation()? else {
            return Ok(None);
        };
        let mut name = None;
        let mut next = None;
        for spec in abbrev.attributes() {
            let attr = entries.read_attribute(*spec)?;
            match attr.name() {
                gimli::DW_AT_linkage_name | gimli::DW_AT_MIPS_linkage_name => {
                    if let Ok(value) = unit_ref.attr_string(attr.value()) {
                        return Ok(Some(value));
                    }
                }
                gimli::DW_AT_name => {
                    if let Ok(value) = unit_ref.attr_string(attr.value()) {
                        name = Some(value);
                    }
                }
                gimli::DW_AT_abstract_origin | gimli::DW_AT_specification => {
                    next = Some(attr.value());
                }
                _ => {}
            }
        }
        match (name, next) {
            (Some(name), _) => Ok(Some(name)),
            (None, Some(next)) => self.name_of(unit_index, next, recursion - 1),
            (None, None) => Ok(None),
        }
    }

    /// The name an abstract origin or specification attribute leads to.
    fn name_of(
        &mut self,
        unit_index: usize,
        value: gimli::AttributeValue<Slice<'a>>,
        recursion: usize,
    ) -> gimli::Result<Option<Slice<'a>>> {
        if recursion == 0 {
            return Ok(None);
        }
        match value {
            gimli::AttributeValue::UnitRef(offset) => self.name_at(unit_index, offset, recursion),
            gimli::AttributeValue::DebugInfoRef(target) => {
                // The unit holding the offset: the last one starting at or before it.
                let found = self.units.partition_point(|(start, _)| *start <= target.0);
                let Some(index) = found.checked_sub(1) else {
                    return Ok(None);
                };
                let header = &self.units[index].1;
                match target.to_unit_offset(header) {
                    Some(offset) => self.name_at(index, offset, recursion),
                    None => Ok(None),
                }
            }
            _ => Ok(None),
        }
    }
}

/// A DIE's name attributes, read in order as addr2line reads them.
#[derive(Default)]
struct Naming<'a> {
    name: Option<Slice<'a>>,
}

impl<'a> Naming<'a> {
    fn read(
        &mut self,
        walker: &mut Walker<'_, 'a>,
        unit_index: usize,
        unit: gimli::UnitRef<Slice<'a>>,
        attr: &gimli::Attribute<Slice<'a>>,
    ) -> gimli::Result<()> {
        match attr.name() {
            gimli::DW_AT_linkage_name | gimli::DW_AT_MIPS_linkage_name => {
                if let Ok(value) = unit.attr_string(attr.value()) {
                    self.name = Some(value);
                }
            }
            gimli::DW_AT_name if self.name.is_none() => {
                self.name = unit.attr_string(attr.value()).ok();
            }
            gimli::DW_AT_abstract_origin | gimli::DW_AT_specification if self.name.is_none() => {
                self.name = walker.name_of(unit_index, attr.value(), 16)?;
            }
            _ => {}
        }
        Ok(())
    }
}

#[derive(Default)]
struct RangeAttributes {
    low_pc: Option<u64>,
    high_pc: Option<u64>,
    size: Option<u64>,
    ranges_offset: Option<gimli::RangeListsOffset>,
}

impl RangeAttributes {
    fn read<'a>(
        &mut self,
        unit: gimli::UnitRef<Slice<'a>>,
        attr: &gimli::Attribute<Slice<'a>>,
    ) -> gimli::Result<()> {
        match (attr.name(), attr.value()) {
            (gimli::DW_AT_low_pc, gimli::AttributeValue::Addr(value)) => self.low_pc = Some(value),
            (gimli::DW_AT_low_pc, gimli::AttributeValue::DebugAddrIndex(index)) => {
                self.low_pc = Some(unit.address(index)?)
            }
            (gimli::DW_AT_high_pc, gimli::AttributeValue::Addr(value)) => {
                self.high_pc = Some(value)
            }
            (gimli::DW_AT_high_pc, gimli::AttributeValue::DebugAddrIndex(index)) => {
                self.high_pc = Some(unit.address(index)?)
            }
            (gimli::DW_AT_high_pc, gimli::AttributeValue::Udata(value)) => self.size = Some(value),
            (gimli::DW_AT_ranges, value) => self.ranges_offset = unit.attr_ranges_offset(value)?,
            _ => {}
        }
        Ok(())
    }

    /// The non-empty ranges.
    fn ranges(&self, unit: gimli::UnitRef<Slice<'_>>) -> gimli::Result<Vec<(u64, u64)>> {
        let mut ranges = Vec::new();
        if let Some(offset) = self.ranges_offset {
            let mut list = unit.ranges(offset)?;
            while let Some(range) = list.next()? {
                ranges.push((range.begin, range.end));
            }
        } else if let (Some(begin), Some(end)) = (self.low_pc, self.high_pc) {
            ranges.push((begin, end));
        } else if let (Some(begin), Some(size)) = (self.low_pc, self.size) {
            // A -1 tombstone overflows and is dropped as empty.
            ranges.push((begin, begin.wrapping_add(size)));
        }
        ranges.retain(|(begin, end)| begin < end);
        Ok(ranges)
    }
}

fn language(unit: &gimli::Unit<Slice<'_>>) -> Option<gimli::DwLang> {
    let mut entries = unit.entries();
    let root = entries.next_dfs().ok()??;
    match root.attr_value(gimli::DW_AT_language) {
        Some(gimli::AttributeValue::Language(language)) => Some(language),
        _ => None,
    }
}

/// The stretches between consecutive edges of `ranges` (begins and ends, sorted):
/// within one, every search over the ranges finds the same.
fn stretches(ranges: impl Iterator<Item = (u64, u64)>) -> Vec<(u64, u64)> {
    let mut edges: Vec<u64> = ranges.flat_map(|(begin, end)| [begin, end]).collect();
    edges.sort_unstable();
    edges.dedup();
    edges.windows(2).map(|pair| (pair[0], pair[1])).collect()
}

/// Splits a function's ranges where its inlined calls begin and end, each piece with
/// the names running there: the function's, then, depth by depth, the call addr2line's
/// search finds (its ranges sorted by depth, then beginning; one depth searched after
/// the range found at the one before), up to the first depth with none. Pieces naming
/// nothing are left out (the symbol table names them).
fn flatten(function: &Piece, mut inlined: Vec<(u64, u64, usize, Option<u32>)>, out: &mut Ranges) {
    inlined.sort_unstable_by_key(|call| (call.2, call.0));
    let edges = function
        .ranges
        .iter()
        .copied()
        .chain(inlined.iter().map(|call| (call.0, call.1)));
    for (from, to) in stretches(edges) {
        if !function.ranges.iter().any(|&(b, e)| from >= b && from < e) {
            continue;
        }
        let mut chain: Vec<u32> = function.name.into_iter().collect();
        let mut rest = &inlined[..];
        let mut depth = 0;
        loop {
            let found = rest.binary_search_by(|call| {
                use std::cmp::Ordering::*;
                if call.2 > depth {
                    Greater
                } else if call.2 < depth {
                    Less
                } else if call.0 > from {
                    Greater
                } else if call.1 <= from {
                    Less
                } else {
                    Equal
                }
            });
            let Ok(found) = found else {
                break;
            };
            chain.extend(rest[found].3);
            rest = &rest[found + 1..];
            depth += 1;
        }
        if chain.is_empty() {
            continue;
        }
        // Neighbours running the same names are one range.
        match out.last_mut() {
            Some(last) if last.1 == from && last.2 == chain => last.1 = to,
            _ => out.push((from, to, chain)),
        }
    }
}

#[derive(Default)]
struct Writer {
    bytes: Vec<u8>,
}

impl Writer {
    fn align(&mut self) {
        while !self.bytes.len().is_multiple_of(8) {
            self.bytes.push(0);
        }
    }

    fn u32(&mut self, value: u32) {
        self.bytes.extend_from_slice(&value.to_le_bytes());
    }

    fn u64(&mut self, value: u64) {
        self.bytes.extend_from_slice(&value.to_le_bytes());
    }

    fn finish(
        mut self,
        dwarf: Ranges,
        symbols: Vec<(u64, u64, u32)>,
        names: Names,
    ) -> Option<Vec<u8>> {
        let mut chains: HashMap<Vec<u32>, u32> = HashMap::new();
        let mut chain_list: Vec<&[u32]> = Vec::new();
        let mut chain_of_range = Vec::with_capacity(dwarf.len());
        for (_, _, chain) in &dwarf {
            let next = chain_list.len() as u32;
            let index = *chains.entry(chain.clone()).or_insert(next);
            if index == next {
                chain_list.push(chain);
            }
            chain_of_range.push(index);
        }
        let items: usize = chain_list.iter().map(|c| c.len()).sum();
        let name_length: usize = names.list.iter().map(String::len).sum();
        u32::try_from(items).ok()?;
        u32::try_from(name_length).ok()?;
        self.bytes.extend_from_slice(MAGIC);
        for count in [
            dwarf.len(),
            chain_list.len(),
            items,
            symbols.len(),
            names.list.len(),
            name_length,
            0,
            0,
            0,
        ] {
            self.u64(count as u64);
        }
        self.align();
        for (begin, end, _) in &dwarf {
            self.u64(*begin);
            self.u64(*end);
        }
        self.align();
        for chain in chain_of_range {
            self.u32(chain);
        }
        self.align();
        let mut start = 0u32;
        self.u32(0);
        for chain in &chain_list {
            start += chain.len() as u32;
            self.u32(start);
        }
        self.align();
        for chain in &chain_list {
            for &name in *chain {
                self.u32(name);
            }
        }
        self.align();
        for (begin, end, _) in &symbols {
            self.u64(*begin);
            self.u64(*end);
        }
        self.align();
        for (_, _, name) in &symbols {
            self.u32(*name);
        }
        self.align();
        let mut start = 0u32;
        self.u32(0);
        for name in &names.list {
            start += name.len() as u32;
            self.u32(start);
        }
        self.align();
        for name in &names.list {
            self.bytes.extend_from_slice(name.as_bytes());
        }
        Some(self.bytes)
    }
}
