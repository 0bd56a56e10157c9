//! Unwinding the raw snapshots of a `--capture raw` recording, when the report is made.
//!
//! Each snapshot is expanded and unwound with the unwind tables of the modules that
//! were mapped in its process at its time (read from the files now, as the symbolizer
//! does). The work is split across all cores; each worker keeps one unwinder per
//! address space, so each module's tables are indexed once per worker.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicUsize, Ordering};

use glass_format::{Arch, Recording, Sample, Snapshot, SAMPLE_TRUNCATED};
use glass_unwind::snapshot::expand;
use glass_unwind::{DwarfUnwinder, UnwindRegs};

use crate::modules::ModuleTimeline;

/// Shows progress on stderr (when it is a terminal) for reports with more snapshots.
const PROGRESS_FROM: usize = 20_000;

fn unwinder_for(timeline: &ModuleTimeline, snapshot: &Snapshot, arch: Arch) -> DwarfUnwinder {
    let mut unwinder = DwarfUnwinder::for_arch(arch);
    for module in timeline.in_force(snapshot.pid, snapshot.time_ns) {
        if module.path.starts_with('[') || unwinder.has_module(module.start) {
            continue;
        }
        // A module whose file is gone unwinds by frame pointers. The file is mapped,
        // not read: only its unwind sections are touched (a read copied whole
        // binaries, once per worker, into fresh memory).
        let Ok(file) = std::fs::File::open(&module.path) else {
            continue;
        };
        // SAFETY: a read-only map of a regular file, dropped before this returns; a file
        // truncated meanwhile could fault, as it would for the symbolizer's maps.
        let Ok(map) = (unsafe { memmap2::Mmap::map(&file) }) else {
            continue;
        };
        let _ = unwinder.add_module_bytes(
            &module.path,
            &map,
            module.start,
            module.end,
            module.file_offset,
        );
    }
    unwinder
}

fn unwind_one(
    snapshot: &Snapshot,
    unwinder: &mut DwarfUnwinder,
    stack: &mut Vec<u8>,
    max_depth: usize,
) -> Sample {
    let mut frames = Vec::new();
    let truncated = match expand(&snapshot.stack, stack) {
        Some(()) => {
            let sp = snapshot.sp;
            let bytes = &stack[..];
            let mut read = |address: u64| -> Option<u64> {
                let offset = usize::try_from(address.checked_sub(sp)?).ok()?;
                Some(u64::from_le_bytes(
                    bytes.get(offset..offset.checked_add(8)?)?.try_into().ok()?,
                ))
            };
            let regs = UnwindRegs {
                lr: snapshot.lr,
                ..UnwindRegs::new(snapshot.ip, snapshot.sp, snapshot.fp)
            };
            unwinder
                .walk(regs, &mut read, max_depth, &mut frames)
                .is_truncated()
        }
        None => {
            frames.push(snapshot.ip);
            true
        }
    };
    Sample {
        time_ns: snapshot.time_ns,
        pid: snapshot.pid,
        tid: snapshot.tid,
        stopped_ns: snapshot.stopped_ns,
        flags: snapshot.flags | if truncated { SAMPLE_TRUNCATED } else { 0 },
        frames,
    }
}

/// The frames of every snapshot, as samples, in recording order.
pub fn unwind_snapshots(recording: &Recording) -> Vec<Sample> {
    let snapshots = &recording.snapshots;
    if snapshots.is_empty() {
        return Vec::new();
    }
    let timeline = ModuleTimeline::new(recording);
    let max_depth = recording
        .meta
        .as_ref()
        .map_or(512, |m| m.max_depth as usize)
        .max(1);
    // The snapshots' registers and stacks are of this architecture (a guest's may not
    // be the host's).
    let arch = recording.meta.as_ref().map_or(Arch::host(), |m| m.arch);
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(snapshots.len());
    let chunk = snapshots.len().div_ceil(workers);
    let done = AtomicUsize::new(0);
    let show_progress = snapshots.len() >= PROGRESS_FROM && std::io::stderr().is_terminal();
    let mut results: Vec<Vec<Sample>> = Vec::new();
    std::thread::scope(|scope| {
        let handles: Vec<_> = snapshots
            .chunks(chunk)
            .map(|part| {
                let timeline = &timeline;
                let done = &done;
                scope.spawn(move || {
                    let mut unwinders: HashMap<(u32, Option<u64>), DwarfUnwinder> = HashMap::new();
                    let mut stack = Vec::new();
                    let mut out = Vec::with_capacity(part.len());
                    for (i, snapshot) in part.iter().enumerate() {
                        let key = (snapshot.pid, timeline.epoch(snapshot.pid, snapshot.time_ns));
                        let unwinder = unwinders
                            .entry(key)
                            .or_insert_with(|| unwinder_for(timeline, snapshot, arch));
                        out.push(unwind_one(snapshot, unwinder, &mut stack, max_depth));
                        if i % 1024 == 1023 {
                            let total = done.fetch_add(1024, Ordering::Relaxed) + 1024;
                            if show_progress {
                                eprint!("\rglass: unwinding stacks {total}/{}", snapshots.len());
                            }
                        }
                    }
                    out
                })
            })
            .collect();
        results = handles
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect();
    });
    if show_progress {
        eprintln!("\rglass: unwound {} stacks{:>20}", snapshots.len(), "");
    }
    results.into_iter().flatten().collect()
}
