//! The AArch64 probe path. The design is x86-64's (the crate's first comment) with the
//! differences the architecture makes:
//!
//! - The return address arrives in x30, not on the stack. The trampoline saves x29/x30
//!   below the function's entry stack pointer, passes the function's word in x16 (free at
//!   any function entry: linkers' veneers may clobber x16/x17) and calls `glass_enter`
//!   with `blr x17`; the probe swaps the saved x30 for the exit stub, and the trampoline
//!   reloads it. A function whose entry signed x30 (`paciasp`, before the patch) has it
//!   authenticated by the trampoline before the probe and signed again after it, with
//!   the same stack pointer as modifier, so its own `autiasp` accepts the stub.
//! - A shadow entry's key is the function's entry stack pointer (what the slot address
//!   is on x86-64): a callee's is below its caller's, a tail call's equals it, and the
//!   stub, reached by `ret`, finds it as its own stack pointer.
//! - Times are the generic timer's virtual count (CNTVCT_EL0), readable at EL0 on Linux.
//!   Hardware counters are not read (glass refuses `--pmc` here): one word per record.
//! - Records are published with a store-release of the ring's head: AArch64, unlike
//!   x86-64, may make later stores visible before earlier ones.
//! - The C++ unwinder's hooks find each hijacked function's saved x30 in its frame (where
//!   its CFI says, handed over in the shadow entry; else by searching the frame) instead
//!   of at a slot address.
//!
//! Registers in the probe path: x11 = the thread's area, x12 = the key, x16 = the
//! function's word. x0-x15 and x30 are preserved: at an entry any may carry an argument
//! or, for helpers such as TLS descriptors' resolvers, a value the caller keeps; at a
//! return x0-x7 carry the result. The vector registers are never touched.

use super::*;

core::arch::global_asm!(
    ".section .tbss,\"awT\",%nobits",
    ".p2align 3",
    ".globl glass_thread_area",
    ".hidden glass_thread_area",
    ".type glass_thread_area, %object",
    ".size glass_thread_area, 8",
    "glass_thread_area:",
    ".zero 8",
    ".text",
    // ---------------------------------------------------------------------------------
    // glass_record: appends one record. In: x11 = area, x4 = the record without its
    // time. Out: x5 = 0 written, 1 dropped. Clobbers x5-x8.
    ".p2align 4",
    ".globl glass_record",
    ".hidden glass_record",
    ".type glass_record, %function",
    "glass_record:",
    "ldr x6, [x11, #{cursor}]",
    "ldr x7, [x11, #{limit}]",
    "add x5, x6, #1",
    "cmp x5, x7",
    "b.ls 2f",
    // The cached limit ran out: glass may have consumed since. (The store of a record
    // depends on this load through the branch: it cannot overtake it.)
    "ldr x7, [x11, #{tail}]",
    "ldr x8, [x11, #{mask}]",
    "add x7, x7, x8",
    "add x7, x7, #1",
    "str x7, [x11, #{limit}]",
    "cmp x5, x7",
    "b.ls 2f",
    // Full: publish what there is, count the loss, never wait.
    "stlr x6, [x11]",
    "ldr x7, [x11, #{lost}]",
    "add x7, x7, #1",
    "str x7, [x11, #{lost}]",
    "mov x5, #1",
    "ret",
    "2:",
    "mrs x7, cntvct_el0",
    "and x7, x7, #{time_mask}",
    "orr x7, x7, x4",
    "ldr x8, [x11, #{mask}]",
    "and x8, x6, x8",
    "add x8, x11, x8, lsl #3",
    "add x8, x8, #{records}",
    "str x7, [x8]",
    "add x6, x6, #1",
    "str x6, [x11, #{cursor}]",
    "tst x6, #{publish_mask}",
    "b.ne 3f",
    "stlr x6, [x11]",
    "3:",
    "mov x5, #0",
    "ret",
    ".size glass_record, . - glass_record",
    // ---------------------------------------------------------------------------------
    // glass_record_c(area, word) -> dropped: glass_record for Rust.
    ".p2align 4",
    ".globl glass_record_c",
    ".hidden glass_record_c",
    "glass_record_c:",
    "stp x29, x30, [sp, #-16]!",
    "mov x11, x0",
    "mov x4, x1",
    "bl glass_record",
    "mov x0, x5",
    "ldp x29, x30, [sp], #16",
    "ret",
    // glass_thread_area_ptr() -> address of this thread's area word.
    ".p2align 4",
    ".globl glass_thread_area_ptr",
    ".hidden glass_thread_area_ptr",
    "glass_thread_area_ptr:",
    "adrp x0, :gottprel:glass_thread_area",
    "ldr x0, [x0, :gottprel_lo12:glass_thread_area]",
    "mrs x1, tpidr_el0",
    "add x0, x0, x1",
    "ret",
    // glass_thread_area_offset() -> the area word's offset from the thread pointer.
    ".p2align 4",
    ".globl glass_thread_area_offset",
    ".hidden glass_thread_area_offset",
    "glass_thread_area_offset:",
    "adrp x0, :gottprel:glass_thread_area",
    "ldr x0, [x0, :gottprel_lo12:glass_thread_area]",
    "ret",
    // ---------------------------------------------------------------------------------
    // glass_enter: called by a trampoline with `blr x17`. x16 = the function's word (its
    // id, and above it where it saves x30); [sp] the function's x29, [sp + 8] its x30
    // (saved by the trampoline, which reloads them after); sp + 16 = its entry stack
    // pointer, the key.
    ".p2align 4",
    ".globl glass_enter",
    ".type glass_enter, %function",
    "glass_enter:",
    "hint #34", // bti c
    "sub sp, sp, #144",
    "stp x0, x1, [sp, #0]",
    "stp x2, x3, [sp, #16]",
    "stp x4, x5, [sp, #32]",
    "stp x6, x7, [sp, #48]",
    "stp x8, x9, [sp, #64]",
    "stp x10, x11, [sp, #80]",
    "stp x12, x13, [sp, #96]",
    "stp x14, x15, [sp, #112]",
    "str x30, [sp, #128]",
    "mrs x9, tpidr_el0",
    "adrp x10, :gottprel:glass_thread_area",
    "ldr x10, [x10, :gottprel_lo12:glass_thread_area]",
    "ldr x11, [x9, x10]",
    "cmp x11, #1",
    "b.ls 40f",
    "10:",
    "ldr x2, [x11, #{busy}]",
    "cbnz x2, 45f",
    "mov x2, #1",
    "str x2, [x11, #{busy}]",
    "add x12, sp, #160",
    // Is the top shadow entry a frame that is gone (longjmp, exception)?
    "ldr x2, [x11, #{depth}]",
    "cbz x2, 20f",
    "sub x3, x2, #1",
    "mov x9, #{entry}",
    "madd x15, x3, x9, x11",
    "add x15, x15, #{shadow}",
    "ldr x3, [x15]",
    "cmp x3, x12",
    "b.hi 20f",
    "b.lo 11f",
    // Same key: a tail call from the top function if its return address is the stub.
    "ldr x4, [sp, #152]",
    "adr x5, glass_exit_stub",
    "cmp x4, x5",
    "b.eq 20f",
    "11:",
    // On a signal's alternate stack the keys of the interrupted frames may lie anywhere:
    // leave them alone. sigaltstack(NULL, &old): old.ss_flags & SS_ONSTACK.
    "sub sp, sp, #32",
    "mov x0, #0",
    "mov x1, sp",
    "mov x8, #132",
    "svc #0",
    "ldr w5, [sp, #8]",
    "add sp, sp, #32",
    "tbnz w5, #0, 20f",
    "12:",
    // Pop the top entry as unwound.
    "ldr x2, [x11, #{depth}]",
    "sub x2, x2, #1",
    "str x2, [x11, #{depth}]",
    "mov x9, #{entry}",
    "madd x15, x2, x9, x11",
    "add x15, x15, #{shadow}",
    "ldr w4, [x15, #{entry_id}]",
    "lsl x4, x4, #{function_shift}",
    "orr x4, x4, #{unwound_word}",
    "ldr x5, [x11, #{unwound}]",
    "add x5, x5, #1",
    "str x5, [x11, #{unwound}]",
    "bl glass_record",
    // And look again.
    "ldr x2, [x11, #{depth}]",
    "cbz x2, 20f",
    "sub x3, x2, #1",
    "mov x9, #{entry}",
    "madd x15, x3, x9, x11",
    "add x15, x15, #{shadow}",
    "ldr x3, [x15]",
    "cmp x3, x12",
    "b.hi 20f",
    "b.lo 12b",
    "ldr x4, [sp, #152]",
    "adr x5, glass_exit_stub",
    "cmp x4, x5",
    "b.ne 12b",
    "20:",
    // Push: record the entry, then take over the return address.
    "ldr x2, [x11, #{depth}]",
    "cmp x2, #{shadow_capacity}",
    "b.hs 30f",
    "mov w4, w16",
    "lsl x4, x4, #{function_shift}",
    "bl glass_record",
    "cbnz x5, 31f",
    "ldr x2, [x11, #{depth}]",
    "mov x9, #{entry}",
    "madd x15, x2, x9, x11",
    "add x15, x15, #{shadow}",
    "ldr x4, [sp, #152]",
    "stp x12, x4, [x15]",
    "and x4, x16, #{entry_word_mask}",
    "str x4, [x15, #{entry_id}]",
    "add x2, x2, #1",
    "str x2, [x11, #{depth}]",
    "adr x4, glass_exit_stub",
    "str x4, [sp, #152]",
    "25:",
    "str xzr, [x11, #{busy}]",
    "26:",
    "ldp x0, x1, [sp, #0]",
    "ldp x2, x3, [sp, #16]",
    "ldp x4, x5, [sp, #32]",
    "ldp x6, x7, [sp, #48]",
    "ldp x8, x9, [sp, #64]",
    "ldp x10, x11, [sp, #80]",
    "ldp x12, x13, [sp, #96]",
    "ldp x14, x15, [sp, #112]",
    "ldr x30, [sp, #128]",
    "add sp, sp, #144",
    "ret",
    // Shadow stack full: not traced.
    "30:",
    "ldr x5, [x11, #{skipped}]",
    "add x5, x5, #1",
    "str x5, [x11, #{skipped}]",
    "b 25b",
    // Entry dropped (ring full): its exit is not recorded either.
    "31:",
    "ldr x5, [x11, #{lost}]",
    "add x5, x5, #1",
    "str x5, [x11, #{lost}]",
    "b 25b",
    // First probe of this thread (x11 = 0), or it has no area (x11 = 1).
    "40:",
    "bl glass_claim_area",
    "cmp x11, #1",
    "b.ls 26b",
    "b 10b",
    // A probe of this thread is running (a signal arrived inside it): not traced.
    "45:",
    "ldr x5, [x11, #{skipped}]",
    "add x5, x5, #1",
    "str x5, [x11, #{skipped}]",
    "b 26b",
    ".size glass_enter, . - glass_enter",
    // ---------------------------------------------------------------------------------
    // glass_claim_area: a thread's first probe claims an area (x11 = 0), or finds it has
    // none (x11 = 1). In: x9 = the thread pointer, x10 = the area word's offset from it.
    // Out: x11 = the area, or 1. Clobbers x0, x2-x8.
    ".p2align 4",
    ".globl glass_claim_area",
    ".hidden glass_claim_area",
    ".type glass_claim_area, %function",
    "glass_claim_area:",
    "adrp x2, {shm}",
    "ldr x2, [x2, :lo12:{shm}]",
    "cbz x2, 42f",
    "cmp x11, #1",
    "b.eq 41f",
    "add x3, x2, #{next_area}",
    // No LSE atomics before ARMv8.1: exclusive load and store.
    "43:",
    "ldaxr x5, [x3]",
    "add x6, x5, #1",
    "stlxr w7, x6, [x3]",
    "cbnz w7, 43b",
    "ldr x6, [x2, #{area_count}]",
    "cmp x5, x6",
    "b.hs 41f",
    "ldr x6, [x2, #{area_stride}]",
    "mul x5, x5, x6",
    "add x5, x5, x2",
    "add x11, x5, #{header_size}",
    "mov x8, #178", // gettid
    "svc #0",
    "str x0, [x11, #{tid}]",
    "mov x8, #172", // getpid
    "svc #0",
    "str x0, [x11, #{pid}]",
    "mov x5, #1",
    "str x5, [x11, #{claimed}]",
    "str x11, [x9, x10]",
    "ret",
    "41:",
    "add x3, x2, #{no_area_lost}",
    "44:",
    "ldxr x5, [x3]",
    "add x5, x5, #1",
    "stxr w7, x5, [x3]",
    "cbnz w7, 44b",
    "42:",
    "mov x11, #1",
    "str x11, [x9, x10]",
    "ret",
    ".size glass_claim_area, . - glass_claim_area",
    // ---------------------------------------------------------------------------------
    // glass_exit_stub: where hijacked returns land; sp is the function's entry stack
    // pointer again, the key.
    ".p2align 4",
    ".globl glass_exit_stub",
    ".type glass_exit_stub, %function",
    "glass_exit_stub:",
    "sub sp, sp, #144",
    "stp x0, x1, [sp, #0]",
    "stp x2, x3, [sp, #16]",
    "stp x4, x5, [sp, #32]",
    "stp x6, x7, [sp, #48]",
    "stp x8, x9, [sp, #64]",
    "stp x10, x11, [sp, #80]",
    "stp x12, x13, [sp, #96]",
    "stp x14, x15, [sp, #112]",
    "add x12, sp, #144",
    "mrs x9, tpidr_el0",
    "adrp x10, :gottprel:glass_thread_area",
    "ldr x10, [x10, :gottprel_lo12:glass_thread_area]",
    "ldr x11, [x9, x10]",
    "ldr x13, [x11, #{busy}]",
    "mov x4, #1",
    "str x4, [x11, #{busy}]",
    "mov x14, #0",
    "50:",
    "ldr x2, [x11, #{depth}]",
    "cbz x2, 55f",
    "sub x2, x2, #1",
    "mov x9, #{entry}",
    "madd x15, x2, x9, x11",
    "add x15, x15, #{shadow}",
    "ldr x3, [x15]",
    "cmp x3, x12",
    "b.hi 55f",
    "str x2, [x11, #{depth}]",
    "ldr w4, [x15, #{entry_id}]",
    "lsl x4, x4, #{function_shift}",
    "b.lo 52f",
    // This call's entry (or, after a tail call, one of the calls sharing the key).
    "ldr x14, [x15, #8]",
    "orr x4, x4, #{exit_word}",
    "cbnz x13, 50b",
    "bl glass_record",
    "b 50b",
    // Deeper entries whose frames are gone.
    "52:",
    "orr x4, x4, #{unwound_word}",
    "ldr x5, [x11, #{unwound}]",
    "add x5, x5, #1",
    "str x5, [x11, #{unwound}]",
    "cbnz x13, 50b",
    "bl glass_record",
    "b 50b",
    "55:",
    "cbz x14, 58f",
    "mov x30, x14",
    "str x13, [x11, #{busy}]",
    "ldp x0, x1, [sp, #0]",
    "ldp x2, x3, [sp, #16]",
    "ldp x4, x5, [sp, #32]",
    "ldp x6, x7, [sp, #48]",
    "ldp x8, x9, [sp, #64]",
    "ldp x10, x11, [sp, #80]",
    "ldp x12, x13, [sp, #96]",
    "ldp x14, x15, [sp, #112]",
    "add sp, sp, #144",
    "ret",
    // No entry for this key: the real return address is lost. Cannot happen unless the
    // program moved its stack pointer under a live frame; stop loudly rather than jump
    // anywhere.
    "58:",
    "udf #0",
    ".size glass_exit_stub, . - glass_exit_stub",
    cursor = const area::CURSOR,
    limit = const area::LIMIT,
    tail = const area::TAIL,
    mask = const area::MASK,
    lost = const area::LOST,
    records = const area::RECORDS,
    publish_mask = const glass_probe_abi::PUBLISH_EVERY - 1,
    time_mask = const (1u64 << glass_probe_abi::TSC_BITS) - 1,
    busy = const area::BUSY,
    depth = const area::DEPTH,
    shadow = const area::SHADOW,
    entry = const area::SHADOW_ENTRY,
    entry_id = const ENTRY_ID,
    entry_word_mask = const ENTRY_WORD_MASK,
    shadow_capacity = const area::SHADOW_CAPACITY,
    function_shift = const FUNCTION_SHIFT,
    unwound_word = const UNWOUND_WORD,
    exit_word = const EXIT_WORD,
    unwound = const area::UNWOUND,
    skipped = const area::SKIPPED,
    next_area = const header::NEXT_AREA,
    area_count = const header::AREA_COUNT,
    area_stride = const header::AREA_STRIDE,
    header_size = const header::SIZE,
    no_area_lost = const header::NO_AREA_LOST,
    tid = const area::TID,
    pid = const area::PID,
    claimed = const area::CLAIMED,
    shm = sym SHM,
);

/// The bits of the trampoline's word a shadow entry keeps: the id and where x30 is saved.
/// (A logical immediate: one run of ones.)
const ENTRY_WORD_MASK: u64 = (1u64 << (LR_SAVE_SHIFT + LR_SAVE_BITS)) - 1;
const LR_SAVE_SHIFT: u32 = glass_probe_abi::LR_SAVE_SHIFT;
const LR_SAVE_BITS: u32 = glass_probe_abi::LR_SAVE_BITS;

/// No return-site probes on AArch64 yet: glass patches entries only.
pub(crate) fn site_probes() -> [u64; 3] {
    [0; 3]
}

/// What glass calls to sign a return address it gives back (see header::AS_HELD).
pub(crate) fn as_held_entry() -> u64 {
    glass_probe_as_held as *const () as u64
}

/// Where a fatal fault happened.
pub(crate) fn fault_pc(context: &libc::ucontext_t) -> u64 {
    context.uc_mcontext.pc
}

/// Hardware counters are not read on AArch64 (glass refuses `--pmc` there).
pub(crate) fn open_counters(_area: *mut u8) {}

// ---------------------------------------------------------------------------------------
// Pointer authentication, with the instructions of the hint space only: they run as NOPs
// where the CPU has none, and assemble without the pauth feature.

use glass_probe_abi::stripped;

/// `value` signed as `paciasp` (key A) or `pacibsp` (key B) would sign it with `modifier`
/// as the stack pointer.
fn signed(value: u64, modifier: u64, key_b: bool) -> u64 {
    let mut out = value;
    // SAFETY: PACIA1716/PACIB1716 only compute x17 from x17 and x16.
    unsafe {
        if key_b {
            core::arch::asm!("hint #10", inout("x17") out, in("x16") modifier,
                options(nomem, nostack, preserves_flags));
        } else {
            core::arch::asm!("hint #8", inout("x17") out, in("x16") modifier,
                options(nomem, nostack, preserves_flags));
        }
    }
    out
}

/// What a frame holding `held` (its saved x30, the stub signed or not by its entry with
/// `key` as modifier) must hold instead so that it returns to `value`: `value` signed
/// the same way. None: signed with neither key, so not by this function's entry.
fn as_held(held: u64, stub: u64, value: u64, key: u64) -> Option<u64> {
    if held == stub {
        return Some(value);
    }
    [false, true]
        .into_iter()
        .find(|&key_b| signed(stub, key, key_b) == held)
        .map(|key_b| signed(value, key, key_b))
}

/// [`as_held`] for glass, which calls it in the process when it gives a signed return
/// address back at detach (the keys are the process's own); `held` itself when neither
/// key signed it.
#[no_mangle]
pub extern "C" fn glass_probe_as_held(held: u64, stub: u64, value: u64, key: u64) -> u64 {
    as_held(held, stub, value, key).unwrap_or(held)
}

/// The stack word where the function of shadow entry `entry` keeps its x30, if it holds
/// `looked_for` (stripped): where its CFI said, else the lowest such word in
/// `[low, key)`, the frame's part below the entry's key and above any deeper entry's.
pub(crate) unsafe fn saved_x30(entry: &[u64; 3], low: u64, looked_for: u64) -> Option<*mut u64> {
    let key = entry[0];
    let words = glass_probe_abi::lr_save_words(entry[2]);
    if words != 0 {
        let at = key.wrapping_sub(words * 8);
        return (at >= low && stripped(*(at as *const u64)) == looked_for)
            .then_some(at as *mut u64);
    }
    let mut at = low.next_multiple_of(8);
    while at < key {
        if stripped(*(at as *const u64)) == looked_for {
            return Some(at as *mut u64);
        }
        at += 8;
    }
    None
}

/// Puts the real return address back in the frame of every entry from `low` up whose
/// saved x30 is the stub, marking them restored.
unsafe fn restore_from(area: *mut u8, depth: u64, low: u64) {
    let stub = stub_address();
    glass_probe_abi::each_shadow_run(
        depth,
        |i| (*shadow_entry(area, i))[0],
        low,
        |first, last, low| {
            let entry = shadow_entry(area, first);
            if let Some(at) = saved_x30(&*shadow_entry(area, last), low, stub) {
                if let Some(value) = as_held(*at, stub, (*entry)[1], (*entry)[0]) {
                    *at = value;
                    (*entry)[2] |= RESTORED;
                }
            }
        },
    );
}

/// Called by the unwinder hooks with the caller's stack pointer; returns the real
/// function to continue in.
extern "C" fn before_unwind(caller_sp: u64, which: usize) -> *mut c_void {
    // SAFETY: the area is this thread's; the words searched are live stack of frames at
    // or above the caller (between caller_sp and the entries' keys).
    unsafe {
        if let Some(area) = thread_area() {
            let busy = *field(area, area::BUSY);
            *field(area, area::BUSY) = 1;
            restore_from(area, *field(area, area::DEPTH), caller_sp);
            *field(area, area::BUSY) = busy;
        }
        real_function(which)
    }
}

/// Called after the real `__cxa_begin_catch`, with the catching frame's stack pointer:
/// entries below it are gone, the restored ones above it are hijacked again.
extern "C" fn after_catch(catcher_sp: u64) {
    // SAFETY: as in before_unwind.
    unsafe {
        let Some(area) = thread_area() else { return };
        let busy = *field(area, area::BUSY);
        *field(area, area::BUSY) = 1;
        let mut depth = *field(area, area::DEPTH);
        while depth > 0 {
            let entry = shadow_entry(area, depth - 1);
            if (*entry)[0] >= catcher_sp {
                break;
            }
            depth -= 1;
            *field(area, area::DEPTH) = depth;
            *field(area, area::UNWOUND) += 1;
            if busy == 0 {
                let id = (*entry)[2] & 0xffff_ffff;
                glass_record_c(area, (id << FUNCTION_SHIFT) | UNWOUND_WORD);
            }
        }
        let stub = stub_address();
        glass_probe_abi::each_shadow_run(
            depth,
            |i| (*shadow_entry(area, i))[0],
            catcher_sp,
            |first, last, low| {
                let entry = shadow_entry(area, first);
                if (*entry)[2] & RESTORED == 0 {
                    return;
                }
                (*entry)[2] &= !RESTORED;
                let real = (*entry)[1];
                if let Some(at) = saved_x30(&*shadow_entry(area, last), low, stripped(real)) {
                    let held = *at;
                    let signed_real = [false, true]
                        .into_iter()
                        .find(|&key_b| held != real && signed(real, (*entry)[0], key_b) == held);
                    *at = match signed_real {
                        Some(key_b) => signed(stub, (*entry)[0], key_b),
                        None if held == real => stub,
                        None => held,
                    };
                }
            },
        );
        *field(area, area::BUSY) = busy;
    }
}

/// Puts the real return address back in every frame that still holds the stub (a forked
/// child left without an area of its own; `entries` is its copy of the shadow stack).
///
/// # Safety
/// The entries are this thread's, their frames live.
pub(crate) unsafe fn give_back_returns(entries: &[[u64; 3]]) {
    let stub = stub_address();
    let here = 0u64;
    let low = &here as *const u64 as u64;
    glass_probe_abi::each_shadow_run(
        entries.len() as u64,
        |i| entries[i as usize][0],
        low,
        |first, last, low| {
            let entry = &entries[first as usize];
            if let Some(at) = saved_x30(&entries[last as usize], low, stub) {
                if let Some(value) = as_held(*at, stub, entry[1], entry[0]) {
                    *at = value;
                }
            }
        },
    );
}

// The interposed entry points: tail-jump (through x16, which a BTI landing pad accepts
// from `br`) into the real function once the frames are restored, with the caller's x30
// and stack: no frame of the runtime sits between the thrower and the unwinder.
macro_rules! unwind_hook {
    ($name:ident, $which:expr) => {
        /// Interposes the unwinder's entry point of the same name.
        ///
        /// # Safety
        /// Called only by the C++ runtime, with that function's arguments.
        #[unsafe(naked)]
        #[no_mangle]
        pub unsafe extern "C" fn $name() {
            core::arch::naked_asm!(
                "hint #34",
                "stp x0, x1, [sp, #-48]!",
                "stp x2, x3, [sp, #16]",
                "stp x29, x30, [sp, #32]",
                "add x0, sp, #48",
                "mov x1, #{which}",
                "bl {before}",
                "mov x16, x0",
                "ldp x2, x3, [sp, #16]",
                "ldp x29, x30, [sp, #32]",
                "ldp x0, x1, [sp], #48",
                "br x16",
                which = const $which,
                before = sym before_unwind,
            )
        }
    };
}

unwind_hook!(_Unwind_RaiseException, 0);
unwind_hook!(_Unwind_Resume, 1);
unwind_hook!(_Unwind_Resume_or_Rethrow, 2);
unwind_hook!(_Unwind_ForcedUnwind, 3);

extern "C" fn begin_catch_real() -> *mut c_void {
    // SAFETY: dlsym lookup.
    unsafe { real_function(BEGIN_CATCH) }
}

/// Interposes `__cxa_begin_catch`: a handler has been reached.
///
/// # Safety
/// Called only by compiled C++ catch blocks, with the exception object.
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn __cxa_begin_catch() {
    core::arch::naked_asm!(
        "hint #34",
        "stp x19, x30, [sp, #-32]!",
        "str x0, [sp, #16]",
        "add x19, sp, #32",
        "bl {real}",
        "mov x16, x0",
        "ldr x0, [sp, #16]",
        "blr x16",
        "str x0, [sp, #16]",
        "mov x0, x19",
        "bl {after}",
        "ldr x0, [sp, #16]",
        "ldp x19, x30, [sp], #32",
        "ret",
        real = sym begin_catch_real,
        after = sym after_catch,
    )
}
