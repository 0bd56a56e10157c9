//! Detaching: in two halves. The entry jumps go first with the threads wherever they
//! are; then, with no thread in the probes, the unwinder's GOT slots, the hijacked
//! return addresses and the area words, and the runtime unmaps the session.

use std::time::{Duration, Instant};

use glass_target::attach::Attachment;
use glass_target::inject::StoppedProcess;
use glass_target::thread_state::thread_state;

use super::*;

/// What detaching took.
pub(super) struct Detached {
    /// Every thread stopped.
    pub(super) stopped_ns: u64,
    /// One thread stopped longer, to unmap the session.
    pub(super) unmap_ns: u64,
    /// Calls in flight, given their return addresses back.
    pub(super) in_flight: u64,
    /// Threads stepped out of the probes and trampolines.
    pub(super) moved: usize,
}

impl Detached {
    /// How it went, as the user hears it.
    pub(super) fn report(&self, pid: i32, why: &'static str) -> DetachReport {
        DetachReport {
            pid,
            why,
            stopped_ns: self.stopped_ns,
            moved: self.moved,
            unmap_ns: self.unmap_ns,
            in_flight: self.in_flight,
        }
    }
}

/// The first half of taking instrumentation out: every thread stopped wherever it is,
/// the bytes `undo` lists put back, every thread (but `keep`) let go again. No thread
/// enters a probe after this but through a trampoline it was already in or the exit of
/// a call in flight, so the second half finds the threads out of the probes at once
/// (waiting for that with the entries still patched can take forever: on a machine
/// whose rdtsc traps to the hypervisor, a thread calling a traced function in a loop is
/// stopped just after the probe's rdtsc nearly every time). Returns how long every
/// thread was stopped.
pub(super) fn restore_code(
    attachment: &mut Attachment,
    process: &StoppedProcess,
    undo: &[install::Undo],
    keep: Option<i32>,
) -> Result<Duration> {
    let pid = process.pid();
    attachment.stop_all()?;
    let stopped = Instant::now();
    let restored = install::uninstall(process, undo)
        .map_err(|e| Failure::runtime(format!("cannot restore the code of pid {pid}: {e}")));
    let held = stopped.elapsed();
    for tid in attachment.tids() {
        if Some(tid) != keep {
            attachment.resume(tid);
        }
    }
    restored?;
    glass_target::test_hook("detach-code-restored");
    // Long enough for a thread to finish the probe it was in.
    std::thread::sleep(Duration::from_millis(1));
    Ok(held)
}

/// The second half (after [`restore_code`]), with every thread stopped outside the
/// runtime and the trampolines: gives every call in flight (the shadow stacks of the
/// session the runtime mapped at `session_at`, read through the process's memory) its
/// real return address, and clears each thread's area word. Returns the calls in flight.
pub(super) fn take_out(process: &StoppedProcess, tids: &[i32], session_at: u64) -> Result<u64> {
    use glass_probe_abi::{area, header};
    let pid = process.pid();
    let word = |at: u64| process.read_u64(at).unwrap_or(0);
    let stub = word(session_at + header::EXIT_STUB as u64);
    let areas = word(session_at + header::NEXT_AREA as u64)
        .min(word(session_at + header::AREA_COUNT as u64));
    let stride = word(session_at + header::AREA_STRIDE as u64);
    // Calls in flight return straight to their callers: the slots get their addresses
    // back, the innermost first (tail calls share a slot; the outermost entry holds
    // the real address).
    let mut in_flight = 0;
    for index in 0..areas {
        let base = session_at + header::SIZE as u64 + index * stride;
        if word(base + area::PID as u64) != pid as u64 {
            continue;
        }
        let depth = word(base + area::DEPTH as u64).min(area::SHADOW_CAPACITY as u64);
        let Ok(entries) = process.read(
            base + area::SHADOW as u64,
            depth as usize * area::SHADOW_ENTRY,
        ) else {
            continue;
        };
        in_flight += depth;
        #[cfg(target_arch = "x86_64")]
        for entry in entries.chunks_exact(area::SHADOW_ENTRY).rev() {
            let slot = u64::from_le_bytes(entry[..8].try_into().unwrap());
            let real = &entry[8..16];
            if word(slot) == stub {
                let _ = process.write(slot, real);
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            let tid = word(base + area::TID as u64) as i32;
            if tids.contains(&tid) {
                let as_held = word(session_at + header::AS_HELD as u64);
                give_back_arm(process, tid, &entries, stub, as_held);
            }
        }
        let _ = process.write(base + area::DEPTH as u64, &0u64.to_le_bytes());
    }
    // Each thread claims a fresh area in the next session. (An offset of 0 would be the
    // thread's own TCB pointer: never written.)
    let offset = word(session_at + header::TLS_OFFSET as u64);
    for &tid in tids.iter().filter(|_| offset != 0) {
        if let Ok(state) = thread_state(tid) {
            let _ = process.write(
                state.thread_pointer.wrapping_add(offset),
                &0u64.to_le_bytes(),
            );
        }
    }
    Ok(in_flight)
}

/// Takes the instrumentation out.
pub(super) fn detach(pid: i32, attached: &Attached, session_at: u64) -> Result<Detached> {
    let mut attachment = Attachment::seize(pid).map_err(|e| {
        Failure::runtime(format!(
            "cannot stop pid {pid} to detach: {e}; its probes stay in place, recording nothing"
        ))
    })?;
    let writer = StoppedProcess::for_thread(pid, pid)
        .map_err(|e| Failure::runtime(format!("cannot open the memory of pid {pid}: {e}")))?;
    let code_held = restore_code(&mut attachment, &writer, &attached.undo, None)?;
    let regions: Vec<Span> = attached
        .undo
        .iter()
        .filter(|u| u.region.1 > 0)
        .map(|u| Span {
            start: u.region.0,
            end: u.region.0 + u.region.1,
        })
        .collect();
    let back = moves_back(attached.undo.iter().flat_map(|u| u.moves.iter().copied()));
    let inside = |rip: u64| within(&regions, rip);
    let leave = Leave {
        inside: &inside,
        spans: &attached.runtime_text,
        moves: &back,
    };
    let moved = stop_at_safe_points(&mut attachment, &leave, None)?;
    let stopped = Instant::now();
    glass_target::test_hook("detach-stopped");
    let tids = attachment.tids();
    let caller = super::go_stacks::thread_for_calls(pid, &tids, attached.go_g_offset);
    let mut process = StoppedProcess::for_thread(pid, caller)
        .map_err(|e| Failure::runtime(format!("cannot open the memory of pid {pid}: {e}")))?;
    process.use_libc(attached.libc);
    process.reuse_landing(attached.landing);
    install::uninstall(&process, std::slice::from_ref(&attached.hooks_undo))
        .map_err(|e| Failure::runtime(format!("cannot restore the GOT of pid {pid}: {e}")))?;
    let in_flight = take_out(&process, &tids, session_at)?;
    glass_target::test_hook("detach-restored");
    // Only the runtime's own state is left, which no thread can reach any more: the
    // others go now, and one stays to unmap the session and the ledger.
    attachment.release_all_but(caller);
    let all_stopped = stopped.elapsed().as_nanos() as u64;
    // The session ends before the ledger goes: a glass killed in between leaves a
    // ledger whose recovery only repeats what is done, never a session without one.
    let left = leave_runtime(&process, attached.leave);
    if left.is_ok() {
        let _ = process.write(attached.ledger_slot, &0u64.to_le_bytes());
        let (ledger_at, ledger_len) = attached.ledger_at;
        process.unmap(ledger_at, ledger_len);
    }
    return_landing(&process, attached.landing_word);
    left?;
    attachment.release();
    Ok(Detached {
        stopped_ns: all_stopped + code_held.as_nanos() as u64,
        unmap_ns: stopped.elapsed().as_nanos() as u64 - all_stopped,
        in_flight,
        moved,
    })
}

/// AArch64: gives each call in flight of thread `tid` (its shadow entries, as read) its
/// real return address back where the hijacked one is now: in the frame's saved x30
/// (where the function's CFI saves it, else the lowest word of the frame holding the
/// stub) and, for the innermost call, in the x30 register if the function has not saved
/// it (or has reloaded it to return). The address goes back signed as the stub was: a
/// function that signed the stub after the probe took x30 authenticates what it finds,
/// and only the process can sign with its keys (`as_held`, the runtime's
/// glass_probe_as_held, is called in it for those).
#[cfg(target_arch = "aarch64")]
fn give_back_arm(process: &StoppedProcess, tid: i32, entries: &[u8], stub: u64, as_held: u64) {
    use glass_probe_abi::{area, lr_save_words, stripped};
    use glass_target::inject::CallArg;
    let entry = |i: u64| -> [u64; 3] {
        let at = i as usize * area::SHADOW_ENTRY;
        [0, 1, 2]
            .map(|w| u64::from_le_bytes(entries[at + 8 * w..at + 8 * w + 8].try_into().unwrap()))
    };
    let Ok(mut regs) = process.thread_registers(tid) else {
        return;
    };
    let give = |held: u64, real: u64, key: u64| -> Option<u64> {
        if held == stub {
            return Some(real);
        }
        let args = [held, stub, real, key].map(CallArg::Value);
        process.call(as_held, &args, CALL_LIMIT).ok()
    };
    let depth = (entries.len() / area::SHADOW_ENTRY) as u64;
    let mut innermost = true;
    let mut changed = false;
    glass_probe_abi::each_shadow_run(
        depth,
        |i| entry(i)[0],
        regs.sp,
        |first, last, low| {
            let [key, real, _] = entry(first);
            if std::mem::take(&mut innermost) && stripped(regs.regs[30]) == stub {
                if let Some(value) = give(regs.regs[30], real, key) {
                    regs.regs[30] = value;
                    changed = true;
                }
            }
            let words = lr_save_words(entry(last)[2]);
            let slot = if words != 0 {
                let at = key.wrapping_sub(8 * words);
                (at >= low).then_some(at)
            } else {
                (low.next_multiple_of(8)..key)
                    .step_by(8)
                    .find(|&at| process.read_u64(at).is_ok_and(|w| stripped(w) == stub))
            };
            if let Some(at) = slot {
                let held = process.read_u64(at).unwrap_or(0);
                if stripped(held) == stub {
                    if let Some(value) = give(held, real, key) {
                        let _ = process.write(at, &value.to_le_bytes());
                    }
                }
            }
        },
    );
    if changed {
        let _ = process.set_thread_registers(tid, &regs);
    }
}
