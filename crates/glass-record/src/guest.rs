//! The VM-guest loop: sample a guest through a [`GuestBackend`] (its VMM's GDB stub for
//! `--gdb`, `--vm`, `--qmp` and `--libvirt`), whatever the guest's architecture.
//!
//! At each tick: stop the VM, read each vCPU's registers, copy the top of each vCPU's
//! stack — from the guest's RAM through glass's own page-table walk (x86-64 or AArch64)
//! and translation cache where the backend has RAM (`--guest-memory`, `--vm`; QEMU's own
//! memory for `--qmp`/`--libvirt`), through the backend's own reads otherwise — and let
//! the VM run. Unwinding (DWARF CFI from the guest ELF, frame
//! pointers where there is none) and writing happen after the guest runs again, in the
//! same sink as for processes. A vCPU is recorded as thread `vcpuN` (tid N+1) of one
//! process named after the guest ELF.
//!
//! Each vCPU's stack copy is sized from what the unwinder wanted last time (as the
//! ptrace backend does), up to `--stack-size`; copies that were too short are counted
//! per vCPU. Where the backend maps guest RAM, a vCPU's first copy runs from its stack
//! pointer to the end of the stack's mapping (the page walk's first unmapped page, or
//! `--stack-size`), so a deep stack is whole on its first sample; later copies shrink
//! from there as the deepest walk decays. A vCPU that has not yet run the image and is not
//! paging (firmware, boot loader, an application processor the guest never started), or
//! an x86 vCPU in real mode, is recorded with its instruction pointer only, flagged
//! `FIRMWARE`; an x86 vCPU in 32-bit protected mode in the image is walked by 32-bit
//! frame records here (the sink's unwinders read 64-bit words); one stopped right after a `hlt` of the
//! image is flagged `HALTED` (left out with `--no-idle`).

use std::time::{Duration, Instant};

use glass_format::{Arch, Backend, ProcessKind};
use glass_mem::ram::{qemu_arm_virt_layout, qemu_x86_layout, GuestRam};
use glass_mem::{PhysicalMemory, TranslationCache, WordReader};
use glass_target::gdbstub::backend::GdbBackend;
use glass_target::gdbstub::client::{Client, StubError};
use glass_target::guest::{paging_of, GuestBackend, GuestError, Lost, VcpuRegs};
use glass_target::qmp::Monitor;
use glass_target::stop_mark::StopMark;
use glass_target::TargetError;
use nix::sys::signalfd::SignalFd;

use super::driver::{drive, Clock, Gathered, LateTicks, Sampler, DEFAULT_STOPPED_BUDGET};
use super::event::Event;
use glass_target::guest_os::{
    BackendMemory, GuestMemory, GuestOs, Said, Slide, StackSwitch, TaskAtStop, VcpuAt,
};

use super::guest_image::GuestImage;
use super::guest_os::guest_os_for;
use super::recorder::Recorder as Sink;
use super::{finish, unwind_name, Outcome};
use crate::{CaptureMode, Notes, Recorded, Result, SampleClock};

/// The pid the guest is recorded under (a guest has no host process of its own).
const GUEST_PID: i32 = 1;
/// The first stack copy per vCPU from shared RAM (a memory copy: cheap); later ones are
/// sized from what the unwinder wanted. Through `m` packets the first copy is one packet.
const FIRST_STACK_COPY: usize = 16 << 10;
/// The second range's size: a Linux task stack is 16 KiB (arm64 and x86-64), and the
/// copy ends at the first unmapped page.
const OTHER_STACK_COPY: usize = 16 << 10;
/// A user stack's copy (`--guest-root`): the frames of a process's user code sit near
/// its stack pointer, and its stack's top (arguments, environment) is no use to a walk.
const USER_STACK_COPY: usize = 16 << 10;
/// How many of a vCPU's last walks its stack copy is sized for at least.
const RECENT_WALKS: usize = 64;
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
    let ram = match args.guest_memory.clone() {
        Some(path) => RamSource::File(path),
        None => RamSource::Stub,
    };
    // Before the first connection stops the VM: from here on, a glass that dies leaves
    // the VM to the guardian, which lets it run, and a glass that holds it stopped past
    // the stop bound is killed by the guardian (which then lets it run).
    let mark = StopMark::create().map_err(TargetError::Io)?;
    let guardian =
        super::guardian::Guardian::start(&address, false, false, &mark, sink.stop_bound)?;
    let sampled = sample_guest(
        sink,
        &address,
        ram,
        &symbols,
        stop_signals,
        Vmm::Stub,
        &mark,
    );
    // Every way out of sample_guest leaves the VM running (or never stopped it).
    guardian.done();
    let (sink, outcome, fate) = sampled?;
    if let Some(fate) = fate {
        sink.notes.warn(&fate);
    }
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

/// A RAM file's name as the recording keeps it: `--vm`'s memfd, which glass reaches
/// through its own `/proc/self/fd`, by the memfd's name (`memfd:glass-vm-ram`).
fn file_name(path: &std::path::Path) -> String {
    match std::fs::read_link(path) {
        Ok(target) if path.starts_with("/proc/self/fd") => {
            let target = target.to_string_lossy();
            let target = target.strip_suffix(" (deleted)").unwrap_or(&target);
            target.trim_start_matches('/').to_string()
        }
        _ => path.display().to_string(),
    }
}

/// Connects, samples until the end, and lets the guest go. `vm` is the QEMU glass
/// launched, whose exit ends the recording. Every moment glass holds the VM stopped
/// (the connection's handshake, each sample, the detach) is marked in `mark` for the
/// guardian.
pub(super) fn sample_guest<'a>(
    mut sink: Sink<'a>,
    address: &str,
    ram: RamSource,
    symbols: &std::path::Path,
    stop_signals: &SignalFd,
    mut vmm: Vmm<'_>,
    mark: &StopMark,
) -> std::result::Result<(Sink<'a>, Outcome, Option<String>), TargetError> {
    let mut image = GuestImage::load(symbols)?;
    // Before the VM is touched: a description of the guest's OS that cannot serve (a
    // BTF, a map) is one line.
    let mut os = guest_os_for(
        symbols,
        &image,
        sink.args.guest_btf.as_deref(),
        sink.args.guest_root.as_deref(),
    )?;
    // Pinned only now: a QEMU that --vm launched and the guardian keep their CPUs.
    if let Some(cpu) = sink.args.sampler_cpu {
        super::pin_to_cpu(cpu).map_err(TargetError::Io)?;
    }
    // The handshake stops the VM and ends by letting it run.
    let client = Client::connect_marked(address, Some(mark));
    mark.end();
    // A --gdb address with no working stub behind it (nothing listening, a server
    // that is not a GDB stub or never answers, an address that does not parse) is bad
    // input; a stub glass launched or enabled through QEMU's monitor failing is a
    // runtime failure.
    let given_by_user = matches!(vmm, Vmm::Stub);
    let mut client = client.map_err(|error| match !given_by_user {
        true => stub_failed(error),
        false => TargetError::BadInput(format!(
            "{error} (--gdb wants host:port or a unix socket path where a GDB stub listens, such as QEMU's -gdb tcp::1234)"
        )),
    })?;
    if !os
        .as_ref()
        .is_some_and(|os| os.wants_task_registers(client.arch()))
    {
        client.without_task_registers();
    }
    let arch = client.arch();
    image.check_arch(symbols, arch)?;
    let (ram, source) = match ram {
        RamSource::File(path) => {
            let ram = map_ram(&path, arch)?;
            let source = glass_format::GuestRam::File {
                path: file_name(&path),
                bytes: ram.size(),
            };
            (Some(Box::new(ram) as Box<dyn PhysicalMemory>), source)
        }
        RamSource::Process(ram, source) => (Some(ram), source),
        RamSource::Stub => (None, glass_format::GuestRam::Stub),
    };
    let mut backend = GdbBackend::with_memory(client, ram);
    let said = match os.as_deref_mut().map(|os| os.prepare(&mut backend, mark)) {
        Some(Err(error)) => {
            mark.begin();
            let _ = backend.detach();
            mark.end();
            return Err(error);
        }
        Some(Ok(said)) => said,
        None => Vec::new(),
    };
    // Said once the inputs are known to fit (a bad one is the only line printed).
    sink.notes
        .figure(&format!("guest memory read from {source}"));
    let target = GuestTarget {
        backend: &mut backend,
        image: &mut image,
        symbols,
        vmm: &mut vmm,
        stop_mark: Some(mark),
        os: os.as_deref_mut(),
    };
    let ran = say(&mut sink, said)
        .and_then(|()| run_with(&mut sink, target, stop_signals, Some(&source)));
    let (outcome, fate) = match ran {
        Ok(ended) => ended,
        Err(error) => (Outcome::WriteFailed(error), None),
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
    Ok((sink, outcome, fate))
}

/// Where the VM's RAM is read from, besides the stub.
pub(super) enum RamSource {
    /// Only through the stub (`m` packets).
    Stub,
    /// A file QEMU backs the RAM with (`--guest-memory`, `--vm`'s memfd).
    File(std::path::PathBuf),
    /// QEMU's own memory, and what the recording says of it.
    Process(Box<dyn PhysicalMemory>, glass_format::GuestRam),
}

/// What holds the VM besides its GDB stub: how glass learns that it ended, and how.
pub(super) enum Vmm<'a> {
    /// `--gdb`: the stub alone (and `--xen`: the backend alone).
    Stub,
    /// `--vm`: the QEMU glass launched (its exit status says how it ended).
    Launched(&'a mut std::process::Child),
    /// `--qmp`, `--libvirt`: QEMU's monitor, and a pidfd of QEMU.
    Monitored {
        monitor: &'a mut dyn Monitor,
        pidfd: Option<std::os::fd::OwnedFd>,
    },
}

/// How long QEMU has to exit once its stub connection broke: QEMU closes the stub in
/// its clean-up, then ends (it took up to 122 ms under load here; 10 s is for a machine
/// swapping). Only a QEMU that closed the stub and still runs (its stub removed by
/// someone) waits this long.
const QEMU_EXIT_WAIT: Duration = Duration::from_secs(10);

impl Vmm<'_> {
    /// Between samples: the VM has ended (QEMU exited).
    fn ended(&mut self) -> bool {
        match self {
            Vmm::Stub => false,
            Vmm::Launched(child) => matches!(child.try_wait(), Ok(Some(_))),
            Vmm::Monitored { monitor, pidfd } => {
                monitor.drain();
                pidfd
                    .as_ref()
                    .is_some_and(|fd| super::guardian::exited(fd, 0))
            }
        }
    }

    /// After the backend lost the VM: `Some(how it ended)` if it ended, decided by what
    /// QEMU did (its exit status, the stub's exit packet, the monitor's SHUTDOWN event),
    /// never by a fixed wait; `None` if QEMU runs on (the connection broke).
    fn after_loss(&mut self, lost: &Lost) -> Option<String> {
        let gone = lost.exit_packet.is_some() || lost.closed;
        match self {
            Vmm::Stub => lost
                .exit_packet
                .as_ref()
                .map(|packet| format!("the VM ended (its GDB stub's last packet: {packet})")),
            Vmm::Launched(child) => {
                let until = Instant::now() + if gone { QEMU_EXIT_WAIT } else { Duration::ZERO };
                loop {
                    if let Ok(Some(status)) = child.try_wait() {
                        return Some(format!("QEMU exited ({status})"));
                    }
                    if Instant::now() >= until {
                        return None;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            Vmm::Monitored { monitor, .. } => monitor.ending(),
        }
    }

    /// How the VM ended, once [`Vmm::ended`] said it did.
    fn fate(&mut self) -> Option<String> {
        match self {
            Vmm::Monitored { monitor, .. } => monitor.ending(),
            _ => None,
        }
    }
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
    /// The last walks' needs in bytes (a ring indexed by the sample count).
    recent: [u32; RECENT_WALKS],
    /// When the last walk's sample was taken (ns since the recording's start).
    last_sample_ns: u64,
    /// Bytes copied at this sample.
    copied: usize,
    /// The next copy is the first with a stack: it runs to the end of the mapping.
    first_copy: bool,
    /// This sample's copy was that first one.
    top_copy: bool,
    /// Where the first copy's whole walk ended (its outermost frame: the top of the
    /// stack in use), 0 until known. A later copy from a stack pointer below it within
    /// the limit reaches it, so a deep stack first seen after the copies shrank (beta's
    /// recursion after seconds of alpha) is whole on its first sample too; the adaptive
    /// size stays the floor (another stack, another task's, is sized as before).
    stack_top: u64,
    /// The length asked of this sample's copy.
    asked: usize,
    /// The vCPU has executed inside the image (so it is past its firmware).
    ran_image: bool,
    /// At this sample: in firmware (x86 real mode, or not paging and not yet in the image).
    in_firmware: bool,
    /// At this sample: running a user process of the guest (its OS says).
    user_mode: bool,
    /// The stack read's time at this sample, kept in `read_ns` once the VM runs (a push
    /// may allocate: never while it is stopped).
    last_read_ns: u64,
    read_ns: Vec<u64>,
    samples: u64,
    halted: u64,
    firmware: u64,
    /// Stacks the unwinder wanted more of than was copied, or memory outside the copies.
    cut: u64,
    /// The second range: where the frame chain leaves the first copy for another stack
    /// (a Linux guest's IRQ stack back to the task's), its address and bytes copied;
    /// and a third (an x86-64 exception stack back to the IRQ stack, then the task's).
    other: Vec<u8>,
    other_at: u64,
    other_copied: usize,
    third: Vec<u8>,
    third_at: u64,
    third_copied: usize,
    /// Samples that took a second range.
    switched: u64,
    /// This sample's stack was walked in place while the VM was stopped
    /// ([`GuestBackend::walks_in_place`]): its frames and their truncation flags, and the
    /// walks in place so far that met memory they could not read.
    walked_in_place: bool,
    frames: Vec<u64>,
    walk_flags: u8,
    in_place_walks: u64,
    in_place_unreadable: u64,
}

impl Vcpu {
    fn new(limit: usize, first_copy: usize, arch: Arch) -> Self {
        Vcpu {
            regs: VcpuRegs::zeroed(arch),
            stack: vec![0; limit],
            copy_len: first_copy.min(limit),
            deepest: first_copy.min(limit),
            recent: [0; RECENT_WALKS],
            last_sample_ns: 0,
            copied: 0,
            first_copy: true,
            top_copy: false,
            stack_top: 0,
            asked: 0,
            ran_image: false,
            in_firmware: false,
            user_mode: false,
            last_read_ns: 0,
            read_ns: Vec::new(),
            samples: 0,
            halted: 0,
            firmware: 0,
            cut: 0,
            other: vec![0; limit.min(OTHER_STACK_COPY)],
            other_at: 0,
            other_copied: 0,
            third: vec![0; limit.min(OTHER_STACK_COPY)],
            third_at: 0,
            third_copied: 0,
            switched: 0,
            walked_in_place: false,
            frames: Vec::new(),
            walk_flags: 0,
            in_place_walks: 0,
            in_place_unreadable: 0,
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
    /// The size follows the deepest recent walk with a quarter more room: the deepest
    /// decays by half in about 1.4 s of sampling (`since_last_ns`, whatever the rate),
    /// but never below the deepest of the last [`RECENT_WALKS`] walks. At high rates the
    /// decay governs; where glass gets few stops a second (a loaded host: 10-20), a
    /// decay in time alone let a deep phase a third of the time fade between two of its
    /// samples and be cut at the next (2 cuts in 30 s seen), while a bound on the decay
    /// per sample kept a shallow vCPU copying 40-60 KiB for tens of seconds after its
    /// first copy (stopped time spent on nothing). The window holds both: a deep phase
    /// is in it, a finished one leaves it after that many samples.
    /// A vCPU that alternates shallow and deep stacks keeps a copy for the deep ones,
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
        if self.top_copy && wanted > 0 && wanted <= self.copied {
            self.stack_top = self.regs.sp().saturating_add(wanted as u64);
        }
        if self.top_copy {
            // Later copies shrink from the mapping's end, not from the first walk.
            self.deepest = self.deepest.max(self.copied);
        }
        let asked = self.asked;
        let ran_out = wanted > self.copied && wanted <= self.copied + FRAME;
        if ran_out && self.copied == asked {
            self.cut += 1;
            self.deepest = self.deepest.max(self.copy_len * 4);
        }
        // A walk gone astray says nothing of the depth: its slot holds no need.
        self.recent[self.samples as usize % RECENT_WALKS] = if wanted <= self.copied + FRAME {
            wanted as u32
        } else {
            0
        };
        let recent = self.recent.iter().copied().max().unwrap_or(0) as usize;
        self.deepest = self.deepest.max(recent);
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
    /// When the last vCPU's read ended: the resume's start, without one more clock read
    /// in the stop (on Xen's clocksource every read is a system call).
    read_done: Option<Instant>,
}

/// Samples the guest `target` names until the end (`xen`'s loop: the VM's end is the
/// backend's to tell).
pub(super) fn run(
    sink: &mut Sink,
    target: GuestTarget,
    stop_signals: &SignalFd,
) -> std::io::Result<Outcome> {
    run_with(sink, target, stop_signals, None).map(|(outcome, _)| outcome)
}

/// What the loop samples: the backend, the guest's image (`symbols`), what holds the VM,
/// the guardian's stop mark where the backend does not mark its own stops, and the guest
/// OS's hook where one knows the guest's memory.
pub(super) struct GuestTarget<'t, 'v> {
    pub backend: &'t mut dyn GuestBackend,
    pub image: &'t mut GuestImage,
    pub symbols: &'t std::path::Path,
    pub vmm: &'t mut Vmm<'v>,
    pub stop_mark: Option<&'t StopMark>,
    pub os: Option<&'t mut (dyn GuestOs + 'static)>,
}

/// [`run`], with how the VM ended when it did (`Outcome::TargetExited`) and the monitor
/// or stub said so; `ram`: where the guest's RAM is read from, recorded after the Meta
/// record.
fn run_with(
    sink: &mut Sink,
    target: GuestTarget,
    stop_signals: &SignalFd,
    ram: Option<&glass_format::GuestRam>,
) -> std::io::Result<(Outcome, Option<String>)> {
    let GuestTarget {
        backend,
        image,
        symbols,
        vmm,
        stop_mark,
        mut os,
    } = target;
    let args = sink.args;
    record_guest(sink, &*backend, image, symbols, ram)?;
    let arch = backend.arch();
    let vcpu_count = backend.vcpu_count();
    if let Some(os) = os.as_deref_mut() {
        let said = os.begin(arch, vcpu_count, args.capture == CaptureMode::Raw);
        say(sink, said)?;
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
        read_done: None,
    };
    let takes_late_ticks = backend.takes_late_ticks_at_once();
    // Where a guest OS is known its stacks continue on others (IRQ, exception) and its
    // processes' in their own spaces: those keep their copies. `--capture raw` keeps
    // the copy itself.
    let in_place =
        backend.walks_in_place() && has_ram && os.is_none() && args.capture == CaptureMode::Frames;
    let mut sampler = GuestSampler {
        vcpus: &mut vcpus,
        outside: OutsideText::default(),
        backend,
        source: &mut source,
        image,
        vmm,
        fate: None,
        os: os.as_deref_mut(),
        no_idle: args.no_idle,
        stop_mark,
        ticks: 0,
        stop_in_sample: std::env::var("GLASS_TEST_STOP_IN_SAMPLE")
            .ok()
            .and_then(|n| n.parse().ok()),
        waited: Duration::ZERO,
        stopped: Duration::ZERO,
        wake_ups: WakeUps::default(),
        period: Duration::from_secs(1) / args.frequency.max(1),
        in_place,
        resume_ns: Vec::new(),
        schedule: crate::Schedule::default(),
        missed: 0,
    };
    let (cpu_began, began) = (own_cpu_us(), Instant::now());
    sink.sampling_began();
    let outcome = drive(
        &mut sampler,
        sink,
        Some(stop_signals),
        schedule_clock(args, takes_late_ticks),
        args.duration,
    );
    sink.sampling_ended();
    let cpu_end = own_cpu_us();
    let ran = Ran {
        seconds: began.elapsed().as_secs_f64(),
        user_us: cpu_end.0 - cpu_began.0,
        system_us: cpu_end.1 - cpu_began.1,
        waited: sampler.waited,
        stopped: sampler.stopped,
        wake_ups: sampler.wake_ups,
        takes_late_ticks,
        backend_figures: sampler.backend.figures(),
        resume_ns: std::mem::take(&mut sampler.resume_ns),
        schedule: sampler.schedule,
        missed: sampler.missed,
        limit,
        has_ram,
    };
    let mut outside = std::mem::take(&mut sampler.outside);
    let fate = sampler.fate.take();
    summarize(sink, &ran, &mut vcpus, &mut source);
    if let Some(os) = os {
        say(sink, os.ended())?;
    }
    outside.judge(symbols, sink.notes);
    outcome.map(|outcome| (outcome, fate))
}

/// Before sampling: what the recording says of the guest (the Meta record, where its
/// RAM is read from, one process named after the image, its mappings, a thread per
/// vCPU), and the image's figures.
fn record_guest(
    sink: &mut Sink,
    backend: &dyn GuestBackend,
    image: &GuestImage,
    symbols: &std::path::Path,
    ram: Option<&glass_format::GuestRam>,
) -> std::io::Result<()> {
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
    sink.write_meta(
        backend.recording_backend(),
        backend.arch(),
        unwind_name(args.unwind),
        0,
    )?;
    if let Some(ram) = ram {
        sink.guest_ram(ram)?;
    }
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
    for vcpu in 0..backend.vcpu_count() {
        sink.handle(Event::Thread {
            pid: GUEST_PID,
            tid: vcpu as i32 + 1,
            name: Some(format!("vcpu{vcpu}")),
        })?;
    }
    Ok(())
}

/// Says what the guest OS had to say, in its order.
fn say(sink: &mut Sink, said: Vec<Said>) -> std::io::Result<()> {
    for item in said {
        match item {
            Said::Figure(figure) => sink.notes.figure(&figure),
            Said::Warning(warning) => sink.notes.warn(&warning),
            Said::Kept(warning) => sink.warn_kept(&warning)?,
            Said::KernelUnwind(table) => sink.walk_guest_kernel_with(table),
        }
    }
    Ok(())
}

/// The clock the loop keeps for `args` (`--clock`, `--max-stopped`), and what it does
/// about a deadline found passed: a backend that does not take late ticks at once skips
/// them; otherwise one is taken within the budget, or every one where the user asked for
/// wall-clock stops with no budget.
fn schedule_clock(args: &crate::RecordOptions, takes_late_ticks: bool) -> Clock {
    let clock = sample_clock(args);
    let late = if !takes_late_ticks {
        LateTicks::Skip
    } else if clock == SampleClock::Wall && args.max_stopped == Some(100.0) {
        LateTicks::TakeEvery
    } else {
        LateTicks::TakeOne {
            stopped_budget: args
                .max_stopped
                .map_or(DEFAULT_STOPPED_BUDGET, |percent| percent / 100.0),
        }
    };
    match clock {
        SampleClock::Running => Clock::Running(args.frequency, late),
        SampleClock::Wall => Clock::Wall(args.frequency, late),
    }
}

/// `--clock`, the guest's running time unless given.
fn sample_clock(args: &crate::RecordOptions) -> SampleClock {
    args.clock.unwrap_or(SampleClock::Running)
}

/// What the loop measured of a recording, for its summary.
struct Ran {
    seconds: f64,
    user_us: u64,
    system_us: u64,
    waited: Duration,
    stopped: Duration,
    wake_ups: WakeUps,
    takes_late_ticks: bool,
    backend_figures: Vec<String>,
    /// Per sample, the resume's time until it returned to glass.
    resume_ns: Vec<u64>,
    schedule: crate::Schedule,
    missed: u64,
    limit: usize,
    has_ram: bool,
}

/// The loop's figures at the end: the stops, glass's own CPU, the timer, each vCPU, the
/// backend's, the translation cache.
fn summarize(sink: &mut Sink, ran: &Ran, vcpus: &mut [Vcpu], source: &mut StackSource) {
    let args = sink.args;
    let seconds = ran.seconds;
    let times = &mut source.registers_ns;
    times.sort_unstable();
    sink.notes.figure(&format!(
        "stop and registers of {} in one exchange: p50 {:.1} us, p99 {:.1} us",
        glass_format::count(vcpus.len() as u64, "vCPU"),
        percentile(times, 0.5),
        percentile(times, 0.99)
    ));
    let mut resume_ns = ran.resume_ns.clone();
    resume_ns.sort_unstable();
    sink.notes.figure(&format!(
        "resume, until it returned to glass: p50 {:.1} us, p99 {:.1} us (each vCPU's stack read is below: the rest of the stop)",
        percentile(&resume_ns, 0.5),
        percentile(&resume_ns, 0.99)
    ));
    // glass's own CPU, stops and everything between them (unwinding, writing): in a
    // Xen dom0 the system part includes the hypercalls' time in Xen (a pause waits
    // there until every vCPU of the domain is descheduled).
    let stops = times.len().max(1) as f64;
    // The rate asked is per second of the guest's running time (as perf's cpu-clock is
    // per second of the task's) unless --clock wall: the time glass held it stopped is
    // then counted too.
    let running = (seconds - ran.stopped.as_secs_f64()).max(1e-9);
    sink.notes.figure(&format!(
        "stops taken: {} in {seconds:.1} s ({:.1}/s; {:.0} per second the guest ran, {} Hz asked); glass's own CPU per stop: {:.0} us user, {:.0} us system; waiting between stops: {:.0}% of the time",
        times.len(),
        times.len() as f64 / seconds.max(1e-9),
        times.len() as f64 / running,
        args.frequency,
        ran.user_us as f64 / stops,
        ran.system_us as f64 / stops,
        100.0 * ran.waited.as_secs_f64() / seconds.max(1e-9)
    ));
    // Where the deadlines went: taken, passed while glass was not there to take them,
    // or held back by the budget; the rest is the recording's ends.
    let schedule = &ran.schedule;
    let (clock_seconds, clock) = match sample_clock(args) {
        SampleClock::Running => (
            running,
            format!(
                "in the guest's running time (as perf's cpu-clock counts a task's own; {:.1} Hz per wall-clock second at this stopped share; --clock wall counts wall time)",
                args.frequency as f64 * running / seconds.max(1e-9)
            ),
        ),
        SampleClock::Wall => (
            seconds,
            format!(
                "in wall-clock time (--clock wall; {:.1} Hz per second the guest ran at this stopped share)",
                args.frequency as f64 * seconds / running
            ),
        ),
    };
    let deadlines = args.frequency as f64 * clock_seconds;
    let held = schedule.deadlines_held();
    sink.notes.figure(&format!(
        "the schedule: {} Hz {clock}: of its {deadlines:.0} deadlines, {} taken, {} passed before glass could take them, {held:.0} held back by the stopped-time budget (--max-stopped; {} holds), {:.0} otherwise",
        args.frequency,
        times.len(),
        ran.missed,
        schedule.budget_holds,
        deadlines - times.len() as f64 - ran.missed as f64 - held
    ));
    if schedule.back_to_back > 0 {
        sink.notes.figure(&format!(
            "{} of the deadlines taken were late and taken right after the stop before (--clock wall --max-stopped 100 takes every deadline, as uniprof does; at most {} back to back)",
            schedule.back_to_back,
            crate::CATCH_UP_MOST
        ));
    }
    if !schedule.spin.is_zero() {
        sink.notes.figure(&format!(
            "the loop spun for the last {:.0} us before each deadline rather than sleep through them (twice the median of short sleeps measured at the start)",
            schedule.spin.as_secs_f64() * 1e6
        ));
    }
    if let Some(figure) = ran.wake_ups.figure(ran.takes_late_ticks) {
        sink.notes.figure(&figure);
    }
    print_vcpus(vcpus, ran.limit, args.no_idle, sink.notes);
    if let Some(figure) = sink.in_place_walks_figure() {
        sink.notes.figure(&figure);
    }
    for figure in &ran.backend_figures {
        sink.notes.figure(figure);
    }
    if ran.has_ram {
        let cache = &source.cache;
        sink.notes.figure(&format!(
            "translation cache: {} hits, {} misses, {} stale entries re-walked",
            cache.hits, cache.misses, cache.stale
        ));
    }
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
        if vcpu.in_place_walks > 0 {
            notes.figure(&format!(
                "vcpu{index}: {} samples{states}, stack read in p50 {:.1} us, p99 {:.1} us; walked in place while stopped, reading only the words the walk needs: {} of {} walks met memory they could not read",
                vcpu.samples,
                at(0.5),
                at(0.99),
                vcpu.in_place_unreadable,
                vcpu.in_place_walks
            ));
            continue;
        }
        notes.figure(&format!(
            "vcpu{index}: {} samples{states}, stack read in p50 {:.1} us, p99 {:.1} us; stack copy {} KiB (limit {} KiB), {} stacks continued on a second stack, {} stacks longer than the copy",
            vcpu.samples,
            at(0.5),
            at(0.99),
            vcpu.copy_len.div_ceil(1024),
            limit / 1024,
            vcpu.switched,
            vcpu.cut
        ));
    }
}

/// This process's CPU time so far, user and system, in microseconds.
fn own_cpu_us() -> (u64, u64) {
    // SAFETY: a plain struct of integers, which getrusage fills.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return (0, 0);
    }
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    (us(usage.ru_utime), us(usage.ru_stime))
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
struct GuestSampler<'s, 'b, 'v> {
    vcpus: &'s mut [Vcpu],
    outside: OutsideText,
    backend: &'b mut dyn GuestBackend,
    source: &'s mut StackSource,
    image: &'s mut GuestImage,
    vmm: &'s mut Vmm<'v>,
    /// How the VM ended, where the monitor or the stub said.
    fate: Option<String>,
    /// What knows the guest OS's memory: its tasks, their user space, the kernel's
    /// unwind tables and place.
    os: Option<&'s mut (dyn GuestOs + 'static)>,
    no_idle: bool,
    /// Marks each sample for the guardian, where the backend does not itself (Xen's
    /// marks its pause).
    stop_mark: Option<&'s StopMark>,
    /// Ticks taken, and GLASS_TEST_STOP_IN_SAMPLE=N (tests only): at tick N glass stops
    /// itself (SIGSTOP) right after it stopped the VM, so that a test finds glass
    /// stopped inside a sample by construction.
    ticks: u64,
    stop_in_sample: Option<u64>,
    /// Time the loop spent waiting (for the next tick, mostly).
    waited: Duration,
    /// The guest's stopped time over the recording: the schedule is kept in the rest.
    stopped: Duration,
    wake_ups: WakeUps,
    period: Duration,
    /// Stacks are walked in place while the VM is stopped
    /// ([`GuestBackend::walks_in_place`]), not copied.
    in_place: bool,
    /// Per sample, the time the resume took until it returned to glass.
    resume_ns: Vec<u64>,
    /// What the clock did with its deadlines, and the deadlines it found passed.
    schedule: crate::Schedule,
    missed: u64,
}

impl<'a> Sampler<Sink<'a>> for GuestSampler<'_, '_, '_> {
    fn gather(&mut self, _sink: &mut Sink<'a>) -> std::io::Result<Gathered> {
        let exited = self.vmm.ended();
        if exited {
            self.fate = self.vmm.fate();
        }
        Ok(Gathered::ended_if(exited))
    }

    fn housekeeping(&mut self, sink: &mut Sink<'a>) -> std::io::Result<()> {
        sink.flush()
    }

    fn waited(&mut self, waited: Duration) {
        self.waited += waited;
    }

    fn schedule_ended(&mut self, schedule: crate::Schedule) {
        self.schedule = schedule;
    }

    fn woke_late(&mut self, late: Duration) {
        self.wake_ups.count += 1;
        self.wake_ups.late += late;
        if late * 2 > self.period {
            self.wake_ups.over_half_period += 1;
        }
    }

    /// Walks each stack walked in place at the last stop again, from the registers it
    /// had then, while the guest runs: the walk inside the coming stop then finds glass's
    /// code, its tables and the guest's stack page warm ([`Recorder::warm_live`]).
    fn before_deadline(&mut self, sink: &mut Sink<'a>) {
        if !self.in_place {
            return;
        }
        let Some(ram) = self.backend.physical_memory() else {
            return;
        };
        for vcpu in self.vcpus.iter().filter(|v| v.walked_in_place) {
            let r = vcpu.regs;
            let paging = paging_of(&r);
            let mut reader = WordReader::new(ram, &mut self.source.cache, &paging);
            sink.warm_live(GUEST_PID, r.unwind(), &mut |address| reader.word(address));
        }
    }

    fn tick(
        &mut self,
        sink: &mut Sink<'a>,
        missed: u64,
    ) -> std::io::Result<std::result::Result<u64, Outcome>> {
        sink.deadlines_missed(missed);
        self.missed += missed;
        // The stopped window: registers and stack copies only.
        self.ticks += 1;
        if let Some(mark) = self.stop_mark {
            mark.begin();
        }
        let stopped_at = Instant::now();
        let taken = self.take_sample(stopped_at, self.in_place.then_some(&mut *sink));
        if taken.is_ok() && self.stop_in_sample == Some(self.ticks) {
            // SAFETY: raising a signal at ourselves (the test hook above).
            unsafe { libc::raise(libc::SIGSTOP) };
        }
        let resumed = self.backend.resume();
        let resumed_at = Instant::now();
        let stopped_ns = resumed_at.duration_since(stopped_at).as_nanos() as u64;
        let resuming = self.source.read_done.take().unwrap_or(stopped_at);
        let resume_ns = resumed_at.duration_since(resuming).as_nanos() as u64;
        // Also after a failure: the VM went away, or the connection broke and
        // `sample_guest` reconnects to let it run (unmarked: the guardian would do the
        // same).
        if let Some(mark) = self.stop_mark {
            mark.end();
        }
        if let Err(error) = taken
            .and(resumed)
            .and_then(|()| self.backend.ran_again(resumed_at))
        {
            return Ok(Err(self.lost(sink, &error)));
        }
        let time_ns = sink.ns_since_origin(stopped_at);
        sink.tick_at(stopped_ns, time_ns + stopped_ns);
        self.source.registers_ns.push(self.source.last_registers_ns);
        self.resume_ns.push(resume_ns);
        let at = SampleTime {
            time_ns,
            stopped_ns,
        };
        for index in 0..self.vcpus.len() {
            self.record_vcpu(sink, index, at)?;
        }
        self.after_sample(sink, time_ns)?;
        // The loop spends the stop from the budget, and under the running clock also
        // postpones the next ticks by it.
        self.stopped += Duration::from_nanos(stopped_ns);
        Ok(Ok(stopped_ns))
    }
}

/// When a sample was taken (ns since the recording's start) and how long the VM was
/// held stopped for it.
#[derive(Clone, Copy)]
struct SampleTime {
    time_ns: u64,
    stopped_ns: u64,
}

/// How late the clock's timer woke the loop when it slept for a deadline.
#[derive(Clone, Copy, Default)]
struct WakeUps {
    count: u64,
    late: Duration,
    over_half_period: u64,
}

impl WakeUps {
    /// The mean lateness, and a hint when wake-ups, not glass, bound the rate: most of
    /// them more than half a period late.
    fn figure(&self, xen: bool) -> Option<String> {
        if self.count == 0 {
            return None;
        }
        let mean = self.late.as_secs_f64() / self.count as f64;
        let mut figure = format!(
            "timer wake-ups: {} after a sleep, late by {:.0} us on average ({:.0}% by more than half a period)",
            self.count,
            mean * 1e6,
            100.0 * self.over_half_period as f64 / self.count as f64
        );
        if xen && self.over_half_period * 2 > self.count {
            figure.push_str(
                "; the host's scheduler, not glass, bounds the rate: in a Xen dom0 whose pCPU a guest vCPU shares, dom0 on pCPUs of its own (xl vcpu-pin) or a lower scheduler rate limit (xl sched-credit2 -s -r 0) lets it keep the rate",
            );
        }
        Some(figure)
    }
}

impl GuestSampler<'_, '_, '_> {
    /// Stops the VM (at `started`) and reads every vCPU; with a `walker`, walks their
    /// stacks in place. The clock is read once per step (each step's end is the next
    /// one's start): in a Xen dom0 under TCG every read costs microseconds of the stopped
    /// window.
    fn take_sample(
        &mut self,
        started: Instant,
        mut walker: Option<&mut Sink>,
    ) -> std::result::Result<(), GuestError> {
        let source = &mut *self.source;
        self.backend.stop_with_registers(&mut source.regs)?;
        let mut step = Instant::now();
        source.last_registers_ns = step.duration_since(started).as_nanos() as u64;
        for (index, vcpu) in self.vcpus.iter_mut().enumerate() {
            let stopped = StoppedVcpu {
                index,
                no_idle: self.no_idle,
                regs: source.regs[index],
            };
            read_vcpu(
                &mut *self.backend,
                source,
                self.image,
                vcpu,
                stopped,
                self.os.as_deref_mut(),
                walker.as_deref_mut(),
            )?;
            let read = Instant::now();
            vcpu.last_read_ns = read.duration_since(step).as_nanos() as u64;
            step = read;
        }
        source.read_done = Some(step);
        Ok(())
    }

    /// The backend lost the VM: it powered off, or the connection broke. Told apart by
    /// what QEMU did, not by a wait (issue 23: a fixed 100 ms called 2 power-offs in 10
    /// under load a lost connection).
    fn lost(&mut self, sink: &mut Sink, error: &GuestError) -> Outcome {
        if self.backend.gone() {
            sink.notes
                .warn(&format!("{error}; the recording ends there"));
            return Outcome::TargetExited;
        }
        let lost = self.backend.lost();
        match self.vmm.after_loss(&lost) {
            Some(fate) => {
                self.fate = Some(fate);
                Outcome::TargetExited
            }
            None => {
                sink.notes.warn(&format!("{error}; ending the recording"));
                Outcome::StubLost
            }
        }
    }

    /// Once the VM runs again: vCPU `index`'s sample, as its state at the stop says (its
    /// task's, its user stack walked in its process, its instruction pointer alone in
    /// user mode or firmware, halted, its kernel or image stack walked).
    fn record_vcpu(
        &mut self,
        sink: &mut Sink,
        index: usize,
        at: SampleTime,
    ) -> std::io::Result<()> {
        let SampleTime {
            time_ns,
            stopped_ns,
        } = at;
        let vcpu = &mut self.vcpus[index];
        let tid = index as i32 + 1;
        let r = vcpu.regs;
        vcpu.samples += 1;
        vcpu.read_ns.push(vcpu.last_read_ns);
        if let Some(os) = self.os.as_deref_mut() {
            if let Some(task) = os.task_changed(index, time_ns, GUEST_PID as u32, tid as u32) {
                sink.handle(Event::GuestTask(task))?;
            }
        }
        let user_mode = vcpu.user_mode;
        if user_mode && vcpu.copied > 0 && self.user_stack(sink, index, at)? {
            return Ok(());
        }
        let vcpu = &mut self.vcpus[index];
        if user_mode {
            // A user process of the guest: its code is not the kernel image's, and
            // the report names it by the task (`[user] comm`).
            sink.handle(Event::Frames {
                pid: GUEST_PID,
                tid,
                time_ns,
                stopped_ns: stopped_ns as u32,
                flags: 0,
                frames: &[r.ip()],
            })?;
            return Ok(());
        }
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
            return Ok(());
        }
        let image = &mut *self.image;
        self.outside.note(image.contains(r.ip()));
        let halted = self
            .backend
            .halted(index)
            .unwrap_or_else(|| halted_at(&mut *self.backend, &mut self.source.cache, image, &r));
        if halted {
            vcpu.halted += 1;
            if self.no_idle {
                return Ok(());
            }
        }
        let flags = if halted {
            glass_format::SAMPLE_HALTED
        } else {
            0
        };
        if vcpu.walked_in_place {
            sink.handle(Event::Frames {
                pid: GUEST_PID,
                tid,
                time_ns,
                stopped_ns: stopped_ns as u32,
                flags: flags | vcpu.walk_flags,
                frames: &vcpu.frames,
            })?;
            return Ok(());
        }
        if r.protected_32() {
            // 32-bit frames: walked here, once the VM runs again (the sink's
            // unwinders read 64-bit words).
            let mut frames = Vec::new();
            let (end, wanted) = glass_unwind::walk_frame_pointers_32(
                r.unwind(),
                &vcpu.stack[..vcpu.copied],
                sink.args.max_depth as usize,
                &mut frames,
            );
            sink.handle(Event::Frames {
                pid: GUEST_PID,
                tid,
                time_ns,
                stopped_ns: stopped_ns as u32,
                flags,
                frames: &frames,
            })?;
            vcpu.cut += u64::from(end == glass_unwind::WalkEnd::Unreadable);
            vcpu.walked(wanted, time_ns.saturating_sub(vcpu.last_sample_ns));
            vcpu.last_sample_ns = time_ns;
            return Ok(());
        }
        let outside_before = sink.walks_outside_copies();
        let wanted = sink.handle(Event::Stack {
            pid: GUEST_PID,
            tid,
            time_ns,
            stopped_ns: stopped_ns as u32,
            flags,
            regs: r.unwind(),
            stack: &vcpu.stack[..vcpu.copied],
            other_stacks: &[
                (vcpu.other_at, &vcpu.other[..vcpu.other_copied]),
                (vcpu.third_at, &vcpu.third[..vcpu.third_copied]),
            ][..usize::from(vcpu.other_copied > 0) + usize::from(vcpu.third_copied > 0)],
            space: None,
        })?;
        vcpu.switched += u64::from(vcpu.other_copied > 0);
        // A walk that wanted memory outside its copies was cut too, wherever it was.
        vcpu.cut += u64::from(sink.walks_outside_copies() > outside_before);
        vcpu.walked(wanted, time_ns.saturating_sub(vcpu.last_sample_ns));
        vcpu.last_sample_ns = time_ns;
        Ok(())
    }

    /// A user-mode sample of vCPU `index` with its user stack copied: the address space
    /// the guest OS places it in, the mappings learned of it recorded, the stack unwound
    /// there. False when the guest OS has none for it, or its code is in no binary it
    /// knows (the sample stays `[user] comm`).
    fn user_stack(
        &mut self,
        sink: &mut Sink,
        index: usize,
        at: SampleTime,
    ) -> std::io::Result<bool> {
        let Some(os) = self.os.as_deref_mut() else {
            return Ok(false);
        };
        let vcpu = &self.vcpus[index];
        let r = vcpu.regs;
        let mut memory = BackendMemory {
            backend: &mut *self.backend,
            cache: &mut self.source.cache,
        };
        let Some(space) = os.user_space(index, &r, at.time_ns, &mut memory) else {
            return Ok(false);
        };
        for mapping in space.new_mappings {
            sink.handle(Event::Mapping {
                pid: space.space,
                mapping,
                time_ns: at.time_ns,
            })?;
        }
        if !space.walk {
            return Ok(false);
        }
        sink.handle(Event::Stack {
            pid: GUEST_PID,
            tid: index as i32 + 1,
            time_ns: at.time_ns,
            stopped_ns: at.stopped_ns as u32,
            flags: 0,
            regs: r.unwind(),
            stack: &vcpu.stack[..vcpu.copied],
            other_stacks: &[],
            space: Some(space.space),
        })?;
        Ok(true)
    }

    /// Once every vCPU's sample is recorded: what the guest OS learns while the VM runs
    /// (a relocated kernel's place, once found, moves the image; the kernel's unwind
    /// tables).
    fn after_sample(&mut self, sink: &mut Sink, time_ns: u64) -> std::io::Result<()> {
        let Some(os) = self.os.as_deref_mut() else {
            return Ok(());
        };
        let arch = self.backend.arch();
        let vcpus: Vec<VcpuAt> = self
            .vcpus
            .iter()
            .map(|v| VcpuAt {
                regs: v.regs,
                in_firmware: v.in_firmware,
            })
            .collect();
        let mut memory = BackendMemory {
            backend: &mut *self.backend,
            cache: &mut self.source.cache,
        };
        let image = &mut *self.image;
        if image.may_slide() {
            match os.find_slide(arch, &vcpus, image_text(image), &mut memory) {
                Ok(Some(slide)) => moved(sink, image, slide, time_ns)?,
                Ok(None) => {}
                Err(note) => sink.warn_kept(&note)?,
            }
        }
        let said = os.after_sample(&vcpus, image_text(image), &mut memory);
        say(sink, said)
    }
}

/// The image's text, where the guest OS looks for its kernel.
fn image_text(image: &GuestImage) -> std::ops::Range<u64> {
    image.mappings.first().map_or(0..0, |m| m.start..m.end)
}

/// The kernel was found to run `slide.by` above the symbol table: the table is mapped
/// where the kernel runs from this sample on.
fn moved(
    sink: &mut Sink,
    image: &mut GuestImage,
    slide: Slide,
    time_ns: u64,
) -> std::io::Result<()> {
    image.apply_slide(slide.by);
    if slide.by == 0 {
        // Where the table says: nothing moved, nothing to say.
        return Ok(());
    }
    sink.notes.figure(&format!(
        "KASLR: the running kernel lies {:#x} above the symbol table ({}); named from then on",
        slide.by, slide.how
    ));
    for mapping in &image.mappings {
        sink.handle(Event::Mapping {
            pid: GUEST_PID,
            mapping: mapping.clone(),
            time_ns,
        })?;
    }
    Ok(())
}

/// A vCPU of a stopped VM, as the stop read it.
struct StoppedVcpu {
    index: usize,
    no_idle: bool,
    regs: VcpuRegs,
}

/// While the VM is stopped: vCPU `index`'s state (interrupted context, firmware, its
/// task, halted) and its stack copies: the stack it runs on, and the other stacks its
/// frames continue on; or, with a `walker` (the backend [walks in
/// place](GuestBackend::walks_in_place)), the walk of its stack, made here.
fn read_vcpu(
    backend: &mut dyn GuestBackend,
    source: &mut StackSource,
    image: &mut GuestImage,
    vcpu: &mut Vcpu,
    stopped: StoppedVcpu,
    mut os: Option<&mut (dyn GuestOs + 'static)>,
    walker: Option<&mut Sink>,
) -> std::result::Result<(), GuestError> {
    let StoppedVcpu {
        index,
        no_idle,
        regs: mut r,
    } = stopped;
    if let Some(os) = os.as_deref_mut() {
        let mut memory = BackendMemory {
            backend: &mut *backend,
            cache: &mut source.cache,
        };
        os.interrupted(index, &mut r, &mut memory);
    }
    vcpu.regs = r;
    // Only code of the image run with paging on counts: QEMU parks an AArch64 vCPU
    // that was never started (PSCI CPU_ON) at the image's entry, MMU off.
    // A 32-bit x86 image may run with paging off (protected mode): its code counts.
    vcpu.ran_image |= (r.paging_on() || r.protected_32()) && image.contains(r.ip());
    vcpu.in_firmware = !vcpu.ran_image && !r.paging_on() || r.real_mode();
    let task = match os.as_deref_mut() {
        Some(os) => {
            let at = VcpuAt {
                regs: r,
                in_firmware: vcpu.in_firmware,
            };
            let mut memory = BackendMemory {
                backend: &mut *backend,
                cache: &mut source.cache,
            };
            os.task_at_stop(index, at, &mut memory)
        }
        None => TaskAtStop::default(),
    };
    let user_mode = task.user_mode;
    vcpu.user_mode = user_mode;
    // Decided here only for --no-idle (the image's decode is work that can wait
    // until the VM runs again); the sample's flag is decided in `tick`.
    let left_out = no_idle
        && backend
            .halted(index)
            .unwrap_or_else(|| halted_at(backend, &mut source.cache, image, &r));
    vcpu.top_copy = false;
    // A kernel stack that continues on another (an x86-64 Linux IRQ or exception
    // stack): the copy runs to the top for the walk to find where.
    let switch = match os.as_deref_mut() {
        Some(os) if !user_mode => {
            let mut memory = BackendMemory {
                backend: &mut *backend,
                cache: &mut source.cache,
            };
            os.stack_switch(index, &r, &mut memory)
        }
        _ => None,
    };
    vcpu.walked_in_place = false;
    let kernel_stack = !(vcpu.in_firmware || left_out || user_mode);
    if let (Some(sink), Some(ram), true) = (walker, backend.physical_memory(), kernel_stack) {
        if !r.protected_32() {
            walk_in_place(sink, ram, &mut source.cache, vcpu);
            return Ok(());
        }
    }
    let has_ram = backend.physical_memory().is_some();
    // Only from mapped RAM: the process's mappings are read from it once the VM runs
    // (through m packets there is no reading then), and 16 KiB of packets would hold
    // the VM stopped for nothing.
    let walk_user = task.walk_user_stack && has_ram;
    vcpu.copied = if user_mode && walk_user && !left_out {
        // A process's user stack, through this vCPU's own page tables (its
        // process's): a fixed cap, sized apart from the kernel stacks'.
        let len = USER_STACK_COPY.min(vcpu.stack.len());
        copy_stack(
            backend,
            &mut source.cache,
            index,
            &r,
            &mut vcpu.stack[..len],
        )?
    } else if vcpu.in_firmware || left_out || user_mode {
        // Nothing of its stack is recorded.
        0
    } else {
        copy_kernel_stack(backend, &mut source.cache, index, vcpu, switch)?
    };
    vcpu.other_copied = 0;
    vcpu.third_copied = 0;
    // Only from mapped RAM: through m packets a second 16 KiB range would hold the VM
    // stopped past the stop bound (a unikernel's debug-build run did).
    let other = has_ram && !user_mode;
    // Where kernel stacks are walked by tables they hold no frame records to follow:
    // the guest OS says where the other stack is.
    let by_tables = os.is_some_and(|os| os.walks_kernel_by_tables());
    let leaves = match switch {
        Some(switch) => Some(switch.other),
        None if by_tables || r.protected_32() => None,
        None => chain_leaves_copy(&r, &vcpu.stack[..vcpu.copied]),
    };
    if let Some(at) = other.then_some(leaves).flatten() {
        let buf = &mut vcpu.other;
        vcpu.other_at = at;
        // Unreadable: the walk ends there and is counted as cut.
        vcpu.other_copied = copy_from(backend, &mut source.cache, index, &r, at, buf).unwrap_or(0);
    }
    if let Some(at) = switch.and_then(|s| s.then).filter(|_| other) {
        vcpu.third_at = at;
        vcpu.third_copied =
            copy_from(backend, &mut source.cache, index, &r, at, &mut vcpu.third).unwrap_or(0);
    }
    Ok(())
}

/// The walk of a stopped vCPU's stack (its registers in `vcpu.regs`) in the guest's
/// memory itself, reading the words the walk needs and copying nothing: a frame-pointer
/// walk reads the two words of each frame record, as uniprof's does; a CFI walk the
/// return address and saved registers each frame's rules name.
fn walk_in_place(
    sink: &mut Sink,
    ram: &dyn PhysicalMemory,
    cache: &mut TranslationCache,
    vcpu: &mut Vcpu,
) {
    let r = vcpu.regs;
    let paging = paging_of(&r);
    let mut reader = WordReader::new(ram, cache, &paging);
    let unreadable = sink.live_walks_unreadable();
    vcpu.walk_flags = sink.walk_live(
        GUEST_PID,
        r.unwind(),
        &mut |address| reader.word(address),
        &mut vcpu.frames,
    );
    vcpu.in_place_unreadable += sink.live_walks_unreadable() - unreadable;
    vcpu.in_place_walks += 1;
    vcpu.walked_in_place = true;
    vcpu.copied = 0;
    vcpu.other_copied = 0;
    vcpu.third_copied = 0;
}

/// The stack vCPU `index` runs on in the kernel or the image, sized from its recent
/// walks; the first copy from mapped RAM runs up to the first unmapped page, and one on
/// another stack than its task's (`switch`) to that stack's top.
fn copy_kernel_stack(
    backend: &mut dyn GuestBackend,
    cache: &mut TranslationCache,
    index: usize,
    vcpu: &mut Vcpu,
    switch: Option<StackSwitch>,
) -> std::result::Result<usize, GuestError> {
    let r = vcpu.regs;
    vcpu.top_copy = vcpu.first_copy && backend.physical_memory().is_some();
    let to_top = vcpu.stack_top.saturating_sub(r.sp()) as usize;
    let len = if vcpu.top_copy {
        vcpu.stack.len()
    } else if to_top > 0 && to_top <= vcpu.stack.len() {
        vcpu.copy_len
            .max(to_top.next_multiple_of(512))
            .min(vcpu.stack.len())
    } else {
        vcpu.copy_len
    };
    let len = match switch {
        Some(switch) => len
            .max((switch.copy_to - r.sp()) as usize)
            .min(vcpu.stack.len()),
        None => len,
    };
    vcpu.asked = len;
    let copied = copy_stack(backend, cache, index, &r, &mut vcpu.stack[..len])?;
    vcpu.first_copy &= copied == 0;
    Ok(copied)
}

/// Whether the vCPU has just executed a halting instruction, from the image's code or,
/// where it has none (a symbol table), from the guest's RAM where glass maps it (kernel
/// text, which does not change while the guest runs; the stub cannot be asked once the
/// VM runs again).
fn halted_at(
    backend: &mut dyn GuestBackend,
    cache: &mut TranslationCache,
    image: &mut GuestImage,
    r: &VcpuRegs,
) -> bool {
    let arch = backend.arch();
    image.halted_in_memory(arch, r.ip(), &mut |address, buf| {
        backend
            .physical_memory()
            .map_or(0, |ram| cache.read_with(ram, &paging_of(r), address, buf))
    })
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
    copy_from(backend, cache, vcpu, r, r.sp(), buf)
}

fn copy_from(
    backend: &mut dyn GuestBackend,
    cache: &mut TranslationCache,
    vcpu: usize,
    r: &VcpuRegs,
    at: u64,
    buf: &mut [u8],
) -> std::result::Result<usize, GuestError> {
    BackendMemory { backend, cache }.read(vcpu, r, at, buf)
}

/// Where the frame-record chain from the vCPU's frame pointer leaves the stack copy for
/// another stack (a frame record below the stack pointer, or far above the copy: a
/// Linux kernel's `call_on_irq_stack` record on the interrupted task's stack): that
/// record's address, to copy a second range from. None when the chain ends, or only
/// runs past the copy's end (the same stack, deeper: the copy's size handles that).
fn chain_leaves_copy(r: &VcpuRegs, copy: &[u8]) -> Option<u64> {
    const NEAR: u64 = 4096;
    let (sp, end) = (r.sp(), r.sp() + copy.len() as u64);
    let word = |at: u64| {
        let offset = usize::try_from(at.checked_sub(sp)?).ok()?;
        Some(u64::from_le_bytes(
            copy.get(offset..offset + 8)?.try_into().ok()?,
        ))
    };
    let mut fp = r.unwind().fp;
    for _ in 0..MAX_CHAIN {
        if fp == 0 || !fp.is_multiple_of(8) {
            return None;
        }
        if fp < sp || fp >= end + NEAR {
            return Some(fp);
        }
        fp = word(fp)?;
    }
    None
}

/// The most frame records [`chain_leaves_copy`] follows.
const MAX_CHAIN: usize = 512;

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

#[cfg(test)]
mod tests {
    use super::WakeUps;
    use std::time::Duration;

    #[test]
    fn late_wake_ups_name_the_scheduler_only_for_xen_and_only_when_most_are_late() {
        assert_eq!(WakeUps::default().figure(true), None);
        let mostly_late = WakeUps {
            count: 10,
            late: Duration::from_millis(36),
            over_half_period: 8,
        };
        let figure = mostly_late.figure(true).unwrap();
        assert!(figure.starts_with("timer wake-ups: 10 after a sleep, late by 3600 us on average (80% by more than half a period)"), "{figure}");
        assert!(
            figure.contains("xl vcpu-pin") && figure.contains("sched-credit2 -s -r 0"),
            "{figure}"
        );
        // Not a Xen dom0: the remedies would not apply.
        assert!(!mostly_late.figure(false).unwrap().contains("xl "));
        let prompt = WakeUps {
            over_half_period: 5,
            ..mostly_late
        };
        assert!(
            !prompt.figure(true).unwrap().contains("xl "),
            "half late is not most"
        );
    }
}
