//! `glass trace --qmp SOCKET --symbols ELF -f GLOBS -d SECONDS`: a QEMU that runs already,
//! traced from outside and left as it was found.
//!
//! Through QEMU's QMP monitor glass hot-plugs its region (`object-add` of a RAM backend
//! and `device_add pc-dimm`: the VM must have been started with a free memory slot,
//! `-m N,slots=1,maxmem=…`, or glass refuses in one line that says so), reads and writes
//! it in QEMU's own memory (process_vm_readv/writev at the host address `gpa2hva` gives),
//! and enables a GDB stub of its own (`gdbserver`), watched by glass-record's guardian:
//! if glass dies while it holds the VM stopped, the guardian lets it run and removes the
//! stub. With every vCPU stopped glass patches as `--vm` does (see the parent module),
//! lets the VM run and drains the ring while it runs. At the end it stops the VM again,
//! puts every patched byte back through the stub, moves any vCPU out of a trampoline's
//! relocated copy, checks that the patched code reads as it did before, removes its stub
//! and lets the VM run. The region stays (a call under way returns through its
//! trampoline), mapped where the guest never looks; the recording says so, and the next
//! trace of the VM uses it again (`layout`).
//!
//! Before the first patched byte glass hands its guardian the ledger of the code it
//! patches: a glass that dies (SIGKILL at any step, or killed by the guardian for
//! holding the VM stopped past the stop bound) has its code put back by the guardian
//! through the stub, every vCPU moved out of the relocated copies, and the stub removed.

use std::cell::RefCell;
use std::time::Instant;

use glass_format::Record;
use glass_mem::process::{read_process, write_process};
use glass_target::arch::VcpuRegs;
use glass_target::gdbstub::client::Client;
use glass_target::gdbstub::ledger::CodeLedger;
use glass_target::guest_code::GuestCode;
use glass_target::qmp::{existing_stub, open_monitor, parse_gpa2hva, Monitor, MonitorError};
use glass_target::stop_mark::StopMark;
use glass_target::test_hook;
use serde_json::json;

use super::layout::{self, RegionAccess};
use super::{
    check_code, choice_arch, choose, counter_hz, drain_until, finish, image_code, patch, replay,
    stub_failure, write_header, Ended,
};
use crate::{Failure, Output, Result, TraceNotes, TraceOptions, Traced};

fn monitor_failure(error: MonitorError) -> Failure {
    match error {
        MonitorError::BadInput(text) => Failure::BadInput(text),
        MonitorError::TimedOut(text) | MonitorError::Failed(text) => Failure::Runtime(text),
    }
}

/// The region in QEMU's memory.
struct ProcessRegion {
    pid: i32,
    host: u64,
}

impl RegionAccess for ProcessRegion {
    fn write(&self, offset: u64, bytes: &[u8]) -> std::result::Result<(), String> {
        write_process(self.pid, self.host + offset, bytes)
            .map(|_| ())
            .map_err(|e| format!("cannot write glass's region in QEMU: {e}"))
    }

    fn load(&self, offset: u64) -> u64 {
        let mut word = [0u8; 8];
        let _ = read_process(self.pid, self.host + offset, &mut word);
        u64::from_le_bytes(word)
    }

    fn store(&self, offset: u64, value: u64) {
        let _ = write_process(self.pid, self.host + offset, &value.to_le_bytes());
    }

    fn read(&self, offset: u64, out: &mut [u8]) {
        if read_process(self.pid, self.host + offset, out).is_err() {
            out.fill(0);
        }
    }

    fn zero(&self, offset: u64, len: u64) {
        if len > 0 {
            let _ = write_process(self.pid, self.host + offset, &vec![0; len as usize]);
        }
    }
}

pub(crate) fn run(args: &TraceOptions, notes: &mut dyn TraceNotes) -> Result<Traced> {
    let symbols = args.symbols.clone().ok_or_else(|| {
        Failure::bad_input("--qmp and --libvirt need --symbols: the guest's ELF image")
    })?;
    let (choice, skipped) = choose(&symbols, &args.functions)?;
    if choice_arch(&choice) == glass_format::Arch::Aarch64 {
        return Err(Failure::bad_input(
            "--qmp and --libvirt trace x86-64 guests: QEMU's virt machine hot-plugs no memory for glass's region without ACPI (firmware); attach to an AArch64 guest with --gdb and --guest-scratch, or launch it with --vm",
        ));
    }
    let (mut monitor, guardian_args) =
        open_monitor(args.qmp.as_deref(), args.libvirt.as_deref()).map_err(Failure::from)?;
    let named = monitor.describe();
    let status = monitor.status().map_err(monitor_failure)?;
    if status != "running" {
        return Err(Failure::bad_input(format!(
            "{named}: the VM is {status} (glass traces a running VM and leaves it as it found it: resume it first)"
        )));
    }
    let chardevs = monitor.hmp("info chardev").map_err(monitor_failure)?;
    if let Some((_, filename)) = existing_stub(&chardevs) {
        return Err(Failure::bad_input(format!(
            "{named}: QEMU already has a GDB stub ({filename}), which glass does not replace: remove it (HMP: gdbserver none)"
        )));
    }
    let file = glass_record::PendingOutput::open(&args.output)?;
    let pid = monitor.qemu_pid();
    let (region_gpa, host, reused) = plug_region(&mut *monitor, &named)?;
    let region = ProcessRegion { pid, host };
    // QEMU creates the socket; glass reaches it through QEMU's root.
    let socket = std::env::temp_dir().join(format!("glass-trace-gdb-{}.sock", std::process::id()));
    let reached = format!("/proc/{pid}/root{}", socket.display());
    let mark = StopMark::create().map_err(|e| Failure::runtime(e.to_string()))?;
    // Before the stub exists: from then on a glass that dies leaves it to the guardian,
    // which lets the VM run and removes the stub.
    let mut guardian = glass_record::guardian::Guardian::start_monitored(
        &reached,
        guardian_args,
        &mark,
        glass_record::stop_bound()?,
    )
    .map_err(|e| Failure::runtime(e.to_string()))?;
    let said = monitor
        .hmp(&format!(
            "gdbserver unix:{},server=on,wait=off",
            socket.display()
        ))
        .map_err(monitor_failure)?;
    let traced = if said.contains("Waiting for gdb connection") {
        let traced = Client::connect_marked(&reached, Some(&mark))
            .map_err(|e| stub_failure("cannot connect to the GDB stub glass enabled", e))
            .and_then(|client| {
                mark.end();
                let client = RefCell::new(client);
                trace_attached(
                    args,
                    notes,
                    Reached {
                        target: &client,
                        region: &region,
                        region_gpa,
                        reused,
                        monitor: Some(&mut *monitor),
                        qemu: pid as u32,
                        named: named.clone(),
                        region_said: format!("a pc-dimm at guest-physical {region_gpa:#x}"),
                    },
                    (&mark, &mut guardian),
                    (&symbols, choice, skipped),
                    file,
                )
            });
        let _ = monitor.hmp("gdbserver none");
        traced
    } else {
        Err(Failure::runtime(format!(
            "{named}: QEMU did not start a GDB stub: {}",
            said.trim().replace('\n', "; ")
        )))
    };
    guardian.done();
    let _ = std::fs::remove_file(&reached);
    traced
}

/// glass's region in the VM: the one an earlier trace added, or a new one. Its
/// guest-physical address, where it lies in QEMU's memory, and whether it was there.
fn plug_region(monitor: &mut dyn Monitor, named: &str) -> Result<(u64, u64, bool)> {
    let devices = monitor
        .qmp("query-memory-devices", None)
        .map_err(monitor_failure)?;
    let earlier = devices.as_array().into_iter().flatten().find_map(|d| {
        let data = d.get("data")?;
        let id = data.get("id")?.as_str()?;
        id.starts_with("glass-dimm-")
            .then(|| data.get("addr").and_then(|a| a.as_u64()))
            .flatten()
    });
    let (gpa, reused) = match earlier {
        Some(gpa) => (gpa, true),
        None => (add_region(monitor, named)?, false),
    };
    let answer = monitor
        .hmp(&format!("gpa2hva {gpa:#x}"))
        .map_err(monitor_failure)?;
    let host = parse_gpa2hva(&answer).ok_or_else(|| {
        Failure::runtime(format!(
            "{named}: QEMU does not say where glass's region is in its memory ({})",
            answer.trim()
        ))
    })?;
    Ok((gpa, host, reused))
}

/// Hot-plugs a new region: its guest-physical address.
fn add_region(monitor: &mut dyn Monitor, named: &str) -> Result<u64> {
    let id = format!("glass-region-{}", std::process::id());
    let dimm = format!("glass-dimm-{}", std::process::id());
    let refused = |why: MonitorError| {
        Failure::bad_input(format!(
            "{named}: QEMU would not add glass's 2 MiB region ({why}): {}",
            if named.starts_with("libvirt") {
                "give the domain a free memory slot (<maxMemory slots='1' unit='MiB'>SIZE+2 or more</maxMemory>, a NUMA <cell>, and <features><acpi/></features>)"
            } else {
                "start the VM with a free memory slot (-m SIZE,slots=1,maxmem=SIZE+2M or more)"
            }
        ))
    };
    monitor
        .qmp(
            "object-add",
            Some(json!({"qom-type": "memory-backend-ram", "id": id, "size": layout::REGION_BYTES})),
        )
        .map_err(refused)?;
    if let Err(why) = monitor.qmp(
        "device_add",
        Some(json!({"driver": "pc-dimm", "id": dimm, "memdev": id})),
    ) {
        let _ = monitor.qmp("object-del", Some(json!({ "id": id })));
        return Err(refused(why));
    }
    let devices = monitor
        .qmp("query-memory-devices", None)
        .map_err(monitor_failure)?;
    devices
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|d| d.get("data"))
        .find(|d| d.get("id").and_then(|i| i.as_str()) == Some(dimm.as_str()))
        .and_then(|d| d.get("addr").and_then(|a| a.as_u64()))
        .ok_or_else(|| Failure::runtime(format!("{named}: the region glass added has no address")))
}

/// The original bytes at each patch, read before it is written.
fn read_originals(
    target: &mut dyn GuestCode,
    patches: &[(u64, Vec<u8>)],
) -> Result<Vec<(u64, Vec<u8>)>> {
    patches
        .iter()
        .map(|(at, bytes)| {
            let original = target
                .read_virtual(*at, bytes.len())
                .map_err(|e| Failure::runtime(format!("cannot read the guest's code: {e}")))?;
            Ok((*at, original))
        })
        .collect()
}

/// The VM an attach reached, however it reached it.
pub(super) struct Reached<'a> {
    /// What glass stops, reads and patches the guest through: the stub connection
    /// glass holds, or Xen.
    pub target: &'a RefCell<dyn GuestCode + 'a>,
    /// glass's region in the guest, and its guest-physical address.
    pub region: &'a dyn RegionAccess,
    pub region_gpa: u64,
    /// The region holds an earlier trace's trampolines, which stay.
    pub reused: bool,
    /// QEMU's monitor, where glass has one: it says how a VM ended.
    pub monitor: Option<&'a mut dyn Monitor>,
    /// QEMU's pid (0: not known, `--gdb`), and how the user named the VM.
    pub qemu: u32,
    pub named: String,
    /// What the region is, for the recording's note ("a pc-dimm at ...").
    pub region_said: String,
}

/// From the VM running, untouched: patch in one stop, drain while it runs, put the code
/// back in one stop. `guardian` holds the ledger meanwhile.
pub(super) fn trace_attached(
    args: &TraceOptions,
    notes: &mut dyn TraceNotes,
    reached: Reached,
    (mark, guardian): (&StopMark, &mut glass_record::guardian::Guardian),
    (symbols, mut choice, mut skipped): (
        &std::path::Path,
        crate::select::ModuleChoice,
        Vec<crate::Skip>,
    ),
    output: glass_record::PendingOutput,
) -> Result<Traced> {
    let Reached {
        target,
        region,
        region_gpa,
        reused,
        mut monitor,
        qemu,
        named,
        region_said,
    } = reached;
    super::end_on_signals();
    let clock_start = (glass_probe_abi::rdtsc(), glass_record::monotonic_now_ns());
    let vcpus = target.borrow().vcpu_count();
    let arch = choice_arch(&choice);
    let mut regs = vec![VcpuRegs::zeroed(arch); vcpus];
    // A first short stop to read the guest's page tables, so that the trampolines are
    // written with the VM running and the stop that patches stays short.
    let (layout, counter_hz) = {
        let mut target = target.borrow_mut();
        mark.begin();
        let looked = target
            .stop_with_registers(&mut regs)
            .map_err(Failure::runtime)
            .and_then(|()| {
                check_long_mode(&regs, arch)?;
                let layout = super::place_region(
                    &mut *target,
                    &regs,
                    region_gpa,
                    &mut choice,
                    &mut skipped,
                )?;
                Ok((layout, counter_hz(&mut *target, arch)?))
            });
        let resumed = target.resume();
        mark.end();
        let looked = looked?;
        resumed.map_err(Failure::runtime)?;
        looked
    };
    if let Some(note) = choice.far_note() {
        notes.note(&note);
    }
    let mut image = vec![0u8; layout::IMAGE_BYTES as usize];
    if reused {
        region.read(0, &mut image[..layout::HEADER_BYTES as usize]);
    }
    let installation = layout
        .install(&mut image, &choice, symbols, &mut skipped)
        .map_err(Failure::runtime)?;
    let image_code = image_code(symbols, &installation.patches)?;
    for range in installation.written() {
        region
            .write(
                range.start,
                &image[range.start as usize..range.end as usize],
            )
            .map_err(Failure::runtime)?;
    }
    let mut guest = target.borrow_mut();
    mark.begin();
    let attach_started = Instant::now();
    guest
        .stop_with_registers(&mut regs)
        .map_err(Failure::runtime)?;
    test_hook("guest-attach-stopped");
    let held = (|| {
        check_long_mode(&regs, arch)?;
        let originals = read_originals(&mut *guest, &installation.patches)?;
        check_code(symbols, &originals, &image_code, &installation.installed)?;
        let ledger = installation.ledger(originals);
        // Told before the first byte changes: from here a glass that dies has its
        // guardian put the code back.
        guardian.tell(&ledger).map_err(|e| {
            Failure::runtime(format!("cannot hand glass's guardian its ledger: {e}"))
        })?;
        patch(
            &mut *guest,
            &layout,
            &installation.patches,
            &installation.moves,
        )?;
        test_hook("guest-attach-patched");
        // Nothing refused: the recording begins (a refusal left a recording already at
        // that path whole). If the file cannot be emptied, the code goes back first.
        match output.start() {
            Ok(file) => Ok((ledger, file)),
            Err(failure) => {
                let _ = ledger.put_back(&mut *guest);
                Err(Failure::from(failure))
            }
        }
    })();
    let (ledger, file) = match held {
        Ok(held) => held,
        Err(failure) => {
            let _ = guest.resume();
            mark.end();
            return Err(failure);
        }
    };
    // Still stopped: the records reserved so far are an earlier trace's. (The region's
    // reads go through the stub connection `guest` holds, with `--gdb`.)
    drop(guest);
    let patched_at = layout::ring_head(region);
    let mut guest = target.borrow_mut();
    guest.resume().map_err(Failure::runtime)?;
    mark.end();
    drop(guest);
    let attach_ms = attach_started.elapsed().as_secs_f64() * 1e3;
    let installed = installation.installed;
    notes.instrumented(&installed, &skipped);
    notes.note(&format!(
        "attached to {named}: the VM stopped {attach_ms:.1} ms to patch{}",
        if reused {
            " (in glass's region of an earlier trace)"
        } else {
            ""
        }
    ));

    let mut out = Output::new(file, 1);
    write_header(&mut out, args, (qemu, arch), &installed, &skipped);
    // As `glass trace --pid` says what it attached to: the process record's name.
    out.write(&Record::Process(glass_format::Process {
        time_ns: 0,
        pid: qemu,
        parent_pid: 0,
        kind: glass_format::ProcessKind::Attached,
        name: if qemu != 0 {
            format!("QEMU (pid {qemu}), {named}")
        } else {
            named.clone()
        },
    }));
    let mut replay = replay::Replay::default();
    let mut ring = layout::RingReader::resuming(region, patched_at);
    let mut hooked = false;
    let why = drain_until(
        (region, &mut ring, &mut replay, &mut out),
        qemu,
        args.duration,
        || {
            if !std::mem::replace(&mut hooked, true) {
                test_hook("guest-tracing");
            }
            match monitor.as_deref_mut() {
                Some(monitor) => monitor.ending().map(|_| Ended::Exited(0)),
                None => target.borrow_mut().is_gone().then_some(Ended::Exited(0)),
            }
        },
    );
    if matches!(why, Ended::Exited(_)) {
        return Err(Failure::runtime(format!(
            "{named}: the VM ended while traced"
        )));
    }
    mark.begin();
    let detach_started = Instant::now();
    let mut guest = target.borrow_mut();
    let restored = restore(&mut *guest, &ledger, vcpus);
    drop(guest);
    ring.drain(region, &mut replay);
    replay.take(|stack, words| out.chunk(qemu, stack, words));
    let _ = target.borrow_mut().detach();
    mark.end();
    let restored = restored?;
    if ring.set_aside() > 0 {
        notes.note(&format!(
            "set aside {} records an earlier trace of this VM left in the ring (calls it timed after its last read)",
            ring.set_aside()
        ));
    }
    notes.note(&format!(
        "detached: the VM stopped {:.1} ms to restore {} patched byte ranges ({} vCPUs moved out of the trampolines); the code reads as before",
        detach_started.elapsed().as_secs_f64() * 1e3,
        ledger.code.len(),
        restored
    ));
    out.write(&Record::Note(format!(
        "glass's 2 MiB region stays in the VM ({region_said}, mapped at {:#x} through {}): calls under way when glass detached return through its trampolines, and the next glass trace of this VM uses it again",
        layout.base(),
        layout.hang()
    )));
    let summary = finish(
        &mut out,
        args,
        (clock_start, counter_hz),
        &ring,
        &replay,
        installed.len(),
        skipped.len(),
        0,
    )?;
    Ok(Traced {
        exit_status: 0,
        records: out.records,
        summary,
        generic_timer: counter_hz.is_some(),
    })
}

/// Whether the guest runs 64-bit code on one set of page tables, the ones glass maps
/// its region into (vCPU 0's): a vCPU still in real or protected mode (a guest booting,
/// or not 64-bit) would leave glass reading page tables that are not there, and one on
/// other page tables would fault at its first traced call. A vCPU not yet started (in
/// the firmware's real mode, paging off) runs none of the guest's code.
fn check_long_mode(regs: &[VcpuRegs], arch: glass_format::Arch) -> Result<()> {
    let long = |r: &VcpuRegs| matches!(r, VcpuRegs::X86_64(x) if x.long_mode());
    let cr3 = |r: &VcpuRegs| match r {
        VcpuRegs::X86_64(x) => x.cr3 & 0x000f_ffff_ffff_f000,
        _ => 0,
    };
    match (regs.first(), arch) {
        (Some(VcpuRegs::Aarch64(_)), glass_format::Arch::Aarch64) => return check_aarch64(regs),
        (Some(VcpuRegs::Aarch64(_)), _) => {
            return Err(Failure::bad_input(
                "an AArch64 guest, and --symbols is an x86-64 image: give the guest's own",
            ))
        }
        (_, glass_format::Arch::Aarch64) => {
            return Err(Failure::bad_input(
                "an x86-64 guest, and --symbols is an AArch64 image: give the guest's own",
            ))
        }
        _ => {}
    }
    if !regs.first().is_some_and(long) {
        return Err(Failure::bad_input(
            "vCPU 0 runs outside long mode (a guest still in its firmware or boot code, or not a 64-bit one): glass traces 64-bit guests; attach once the guest runs its own code",
        ));
    }
    if let Some(other) = regs
        .iter()
        .position(|r| r.paging_on() && (!long(r) || cr3(r) != cr3(&regs[0])))
    {
        return Err(Failure::bad_input(format!(
            "vCPU {other} runs on other page tables than vCPU 0 (or outside long mode): glass maps its region into one set of page tables, as a unikernel has"
        )));
    }
    Ok(())
}

/// An AArch64 guest's counterpart of [`check_long_mode`]: vCPU 0 has its MMU on, and
/// every vCPU that has shares its translation tables (glass maps its region into vCPU
/// 0's); a vCPU not yet started (MMU off) runs none of the guest's code.
fn check_aarch64(regs: &[VcpuRegs]) -> Result<()> {
    let tables = |r: &VcpuRegs| match r {
        VcpuRegs::Aarch64(a) if a.mmu_on() => Some((
            a.ttbr0_el1 & 0x0000_ffff_ffff_fffe,
            a.ttbr1_el1 & 0x0000_ffff_ffff_fffe,
            a.tcr_el1,
        )),
        _ => None,
    };
    let Some(first) = regs.first().and_then(tables) else {
        return Err(Failure::bad_input(
            "vCPU 0 has its MMU off (a guest still booting): glass traces guests that map their code; attach once the guest runs its own code",
        ));
    };
    if let Some(other) = regs
        .iter()
        .position(|r| tables(r).is_some_and(|t| t != first))
    {
        return Err(Failure::bad_input(format!(
            "vCPU {other} runs on other translation tables than vCPU 0: glass maps its region into one set of tables, as a unikernel has"
        )));
    }
    Ok(())
}

/// Stops the VM and puts the code back (see [`CodeLedger::put_back`]): how many vCPUs
/// were moved out of the trampolines.
fn restore(guest: &mut dyn GuestCode, ledger: &CodeLedger, vcpus: usize) -> Result<usize> {
    let mut regs = vec![VcpuRegs::zeroed(glass_target::guest::Arch::X86_64); vcpus];
    guest
        .stop_with_registers(&mut regs)
        .map_err(Failure::runtime)?;
    test_hook("guest-detach-stopped");
    let moved = ledger.put_back(guest).map_err(Failure::runtime)?;
    test_hook("guest-detach-restored");
    Ok(moved)
}
