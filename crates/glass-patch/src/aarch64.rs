//! AArch64 entry patches: where a function can take a branch to a trampoline, and the
//! displaced instructions re-encoded to run there.
//!
//! The patch is one `B` (4 bytes, ±128 MiB) to a trampoline placed that close. Where none
//! can be, a register-indirect sequence through x16 (IP0): `adrp x16; add x16; br x16`
//! (12 bytes, ±4 GiB) or `movz/movk x16; br x16` (16 bytes, any 48-bit address). The
//! procedure-call standard lets any call clobber x16 and x17 (linker veneers and PLT stubs
//! do), so no caller keeps a value in them across a call and they are dead at a function's
//! entry; the indirect patch is used only where no displaced instruction names them.
//!
//! A landing pad stays first: `bti c`/`bti jc`, or `paciasp`/`pacibsp` (which are landing
//! pads themselves in a BTI-guarded page), so the patch goes at the next instruction. A
//! function whose entry signs its return address (`paciasp`) has it signed before the
//! trampoline runs: a probe that replaces the return address must authenticate and sign
//! again with the same key and the same stack pointer (`Plan::signed_at_patch` says
//! which key), or the function's `autiasp` fails.
//!
//! Decoding is yaxpeax-arm's (pure Rust, the whole A64 set including PAC, BTI and SVE,
//! with every PC-relative operand given as an offset, so nothing PC-relative goes unseen).
//! It only decodes: the dozen encodings written here (B, BL, the conditional branches'
//! offset fields, MOVZ/MOVK, ADRP/ADD, LDR, BR) are each checked in the tests by
//! decoding them back with yaxpeax.

use yaxpeax_arch::{Decoder, U8Reader};
use yaxpeax_arm::armv8::a64::{InstDecoder, Instruction, Opcode, Operand};

use crate::Reason;

/// Bytes of the near patch: one `B`.
pub const NEAR_PATCH_LEN: u64 = 4;

/// The scratch register of the indirect patch and of relocated sequences.
const SCRATCH: u32 = 16;

/// How the patch reaches the trampoline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// One `B`: the trampoline within ±128 MiB.
    Near,
    /// `adrp/add/br x16`: within ±4 GiB.
    Page,
    /// `movz/movk/br x16`: anywhere in a 48-bit address space.
    Anywhere,
}

impl Reach {
    /// The cheapest reach from `from` to `to`.
    pub fn between(from: u64, to: u64) -> Reach {
        if fits_signed(to.wrapping_sub(from) as i64, 28) {
            Reach::Near
        } else if fits_signed(page(to).wrapping_sub(page(from)) as i64 >> 12, 21) {
            Reach::Page
        } else {
            Reach::Anywhere
        }
    }

    /// Bytes the patch replaces.
    pub fn bytes(self) -> u64 {
        match self {
            Reach::Near => 4,
            Reach::Page => 12,
            Reach::Anywhere => 16,
        }
    }
}

/// The return-address signing key of a `paciasp` (A) or `pacibsp` (B).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PacKey {
    A,
    B,
}

/// A function that can be patched: where the patch goes and what it displaces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Where the patch is written: the entry, or the instruction after its landing pad.
    pub patch_at: u64,
    pub reach: Reach,
    /// The displaced instruction words, from `patch_at` on.
    pub displaced: Vec<u32>,
    /// The return address is signed by the landing pad at the entry, before the patch:
    /// a probe that replaces it must authenticate and sign again with this key.
    pub signed_at_patch: Option<PacKey>,
    /// The entry keeps a BTI landing pad (`bti c`/`bti jc`) first.
    pub landing_pad: bool,
}

const BTI_C: u32 = 0xd503_245f;
const BTI_JC: u32 = 0xd503_24df;
const PACIASP: u32 = 0xd503_233f;
const PACIBSP: u32 = 0xd503_237f;
const NOP: u32 = 0xd503_201f;
const AUTIASP: u32 = 0xd503_23bf;
const AUTIBSP: u32 = 0xd503_23ff;
/// `stp x29, x30, [sp, #-16]!`, `ldp x29, x30, [sp], #16`.
const STP_FP_LR_PUSH: u32 = 0xa9bf_7bfd;
const LDP_FP_LR_POP: u32 = 0xa8c1_7bfd;
const BLR_X17: u32 = 0xd63f_0220;
/// `ldr x17, <literal>` and `ldr x16, <literal>` without their offsets.
const LDR_LITERAL_X17: u32 = 0x5800_0011;
const LDR_LITERAL_X16: u32 = 0x5800_0010;

/// What a decoded instruction needs to move.
fn decode(word: u32) -> Option<Instruction> {
    let bytes = word.to_le_bytes();
    let mut reader = U8Reader::new(&bytes);
    InstDecoder::default().decode(&mut reader).ok()
}

fn words(code: &[u8]) -> impl Iterator<Item = u32> + '_ {
    code.chunks_exact(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
}

/// Whether the function at `address` (its bytes `code`) can take a patch of `reach`.
pub fn analyze(code: &[u8], address: u64, reach: Reach) -> Result<Plan, Reason> {
    if !address.is_multiple_of(4) {
        return Err(Reason::Undecodable { at: address });
    }
    let all: Vec<u32> = words(code).collect();
    let (skip, signed_at_patch, landing_pad) = match all.first() {
        Some(&BTI_C) | Some(&BTI_JC) => (1, None, true),
        Some(&PACIASP) => (1, Some(PacKey::A), false),
        Some(&PACIBSP) => (1, Some(PacKey::B), false),
        _ => (0, None, false),
    };
    let patch_at = address + 4 * skip as u64;
    let count = (reach.bytes() / 4) as usize;
    if all.len() < skip + count {
        return Err(Reason::TooShortFor {
            size: code.len() as u64,
            needed: 4 * skip as u64 + reach.bytes(),
        });
    }
    let displaced = all[skip..skip + count].to_vec();
    let displaced_end = patch_at + reach.bytes();
    for (index, &word) in displaced.iter().enumerate() {
        let at = patch_at + 4 * index as u64;
        let instruction = decode(word).ok_or(Reason::Undecodable { at })?;
        let unmovable = || Reason::Unrelocatable {
            at,
            instruction: instruction.to_string(),
        };
        if reach != Reach::Near && names_scratch(&instruction) {
            return Err(unmovable());
        }
        // A call emulated in the trampoline returns to the original code after it, so
        // only the last displaced instruction may be one.
        if instruction.opcode == Opcode::BL && index + 1 != displaced.len() {
            return Err(unmovable());
        }
        // A call through a register cannot be emulated so (its `br` would need a
        // landing pad that accepts it), and moved as it is it would return into the
        // trampoline, a frame no unwinder knows.
        if matches!(
            instruction.opcode,
            Opcode::BLR | Opcode::BLRAA | Opcode::BLRAAZ | Opcode::BLRAB | Opcode::BLRABZ
        ) {
            return Err(unmovable());
        }
        // Control that leaves before the last displaced instruction would skip the
        // rest, and what follows it is reached some other way (a literal pool, another
        // function's code): not ours to move.
        let leaves = matches!(
            instruction.opcode,
            Opcode::B
                | Opcode::BR
                | Opcode::BRAA
                | Opcode::BRAAZ
                | Opcode::BRAB
                | Opcode::BRABZ
                | Opcode::RET
                | Opcode::RETAA
                | Opcode::RETAB
                | Opcode::ERET
        );
        if leaves && index + 1 != displaced.len() {
            return Err(unmovable());
        }
        relocate(word, at, 0, index == 0 || reach != Reach::Near).map_err(|_| unmovable())?;
    }
    // No branch of the function may land inside the patch, past its first word (the
    // first is where the patch's own branch is, which a loop back to it may take).
    for (index, word) in all.iter().enumerate() {
        let from = address + 4 * index as u64;
        let Some(instruction) = decode(*word) else {
            continue; // data in the text (a literal pool)
        };
        if let Some(target) = branch_target(&instruction, from) {
            if target > patch_at && target < displaced_end {
                return Err(Reason::JumpIntoPatch { from, to: target });
            }
        }
    }
    Ok(Plan {
        patch_at,
        reach,
        displaced,
        signed_at_patch,
        landing_pad,
    })
}

/// Whether the instruction names x16 or x17 (which the indirect patch clobbers).
fn names_scratch(instruction: &Instruction) -> bool {
    let scratch = |r: u16| r == 16 || r == 17;
    instruction.operands.iter().any(|operand| match *operand {
        Operand::Register(_, r) | Operand::RegisterOrSP(_, r) => scratch(r),
        Operand::RegisterPair(_, r) => scratch(r) || scratch(r + 1),
        Operand::RegShift(_, _, _, r) => scratch(r),
        Operand::RegRegOffset(a, b, ..) | Operand::RegPostIndexReg(a, b) => {
            scratch(a) || scratch(b)
        }
        Operand::RegPreIndex(r, ..) | Operand::RegPostIndex(r, _) => scratch(r),
        _ => false,
    })
}

/// The target of a direct branch (B, BL, B.cond, CBZ/CBNZ, TBZ/TBNZ) at `from`.
pub fn branch_target(instruction: &Instruction, from: u64) -> Option<u64> {
    let branches = matches!(
        instruction.opcode,
        Opcode::B
            | Opcode::BL
            | Opcode::Bcc(_)
            | Opcode::CBZ
            | Opcode::CBNZ
            | Opcode::TBZ
            | Opcode::TBNZ
    );
    branches.then(|| pc_offset(instruction).map(|offset| from.wrapping_add(offset as u64)))?
}

/// The targets of the direct branches in `code` (at `address`): where code elsewhere
/// may land, which a patch must not overlap past its first word.
pub fn branch_targets(code: &[u8], address: u64) -> impl Iterator<Item = u64> + '_ {
    words(code).enumerate().filter_map(move |(index, word)| {
        let from = address + 4 * index as u64;
        branch_target(&decode(word)?, from)
    })
}

fn pc_offset(instruction: &Instruction) -> Option<i64> {
    instruction
        .operands
        .iter()
        .find_map(|operand| match *operand {
            Operand::PCOffset(offset) => Some(offset),
            _ => None,
        })
}

fn page(address: u64) -> u64 {
    address & !0xfff
}

fn fits_signed(value: i64, bits: u32) -> bool {
    let limit = 1i64 << (bits - 1);
    (-limit..limit).contains(&value)
}

/// `word`, which ran at `from`, as a sequence that does the same at `to`. `scratch_free`:
/// x16 may be clobbered (true at a function's entry, and throughout an indirect patch's
/// displaced instructions, none of which names it). Fails for a PC-relative instruction
/// of a kind not handled here.
pub fn relocate(word: u32, from: u64, to: u64, scratch_free: bool) -> Result<Vec<u32>, String> {
    let instruction = decode(word).ok_or_else(|| format!("undecodable word {word:#010x}"))?;
    let Some(offset) = pc_offset(&instruction) else {
        return Ok(vec![word]);
    };
    let rd = word & 0x1f;
    let unhandled = || Err(format!("`{instruction}` (PC-relative) cannot be moved"));
    Ok(match instruction.opcode {
        Opcode::B => jump(to, from.wrapping_add(offset as u64)),
        Opcode::BL => {
            // Returns to the original code after it, as a call from there would.
            let mut sequence = load_absolute(30, from + 4);
            let at = to + 4 * sequence.len() as u64;
            sequence.extend(jump(at, from.wrapping_add(offset as u64)));
            sequence
        }
        Opcode::Bcc(_) | Opcode::CBZ | Opcode::CBNZ | Opcode::TBZ | Opcode::TBNZ => {
            // The same test, branching over a jump to the continuation to a jump to
            // the original target.
            let field = if matches!(instruction.opcode, Opcode::TBZ | Opcode::TBNZ) {
                14
            } else {
                19
            };
            let taken = jump(to + 8, from.wrapping_add(offset as u64));
            let mut sequence = vec![
                with_branch_offset(word, 8, field),
                b(4 * (1 + taken.len() as i64)),
            ];
            sequence.extend(taken);
            sequence
        }
        Opcode::ADR => address_into(rd, to, from.wrapping_add(offset as u64)),
        Opcode::ADRP => address_into(rd, to, page(from).wrapping_add(offset as u64)),
        Opcode::LDR | Opcode::LDRSW | Opcode::PRFM => {
            let literal = from.wrapping_add(offset as u64);
            let opc = word >> 30;
            let vector = word & (1 << 26) != 0;
            match (vector, opc) {
                // A prefetch is a hint: dropping it changes nothing but timing.
                (false, 0b11) => vec![NOP],
                (false, _) => {
                    // The destination holds the address, then the value.
                    let load = match opc {
                        0b00 => 0xb940_0000, // ldr wt, [xt]
                        0b01 => 0xf940_0000, // ldr xt, [xt]
                        _ => 0xb980_0000,    // ldrsw xt, [xt]
                    };
                    let mut sequence = load_absolute(rd, literal);
                    sequence.push(load | rd << 5 | rd);
                    sequence
                }
                (true, _) if !scratch_free => return unhandled(),
                (true, _) => {
                    let load = match opc {
                        0b00 => 0xbd40_0000, // ldr st, [x16]
                        0b01 => 0xfd40_0000, // ldr dt, [x16]
                        0b10 => 0x3dc0_0000, // ldr qt, [x16]
                        _ => return unhandled(),
                    };
                    let mut sequence = load_absolute(SCRATCH, literal);
                    sequence.push(load | SCRATCH << 5 | rd);
                    sequence
                }
            }
        }
        _ => return unhandled(),
    })
}

/// A jump from `at` to `target`: `B` in range, else through x16 (clobbering it: a
/// relocated branch leaves the displaced code, where x16 is dead at a function's entry,
/// and a branch target's code cannot rely on x16 either, since a veneer may sit between).
fn jump(at: u64, target: u64) -> Vec<u32> {
    let offset = target.wrapping_sub(at) as i64;
    if fits_signed(offset, 28) {
        vec![b(offset)]
    } else {
        let mut sequence = load_absolute(SCRATCH, target);
        sequence.push(br(SCRATCH));
        sequence
    }
}

/// The patch's own words at `patch_at`, to a trampoline at `trampoline`.
pub fn patch_words(plan: &Plan, trampoline: u64) -> Result<Vec<u32>, String> {
    let words = match plan.reach {
        Reach::Near => {
            let offset = trampoline.wrapping_sub(plan.patch_at) as i64;
            if !fits_signed(offset, 28) {
                return Err(format!(
                    "trampoline at {trampoline:#x} is out of a branch's reach from {:#x}",
                    plan.patch_at
                ));
            }
            vec![b(offset)]
        }
        Reach::Page => {
            let pages = (page(trampoline).wrapping_sub(page(plan.patch_at)) as i64) >> 12;
            if !fits_signed(pages, 21) {
                return Err(format!(
                    "trampoline at {trampoline:#x} is out of adrp's reach from {:#x}",
                    plan.patch_at
                ));
            }
            vec![
                adrp(SCRATCH, pages),
                add_immediate(SCRATCH, SCRATCH, (trampoline & 0xfff) as u32),
                br(SCRATCH),
            ]
        }
        Reach::Anywhere => {
            if trampoline >> 48 != 0 {
                return Err(format!("trampoline at {trampoline:#x} is past 48 bits"));
            }
            vec![
                movz(SCRATCH, trampoline as u16, 0),
                movk(SCRATCH, (trampoline >> 16) as u16, 1),
                movk(SCRATCH, (trampoline >> 32) as u16, 2),
                br(SCRATCH),
            ]
        }
    };
    Ok(words)
}

/// Where each displaced instruction's relocated sequence starts in the trampoline body:
/// a thread stopped at a displaced instruction (past the first) when an indirect patch
/// is written is moved there.
pub type Moves = Vec<(u64, u64)>;

/// The trampoline's displaced part, for a trampoline whose displaced code starts at `at`:
/// every displaced instruction relocated, then a jump back to the instruction after the
/// patch. Returns its words and the moves of [`Moves`].
///
/// `guarded`: the function's pages are BTI-guarded. An indirect branch may then land only
/// on a landing pad, which the instruction after the patch (or a relocated branch's
/// target) is not: every jump back must be a direct `B`, so the trampoline must be within
/// ±128 MiB of everything it jumps to.
pub fn relocated_body(plan: &Plan, at: u64, guarded: bool) -> Result<(Vec<u32>, Moves), String> {
    let mut body = Vec::new();
    let mut moves = Vec::new();
    let scratch_free = plan.reach != Reach::Near || plan.displaced.len() == 1;
    for (index, &word) in plan.displaced.iter().enumerate() {
        let from = plan.patch_at + 4 * index as u64;
        let here = at + 4 * body.len() as u64;
        moves.push((from, here));
        body.extend(relocate(word, from, here, scratch_free)?);
    }
    let back = plan.patch_at + plan.reach.bytes();
    let here = at + 4 * body.len() as u64;
    body.extend(jump(here, back));
    if guarded && body.contains(&br(SCRATCH)) {
        return Err(format!(
            "the function's pages are BTI-guarded and the trampoline at {at:#x} is out of a branch's reach of them (an indirect branch back would land on no landing pad)"
        ));
    }
    Ok((body, moves))
}

/// A function's trampoline at `at`, for glass's probe runtime (glass-probe's AArch64
/// path): x29/x30 saved below the entry stack pointer, `word` (the function's id and
/// where it saves x30) in x16, `blr` to the probe at `enter` (a literal at the
/// trampoline's end), x29/x30 reloaded (the probe may have swapped the saved x30), then
/// the displaced instructions and the jump back ([`relocated_body`]). An entry that
/// signed x30 before the patch gets it authenticated before the probe and signed again
/// after, with the same key and the same stack pointer: the probe sees (and swaps) a
/// plain address, and the function's own `autiasp` accepts what it returns through.
/// Returns the bytes and the moves of [`Moves`].
pub fn entry_trampoline(
    plan: &Plan,
    word: u64,
    at: u64,
    enter: u64,
    guarded: bool,
) -> Result<(Vec<u8>, Moves), String> {
    let mut code = Vec::new();
    match plan.signed_at_patch {
        Some(PacKey::A) => code.push(AUTIASP),
        Some(PacKey::B) => code.push(AUTIBSP),
        None => {}
    }
    code.push(STP_FP_LR_PUSH);
    code.push(movz(SCRATCH, word as u16, 0));
    for shift in 1..4 {
        code.push(movk(SCRATCH, (word >> (16 * shift)) as u16, shift));
    }
    let literal_from = code.len();
    code.push(0); // ldr x17, literal (below)
    code.push(BLR_X17);
    code.push(LDP_FP_LR_POP);
    match plan.signed_at_patch {
        Some(PacKey::A) => code.push(PACIASP),
        Some(PacKey::B) => code.push(PACIBSP),
        None => {}
    }
    let body_at = at + 4 * code.len() as u64;
    let (body, moves) = relocated_body(plan, body_at, guarded)?;
    code.extend(body);
    if code.len() % 2 == 1 {
        code.push(NOP);
    }
    let literal = 4 * code.len() as i64;
    code[literal_from] =
        LDR_LITERAL_X17 | (((literal - 4 * literal_from as i64) >> 2) as u32 & 0x7ffff) << 5;
    let mut bytes = to_bytes(&code);
    bytes.extend_from_slice(&enter.to_le_bytes());
    Ok((bytes, moves))
}

/// A library call's trampoline, which its GOT slot is pointed at: the PLT stub jumps to
/// it (`br x17`) with the caller's return address in x30; it calls the probe at `enter`
/// as [`entry_trampoline`] does, with `word` in x16, then jumps on to `target`, what the
/// slot held (`br x16`, which a BTI landing pad accepts). Both addresses are literals at
/// its end: the bytes do not depend on where they are written.
pub fn got_trampoline(word: u64, enter: u64, target: u64) -> Vec<u8> {
    let mut code = vec![STP_FP_LR_PUSH, movz(SCRATCH, word as u16, 0)];
    for shift in 1..4 {
        code.push(movk(SCRATCH, (word >> (16 * shift)) as u16, shift));
    }
    // Words 5 to 9, two for alignment, then the literals at words 12 and 14.
    code.push(LDR_LITERAL_X17 | ((12 - 5) << 5));
    code.push(BLR_X17);
    code.push(LDP_FP_LR_POP);
    code.push(LDR_LITERAL_X16 | ((14 - 8) << 5));
    code.push(br(SCRATCH));
    code.extend([NOP, NOP]);
    let mut bytes = to_bytes(&code);
    bytes.extend_from_slice(&enter.to_le_bytes());
    bytes.extend_from_slice(&target.to_le_bytes());
    bytes
}

/// Longest trampoline [`entry_trampoline`] builds for `plan`: its fixed words, each
/// displaced instruction's longest relocation (a conditional branch or literal load to
/// an absolute address), the jump back and the literal, with room to spare.
pub fn entry_trampoline_room(plan: &Plan) -> u64 {
    4 * (12 + 10 * plan.displaced.len() as u64 + 6) + 8
}

/// Bytes of `words`, little-endian, as they are written.
pub fn to_bytes(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// `xd` = `value`, at `to`: ADR or ADRP + ADD where they reach, else MOVZ/MOVK.
fn address_into(rd: u32, to: u64, value: u64) -> Vec<u32> {
    let near = value.wrapping_sub(to) as i64;
    if fits_signed(near, 21) {
        return vec![adr(rd, near)];
    }
    let pages = (page(value).wrapping_sub(page(to)) as i64) >> 12;
    if fits_signed(pages, 21) {
        let mut sequence = vec![adrp(rd, pages)];
        if value & 0xfff != 0 {
            sequence.push(add_immediate(rd, rd, (value & 0xfff) as u32));
        }
        return sequence;
    }
    load_absolute(rd, value)
}

/// `xd` = `value` by MOVZ and a MOVK per further nonzero halfword.
fn load_absolute(rd: u32, value: u64) -> Vec<u32> {
    let mut sequence = vec![movz(rd, value as u16, 0)];
    for shift in 1..4 {
        let half = (value >> (16 * shift)) as u16;
        if half != 0 {
            sequence.push(movk(rd, half, shift));
        }
    }
    sequence
}

fn b(offset: i64) -> u32 {
    0x1400_0000 | ((offset >> 2) as u32 & 0x03ff_ffff)
}

fn br(rn: u32) -> u32 {
    0xd61f_0000 | rn << 5
}

fn movz(rd: u32, half: u16, shift: u32) -> u32 {
    0xd280_0000 | shift << 21 | (half as u32) << 5 | rd
}

fn movk(rd: u32, half: u16, shift: u32) -> u32 {
    0xf280_0000 | shift << 21 | (half as u32) << 5 | rd
}

fn adr_family(base: u32, rd: u32, immediate: i64) -> u32 {
    let immediate = immediate as u32;
    base | (immediate & 3) << 29 | ((immediate >> 2) & 0x7ffff) << 5 | rd
}

fn adr(rd: u32, offset: i64) -> u32 {
    adr_family(0x1000_0000, rd, offset)
}

fn adrp(rd: u32, pages: i64) -> u32 {
    adr_family(0x9000_0000, rd, pages)
}

fn add_immediate(rd: u32, rn: u32, immediate: u32) -> u32 {
    0x9100_0000 | (immediate & 0xfff) << 10 | rn << 5 | rd
}

/// A conditional branch (`field`: its offset's bits, 19 or 14, from bit 5) with a new
/// offset.
fn with_branch_offset(word: u32, offset: i64, field: u32) -> u32 {
    let mask = ((1u32 << field) - 1) << 5;
    (word & !mask) | (((offset >> 2) as u32) << 5 & mask)
}

#[cfg(test)]
mod tests {
    use super::*;
    use yaxpeax_arm::armv8::a64::SizeCode;

    fn text(word: u32) -> String {
        decode(word).map_or("?".into(), |i| i.to_string())
    }

    #[test]
    fn an_entry_trampoline_saves_the_return_address_calls_the_probe_and_signs_again() {
        // paciasp; sub sp, sp, #0x20; ...: the patch goes after paciasp.
        let code = to_bytes(&[PACIASP, 0xd100_83ff, 0xa900_7bfd, 0xd65f_03c0]);
        let plan = analyze(&code, 0x40_0000, Reach::Near).unwrap();
        assert_eq!(plan.signed_at_patch, Some(PacKey::A));
        let at = 0x41_0000;
        let (bytes, _) =
            entry_trampoline(&plan, 0x0000_0003_0000_0007, at, 0x7f00_1234_5678, true).unwrap();
        let words: Vec<u32> = words(&bytes[..bytes.len() - 8]).collect();
        let texts: Vec<String> = words.iter().map(|&w| text(w)).collect();
        assert_eq!(texts[0], "autiasp");
        assert!(
            texts[1].starts_with("stp x29, x30, [sp, #-0x10]!"),
            "{}",
            texts[1]
        );
        assert_eq!(texts[2], "mov x16, #0x7");
        assert_eq!(texts[4], "movk x16, #0x3, lsl #32");
        assert!(texts[6].starts_with("ldr x17, "), "{}", texts[6]);
        assert_eq!(texts[7], "blr x17");
        assert!(
            texts[8].starts_with("ldp x29, x30, [sp], #0x10"),
            "{}",
            texts[8]
        );
        assert_eq!(texts[9], "paciasp");
        assert_eq!(texts[10], "sub sp, sp, #0x20");
        // Back to the instruction after the patch.
        let back = decode(words[11]).unwrap();
        assert_eq!(branch_target(&back, at + 44), Some(0x40_0008));
        // The literal the ldr loads is the probe's address.
        let ldr = decode(words[6]).unwrap();
        let literal = (at + 24).wrapping_add(pc_offset(&ldr).unwrap() as u64);
        let offset = (literal - at) as usize;
        assert_eq!(
            u64::from_le_bytes(bytes[offset..offset + 8].try_into().unwrap()),
            0x7f00_1234_5678
        );
        assert_eq!(offset % 8, 0);
        assert!(bytes.len() as u64 <= entry_trampoline_room(&plan));
    }

    #[test]
    fn a_got_trampoline_calls_the_probe_then_jumps_to_what_the_slot_held() {
        let bytes = got_trampoline(9, 0x7f00_0000_1000, 0xffff_0000_2000);
        assert_eq!(bytes.len(), 12 * 4 + 16);
        let words: Vec<u32> = words(&bytes[..48]).collect();
        let texts: Vec<String> = words.iter().map(|&w| text(w)).collect();
        assert!(
            texts[0].starts_with("stp x29, x30, [sp, #-0x10]!"),
            "{}",
            texts[0]
        );
        assert_eq!(texts[1], "mov x16, #0x9");
        assert_eq!(texts[6], "blr x17");
        assert_eq!(texts[9], "br x16");
        let literal = |index: usize| {
            let at = 0x1000 + 4 * index as u64;
            let to = at.wrapping_add(pc_offset(&decode(words[index]).unwrap()).unwrap() as u64);
            let offset = (to - 0x1000) as usize;
            u64::from_le_bytes(bytes[offset..offset + 8].try_into().unwrap())
        };
        assert!(texts[5].starts_with("ldr x17, "), "{}", texts[5]);
        assert_eq!(literal(5), 0x7f00_0000_1000);
        assert!(texts[8].starts_with("ldr x16, "), "{}", texts[8]);
        assert_eq!(literal(8), 0xffff_0000_2000);
    }

    #[test]
    fn each_encoding_decodes_back_as_meant() {
        assert_eq!(text(b(-8)), "b $-0x8");
        assert_eq!(text(br(16)), "br x16");
        assert_eq!(text(movz(16, 0x1234, 1)), "mov x16, #0x12340000");
        assert_eq!(text(movk(3, 0xbeef, 2)), "movk x3, #0xbeef, lsl #32");
        assert_eq!(text(add_immediate(16, 16, 0xabc)), "add x16, x16, #0xabc");
        for (word, offset) in [(adr(5, -3), -3i64), (adr(5, 0xfffff), 0xfffff)] {
            let decoded = decode(word).unwrap();
            assert_eq!(decoded.opcode, Opcode::ADR);
            assert_eq!(pc_offset(&decoded), Some(offset));
        }
        let decoded = decode(adrp(7, -5)).unwrap();
        assert_eq!(decoded.opcode, Opcode::ADRP);
        assert_eq!(pc_offset(&decoded), Some(-5 << 12));
        // cbz x3, tbnz w4 #5, b.ne: each with its offset replaced, the rest kept.
        for (word, field) in [(0xb400_0043u32, 19), (0x3728_0084, 14), (0x5400_0041, 19)] {
            let moved = decode(with_branch_offset(word, 8, field)).unwrap();
            assert_eq!(moved.opcode, decode(word).unwrap().opcode);
            assert_eq!(pc_offset(&moved), Some(8));
            assert_eq!(moved.operands[0], decode(word).unwrap().operands[0]);
        }
    }

    #[test]
    fn reach_is_chosen_by_distance() {
        let at = 0x40_0000;
        assert_eq!(Reach::between(at, at + (127 << 20)), Reach::Near);
        assert_eq!(Reach::between(at, at + (1 << 30)), Reach::Page);
        assert_eq!(Reach::between(at, at + (1 << 40)), Reach::Anywhere);
    }

    #[test]
    fn a_landing_pad_stays_first_and_a_signing_one_is_named() {
        let ret = 0xd65f_03c0u32;
        let mov = 0xaa01_03e0u32; // mov x0, x1
        let code = to_bytes(&[BTI_C, mov, ret]);
        let plan = analyze(&code, 0x1000, Reach::Near).unwrap();
        assert_eq!((plan.patch_at, plan.landing_pad), (0x1004, true));
        let code = to_bytes(&[PACIBSP, mov, ret]);
        let plan = analyze(&code, 0x1000, Reach::Near).unwrap();
        assert_eq!(plan.signed_at_patch, Some(PacKey::B));
        assert_eq!(plan.patch_at, 0x1004);
    }

    #[test]
    fn the_indirect_patch_refuses_what_it_would_break() {
        let ret = 0xd65f_03c0u32;
        let mov_x16 = 0xaa00_03f0u32; // mov x16, x0
        let code = to_bytes(&[mov_x16, mov_x16, mov_x16, ret]);
        assert!(analyze(&code, 0x1000, Reach::Near).is_ok());
        assert!(matches!(
            analyze(&code, 0x1000, Reach::Page),
            Err(Reason::Unrelocatable { .. })
        ));
        // b.ne back to the second word: inside a 12-byte patch, not a 4-byte one.
        let loop_back = 0x54ff_ffe1u32; // b.ne -4 (at 0x1008: to 0x1004)
        let add = 0x9100_0400u32; // add x0, x0, #1
        let code = to_bytes(&[add, add, loop_back, ret]);
        assert!(analyze(&code, 0x1000, Reach::Near).is_ok());
        assert_eq!(
            analyze(&code, 0x1000, Reach::Page),
            Err(Reason::JumpIntoPatch {
                from: 0x1008,
                to: 0x1004
            })
        );
        assert!(matches!(
            analyze(&to_bytes(&[add, ret]), 0x1000, Reach::Anywhere),
            Err(Reason::TooShortFor { needed: 16, .. })
        ));
        // A call through a register would return into the trampoline: refused.
        let blr_x8 = 0xd63f_0100u32;
        assert!(matches!(
            analyze(&to_bytes(&[blr_x8, ret]), 0x1000, Reach::Near),
            Err(Reason::Unrelocatable { .. })
        ));
    }

    /// The value a relocated address sequence (ADR, ADRP, ADD, MOVZ, MOVK) leaves in
    /// its register, run at `at`, read through yaxpeax's operands.
    fn evaluate(sequence: &[u32], at: u64) -> (u16, u64) {
        let mut value = 0u64;
        let mut register = u16::MAX;
        for (index, &word) in sequence.iter().enumerate() {
            let pc = at + 4 * index as u64;
            let i = decode(word).unwrap();
            match (i.opcode, i.operands[0], i.operands[1], i.operands[2]) {
                (Opcode::ADR, Operand::Register(_, r), Operand::PCOffset(o), _) => {
                    (register, value) = (r, pc.wrapping_add(o as u64))
                }
                (Opcode::ADRP, Operand::Register(_, r), Operand::PCOffset(o), _) => {
                    (register, value) = (r, page(pc).wrapping_add(o as u64))
                }
                (Opcode::MOVZ, Operand::Register(_, r), Operand::ImmShift(h, s), _) => {
                    (register, value) = (r, (h as u64) << s)
                }
                (Opcode::MOVK, Operand::Register(_, r), Operand::ImmShift(h, s), _) => {
                    assert_eq!(r, register);
                    value = value & !(0xffffu64 << s) | (h as u64) << s;
                }
                (
                    Opcode::ADD,
                    Operand::RegisterOrSP(_, d),
                    Operand::RegisterOrSP(_, n),
                    Operand::Immediate(k),
                ) => {
                    assert_eq!((d, n), (register, register));
                    value += k as u64;
                }
                _ => panic!("not an address sequence: {i}"),
            }
        }
        (register, value)
    }

    #[test]
    fn pc_relative_addresses_are_the_same_from_anywhere() {
        let from = 0x40_1000u64;
        for to in [
            from + 0x80,
            from + (1 << 20) + 0x44,
            from + (1 << 31),
            from + (5 << 32),
            from - 0x7000,
        ] {
            for (word, value) in [
                (adrp(3, 2), 0x40_3000),
                (adrp(3, -1), 0x40_0000),
                (adr(4, 0x123), from + 0x123),
                (adr(4, -0x44), from - 0x44),
            ] {
                let moved = relocate(word, from, to, false).unwrap();
                let expected = (word & 0x1f) as u16;
                assert_eq!(evaluate(&moved, to), (expected, value), "to {to:#x}");
            }
        }
    }

    #[test]
    fn branches_reach_their_targets_from_anywhere() {
        let from = 0x40_1000u64;
        let target = from + 0x100;
        for to in [from + 0x1000, from + (5 << 32)] {
            let moved = relocate(b(0x100), from, to, true).unwrap();
            if moved.len() == 1 {
                assert_eq!(branch_target(&decode(moved[0]).unwrap(), to), Some(target));
            } else {
                assert_eq!(*moved.last().unwrap(), br(16));
                assert_eq!(evaluate(&moved[..moved.len() - 1], to), (16, target));
            }
            // A call sets the return address to the original code after it.
            let moved = relocate(0x9400_0040, from, to, true).unwrap(); // bl +0x100
            let call_return: Vec<u32> = moved
                .iter()
                .take_while(|w| {
                    decode(**w).unwrap().operands[0] == Operand::Register(SizeCode::X, 30)
                })
                .copied()
                .collect();
            let (register, value) = evaluate(&call_return, to);
            assert_eq!((register, value), (30, from + 4));
            // cbz: taken over the fall-through jump to a jump to the target.
            let moved = relocate(0xb400_0803, from, to, true).unwrap(); // cbz x3, +0x100
            let test = decode(moved[0]).unwrap();
            assert_eq!(test.opcode, Opcode::CBZ);
            assert_eq!(branch_target(&test, to), Some(to + 8));
            let over = decode(moved[1]).unwrap();
            assert_eq!(
                branch_target(&over, to + 4),
                Some(to + 4 * moved.len() as u64),
                "the fall-through skips the taken path"
            );
        }
    }

    #[test]
    fn a_far_trampoline_in_a_bti_guarded_binary_is_refused() {
        let add = 0x9100_0400u32;
        let ret = 0xd65f_03c0u32;
        let plan = analyze(
            &to_bytes(&[BTI_C, add, add, add, add, ret]),
            0x40_1000,
            Reach::Anywhere,
        )
        .unwrap();
        assert!(relocated_body(&plan, 0x40_1000 + (5 << 32), true).is_err());
        assert!(relocated_body(&plan, 0x40_1000 + (5 << 32), false).is_ok());
        let plan = analyze(&to_bytes(&[BTI_C, add, ret]), 0x40_1000, Reach::Near).unwrap();
        assert!(relocated_body(&plan, 0x40_1000 + (64 << 20), true).is_ok());
    }
}
