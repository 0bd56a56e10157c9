//! Safe points: every thread stopped where none resumes inside bytes glass is about to
//! replace or take out. Threads are moved between a function's original bytes and their
//! relocated copy (never single-stepped); threads in the probe runtime are let run alone
//! until they are out.

use std::time::Duration;

use glass_target::attach::Attachment;
use glass_target::thread_state::{set_pc, thread_state};

use super::*;

/// How many times glass stops every thread looking for a moment when none is where it
/// must not be (inside the probe runtime or the trampolines, at detach), letting them
/// run 1 ms between tries. The probes never block, so a thread is seldom there twice.
pub(super) const SAFE_POINT_TRIES: usize = 2000;

/// Places threads must not resume in, and where each place of them moves a thread to.
pub(super) struct Leave<'a> {
    /// Where a thread must not resume: it is moved (see `moves`).
    pub(super) inside: &'a dyn Fn(u64) -> bool,
    /// Where a thread must not be at all, and cannot be moved from: the threads are let
    /// run until none is there.
    pub(super) spans: &'a [Span],
    pub(super) moves: &'a std::collections::HashMap<u64, u64>,
}

/// With every thread stopped: moves each thread whose resume points lie where
/// `leave.inside` says to the same place in the other copy of the code (`leave.moves`):
/// into the trampolines' relocated instructions before the patches are written, back
/// into the original code before they are taken out. Never single-steps: a thread being
/// stepped when glass dies is killed by the kernel. Returns how many were moved, or
/// (nothing changed) the threads inside `leave.spans` or that could not be moved.
pub(super) fn move_out(
    attachment: &Attachment,
    leave: &Leave,
) -> Result<std::result::Result<usize, Vec<i32>>> {
    let mut planned = Vec::new();
    let mut in_the_way = Vec::new();
    for tid in attachment.tids() {
        // Where it resumes: its pc and, stopped in a system call the kernel will restart,
        // the system call instruction before it, to which the kernel moves it back when
        // it runs again: a thread blocked right after bytes glass replaces would
        // otherwise restart inside the new ones.
        let Ok(state) = thread_state(tid) else {
            continue;
        };
        let points = state.resume_points();
        if points.iter().any(|&p| within(leave.spans, p)) {
            in_the_way.push(tid);
            continue;
        }
        if !points.into_iter().any(leave.inside) {
            continue;
        }
        // The thread's own pc moves; a restart the kernel has yet to make goes back
        // from there, to the other copy's system call instruction.
        match leave.moves.get(&state.pc) {
            Some(&to) => planned.push((tid, to)),
            None => in_the_way.push(tid),
        }
    }
    if !in_the_way.is_empty() {
        return Ok(Err(in_the_way));
    }
    for &(tid, to) in &planned {
        set_pc(tid, to).map_err(|e| Failure::runtime(format!("cannot move thread {tid}: {e}")))?;
    }
    Ok(Ok(planned.len()))
}

/// Stops every thread with none left where `leave` says (those that can be are moved,
/// see [`move_out`]); returns how many were moved. The threads in the way (in the probe
/// runtime, or between two instructions a move cannot map) are let run for a moment on
/// their own, the others held, and stopped again: the probes never block, so a thread
/// is out of them in microseconds. Every so often all of them run (all but `keep`), in
/// case one waits for another.
pub(super) fn stop_at_safe_points(
    attachment: &mut Attachment,
    leave: &Leave,
    keep: Option<i32>,
) -> Result<usize> {
    for attempt in 0..SAFE_POINT_TRIES {
        attachment.stop_all()?;
        let in_the_way = match move_out(attachment, leave)? {
            Ok(moved) => return Ok(moved),
            Err(in_the_way) => in_the_way,
        };
        let let_run = match attempt % 10 {
            9 => attachment.tids(),
            _ => in_the_way,
        };
        // The thread injected calls run in stays where it was found safe for them.
        for tid in let_run {
            if Some(tid) != keep {
                attachment.resume(tid);
            }
        }
        std::thread::sleep(Duration::from_micros(if attempt % 10 == 9 {
            1000
        } else {
            100
        }));
    }
    Err(Failure::runtime(
        "a thread stayed inside code glass must change or take out (blocked in a system call there)",
    ))
}

/// The moves that take threads out of the trampolines: `moves` read backwards.
pub(super) fn moves_back(
    moves: impl Iterator<Item = (u64, u64)>,
) -> std::collections::HashMap<u64, u64> {
    moves
        .map(|(original, relocated)| (relocated, original))
        .collect()
}
