//! The VM-guest loop: sample a guest through its VMM's GDB stub.
//!
//! At each tick: stop the VM, read each vCPU's registers (one `g` per vCPU), copy the
//! top of each vCPU's stack — from the guest's RAM mapping through glass's own page-table
//! walk and translation cache when `--guest-memory` is given, through `m` packets
//! otherwise — and let the VM run. Unwinding (DWARF CFI from the guest ELF, frame
//! pointers where there is none) and writing happen after the guest runs again, in the
//! same sink as for processes. A vCPU is recorded as thread `vcpuN` (tid N+1) of one
//! process named after the guest ELF.

use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use glass_format::ProcessKind;
use glass_mem::ram::{qemu_x86_layout, GuestRam};
use glass_mem::{PagingMode, TranslationCache};
use glass_target::gdbstub::client::{Client, StubError, VcpuRegs};
use glass_target::procfs::Mapping;
use glass_target::TargetError;
use glass_unwind::UnwindRegs;
use nix::sys::signalfd::SignalFd;
use object::{Object, ObjectSegment, SegmentFlags};

use super::sink::Sink;
use super::{
    finish, poll_readable, read_expirations, take_stop_signal, tick_timer, unwind_name, Outcome,
};
use crate::error::Result;

/// The pid the guest is recorded under (a guest has no host process of its own).
const GUEST_PID: i32 = 1;
/// Stack bytes copied per vCPU per sample.
const STACK_COPY: usize = 16 << 10;
/// Stack bytes read through the stub when RAM is not mapped: one `m` packet.
const SLOW_PATH_COPY: usize = 1024;
/// QEMU's i440fx keeps RAM below 3.5 GiB under 4 GiB (the PCI hole above it).
const QEMU_BELOW_4G: u64 = 0xe000_0000;

fn stub_failed(error: StubError) -> TargetError {
    TargetError::Io(std::io::Error::other(error.to_string()))
}

/// The executable segments of the guest ELF, as mappings at their link addresses.
fn guest_mappings(path: &std::path::Path) -> std::result::Result<Vec<Mapping>, TargetError> {
    let bytes = std::fs::read(path)
        .map_err(|e| TargetError::BadArgument(format!("{}: {e}", path.display())))?;
    let elf = object::File::parse(&*bytes).map_err(|e| {
        TargetError::BadArgument(format!("{}: not an ELF file ({e})", path.display()))
    })?;
    let mappings: Vec<Mapping> = elf
        .segments()
        .filter(|s| matches!(s.flags(), SegmentFlags::Elf { p_flags, .. } if p_flags.0 & object::elf::PF_X.0 != 0))
        .map(|s| Mapping {
            start: s.address(),
            end: s.address() + s.size(),
            file_offset: s.file_range().0,
            path: path.to_string_lossy().into_owned(),
            deleted: false,
        })
        .collect();
    if mappings.is_empty() {
        return Err(TargetError::BadArgument(format!(
            "{}: no executable segment",
            path.display()
        )));
    }
    Ok(mappings)
}

pub fn record(
    mut sink: Sink,
    stop_signals: &SignalFd,
) -> std::result::Result<Result<i32>, TargetError> {
    let args = sink.args;
    let address = args.gdb.clone().unwrap_or_default();
    let symbols = args.symbols.clone().unwrap_or_default();
    let mappings = guest_mappings(&symbols)?;
    let ram = match &args.guest_memory {
        Some(path) => {
            let size = std::fs::metadata(path)
                .map_err(|e| TargetError::BadArgument(format!("{}: {e}", path.display())))?
                .len();
            Some(
                GuestRam::open(path, qemu_x86_layout(size, QEMU_BELOW_4G))
                    .map_err(TargetError::Io)?,
            )
        }
        None => None,
    };
    let mut client = Client::connect(&address).map_err(stub_failed)?;
    let outcome = match run(
        &mut sink,
        &mut client,
        ram.as_ref(),
        mappings,
        &symbols,
        stop_signals,
    ) {
        Ok(outcome) => outcome,
        Err(error) => Outcome::WriteFailed(error),
    };
    // Whatever ended the recording, the guest runs on.
    let _ = client.detach();
    Ok(finish(sink, outcome, None, "gdbstub"))
}

fn run(
    sink: &mut Sink,
    client: &mut Client,
    ram: Option<&GuestRam>,
    mappings: Vec<Mapping>,
    symbols: &std::path::Path,
    stop_signals: &SignalFd,
) -> std::io::Result<Outcome> {
    let args = sink.args;
    sink.write_meta("gdbstub", unwind_name(args.unwind), 0)?;
    // Guest addresses are not host processes: never consult /proc for them.
    sink.without_proc();
    let name = symbols
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "guest".into());
    sink.process_named(GUEST_PID, 0, ProcessKind::Attached, 0, false, name)?;
    for mapping in mappings {
        sink.add_mapping(GUEST_PID, mapping, 0)?;
    }
    let vcpus = client.vcpus.len();
    for vcpu in 0..vcpus {
        sink.thread_name(GUEST_PID, vcpu as i32 + 1, format!("vcpu{vcpu}"))?;
    }
    let timer = tick_timer(args.frequency)?;
    let deadline = args
        .duration
        .map(|s| sink.origin + Duration::from_secs_f64(s.max(0.0)));
    let mut cache = TranslationCache::new();
    let mut stacks: Vec<Vec<u8>> = vec![vec![0; STACK_COPY]; vcpus];
    let mut regs: Vec<VcpuRegs> = vec![VcpuRegs::default(); vcpus];
    let mut lengths = vec![0usize; vcpus];
    loop {
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return Ok(Outcome::DurationElapsed);
        }
        let wait_ms = deadline.map_or(500, |d| {
            d.saturating_duration_since(now).as_millis().min(500) as i32 + 1
        });
        let ready = poll_readable(&[timer.as_raw_fd(), stop_signals.as_raw_fd()], wait_ms);
        if ready[1] {
            if let Some(signal) = take_stop_signal(stop_signals) {
                return Ok(Outcome::Signalled(signal));
            }
        }
        if !ready[0] {
            continue;
        }
        let expirations = read_expirations(&timer);
        if expirations == 0 {
            continue;
        }
        sink.missed_deadlines += expirations - 1;

        // The stopped window: registers and stack copies only.
        let stopped_at = Instant::now();
        let taken = take_sample(
            client,
            ram,
            &mut cache,
            &mut regs,
            &mut stacks,
            &mut lengths,
        );
        let resumed = client.resume();
        let stopped_ns = stopped_at.elapsed().as_nanos() as u64;
        if let Err(error) = taken.and(resumed) {
            // The stub went away (the VM exited, or the connection broke).
            eprintln!("glass: {error}; ending the recording");
            return Ok(Outcome::TargetExited);
        }
        sink.tick(stopped_ns);
        let time_ns = sink.ns_since_origin(stopped_at);
        for vcpu in 0..vcpus {
            let r = regs[vcpu];
            let unwind = UnwindRegs {
                ip: r.ip,
                sp: r.sp,
                fp: r.fp,
            };
            sink.stack_sample(
                GUEST_PID,
                vcpu as i32 + 1,
                time_ns,
                stopped_ns as u32,
                false,
                unwind,
                &stacks[vcpu][..lengths[vcpu]],
            )?;
        }
        if let Some(dead) = deadline {
            if Instant::now() >= dead {
                return Ok(Outcome::DurationElapsed);
            }
        }
    }
}

fn take_sample(
    client: &mut Client,
    ram: Option<&GuestRam>,
    cache: &mut TranslationCache,
    regs: &mut [VcpuRegs],
    stacks: &mut [Vec<u8>],
    lengths: &mut [usize],
) -> std::result::Result<(), StubError> {
    client.stop()?;
    for vcpu in 0..regs.len() {
        let r = client.registers(vcpu)?;
        regs[vcpu] = r;
        lengths[vcpu] = match ram {
            Some(ram) => cache.read_virtual(
                ram,
                r.cr3,
                PagingMode::from_cr4(r.cr4),
                r.sp,
                &mut stacks[vcpu],
            ),
            None => {
                // Replies are limited by the stub's packet size (hex doubles the bytes).
                let bytes = client.read_memory(r.sp, SLOW_PATH_COPY)?;
                stacks[vcpu][..bytes.len()].copy_from_slice(&bytes);
                bytes.len()
            }
        };
    }
    Ok(())
}
