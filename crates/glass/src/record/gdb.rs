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
use super::{finish, poll_readable, take_stop_signal, unwind_name, Outcome, Ticker};
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
    if !bytes.starts_with(b"\x7fELF") {
        // An `nm -n` / System.map table: one mapping over its text symbols (no unwind
        // tables: frame pointers only).
        let table = glass_symbols::nm_table(&path.to_string_lossy()).ok_or_else(|| {
            TargetError::BadArgument(format!(
                "{}: neither an ELF file nor an nm -n symbol table",
                path.display()
            ))
        })?;
        let start = table.first().map_or(0, |s| s.0);
        let end = table.last().map_or(start, |s| s.0 + s.1);
        return Ok(vec![Mapping {
            start,
            end,
            file_offset: 0,
            path: path.to_string_lossy().into_owned(),
            deleted: false,
        }]);
    }
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
    sink: Sink,
    stop_signals: &SignalFd,
) -> std::result::Result<Result<i32>, TargetError> {
    let args = sink.args;
    let address = args.gdb.clone().unwrap_or_default();
    let symbols = args.symbols.clone().unwrap_or_default();
    let ram = match &args.guest_memory {
        Some(path) => Some(map_ram(path)?),
        None => None,
    };
    // Before the first connection stops the VM: from here on, a glass that dies leaves
    // the VM to the guardian, which lets it run.
    let guardian = super::guardian::Guardian::start(&address, false, false)?;
    let sampled = sample_guest(sink, &address, ram, &symbols, stop_signals, None);
    // Every way out of sample_guest leaves the VM running (or never stopped it).
    guardian.done();
    let (sink, outcome) = sampled?;
    Ok(finish(sink, outcome, None, "gdbstub"))
}

pub(super) fn map_ram(path: &std::path::Path) -> std::result::Result<GuestRam, TargetError> {
    let size = std::fs::metadata(path)
        .map_err(|e| TargetError::BadArgument(format!("{}: {e}", path.display())))?
        .len();
    GuestRam::open(path, qemu_x86_layout(size, QEMU_BELOW_4G)).map_err(TargetError::Io)
}

/// Connects, samples until the end, and lets the guest go. `vm` is the QEMU glass
/// launched, whose exit ends the recording.
pub(super) fn sample_guest<'a>(
    mut sink: Sink<'a>,
    address: &str,
    ram: Option<GuestRam>,
    symbols: &std::path::Path,
    stop_signals: &SignalFd,
    vm: Option<&mut std::process::Child>,
) -> std::result::Result<(Sink<'a>, Outcome), TargetError> {
    let mappings = guest_mappings(symbols)?;
    let mut client = Client::connect(address).map_err(stub_failed)?;
    let outcome = match run(
        &mut sink,
        &mut client,
        ram.as_ref(),
        mappings,
        symbols,
        stop_signals,
        vm,
    ) {
        Ok(outcome) => outcome,
        Err(error) => Outcome::WriteFailed(error),
    };
    if matches!(outcome, Outcome::StubLost) {
        // The VM may have been stopped when the connection broke, and QEMU leaves it
        // stopped: connect again (the handshake resumes it) and detach.
        drop(client);
        match Client::connect(address).and_then(|mut again| again.detach()) {
            Ok(()) => eprintln!("glass: reconnected to the GDB stub and let the guest run"),
            Err(error) => eprintln!("glass: could not reconnect to let the guest run: {error}"),
        }
    } else {
        // Whatever else ended the recording, the guest runs on.
        let _ = client.detach();
    }
    Ok((sink, outcome))
}

fn run(
    sink: &mut Sink,
    client: &mut Client,
    ram: Option<&GuestRam>,
    mappings: Vec<Mapping>,
    symbols: &std::path::Path,
    stop_signals: &SignalFd,
    vm: Option<&mut std::process::Child>,
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
    let text: Vec<(u64, u64)> = mappings.iter().map(|m| (m.start, m.end)).collect();
    for mapping in mappings {
        sink.add_mapping(GUEST_PID, mapping, 0)?;
    }
    let vcpus = client.vcpus.len();
    for vcpu in 0..vcpus {
        sink.thread_name(GUEST_PID, vcpu as i32 + 1, format!("vcpu{vcpu}"))?;
    }
    let timer = Ticker::new(args.frequency)?;
    let deadline = args
        .duration
        .map(|s| sink.origin + Duration::from_secs_f64(s.max(0.0)));
    let mut cache = if args.no_translation_cache {
        TranslationCache::disabled()
    } else {
        TranslationCache::new()
    };
    let mut per_vcpu: Vec<Vec<u64>> = vec![Vec::new(); vcpus];
    let outcome = sample_loop(
        &mut per_vcpu,
        sink,
        client,
        ram,
        &text,
        symbols,
        stop_signals,
        vm,
        &mut cache,
        timer,
        deadline,
        vcpus,
    );
    if !args.quiet {
        // The VM stops as a whole (the stopped time per sample is in the summary); what
        // differs per vCPU is the time its registers and stack take to read.
        for (vcpu, times) in per_vcpu.iter_mut().enumerate() {
            times.sort_unstable();
            let at = |p: f64| {
                times
                    .get(((times.len().max(1) - 1) as f64 * p) as usize)
                    .copied()
                    .unwrap_or(0) as f64
                    / 1000.0
            };
            eprintln!(
                "glass: vcpu{vcpu}: {} samples, registers and stack read in p50 {:.1} us, p99 {:.1} us",
                times.len(),
                at(0.5),
                at(0.99)
            );
        }
    }
    if ram.is_some() && !args.quiet {
        eprintln!(
            "glass: translation cache: {} hits, {} misses, {} stale entries re-walked",
            cache.hits, cache.misses, cache.stale
        );
    }
    outcome
}

#[allow(clippy::too_many_arguments)]
fn sample_loop(
    per_vcpu: &mut [Vec<u64>],
    sink: &mut Sink,
    client: &mut Client,
    ram: Option<&GuestRam>,
    text: &[(u64, u64)],
    symbols: &std::path::Path,
    stop_signals: &SignalFd,
    mut vm: Option<&mut std::process::Child>,
    cache: &mut TranslationCache,
    mut timer: Ticker,
    deadline: Option<Instant>,
    vcpus: usize,
) -> std::io::Result<Outcome> {
    let mut outside = OutsideText::default();
    let mut stacks: Vec<Vec<u8>> = vec![vec![0; STACK_COPY]; vcpus];
    let mut regs: Vec<VcpuRegs> = vec![VcpuRegs::default(); vcpus];
    let mut lengths = vec![0usize; vcpus];
    loop {
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return Ok(Outcome::DurationElapsed);
        }
        if let Some(vm) = vm.as_deref_mut() {
            if matches!(vm.try_wait(), Ok(Some(_))) {
                return Ok(Outcome::TargetExited);
            }
        }
        let wait_ms = deadline.map_or(500, |d| {
            d.saturating_duration_since(now).as_millis().min(500) as i32 + 1
        });
        let ready = poll_readable(&[timer.fd(), stop_signals.as_raw_fd()], wait_ms);
        if ready[1] {
            if let Some(signal) = take_stop_signal(stop_signals) {
                return Ok(Outcome::Signalled(signal));
            }
        }
        if !ready[0] {
            continue;
        }
        let Some(missed) = timer.fired() else {
            continue;
        };
        sink.missed_deadlines += missed;

        // The stopped window: registers and stack copies only.
        let stopped_at = Instant::now();
        let taken = take_sample(
            client,
            ram,
            cache,
            &mut regs,
            &mut stacks,
            &mut lengths,
            per_vcpu,
        );
        let resumed = client.resume();
        let stopped_ns = stopped_at.elapsed().as_nanos() as u64;
        if let Err(error) = taken.and(resumed) {
            // The stub went away: the VM powered off, or the connection broke.
            let powered_off = vm.as_deref_mut().is_some_and(|vm| {
                std::thread::sleep(Duration::from_millis(100));
                matches!(vm.try_wait(), Ok(Some(_)))
            });
            if !powered_off {
                eprintln!("glass: {error}; ending the recording");
                return Ok(Outcome::StubLost);
            }
            return Ok(Outcome::TargetExited);
        }
        sink.tick(stopped_ns);
        let time_ns = sink.ns_since_origin(stopped_at);
        for vcpu in 0..vcpus {
            let r = regs[vcpu];
            outside.note(text, r.ip, symbols);
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
    per_vcpu: &mut [Vec<u64>],
) -> std::result::Result<(), StubError> {
    client.stop()?;
    for vcpu in 0..regs.len() {
        let started = Instant::now();
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
        per_vcpu[vcpu].push(started.elapsed().as_nanos() as u64);
    }
    Ok(())
}

/// Counts sampled instruction pointers outside the symbol file's text, and warns once
/// when most are: the file is probably not the running guest.
#[derive(Default)]
struct OutsideText {
    samples: u64,
    outside: u64,
    warned: bool,
}

impl OutsideText {
    fn note(&mut self, text: &[(u64, u64)], ip: u64, symbols: &std::path::Path) {
        self.samples += 1;
        if !text.iter().any(|&(start, end)| ip >= start && ip < end) {
            self.outside += 1;
        }
        if !self.warned && self.samples >= 40 && self.outside * 2 > self.samples {
            self.warned = true;
            eprintln!(
                "glass: warning: {} of {} sampled addresses lie outside the text of {}: is it the running guest's image?",
                self.outside,
                self.samples,
                symbols.display()
            );
        }
    }
}
