//! The code glass writes into the target: a trampoline per function and the jump that
//! sends the function's entry to it.
//!
//! ```text
//! trampoline:  push <id>                  the function id, for glass_enter
//!              call [rip + enter_slot]    the probe runtime's glass_enter (it pops the id)
//!              <displaced instructions>   re-encoded here by iced-x86's BlockEncoder
//!              jmp <end of displaced>     back into the function
//! ```
//!
//! The enter slot is a word at the start of the trampoline region holding
//! `glass_enter`'s address: a `call [rip+disp32]` reaches it wherever the runtime is
//! loaded, while the trampolines stay within ±2 GiB of the code they patch.

use iced_x86::{
    BlockEncoder, BlockEncoderOptions, Code, FlowControl, Instruction, InstructionBlock,
    MemoryOperand, Register,
};

use crate::{Plan, PATCH_LEN};

/// The displaced instructions as they must run in the trampoline. A `call` (only ever the
/// last one) is emulated so that it pushes the address after it in the *original* code:
/// `lea rsp,[rsp-8]; push rax; mov rax, <return>; mov [rsp+8], rax; pop rax; jmp <target>`.
pub(crate) fn relocate(displaced: &[Instruction], displaced_end: u64) -> Vec<Instruction> {
    let mut out = Vec::with_capacity(displaced.len() + 6);
    for instruction in displaced {
        let jump_code = match instruction.code() {
            Code::Call_rel32_64 => Some(Code::Jmp_rel32_64),
            Code::Call_rm64 => Some(Code::Jmp_rm64),
            _ => None,
        };
        match jump_code {
            Some(code) => {
                let rsp =
                    |displacement: i64| MemoryOperand::with_base_displ(Register::RSP, displacement);
                out.push(Instruction::with2(Code::Lea_r64_m, Register::RSP, rsp(-8)).unwrap());
                out.push(Instruction::with1(Code::Push_r64, Register::RAX).unwrap());
                out.push(
                    Instruction::with2(Code::Mov_r64_imm64, Register::RAX, displaced_end).unwrap(),
                );
                out.push(Instruction::with2(Code::Mov_rm64_r64, rsp(8), Register::RAX).unwrap());
                out.push(Instruction::with1(Code::Pop_r64, Register::RAX).unwrap());
                let mut jump = *instruction;
                jump.set_code(code);
                out.push(jump);
            }
            None => out.push(*instruction),
        }
    }
    out
}

/// Whether the displaced instructions end by leaving (a return, a jump, or a call, whose
/// relocated form jumps): no jump back to the rest of the function follows them.
pub(crate) fn leaves_by_itself(plan: &Plan) -> bool {
    plan.instructions.last().is_some_and(|last| {
        matches!(
            last.flow_control(),
            FlowControl::Return | FlowControl::UnconditionalBranch | FlowControl::IndirectBranch
        ) || crate::pushes_return_address(last)
    })
}

/// (original address, trampoline address) pairs: see [`build_with_moves`].
pub type Moves = Vec<(u64, u64)>;

/// Bytes of one function's trampoline at `address`.
pub fn build(plan: &Plan, id: u32, address: u64, enter_slot: u64) -> Result<Vec<u8>, String> {
    build_with_moves(plan, id, address, enter_slot).map(|(bytes, _)| bytes)
}

/// Bytes of one function's trampoline at `address`, and where a thread stopped inside
/// the bytes the patch replaces goes instead: (original address, trampoline address)
/// for the patch's start (the trampoline's), each displaced instruction after the first,
/// and the end of the displaced bytes when the trampoline jumps back there. Read
/// backwards, the same pairs take a thread out of the trampoline when the patch goes. A thread moved so runs the rest of the
/// displaced instructions from their relocated copies (this one call unrecorded) and
/// comes back as it would have; the end's entry serves a thread whose interrupted
/// system call (a `syscall` displaced last) the kernel restarts 2 bytes back.
pub fn build_with_moves(
    plan: &Plan,
    id: u32,
    address: u64,
    enter_slot: u64,
) -> Result<(Vec<u8>, Moves), String> {
    build_entry(plan, id, address, enter_slot, None)
}

/// A Go function's entry trampoline (see [`crate::return_sites`]): as [`build_with_moves`], with
/// the probe at `enter_slot` keeping return addresses alone, and, when the displaced
/// instructions end in the function's `ret`, the exit probe at `exit_slot` before it.
pub fn build_site_entry(
    plan: &Plan,
    id: u32,
    address: u64,
    enter_slot: u64,
    exit_slot: u64,
) -> Result<(Vec<u8>, Moves), String> {
    build_entry(plan, id, address, enter_slot, Some(exit_slot))
}

fn build_entry(
    plan: &Plan,
    id: u32,
    address: u64,
    enter_slot: u64,
    exit_slot: Option<u64>,
) -> Result<(Vec<u8>, Moves), String> {
    let mut instructions = vec![
        Instruction::with1(Code::Pushq_imm32, id as i32).map_err(|e| e.to_string())?,
        Instruction::with1(
            Code::Call_rm64,
            MemoryOperand::with_base_displ(Register::RIP, enter_slot as i64),
        )
        .map_err(|e| e.to_string())?,
    ];
    let end = plan.patch_at + plan.displaced;
    let mut relocated = relocate(&plan.instructions, end);
    if let Some(exit_slot) = exit_slot {
        if relocated.last().is_some_and(|i| i.code() == Code::Retnq) {
            // The ret's own index then names the probe: a thread moved to it is timed.
            let at = relocated.len() - 1;
            let probe = [
                Instruction::with1(Code::Pushq_imm32, id as i32).map_err(|e| e.to_string())?,
                Instruction::with1(
                    Code::Call_rm64,
                    MemoryOperand::with_base_displ(Register::RIP, exit_slot as i64),
                )
                .map_err(|e| e.to_string())?,
            ];
            relocated.splice(at..at, probe);
        }
    }
    let relocated_count = relocated.len();
    instructions.extend(relocated);
    let leaves = leaves_by_itself(plan);
    if !leaves {
        instructions
            .push(Instruction::with_branch(Code::Jmp_rel32_64, end).map_err(|e| e.to_string())?);
    }
    let block = InstructionBlock::new(&instructions, address);
    let encoded = BlockEncoder::encode(
        64,
        block,
        BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS,
    )
    .map_err(|e| e.to_string())?;
    let offsets = &encoded.new_instruction_offsets;
    // Only the last displaced instruction can be a call, which becomes several: each
    // displaced instruction starts at index 2 + its own.
    // The patch's start maps to the trampoline's (a thread about to enter the probe) and,
    // read backwards only, the relocated first instruction to it too (a thread the
    // probe has just returned to); a forward move never starts at the patch's start.
    let mut moves: Vec<(u64, u32)> = vec![(plan.patch_at, offsets[2]), (plan.patch_at, offsets[0])];
    moves.extend(
        plan.instructions
            .iter()
            .enumerate()
            .skip(1)
            .map(|(i, instruction)| (instruction.ip(), offsets[2 + i])),
    );
    if !leaves {
        moves.push((end, offsets[2 + relocated_count]));
    }
    let moves = moves
        .into_iter()
        .filter(|&(_, offset)| offset != u32::MAX)
        .map(|(from, offset)| (from, address + offset as u64))
        .collect();
    Ok((encoded.code_buffer, moves))
}

/// The bytes written at `plan.patch_at`: `jmp rel32` to the trampoline, then int3 over
/// the rest of the overwritten bytes (never executed: nothing branches into them).
pub fn entry_patch(plan: &Plan, trampoline: u64) -> Result<Vec<u8>, String> {
    let from = plan.patch_at + PATCH_LEN;
    let distance = trampoline.wrapping_sub(from) as i64;
    let rel = i32::try_from(distance).map_err(|_| {
        format!(
            "trampoline {trampoline:#x} is out of reach of {:#x}",
            plan.patch_at
        )
    })?;
    let mut bytes = vec![0xe9];
    bytes.extend_from_slice(&rel.to_le_bytes());
    bytes.resize(plan.overwritten as usize, 0xcc);
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use iced_x86::{Decoder, DecoderOptions};

    use super::*;
    use crate::analyze;

    fn decode(bytes: &[u8], ip: u64) -> Vec<String> {
        Decoder::with_ip(64, bytes, ip, DecoderOptions::NONE)
            .into_iter()
            .map(|i| format!("{i}"))
            .collect()
    }

    #[test]
    fn threads_inside_the_displaced_bytes_move_to_their_relocated_copies() {
        // xor eax, eax; syscall; mov [rdi], eax; ret: a thread interrupted in the system
        // call sits after it (4), which the kernel restarts at the syscall (2).
        let code = [0x31, 0xc0, 0x0f, 0x05, 0x89, 0x07, 0xc3];
        let plan = analyze(&code, 0x40_1000).unwrap();
        assert_eq!(plan.displaced, 6);
        let at = 0x40_1000 + 0x10_0000;
        let (bytes, moves) = build_with_moves(&plan, 7, at, at - 8).unwrap();
        assert_eq!(decode(&bytes, at)[3], "syscall");
        assert_eq!(moves.len(), 5);
        assert_eq!(moves[1], (0x40_1000, at));
        assert_eq!(moves[0].0, 0x40_1000);
        assert_eq!(
            decode(&bytes[(moves[0].1 - at) as usize..], moves[0].1)[0],
            "xor eax,eax"
        );
        let (syscall_at, relocated_syscall) = moves[2];
        assert_eq!(syscall_at, 0x40_1002);
        assert_eq!(
            &bytes[(relocated_syscall - at) as usize..][..2],
            &[0x0f, 0x05]
        );
        // What follows the relocated syscall is where the kernel's 2 bytes back start.
        assert_eq!(moves[3], (0x40_1004, relocated_syscall + 2));
        assert_eq!(moves[4].0, 0x40_1006);
        assert_eq!(bytes[(moves[4].1 - at) as usize], 0xe9);
    }

    #[test]
    fn a_trampoline_pushes_the_id_calls_enter_and_jumps_back() {
        // push rbp; mov rbp, rsp; mov eax, [rip+0x100]; pop rbp; ret
        let code = [
            0x55, 0x48, 0x89, 0xe5, 0x8b, 0x05, 0x00, 0x01, 0x00, 0x00, 0x5d, 0xc3,
        ];
        let plan = analyze(&code, 0x40_1000).unwrap();
        assert_eq!(plan.displaced, 10);
        let at = 0x40_1000 + 0x10_0000;
        let bytes = build(&plan, 7, at, at - 8).unwrap();
        assert_eq!(
            decode(&bytes, at),
            [
                "push 7",
                "call qword ptr [500FF8h]",
                "push rbp",
                "mov rbp,rsp",
                "mov eax,[40110Ah]",
                "jmp 000000000040100Ah"
            ]
        );
        assert_eq!(
            entry_patch(&plan, at).unwrap(),
            [0xe9, 0xfb, 0xff, 0x0f, 0x00, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc]
        );
    }

    #[test]
    fn a_displaced_call_returns_into_the_original_code() {
        // call 0x402000; add eax, 1; ret
        let code = [0xe8, 0xfb, 0x0f, 0x00, 0x00, 0x83, 0xc0, 0x01, 0xc3];
        let plan = analyze(&code, 0x40_1000).unwrap();
        let at = 0x50_0000;
        let text = decode(&build(&plan, 1, at, at - 8).unwrap(), at);
        assert_eq!(
            text[2..],
            [
                "lea rsp,[rsp-8]",
                "push rax",
                "mov rax,401005h",
                "mov [rsp+8],rax",
                "pop rax",
                "jmp 0000000000402000h"
            ]
        );
    }

    #[test]
    fn a_displaced_syscall_is_copied_and_followed_by_the_jump_back() {
        // syscall; nop; nop; nop; ret — syscall returns to the next instruction (iced-x86
        // classes it as a call): copied as it is, then the jump back after the patch.
        let code = [0x0f, 0x05, 0x90, 0x90, 0x90, 0xc3];
        let plan = analyze(&code, 0x40_1000).unwrap();
        assert_eq!(plan.displaced, 5);
        let at = 0x50_0000;
        let text = decode(&build(&plan, 1, at, at - 8).unwrap(), at);
        assert_eq!(
            text[2..],
            ["syscall", "nop", "nop", "nop", "jmp 0000000000401005h"]
        );
        // And not only as the last displaced instruction.
        let code = [0x0f, 0x05, 0x48, 0x89, 0xc7, 0xc3];
        assert!(analyze(&code, 0x40_1000).is_ok());
    }

    #[test]
    fn a_short_function_without_padding_moves_whole_for_its_call_sites() {
        // xor eax, eax; ret — 3 bytes, nothing to borrow after it.
        let plan = crate::whole_function_plan(&[0x31, 0xc0, 0xc3], 0x1000).unwrap();
        assert_eq!(plan.overwritten, 0, "nothing of the original is written");
        let text = decode(&build(&plan, 9, 0x3000, 0x2ff8).unwrap(), 0x3000);
        assert_eq!(
            text,
            ["push 9", "call qword ptr [2FF8h]", "xor eax,eax", "ret"]
        );
        // A call inside would return into the copy: refused. So is falling off the end.
        assert!(crate::whole_function_plan(&[0xe8, 0, 0, 0, 0, 0xc3], 0x1000).is_err());
        assert!(crate::whole_function_plan(&[0x31, 0xc0], 0x1000).is_err());
        // The rel32 call to it is found, its displacement is the last four bytes.
        assert_eq!(
            crate::branch_at(&[0xe8, 0xfb, 0x0f, 0x00, 0x00], 0x1000),
            Some((0x2000, 5))
        );
    }

    #[test]
    fn a_short_function_borrows_filler_padding() {
        // lea eax, [rdi+3]; ret; then int3 padding
        let code = [0x8d, 0x47, 0x03, 0xc3];
        let plan = crate::analyze_with_padding(&code, 0x1000, &[0xcc; 12]).unwrap();
        assert_eq!((plan.displaced, plan.overwritten), (4, 5));
        let text = decode(&build(&plan, 2, 0x2000, 0x1ff8).unwrap(), 0x2000);
        assert_eq!(text[2..], ["lea eax,[rdi+3]", "ret"]);
        // Padding that is code (or too little of it) is not borrowed.
        assert!(crate::analyze_with_padding(&code, 0x1000, &[0x55; 4]).is_err());
        assert!(crate::analyze_with_padding(&code, 0x1000, &[]).is_err());
        // A function that can fall through its end is not extended.
        assert!(
            crate::analyze_with_padding(&[0x8d, 0x47, 0x03, 0x90], 0x1000, &[0xcc; 8]).is_err()
        );
    }
}
