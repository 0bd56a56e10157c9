//! The AArch64 call-style trampoline: [`crate::call_trampoline`]'s exit path without
//! per-thread state, for AArch64 guests (`glass trace --vm` of `qemu-system-aarch64`).
//!
//! ```text
//! trampoline:  [autiasp]                     when the entry signed x30 before the patch
//!              stp x29, x30, [sp, #-16]!     the caller's return address kept
//!              stp x9, x10, [sp, #-16]!      what the record uses besides x16/x17
//!              reserve a ring slot           ldaxr/stlxr on head against tail;
//!                                            full: clrex, ldxr/stxr on dropped
//!              str  CNTVCT_EL0, [slot]
//!              stlr slot << 16 | id << 1 | 0, [slot + 8]      slot: sp at the entry
//!              ldp x9, x10, [sp], #16
//!              bl body                       ([paciasp] with x30 = the return: see below)
//!              stp x9, x10, [sp, #-16]!
//!              record { CNTVCT_EL0, slot << 16 | id << 1 | 1 }
//!              ldp x9, x10, [sp], #16
//!              ldp x29, x30, [sp], #16
//!              [autiasp]                     the caller's signed x30, as the function's
//!              ret                           own epilogue would have
//! body:        <displaced instructions>      aarch64::relocated_body
//!              b <after the patch>           the rest of the function returns to us
//! literals:    head, tail, dropped, records  (8 bytes each)
//! ```
//!
//! Registers: x0-x8 (arguments, the indirect-result register, results) are never
//! touched; x9 and x10 are saved and restored around each record; x16 and x17 (IP0/IP1,
//! which any call may clobber: veneers and PLT stubs do) are used freely, being dead at a
//! function's entry and after its return; x18 (the platform register) is never named.
//! NZCV is clobbered (the procedure-call standard keeps no flags across a call).
//!
//! The function sees a frame of 16 bytes (x29/x30) between it and its caller's: right
//! for every function that takes no arguments on the stack, wrong for the others, which
//! callers must prove from DWARF or leave alone (`stack_args`, whose x86-64 rule refuses
//! whatever AAPCS64 could put on the stack: it counts six integer registers where
//! AAPCS64 has eight, and sends every aggregate over 16 bytes, `long double` and variadic
//! arguments to memory).
//!
//! PAC: an entry whose landing pad (`paciasp`/`pacibsp`) signed x30 before the patch
//! keeps that signed value in the frame record and authenticates it before `ret`, with
//! the same stack pointer it was signed with. The body is entered with x30 = the
//! trampoline's return point signed by the same key with the body's stack pointer
//! (`adr x30; paciasp; b body`), so the function's own `autiasp; ret` returns here.
//!
//! Records are [`crate::call_trampoline`]'s: 16 bytes, reserved by compare-and-swap of
//! `head` against `tail` (here a load-acquire exclusive and a store-release exclusive), a
//! full ring drops the record and counts it, never waits; the time stamp is stored first
//! and the word published by a store-release, so a reader that sees the word sees the
//! time. The slot is the stack pointer at the function's entry, sign-extended from 48
//! bits by [`Record::decode`](crate::call_trampoline::Record::decode) (an upper-half
//! kernel address of up to 48 bits reads back whole).

use crate::aarch64::{relocated_body, to_bytes, Moves, PacKey, Plan};
use crate::call_trampoline::{Ring, MAX_ID};

const STP_FP_LR_PUSH: u32 = 0xa9bf_7bfd;
const LDP_FP_LR_POP: u32 = 0xa8c1_7bfd;
const PACIASP: u32 = 0xd503_233f;
const PACIBSP: u32 = 0xd503_237f;
const AUTIASP: u32 = 0xd503_23bf;
const AUTIBSP: u32 = 0xd503_23ff;
const RET: u32 = 0xd65f_03c0;
const CLREX: u32 = 0xd503_3f5f;
const NOP: u32 = 0xd503_201f;
/// `mrs xt, cntvct_el0` without its register.
const MRS_CNTVCT: u32 = 0xd53b_e040;
/// The condition "signed greater or equal" of `b.cond`.
const GE: u32 = 0xa;

const SP: u32 = 31;
const ZR: u32 = 31;
const X9: u32 = 9;
const X10: u32 = 10;
const X16: u32 = 16;
const X17: u32 = 17;
const LR: u32 = 30;

/// The literals at the trampoline's end, in order.
const LITERALS: usize = 4;
const HEAD: usize = 0;
const TAIL: usize = 1;
const DROPPED: usize = 2;
const RECORDS: usize = 3;

/// Words of code with branches to labels resolved once every label is placed.
#[derive(Default)]
struct Asm {
    words: Vec<u32>,
    /// (word index, label, kind)
    fixups: Vec<(usize, usize, Fixup)>,
    labels: Vec<Option<usize>>,
}

#[derive(Clone, Copy)]
enum Fixup {
    /// imm26 at bit 0 (B, BL).
    Imm26,
    /// imm19 at bit 5 (B.cond, CBZ/CBNZ, LDR literal).
    Imm19,
    /// ADR's immlo:immhi.
    Adr,
}

impl Asm {
    fn label(&mut self) -> usize {
        self.labels.push(None);
        self.labels.len() - 1
    }

    fn place(&mut self, label: usize) {
        self.labels[label] = Some(self.words.len());
    }

    fn push(&mut self, word: u32) {
        self.words.push(word);
    }

    fn to(&mut self, word: u32, label: usize, fixup: Fixup) {
        self.fixups.push((self.words.len(), label, fixup));
        self.words.push(word);
    }

    fn resolve(&mut self) -> Result<(), String> {
        for &(at, label, fixup) in &self.fixups {
            let target = self.labels[label].ok_or("a label never placed")?;
            let offset = 4 * (target as i64 - at as i64);
            self.words[at] |= match fixup {
                Fixup::Imm26 => ((offset >> 2) as u32) & 0x03ff_ffff,
                Fixup::Imm19 => (((offset >> 2) as u32) & 0x7ffff) << 5,
                Fixup::Adr => {
                    let immediate = offset as u32;
                    (immediate & 3) << 29 | ((immediate >> 2) & 0x7ffff) << 5
                }
            };
        }
        Ok(())
    }
}

fn stp_pre(rt: u32, rt2: u32, by: i32) -> u32 {
    0xa980_0000 | (((by / 8) as u32) & 0x7f) << 15 | rt2 << 10 | SP << 5 | rt
}

fn ldp_post(rt: u32, rt2: u32, by: i32) -> u32 {
    0xa8c0_0000 | (((by / 8) as u32) & 0x7f) << 15 | rt2 << 10 | SP << 5 | rt
}

/// `ldr xt, <literal>`, its offset fixed up.
fn ldr_literal(rt: u32) -> u32 {
    0x5800_0000 | rt
}

fn ldr(rt: u32, rn: u32) -> u32 {
    0xf940_0000 | rn << 5 | rt
}

fn str_offset(rt: u32, rn: u32, offset: u32) -> u32 {
    0xf900_0000 | (offset / 8) << 10 | rn << 5 | rt
}

fn ldaxr(rt: u32, rn: u32) -> u32 {
    0xc85f_fc00 | rn << 5 | rt
}

fn ldxr(rt: u32, rn: u32) -> u32 {
    0xc85f_7c00 | rn << 5 | rt
}

fn stlxr(rs: u32, rt: u32, rn: u32) -> u32 {
    0xc800_fc00 | rs << 16 | rn << 5 | rt
}

fn stxr(rs: u32, rt: u32, rn: u32) -> u32 {
    0xc800_7c00 | rs << 16 | rn << 5 | rt
}

fn stlr(rt: u32, rn: u32) -> u32 {
    0xc89f_fc00 | rn << 5 | rt
}

fn sub(rd: u32, rn: u32, rm: u32) -> u32 {
    0xcb00_0000 | rm << 16 | rn << 5 | rd
}

fn cmp(rn: u32, rm: u32) -> u32 {
    0xeb00_0000 | rm << 16 | rn << 5 | ZR
}

/// `add xd, xn|sp, #immediate`.
fn add_immediate(rd: u32, rn: u32, immediate: u32) -> u32 {
    0x9100_0000 | (immediate & 0xfff) << 10 | rn << 5 | rd
}

/// `add xd, xn, xm, lsl #shift`.
fn add_shifted(rd: u32, rn: u32, rm: u32, shift: u32) -> u32 {
    0x8b00_0000 | rm << 16 | (shift & 0x3f) << 10 | rn << 5 | rd
}

fn orr(rd: u32, rn: u32, rm: u32) -> u32 {
    0xaa00_0000 | rm << 16 | rn << 5 | rd
}

/// `and xd, xn, #(2^ones - 1)`, 1 <= ones <= 63.
fn and_low_ones(rd: u32, rn: u32, ones: u32) -> u32 {
    0x9240_0000 | (ones - 1) << 10 | rn << 5 | rd
}

/// `lsl xd, xn, #shift` (UBFM), 1 <= shift <= 63.
fn lsl(rd: u32, rn: u32, shift: u32) -> u32 {
    0xd340_0000 | ((64 - shift) & 0x3f) << 16 | (63 - shift) << 10 | rn << 5 | rd
}

fn movz(rd: u32, half: u16, shift: u32) -> u32 {
    0xd280_0000 | shift << 21 | (half as u32) << 5 | rd
}

fn movk(rd: u32, half: u16, shift: u32) -> u32 {
    0xf280_0000 | shift << 21 | (half as u32) << 5 | rd
}

/// `xd` = `value` (MOVZ of its lowest nonzero halfword, a MOVK per further one).
fn load(asm: &mut Asm, rd: u32, value: u64) {
    let first = (0..4)
        .find(|s| (value >> (16 * s)) as u16 != 0)
        .unwrap_or(0);
    asm.push(movz(rd, (value >> (16 * first)) as u16, first));
    for shift in first + 1..4 {
        let half = (value >> (16 * shift)) as u16;
        if half != 0 {
            asm.push(movk(rd, half, shift));
        }
    }
}

/// Longest trampoline [`build`] makes for `plan`: the fixed words (two records of at
/// most 36 words each and 16 around them), each displaced instruction's longest
/// relocation, the jump back, the literals, with room to spare.
pub fn room(plan: &Plan) -> u64 {
    4 * (2 * 36 + 16 + 10 * plan.displaced.len() as u64 + 6) + 8 * (LITERALS as u64 + 1)
}

/// The trampoline of the function `plan` patches, with id `id`, at `address` (8-byte
/// aligned), recording into `ring`; `guarded`: the function's pages are BTI-guarded
/// (see [`relocated_body`]). Returns its bytes and where a vCPU stopped at a displaced
/// instruction past the first goes instead ([`Moves`]; none for a near patch, which
/// displaces one word).
pub fn build(
    plan: &Plan,
    id: u16,
    address: u64,
    ring: &Ring,
    guarded: bool,
) -> Result<(Vec<u8>, Moves), String> {
    if id > MAX_ID {
        return Err(format!("function id {id} is over {MAX_ID}"));
    }
    if !ring.capacity.is_power_of_two() || ring.capacity < 2 || ring.capacity > 1 << 31 {
        return Err(format!(
            "a ring of {} records is not a power of two from 2 to 2^31",
            ring.capacity
        ));
    }
    if !address.is_multiple_of(8) {
        return Err(format!(
            "a trampoline at {address:#x} is not 8-byte aligned"
        ));
    }
    let mut asm = Asm::default();
    let literals: Vec<usize> = (0..LITERALS).map(|_| asm.label()).collect();
    let body = asm.label();
    let after_call = asm.label();
    let (sign, authenticate) = match plan.signed_at_patch {
        Some(PacKey::A) => (Some(PACIASP), Some(AUTIASP)),
        Some(PacKey::B) => (Some(PACIBSP), Some(AUTIBSP)),
        None => (None, None),
    };
    asm.push(STP_FP_LR_PUSH);
    record(&mut asm, ring, id, false, &literals);
    match sign {
        // x30 = the return point, signed as the body's `autiasp` expects it: with the
        // stack pointer the body runs on.
        Some(sign) => {
            asm.to(0x1000_0000 | LR, after_call, Fixup::Adr);
            asm.push(sign);
            asm.to(0x1400_0000, body, Fixup::Imm26);
        }
        None => asm.to(0x9400_0000, body, Fixup::Imm26),
    }
    asm.place(after_call);
    record(&mut asm, ring, id, true, &literals);
    asm.push(LDP_FP_LR_POP);
    if let Some(authenticate) = authenticate {
        asm.push(authenticate);
    }
    asm.push(RET);
    asm.place(body);
    let body_at = address + 4 * asm.words.len() as u64;
    let (relocated, moves) = relocated_body(plan, body_at, guarded)?;
    asm.words.extend(relocated);
    if asm.words.len() % 2 == 1 {
        asm.push(NOP);
    }
    for (index, value) in [ring.head, ring.tail, ring.dropped, ring.records]
        .into_iter()
        .enumerate()
    {
        asm.place(literals[index]);
        asm.push(value as u32);
        asm.push((value >> 32) as u32);
    }
    asm.resolve()?;
    // A vCPU at the patch's first word runs the new branch: it is not moved.
    let moves = moves.into_iter().skip(1).collect();
    Ok((to_bytes(&asm.words), moves))
}

/// One record, with the stack as [`build`] leaves it between x29/x30's push and pop:
/// x9/x10 saved and restored; x16, x17 and the flags clobbered.
fn record(asm: &mut Asm, ring: &Ring, id: u16, exit: bool, literals: &[usize]) {
    let retry = asm.label();
    let full = asm.label();
    let done = asm.label();
    let count = asm.label();
    asm.push(stp_pre(X9, X10, -16));
    asm.to(ldr_literal(X16), literals[HEAD], Fixup::Imm19);
    // retry: x17 = head; x9 = head - tail; full when it reaches the capacity. Signed, as
    // on x86-64: a head read before another vCPU reserved and the reader consumed past it
    // is behind the tail (negative, not full); the store-exclusive then fails.
    asm.place(retry);
    asm.push(ldaxr(X17, X16));
    asm.to(ldr_literal(X9), literals[TAIL], Fixup::Imm19);
    asm.push(ldr(X9, X9));
    asm.push(sub(X9, X17, X9));
    load(asm, X10, ring.capacity);
    asm.push(cmp(X9, X10));
    asm.to(0x5400_0000 | GE, full, Fixup::Imm19);
    asm.push(add_immediate(X9, X17, 1));
    asm.push(stlxr(X10, X9, X16));
    asm.to(0x3500_0000 | X10, retry, Fixup::Imm19); // cbnz w10, retry
                                                    // x16 = &records[head % capacity]
    asm.to(ldr_literal(X16), literals[RECORDS], Fixup::Imm19);
    asm.push(and_low_ones(X17, X17, ring.capacity.trailing_zeros()));
    asm.push(add_shifted(X16, X16, X17, 4));
    asm.push(MRS_CNTVCT | X17);
    asm.push(str_offset(X17, X16, 0));
    // The slot: sp at the function's entry, above x29/x30 and x9/x10.
    asm.push(add_immediate(X17, SP, 32));
    asm.push(lsl(X17, X17, 16));
    let low_word = (u32::from(id) << 1) | u32::from(exit);
    asm.push(movz(X9, low_word as u16, 0));
    asm.push(orr(X17, X17, X9));
    asm.push(add_immediate(X16, X16, 8));
    asm.push(stlr(X17, X16));
    asm.to(0x1400_0000, done, Fixup::Imm26);
    // full: the exclusive reservation dropped, the loss counted.
    asm.place(full);
    asm.push(CLREX);
    asm.to(ldr_literal(X16), literals[DROPPED], Fixup::Imm19);
    asm.place(count);
    asm.push(ldxr(X17, X16));
    asm.push(add_immediate(X17, X17, 1));
    asm.push(stxr(X10, X17, X16));
    asm.to(0x3500_0000 | X10, count, Fixup::Imm19);
    asm.place(done);
    asm.push(ldp_post(X9, X10, 16));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aarch64::{analyze, Reach};
    use yaxpeax_arch::{Decoder, U8Reader};
    use yaxpeax_arm::armv8::a64::{InstDecoder, Instruction, Operand};

    fn decode(word: u32) -> Instruction {
        let bytes = word.to_le_bytes();
        InstDecoder::default()
            .decode(&mut U8Reader::new(&bytes))
            .unwrap_or_else(|e| panic!("{word:#010x}: {e}"))
    }

    fn text(word: u32) -> String {
        decode(word).to_string()
    }

    fn pc_offset(instruction: &Instruction) -> Option<i64> {
        instruction.operands.iter().find_map(|o| match *o {
            Operand::PCOffset(offset) => Some(offset),
            _ => None,
        })
    }

    const RING: Ring = Ring {
        head: 0xffff_ff80_4800_2000,
        tail: 0xffff_ff80_4800_2008,
        dropped: 0xffff_ff80_4800_2010,
        records: 0xffff_ff80_4810_0000,
        capacity: 65536,
    };

    fn words(bytes: &[u8]) -> Vec<u32> {
        bytes
            .chunks_exact(4)
            .map(|w| u32::from_le_bytes(w.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn each_encoding_decodes_back_as_meant() {
        assert_eq!(text(stp_pre(X9, X10, -16)), "stp x9, x10, [sp, #-0x10]!");
        assert_eq!(text(ldp_post(X9, X10, 16)), "ldp x9, x10, [sp], #0x10");
        assert_eq!(text(STP_FP_LR_PUSH), "stp x29, x30, [sp, #-0x10]!");
        assert_eq!(text(LDP_FP_LR_POP), "ldp x29, x30, [sp], #0x10");
        assert_eq!(text(ldr(X9, X9)), "ldr x9, [x9]");
        assert_eq!(text(str_offset(X17, X16, 0)), "str x17, [x16]");
        assert_eq!(text(ldaxr(X17, X16)), "ldaxr x17, [x16]");
        assert_eq!(text(ldxr(X17, X16)), "ldxr x17, [x16]");
        assert_eq!(text(stlxr(X10, X9, X16)), "stlxr w10, x9, [x16]");
        assert_eq!(text(stxr(X10, X17, X16)), "stxr w10, x17, [x16]");
        assert_eq!(text(stlr(X17, X16)), "stlr x17, [x16]");
        assert_eq!(text(sub(X9, X17, X9)), "sub x9, x17, x9");
        assert_eq!(text(cmp(X9, X10)), "cmp x9, x10");
        assert_eq!(text(add_immediate(X17, SP, 32)), "add x17, sp, #0x20");
        assert_eq!(
            text(add_shifted(X16, X16, X17, 4)),
            "add x16, x16, x17, lsl #4"
        );
        assert_eq!(text(orr(X17, X17, X9)), "orr x17, x17, x9");
        assert_eq!(text(and_low_ones(X17, X17, 16)), "and x17, x17, #0xffff");
        assert_eq!(
            text(and_low_ones(X17, X17, 31)),
            "and x17, x17, #0x7fffffff"
        );
        assert_eq!(text(lsl(X17, X17, 16)), "lsl x17, x17, #0x10");
        assert_eq!(text(MRS_CNTVCT | X17), "mrs x17, cntvct_el0");
        assert_eq!(text(CLREX), "clrex #0xf");
        assert_eq!(text(RET), "ret");
        assert_eq!(text(movk(X10, 0x8000, 1)), "movk x10, #0x8000, lsl #16");
        for (word, expected) in [
            (PACIASP, "paciasp"),
            (PACIBSP, "pacibsp"),
            (AUTIASP, "autiasp"),
            (AUTIBSP, "autibsp"),
        ] {
            assert_eq!(text(word), expected);
        }
    }

    /// The trampoline as text, one instruction a line, literals left out.
    fn listing(bytes: &[u8]) -> Vec<String> {
        let words = words(&bytes[..bytes.len() - 8 * LITERALS]);
        words.iter().map(|&w| text(w)).collect()
    }

    #[test]
    fn a_trampoline_records_calls_the_body_records_and_returns() {
        // stp x29, x30, [sp, #-0x20]!; mov x29, sp; ...; ret
        let code = to_bytes(&[0xa9be_7bfd, 0x9100_03fd, 0xd503_201f, RET]);
        let function = 0xffff_ff80_4020_1000;
        let plan = analyze(&code, function, Reach::Near).unwrap();
        let at = 0xffff_ff80_4800_3000;
        let (bytes, moves) = build(&plan, 5, at, &RING, false).unwrap();
        assert!(moves.is_empty());
        assert!(bytes.len() as u64 <= room(&plan));
        let words = words(&bytes);
        let texts = listing(&bytes);
        assert_eq!(texts[0], "stp x29, x30, [sp, #-0x10]!");
        assert_eq!(texts[1], "stp x9, x10, [sp, #-0x10]!");
        // Every register written is x9, x10, x16, x17 or sp, but the body's.
        let body = texts
            .iter()
            .position(|t| t.starts_with("bl "))
            .expect("a call of the body");
        let ret = texts.iter().position(|t| t == "ret").unwrap();
        for text in &texts[..ret] {
            if text.starts_with("stp x29") || text.starts_with("ldp x29") {
                continue;
            }
            let named = text
                .split(|c: char| !c.is_ascii_alphanumeric())
                .filter(|t| t.starts_with(['x', 'w']) && t[1..].parse::<u32>().is_ok());
            for register in named {
                assert!(["9", "10", "16", "17"].contains(&&register[1..]), "{text}");
            }
        }
        // The body: the function's first word, then back to its second.
        let body_at = decode(words[body]);
        let target = (at + 4 * body as u64).wrapping_add(pc_offset(&body_at).unwrap() as u64);
        let body_index = ((target - at) / 4) as usize;
        assert_eq!(body_index, ret + 1);
        assert_eq!(words[body_index], 0xa9be_7bfd);
        let back = decode(words[body_index + 1]);
        assert_eq!(
            (at + 4 * (body_index as u64 + 1)).wrapping_add(pc_offset(&back).unwrap() as u64),
            function + 4
        );
        assert_eq!(texts[ret - 1], "ldp x29, x30, [sp], #0x10");
        assert_eq!(texts[ret - 2], "ldp x9, x10, [sp], #0x10");
        // Both records: the id and the exit bit, the slot sp + 32, CNTVCT_EL0 timed.
        assert_eq!(
            texts.iter().filter(|t| *t == "mrs x17, cntvct_el0").count(),
            2
        );
        assert_eq!(
            texts.iter().filter(|t| *t == "add x17, sp, #0x20").count(),
            2
        );
        assert!(texts[..body].contains(&"mov x9, #0xa".to_string()));
        assert!(texts[body..ret].contains(&"mov x9, #0xb".to_string()));
        assert_eq!(texts.iter().filter(|t| t.starts_with("stlr ")).count(), 2);
        // Each literal load reads the ring's word it means.
        let literal = |index: usize| {
            let to = (at + 4 * index as u64)
                .wrapping_add(pc_offset(&decode(words[index])).unwrap() as u64);
            let offset = (to - at) as usize;
            assert_eq!(offset % 8, 0);
            u64::from_le_bytes(bytes[offset..offset + 8].try_into().unwrap())
        };
        let loads: Vec<u64> = texts
            .iter()
            .enumerate()
            .filter(|(_, t)| t.starts_with("ldr x16, $") || t.starts_with("ldr x9, $"))
            .map(|(index, _)| literal(index))
            .collect();
        assert_eq!(
            loads,
            [
                RING.head,
                RING.tail,
                RING.records,
                RING.dropped,
                RING.head,
                RING.tail,
                RING.records,
                RING.dropped
            ]
        );
        // The branches inside a record land inside it.
        for (index, &word) in words[..ret].iter().enumerate() {
            if let Some(offset) = pc_offset(&decode(word)) {
                let to = index as i64 + offset / 4;
                assert!(to >= 0 && to <= words.len() as i64, "{}", texts[index]);
            }
        }
    }

    #[test]
    fn a_signed_entry_is_authenticated_before_the_return_and_the_body_gets_a_signed_x30() {
        // paciasp; stp x29, x30, [sp, #-0x10]!; ...; autiasp; ret
        let code = to_bytes(&[PACIASP, 0xa9bf_7bfd, 0x9100_03fd, AUTIASP, RET]);
        let plan = analyze(&code, 0x4020_0000, Reach::Near).unwrap();
        let at = 0x4080_0000;
        let (bytes, _) = build(&plan, 1, at, &RING, true).unwrap();
        let texts = listing(&bytes);
        let words = words(&bytes);
        let ret = texts.iter().position(|t| t == "ret").unwrap();
        assert_eq!(texts[ret - 1], "autiasp");
        assert_eq!(texts[ret - 2], "ldp x29, x30, [sp], #0x10");
        let sign = texts.iter().position(|t| t == "paciasp").unwrap();
        // adr x30, <after the call>; paciasp; b body
        let adr = decode(words[sign - 1]);
        assert!(
            texts[sign - 1].starts_with("adr x30"),
            "{}",
            texts[sign - 1]
        );
        let back_to = sign as i64 + 2; // the word after `b body`
        assert_eq!(pc_offset(&adr).unwrap(), 4 * (back_to - (sign as i64 - 1)));
        assert!(texts[sign + 1].starts_with("b "), "{}", texts[sign + 1]);
        assert!(!texts.iter().any(|t| t.starts_with("bl ")));
        assert_eq!(texts[back_to as usize], "stp x9, x10, [sp, #-0x10]!");
    }

    #[test]
    fn bad_rings_and_ids_are_refused() {
        let code = to_bytes(&[0x9100_0400, RET]);
        let plan = analyze(&code, 0x1000, Reach::Near).unwrap();
        assert!(build(&plan, MAX_ID + 1, 0x2000, &RING, false).is_err());
        assert!(build(&plan, 1, 0x2004, &RING, false).is_err());
        let odd = Ring {
            capacity: 1000,
            ..RING
        };
        assert!(build(&plan, 1, 0x2000, &odd, false).is_err());
        let large = Ring {
            capacity: 1 << 31,
            ..RING
        };
        let (bytes, _) = build(&plan, 1, 0x2000, &large, false).unwrap();
        let texts = listing(&bytes);
        assert!(
            texts.contains(&"mov x10, #0x80000000".to_string()),
            "{texts:?}"
        );
    }
}
