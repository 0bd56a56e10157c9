//! What attaching to a running Go program must know of its goroutines, read from the
//! runtime's own structures (offsets that have held since Go 1.4: `g.stack` first,
//! `g.m` after the stack guards, panic and defer, `m.g0` first).
//!
//! - The injected calls (the C library's `mmap`, `dlopen`) run on the stack of the
//!   thread that makes them. A goroutine's stack is a few KiB of the Go heap with other
//!   goroutines' stacks below it: `dlopen` there overwrote a parked goroutine's frames,
//!   and the runtime died of "unknown caller pc". The loader thread must be on its
//!   system stack (`g0`, a pthread's stack under cgo) or outside Go.
//! - A goroutine the runtime preempted asynchronously is parked with the pc it was at
//!   pushed on its stack as a return address: any instruction boundary of a Go
//!   function. One inside bytes a patch replaces would resume in the middle of the new
//!   jump. Parked goroutines cannot be moved as threads are (the runtime reads their
//!   return addresses), so the functions they are stopped inside are left unpatched.

use glass_target::inject::StoppedProcess;
use glass_target::thread_state::ThreadState;

/// `g.m`: after stack (16 bytes), stackguard0, stackguard1, _panic, _defer.
const G_M: u64 = 0x30;
/// Most of a goroutine's stack glass reads when looking for planted pcs.
const MOST_STACK: u64 = 1 << 20;

fn read_u64(pid: i32, address: u64) -> Option<u64> {
    let mut word = [0u8; 8];
    let file = std::fs::File::open(format!("/proc/{pid}/mem")).ok()?;
    std::os::unix::fs::FileExt::read_exact_at(&file, &mut word, address).ok()?;
    Some(u64::from_le_bytes(word))
}

/// Whether a stopped thread runs on a goroutine's stack (a user goroutine, or the signal
/// stack): its `g`, from its TLS at `g_offset`, is not its M's `g0`, and the stack
/// pointer lies in that g's stack. Unknown counts as on one.
pub(super) fn on_goroutine_stack(pid: i32, state: &ThreadState, g_offset: i64) -> bool {
    let known = || -> Option<bool> {
        let g = read_u64(pid, state.thread_pointer.wrapping_add(g_offset as u64))?;
        if g == 0 {
            return Some(false);
        }
        let (lo, hi) = (read_u64(pid, g)?, read_u64(pid, g + 8)?);
        if state.sp < lo || state.sp >= hi {
            return Some(false);
        }
        let m = read_u64(pid, g + G_M)?;
        let g0 = read_u64(pid, m)?;
        Some(g0 != g)
    };
    known().unwrap_or(true)
}

/// The words on goroutines' stacks (from `runtime.allgs`, a slice at `allgs`)
/// for which `inside` holds: read with every thread stopped. Any word counts, return
/// address or not: a function left unpatched for a stale word costs its calls, one
/// patched under a planted pc costs the program.
pub(super) fn planted_pcs(
    process: &StoppedProcess,
    allgs: u64,
    inside: &dyn Fn(u64) -> bool,
) -> Vec<u64> {
    let mut found = Vec::new();
    let (Ok(array), Ok(count)) = (process.read_u64(allgs), process.read_u64(allgs + 8)) else {
        return found;
    };
    let Ok(pointers) = process.read(array, (count.min(1 << 20) * 8) as usize) else {
        return found;
    };
    for g in pointers.chunks_exact(8) {
        let g = u64::from_le_bytes(g.try_into().unwrap_or_default());
        // From the stack's low end, not its saved stack pointer: a running goroutine's
        // is stale.
        let (Ok(lo), Ok(hi)) = (process.read_u64(g), process.read_u64(g + 8)) else {
            continue;
        };
        let from = lo;
        if from >= hi || hi - from > MOST_STACK {
            continue;
        }
        let Ok(stack) = process.read(from, (hi - from) as usize) else {
            continue;
        };
        found.extend(
            stack
                .chunks_exact(8)
                .map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default()))
                .filter(|&word| inside(word)),
        );
    }
    found
}

/// Of the stopped threads `tids`, the first on its own stack, not a goroutine's (the
/// first of all for a program Go did not build), to make injected calls in.
pub(super) fn thread_for_calls(pid: i32, tids: &[i32], g_offset: Option<i64>) -> i32 {
    let Some(offset) = g_offset else {
        return tids[0];
    };
    tids.iter()
        .copied()
        .find(|&tid| {
            glass_target::thread_state::thread_state(tid)
                .is_ok_and(|state| !on_goroutine_stack(pid, &state, offset))
        })
        .unwrap_or(tids[0])
}
