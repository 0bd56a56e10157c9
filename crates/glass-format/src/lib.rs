//! The `.glass` recording format: a versioned header followed by a stream of
//! length-prefixed records, written as they happen, gathered in checksummed blocks.
//!
//! Why a stream of self-delimiting records: a recorder that is killed halfway (SIGKILL,
//! full disk, power loss) leaves a file whose every complete block is still readable.
//! The reader stops at an incomplete block at the end and says the file was truncated;
//! a complete file ends with an [`Record::End`] record.
//!
//! Why blocks with a CRC-32 each (version 3): without them a flipped byte in a file
//! read back as other, plausible numbers (a third of byte-mutated files passed as
//! whole). A block that fails its check is reported (which blocks, how many bytes) and
//! skipped: the reader finds the next block by its marker and checksum, so every intact
//! block is kept. Blocks are small ([`BLOCK_TARGET`]) so one damaged byte costs little;
//! the recorder flushes often, and each flush closes a block. Versions 1 and 2 (no
//! blocks) are still read, stopping at their first damaged record.
//!
//! This crate depends on nothing else in glass, so other tools can read recordings.
//! The layout is documented byte for byte in `docs/format.md`.

mod packed;
mod reader;
mod seal;
pub mod stream;
mod varint;
mod writer;

pub use reader::{read_bytes, read_file, read_from, FormatError, Reader, Recording};
pub use seal::{seal, Sealed};
pub use writer::{Writer, TRACE_PIECE};

/// `n` and the noun, singular for one (every count glass prints in words): "1 thread",
/// "2 threads", "1 process", "3 processes", "1 vCPU".
pub fn count(n: impl Into<u64>, noun: &str) -> String {
    let n = n.into();
    match n {
        1 => format!("1 {noun}"),
        _ if noun.ends_with('s') => format!("{n} {noun}es"),
        _ => format!("{n} {noun}s"),
    }
}

/// The first eight bytes of every `.glass` file.
pub const MAGIC: [u8; 8] = *b"GLASSREC";
/// Bumped whenever a record's layout changes incompatibly. Version 2 added the
/// architecture to [`Meta`] and the link register to [`Snapshot`]; version 3 put the
/// records in checksummed blocks. Version 1 files (x86-64 only) and 2 are still read.
pub const VERSION: u32 = 3;
/// The oldest version this reader still reads.
pub const OLDEST_VERSION: u32 = 1;
/// The first version whose records are in checksummed blocks.
pub const BLOCKS_VERSION: u32 = 3;
/// Magic + version + (version 3) the CRC-32 of those 12 bytes (reserved before).
pub const HEADER_LEN: usize = 16;
/// The first bytes of every block (version 3): how a reader finds the next block after
/// a damaged one.
pub const BLOCK_MARKER: [u8; 4] = *b"GBLK";
/// Marker, sequence number (u32), length of the records (u32), CRC-32 (of sequence,
/// length and records).
pub const BLOCK_HEAD_LEN: usize = 16;
/// A block is written once it holds this many bytes (a larger record gets a block of
/// its own): a damaged byte loses at most about this much.
pub const BLOCK_TARGET: usize = 16 << 10;

/// Sample flag: the stack walk ended early (depth limit, a frame pointer that did not
/// move up the stack, or unreadable memory); the outermost frames are missing.
pub const SAMPLE_TRUNCATED: u8 = 1 << 0;
/// Sample flag: the thread was inside a system call when it was stopped (off-CPU).
pub const SAMPLE_IN_SYSCALL: u8 = 1 << 1;
/// Sample flag, with [`SAMPLE_TRUNCATED`]: the walk needed stack beyond the copy the
/// recorder made (a copy cut short), rather than failing in code that keeps no frame.
/// Files written before it was recorded never set it.
pub const SAMPLE_STACK_CUT: u8 = 1 << 5;
/// Sample flag (VM guests): the vCPU was halted (stopped right after a `hlt` of the
/// guest image: its idle loop); the frames are where it halted.
pub const SAMPLE_HALTED: u8 = 1 << 2;
/// Sample flag (VM guests): the vCPU had not yet run the guest image (still in the
/// firmware, the boot loader, or never started); `frames[0]` is its instruction pointer.
pub const SAMPLE_FIRMWARE: u8 = 1 << 3;

/// Sample flag (perf backend, `--off-cpu`): the thread was blocked, not running; the
/// frames are where it blocked (kernel frames first when recorded) and `stopped_ns` holds
/// how long it stayed blocked (a longer block is written as several samples).
pub const SAMPLE_OFF_CPU: u8 = 1 << 4;

/// Whether an address is kernel code (the top half of the address space, on x86-64 and
/// AArch64 alike): perf-backend samples hold the kernel's frames first, then the user's.
pub fn is_kernel_address(address: u64) -> bool {
    address >= 0xffff_8000_0000_0000
}

/// The instruction set of the recorded code: which registers a raw snapshot holds,
/// which unwinder and page-table walk apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum Arch {
    #[default]
    X86_64,
    Aarch64,
}

impl Arch {
    /// The architecture glass itself was built for (a process it samples runs on it).
    pub const fn host() -> Arch {
        if cfg!(target_arch = "aarch64") {
            Arch::Aarch64
        } else {
            Arch::X86_64
        }
    }

    /// The name on disk and in messages.
    pub fn name(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Aarch64 => "aarch64",
        }
    }

    pub fn from_name(name: &str) -> Option<Arch> {
        match name {
            "x86_64" => Some(Arch::X86_64),
            "aarch64" => Some(Arch::Aarch64),
            _ => None,
        }
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Which backend made the recording. Stored by name, so a newer writer's backend reads
/// back as [`Backend::Other`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Backend {
    /// The kernel's perf_event sampling (the target never stops).
    #[default]
    Perf,
    /// glass stops each thread with ptrace.
    Ptrace,
    /// A VM guest through its VMM's GDB stub.
    GdbStub,
    /// A Xen guest through the hypervisor (from dom0).
    Xen,
    /// `glass trace`: instrumented functions, not samples.
    Trace,
    Other(String),
}

impl Backend {
    pub fn name(&self) -> &str {
        match self {
            Backend::Perf => "perf",
            Backend::Ptrace => "ptrace",
            Backend::GdbStub => "gdbstub",
            Backend::Xen => "xen",
            Backend::Trace => "trace",
            Backend::Other(name) => name,
        }
    }

    pub fn from_name(name: &str) -> Backend {
        match name {
            "perf" => Backend::Perf,
            "ptrace" => Backend::Ptrace,
            "gdbstub" => Backend::GdbStub,
            "xen" => Backend::Xen,
            "trace" => Backend::Trace,
            other => Backend::Other(other.to_string()),
        }
    }

    /// The samples are of a VM guest's vCPUs (threads are vCPUs, stops hold the VM).
    pub fn is_guest(&self) -> bool {
        matches!(self, Backend::GdbStub)
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How the recording was made and for what.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Meta {
    /// Wall-clock time at the start, nanoseconds since the Unix epoch.
    pub start_unix_ns: u64,
    pub backend: Backend,
    /// The recorded code's architecture (version 1 files: x86-64).
    pub arch: Arch,
    /// The unwinder that produced the frames ("fp", ...).
    pub unwind: String,
    pub frequency_hz: u32,
    pub max_depth: u32,
    /// The pid first attached to (launched or `--pid`).
    pub target_pid: u32,
    /// The command line that was launched, or empty for `--pid`.
    pub command: Vec<String>,
    pub hostname: String,
    pub glass_version: String,
    /// What each sample holds: "frames" (unwound while recording) or "raw" (registers
    /// and a compacted stack, unwound by the report).
    pub capture: String,
}

/// A process appears: attached, forked, or replaced by exec. After an exec record the
/// process's earlier modules no longer apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Process {
    pub time_ns: u64,
    pub pid: u32,
    pub parent_pid: u32,
    pub kind: ProcessKind,
    pub name: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessKind {
    Attached = 0,
    Forked = 1,
    Exec = 2,
}

/// One executable mapping of a process: `[start, end)` maps `path` from `file_offset`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Module {
    pub time_ns: u64,
    pub pid: u32,
    pub start: u64,
    pub end: u64,
    pub file_offset: u64,
    /// The ELF GNU build id read from the file at record time (empty if none).
    pub build_id: Vec<u8>,
    pub path: String,
}

/// A thread appears or is renamed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Thread {
    pub time_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub name: String,
}

/// A thread ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadExit {
    pub time_ns: u64,
    pub pid: u32,
    pub tid: u32,
}

/// One stack sample. `frames[0]` is the instruction pointer; the rest are return
/// addresses, innermost first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// Nanoseconds since the recording started (monotonic clock).
    pub time_ns: u64,
    pub pid: u32,
    pub tid: u32,
    /// How long this thread was stopped to take the sample, in nanoseconds.
    pub stopped_ns: u32,
    pub flags: u8,
    pub frames: Vec<u64>,
}

/// A raw sample: registers and a compacted copy of the stack from `sp` upwards, unwound
/// when the report is made (see `glass_unwind::snapshot` for the compaction).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub time_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub stopped_ns: u32,
    pub flags: u8,
    pub ip: u64,
    pub sp: u64,
    pub fp: u64,
    /// The link register (AArch64's x30: the leaf's return address until it is saved);
    /// 0 on x86-64 and in version 1 files.
    pub lr: u64,
    pub stack: Vec<u8>,
}

/// What a process's JIT description files (`/tmp/perf-PID.map`, jitdump files) named
/// when the recording ended, as one perf map (`START SIZE name` lines, hex): a report
/// names the process's JIT code from this copy, whatever became of the files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JitMap {
    pub pid: u32,
    /// Shown as the module of the frames it names (the file's name).
    pub name: String,
    pub text: String,
}

/// Samples the kernel dropped (its ring was full), per thread as the kernel said:
/// its count of lost records comes with the thread of the next record that fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadLost {
    pub pid: u32,
    pub tid: u32,
    pub count: u64,
}

/// The kernel functions the recording's kernel frames fall in, from /proc/kallsyms at
/// record time, so a report names them on any machine.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KernelSymbols {
    /// Sorted by start, not overlapping.
    pub symbols: Vec<KernelSymbol>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelSymbol {
    pub start: u64,
    /// Up to the next symbol of kallsyms.
    pub len: u64,
    pub name: String,
    /// The kernel module (`ext4`), empty for the kernel image.
    pub module: String,
}

impl KernelSymbols {
    /// The symbol `address` falls in.
    pub fn find(&self, address: u64) -> Option<&KernelSymbol> {
        let index = self.symbols.partition_point(|s| s.start <= address);
        let symbol = self.symbols.get(index.checked_sub(1)?)?;
        (address - symbol.start < symbol.len.max(1)).then_some(symbol)
    }
}

/// A VM guest's vCPU runs a task of the guest's operating system (a Linux guest's
/// process or thread, read from guest memory at the sample): from `time_ns` on, the
/// samples of thread `tid` (the vCPU) of process `pid` ran in it, until the next
/// `GuestTask` of that vCPU. Written when the task changes, not at every sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestTask {
    pub time_ns: u64,
    pub pid: u32,
    pub tid: u32,
    /// The guest's thread id (Linux's `task_struct.pid`; 0 for a CPU's idle task).
    pub task_pid: u32,
    /// The guest's process id (Linux's `tgid`).
    pub task_tgid: u32,
    /// [`GUEST_TASK_KERNEL_THREAD`], [`GUEST_TASK_UNKNOWN`].
    pub flags: u8,
    /// The task's name as the guest keeps it (Linux's `comm`: `swapper/1` for idle).
    pub comm: String,
}

/// GuestTask flag: a kernel thread (no user space of its own).
pub const GUEST_TASK_KERNEL_THREAD: u8 = 1 << 0;
/// GuestTask flag: the task could not be read at this sample (the samples that follow
/// are of no known task).
pub const GUEST_TASK_UNKNOWN: u8 = 1 << 1;
/// Where a Linux guest process's own binaries are recorded (`--guest-root`): Module
/// records under its tgid in a pid range of its own, which meets no host pid (Linux's
/// pids stay below 2^22). Its user-mode samples stay under the vCPU's thread.
pub const GUEST_PROCESS_PIDS: u32 = 0x4000_0000;

impl GuestTask {
    /// The pid this task's user-space modules are recorded under; None for a kernel
    /// thread (no user space) or a task that could not be read.
    pub fn user_space(&self) -> Option<u32> {
        (self.flags & (GUEST_TASK_KERNEL_THREAD | GUEST_TASK_UNKNOWN) == 0)
            .then_some(GUEST_PROCESS_PIDS | self.task_tgid)
    }
}

/// Where a VM guest's RAM was read from, written once at the start of a guest recording:
/// the stops are short when RAM is read directly, several times longer through the stub.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuestRam {
    /// Only through the GDB stub's `m` packets.
    Stub,
    /// A file QEMU backs the RAM with (`--guest-memory`, `--vm`'s memfd), of `bytes`.
    File { path: String, bytes: u64 },
    /// QEMU's own address space (process `pid`, read with process_vm_readv): `blocks`
    /// host ranges of RAM holding `bytes` in all.
    Process { pid: u32, blocks: u32, bytes: u64 },
}

impl std::fmt::Display for GuestRam {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GuestRam::Stub => write!(f, "the GDB stub's m packets"),
            GuestRam::File { path, bytes } => {
                write!(f, "the RAM file {path} ({} MiB)", bytes >> 20)
            }
            GuestRam::Process { pid, blocks, bytes } => write!(
                f,
                "QEMU's own memory (pid {pid}, its address space read with process_vm_readv: {} MiB in {blocks} RAM block{})",
                bytes >> 20,
                if *blocks == 1 { "" } else { "s" }
            ),
        }
    }
}

/// A Python code object a sampled interpreter ran (a function, a module body, a
/// lambda), as the recorder read it from the process: the Python frames of a
/// [`PyStack`] name it by `id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PyCode {
    pub pid: u32,
    /// Unique within the recording.
    pub id: u32,
    /// `co_qualname` (3.11 and later): `Class.method`, `outer.<locals>.inner`.
    pub name: String,
    /// `co_filename`, as the interpreter has it.
    pub file: String,
    /// The line of its `def` (`co_firstlineno`).
    pub first_line: u32,
}

/// A Python frame of a sample, innermost first in [`PyStack::frames`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PyFrame {
    /// The [`PyCode`] it ran.
    pub code: u32,
    /// The line it was at (0: not known).
    pub line: u32,
    /// The outermost frame one `_PyEval_EvalFrameDefault` call ran: the frames up to
    /// and including it replace that native frame (innermost first).
    pub entry: bool,
}

/// The Python frames of the sample of the same thread and time (written right after
/// it): what the interpreter's own frame chain held when the thread was stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PyStack {
    pub time_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub frames: Vec<PyFrame>,
}

/// The cost figures of a recording, written once at the end.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Summary {
    pub duration_ns: u64,
    pub samples: u64,
    /// Sampling ticks (one tick samples every thread).
    pub ticks: u64,
    pub threads: u32,
    pub processes: u32,
    pub missed_deadlines: u64,
    /// Per-tick time the target was stopped: mean, median, 99th percentile, max.
    pub stopped_mean_ns: u64,
    pub stopped_p50_ns: u64,
    pub stopped_p99_ns: u64,
    pub stopped_max_ns: u64,
    /// Sum over ticks of the time the target was stopped.
    pub stopped_total_ns: u64,
    /// Samples dropped (a thread that could not be stopped or read in time).
    pub lost_samples: u64,
    /// The launched command's exit status as a shell reports it (code, or 128+signal);
    /// -1 when not known (attached with `--pid`, or still running).
    pub exit_status: i32,
}

/// `glass trace`: a function (or library call) that was instrumented, and the id its
/// records carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceFunction {
    pub id: u32,
    /// Path of the ELF file that holds it.
    pub module: String,
    /// Runtime address of its entry.
    pub address: u64,
    pub size: u64,
    pub name: String,
    /// How its calls are timed (glass-tracer's `Probe::name`): "return address",
    /// "return sites", "call sites", "library call", "call" (guests); empty in files
    /// written before it was recorded.
    pub probe: String,
}

/// `glass trace`: a function a pattern matched that was not patched, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceSkipped {
    pub module: String,
    pub address: u64,
    pub name: String,
    /// Why, in full.
    pub reason: String,
    /// The reason's kind, without its detail (glass-tracer's `SkipReason::kind`), for
    /// grouping. Files written before it was recorded get it from the reason's text.
    pub kind: String,
}

/// `glass trace`: probe records of one thread, in the order it wrote them (see
/// `glass_probe_abi` for the 8-byte layout: [`TRACE_TIME_BITS`] of time, then kind and
/// function id). Written packed (tag 13), read back as these words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceChunk {
    pub pid: u32,
    pub tid: u32,
    pub words: Vec<u64>,
}

/// `glass trace`: how the session went, written once at the end.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TraceSummary {
    /// Time-stamp counter ticks per second, measured over the session.
    pub tsc_hz: u64,
    /// The full counter at the session's start: the base for the 44 bits records keep.
    pub tsc_start: u64,
    /// Records dropped: rings that were full, or a file that could not be written.
    pub lost: u64,
    /// Probe events of threads that found no free ring.
    pub no_area_lost: u64,
    /// Calls that ended without returning (longjmp, exceptions).
    pub unwound: u64,
    /// Calls not traced: a signal arrived inside a probe, or the shadow stack was full.
    pub skipped: u64,
    pub threads: u32,
    pub patched: u32,
    pub not_patched: u32,
    /// Hardware counters recorded with each record; empty: time only.
    pub counters: Vec<String>,
    /// Why counters asked for are missing.
    pub counters_note: String,
    pub exit_status: i32,
    pub duration_ns: u64,
    /// `glass trace --pid`: how long every thread of the target was stopped to attach
    /// (load the runtime, patch) and to detach (restore); 0 in launch mode.
    pub attach_stop_ns: u64,
    pub detach_stop_ns: u64,
    /// Calls still running when glass detached: their slots were given back, their
    /// ends are not recorded.
    pub in_flight_at_detach: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    Meta(Meta),
    Process(Process),
    Module(Module),
    Thread(Thread),
    ThreadExit(ThreadExit),
    Sample(Sample),
    Snapshot(Snapshot),
    Summary(Summary),
    TraceFunction(TraceFunction),
    TraceSkipped(TraceSkipped),
    TraceChunk(TraceChunk),
    TraceSummary(TraceSummary),
    JitMap(JitMap),
    ThreadLost(ThreadLost),
    KernelSymbols(KernelSymbols),
    GuestTask(GuestTask),
    /// A warning the recorder gave that the reports must repeat (one line): what makes
    /// the profile less than it seems, such as a guest kernel whose place (KASLR) was not
    /// found.
    Note(String),
    PyCode(PyCode),
    PyStack(PyStack),
    GuestRam(GuestRam),
    /// The recorder finished cleanly; nothing follows.
    End,
}

/// Bits of time at the bottom of each `glass trace` call record; the packed chunk codes
/// them as deltas and the bits above them by reference to the records before.
pub const TRACE_TIME_BITS: u32 = 44;

/// Record tags on disk.
pub(crate) mod tag {
    pub const META: u8 = 1;
    pub const PROCESS: u8 = 2;
    pub const MODULE: u8 = 3;
    pub const THREAD: u8 = 4;
    pub const THREAD_EXIT: u8 = 5;
    pub const SAMPLE: u8 = 6;
    pub const SUMMARY: u8 = 7;
    pub const SNAPSHOT: u8 = 8;
    pub const TRACE_FUNCTION: u8 = 9;
    pub const TRACE_SKIPPED: u8 = 10;
    pub const TRACE_CHUNK: u8 = 11;
    pub const TRACE_SUMMARY: u8 = 12;
    pub const TRACE_PACKED: u8 = 13;
    pub const JIT_MAP: u8 = 14;
    pub const THREAD_LOST: u8 = 15;
    pub const KERNEL_SYMBOLS: u8 = 16;
    pub const GUEST_TASK: u8 = 17;
    pub const NOTE: u8 = 18;
    pub const PY_CODE: u8 = 19;
    pub const PY_STACK: u8 = 20;
    pub const GUEST_RAM: u8 = 21;
    pub const END: u8 = 0xff;
}
