//! The stubs of a module's procedure linkage table, as functions named `symbol@plt`.
//!
//! A call from one module into another goes through a PLT stub: `jmp *slot(%rip)` through
//! the GOT slot the dynamic loader fills. The stubs have no symbols, so a symbolizer that
//! names an address by the nearest symbol before it calls them after whatever precedes the
//! PLT: `_init`, a zero-size symbol in `.init` (seen with libpython's stubs, where perf says
//! `PyObject_Malloc@plt`). perf and objdump name each stub after the symbol of the GOT slot
//! it jumps through; so does this, by decoding each stub's indirect jump (iced-x86) and
//! matching its slot with the JUMP_SLOT and GLOB_DAT relocations. Decoding, not counting
//! entries, because the layouts differ: lazy `.plt` entries, IBT's `.plt.sec` beside a
//! `.plt` of lazy stubs, `.plt.got` for `-z now` slots, entries of 8 or 16 bytes.

use std::collections::HashMap;

use iced_x86::{Decoder, DecoderOptions, Mnemonic, OpKind, Register};
use object::read::elf::SectionHeader;
use object::{Object, ObjectSection, ObjectSymbol, ObjectSymbolTable, RelocationTarget};

use crate::Function;

/// The sections that hold stubs.
const PLT_SECTIONS: &[&str] = &[".plt", ".plt.sec", ".plt.got"];

/// Each x86-64 PLT stub that jumps through a GOT slot with a symbol, as a function of the
/// stub's entry size named `symbol@plt`, in address order. Empty for other architectures
/// and for files whose PLT is not in the file (a separate debug file's `.plt` is NOBITS).
pub fn plt_stubs(elf: &object::File) -> Vec<Function> {
    let object::File::Elf64(elf64) = elf else {
        return Vec::new();
    };
    if elf.architecture() != object::Architecture::X86_64 {
        return Vec::new();
    }
    let slots = slot_symbols(elf);
    if slots.is_empty() {
        return Vec::new();
    }
    let mut stubs = Vec::new();
    for name in PLT_SECTIONS {
        let Some(section) = elf64.section_by_name(name) else {
            continue;
        };
        let Ok(code) = section.data() else {
            continue;
        };
        // Entries are `sh_entsize` bytes, else 16 (every x86-64 layout but `.plt.got`
        // without IBT, which says 8).
        let entry_size = match section.elf_section_header().sh_entsize(elf64.endian()) {
            0 => 16,
            size => size,
        };
        let start = section.address();
        let mut decoder = Decoder::with_ip(64, code, start, DecoderOptions::NONE);
        for instruction in &mut decoder {
            if instruction.mnemonic() != Mnemonic::Jmp
                || instruction.op0_kind() != OpKind::Memory
                || instruction.memory_base() != Register::RIP
            {
                continue;
            }
            let Some(symbol) = slots.get(&instruction.memory_displacement64()) else {
                continue;
            };
            let entry = start + (instruction.ip() - start) / entry_size * entry_size;
            if stubs.last().is_some_and(|s: &Function| s.address == entry) {
                continue;
            }
            stubs.push(Function {
                name: format!("{symbol}@plt"),
                address: entry,
                size: entry_size,
            });
        }
    }
    stubs.sort_by_key(|s| s.address);
    stubs
}

/// GOT slot address -> the name of the symbol the loader puts there (version suffix
/// dropped, as perf prints it).
fn slot_symbols(elf: &object::File) -> HashMap<u64, String> {
    let mut slots = HashMap::new();
    let (Some(symbols), Some(relocations)) =
        (elf.dynamic_symbol_table(), elf.dynamic_relocations())
    else {
        return slots;
    };
    for (slot, relocation) in relocations {
        let object::RelocationFlags::Elf { r_type } = relocation.flags() else {
            continue;
        };
        if r_type != object::elf::R_X86_64_JUMP_SLOT && r_type != object::elf::R_X86_64_GLOB_DAT {
            continue;
        }
        let RelocationTarget::Symbol(index) = relocation.target() else {
            continue;
        };
        let Some(name) = symbols
            .symbol_by_index(index)
            .ok()
            .and_then(|s| s.name().ok().map(str::to_string))
        else {
            continue;
        };
        let name = name.split('@').next().unwrap_or_default();
        if !name.is_empty() {
            slots.insert(slot, name.to_string());
        }
    }
    slots
}
