//! The call-style trampoline: the exit path that needs no per-thread state.
//!
//! The process tracer times a call's exit by replacing its return address with the
//! probe's (a shadow stack per thread). Inside a VM guest glass sees no threads: a
//! unikernel schedules its own, on stacks glass does not know. So this trampoline calls
//! the function itself and is returned to, the CPU's call/return pairing intact:
//!
//! ```text
//! trampoline:  push rax, rcx, rdx
//!              reserve a ring slot (lock cmpxchg on head; full: lock inc dropped)
//!              record { rdtsc, slot << 16 | id << 1 | 0 }   slot: the return address's
//!              pop rdx, rcx, rax                             address, rsp on entry
//!              lea rsp, [rsp-8]             keeps the callee's 16-byte alignment
//!              call body
//!              lea rsp, [rsp+8]
//!              push rax, rcx, rdx           (rax and rdx: the return value)
//!              record { rdtsc, slot << 16 | id << 1 | 1 }
//!              pop rdx, rcx, rax
//!              ret                          to the function's caller
//! body:        <displaced instructions>    re-encoded by iced-x86's BlockEncoder
//!              jmp <end of displaced>      the rest of the function, which returns here
//! ```
//!
//! The function sees one more return address and 8 bytes of padding above its own:
//! right for every function that takes no arguments on the stack, wrong for the others
//! (their stack arguments would be 16 bytes further than they look): callers must prove
//! that from DWARF, or leave the function alone. Flags are not kept (the C ABI keeps
//! none across a call; the direction flag is never touched).
//!
//! Records are 16 bytes in a ring of power-of-two size that any CPU appends to: the
//! reservation is a compare-and-swap of `head` against `tail` (which the reader advances),
//! so a full ring drops the new record and counts it, never overwrites, and a writer never
//! waits. A record is published by its second word, written last (x86 stores are seen in
//! order): the reader takes a slot whose word is not zero, zeroes it, then advances
//! `tail`. The slot pairs each exit with its entry offline, and tells stacks (so threads
//! or vCPUs) apart, without any help from the code being traced.

use iced_x86::{
    BlockEncoder, BlockEncoderOptions, Code, Instruction, InstructionBlock, MemoryOperand, Register,
};

use crate::trampoline::{leaves_by_itself, relocate, Moves};
use crate::Plan;

/// Bytes of one ring record: the time stamp, then the word.
pub const RECORD_BYTES: u64 = 16;

/// The largest function id a record holds.
pub const MAX_ID: u16 = (1 << 15) - 1;

/// Where a ring's words are, as the traced code addresses them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ring {
    /// The next index to reserve (u64, written by the traced code).
    pub head: u64,
    /// The first index not yet read (u64, written by the reader).
    pub tail: u64,
    /// Records dropped because the ring was full (u64).
    pub dropped: u64,
    /// The first of `capacity` records.
    pub records: u64,
    /// Records the ring holds: a power of two, at most 2^31.
    pub capacity: u64,
}

/// One record, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    pub tsc: u64,
    /// The address of the call's return address: the same for a call's entry and exit.
    pub slot: u64,
    pub id: u16,
    pub exit: bool,
}

impl Record {
    /// The record of a published slot's two words; None while the word is zero (not yet
    /// written).
    pub fn decode(tsc: u64, word: u64) -> Option<Record> {
        (word != 0).then(|| Record {
            tsc,
            // The slot's 48 bits, sign-extended back to a canonical address.
            slot: ((word as i64) >> 16) as u64,
            id: ((word >> 1) & u64::from(MAX_ID)) as u16,
            exit: word & 1 == 1,
        })
    }
}

/// Labels inside one trampoline: instruction "addresses" BlockEncoder resolves branches
/// to, below any real code address.
const RETRY_ENTRY: u64 = 1;
const FULL_ENTRY: u64 = 2;
const DONE_ENTRY: u64 = 3;
const RETRY_EXIT: u64 = 4;
const FULL_EXIT: u64 = 5;
const DONE_EXIT: u64 = 6;
const BODY: u64 = 7;

/// Bytes of one function's call-style trampoline at `address`, and where a CPU stopped
/// strictly inside the bytes the patch replaces goes instead: each displaced instruction
/// after the first to its relocated copy in the body (and the end of the displaced bytes to the body's jump
/// back). A CPU moved there finishes the call unrecorded, returning to its caller
/// directly; read backwards, the pairs take a CPU out of the body when the patch goes.
pub fn build(plan: &Plan, id: u16, address: u64, ring: &Ring) -> Result<(Vec<u8>, Moves), String> {
    if id > MAX_ID {
        return Err(format!("function id {id} is over {MAX_ID}"));
    }
    if !ring.capacity.is_power_of_two() || ring.capacity > 1 << 31 {
        return Err(format!(
            "a ring of {} records is not a power of two up to 2^31",
            ring.capacity
        ));
    }
    let mut code = Vec::new();
    probe(
        &mut code,
        ring,
        id,
        false,
        (RETRY_ENTRY, FULL_ENTRY, DONE_ENTRY),
    )?;
    code.push(lea_rsp(-8)?);
    code.push(Instruction::with_branch(Code::Call_rel32_64, BODY).map_err(err)?);
    code.push(lea_rsp(8)?);
    probe(
        &mut code,
        ring,
        id,
        true,
        (RETRY_EXIT, FULL_EXIT, DONE_EXIT),
    )?;
    code.push(Instruction::with(Code::Retnq));
    let body_start = code.len();
    let end = plan.patch_at + plan.displaced;
    let relocated = relocate(&plan.instructions, end);
    let relocated_count = relocated.len();
    code.extend(relocated);
    // The body's first instruction is the call's target: labelled, unless it is a
    // displaced instruction a branch of its own could name (its original address).
    let mut body_label = Instruction::with(Code::Nopd);
    body_label.set_ip(BODY);
    code.insert(body_start, body_label);
    let leaves = leaves_by_itself(plan);
    if !leaves {
        code.push(Instruction::with_branch(Code::Jmp_rel32_64, end).map_err(err)?);
    }
    let encoded = BlockEncoder::encode(
        64,
        InstructionBlock::new(&code, address),
        BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS,
    )
    .map_err(err)?;
    let offsets = &encoded.new_instruction_offsets;
    let first = body_start + 1;
    // A CPU at the patch's first byte runs the new jump: it is not moved.
    let mut moves: Moves = plan
        .instructions
        .iter()
        .enumerate()
        .skip(1)
        .map(|(i, instruction)| (instruction.ip(), offsets[first + i]))
        .filter(|&(_, offset)| offset != u32::MAX)
        .map(|(from, offset)| (from, address + u64::from(offset)))
        .collect();
    if !leaves {
        moves.push((end, address + u64::from(offsets[first + relocated_count])));
    }
    Ok((encoded.code_buffer, moves))
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

fn lea_rsp(by: i64) -> Result<Instruction, String> {
    Instruction::with2(
        Code::Lea_r64_m,
        Register::RSP,
        MemoryOperand::with_base_displ(Register::RSP, by),
    )
    .map_err(err)
}

/// `[rip + address]`, a word of the ring.
fn at(address: u64) -> MemoryOperand {
    MemoryOperand::with_base_displ(Register::RIP, address as i64)
}

/// Appends one record: the time stamp and `slot << 16 | id << 1 | exit`, where the slot
/// is rsp as the probe found it. Keeps every register (rax, rcx and rdx are saved).
fn probe(
    code: &mut Vec<Instruction>,
    ring: &Ring,
    id: u16,
    exit: bool,
    (retry, full, done): (u64, u64, u64),
) -> Result<(), String> {
    use Register::*;
    let with = |instruction: Result<Instruction, iced_x86::IcedError>| instruction.map_err(err);
    let labelled = |mut instruction: Instruction, label: u64| {
        instruction.set_ip(label);
        instruction
    };
    let low_word = (u32::from(id) << 1) | u32::from(exit);
    for register in [RAX, RCX, RDX] {
        code.push(with(Instruction::with1(Code::Push_r64, register))?);
    }
    code.push(with(Instruction::with2(
        Code::Mov_r64_rm64,
        RAX,
        at(ring.head),
    ))?);
    // retry: rcx = head - tail; full when it reaches the capacity. Compared signed: a
    // head read before another CPU reserved and the reader consumed past it is behind
    // the tail, and the difference is negative, not full (an unsigned compare dropped
    // such records: 1-3 a run with two vCPUs under multi-threaded TCG); the cmpxchg
    // below then fails on the moved head and the loop reads it again.
    code.push(labelled(
        with(Instruction::with2(Code::Mov_r64_rm64, RCX, RAX))?,
        retry,
    ));
    code.push(with(Instruction::with2(
        Code::Sub_r64_rm64,
        RCX,
        at(ring.tail),
    ))?);
    code.push(with(Instruction::with2(
        Code::Cmp_rm64_imm32,
        RCX,
        ring.capacity as i32,
    ))?);
    code.push(with(Instruction::with_branch(Code::Jge_rel32_64, full))?);
    code.push(with(Instruction::with2(
        Code::Lea_r64_m,
        RCX,
        MemoryOperand::with_base_displ(RAX, 1),
    ))?);
    let mut reserve = with(Instruction::with2(
        Code::Cmpxchg_rm64_r64,
        at(ring.head),
        RCX,
    ))?;
    reserve.set_has_lock_prefix(true);
    code.push(reserve);
    code.push(with(Instruction::with_branch(Code::Jne_rel32_64, retry))?);
    // rcx = &records[index % capacity]
    code.push(with(Instruction::with2(
        Code::And_rm64_imm32,
        RAX,
        (ring.capacity - 1) as i32,
    ))?);
    code.push(with(Instruction::with2(Code::Shl_rm64_imm8, RAX, 4u32))?);
    code.push(with(Instruction::with2(
        Code::Lea_r64_m,
        RCX,
        at(ring.records),
    ))?);
    code.push(with(Instruction::with2(Code::Add_r64_rm64, RCX, RAX))?);
    code.push(Instruction::with(Code::Rdtsc));
    code.push(with(Instruction::with2(Code::Shl_rm64_imm8, RDX, 32u32))?);
    code.push(with(Instruction::with2(Code::Or_r64_rm64, RAX, RDX))?);
    code.push(with(Instruction::with2(
        Code::Mov_rm64_r64,
        MemoryOperand::with_base(RCX),
        RAX,
    ))?);
    // The slot: rsp before the three pushes.
    code.push(with(Instruction::with2(
        Code::Lea_r64_m,
        RAX,
        MemoryOperand::with_base_displ(RSP, 24),
    ))?);
    code.push(with(Instruction::with2(Code::Shl_rm64_imm8, RAX, 16u32))?);
    code.push(with(Instruction::with2(
        Code::Or_rm64_imm32,
        RAX,
        low_word as i32,
    ))?);
    code.push(with(Instruction::with2(
        Code::Mov_rm64_r64,
        MemoryOperand::with_base_displ(RCX, 8),
        RAX,
    ))?);
    code.push(with(Instruction::with_branch(Code::Jmp_rel32_64, done))?);
    let mut count = with(Instruction::with1(Code::Inc_rm64, at(ring.dropped)))?;
    count.set_has_lock_prefix(true);
    code.push(labelled(count, full));
    code.push(labelled(
        with(Instruction::with1(Code::Pop_r64, RDX))?,
        done,
    ));
    code.push(with(Instruction::with1(Code::Pop_r64, RCX))?);
    code.push(with(Instruction::with1(Code::Pop_r64, RAX))?);
    Ok(())
}
