//! Taking out what a glass that died attached left in the process, found through the
//! ledger: by the next glass to attach, or by the dead glass's guardian (`take_over`).

use glass_target::attach::Attachment;
use glass_target::inject::StoppedProcess;
use std::path::Path;

use super::*;

/// If the runtime holds a ledger, another glass attached: while it lives, the process is
/// refused (one line, exit 2); if it died, its instrumentation is taken out (every thread
/// stopped, then all but the loader thread let go) and the runtime lets its session go.
/// Returns the dead glass's pid, or None when there was no ledger.
pub(super) fn recover(
    attachment: &mut Attachment,
    process: &StoppedProcess,
    runtime_at: &[u64],
) -> Result<Option<u64>> {
    let pid = process.pid();
    let ledger_at = process.read_u64(runtime_at[LEDGER]).unwrap_or(0);
    let ledger = match ledger_at {
        0 => None,
        at => Ledger::read(process, at).ok().flatten(),
    };
    let Some((ledger, ledger_len)) = ledger else {
        return Ok(None);
    };
    if ledger.writer_alive() && ledger.writer_pid != std::process::id() as u64 {
        return Err(Failure::TracedByAnother(format!(
            "pid {pid} is already being traced by glass pid {}: one glass at a time",
            ledger.writer_pid
        )));
    }
    glass_target::test_hook("recover");
    // Threads made while the injected calls ran are held like the rest.
    attachment.adopt(&process.take_new_peers());
    // A ledger without a session (its glass died before the runtime joined one, or
    // before it patched anything) has nothing to put back.
    if ledger.session != 0 {
        let mappings = glass_target::procfs::executable_mappings(pid).unwrap_or_default();
        let runtime_text = runtime_text(&mappings);
        let regions: Vec<Span> = ledger
            .regions
            .iter()
            .map(|&(start, len)| Span {
                start,
                end: start + len,
            })
            .collect();
        let late =
            ledger.restore.len() - (ledger.unwinder_hooks as usize).min(ledger.restore.len());
        let (code, hooks) = ledger.restore.split_at(late);
        let undo = |restore: &[(u64, Vec<u8>)]| install::Undo {
            restore: restore.to_vec(),
            region: (0, 0),
            moves: Vec::new(),
        };
        restore_code(attachment, process, &[undo(code)], Some(process.tid()))?;
        let back = moves_back(ledger.moves.iter().copied());
        let inside = |rip: u64| within(&regions, rip);
        let leave = Leave {
            inside: &inside,
            spans: &runtime_text,
            moves: &back,
        };
        stop_at_safe_points(attachment, &leave, Some(process.tid()))?;
        install::uninstall(process, &[undo(hooks)])
            .map_err(|e| Failure::runtime(format!("cannot restore the GOT of pid {pid}: {e}")))?;
        take_out(process, &attachment.tids(), ledger.session)?;
    }
    // Ends the session if the runtime joined one (ENOENT if not).
    process
        .call(runtime_at[1], &[], CALL_LIMIT)
        .map_err(|e| Failure::runtime(format!("cannot end the old session in pid {pid}: {e}")))?;
    let _ = process.write(runtime_at[LEDGER], &0u64.to_le_bytes());
    // An older glass's trap page; glass's landing now stays for the process's life.
    if ledger.trap != 0 && ledger.trap != process.landing() {
        process.unmap(ledger.trap, 4096);
    }
    process.unmap(ledger_at, ledger_len);
    attachment.resume_all_but(process.tid());
    Ok(Some(ledger.writer_pid))
}

/// What the guardian does when glass died: if pid's runtime holds a dead glass's ledger,
/// takes that glass's instrumentation out, as the next attach would (and nothing else:
/// no runtime is loaded, no session joined). Returns the dead glass's pid, or None when
/// there was nothing to take out.
pub fn take_over(pid: i32) -> Result<Option<u64>> {
    let Some(runtime_symbols) = FileSymbols::runtime(&RUNTIME_SYMBOLS) else {
        return Ok(None);
    };
    let Some(runtime_at) = runtime_symbols
        .in_process(pid)
        .and_then(|a| a.into_iter().collect::<Option<Vec<u64>>>())
    else {
        return Ok(None);
    };
    let mem = std::fs::File::open(format!("/proc/{pid}/mem"))
        .map_err(|e| Failure::runtime(format!("cannot read the memory of pid {pid}: {e}")))?;
    let word = |at: u64| {
        let mut bytes = [0u8; 8];
        std::os::unix::fs::FileExt::read_exact_at(&mem, &mut bytes, at)
            .map(|()| u64::from_le_bytes(bytes))
            .unwrap_or(0)
    };
    if word(runtime_at[LEDGER]) == 0 {
        return Ok(None);
    }
    let mappings = glass_target::procfs::executable_mappings(pid)
        .map_err(|e| Failure::runtime(format!("cannot read the mappings of pid {pid}: {e}")))?;
    let Some(loader) = loader_functions(pid, &mappings) else {
        return Ok(None);
    };
    let mut attachment = Attachment::seize(pid)?;
    let loader_code = not_for_calls(&mappings);
    let libc_code = spans_of(&mappings, &["libc.so", "libc-", "libdl"]);
    let go_g_offset = crate::select::go_g_offset_of(Path::new(&format!("/proc/{pid}/exe")));
    let loader_tid = pick_loader_thread(&mut attachment, &loader_code, &libc_code, go_g_offset)?;
    let mut process = StoppedProcess::for_thread(pid, loader_tid)
        .map_err(|e| Failure::runtime(format!("cannot open the memory of pid {pid}: {e}")))?;
    process.use_libc(loader.calls);
    process.answer_peers_during_calls(&attachment.tids());
    if !process.reuse_landing(word(runtime_at[LANDING])) {
        let placed = landing_site(pid).is_some_and(|site| {
            process.reuse_landing(site.at) || process.place_landing(site.at).is_ok()
        });
        if !placed {
            process
                .map_landing()
                .map_err(|e| Failure::runtime(format!("cannot map a landing in pid {pid}: {e}")))?;
        }
    }
    let taken = recover(&mut attachment, &process, &runtime_at);
    return_landing(&process, runtime_at[LANDING]);
    attachment.release();
    taken
}
