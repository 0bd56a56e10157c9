//! Instrumentation, first part: which functions of an ELF binary can be patched safely,
//! and if not, why. (The trampolines, the PLT/GOT hooks and the probe runtime build on
//! this.)
//!
//! The patch replaces the first instructions of a function with a 5-byte `jmp rel32` to
//! a trampoline (after `endbr64`, which must stay first where CET is on). That is safe
//! only when:
//! - the function is at least as long as the patch;
//! - no branch inside the function lands strictly inside the replaced bytes (it would
//!   land in the middle of the new jump);
//! - every replaced instruction can be re-encoded at the trampoline's address (iced-x86's
//!   BlockEncoder widens short branches and re-targets rip-relative operands; it refuses
//!   what it cannot move).
//!
//! Functions that fail a check are listed with the reason, never half-patched.
//!
//! AArch64 has its own module, [`aarch64`]: one `B` (or a register-indirect sequence)
//! after any landing pad, with the PC-relative instructions re-encoded.

use iced_x86::{
    BlockEncoder, BlockEncoderOptions, Code, Decoder, DecoderOptions, FlowControl, Instruction,
    InstructionBlock,
};
use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};

pub mod aarch64;
pub mod aarch64_call;
pub mod call_trampoline;
pub mod plt;
pub mod return_sites;
pub mod stack_args;
pub mod trampoline;

pub use plt::plt_stubs;

/// Bytes of the entry patch: `jmp rel32`.
pub const PATCH_LEN: u64 = 5;

/// A function symbol of the binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Function {
    pub name: String,
    pub address: u64,
    pub size: u64,
}

/// Why a function is not patched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// Shorter than the jump that would replace its first bytes.
    TooShort { size: u64 },
    /// AArch64: shorter than the patch of the reach needed (from the entry, a landing
    /// pad included).
    TooShortFor { size: u64, needed: u64 },
    /// A branch at `from` lands inside the bytes the patch replaces.
    JumpIntoPatch { from: u64, to: u64 },
    /// An instruction among the replaced ones cannot be moved.
    Unrelocatable { at: u64, instruction: String },
    /// The bytes do not decode as x86-64 code.
    Undecodable { at: u64 },
    /// Go: a jump through a register (a jump table), whose targets glass does not know.
    IndirectJump { at: u64 },
    /// Go: a jump out of the function (a tail call), an exit no return probe sees.
    TailCall { at: u64, to: u64 },
    /// Go: an instruction the patch would displace could fault, and Go panics only at
    /// pcs of its own code.
    MayFault { at: u64, instruction: String },
    /// Go: a return that no patch can reach.
    ReturnSite { at: u64, why: &'static str },
}

impl Reason {
    /// The kind, without the detail: stable names summaries group by.
    pub fn kind(&self) -> &'static str {
        match self {
            Reason::TooShort { .. } | Reason::TooShortFor { .. } => "too short",
            Reason::JumpIntoPatch { .. } => "a branch lands inside the patched bytes",
            Reason::Unrelocatable { .. } => "cannot relocate",
            Reason::Undecodable { .. } => "undecodable bytes",
            Reason::IndirectJump { .. } => "a jump table",
            Reason::TailCall { .. } => "a tail call",
            Reason::MayFault { .. } => "a displaced instruction could fault",
            Reason::ReturnSite { .. } => "a return that cannot be patched",
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reason::TooShort { size } => {
                write!(f, "too short ({size} bytes, the patch needs {PATCH_LEN})")
            }
            Reason::TooShortFor { size, needed } => {
                write!(f, "too short ({size} bytes, the patch needs {needed})")
            }
            Reason::JumpIntoPatch { from, to } => {
                write!(
                    f,
                    "a branch lands inside the patched bytes (from {from:#x} to {to:#x})"
                )
            }
            Reason::Unrelocatable { at, instruction } => {
                write!(f, "cannot relocate `{instruction}` at {at:#x}")
            }
            Reason::Undecodable { at } => write!(f, "undecodable bytes at {at:#x}"),
            Reason::IndirectJump { at } => write!(
                f,
                "a jump through a register at {at:#x} (a jump table), whose targets glass does not know"
            ),
            Reason::TailCall { at, to } => write!(
                f,
                "leaves by a jump at {at:#x} to {to:#x}, which no return probe sees"
            ),
            Reason::MayFault { at, instruction } => write!(
                f,
                "`{instruction}` at {at:#x} could fault where the patch would move it (Go panics only at its own pcs)"
            ),
            Reason::ReturnSite { at, why } => {
                write!(f, "the return at {at:#x} cannot be patched: {why}")
            }
        }
    }
}

/// A function that can be patched: where the jump goes and what it displaces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Address of the jump (the entry, or just after `endbr64`).
    pub patch_at: u64,
    /// Bytes displaced (whole instructions, at least [`PATCH_LEN`]).
    pub displaced: u64,
    /// The displaced instructions, re-encoded for a trampoline at the address the
    /// analysis tried (a real trampoline re-encodes at its own address).
    pub relocated_len: usize,
    /// Bytes the patch overwrites from `patch_at`: `displaced`, or more when a function
    /// shorter than the jump borrows the alignment padding after it.
    pub overwritten: u64,
    /// The displaced instructions, as decoded at their original addresses.
    pub instructions: Vec<Instruction>,
}

/// The functions of a binary: symbols with a size from `.symtab` (or `.dynsym`), and,
/// for code no symbol covers (a stripped binary's local functions), the address ranges
/// of the `.eh_frame` FDEs, named `sub_<address>`.
pub fn functions(elf: &object::File) -> Vec<Function> {
    let mut found = symbol_functions(elf);
    let covered = |address: u64, found: &[Function]| {
        let index = found.partition_point(|f| f.address <= address);
        index > 0 && address < found[index - 1].address + found[index - 1].size.max(1)
    };
    let extra: Vec<Function> = fde_ranges(elf)
        .into_iter()
        .filter(|&(address, _)| !covered(address, &found))
        .map(|(address, size)| Function {
            name: fde_function_name(address),
            address,
            size,
        })
        .collect();
    found.extend(extra);
    found.sort_by(|a, b| a.address.cmp(&b.address).then(a.name.cmp(&b.name)));
    found.dedup_by_key(|f| f.address);
    found
}

/// The name of a function only an FDE tells of, starting at file address `address`:
/// glass trace's `-f` and glass report (glass-symbols) both use it.
pub fn fde_function_name(address: u64) -> String {
    format!("sub_{address:x}")
}

/// (start, length) of every FDE in `.eh_frame`: the compiler emits one per function.
pub fn fde_ranges(elf: &object::File) -> Vec<(u64, u64)> {
    use gimli::UnwindSection;
    let Some(section) = elf.section_by_name(".eh_frame") else {
        return Vec::new();
    };
    let Ok(data) = section.data() else {
        return Vec::new();
    };
    let eh_frame = gimli::EhFrame::new(data, gimli::LittleEndian);
    let mut bases = gimli::BaseAddresses::default().set_eh_frame(section.address());
    if let Some(text) = elf.section_by_name(".text") {
        bases = bases.set_text(text.address());
    }
    let mut ranges = Vec::new();
    let mut entries = eh_frame.entries(&bases);
    while let Ok(Some(entry)) = entries.next() {
        if let gimli::CieOrFde::Fde(partial) = entry {
            if let Ok(fde) = partial.parse(gimli::EhFrame::cie_from_offset) {
                if fde.len() > 0 {
                    ranges.push((fde.initial_address(), fde.len()));
                }
            }
        }
    }
    ranges
}

/// Start addresses of code that has its own FDE but is not entered by a call: at its
/// first instruction the frame is not a fresh call frame (CFA ≠ rsp+8; on AArch64,
/// whose calls push nothing, CFA ≠ sp), as in the cold
/// parts compilers split off a function (`foo.cold`), which the hot part enters by a jump
/// with its own frame still on the stack. The entry probe would take a word of that
/// frame for a return address.
pub fn not_call_entries(elf: &object::File) -> std::collections::HashSet<u64> {
    use gimli::UnwindSection;
    let mut found = std::collections::HashSet::new();
    let Some(section) = elf.section_by_name(".eh_frame") else {
        return found;
    };
    let Ok(data) = section.data() else {
        return found;
    };
    let eh_frame = gimli::EhFrame::new(data, gimli::LittleEndian);
    let mut bases = gimli::BaseAddresses::default().set_eh_frame(section.address());
    if let Some(text) = elf.section_by_name(".text") {
        bases = bases.set_text(text.address());
    }
    let mut context = Box::new(gimli::UnwindContext::new());
    let mut entries = eh_frame.entries(&bases);
    while let Ok(Some(entry)) = entries.next() {
        let gimli::CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let Ok(fde) = partial.parse(gimli::EhFrame::cie_from_offset) else {
            continue;
        };
        let start = fde.initial_address();
        let Ok(row) = fde.unwind_info_for_address(&eh_frame, &bases, &mut context, start) else {
            continue;
        };
        let (stack_pointer, pushed) = match elf.architecture() {
            object::Architecture::Aarch64 => (gimli::AArch64::SP, 0),
            _ => (gimli::X86_64::RSP, 8),
        };
        let fresh = matches!(
            row.cfa(),
            gimli::CfaRule::RegisterAndOffset { register, offset } if *register == stack_pointer && *offset == pushed
        );
        if !fresh {
            found.insert(start);
        }
    }
    found
}

/// AArch64: where each function with CFI keeps its return address once its prologue has
/// run, by the start of its FDE: the words below its CFA (its entry stack pointer) of
/// x30's first save. Functions that never save x30 (leaves) are absent. The probe
/// runtime's C++ exception hooks put the real return address back there
/// (glass_probe_abi::LR_SAVE_SHIFT).
pub fn lr_save_words(elf: &object::File) -> std::collections::HashMap<u64, u64> {
    use gimli::UnwindSection;
    let mut found = std::collections::HashMap::new();
    let Some(section) = elf.section_by_name(".eh_frame") else {
        return found;
    };
    let Ok(data) = section.data() else {
        return found;
    };
    let eh_frame = gimli::EhFrame::new(data, gimli::LittleEndian);
    let mut bases = gimli::BaseAddresses::default().set_eh_frame(section.address());
    if let Some(text) = elf.section_by_name(".text") {
        bases = bases.set_text(text.address());
    }
    let mut context = Box::new(gimli::UnwindContext::new());
    let mut entries = eh_frame.entries(&bases);
    while let Ok(Some(entry)) = entries.next() {
        let gimli::CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let Ok(fde) = partial.parse(gimli::EhFrame::cie_from_offset) else {
            continue;
        };
        let Ok(mut rows) = fde.rows(&eh_frame, &bases, &mut context) else {
            continue;
        };
        while let Ok(Some(row)) = rows.next_row() {
            if let Some(gimli::RegisterRule::Offset(offset)) = row.register(gimli::AArch64::X30) {
                if offset < 0 && offset % 8 == 0 {
                    found.insert(fde.initial_address(), (-offset / 8) as u64);
                }
                break;
            }
        }
    }
    found
}

/// Function symbols with a size, from `.symtab` (or `.dynsym` for a stripped binary).
fn symbol_functions(elf: &object::File) -> Vec<Function> {
    let collect =
        |symbols: &mut dyn Iterator<Item = object::Symbol<'_, '_>>| -> Vec<(AliasRank, Function)> {
            symbols
                .filter(|s| s.kind() == SymbolKind::Text && s.is_definition() && s.address() != 0)
                .filter_map(|s| {
                    let function = Function {
                        name: s.name().ok()?.to_string(),
                        address: s.address(),
                        size: s.size(),
                    };
                    Some((alias_rank(&s, &function.name), function))
                })
                .collect()
        };
    let mut found = collect(&mut elf.symbols());
    if found.is_empty() {
        found = collect(&mut elf.dynamic_symbols());
    }
    found.sort_by(|(a_rank, a), (b_rank, b)| {
        a.address
            .cmp(&b.address)
            .then(a_rank.cmp(b_rank))
            .then(a.name.cmp(&b.name))
    });
    found.dedup_by_key(|(_, f)| f.address);
    found.into_iter().map(|(_, f)| f).collect()
}

/// Which of a function's names it is called by, smallest first, as perf chooses: a sized
/// symbol, a strong one, a global one, then the name with fewer leading underscores, then
/// the shorter (`malloc`, not `__libc_malloc`).
type AliasRank = (bool, bool, bool, usize, usize);

fn alias_rank(symbol: &object::Symbol<'_, '_>, name: &str) -> AliasRank {
    (
        symbol.size() == 0,
        symbol.is_weak(),
        !symbol.is_global(),
        name.len() - name.trim_start_matches('_').len(),
        name.len(),
    )
}

/// Every name of each function address, from `.symtab` and `.dynsym` both: a C library
/// exports one function under several names (`malloc` and `__libc_malloc`, `puts` and
/// `_IO_puts`), and [`functions`] keeps one of them.
pub fn function_aliases(elf: &object::File) -> std::collections::HashMap<u64, Vec<String>> {
    let mut aliases: std::collections::HashMap<u64, Vec<String>> = Default::default();
    for symbol in elf.symbols().chain(elf.dynamic_symbols()) {
        if symbol.kind() != SymbolKind::Text || !symbol.is_definition() || symbol.address() == 0 {
            continue;
        }
        let Ok(name) = symbol.name() else { continue };
        let names = aliases.entry(symbol.address()).or_default();
        if !names.iter().any(|n| n == name) {
            names.push(name.to_string());
        }
    }
    aliases
}

/// The bytes of a function, from the section that holds it.
pub fn function_bytes<'a>(elf: &'a object::File, function: &Function) -> Option<&'a [u8]> {
    let section = elf.sections().find(|s| {
        function.address >= s.address()
            && function.address + function.size <= s.address() + s.size()
    })?;
    let data = section.data().ok()?;
    let start = (function.address - section.address()) as usize;
    data.get(start..start + function.size as usize)
}

/// Decides whether `code` (the function's bytes, at `address`) can take the entry patch.
/// A call that pushes a return address. iced-x86 classes `syscall` and `sysenter` as
/// calls too, but they come back to the next instruction as any other instruction does:
/// displaced, they are copied as they are and followed by the jump back.
pub(crate) fn pushes_return_address(instruction: &Instruction) -> bool {
    matches!(
        instruction.flow_control(),
        FlowControl::Call | FlowControl::IndirectCall
    ) && !matches!(
        instruction.mnemonic(),
        iced_x86::Mnemonic::Syscall | iced_x86::Mnemonic::Sysenter
    )
}

pub fn analyze(code: &[u8], address: u64) -> Result<Plan, Reason> {
    analyze_with_padding(code, address, &[])
}

/// Like [`analyze`], where `padding` are the bytes between the function's end and the
/// next function: a function shorter than the jump may borrow them when they are only
/// filler (nop, int3) and the function cannot run into them (its last instruction is a
/// `ret` or `jmp`), since then no symbol covers them and no code reaches them.
pub fn analyze_with_padding(code: &[u8], address: u64, padding: &[u8]) -> Result<Plan, Reason> {
    analyze_inner(code, address, padding, false)
}

/// [`analyze_with_padding`]; `to_start_too`: a branch may land on the patch's first
/// byte, as Go's stack-growth path does (see [`return_sites`]): the exit probe that hijacks
/// returns must not allow it, since the entry would then take its own slot again.
pub(crate) fn analyze_inner(
    code: &[u8],
    address: u64,
    padding: &[u8],
    to_start_too: bool,
) -> Result<Plan, Reason> {
    let instructions = decode_all(code, address)?;
    let patch_at = match instructions.first() {
        Some(first) if first.code() == Code::Endbr64 => first.next_ip(),
        _ => address,
    };
    let end = address + code.len() as u64;
    let mut overwritten_end = 0;
    if end < patch_at + PATCH_LEN {
        let too_short = Reason::TooShort {
            size: code.len() as u64,
        };
        let ends_in_jump = instructions.last().is_some_and(|last| {
            last.next_ip() == end
                && matches!(
                    last.flow_control(),
                    FlowControl::Return | FlowControl::UnconditionalBranch
                )
        });
        let needed = (patch_at + PATCH_LEN - end) as usize;
        if !ends_in_jump || padding.len() < needed || !is_filler(padding, end) {
            return Err(too_short);
        }
        overwritten_end = patch_at + PATCH_LEN;
    }
    // Whole instructions covering the patch.
    let displaced: Vec<Instruction> = instructions
        .iter()
        .filter(|i| i.ip() >= patch_at)
        .scan(patch_at, |covered, i| {
            if *covered >= patch_at + PATCH_LEN {
                None
            } else {
                *covered = i.next_ip();
                Some(*i)
            }
        })
        .collect();
    let displaced_end = displaced.last().map_or(patch_at, |i| i.next_ip());
    // No branch may land strictly inside the displaced bytes.
    for instruction in &instructions {
        if matches!(
            instruction.flow_control(),
            FlowControl::UnconditionalBranch
                | FlowControl::ConditionalBranch
                | FlowControl::Call
                | FlowControl::XbeginXabortXend
        ) {
            // A branch back to the patched entry itself (a loop, or a self tail call
            // that moved the stack) would run the entry probe with the wrong slot.
            let target = instruction.near_branch_target();
            let recursive_call =
                instruction.flow_control() == FlowControl::Call && target == address;
            let to_start = to_start_too && target == patch_at;
            if target >= address && target < displaced_end && !recursive_call && !to_start {
                return Err(Reason::JumpIntoPatch {
                    from: instruction.ip(),
                    to: target,
                });
            }
        }
    }
    // The displaced instructions must re-encode elsewhere; try 1 GiB away, the far end
    // of what a trampoline placed within ±2 GiB must handle.
    let trampoline = address.wrapping_add(1 << 30);
    for instruction in &displaced {
        if matches!(
            instruction.flow_control(),
            FlowControl::Return | FlowControl::Interrupt
        ) && instruction.next_ip() < displaced_end
        {
            // Control leaves before the patch ends: what follows is reached some other way.
            return Err(Reason::Unrelocatable {
                at: instruction.ip(),
                instruction: instruction.to_string(),
            });
        }
    }
    // A displaced call pushes its return address; it must point back into the original
    // code (unwinders and the exit probe read it), so the call is emulated, which only
    // works as the last displaced instruction and without a stack-relative operand.
    for (index, instruction) in displaced.iter().enumerate() {
        if pushes_return_address(instruction) {
            let uses_stack = (0..instruction.op_count()).any(|op| {
                instruction.op_kind(op) == iced_x86::OpKind::Memory
                    && (instruction.memory_base() == iced_x86::Register::RSP
                        || instruction.memory_index() == iced_x86::Register::RSP)
            }) || instruction.op0_register() == iced_x86::Register::RSP;
            if index + 1 != displaced.len() || uses_stack {
                return Err(Reason::Unrelocatable {
                    at: instruction.ip(),
                    instruction: instruction.to_string(),
                });
            }
        }
    }
    let relocated = trampoline::relocate(&displaced, displaced_end);
    let block = InstructionBlock::new(&relocated, trampoline);
    match BlockEncoder::encode(64, block, BlockEncoderOptions::NONE) {
        Ok(encoded) => Ok(Plan {
            patch_at,
            displaced: displaced_end - patch_at,
            relocated_len: encoded.code_buffer.len(),
            overwritten: overwritten_end.max(displaced_end) - patch_at,
            instructions: displaced,
        }),
        Err(error) => Err(Reason::Unrelocatable {
            at: displaced.first().map_or(patch_at, |i| i.ip()),
            instruction: error.to_string(),
        }),
    }
}

/// Every direct branch and call target in the code of `functions` (decoded linearly,
/// function by function): a patch must not cover a byte that code elsewhere jumps to, as
/// hand-written assembly does when one routine enters another past its first bytes.
pub fn branch_targets(
    elf: &object::File,
    functions: &[Function],
) -> std::collections::BTreeSet<u64> {
    let mut targets = std::collections::BTreeSet::new();
    for function in functions {
        let Some(code) = function_bytes(elf, function) else {
            continue;
        };
        let mut decoder = Decoder::with_ip(64, code, function.address, DecoderOptions::NONE);
        let mut instruction = Instruction::default();
        while decoder.can_decode() {
            decoder.decode_out(&mut instruction);
            if matches!(
                instruction.flow_control(),
                FlowControl::UnconditionalBranch
                    | FlowControl::ConditionalBranch
                    | FlowControl::Call
            ) {
                targets.insert(instruction.near_branch_target());
            }
        }
    }
    targets
}

/// A direct branch (`call`, `jmp` or `jcc` with a 32-bit displacement) whose target can
/// be changed by rewriting its last four bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirectSite {
    /// Address of the instruction.
    pub at: u64,
    /// Its length (the displacement is its last four bytes).
    pub len: u8,
}

/// The direct branch sites in the code of `functions` whose target is one of `wanted`.
pub fn direct_sites(
    elf: &object::File,
    functions: &[Function],
    wanted: &std::collections::HashSet<u64>,
) -> std::collections::HashMap<u64, Vec<DirectSite>> {
    let mut sites: std::collections::HashMap<u64, Vec<DirectSite>> = Default::default();
    for function in functions {
        let Some(code) = function_bytes(elf, function) else {
            continue;
        };
        let mut decoder = Decoder::with_ip(64, code, function.address, DecoderOptions::NONE);
        let mut instruction = Instruction::default();
        while decoder.can_decode() {
            decoder.decode_out(&mut instruction);
            let rel32 = matches!(instruction.code(), Code::Call_rel32_64 | Code::Jmp_rel32_64)
                || (instruction.flow_control() == FlowControl::ConditionalBranch
                    && instruction.len() >= 6
                    && instruction.op0_kind() == iced_x86::OpKind::NearBranch64);
            if rel32 && wanted.contains(&instruction.near_branch_target()) {
                sites
                    .entry(instruction.near_branch_target())
                    .or_default()
                    .push(DirectSite {
                        at: instruction.ip(),
                        len: instruction.len() as u8,
                    });
            }
        }
    }
    sites
}

/// The target and length of the direct branch at the start of `bytes` (at `address`).
pub fn branch_at(bytes: &[u8], address: u64) -> Option<(u64, usize)> {
    let instruction = Decoder::with_ip(64, bytes, address, DecoderOptions::NONE).decode();
    (!instruction.is_invalid() && instruction.op0_kind() == iced_x86::OpKind::NearBranch64)
        .then(|| (instruction.near_branch_target(), instruction.len()))
}

/// A plan that moves a whole (short) function into its trampoline, for a function that
/// cannot take the entry jump: its direct callers are sent to the copy instead. The code
/// must end in a `ret` or `jmp` and contain no call (the copy's return addresses would
/// point into it).
pub fn whole_function_plan(code: &[u8], address: u64) -> Result<Plan, Reason> {
    let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
    let mut instructions: Vec<Instruction> = Vec::new();
    while decoder.can_decode() {
        let instruction = decoder.decode();
        if instruction.is_invalid() {
            return Err(Reason::Undecodable {
                at: instruction.ip(),
            });
        }
        if matches!(
            instruction.flow_control(),
            FlowControl::Call | FlowControl::IndirectCall | FlowControl::Interrupt
        ) {
            return Err(Reason::Unrelocatable {
                at: instruction.ip(),
                instruction: instruction.to_string(),
            });
        }
        instructions.push(instruction);
    }
    let ends = instructions.last().is_some_and(|last| {
        matches!(
            last.flow_control(),
            FlowControl::Return | FlowControl::UnconditionalBranch | FlowControl::IndirectBranch
        )
    });
    if !ends {
        return Err(Reason::TooShort {
            size: code.len() as u64,
        });
    }
    let block = InstructionBlock::new(&instructions, address.wrapping_add(1 << 30));
    match BlockEncoder::encode(64, block, BlockEncoderOptions::NONE) {
        Ok(encoded) => Ok(Plan {
            patch_at: address,
            displaced: code.len() as u64,
            relocated_len: encoded.code_buffer.len(),
            overwritten: 0,
            instructions,
        }),
        Err(error) => Err(Reason::Unrelocatable {
            at: address,
            instruction: error.to_string(),
        }),
    }
}

/// Every instruction of `code` (at `address`), or where it stops decoding.
pub(crate) fn decode_all(code: &[u8], address: u64) -> Result<Vec<Instruction>, Reason> {
    let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
    let mut instructions = Vec::new();
    while decoder.can_decode() {
        let instruction = decoder.decode();
        if instruction.is_invalid() {
            return Err(Reason::Undecodable {
                at: instruction.ip(),
            });
        }
        instructions.push(instruction);
    }
    Ok(instructions)
}

/// Whether `bytes` (at `address`) are only alignment filler: int3 or nops.
pub(crate) fn is_filler(bytes: &[u8], address: u64) -> bool {
    let mut decoder = Decoder::with_ip(64, bytes, address, DecoderOptions::NONE);
    while decoder.can_decode() {
        let instruction = decoder.decode();
        if instruction.is_invalid()
            || !matches!(
                instruction.mnemonic(),
                iced_x86::Mnemonic::Nop | iced_x86::Mnemonic::Int3
            )
        {
            return false;
        }
    }
    true
}

/// Shell-style glob: `*` any run, `?` one character.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    fn matches(p: &[u8], n: &[u8]) -> bool {
        match (p.first(), n.first()) {
            (None, None) => true,
            (Some(b'*'), _) => matches(&p[1..], n) || (!n.is_empty() && matches(p, &n[1..])),
            (Some(b'?'), Some(_)) => matches(&p[1..], &n[1..]),
            (Some(a), Some(b)) if a == b => matches(&p[1..], &n[1..]),
            _ => false,
        }
    }
    matches(pattern.as_bytes(), name.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match("parse_*", "parse_header"));
        assert!(glob_match("*", "anything"));
        assert!(glob_match("cl?ssify", "classify"));
        assert!(!glob_match("parse_*", "reparse_x"));
    }

    #[test]
    fn short_functions_and_jumps_into_the_patch() {
        // lea rax, [rdi+3]; ret — exactly 5 bytes: the whole function moves.
        assert_eq!(
            analyze(&[0x48, 0x8d, 0x47, 0x03, 0xc3], 0x1000)
                .unwrap()
                .displaced,
            5
        );
        // ret; then code reached from elsewhere: control leaves inside the patch.
        assert!(matches!(
            analyze(&[0xc3, 0x90, 0x90, 0x90, 0x90, 0xc3], 0x1000),
            Err(Reason::Unrelocatable { .. })
        ));
        // lea eax, [rdi+3]; ret — 4 bytes.
        assert_eq!(
            analyze(&[0x8d, 0x47, 0x03, 0xc3], 0x1000),
            Err(Reason::TooShort { size: 4 })
        );
        // nop; nop; dec edi; jnz -4 (to 0x1002); ret
        let code = [0x90, 0x90, 0xff, 0xcf, 0x75, 0xfc, 0xc3];
        assert_eq!(
            analyze(&code, 0x1000),
            Err(Reason::JumpIntoPatch {
                from: 0x1004,
                to: 0x1002
            })
        );
    }

    #[test]
    fn rip_relative_and_endbr64_prologues_are_patchable() {
        // endbr64; push rbp; mov rax, [rip+0x100]; pop rbp; ret
        let code = [
            0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0x48, 0x8b, 0x05, 0x00, 0x01, 0x00, 0x00, 0x5d, 0xc3,
        ];
        let plan = analyze(&code, 0x40_1000).unwrap();
        assert_eq!(plan.patch_at, 0x40_1004);
        assert_eq!(plan.displaced, 8); // push rbp (1) + mov rax, [rip+..] (7)
                                       // A short conditional jump in the displaced bytes is widened, not refused.
                                       // test edi, edi; je +2; xor eax, eax; ret; mov eax, 1; ret
        let code = [
            0x85, 0xff, 0x74, 0x03, 0x31, 0xc0, 0xc3, 0xb8, 0x01, 0x00, 0x00, 0x00, 0xc3,
        ];
        let plan = analyze(&code, 0x40_2000).unwrap();
        assert!(plan.relocated_len > plan.displaced as usize);
    }
}
