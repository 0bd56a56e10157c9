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

use iced_x86::{
    BlockEncoder, BlockEncoderOptions, Code, Decoder, DecoderOptions, FlowControl, Instruction,
    InstructionBlock,
};
use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};

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
    /// A branch at `from` lands inside the bytes the patch replaces.
    JumpIntoPatch { from: u64, to: u64 },
    /// An instruction among the replaced ones cannot be moved.
    Unrelocatable { at: u64, instruction: String },
    /// The bytes do not decode as x86-64 code.
    Undecodable { at: u64 },
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reason::TooShort { size } => {
                write!(f, "too short ({size} bytes, the patch needs {PATCH_LEN})")
            }
            Reason::JumpIntoPatch { from, to } => {
                write!(
                    f,
                    "a branch at {from:#x} lands at {to:#x}, inside the patched bytes"
                )
            }
            Reason::Unrelocatable { at, instruction } => {
                write!(f, "cannot relocate `{instruction}` at {at:#x}")
            }
            Reason::Undecodable { at } => write!(f, "undecodable bytes at {at:#x}"),
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
}

/// Function symbols with a size, from `.symtab` (or `.dynsym` for a stripped binary).
pub fn functions(elf: &object::File) -> Vec<Function> {
    let collect = |symbols: &mut dyn Iterator<Item = object::Symbol<'_, '_>>| -> Vec<Function> {
        symbols
            .filter(|s| s.kind() == SymbolKind::Text && s.is_definition() && s.address() != 0)
            .filter_map(|s| {
                Some(Function {
                    name: s.name().ok()?.to_string(),
                    address: s.address(),
                    size: s.size(),
                })
            })
            .collect()
    };
    let mut found = collect(&mut elf.symbols());
    if found.is_empty() {
        found = collect(&mut elf.dynamic_symbols());
    }
    found.sort_by(|a, b| a.address.cmp(&b.address).then(a.name.cmp(&b.name)));
    found.dedup_by_key(|f| f.address);
    found
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
pub fn analyze(code: &[u8], address: u64) -> Result<Plan, Reason> {
    let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
    let mut instructions: Vec<Instruction> = Vec::new();
    while decoder.can_decode() {
        let instruction = decoder.decode();
        if instruction.is_invalid() {
            return Err(Reason::Undecodable {
                at: instruction.ip(),
            });
        }
        instructions.push(instruction);
    }
    let patch_at = match instructions.first() {
        Some(first) if first.code() == Code::Endbr64 => first.next_ip(),
        _ => address,
    };
    let end = address + code.len() as u64;
    if end < patch_at + PATCH_LEN {
        return Err(Reason::TooShort {
            size: code.len() as u64,
        });
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
            let target = instruction.near_branch_target();
            if target > patch_at && target < displaced_end {
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
    let block = InstructionBlock::new(&displaced, trampoline);
    match BlockEncoder::encode(64, block, BlockEncoderOptions::NONE) {
        Ok(encoded) => Ok(Plan {
            patch_at,
            displaced: displaced_end - patch_at,
            relocated_len: encoded.code_buffer.len(),
        }),
        Err(error) => Err(Reason::Unrelocatable {
            at: displaced.first().map_or(patch_at, |i| i.ip()),
            instruction: error.to_string(),
        }),
    }
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
