//! Everything a recording does after a sample is taken, whatever backend took it:
//! keeping each process's module map and unwind tables, unwinding copied stacks (or
//! compacting them for `--capture raw`), writing records, and the cost statistics.
//! Nothing here runs while the target is stopped.

use std::collections::{HashMap, HashSet};
use std::io;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use glass_format::{
    Arch, Backend, GuestRam, GuestTask, JitMap, KernelSymbols, Meta, Module, Process, ProcessKind,
    PyCode, PyStack, Snapshot, Summary, Thread, ThreadExit, ThreadLost, Writer,
};
use glass_target::procfs::{self, Mapping};
use glass_unwind::snapshot::compact;
use glass_unwind::{
    walk_frame_pointers, DwarfUnwinder, RemoteMemory, StackWindow, UnwindRegs, WalkEnd,
};

use crate::event::Event;
use crate::{CaptureMode, Notes, RecordOptions, UnwindMode};

/// The module map of a process is re-read at most this often when samples show
/// addresses outside every known mapping (code mapped by dlopen, a JIT).
const MAPS_REFRESH_PERIOD: Duration = Duration::from_millis(20);
/// Written samples reach the file at least this often (checked after each sample, so
/// after the target runs again): a glass killed mid-recording loses at most this much
/// plus one tick (the backends' idle waits flush too).
const FLUSH_PERIOD: Duration = Duration::from_millis(250);

/// One process's executable mappings, as the file has them, and its unwind tables.
#[derive(Clone)]
struct AddressSpace {
    mappings: Vec<Mapping>,
    last_refresh: Option<Instant>,
    unwinder: DwarfUnwinder,
}

impl AddressSpace {
    fn new(arch: Arch) -> Self {
        AddressSpace {
            mappings: Vec::new(),
            last_refresh: None,
            unwinder: DwarfUnwinder::for_arch(arch),
        }
    }

    fn contains(&self, address: u64) -> bool {
        let index = self.mappings.partition_point(|m| m.start <= address);
        index > 0 && address < self.mappings[index - 1].end
    }
}

/// Stack memory from a copy taken at the sample.
struct CopiedStack<'a> {
    sp: u64,
    bytes: &'a [u8],
    /// The highest address an unwinder asked for, to size later copies.
    high_water: u64,
    /// More ranges (address, bytes): other stacks the walk continues on.
    other: &'a [(u64, Vec<u8>)],
    /// A word was asked for outside both ranges and not just past the first: the walk
    /// wanted memory glass did not copy (another stack's).
    outside: bool,
}

impl CopiedStack<'_> {
    fn word(&mut self, address: u64) -> Option<u64> {
        let at = |base: u64, bytes: &[u8]| {
            let offset = usize::try_from(address.checked_sub(base)?).ok()?;
            let word = bytes.get(offset..offset.checked_add(8)?)?;
            Some(u64::from_le_bytes(word.try_into().ok()?))
        };
        if let Some(word) = at(self.sp, self.bytes) {
            self.high_water = self.high_water.max(address + 8);
            return Some(word);
        }
        if let Some(word) = self.other.iter().find_map(|(base, bytes)| at(*base, bytes)) {
            return Some(word);
        }
        if address >= self.sp && address - self.sp <= (self.bytes.len() + 4096) as u64 {
            // Just past the copy: the same stack, deeper than copied.
            self.high_water = self.high_water.max(address + 8);
        } else if address.is_multiple_of(8) && address >> 63 == self.sp >> 63 {
            // A frame elsewhere in the same half (another stack); a word of data taken
            // for a frame pointer (unaligned, or a small number) is a walk gone astray.
            self.outside = true;
        }
        None
    }
}

impl RemoteMemory for CopiedStack<'_> {
    fn read(&mut self, address: u64, buf: &mut [u8]) -> usize {
        self.high_water = self.high_water.max(address + buf.len() as u64);
        let Some(offset) = address
            .checked_sub(self.sp)
            .and_then(|o| usize::try_from(o).ok())
        else {
            return 0;
        };
        let available = self.bytes.len().saturating_sub(offset);
        let n = available.min(buf.len());
        if n > 0 {
            buf[..n].copy_from_slice(&self.bytes[offset..offset + n]);
        }
        n
    }
}

/// Where the recorder's records go: the `.glass` file ([`Writer`]) for `glass record`;
/// a live view can take them instead.
pub trait Output {
    fn meta(&mut self, meta: &Meta) -> io::Result<()>;
    fn process(&mut self, process: &Process) -> io::Result<()>;
    fn module(&mut self, module: &Module) -> io::Result<()>;
    fn thread(&mut self, thread: &Thread) -> io::Result<()>;
    fn thread_exit(&mut self, exit: &ThreadExit) -> io::Result<()>;
    /// An unwound sample: `frames[0]` is the instruction pointer.
    fn sample(
        &mut self,
        time_ns: u64,
        pid: u32,
        tid: u32,
        stopped_ns: u32,
        flags: u8,
        frames: &[u64],
    ) -> io::Result<()>;
    /// A raw sample (`--capture raw`), unwound by the report.
    fn snapshot(&mut self, snapshot: &Snapshot) -> io::Result<()>;
    fn summary(&mut self, summary: &Summary) -> io::Result<()>;
    /// A copy of a process's JIT description files.
    fn jit_map(&mut self, map: &JitMap) -> io::Result<()>;
    fn end(&mut self) -> io::Result<()>;
    fn flush(&mut self) -> io::Result<()>;
    /// The running counts, after every tick and flush: a live view shows the cost as
    /// it goes (the file has it once, in the summary).
    fn progress(&mut self, _progress: &Progress) {}
    /// Samples the kernel dropped for a thread (written at the end).
    fn thread_lost(&mut self, _lost: &ThreadLost) -> io::Result<()> {
        Ok(())
    }
    /// The names of the kernel functions the samples' kernel frames fall in.
    fn kernel_symbols(&mut self, _symbols: &KernelSymbols) -> io::Result<()> {
        Ok(())
    }
    /// A VM guest's vCPU runs another task of the guest from here on.
    fn guest_task(&mut self, _task: &GuestTask) -> io::Result<()> {
        Ok(())
    }

    /// A warning every report of the recording repeats.
    fn note(&mut self, _note: &str) -> io::Result<()> {
        Ok(())
    }
    /// A Python code object the Python frames name.
    fn py_code(&mut self, _code: &PyCode) -> io::Result<()> {
        Ok(())
    }
    /// Where a VM guest's RAM is read from (once, after the Meta record).
    fn guest_ram(&mut self, _ram: &GuestRam) -> io::Result<()> {
        Ok(())
    }
    /// The Python frames of the sample just written.
    fn py_stack(&mut self, _stack: &PyStack) -> io::Result<()> {
        Ok(())
    }
}

/// The recording's counts so far, for [`Output::progress`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Progress {
    pub time_ns: u64,
    /// How long the target was held stopped at this tick; None for a flush.
    pub tick_stopped_ns: Option<u64>,
    pub ticks: u64,
    pub lost: u64,
    pub missed_deadlines: u64,
}

impl<W: io::Write> Output for Writer<W> {
    fn meta(&mut self, meta: &Meta) -> io::Result<()> {
        Writer::meta(self, meta)
    }
    fn process(&mut self, process: &Process) -> io::Result<()> {
        Writer::process(self, process)
    }
    fn module(&mut self, module: &Module) -> io::Result<()> {
        Writer::module(self, module)
    }
    fn thread(&mut self, thread: &Thread) -> io::Result<()> {
        Writer::thread(self, thread)
    }
    fn thread_exit(&mut self, exit: &ThreadExit) -> io::Result<()> {
        Writer::thread_exit(self, exit)
    }
    fn sample(
        &mut self,
        time_ns: u64,
        pid: u32,
        tid: u32,
        stopped_ns: u32,
        flags: u8,
        frames: &[u64],
    ) -> io::Result<()> {
        Writer::sample(self, time_ns, pid, tid, stopped_ns, flags, frames)
    }
    fn snapshot(&mut self, snapshot: &Snapshot) -> io::Result<()> {
        Writer::snapshot(self, snapshot)
    }
    fn summary(&mut self, summary: &Summary) -> io::Result<()> {
        Writer::summary(self, summary)
    }
    fn jit_map(&mut self, map: &JitMap) -> io::Result<()> {
        Writer::jit_map(self, map)
    }
    fn end(&mut self) -> io::Result<()> {
        Writer::end(self)
    }
    fn flush(&mut self) -> io::Result<()> {
        Writer::flush(self)
    }
    fn thread_lost(&mut self, lost: &ThreadLost) -> io::Result<()> {
        Writer::thread_lost(self, lost)
    }
    fn py_code(&mut self, code: &PyCode) -> io::Result<()> {
        Writer::py_code(self, code)
    }
    fn py_stack(&mut self, stack: &PyStack) -> io::Result<()> {
        Writer::py_stack(self, stack)
    }
    fn kernel_symbols(&mut self, symbols: &KernelSymbols) -> io::Result<()> {
        Writer::kernel_symbols(self, symbols)
    }
    fn guest_task(&mut self, task: &GuestTask) -> io::Result<()> {
        Writer::guest_task(self, task)
    }
    fn note(&mut self, note: &str) -> io::Result<()> {
        Writer::note(self, note)
    }
    fn guest_ram(&mut self, ram: &GuestRam) -> io::Result<()> {
        Writer::guest_ram(self, ram)
    }
}

pub struct Recorder<'a> {
    pub args: &'a RecordOptions,
    /// Where warnings and figures go (the CLI prints them on stderr).
    pub notes: &'a mut dyn Notes,
    writer: Box<dyn Output + 'a>,
    pub origin: Instant,
    spaces: HashMap<i32, AddressSpace>,
    build_ids: HashMap<String, Vec<u8>>,
    thread_names: HashMap<i32, String>,
    threads_seen: HashSet<i32>,
    /// When the sampling loop began and ended (ns since the origin).
    sampling: (Option<u64>, Option<u64>),
    /// Threads with at least one sample: the count the reports give.
    threads_sampled: HashSet<i32>,
    processes_seen: HashSet<i32>,
    pub ticks: u64,
    pub samples: u64,
    pub lost: u64,
    /// Per (pid, tid): samples the kernel dropped (perf backend).
    lost_by_thread: HashMap<(i32, i32), u64>,
    pub missed_deadlines: u64,
    stopped_per_tick: Vec<u64>,
    frames: Vec<u64>,
    encoded: Vec<u8>,
    window: StackWindow,
    /// Kernel addresses the samples held (named from kallsyms at the end).
    kernel_addresses: HashSet<u64>,
    kernel_samples: u64,
    /// The current sample's other stack ranges ([`Event::Stack`]'s `other_stacks`).
    other_stacks: Vec<(u64, Vec<u8>)>,
    /// The current sample's address space to unwind in ([`Event::Stack`]'s `space`).
    unwind_space: Option<i32>,
    /// Walks that wanted stack memory outside every copy (another stack than the one
    /// copied): cut, though not by the copy's length.
    pub walks_outside_copies: u64,
    /// An x86-64 Linux guest kernel's ORC tables (crate::linux_orc), once read: kernel
    /// pcs they cover are walked with them.
    pub guest_orc: Option<glass_unwind::orc::OrcTable>,
    /// Off-CPU samples written, and the time they stand for.
    pub off_cpu_samples: u64,
    pub off_cpu_ns: u64,
    /// perf backend: whether kernel stacks are recorded, or why not.
    pub kernel_stacks: Option<Result<(), String>>,
    /// The summary's line about Python frames (ptrace backend), if any.
    pub python: Option<String>,
    /// Module maps may be refreshed from /proc (not for VM guests).
    use_proc: bool,
    /// The sampled code's architecture (set with the meta record).
    arch: Arch,
    /// Jitdump files the processes mapped (runtimes map them for profilers to find).
    jitdumps_mapped: Vec<(i32, String)>,
    /// Per process, its vDSO's functions as a perf map (glass_symbols::vdso), read from
    /// its memory when the mapping is first seen: the vDSO is no file the report could
    /// read, and the report may run on another kernel.
    vdso_maps: Vec<(i32, String)>,
    /// Stack words the last raw snapshot's unwind read (reused buffer).
    read_words: Vec<usize>,
    /// When the file was last flushed, in ns since the origin: compared with each
    /// sample's own time, so that no sample reads the clock for it (in a Xen PV dom0
    /// every clock read is a system call).
    last_flush_ns: u64,
    /// The longest one stop of the target may last before the guardian frees it
    /// (GLASS_STOP_BOUND_MS; see `crate::stop_bound`).
    pub stop_bound: std::time::Duration,
}

impl<'a> Recorder<'a> {
    pub fn new(
        args: &'a RecordOptions,
        writer: Box<dyn Output + 'a>,
        notes: &'a mut dyn Notes,
    ) -> Self {
        Recorder {
            args,
            notes,
            writer,
            origin: Instant::now(),
            spaces: HashMap::new(),
            build_ids: HashMap::new(),
            thread_names: HashMap::new(),
            threads_seen: HashSet::new(),
            sampling: (None, None),
            threads_sampled: HashSet::new(),
            processes_seen: HashSet::new(),
            ticks: 0,
            samples: 0,
            lost: 0,
            lost_by_thread: HashMap::new(),
            missed_deadlines: 0,
            stopped_per_tick: Vec::new(),
            frames: Vec::with_capacity(args.max_depth as usize + 1),
            encoded: Vec::new(),
            window: StackWindow::new(),
            kernel_addresses: HashSet::new(),
            kernel_samples: 0,
            other_stacks: Vec::new(),
            unwind_space: None,
            walks_outside_copies: 0,
            guest_orc: None,
            off_cpu_samples: 0,
            off_cpu_ns: 0,
            kernel_stacks: None,
            python: None,
            use_proc: true,
            arch: Arch::host(),
            jitdumps_mapped: Vec::new(),
            vdso_maps: Vec::new(),
            read_words: Vec::new(),
            last_flush_ns: 0,
            stop_bound: crate::DEFAULT_STOP_BOUND,
        }
    }

    /// The address space of `pid` (made empty on first use).
    fn space(&mut self, pid: i32) -> &mut AddressSpace {
        let arch = self.arch;
        self.spaces
            .entry(pid)
            .or_insert_with(|| AddressSpace::new(arch))
    }

    /// The samples are not of host processes: module maps come only from the caller.
    pub fn without_proc(&mut self) {
        self.use_proc = false;
    }

    /// The sampling loop starts (after the set-up: launch, attach, perf events).
    pub fn sampling_began(&mut self) {
        self.sampling = (Some(self.now_ns()), None);
    }

    /// The sampling loop ended (the duration elapsed, the target exited, ...).
    pub fn sampling_ended(&mut self) {
        self.sampling.1 = Some(self.now_ns());
    }

    /// When the sampling loop began and ended, in ns since the origin.
    pub fn sampling_window(&self) -> (Option<u64>, Option<u64>) {
        self.sampling
    }

    pub fn now_ns(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    pub fn ns_since_origin(&self, instant: Instant) -> u64 {
        instant.saturating_duration_since(self.origin).as_nanos() as u64
    }

    pub fn write_meta(
        &mut self,
        backend: Backend,
        arch: Arch,
        unwind: &str,
        target_pid: i32,
    ) -> io::Result<()> {
        // The wall-clock time of the origin sample times count from (the backend may have
        // spent a while connecting before it writes the meta): start + time is when a
        // sample was taken.
        let start_unix_ns = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| (d.as_nanos() as u64).saturating_sub(self.now_ns()))
            .unwrap_or(0);
        self.arch = arch;
        let capture = match self.args.capture {
            CaptureMode::Frames => "frames",
            CaptureMode::Raw => "raw",
        };
        self.writer.meta(&Meta {
            start_unix_ns,
            backend,
            arch,
            unwind: unwind.into(),
            frequency_hz: self.args.frequency,
            max_depth: self.args.max_depth,
            target_pid: target_pid as u32,
            command: self.args.command.clone(),
            hostname: std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_default(),
            glass_version: env!("CARGO_PKG_VERSION").into(),
            capture: capture.into(),
        })
    }

    /// Consumes one event of a backend. For a [`Event::Stack`] sample, returns how many
    /// bytes of stack the unwinder wanted, so the backend can copy enough next time
    /// (0 otherwise).
    pub fn handle(&mut self, event: Event) -> io::Result<usize> {
        match event {
            Event::Process {
                pid,
                parent,
                kind,
                time_ns,
                name,
                read_maps,
            } => {
                let name = name.unwrap_or_else(|| procfs::thread_name(pid, pid));
                self.process_named(pid, parent, kind, time_ns, read_maps, name)?;
            }
            Event::Mapping {
                pid,
                mapping,
                time_ns,
            } => self.add_mapping(pid, mapping, time_ns)?,
            Event::Thread { pid, tid, name } => match name {
                Some(name) => self.thread_name(pid, tid, name)?,
                None => self.thread(pid, tid)?,
            },
            Event::ThreadExit { pid, tid, time_ns } => self.thread_exit(pid, tid, time_ns)?,
            Event::GuestTask(task) => self.writer.guest_task(&task)?,
            Event::ProcessExit { pid } => {
                self.spaces.remove(&pid);
            }
            Event::Frames {
                pid,
                tid,
                time_ns,
                stopped_ns,
                flags,
                frames,
            } => self.frames_sample(pid, tid, time_ns, stopped_ns, flags, frames)?,
            Event::Stack {
                pid,
                tid,
                time_ns,
                stopped_ns,
                flags,
                regs,
                stack,
                other_stacks,
                space,
            } => {
                self.other_stacks = other_stacks
                    .iter()
                    .map(|(at, bytes)| (*at, bytes.to_vec()))
                    .collect();
                self.unwind_space = space;
                let wanted = self.stack_sample(pid, tid, time_ns, stopped_ns, flags, regs, stack);
                self.other_stacks.clear();
                self.unwind_space = None;
                return wanted;
            }
        }
        Ok(0)
    }

    /// A process appears, named. For an attached or exec'd process with `read_maps`,
    /// its mappings are read from /proc now; otherwise they arrive as mapping events.
    fn process_named(
        &mut self,
        pid: i32,
        parent: i32,
        kind: ProcessKind,
        time_ns: u64,
        read_maps: bool,
        name: String,
    ) -> io::Result<()> {
        self.processes_seen.insert(pid);
        self.writer.process(&Process {
            time_ns,
            pid: pid as u32,
            parent_pid: parent.max(0) as u32,
            kind,
            name,
        })?;
        match kind {
            ProcessKind::Forked => {
                // The child starts with its parent's mappings; readers copy them too.
                let inherited = self
                    .spaces
                    .get(&parent)
                    .cloned()
                    .unwrap_or_else(|| AddressSpace::new(self.arch));
                self.spaces.insert(pid, inherited);
            }
            ProcessKind::Attached | ProcessKind::Exec => {
                self.spaces.insert(pid, AddressSpace::new(self.arch));
                self.thread_names.remove(&pid);
                if read_maps {
                    self.refresh_modules(pid, time_ns)?;
                }
            }
        }
        Ok(())
    }

    /// Re-reads /proc/PID/maps and records the mappings the file does not have yet.
    pub fn refresh_modules(&mut self, pid: i32, time_ns: u64) -> io::Result<()> {
        let Ok(current) = procfs::executable_mappings(pid) else {
            return Ok(());
        };
        self.space(pid).last_refresh = Some(Instant::now());
        for mapping in current {
            self.add_mapping(pid, mapping, time_ns)?;
        }
        Ok(())
    }

    /// Records one executable mapping (if new) and loads its unwind tables.
    fn add_mapping(&mut self, pid: i32, mapping: Mapping, time_ns: u64) -> io::Result<()> {
        let space = self.space(pid);
        if space.mappings.contains(&mapping) {
            return Ok(());
        }
        if glass_symbols::jit::is_jitdump_marker(&mapping.path) {
            self.jitdumps_mapped.push((pid, mapping.path.clone()));
        }
        if self.use_proc && glass_symbols::vdso::is_vdso(&mapping.path) {
            let mut image = vec![0u8; (mapping.end - mapping.start) as usize];
            let read = std::fs::File::open(format!("/proc/{pid}/mem")).and_then(|mem| {
                std::os::unix::fs::FileExt::read_exact_at(&mem, &mut image, mapping.start)
            });
            if let Some(map) = read
                .ok()
                .and_then(|()| glass_symbols::vdso::perf_map(&image, mapping.start))
            {
                self.vdso_maps.retain(|(p, _)| *p != pid);
                self.vdso_maps.push((pid, map));
            }
        }
        let build_id = self.build_id(pid, &mapping);
        self.writer.module(&Module {
            time_ns,
            pid: pid as u32,
            start: mapping.start,
            end: mapping.end,
            file_offset: mapping.file_offset,
            build_id,
            path: mapping.path.clone(),
        })?;
        // With frame pointers only, AArch64 still needs the modules' function symbols
        // (to tell a leaf's unsaved link register from one it saved).
        let wants_tables = self.args.unwind != UnwindMode::Fp || self.arch == Arch::Aarch64;
        let space = self.space(pid);
        if wants_tables
            && !mapping.path.starts_with('[')
            && !space.unwinder.has_module(mapping.start)
        {
            let path = readable_path(pid, &mapping);
            // A module whose tables cannot be read unwinds by frame pointers; a symbol
            // table (a guest kernel's kallsyms) still gives its function starts.
            let added = space.unwinder.add_module(
                Path::new(&path),
                mapping.start,
                mapping.end,
                mapping.file_offset,
            );
            if let Err(glass_unwind::dwarf::ModuleError::NotElf(_)) = added {
                if let Some(table) = glass_symbols::nm_table(&path) {
                    // The mapping starts at the table's first symbol, or above it by a
                    // relocated (KASLR) kernel's slide.
                    let slide = mapping.start.wrapping_sub(table.first().map_or(0, |s| s.0));
                    let starts: Vec<u64> = table.iter().map(|s| s.0.wrapping_add(slide)).collect();
                    space
                        .unwinder
                        .add_symbol_table(mapping.start, mapping.end, &starts);
                }
            }
        }
        // Overlapping older mappings (an unmapped and reused range) give way.
        space
            .mappings
            .retain(|m| m.end <= mapping.start || m.start >= mapping.end);
        let at = space.mappings.partition_point(|m| m.start < mapping.start);
        space.mappings.insert(at, mapping);
        Ok(())
    }

    fn build_id(&mut self, pid: i32, mapping: &Mapping) -> Vec<u8> {
        if mapping.path.starts_with('[') {
            return Vec::new();
        }
        if let Some(id) = self.build_ids.get(&mapping.path) {
            return id.clone();
        }
        let id =
            glass_symbols::build_id(Path::new(&readable_path(pid, mapping))).unwrap_or_default();
        if !mapping.deleted {
            self.build_ids.insert(mapping.path.clone(), id.clone());
        }
        id
    }

    fn thread(&mut self, pid: i32, tid: i32) -> io::Result<()> {
        self.threads_seen.insert(tid);
        self.thread_name(pid, tid, procfs::thread_name(pid, tid))
    }

    fn thread_name(&mut self, pid: i32, tid: i32, name: String) -> io::Result<()> {
        if name.is_empty() || self.thread_names.get(&tid) == Some(&name) {
            return Ok(());
        }
        self.writer.thread(&Thread {
            time_ns: self.now_ns(),
            pid: pid as u32,
            tid: tid as u32,
            name: name.clone(),
        })?;
        self.thread_names.insert(tid, name);
        self.threads_seen.insert(tid);
        Ok(())
    }

    /// How many threads have samples (of all those seen).
    pub fn threads_sampled(&self) -> u32 {
        self.threads_sampled.len() as u32
    }

    pub fn knows_thread(&self, tid: i32) -> bool {
        self.thread_names.contains_key(&tid)
    }

    /// Threads often name themselves after they start: write names that changed.
    pub fn refresh_thread_names(&mut self, threads: &[(i32, i32)]) -> io::Result<()> {
        for &(pid, tid) in threads {
            self.thread_name(pid, tid, procfs::thread_name(pid, tid))?;
        }
        Ok(())
    }

    fn thread_exit(&mut self, pid: i32, tid: i32, time_ns: u64) -> io::Result<()> {
        self.writer.thread_exit(&ThreadExit {
            time_ns,
            pid: pid as u32,
            tid: tid as u32,
        })
    }

    /// The kernel dropped `count` samples, said with `tid`'s next record.
    pub fn lost_by(&mut self, pid: i32, tid: i32, count: u64) {
        self.lost += count;
        *self.lost_by_thread.entry((pid, tid)).or_insert(0) += count;
    }

    /// Samples lost per thread, most first: (pid, tid, thread name, count).
    pub fn lost_by_thread(&self) -> Vec<(i32, i32, String, u64)> {
        let mut lost: Vec<_> = self
            .lost_by_thread
            .iter()
            .map(|(&(pid, tid), &count)| {
                let name = self.thread_names.get(&tid).cloned().unwrap_or_default();
                (pid, tid, name, count)
            })
            .collect();
        lost.sort_by(|a, b| b.3.cmp(&a.3).then(a.1.cmp(&b.1)));
        lost
    }

    pub fn tick(&mut self, stopped_ns: u64) {
        let now = self.now_ns();
        self.tick_at(stopped_ns, now);
    }

    /// [`Recorder::tick`] for a caller that knows the time (ns since the origin) the
    /// stop ended: one clock read fewer per sample.
    pub fn tick_at(&mut self, stopped_ns: u64, time_ns: u64) {
        self.ticks += 1;
        self.stopped_per_tick.push(stopped_ns);
        self.progress_at(Some(stopped_ns), time_ns);
    }

    fn progress(&mut self, tick_stopped_ns: Option<u64>) {
        let now = self.now_ns();
        self.progress_at(tick_stopped_ns, now);
    }

    fn progress_at(&mut self, tick_stopped_ns: Option<u64>, time_ns: u64) {
        let progress = Progress {
            time_ns,
            tick_stopped_ns,
            ticks: self.ticks,
            lost: self.lost,
            missed_deadlines: self.missed_deadlines,
        };
        self.writer.progress(&progress);
    }

    /// A Python code object (before the first Python frames that name it).
    pub fn py_code(&mut self, code: &PyCode) -> io::Result<()> {
        self.writer.py_code(code)
    }

    /// The Python frames of the sample just written.
    pub fn py_stack(&mut self, stack: &PyStack) -> io::Result<()> {
        self.writer.py_stack(stack)
    }

    /// x86-64, a frame-pointer walk made while the thread was stopped (`frames`): a
    /// sample in a function without a frame (yet) has its caller skipped by the chain;
    /// it is taken from the return address at the stack pointer (`top`: the words at
    /// `regs.sp` and above), as for a stack copy's walk.
    pub fn recover_leaf_caller(
        &mut self,
        pid: i32,
        regs: UnwindRegs,
        top: [Option<u64>; 2],
        frames: &mut Vec<u64>,
    ) -> io::Result<()> {
        if self.arch != Arch::X86_64 || frames.is_empty() {
            return Ok(());
        }
        self.check_modules(pid, frames)?;
        let space = self.space(pid);
        let leaf_return = glass_unwind::unchained_return_address(
            regs,
            &mut |address| match address.wrapping_sub(regs.sp) {
                0 => top[0],
                8 => top[1],
                _ => None,
            },
            frames.get(1).copied(),
            &|address| space.contains(address),
        );
        if let Some(address) = leaf_return {
            frames.insert(1, address);
            if frames.len() > self.args.max_depth as usize {
                frames.pop();
            }
        }
        Ok(())
    }

    /// A sample already unwound (the frame-pointer walk in the stopped window).
    fn frames_sample(
        &mut self,
        pid: i32,
        tid: i32,
        time_ns: u64,
        stopped_ns: u32,
        flags: u8,
        frames: &[u64],
    ) -> io::Result<()> {
        self.check_modules(pid, frames)?;
        self.writer
            .sample(time_ns, pid as u32, tid as u32, stopped_ns, flags, frames)?;
        self.samples += 1;
        self.threads_sampled.insert(tid);
        self.flush_if_due(time_ns)
    }

    /// A sample holding registers and a copy of the stack from `regs.sp`. Unwinds it
    /// (or, with `--capture raw`, compacts and stores it). Returns how many bytes of
    /// stack the unwinder wanted, so the backend can copy enough next time.
    #[allow(clippy::too_many_arguments)]
    fn stack_sample(
        &mut self,
        pid: i32,
        tid: i32,
        time_ns: u64,
        stopped_ns: u32,
        state_flags: u8,
        regs: UnwindRegs,
        stack: &[u8],
    ) -> io::Result<usize> {
        self.stack_sample_with_kernel(pid, tid, time_ns, stopped_ns, state_flags, regs, stack, &[])
    }

    /// [`Recorder::stack_sample`] with the kernel's frames of the sample (innermost
    /// first), which go before the user frames (`--capture raw` keeps none).
    #[allow(clippy::too_many_arguments)]
    pub fn stack_sample_with_kernel(
        &mut self,
        pid: i32,
        tid: i32,
        time_ns: u64,
        stopped_ns: u32,
        state_flags: u8,
        regs: UnwindRegs,
        stack: &[u8],
        kernel: &[u64],
    ) -> io::Result<usize> {
        let mut frames = std::mem::take(&mut self.frames);
        frames.clear();
        if self.args.capture == CaptureMode::Frames {
            self.note_kernel_frames(kernel);
            frames.extend_from_slice(kernel);
        }
        let (truncated, wanted) = self.unwind_into(pid, regs, stack, &mut frames);
        let flags = state_flags | truncated;
        let result = match self.args.capture {
            CaptureMode::Frames => {
                self.frames_sample(pid, tid, time_ns, stopped_ns, flags, &frames)
            }
            CaptureMode::Raw => self.raw_sample(
                pid,
                tid,
                time_ns,
                stopped_ns,
                state_flags,
                regs,
                stack,
                &frames,
            ),
        };
        self.frames = frames;
        result.map(|()| wanted)
    }

    /// Keeps the kernel addresses samples hold, to name them when the recording ends.
    fn note_kernel_frames(&mut self, kernel: &[u64]) {
        if !kernel.is_empty() {
            self.kernel_samples += 1;
            self.kernel_addresses.extend(kernel);
        }
    }

    /// Records where a VM guest's RAM is read from.
    pub fn guest_ram(&mut self, ram: &GuestRam) -> io::Result<()> {
        self.writer.guest_ram(ram)
    }

    /// Warns now and keeps the warning in the recording, for every report to repeat.
    pub fn warn_kept(&mut self, warning: &str) -> io::Result<()> {
        self.notes.warn(warning);
        self.writer.note(warning)
    }

    /// Samples that held kernel frames.
    pub fn kernel_samples(&self) -> u64 {
        self.kernel_samples
    }

    /// Unwinds a blocked thread's stack (kernel frames first) into `frames`, for an
    /// off-CPU sample written when the block's length is known; returns the flags.
    pub fn unwind_blocked(
        &mut self,
        pid: i32,
        regs: UnwindRegs,
        stack: &[u8],
        kernel: &[u64],
        frames: &mut Vec<u64>,
    ) -> u8 {
        frames.clear();
        self.note_kernel_frames(kernel);
        frames.extend_from_slice(kernel);
        let (truncated, _) = self.unwind_into(pid, regs, stack, frames);
        glass_format::SAMPLE_OFF_CPU | truncated
    }

    /// An off-CPU sample: `frames` blocked for `blocked_ns` from `time_ns` (written as
    /// several samples when that does not fit the record's 32-bit field).
    pub fn off_cpu_sample(
        &mut self,
        pid: i32,
        tid: i32,
        time_ns: u64,
        blocked_ns: u64,
        flags: u8,
        frames: &[u64],
    ) -> io::Result<()> {
        let (mut at, mut left) = (time_ns, blocked_ns);
        while left > 0 {
            let part = left.min(u32::MAX as u64);
            self.frames_sample(pid, tid, at, part as u32, flags, frames)?;
            self.off_cpu_ns += part;
            self.off_cpu_samples += 1;
            at += part;
            left -= part;
        }
        Ok(())
    }

    /// Unwinds the user stack copy after whatever `frames` holds; returns the sample's
    /// truncation flags (truncation_flags) and how many bytes of stack it wanted.
    fn unwind_into(
        &mut self,
        pid: i32,
        regs: UnwindRegs,
        stack: &[u8],
        frames: &mut Vec<u64>,
    ) -> (u8, usize) {
        let other = std::mem::take(&mut self.other_stacks);
        let guest_user = self.unwind_space.is_some();
        let pid = self.unwind_space.unwrap_or(pid);
        let first = frames.len();
        let mut copy = CopiedStack {
            sp: regs.sp,
            bytes: stack,
            high_water: regs.sp,
            other: &other,
            outside: false,
        };
        let max_depth = self.args.max_depth as usize;
        let (unwind, arch) = (self.args.unwind, self.arch);
        let space = self
            .spaces
            .entry(pid)
            .or_insert_with(|| AddressSpace::new(arch));
        let orc_end = self
            .guest_orc
            .as_ref()
            .filter(|orc| arch == Arch::X86_64 && orc.find(regs.ip).is_some())
            .map(|orc| orc.walk(regs, &mut |address| copy.word(address), max_depth, frames));
        let end = match unwind {
            _ if orc_end.is_some() => orc_end.unwrap_or(WalkEnd::Complete),
            UnwindMode::Fp if arch == Arch::Aarch64 => {
                let unwinder = &space.unwinder;
                glass_unwind::aarch64::walk_frame_records(
                    regs,
                    &mut |address| copy.word(address),
                    max_depth,
                    frames,
                    &|a, b| unwinder.same_function(a, b),
                )
            }
            UnwindMode::Fp => {
                let start = frames.len();
                self.window.fill(&mut copy, regs.sp);
                let end = walk_frame_pointers(regs, &mut self.window, &mut copy, max_depth, frames);
                // A sample in a function without a frame (yet): its caller, which the
                // chain skips, from the return address at the stack pointer.
                let window = &mut self.window;
                let leaf_return = glass_unwind::unchained_return_address(
                    regs,
                    &mut |address| window.word(&mut copy, address),
                    frames.get(start + 1).copied(),
                    &|address| space.contains(address),
                );
                if let Some(address) = leaf_return {
                    frames.insert(start + 1, address);
                    if frames.len() - start > max_depth {
                        frames.pop();
                    }
                }
                end
            }
            UnwindMode::Auto | UnwindMode::Dwarf => {
                space
                    .unwinder
                    .walk(regs, &mut |address| copy.word(address), max_depth, frames)
            }
        };
        if guest_user {
            // A guest process's stack ends at its outermost frame in its own code: past
            // `_start` a walk reads whatever the kernel put there (argc).
            while frames.len() > first + 1 && frames.last().is_some_and(|&a| !space.contains(a)) {
                frames.pop();
            }
        }
        self.walks_outside_copies += u64::from(copy.outside && end == WalkEnd::Unreadable);
        let wanted = (copy.high_water - regs.sp) as usize;
        (truncation_flags(end, wanted, stack.len()), wanted)
    }

    /// A `--capture raw` sample: the registers and the compacted stack (`frames`, the
    /// unwind just made, tells which modules the stack touches).
    #[allow(clippy::too_many_arguments)]
    fn raw_sample(
        &mut self,
        pid: i32,
        tid: i32,
        time_ns: u64,
        stopped_ns: u32,
        state_flags: u8,
        regs: UnwindRegs,
        stack: &[u8],
        frames: &[u64],
    ) -> io::Result<()> {
        let max_depth = self.args.max_depth as usize;
        // The unwind above only told which modules the stack touches.
        self.check_modules(pid, frames)?;
        // Unwind again as the report will (CFI, frame pointers as fallback),
        // noting every stack word it reads: those are kept verbatim, so the
        // report's unwind of the compacted copy gives exactly these frames.
        let mut read_words = std::mem::take(&mut self.read_words);
        read_words.clear();
        let space = self.space(pid);
        let mut scratch = Vec::new();
        let sp = regs.sp;
        space.unwinder.walk(
            regs,
            &mut |address| {
                let offset = usize::try_from(address.checked_sub(sp)?).ok()?;
                let word = stack.get(offset..offset.checked_add(8)?)?;
                read_words.push(offset / 8);
                if offset % 8 != 0 {
                    read_words.push(offset / 8 + 1);
                }
                Some(u64::from_le_bytes(word.try_into().ok()?))
            },
            max_depth,
            &mut scratch,
        );
        read_words.sort_unstable();
        read_words.dedup();
        let space = &self.spaces[&pid];
        let mut encoded = std::mem::take(&mut self.encoded);
        encoded.clear();
        let reach = read_words.last().map_or(0, |&last| last + 1);
        compact(
            stack,
            regs.sp,
            &|value| space.contains(value),
            &read_words,
            reach,
            &mut encoded,
        );
        self.read_words = read_words;
        let written = self.writer.snapshot(&Snapshot {
            time_ns,
            pid: pid as u32,
            tid: tid as u32,
            stopped_ns,
            flags: state_flags,
            ip: regs.ip,
            sp: regs.sp,
            fp: regs.fp,
            lr: regs.lr,
            stack: std::mem::take(&mut encoded),
        });
        self.samples += 1;
        self.threads_sampled.insert(tid);
        written.and_then(|()| self.flush_if_due(time_ns))
    }

    /// Re-reads the module map (rate limited) when a sample holds an address outside
    /// every known mapping: that is how code mapped after the start (the libraries the
    /// dynamic loader maps, dlopen, a JIT) gets into the recording.
    fn check_modules(&mut self, pid: i32, frames: &[u64]) -> io::Result<()> {
        if !self.use_proc {
            return Ok(());
        }
        let space = self.space(pid);
        if frames
            .iter()
            .all(|&a| space.contains(a) || glass_format::is_kernel_address(a))
        {
            return Ok(());
        }
        if space
            .last_refresh
            .is_none_or(|t| t.elapsed() >= MAPS_REFRESH_PERIOD)
        {
            self.refresh_modules(pid, self.now_ns())?;
        }
        Ok(())
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.last_flush_ns = self.now_ns();
        self.progress(None);
        self.writer.flush()
    }

    /// Flushes when a flush period has passed by the time of the sample just written.
    fn flush_if_due(&mut self, time_ns: u64) -> io::Result<()> {
        if time_ns.saturating_sub(self.last_flush_ns) >= FLUSH_PERIOD.as_nanos() as u64 {
            self.flush()?;
        }
        Ok(())
    }

    pub fn summary(&self, exit_status: Option<i32>) -> Summary {
        let mut stopped = self.stopped_per_tick.clone();
        stopped.sort_unstable();
        let total: u64 = stopped.iter().sum();
        let percentile = |p: f64| -> u64 {
            if stopped.is_empty() {
                0
            } else {
                stopped[((stopped.len() - 1) as f64 * p).round() as usize]
            }
        };
        Summary {
            duration_ns: self.now_ns(),
            samples: self.samples,
            ticks: self.ticks,
            threads: self.threads_seen.len() as u32,
            processes: self.processes_seen.len() as u32,
            missed_deadlines: self.missed_deadlines,
            stopped_mean_ns: if stopped.is_empty() {
                0
            } else {
                total / stopped.len() as u64
            },
            stopped_p50_ns: percentile(0.5),
            stopped_p99_ns: percentile(0.99),
            stopped_max_ns: stopped.last().copied().unwrap_or(0),
            stopped_total_ns: total,
            lost_samples: self.lost,
            exit_status: exit_status.unwrap_or(-1),
        }
    }

    /// Writes the copies of the JIT files, the summary and the end marker.
    pub fn finish(&mut self, summary: &Summary) -> io::Result<()> {
        self.keep_jit_files()?;
        if !self.kernel_addresses.is_empty() {
            let addresses: Vec<u64> = self.kernel_addresses.iter().copied().collect();
            self.writer
                .kernel_symbols(&glass_target::perf::kernel_symbols(&addresses))?;
        }
        for (pid, tid, _, count) in self.lost_by_thread() {
            self.writer.thread_lost(&ThreadLost {
                pid: pid as u32,
                tid: tid as u32,
                count,
            })?;
        }
        self.writer.summary(summary)?;
        self.writer.end()
    }

    /// Keeps what each sampled process's JIT description files (`/tmp/perf-PID.map`,
    /// jitdump files) name, as they are now that the recording ends (they grow while the
    /// process runs; runtimes may delete them at exit, and a later process may reuse the
    /// pid): the report names JIT code from these copies.
    fn keep_jit_files(&mut self) -> io::Result<()> {
        if !self.use_proc {
            return Ok(());
        }
        for (pid, text) in std::mem::take(&mut self.vdso_maps) {
            self.writer.jit_map(&JitMap {
                pid: pid as u32,
                name: glass_symbols::vdso::MODULE.to_string(),
                text,
            })?;
        }
        let mut pids: Vec<i32> = self.processes_seen.iter().copied().collect();
        pids.sort_unstable();
        for pid in pids {
            let mapped: Vec<std::path::PathBuf> = self
                .jitdumps_mapped
                .iter()
                .filter(|(p, _)| *p == pid)
                .map(|(_, path)| path.into())
                .collect();
            let Some(text) = glass_symbols::jit::snapshot(pid as u32, &mapped) else {
                continue;
            };
            // Named after the file that names the code: the jitdump where there is one.
            let name = glass_symbols::jit::files_for_pid(pid as u32)
                .into_iter()
                .chain(mapped)
                .filter_map(|path| path.file_name().map(|n| n.to_string_lossy().into_owned()))
                .find(|name| name.starts_with("jit-"))
                .unwrap_or_else(|| format!("perf-{pid}.map"));
            self.writer.jit_map(&JitMap {
                pid: pid as u32,
                name,
                text,
            })?;
        }
        Ok(())
    }
}

/// The flags for how a walk over a stack copy of `copied` bytes ended, having asked for
/// `wanted` bytes above the stack pointer: SAMPLE_TRUNCATED, with SAMPLE_STACK_CUT when
/// the walk needed more of the stack than was copied. A read far above the copy (more
/// than a thread's usual 8 MiB stack) is a frame pointer register holding data in code
/// that keeps no frame, not a short copy.
fn truncation_flags(end: WalkEnd, wanted: usize, copied: usize) -> u8 {
    match end {
        WalkEnd::Complete => 0,
        WalkEnd::DepthLimit => glass_format::SAMPLE_TRUNCATED,
        _ if wanted > copied && wanted <= 8 << 20 => {
            glass_format::SAMPLE_TRUNCATED | glass_format::SAMPLE_STACK_CUT
        }
        _ => glass_format::SAMPLE_TRUNCATED,
    }
}

/// A path that reads the mapped file: a deleted or replaced file is still readable
/// through the mapping itself.
fn readable_path(pid: i32, mapping: &Mapping) -> String {
    if mapping.deleted {
        format!(
            "/proc/{pid}/map_files/{:x}-{:x}",
            mapping.start, mapping.end
        )
    } else {
        mapping.path.clone()
    }
}

#[cfg(test)]
mod tests;
