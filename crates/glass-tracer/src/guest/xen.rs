//! `glass trace --xen DOMAIN --symbols ELF -f GLOBS -d SECONDS`: a Xen PVH or HVM guest
//! (x86-64), or an ARM64 domU (glass's aarch64 build in an ARM64 dom0), traced from
//! dom0, through the hypervisor alone.
//!
//! glass adds 2 MiB of frames to the domain above all its memory (`XEN_DOMCTL_max_mem`,
//! `XENMEM_populate_physmap`: glass_target's `xen::code`), maps them writable into
//! itself with libxenforeignmemory, and drains the ring from that mapping while the
//! guest runs, never pausing it to read. Pauses, registers and the guest's own memory
//! go through the same hypercalls as `glass record --xen`. Everything else is the attach
//! of `--qmp` (the parent's `attach` module): patch in one pause, put back in one pause,
//! the guardian holding the ledger and putting the code back if glass dies. A second
//! trace finds the region by its mark and uses it again.
//!
//! On ARM64 the region is mapped into the guest as for `--vm` on `virt` (the parent's
//! `aarch64` module: one 2 MiB block in a free entry of a level-2 table of the guest's,
//! within a branch of the code), the frames being the 2 MiB Xen added at 4 GiB, above
//! the domU's RAM bank 0 (Xen's guest memory map puts bank 1 at 8 GiB).
//!
//! What differs from QEMU: Xen has no call that moves an HVM vCPU's pc without
//! reloading other state (see `xen::code`), so a vCPU inside the bytes about to be
//! patched, or inside a relocated copy at detach, is let run a moment until it has
//! left.

use std::cell::RefCell;

use glass_target::stop_mark::StopMark;
use glass_target::xen::code::XenCode;

use super::attach::{trace_attached, Reached};
use super::choose;
use super::layout::{self, RegionAccess, Words};
use crate::{Failure, Result, TraceNotes, TraceOptions, Traced};

pub(crate) fn run(args: &TraceOptions, notes: &mut dyn TraceNotes, spec: &str) -> Result<Traced> {
    let symbols = args
        .symbols
        .clone()
        .ok_or_else(|| Failure::bad_input("--xen needs --symbols: the guest's ELF image"))?;
    let (choice, skipped) = choose(&symbols, &args.functions)?;
    let file = glass_record::PendingOutput::open(&args.output)?;
    let (mut code, name) = XenCode::open(spec, None).map_err(Failure::starting)?;
    let domid = code.domid();
    let _only_tracer = claim(domid)?;
    let mark = StopMark::create().map_err(|e| Failure::runtime(e.to_string()))?;
    // Before the first pause: a glass that dies from here on has its guardian put back
    // what it patched and let the domain run.
    let mut guardian =
        glass_record::guardian::Guardian::start_xen(domid, &mark, glass_record::stop_bound()?)
            .map_err(|e| Failure::runtime(e.to_string()))?;
    let traced = (|| {
        let (gpa, reused) = code
            .add_region(layout::REGION_BYTES, &layout::is_glass_region)
            .map_err(Failure::runtime)?;
        let mapping = code
            .map(gpa, layout::REGION_BYTES)
            .map_err(Failure::runtime)?;
        let region = Words(mapping.as_slice());
        if !reused {
            // Frames Xen just gave the domain: not necessarily zeroed (a host booted
            // without scrubbing hands out what was there).
            region.zero(0, layout::REGION_BYTES);
        }
        let code = RefCell::new(code);
        trace_attached(
            args,
            notes,
            Reached {
                target: &code,
                region: &region,
                region_gpa: gpa,
                reused,
                monitor: None,
                qemu: 0,
                named: format!("Xen domain {name} (id {domid})"),
                region_said: format!("2 MiB glass added to the domain at guest-physical {gpa:#x}"),
            },
            (&mark, &mut guardian),
            (&symbols, choice, skipped),
            file,
        )
    })();
    guardian.done();
    traced
}

/// One glass trace of a domain at a time: a second one would find the first one's jumps
/// where it expects the ELF's code. Every glass that controls a domain runs in the same
/// dom0, so a lock file there says who traces it; the kernel drops the lock when the
/// holder dies, whatever kills it.
fn claim(domid: u32) -> Result<std::fs::File> {
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsRawFd;
    let dir = if std::path::Path::new("/run/lock").is_dir() {
        "/run/lock"
    } else {
        "/tmp"
    };
    let path = format!("{dir}/glass-trace-xen-{domid}");
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| Failure::runtime(format!("cannot open {path}: {e}")))?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let mut holder = String::new();
        let _ = file.read_to_string(&mut holder);
        return Err(Failure::bad_input(format!(
            "Xen domain {domid} is being traced by another glass (pid {}): one trace of a domain at a time",
            holder.trim()
        )));
    }
    let _ = file.set_len(0);
    let _ = file.rewind();
    let _ = write!(file, "{}", std::process::id());
    Ok(file)
}
