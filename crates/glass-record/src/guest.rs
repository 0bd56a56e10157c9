//! The VM-guest loop: sample a guest through a [`GuestBackend`] (its VMM's GDB stub for
//! `--gdb` and `--vm`), whatever the guest's architecture.
//!
//! At each tick: stop the VM, read each vCPU's registers, copy the top of each vCPU's
//! stack — from the guest's RAM through glass's own page-table walk (x86-64 or AArch64)
//! and translation cache where the backend maps RAM (`--guest-memory`, `--vm`), through
//! the backend's own reads otherwise — and let the VM run. Unwinding (DWARF CFI from the guest ELF, frame
//! pointers where there is none) and writing happen after the guest runs again, in the
//! same sink as for processes. A vCPU is recorded as thread `vcpuN` (tid N+1) of one
//! process named after the guest ELF.
//!
//! Each vCPU's stack copy is sized from what the unwinder wanted last time (as the
//! ptrace backend does), up to `--stack-size`; copies that were too short are counted
//! per vCPU. A vCPU that has not yet run the image and is not in long mode (firmware,
//! boot loader, an application processor the guest never started) is recorded with its
//! instruction pointer only, flagged `FIRMWARE`; one stopped right after a `hlt` of the
//! image is flagged `HALTED` (left out with `--no-idle`).

use std::time::{Duration, Instant};

use glass_format::{Arch, Backend, ProcessKind};
use glass_mem::ram::{qemu_arm_virt_layout, qemu_x86_layout, GuestRam};
use glass_mem::TranslationCache;
use glass_target::gdbstub::backend::GdbBackend;
use glass_target::gdbstub::client::{Client, StubError};
use glass_target::guest::{paging_of, GuestBackend, GuestError, VcpuRegs};
use glass_target::stop_mark::StopMark;
use glass_target::TargetError;
use nix::sys::signalfd::SignalFd;

use super::driver::{drive, Clock, Gathered, Sampler};
use super::event::Event;
use super::guest_image::GuestImage;
use super::recorder::Recorder as Sink;
use super::{finish, unwind_name, Outcome};
use crate::{Notes, Recorded, Result};

/// The pid the guest is recorded under (a guest has no host process of its own).
const GUEST_PID: i32 = 1;
/// The first stack copy per vCPU from shared RAM (a memory copy: cheap); later ones are
/// sized from what the unwinder wanted. Through `m` packets the first copy is one packet.
const FIRST_STACK_COPY: usize = 16 << 10;
/// The most a vCPU's stack copy grows to unless `--stack-size` says otherwise.
const DEFAULT_STACK_LIMIT: usize = 256 << 10;
/// QEMU's i440fx keeps RAM below 3.5 GiB under 4 GiB (the PCI hole above it).
const QEMU_BELOW_4G: u64 = 0xe000_0000;

fn stub_failed(error: StubError) -> TargetError {
    TargetError::Io(std::io::Error::other(error.to_string()))
}

pub fn record(
    sink: Sink,
    stop_signals: &SignalFd,
) -> std::result::Result<Result<Recorded>, TargetError> {
    let args = sink.args;
    let address = args.gdb.clone().unwrap_or_default();
    let symbols = args.symbols.clone().unwrap_or_default();
    if let Some(path) = &args.guest_memory {
        // Checked before the VM is touched; mapped once the guest's machine is known.
        std::fs::metadata(path)
            .map_err(|e| TargetError::BadInput(format!("{}: {e}", path.display())))?;
    }
    let ram = args.guest_memory.clone();
    // Before the first connection stops the VM: from here on, a glass that dies leaves
    // the VM to the guardian, which lets it run, and a glass that holds it stopped past
    // the stop bound is killed by the guardian (which then lets it run).
    let mark = StopMark::create().map_err(TargetError::Io)?;
    let guardian =
        super::guardian::Guardian::start(&address, false, false, &mark, sink.stop_bound)?;
    let sampled = sample_guest(sink, &address, ram, &symbols, stop_signals, None, &mark);
    // Every way out of sample_guest leaves the VM running (or never stopped it).
    guardian.done();
    let (sink, outcome) = sampled?;
    Ok(finish(sink, outcome, None, Backend::GdbStub))
}

/// Maps the guest's RAM file with the layout of QEMU's machine for `arch` (x86: `pc`,
/// RAM from 0 with the PCI hole; AArch64: `virt`, RAM from 1 GiB).
fn map_ram(path: &std::path::Path, arch: Arch) -> std::result::Result<GuestRam, TargetError> {
    let size = std::fs::metadata(path)
        .map_err(|e| TargetError::BadInput(format!("{}: {e}", path.display())))?
        .len();
    let layout = match arch {
        Arch::X86_64 => qemu_x86_layout(size, QEMU_BELOW_4G),
        Arch::Aarch64 => qemu_arm_virt_layout(size),
    };
    GuestRam::open(path, layout).map_err(TargetError::Io)
}

/// Connects, samples until the end, and lets the guest go. `vm` is the QEMU glass
/// launched, whose exit ends the recording. Every moment glass holds the VM stopped
/// (the connection's handshake, each sample, the detach) is marked in `mark` for the
/// guardian.
pub(super) fn sample_guest<'a>(
    mut sink: Sink<'a>,
    address: &str,
    ram: Option<std::path::PathBuf>,
    symbols: &std::path::Path,
    stop_signals: &SignalFd,
    vm: Option<&mut std::process::Child>,
    mark: &StopMark,
) -> std::result::Result<(Sink<'a>, Outcome), TargetError> {
    let mut image = GuestImage::load(symbols)?;
    // Pinned only now: a QEMU that --vm launched and the guardian keep their CPUs.
    if let Some(cpu) = sink.args.sampler_cpu {
        super::pin_to_cpu(cpu).map_err(TargetError::Io)?;
    }
    // The handshake stops the VM and ends by letting it run.
    let client = Client::connect_marked(address, Some(mark));
    mark.end();
    let client = client.map_err(stub_failed)?;
    let arch = client.arch();
    image.check_arch(symbols, arch)?;
    let ram = match ram {
        Some(path) => Some(map_ram(&path, arch)?),
        None => None,
    };
    let mut backend = GdbBackend::new(client, ram);
    let outcome = match run(
        &mut sink,
        &mut backend,
        &mut image,
        symbols,
        stop_signals,
        vm,
        Some(mark),
    ) {
        Ok(outcome) => outcome,
        Err(error) => Outcome::WriteFailed(error),
    };
    if matches!(outcome, Outcome::StubLost) {
        // The VM may have been stopped when the connection broke, and QEMU leaves it
        // stopped: connect again (the handshake resumes it) and detach. Not marked:
        // glass does here what its guardian would do.
        drop(backend);
        match Client::connect(address).and_then(|mut again| again.detach()) {
            Ok(()) => sink
                .notes
                .warn("reconnected to the GDB stub and let the guest run"),
            Err(error) => sink.notes.warn(&format!(
                "could not reconnect to let the guest run: {error}"
            )),
        }
    } else {
        // Whatever else ended the recording, the guest runs on.
        mark.begin();
        let _ = backend.detach();
    }
    mark.end();
    Ok((sink, outcome))
}

/// What the loop keeps per vCPU: the last registers and stack copy, the copy's size, and
/// the figures printed at the end.
struct Vcpu {
    regs: VcpuRegs,
    /// Sized to the limit once: nothing is allocated while the VM is stopped.
    stack: Vec<u8>,
    /// Bytes to copy at the next sample.
    copy_len: usize,
    /// The deepest recent walk's need in bytes, decaying (see [`Vcpu::walked`]).
    deepest: usize,
    /// When the last walk's sample was taken (ns since the recording's start).
    last_sample_ns: u64,
    /// Bytes copied at this sample.
    copied: usize,
    /// The vCPU has executed inside the image (so it is past its firmware).
    ran_image: bool,
    /// At this sample: still in firmware (not yet in long mode nor in the image).
    in_firmware: bool,
    /// The stack read's time at this sample, kept in `read_ns` once the VM runs (a push
    /// may allocate: never while it is stopped).
    last_read_ns: u64,
    read_ns: Vec<u64>,
    samples: u64,
    halted: u64,
    firmware: u64,
    /// Stacks the unwinder wanted more of than was copied.
    cut: u64,
}

impl Vcpu {
    fn new(limit: usize, first_copy: usize, arch: Arch) -> Self {
        Vcpu {
            regs: VcpuRegs::zeroed(arch),
            stack: vec![0; limit],
            copy_len: first_copy.min(limit),
            deepest: first_copy.min(limit),
            last_sample_ns: 0,
            copied: 0,
            ran_image: false,
            in_firmware: false,
            last_read_ns: 0,
            read_ns: Vec::new(),
            samples: 0,
            halted: 0,
            firmware: 0,
            cut: 0,
        }
    }

    /// After a walk that wanted `wanted` bytes from the stack pointer: count a copy that
    /// was too short, and size the next one.
    ///
    /// A walk that ran out of copy asks for a word just past its end (within a frame),
    /// and then stops; a word asked for far beyond it is a walk gone astray (a
    /// frame-pointer guess through a register that holds no frame pointer), which says
    /// nothing about the stack's depth and is neither counted nor copied for. A copy
    /// that stopped short of its size met the end of the mapped stack: not cut either.
    ///
    /// The size follows the deepest recent walk with a quarter more room, the deepest
    /// decaying by half in about 1.4 s of sampling (`since_last_ns`, whatever the rate):
    /// a vCPU that alternates shallow and deep stacks keeps a copy for the deep ones,
    /// while one whose deep phase is over stops paying for it (which matters most through
    /// `m` packets, one round trip per packet). A cut copy grows fourfold, so a deep
    /// stack is reached in one or two samples.
    fn walked(&mut self, wanted: usize, since_last_ns: u64) {
        const FRAME: usize = 4096;
        const DECAY_NS: u64 = 2_000_000_000;
        let limit = self.stack.len();
        let decay = (self.deepest as u128 * since_last_ns.min(DECAY_NS) as u128 / DECAY_NS as u128)
            as usize;
        self.deepest -= decay;
        let ran_out = wanted > self.copied && wanted <= self.copied + FRAME;
        if ran_out && self.copied == self.copy_len {
            self.cut += 1;
            self.deepest = self.deepest.max(self.copy_len * 4);
        }
        if wanted <= self.copied + FRAME {
            self.deepest = self.deepest.max(wanted);
        }
        self.copy_len = (self.deepest + self.deepest / 4 + 512)
            .next_multiple_of(512)
            .clamp(512, limit);
    }
}

/// Where the VM's stack copies come from.
struct StackSource {
    cache: TranslationCache,
    /// Every vCPU's registers, read in the exchange that stops the VM.
    regs: Vec<VcpuRegs>,
    /// Per sample, the time that exchange took.
    registers_ns: Vec<u64>,
    /// This sample's, kept in `registers_ns` once the VM runs.
    last_registers_ns: u64,
}

pub(super) fn run(
    sink: &mut Sink,
    backend: &mut dyn GuestBackend,
    image: &mut GuestImage,
    symbols: &std::path::Path,
    stop_signals: &SignalFd,
    vm: Option<&mut std::process::Child>,
    stop_mark: Option<&StopMark>,
) -> std::io::Result<Outcome> {
    let args = sink.args;
    // Said once connected (an error before then is the one line printed).
    if let Some(warning) = &image.naming_warning {
        sink.notes.warn(warning);
    }
    sink.notes.figure(&format!(
        "unwind tables of {}: {}",
        symbols.display(),
        image.cfi
    ));
    let arch = backend.arch();
    sink.write_meta(
        backend.recording_backend(),
        arch,
        unwind_name(args.unwind),
        0,
    )?;
    // Guest addresses are not host processes: never consult /proc for them.
    sink.without_proc();
    let name = symbols
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "guest".into());
    sink.handle(Event::Process {
        pid: GUEST_PID,
        parent: 0,
        kind: ProcessKind::Attached,
        time_ns: 0,
        name: Some(name),
        read_maps: false,
    })?;
    for mapping in &image.mappings {
        sink.handle(Event::Mapping {
            pid: GUEST_PID,
            mapping: mapping.clone(),
            time_ns: 0,
        })?;
    }
    let vcpu_count = backend.vcpu_count();
    for vcpu in 0..vcpu_count {
        sink.handle(Event::Thread {
            pid: GUEST_PID,
            tid: vcpu as i32 + 1,
            name: Some(format!("vcpu{vcpu}")),
        })?;
    }
    let limit = args
        .stack_size
        .map_or(DEFAULT_STACK_LIMIT, |bytes| bytes as usize);
    let has_ram = backend.physical_memory().is_some();
    let first_copy = if has_ram {
        FIRST_STACK_COPY
    } else {
        backend.read_unit()
    };
    let mut vcpus: Vec<Vcpu> = (0..vcpu_count)
        .map(|_| Vcpu::new(limit, first_copy, arch))
        .collect();
    let mut source = StackSource {
        cache: if args.no_translation_cache {
            TranslationCache::disabled()
        } else {
            TranslationCache::new()
        },
        regs: vec![VcpuRegs::zeroed(arch); vcpus.len()],
        registers_ns: Vec::new(),
        last_registers_ns: 0,
    };
    let mut sampler = GuestSampler {
        vcpus: &mut vcpus,
        outside: OutsideText::default(),
        backend,
        source: &mut source,
        image,
        vm,
        no_idle: args.no_idle,
        stop_mark,
        ticks: 0,
        stop_in_sample: std::env::var("GLASS_TEST_STOP_IN_SAMPLE")
            .ok()
            .and_then(|n| n.parse().ok()),
    };
    sink.sampling_began();
    let outcome = drive(
        &mut sampler,
        sink,
        Some(stop_signals),
        Clock::Running(args.frequency),
        args.duration,
    );
    sink.sampling_ended();
    let mut outside = std::mem::take(&mut sampler.outside);
    let backend_figures = sampler.backend.figures();
    let times = &mut source.registers_ns;
    times.sort_unstable();
    sink.notes.figure(&format!(
        "stop and registers of {} vCPUs in one exchange: p50 {:.1} us, p99 {:.1} us",
        vcpus.len(),
        percentile(times, 0.5),
        percentile(times, 0.99)
    ));
    print_vcpus(&mut vcpus, limit, args.no_idle, sink.notes);
    for figure in backend_figures {
        sink.notes.figure(&figure);
    }
    if has_ram {
        let cache = &source.cache;
        sink.notes.figure(&format!(
            "translation cache: {} hits, {} misses, {} stale entries re-walked",
            cache.hits, cache.misses, cache.stale
        ));
    }
    outside.judge(symbols, sink.notes);
    outcome
}

/// The per-vCPU figures: the VM stops as a whole (the stopped time per sample is in the
/// summary); what differs per vCPU is the time its registers and stack take to read,
/// its states, and its stack copies.
fn print_vcpus(vcpus: &mut [Vcpu], limit: usize, no_idle: bool, notes: &mut dyn Notes) {
    for (index, vcpu) in vcpus.iter_mut().enumerate() {
        let times = &mut vcpu.read_ns;
        times.sort_unstable();
        let at = |p: f64| percentile(times, p);
        let mut states = Vec::new();
        if vcpu.halted > 0 {
            let left_out = if no_idle { ", left out" } else { "" };
            states.push(format!("{} halted{left_out}", vcpu.halted));
        }
        if vcpu.firmware > 0 {
            states.push(format!("{} in firmware", vcpu.firmware));
        }
        let states = if states.is_empty() {
            String::new()
        } else {
            format!(" ({})", states.join(", "))
        };
        notes.figure(&format!(
            "vcpu{index}: {} samples{states}, stack read in p50 {:.1} us, p99 {:.1} us; stack copy {} KiB (limit {} KiB), {} stacks longer than the copy",
            vcpu.samples,
            at(0.5),
            at(0.99),
            vcpu.copy_len.div_ceil(1024),
            limit / 1024,
            vcpu.cut
        ));
    }
}

/// The `p` quantile of sorted nanoseconds, in microseconds.
fn percentile(sorted_ns: &[u64], p: f64) -> f64 {
    sorted_ns
        .get(((sorted_ns.len().max(1) - 1) as f64 * p) as usize)
        .copied()
        .unwrap_or(0) as f64
        / 1000.0
}

/// The guest loop's side of the shared poll loop: the whole VM is one target, stopped
/// at each tick; its vCPUs are its threads.
struct GuestSampler<'s, 'b> {
    vcpus: &'s mut [Vcpu],
    outside: OutsideText,
    backend: &'b mut dyn GuestBackend,
    source: &'s mut StackSource,
    image: &'s mut GuestImage,
    vm: Option<&'s mut std::process::Child>,
    no_idle: bool,
    /// Marks each sample for the guardian, where the backend does not itself (Xen's
    /// marks its pause).
    stop_mark: Option<&'s StopMark>,
    /// Ticks taken, and GLASS_TEST_STOP_IN_SAMPLE=N (tests only): at tick N glass stops
    /// itself (SIGSTOP) right after it stopped the VM, so that a test finds glass
    /// stopped inside a sample by construction.
    ticks: u64,
    stop_in_sample: Option<u64>,
}

impl<'a> Sampler<Sink<'a>> for GuestSampler<'_, '_> {
    fn gather(&mut self, _sink: &mut Sink<'a>) -> std::io::Result<Gathered> {
        let exited = self
            .vm
            .as_deref_mut()
            .is_some_and(|vm| matches!(vm.try_wait(), Ok(Some(_))));
        Ok(Gathered::ended_if(exited))
    }

    fn housekeeping(&mut self, sink: &mut Sink<'a>) -> std::io::Result<()> {
        sink.flush()
    }

    fn tick(
        &mut self,
        sink: &mut Sink<'a>,
        missed: u64,
    ) -> std::io::Result<std::result::Result<u64, Outcome>> {
        sink.missed_deadlines += missed;
        let (vcpus, source, image) = (&mut *self.vcpus, &mut *self.source, &mut *self.image);
        // The stopped window: registers and stack copies only.
        self.ticks += 1;
        if let Some(mark) = self.stop_mark {
            mark.begin();
        }
        let stopped_at = Instant::now();
        let taken = take_sample(self.backend, source, image, vcpus, self.no_idle);
        if taken.is_ok() && self.stop_in_sample == Some(self.ticks) {
            // SAFETY: raising a signal at ourselves (the test hook above).
            unsafe { libc::raise(libc::SIGSTOP) };
        }
        let resumed = self.backend.resume();
        let stopped_ns = stopped_at.elapsed().as_nanos() as u64;
        // Also after a failure: the VM went away, or the connection broke and
        // `sample_guest` reconnects to let it run (unmarked: the guardian would do the
        // same).
        if let Some(mark) = self.stop_mark {
            mark.end();
        }
        if let Err(error) = taken.and(resumed) {
            // The backend lost the VM: it powered off, or the connection broke.
            let powered_off = self.vm.as_deref_mut().is_some_and(|vm| {
                std::thread::sleep(Duration::from_millis(100));
                matches!(vm.try_wait(), Ok(Some(_)))
            });
            if self.backend.gone() {
                sink.notes
                    .warn(&format!("{error}; the recording ends there"));
                return Ok(Err(Outcome::TargetExited));
            }
            if !powered_off {
                sink.notes.warn(&format!("{error}; ending the recording"));
                return Ok(Err(Outcome::StubLost));
            }
            return Ok(Err(Outcome::TargetExited));
        }
        sink.tick(stopped_ns);
        source.registers_ns.push(source.last_registers_ns);
        let time_ns = sink.ns_since_origin(stopped_at);
        for (index, vcpu) in vcpus.iter_mut().enumerate() {
            let tid = index as i32 + 1;
            let r = vcpu.regs;
            vcpu.samples += 1;
            vcpu.read_ns.push(vcpu.last_read_ns);
            if vcpu.in_firmware {
                vcpu.firmware += 1;
                sink.handle(Event::Frames {
                    pid: GUEST_PID,
                    tid,
                    time_ns,
                    stopped_ns: stopped_ns as u32,
                    flags: glass_format::SAMPLE_FIRMWARE,
                    frames: &[r.ip()],
                })?;
                continue;
            }
            self.outside.note(image.contains(r.ip()));
            let halted = self
                .backend
                .halted(index)
                .unwrap_or_else(|| image.halted_at(r.ip()));
            if halted {
                vcpu.halted += 1;
                if self.no_idle {
                    continue;
                }
            }
            let wanted = sink.handle(Event::Stack {
                pid: GUEST_PID,
                tid,
                time_ns,
                stopped_ns: stopped_ns as u32,
                flags: if halted {
                    glass_format::SAMPLE_HALTED
                } else {
                    0
                },
                regs: r.unwind(),
                stack: &vcpu.stack[..vcpu.copied],
            })?;
            vcpu.walked(wanted, time_ns.saturating_sub(vcpu.last_sample_ns));
            vcpu.last_sample_ns = time_ns;
        }
        // Ticks are spaced in the guest's own (running) time: the loop postpones them.
        Ok(Ok(stopped_ns))
    }
}

fn take_sample(
    backend: &mut dyn GuestBackend,
    source: &mut StackSource,
    image: &mut GuestImage,
    vcpus: &mut [Vcpu],
    no_idle: bool,
) -> std::result::Result<(), GuestError> {
    let started = Instant::now();
    backend.stop_with_registers(&mut source.regs)?;
    source.last_registers_ns = started.elapsed().as_nanos() as u64;
    for (index, vcpu) in vcpus.iter_mut().enumerate() {
        let started = Instant::now();
        let r = source.regs[index];
        vcpu.regs = r;
        // Only code of the image run with paging on counts: QEMU parks an AArch64 vCPU
        // that was never started (PSCI CPU_ON) at the image's entry, MMU off.
        vcpu.ran_image |= r.paging_on() && image.contains(r.ip());
        vcpu.in_firmware = !vcpu.ran_image && !r.paging_on();
        // Decided here only for --no-idle (the image's decode is work that can wait
        // until the VM runs again); the sample's flag is decided in `tick`.
        let left_out = no_idle
            && backend
                .halted(index)
                .unwrap_or_else(|| image.halted_at(r.ip()));
        vcpu.copied = if vcpu.in_firmware || left_out {
            // Nothing of its stack is recorded.
            0
        } else {
            copy_stack(
                backend,
                &mut source.cache,
                index,
                &r,
                &mut vcpu.stack[..vcpu.copy_len],
            )?
        };
        vcpu.last_read_ns = started.elapsed().as_nanos() as u64;
    }
    Ok(())
}

/// Copies the stack from the vCPU's stack pointer into `buf`; returns how many bytes
/// could be read (a short count ends at the first unmapped page).
fn copy_stack(
    backend: &mut dyn GuestBackend,
    cache: &mut TranslationCache,
    vcpu: usize,
    r: &VcpuRegs,
    buf: &mut [u8],
) -> std::result::Result<usize, GuestError> {
    if let Some(ram) = backend.physical_memory() {
        return Ok(cache.read_with(ram, &paging_of(r), r.sp(), buf));
    }
    backend.read_virtual(vcpu, r.sp(), buf)
}

/// Counts sampled instruction pointers outside the image's text, once the vCPU is past
/// its firmware (the firmware and the boot loader run first, outside any image), and
/// warns when most are: the file is probably not the running guest.
#[derive(Default)]
struct OutsideText {
    samples: u64,
    outside: u64,
    warned: bool,
}

impl OutsideText {
    fn note(&mut self, inside: bool) {
        self.samples += 1;
        self.outside += u64::from(!inside);
    }

    fn judge(&mut self, symbols: &std::path::Path, notes: &mut dyn Notes) {
        if !self.warned && self.samples >= 40 && self.outside * 2 > self.samples {
            self.warned = true;
            notes.warn(&format!(
                "{} of {} sampled addresses lie outside the text of {} (counting only vCPUs past their firmware): is it the running guest's image?",
                self.outside,
                self.samples,
                symbols.display()
            ));
        }
    }
}
