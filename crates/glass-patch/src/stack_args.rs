//! Which functions take every argument in registers, read from DWARF.
//!
//! The [call-style trampoline](crate::call_trampoline) puts its own return address and
//! 8 bytes of padding between a function and its caller's frame: a function that reads
//! arguments from the stack would read them 16 bytes off. Under the System V x86-64
//! calling convention the first six integer-class arguments go in registers and the first
//! eight SSE-class ones in xmm registers; what does not fit, aggregates over 16 bytes,
//! `long double` and the arguments of a variadic function go on the stack. This reads
//! each subprogram's parameters (from its abstract instance when its own DIE lists none)
//! and classifies them the way the convention does, erring to "on the stack" wherever the
//! DWARF leaves room for doubt (a type it does not describe, a reference into another
//! unit). A function DWARF does not describe is not in the map: the caller says why it is
//! left alone. So must a compiler's clone whose signature it changed (`.isra`, `.part`):
//! DWARF describes the arguments of the function it was cloned from. gimli reads the DWARF; the classification is the convention's, written
//! here because no crate offers it.

use std::borrow::Cow;
use std::collections::HashMap;

use gimli::{AttributeValue, Reader, UnitOffset};
use object::{Object, ObjectSection};

/// How a function's arguments reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Arguments {
    /// Every argument (and a hidden pointer for a large return value) in registers.
    InRegisters,
    /// Some may be on the stack, and why.
    OnStack(String),
}

/// Integer registers for arguments (rdi, rsi, rdx, rcx, r8, r9) and SSE ones (xmm0-7).
const INTEGER_REGISTERS: u32 = 6;
const SSE_REGISTERS: u32 = 8;

/// Each function the DWARF of `elf` describes, by its entry address, with how its
/// arguments reach it. Empty when the file has no DWARF.
pub fn argument_passing(elf: &object::File) -> HashMap<u64, Arguments> {
    let mut found = HashMap::new();
    let endian = if elf.is_little_endian() {
        gimli::RunTimeEndian::Little
    } else {
        gimli::RunTimeEndian::Big
    };
    let load = |id: gimli::SectionId| -> Result<Cow<[u8]>, ()> {
        Ok(match elf.section_by_name(id.name()) {
            Some(section) => section.uncompressed_data().map_err(|_| ())?,
            None => Cow::Borrowed(&[][..]),
        })
    };
    let Ok(sections) = gimli::DwarfSections::load(load) else {
        return found;
    };
    let dwarf = sections.borrow(|section| gimli::EndianSlice::new(section, endian));
    let mut units = dwarf.units();
    while let Ok(Some(header)) = units.next() {
        let Ok(unit) = dwarf.unit(header) else {
            continue;
        };
        let mut entries = unit.entries();
        while let Ok(Some(entry)) = entries.next_dfs() {
            if entry.tag() != gimli::DW_TAG_subprogram {
                continue;
            }
            let Some(low_pc) = entry
                .attr_value(gimli::DW_AT_low_pc)
                .and_then(|value| dwarf.attr_address(&unit, value).ok().flatten())
            else {
                continue;
            };
            if low_pc == 0 {
                continue;
            }
            let verdict = match classify(&unit, entry.offset()) {
                Ok(()) => Arguments::InRegisters,
                Err(why) => Arguments::OnStack(why),
            };
            found.insert(low_pc, verdict);
        }
    }
    found
}

type Unit<'a> = gimli::Unit<gimli::EndianSlice<'a, gimli::RunTimeEndian>>;
type Offset = UnitOffset<usize>;

/// Registers the arguments take so far.
#[derive(Default)]
struct Count {
    integer: u32,
    sse: u32,
}

/// Ok when every argument of the subprogram at `offset` is passed in registers.
fn classify(unit: &Unit, offset: Offset) -> Result<(), String> {
    let entry = unit.entry(offset).map_err(|e| e.to_string())?;
    let origin = origin_of(&entry)?;
    let (mut parameters, mut variadic) = parameters(unit, offset)?;
    if parameters.is_empty() && !variadic {
        if let Some(origin) = origin {
            (parameters, variadic) = parameters_of_origin(unit, origin)?;
        }
    }
    if variadic {
        return Err("variadic: its variable arguments may be on the stack".into());
    }
    let mut count = Count::default();
    // A return value in memory: its address comes as a hidden first argument.
    let returns = match entry.attr_value(gimli::DW_AT_type) {
        Some(value) => Some(type_offset(value)?),
        None => match origin {
            Some(origin) => unit
                .entry(origin)
                .map_err(|e| e.to_string())?
                .attr_value(gimli::DW_AT_type)
                .map(type_offset)
                .transpose()?,
            None => None,
        },
    };
    if let Some(returns) = returns {
        if let Class::Memory(_) = class(unit, returns, 0)? {
            count.integer += 1;
        }
    }
    for (index, parameter) in parameters.into_iter().enumerate() {
        match class(unit, parameter, 0)? {
            Class::Registers { integer, sse } => {
                count.integer += integer;
                count.sse += sse;
            }
            Class::Memory(why) => {
                return Err(format!(
                    "argument {} is passed on the stack: {why}",
                    index + 1
                ))
            }
        }
    }
    if count.integer > INTEGER_REGISTERS {
        return Err(format!(
            "{} integer arguments: those after the sixth are on the stack",
            count.integer
        ));
    }
    if count.sse > SSE_REGISTERS {
        return Err(format!(
            "{} floating-point arguments: those after the eighth are on the stack",
            count.sse
        ));
    }
    Ok(())
}

/// The DIE this one completes (an out-of-line instance's abstract origin, a
/// definition's declaration), if any.
fn origin_of(
    entry: &gimli::DebuggingInformationEntry<gimli::EndianSlice<'_, gimli::RunTimeEndian>>,
) -> Result<Option<Offset>, String> {
    for name in [gimli::DW_AT_abstract_origin, gimli::DW_AT_specification] {
        match entry.attr_value(name) {
            Some(AttributeValue::UnitRef(offset)) => return Ok(Some(offset)),
            Some(_) => return Err("its declaration is in another unit".into()),
            None => {}
        }
    }
    Ok(None)
}

/// The types of the formal parameters among the children of the DIE at `offset`, and
/// whether it is variadic. A parameter without a type takes its origin's.
fn parameters(unit: &Unit, offset: Offset) -> Result<(Vec<Offset>, bool), String> {
    let mut tree = unit.entries_tree(Some(offset)).map_err(|e| e.to_string())?;
    let root = tree.root().map_err(|e| e.to_string())?;
    let mut children = root.children();
    let mut types = Vec::new();
    let mut variadic = false;
    while let Some(child) = children.next().map_err(|e| e.to_string())? {
        let entry = child.entry();
        match entry.tag() {
            gimli::DW_TAG_formal_parameter => {
                let value = match entry.attr_value(gimli::DW_AT_type) {
                    Some(value) => value,
                    None => {
                        let origin = origin_of(entry)?.ok_or("a parameter without a type")?;
                        unit.entry(origin)
                            .map_err(|e| e.to_string())?
                            .attr_value(gimli::DW_AT_type)
                            .ok_or("a parameter without a type")?
                    }
                };
                types.push(type_offset(value)?);
            }
            gimli::DW_TAG_unspecified_parameters => variadic = true,
            _ => {}
        }
    }
    Ok((types, variadic))
}

/// The parameters of the abstract instance or declaration at `origin`, following its own
/// origin (a declaration's) once more if it lists none.
fn parameters_of_origin(unit: &Unit, origin: Offset) -> Result<(Vec<Offset>, bool), String> {
    let found = parameters(unit, origin)?;
    if !found.0.is_empty() || found.1 {
        return Ok(found);
    }
    let entry = unit.entry(origin).map_err(|e| e.to_string())?;
    match origin_of(&entry)? {
        Some(next) => parameters(unit, next),
        None => Ok(found),
    }
}

fn type_offset<R: Reader<Offset = usize>>(value: AttributeValue<R>) -> Result<Offset, String> {
    match value {
        AttributeValue::UnitRef(offset) => Ok(offset),
        _ => Err("a type in another unit".into()),
    }
}

/// Where the convention passes a value of a type.
enum Class {
    Registers { integer: u32, sse: u32 },
    Memory(String),
}

/// Types nest (typedef of const of typedef…); deeper than this is taken as a cycle.
const MAX_TYPE_DEPTH: u32 = 32;

fn class(unit: &Unit, offset: Offset, depth: u32) -> Result<Class, String> {
    if depth > MAX_TYPE_DEPTH {
        return Err("a type nested too deep".into());
    }
    let (offset, size) = unqualified(unit, offset, depth)?;
    let entry = unit.entry(offset).map_err(|e| e.to_string())?;
    let integer = |n| Ok(Class::Registers { integer: n, sse: 0 });
    match entry.tag() {
        gimli::DW_TAG_pointer_type
        | gimli::DW_TAG_reference_type
        | gimli::DW_TAG_rvalue_reference_type
        | gimli::DW_TAG_enumeration_type => integer(1),
        gimli::DW_TAG_ptr_to_member_type => integer(if size == Some(16) { 2 } else { 1 }),
        gimli::DW_TAG_base_type => {
            let encoding = match entry.attr_value(gimli::DW_AT_encoding) {
                Some(AttributeValue::Encoding(encoding)) => encoding,
                _ => return Err("a base type without an encoding".into()),
            };
            let size = size.ok_or("a base type without a size")?;
            match (encoding, size) {
                (gimli::DW_ATE_float, 4 | 8) => Ok(Class::Registers { integer: 0, sse: 1 }),
                (gimli::DW_ATE_complex_float, 8) => Ok(Class::Registers { integer: 0, sse: 1 }),
                (gimli::DW_ATE_complex_float, 16) => Ok(Class::Registers { integer: 0, sse: 2 }),
                (gimli::DW_ATE_float | gimli::DW_ATE_complex_float, _) => {
                    Ok(Class::Memory("long double".into()))
                }
                (_, 1..=8) => integer(1),
                (_, 16) => integer(2),
                _ => Err(format!("a base type of {size} bytes")),
            }
        }
        gimli::DW_TAG_structure_type | gimli::DW_TAG_union_type | gimli::DW_TAG_class_type => {
            // C++ types that are not trivially copyable go by invisible reference.
            if let Some(AttributeValue::CallingConvention(gimli::DW_CC_pass_by_reference)) =
                entry.attr_value(gimli::DW_AT_calling_convention)
            {
                return integer(1);
            }
            match size {
                Some(size) if size > 16 => {
                    Ok(Class::Memory(format!("an aggregate of {size} bytes")))
                }
                Some(size) => match memory_member(unit, offset, depth)? {
                    Some(why) => Ok(Class::Memory(why)),
                    // Up to two eightbytes, in integer or SSE registers: counted as
                    // integer ones, which only ever overstates what those hold.
                    None => integer(size.div_ceil(8).max(1) as u32),
                },
                None => Err("an aggregate without a size".into()),
            }
        }
        tag => Err(format!("a type DWARF describes as {tag}")),
    }
}

/// Why a small aggregate still goes in memory, if it does: a `long double` in it (x87
/// class), or a field not at a multiple of its own size (up to 8), which the convention
/// calls unaligned.
fn memory_member(unit: &Unit, offset: Offset, depth: u32) -> Result<Option<String>, String> {
    if depth > MAX_TYPE_DEPTH {
        return Err("a type nested too deep".into());
    }
    let mut tree = unit.entries_tree(Some(offset)).map_err(|e| e.to_string())?;
    let root = tree.root().map_err(|e| e.to_string())?;
    let mut children = root.children();
    while let Some(child) = children.next().map_err(|e| e.to_string())? {
        let entry = child.entry();
        if entry.tag() != gimli::DW_TAG_member {
            continue;
        }
        let Some(value) = entry.attr_value(gimli::DW_AT_type) else {
            return Err("a field without a type".into());
        };
        let (field, size) = unqualified(unit, type_offset(value)?, depth)?;
        let field_entry = unit.entry(field).map_err(|e| e.to_string())?;
        match field_entry.tag() {
            gimli::DW_TAG_base_type => {
                if let Some(AttributeValue::Encoding(gimli::DW_ATE_float)) =
                    field_entry.attr_value(gimli::DW_AT_encoding)
                {
                    if size == Some(16) {
                        return Ok(Some("an aggregate holding a long double".into()));
                    }
                }
            }
            gimli::DW_TAG_structure_type
            | gimli::DW_TAG_union_type
            | gimli::DW_TAG_class_type
            | gimli::DW_TAG_array_type => {
                if let Some(why) = memory_member(unit, field, depth + 1)? {
                    return Ok(Some(why));
                }
                if field_entry.tag() == gimli::DW_TAG_array_type {
                    // An array's element decides: look through it.
                    if let Some(element) = field_entry.attr_value(gimli::DW_AT_type) {
                        let (element, _) = unqualified(unit, type_offset(element)?, depth)?;
                        let element_entry = unit.entry(element).map_err(|e| e.to_string())?;
                        if let Some(AttributeValue::Encoding(gimli::DW_ATE_float)) =
                            element_entry.attr_value(gimli::DW_AT_encoding)
                        {
                            let bytes = element_entry
                                .attr_value(gimli::DW_AT_byte_size)
                                .and_then(|v| v.udata_value());
                            if bytes == Some(16) {
                                return Ok(Some("an aggregate holding a long double".into()));
                            }
                        }
                    }
                }
            }
            _ => {}
        }
        // Bit fields sit in storage of their own type's alignment: only whole fields
        // can be misplaced.
        if entry.attr(gimli::DW_AT_data_bit_offset).is_some()
            || entry.attr(gimli::DW_AT_bit_size).is_some()
        {
            continue;
        }
        let at = entry
            .attr_value(gimli::DW_AT_data_member_location)
            .and_then(|v| v.udata_value())
            .unwrap_or(0);
        let alignment = size.unwrap_or(1).clamp(1, 8);
        let scalar = field_entry.tag() == gimli::DW_TAG_base_type
            || field_entry.tag() == gimli::DW_TAG_pointer_type;
        if scalar && at % alignment != 0 {
            return Ok(Some("an aggregate with an unaligned field".into()));
        }
    }
    Ok(None)
}

/// The type behind typedefs and qualifiers, and its size.
fn unqualified(
    unit: &Unit,
    mut offset: Offset,
    depth: u32,
) -> Result<(Offset, Option<u64>), String> {
    for _ in depth..MAX_TYPE_DEPTH {
        let entry = unit.entry(offset).map_err(|e| e.to_string())?;
        match entry.tag() {
            gimli::DW_TAG_typedef
            | gimli::DW_TAG_const_type
            | gimli::DW_TAG_volatile_type
            | gimli::DW_TAG_restrict_type
            | gimli::DW_TAG_atomic_type => match entry.attr_value(gimli::DW_AT_type) {
                Some(value) => offset = type_offset(value)?,
                None => return Err("a qualified type of nothing".into()),
            },
            _ => {
                let size = entry
                    .attr_value(gimli::DW_AT_byte_size)
                    .and_then(|v| v.udata_value());
                return Ok((offset, size));
            }
        }
    }
    Err("a type nested too deep".into())
}
