//! Return-site probes: an entry probe and a probe at each return, with every return
//! address left as the caller's call wrote it.
//!
//! The process tracer's first exit probe replaces a call's return address (see
//! glass-probe). That breaks the CPU's pairing of calls and returns (the probe's exit and
//! the real return are both mispredicted), and it kills Go programs: the Go runtime reads
//! and moves return addresses itself (garbage collection, preemption, panics,
//! `runtime.Callers`, goroutine stacks copied as they grow), and a pc it does not know is
//! fatal. So a function whose code allows it gets two kinds of patch, each the same
//! `jmp rel32` as an entry patch, to a trampoline:
//!
//! ```text
//! entry:    push <id>; call [rip + site_enter]; <displaced>; jmp back
//! return:   <displaced but the ret>; push <id>; call [rip + site_exit]; ret
//! ```
//!
//! At a return the stack pointer is back at the call's slot, the same word the entry
//! saw, so the probes key a call by its stack and its slot there (for a goroutine,
//! relative to the stack's top, which stays the same when the runtime moves the stack:
//! glass-probe). A call left without returning (longjmp, an exception, a panic) is ended
//! by the next record at or above its slot.
//!
//! What this asks of the code, beyond the entry patch's own checks:
//! - Each `ret` must be reachable by a patch: the instructions just before it, straight
//!   code no branch lands inside, at least five bytes with the `ret`; or the `ret` and
//!   the filler after the function's last one. A function with a return that cannot be
//!   patched takes the return-address probe instead (Go: is not traced).
//! - The function leaves only by `ret`: a jump out of it (a tail call) or through a
//!   register (a jump table, whose targets glass does not know) refuses it.
//! - Go only: nearly every Go function starts with its stack check, whose slow path
//!   calls `runtime.morestack` and jumps back to the function's first byte. That byte is
//!   the patch's start, which a branch may reach: the entry probe runs again, on a grown
//!   stack at the same slot, and glass counts one call. (Elsewhere a branch to the first
//!   byte is a loop or a tail call to itself: each pass is a call, so it is refused.)
//! - Go only: a displaced instruction must not fault: Go turns a fault at a pc of its own
//!   code into a panic (nil checks are loads), and a pc in a trampoline is not its code.
//!   Only stack-, rip-, goroutine- and TLS-relative operands are displaced.

use iced_x86::{
    BlockEncoder, BlockEncoderOptions, Code, FlowControl, Instruction, InstructionBlock,
    MemoryOperand, Mnemonic, OpKind, Register,
};

use crate::{analyze_inner, decode_all, is_filler, Plan, Reason, PATCH_LEN};

/// A return patched with a jump to its own trampoline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReturnSite {
    /// Where the jump is written.
    pub at: u64,
    /// Bytes the jump replaces (whole instructions, the `ret` last; or the `ret` and the
    /// filler after it).
    pub overwritten: u64,
    /// The instructions before the `ret` that move into the trampoline.
    pub before: Vec<Instruction>,
}

/// How a function is patched for return-site probes: its entry (whose displaced instructions may end in
/// its only `ret`) and each return elsewhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SitePlan {
    pub entry: Plan,
    pub returns: Vec<ReturnSite>,
}

impl SitePlan {
    /// Every (start, length) the plan overwrites.
    pub fn overwritten(&self) -> Vec<(u64, u64)> {
        std::iter::once((self.entry.patch_at, self.entry.overwritten))
            .chain(self.returns.iter().map(|r| (r.at, r.overwritten)))
            .collect()
    }
}

/// Plans a function's patches. `code` is the function at `address`, `padding` the bytes
/// after it up to the next function, `landed_on(from, to)` the first address in
/// `from..to` that code elsewhere branches to, and `go` whether Go built it (see the
/// module's comment).
pub fn plan(
    code: &[u8],
    address: u64,
    padding: &[u8],
    landed_on: &dyn Fn(u64, u64) -> Option<u64>,
    go: bool,
) -> Result<SitePlan, Reason> {
    let instructions = decode_all(code, address)?;
    let end = address + code.len() as u64;
    for instruction in &instructions {
        match instruction.flow_control() {
            FlowControl::IndirectBranch => {
                return Err(Reason::IndirectJump {
                    at: instruction.ip(),
                })
            }
            FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch => {
                let target = instruction.near_branch_target();
                if target < address || target >= end {
                    return Err(Reason::TailCall {
                        at: instruction.ip(),
                        to: target,
                    });
                }
            }
            _ => {}
        }
    }
    let may_fault = |instruction: &Instruction| go && may_fault(instruction);
    let entry = analyze_inner(code, address, padding, go)?;
    if let Some(instruction) = entry.instructions.iter().find(|i| may_fault(i)) {
        return Err(Reason::MayFault {
            at: instruction.ip(),
            instruction: instruction.to_string(),
        });
    }
    let entry_end = entry.patch_at + entry.displaced;
    // Where branches inside the function land.
    let inside: std::collections::BTreeSet<u64> = instructions
        .iter()
        .filter(|i| {
            matches!(
                i.flow_control(),
                FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch
            )
        })
        .map(|i| i.near_branch_target())
        .collect();
    let lands_inside = |from: u64, to: u64| {
        inside
            .range(from..to)
            .next()
            .copied()
            .or(landed_on(from, to))
    };
    let mut returns = Vec::new();
    for (index, ret) in instructions.iter().enumerate() {
        if ret.flow_control() != FlowControl::Return || ret.ip() < entry_end {
            continue;
        }
        returns.push(return_site(
            &instructions[..=index],
            entry_end,
            end,
            padding,
            &lands_inside,
            &may_fault,
        )?);
    }
    Ok(SitePlan { entry, returns })
}

/// The patch of the `ret` that ends `upto`, or why it cannot have one.
fn return_site(
    upto: &[Instruction],
    entry_end: u64,
    end: u64,
    padding: &[u8],
    lands_inside: &dyn Fn(u64, u64) -> Option<u64>,
    may_fault: &dyn Fn(&Instruction) -> bool,
) -> Result<ReturnSite, Reason> {
    let ret = upto[upto.len() - 1];
    let refused = |why: &'static str| Reason::ReturnSite { at: ret.ip(), why };
    if ret.code() != Code::Retnq {
        return Err(refused("a return that pops arguments"));
    }
    // Straight code before the ret, back to five bytes.
    let mut start = upto.len() - 1;
    while ret.next_ip() - upto[start].ip() < PATCH_LEN && start > 0 {
        let before = upto[start - 1];
        if before.flow_control() != FlowControl::Next
            || before.ip() < entry_end
            || may_fault(&before)
            || lands_inside(before.next_ip(), ret.next_ip()).is_some()
        {
            break;
        }
        start -= 1;
    }
    let at = upto[start].ip();
    if ret.next_ip() - at >= PATCH_LEN && lands_inside(at + 1, ret.next_ip()).is_none() {
        return Ok(ReturnSite {
            at,
            overwritten: ret.next_ip() - at,
            before: upto[start..upto.len() - 1].to_vec(),
        });
    }
    // The function's last ret, and the filler after it.
    let needed = PATCH_LEN as usize - 1;
    if ret.next_ip() == end
        && padding.len() >= needed
        && is_filler(&padding[..needed], end)
        && lands_inside(ret.ip() + 1, ret.ip() + PATCH_LEN).is_none()
    {
        return Ok(ReturnSite {
            at: ret.ip(),
            overwritten: PATCH_LEN,
            before: Vec::new(),
        });
    }
    Err(refused("fewer than five bytes of straight code before it"))
}

/// Whether an instruction reads or writes memory a fault could stop it at: anything
/// but the stack, the code's own data (rip-relative), the goroutine (r14) and the
/// thread's own TLS (where Go keeps the goroutine).
fn may_fault(instruction: &Instruction) -> bool {
    if matches!(instruction.mnemonic(), Mnemonic::Lea | Mnemonic::Nop)
        || instruction.memory_segment() == Register::FS
    {
        return false;
    }
    (0..instruction.op_count()).any(|op| {
        instruction.op_kind(op) == OpKind::Memory
            && !matches!(
                instruction.memory_base(),
                Register::RSP | Register::RIP | Register::R14
            )
    })
}

/// The trampoline of one return site at `address`: the instructions before the `ret`,
/// the exit probe, the `ret`. Also where a thread stopped strictly inside the replaced
/// bytes goes: each displaced instruction after the first to its copy, and the `ret`
/// to the probe.
pub fn return_trampoline(
    site: &ReturnSite,
    id: u32,
    address: u64,
    exit_slot: u64,
) -> Result<(Vec<u8>, crate::trampoline::Moves), String> {
    let mut instructions = site.before.clone();
    let probe_index = instructions.len();
    instructions.push(Instruction::with1(Code::Pushq_imm32, id as i32).map_err(|e| e.to_string())?);
    instructions.push(
        Instruction::with1(
            Code::Call_rm64,
            MemoryOperand::with_base_displ(Register::RIP, exit_slot as i64),
        )
        .map_err(|e| e.to_string())?,
    );
    instructions.push(Instruction::with(Code::Retnq));
    let encoded = BlockEncoder::encode(
        64,
        InstructionBlock::new(&instructions, address),
        BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS,
    )
    .map_err(|e| e.to_string())?;
    let offsets = &encoded.new_instruction_offsets;
    let mut moves: crate::trampoline::Moves = site
        .before
        .iter()
        .enumerate()
        .skip(1)
        .map(|(i, instruction)| (instruction.ip(), address + u64::from(offsets[i])))
        .collect();
    if let Some(last) = site.before.last() {
        // The ret: a thread there has not run the probe yet.
        moves.push((last.next_ip(), address + u64::from(offsets[probe_index])));
    }
    Ok((encoded.code_buffer, moves))
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::{Decoder, DecoderOptions};

    fn text(bytes: &[u8], ip: u64) -> Vec<String> {
        Decoder::with_ip(64, bytes, ip, DecoderOptions::NONE)
            .into_iter()
            .map(|i| format!("{i}"))
            .collect()
    }

    /// main.work of a Go 1.19 build: the stack check, a loop, one return, and the
    /// morestack path that jumps back to the first byte.
    const WORK: [u8; 108] = [
        0x49, 0x3b, 0x66, 0x10, 0x76, 0x52, 0x48, 0x83, 0xec, 0x20, 0x48, 0x89, 0x6c, 0x24, 0x18,
        0x48, 0x8d, 0x6c, 0x24, 0x18, 0x48, 0x89, 0x44, 0x24, 0x28, 0x31, 0xc9, 0x31, 0xd2, 0xeb,
        0x27, 0x48, 0x89, 0x4c, 0x24, 0x10, 0x48, 0x89, 0x54, 0x24, 0x08, 0x48, 0x89, 0xc8, 0xe8,
        0xef, 0xfe, 0xff, 0xff, 0x48, 0x8b, 0x4c, 0x24, 0x10, 0x48, 0xff, 0xc1, 0x48, 0x8b, 0x54,
        0x24, 0x08, 0x48, 0x01, 0xc2, 0x48, 0x8b, 0x44, 0x24, 0x28, 0x48, 0x39, 0xc8, 0x7f, 0xd4,
        0x48, 0x89, 0xd0, 0x48, 0x8b, 0x6c, 0x24, 0x18, 0x48, 0x83, 0xc4, 0x20, 0xc3, 0x48, 0x89,
        0x44, 0x24, 0x08, 0x0f, 0x1f, 0x00, 0xe8, 0x3b, 0x71, 0xfd, 0xff, 0x48, 0x8b, 0x44, 0x24,
        0x08, 0xeb, 0x94,
    ];

    #[test]
    fn a_sites_function_with_its_stack_check_gets_an_entry_and_a_return_patch() {
        let none = |_: u64, _: u64| None;
        let plan = plan(&WORK, 0x486320, &[0xcc; 20], &none, true).unwrap();
        assert_eq!(plan.entry.patch_at, 0x486320);
        assert_eq!(plan.entry.displaced, 6);
        assert_eq!(plan.returns.len(), 1);
        let site = &plan.returns[0];
        // add rsp,20h; ret
        assert_eq!((site.at, site.overwritten), (0x486373, 5));
        let (bytes, moves) = return_trampoline(site, 3, 0x500000, 0x4ffff8).unwrap();
        assert_eq!(
            text(&bytes, 0x500000),
            ["add rsp,20h", "push 3", "call qword ptr [4FFFF8h]", "ret"]
        );
        assert_eq!(moves, [(0x486377, 0x500004)]);
        // Without the first-byte allowance (code Go did not build), the morestack path's
        // jump is refused.
        assert!(matches!(
            super::plan(&WORK, 0x486320, &[0xcc; 20], &none, false),
            Err(Reason::JumpIntoPatch { to: 0x486320, .. })
        ));
    }

    #[test]
    fn a_leaf_keeps_its_ret_in_the_entry_or_borrows_filler() {
        let none = |_: u64, _: u64| None;
        // main.leaf: lea rcx,[rax+rax*2]; lea rax,[rax+rcx*2]; lea rax,[rax+1]; ret
        let leaf = [
            0x48, 0x8d, 0x0c, 0x40, 0x48, 0x8d, 0x04, 0x48, 0x48, 0x8d, 0x40, 0x01, 0xc3,
        ];
        let plan = plan(&leaf, 0x486240, &[0xcc; 19], &none, true).unwrap();
        assert_eq!(plan.entry.displaced, 8);
        assert_eq!(
            (plan.returns[0].at, plan.returns[0].overwritten),
            (0x486248, 5)
        );
        // xor eax,eax; ret: the whole function is the entry's, ret included.
        let plan = plan_of(&[0x31, 0xc0, 0xc3], &[0xcc; 13]);
        assert!(plan.returns.is_empty());
        // A load that may fault (a nil check) is never displaced.
        assert!(matches!(
            plan_result(
                &[0x48, 0x8b, 0x00, 0x48, 0x83, 0xc0, 0x01, 0xc3],
                &[0xcc; 8]
            ),
            Err(Reason::MayFault { .. })
        ));
        // A tail call out of the function, and a jump table.
        assert!(matches!(
            plan_result(&[0x48, 0x83, 0xc0, 0x01, 0xe9, 0x00, 0x10, 0x00, 0x00], &[]),
            Err(Reason::TailCall { .. })
        ));
        assert!(matches!(
            plan_result(&[0x48, 0x83, 0xc0, 0x01, 0x90, 0xff, 0xe0], &[]),
            Err(Reason::IndirectJump { .. })
        ));
    }

    fn plan_result(code: &[u8], padding: &[u8]) -> Result<SitePlan, Reason> {
        plan(code, 0x1000, padding, &|_, _| None, true)
    }

    fn plan_of(code: &[u8], padding: &[u8]) -> SitePlan {
        plan_result(code, padding).unwrap()
    }
}
