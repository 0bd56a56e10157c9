//! AArch64: framehop's registers for its AArch64 unwinder, and the frame-record walk
//! (x29/x30) where no CFI covers the leaf. Written here rather than taken from framehop
//! because framehop's fallback takes the link register as the caller's return address
//! even where the function already saved it in its frame record (the caller then
//! appears twice); telling the two apart needs the modules' function symbols.

use framehop::aarch64::UnwindRegsAarch64;

use crate::fp::{follow_chain, WalkEnd};
use crate::UnwindRegs;

/// framehop's starting registers: the link register (its pointer authentication code
/// stripped), the stack pointer, x29. Return addresses framehop reads from the stack are
/// stripped by the reader ([`strip_pac`] where the result is code): framehop's own
/// `PtrAuthMask` only clears bits, which cannot restore an upper-half (kernel) address.
pub fn framehop_regs(regs: UnwindRegs) -> UnwindRegsAarch64 {
    UnwindRegsAarch64::new(strip_pac(regs.lr, regs.va_bits), regs.sp, regs.fp)
}

/// A code address without its pointer authentication code (pac-ret kernels sign x30
/// before saving it: `paciasp`). The code sits above the virtual address size of the
/// address's half, told by bit 55, which signing keeps: an upper-half address gets those
/// bits set again, a lower-half one cleared. `va_bits` is [lower, upper] (0: unknown,
/// the address is kept).
pub fn strip_pac(address: u64, va_bits: [u8; 2]) -> u64 {
    let upper = address >> 55 & 1 == 1;
    let bits = va_bits[usize::from(upper)];
    if bits == 0 || bits >= 64 {
        return address;
    }
    let code_bits = u64::MAX << bits;
    if upper {
        address | code_bits
    } else {
        address & !code_bits
    }
}

/// How many stack switches a frame-record chain may make: Linux's arm64 kernel runs
/// interrupts on a per-CPU IRQ stack (`call_on_irq_stack` leaves a frame record on the
/// task's stack), softirqs too, and an overflow on its own stack: IRQ, then task.
const STACK_SWITCHES: usize = 2;

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
    let strip = |address: u64| strip_pac(address, regs.va_bits);
    let lr = strip(regs.lr);
    let saved_lr = (regs.fp >= regs.sp && regs.fp != 0)
        .then(|| read_word(regs.fp + 8))
        .flatten()
        .map(strip);
    // lr - 4: the call instruction itself (a call that ends a function returns past it).
    if lr != 0 && saved_lr != Some(lr) && !same_function(lr.wrapping_sub(4), regs.ip) {
        if max_depth <= 1 {
            return WalkEnd::DepthLimit;
        }
        frames.push(lr);
    }
    let remaining = max_depth.saturating_sub(frames.len() - start - 1);
    follow_chain(
        regs.fp,
        regs.sp,
        read_word,
        remaining,
        frames,
        &strip,
        STACK_SWITCHES,
    )
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
    fn pointer_authentication_codes_are_stripped_by_the_addresss_half() {
        // 48-bit halves (T0SZ = T1SZ = 16), as Debian's arm64 kernel runs.
        let va = [48, 48];
        assert_eq!(strip_pac(0x4ab5_8000_0845_1234, va), 0xffff_8000_0845_1234);
        assert_eq!(strip_pac(0x7f12_0000_0040_1000, va), 0x0000_0000_0040_1000);
        assert_eq!(strip_pac(0xffff_8000_0845_1234, va), 0xffff_8000_0845_1234);
        assert_eq!(
            strip_pac(0x7f12_0000_0040_1000, [0, 0]),
            0x7f12_0000_0040_1000
        );
        // A signed kernel chain: x30 and the saved return addresses carry codes.
        let kernel = |a: u64| a | 0xffff_0000_0000_0000;
        let signed = |a: u64| a & 0x0080_ffff_ffff_ffff | 0x2a2a_0000_0000_0000;
        let base = kernel(0x8000_0000_0000);
        let records = [
            (base + 0x40, base + 0x80, signed(kernel(0x1010))),
            (base + 0x80, 0, 0),
        ];
        let regs = UnwindRegs {
            lr: signed(kernel(0x2020)),
            va_bits: va,
            ..UnwindRegs::new(kernel(0x3010), base, base + 0x40)
        };
        let mut frames = Vec::new();
        let end = walk_frame_records(
            regs,
            &mut stack(base, &records),
            64,
            &mut frames,
            &|_, _| false,
        );
        assert_eq!(end, WalkEnd::Complete);
        assert_eq!(frames, [kernel(0x3010), kernel(0x2020), kernel(0x1010)]);
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
