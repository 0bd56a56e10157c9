//! x86-64: framehop's registers for its x86-64 unwinder. Calls push the return address,
//! so the frame-pointer walk needs no more than rbp and the stack ([`crate::fp`]).

use framehop::x86_64::UnwindRegsX86_64;

use crate::UnwindRegs;

/// framehop's starting registers: rip, rsp, rbp.
pub fn framehop_regs(regs: UnwindRegs) -> UnwindRegsX86_64 {
    UnwindRegsX86_64::new(regs.ip, regs.sp, regs.fp)
}
