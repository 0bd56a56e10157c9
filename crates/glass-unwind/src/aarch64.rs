//! AArch64: framehop's registers for its AArch64 unwinder, and the frame-record walk
//! (x29/x30) where no CFI covers the leaf. Written here rather than taken from framehop
//! because framehop's fallback takes the link register as the caller's return address
//! even where the function already saved it in its frame record (the caller then
//! appears twice); telling the two apart needs the modules' function symbols.

use framehop::aarch64::UnwindRegsAarch64;

use crate::fp::{follow_chain, WalkEnd};
use crate::UnwindRegs;

/// framehop's starting registers: the link register, the stack pointer, x29 (pointer
/// authentication bits are not stripped: guests and Linux processes here use none).
pub fn framehop_regs(regs: UnwindRegs) -> UnwindRegsAarch64 {
    UnwindRegsAarch64::new(regs.lr, regs.sp, regs.fp)
}

/// The AArch64 frame-record walk. A function saves x29/x30 as a frame record only in
/// its prologue (and leaves compiled without frame records never do): until then the
/// caller's return address is in the link register alone. So the link register is the
/// first return address unless the leaf has already saved it — the frame record at x29
/// holds the same value — or it points into the leaf's own function (a call the leaf
/// made has returned: x30 is then that call's return address, and the leaf's own is in
/// its record). `same_function(a, b)` says whether two addresses lie in one function
/// (from symbols; false when unknown, which keeps the link register).
pub fn walk_frame_records(
    regs: UnwindRegs,
    read_word: &mut dyn FnMut(u64) -> Option<u64>,
    max_depth: usize,
    frames: &mut Vec<u64>,
    same_function: &dyn Fn(u64, u64) -> bool,
) -> WalkEnd {
    let start = frames.len();
    frames.push(regs.ip);
    let lr = regs.lr;
    let saved_lr = (regs.fp >= regs.sp && regs.fp != 0)
        .then(|| read_word(regs.fp + 8))
        .flatten();
    // lr - 4: the call instruction itself (a call that ends a function returns past it).
    if lr != 0 && saved_lr != Some(lr) && !same_function(lr.wrapping_sub(4), regs.ip) {
        if max_depth <= 1 {
            return WalkEnd::DepthLimit;
        }
        frames.push(lr);
    }
    let remaining = max_depth.saturating_sub(frames.len() - start - 1);
    follow_chain(regs.fp, regs.sp, read_word, remaining, frames)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stack at `base` holding frame records (address, saved x29, saved x30).
    fn stack(base: u64, records: &[(u64, u64, u64)]) -> impl FnMut(u64) -> Option<u64> {
        let records = records.to_vec();
        move |address| {
            records
                .iter()
                .find_map(|&(at, fp, lr)| {
                    if address == at {
                        Some(fp)
                    } else if address == at + 8 {
                        Some(lr)
                    } else {
                        None
                    }
                })
                .or((address >= base && address < base + 0x1000).then_some(0))
        }
    }

    // Functions: main 0x1000..0x1100, caller 0x2000..0x2100, leaf 0x3000..0x3100.
    fn same_function(a: u64, b: u64) -> bool {
        a >> 12 == b >> 12
    }

    const BASE: u64 = 0x7000_0000;

    fn walk(ip: u64, lr: u64, fp: u64, records: &[(u64, u64, u64)]) -> Vec<u64> {
        let regs = UnwindRegs {
            lr,
            ..UnwindRegs::new(ip, BASE, fp)
        };
        let mut frames = Vec::new();
        let end = walk_frame_records(
            regs,
            &mut stack(BASE, records),
            64,
            &mut frames,
            &same_function,
        );
        assert_eq!(end, WalkEnd::Complete, "{frames:x?}");
        frames
    }

    #[test]
    fn a_leaf_without_a_frame_record_returns_through_the_link_register() {
        // The leaf has not saved x30: x29 is still the caller's record.
        let records = [(BASE + 0x40, BASE + 0x80, 0x1010), (BASE + 0x80, 0, 0)];
        assert_eq!(
            walk(0x3010, 0x2020, BASE + 0x40, &records),
            [0x3010, 0x2020, 0x1010]
        );
    }

    #[test]
    fn a_saved_link_register_is_not_counted_twice() {
        // The leaf saved its record: x30 equals the return address in it.
        let records = [
            (BASE + 0x20, BASE + 0x40, 0x2020),
            (BASE + 0x40, BASE + 0x80, 0x1010),
            (BASE + 0x80, 0, 0),
        ];
        assert_eq!(
            walk(0x3010, 0x2020, BASE + 0x20, &records),
            [0x3010, 0x2020, 0x1010]
        );
    }

    #[test]
    fn a_link_register_into_the_function_itself_is_a_returned_call() {
        // The caller called something that returned: x30 points back into the caller.
        let records = [(BASE + 0x40, BASE + 0x80, 0x1010), (BASE + 0x80, 0, 0)];
        assert_eq!(
            walk(0x2030, 0x2028, BASE + 0x40, &records),
            [0x2030, 0x1010]
        );
    }
}
