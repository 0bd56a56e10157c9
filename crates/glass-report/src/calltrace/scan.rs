//! `--format calls`, `tree`, `invocations` (and a trace's flame graph) straight from the
//! file: the per-function figures, and when asked the per-path ones ([`PathTree`]) and
//! the invocations of a root function, summed while the file streams by, without
//! building the calls. [`super::CallTrace`] keeps every call
//! (and the model every other format needs keeps more per call): for 10^8 records that
//! is gigabytes of fresh memory, whose first touch alone (page faults) took most of a
//! report's time. Here memory is per thread (its open calls), per function (its figures
//! and its [`Durations`](super::calls::Durations)), per call path and per invocation of
//! the root (its callees' times), whatever the file's size.
//!
//! The file is read in blocks on the calling thread ([`glass_format::stream`]); each
//! traced thread's chunks go, in file order, to one worker (threads are dealt out to
//! the workers as they first appear), which decodes them straight into its tables; the
//! workers' tables are added up at the end. A traced thread's records are one stream,
//! decoded by one worker, so the result is the same for any number of workers.
//!
//! Times are kept relative to each thread's first record: the base the 44 bits of a
//! record are extended from (the session's full counter at its start) is in the trace
//! summary, written again at the end of the file, and only the header's span needs it.
//! [`ThreadState`] is the one replay of a thread's records (a state machine: entries
//! open calls, an exit closes the innermost open call of its function with the calls
//! above it whose exits were lost, an unwound record closes one that ended by longjmp or
//! an exception); [`super::CallTrace::build`] runs it too, keeping every call
//! ([`CallSink`]) where the scan only sums.

use std::collections::HashMap;
use std::path::Path;
use std::sync::mpsc::{sync_channel, SyncSender};
use std::thread::JoinHandle;

use glass_format::stream::{Item, Stream, TraceBytes};
use glass_format::{FormatError, Recording};
use glass_probe_abi::{EXIT_BIT, FUNCTION_SHIFT, TSC_BITS, UNWOUND_BIT};

use super::calls::FunctionStats;
use super::invocations::{root_id, Callees, Invocation, Invocations};
use super::paths::{PathTree, ROOT};

const TSC_MASK: u64 = (1 << TSC_BITS) - 1;
/// Chunks queued per worker: a few blocks' worth, so the reader runs ahead of the
/// workers without holding more of the file.
const QUEUE: usize = 64;

/// The figures of `--format calls` for a whole recording.
#[derive(Debug, Default)]
pub struct Scan {
    /// Everything in the file but the call records.
    pub recording: Recording,
    /// Per function id, its figures (functions that were called).
    pub stats: HashMap<u32, FunctionStats>,
    /// The calls merged by path, when asked for.
    pub paths: Option<PathTree>,
    /// The invocations of the root asked for (by start), when it names a traced function.
    pub invocations: Invocations,
    /// Calls seen (each entry record is one).
    pub calls: u64,
    /// Traced threads (pid, tid) with records, in order of appearance.
    pub threads: Vec<(u32, u32)>,
    /// The earliest and latest record time (full counter values).
    pub first: u64,
    pub last: u64,
    /// Call records decoded (words / stride).
    pub records: u64,
    /// Trace chunks read.
    pub chunks: u64,
}

impl Scan {
    pub fn span(&self) -> u64 {
        self.last.saturating_sub(self.first)
    }
}

/// What is summed besides the per-function figures.
#[derive(Debug, Clone, Default)]
pub struct Wanted {
    /// Per call path ([`Scan::paths`]).
    pub paths: bool,
    /// The invocations of the traced function of this name ([`Scan::invocations`]).
    pub root: Option<String>,
}

/// What the workers sum (the root resolved to its function id).
#[derive(Debug, Clone, Copy)]
struct Config {
    paths: bool,
    root: Option<u32>,
}

/// Reads a `glass trace` recording and sums its calls per function (and what `wanted`
/// asks for), with `workers` threads decoding (1: on the calling thread). Errors only
/// when nothing can be read at all, as [`glass_format::read_file`]; damage is in
/// `recording.damage`.
pub fn scan_file(path: &Path, workers: usize, wanted: &Wanted) -> Result<Scan, FormatError> {
    let (mut stride, mut stop, mut root) = (None, None, None);
    // A second pass is needed only when the first one learns, too late, that a chunk's
    // body was bad (everything from it on is dropped, as the whole-file reader does) or
    // that the records carry a different number of counter words than the summary
    // before them said (or, in a file glass did not write, that the root's name came
    // after the first call records); a third only for two of these.
    for _ in 0..4 {
        let pass = pass(path, workers.max(1), wanted, root, stride, stop.clone())?;
        let named = wanted
            .root
            .as_deref()
            .and_then(|name| root_id(&function_names(&pass.scan.recording), name).ok());
        let words = 1 + pass
            .scan
            .recording
            .trace_summary
            .as_ref()
            .map_or(0, |s| s.counters.len());
        match pass.bad_chunk {
            Some(damage) if stop.is_none() => stop = Some(damage),
            // (Without a chunk there is nothing to read again.)
            _ if pass.scan.chunks > 0 && pass.stride != words => stride = Some(words),
            _ if pass.scan.chunks > 0 && named != pass.root => root = named,
            _ => return Ok(pass.scan),
        }
    }
    Err(FormatError::Io(
        "the recording's call records could not be framed consistently".into(),
    ))
}

fn function_names(recording: &Recording) -> HashMap<u32, String> {
    recording
        .trace_functions
        .iter()
        .map(|f| (f.id, f.name.clone()))
        .collect()
}

struct Pass {
    scan: Scan,
    stride: usize,
    /// The root's function id the workers used.
    root: Option<u32>,
    /// The first chunk whose body did not decode, as damage at its offset.
    bad_chunk: Option<FormatError>,
}

fn pass(
    path: &Path,
    workers: usize,
    wanted: &Wanted,
    root: Option<u32>,
    stride: Option<usize>,
    stop: Option<FormatError>,
) -> Result<Pass, FormatError> {
    let mut stream = Stream::open(path)?;
    if workers > 1 {
        // The workers give the blocks back as they go; a few blocks per worker keep
        // them busy (first-touching more memory costs more than it saves).
        stream.limit_blocks(2 + 2 * workers);
    }
    let mut scan = Scan {
        recording: Recording {
            file_len: std::fs::metadata(path).map_or(0, |m| m.len() as usize),
            version: stream.version(),
            ..Recording::default()
        },
        ..Scan::default()
    };
    let stop_at = match &stop {
        Some(FormatError::Corrupt { offset, .. }) => *offset,
        _ => usize::MAX,
    };
    let mut thread_index: HashMap<(u32, u32), usize> = HashMap::new();
    let mut engine: Option<Engine> = None;
    let mut config = Config {
        paths: wanted.paths,
        root,
    };
    loop {
        if stream.offset() >= stop_at {
            scan.recording.add(Err(stop.clone().unwrap()));
            break;
        }
        let Some(item) = stream.next() else { break };
        match item {
            // (The stream may have skipped records of unknown kinds up to it.)
            Ok(Item::Trace(chunk)) if chunk.offset >= stop_at => {
                scan.recording.add(Err(stop.clone().unwrap()));
                break;
            }
            Ok(Item::Trace(chunk)) => {
                let next = scan.threads.len();
                let thread = *thread_index.entry((chunk.pid, chunk.tid)).or_insert(next);
                if thread == next {
                    scan.threads.push((chunk.pid, chunk.tid));
                }
                // The counters each record carries are named by the summary written
                // before the first chunk (and again at the end).
                let recording = &scan.recording;
                let engine = engine.get_or_insert_with(|| {
                    let counters = recording
                        .trace_summary
                        .as_ref()
                        .map_or(0, |s| s.counters.len());
                    // The root by the names written before the first calls (glass writes
                    // them all there; a later name means another pass).
                    if root.is_none() {
                        config.root = wanted
                            .root
                            .as_deref()
                            .and_then(|name| root_id(&function_names(recording), name).ok());
                    }
                    Engine::start(workers, config, stride.unwrap_or(1 + counters))
                });
                scan.chunks += 1;
                engine.chunk(thread, chunk);
            }
            Ok(Item::Record(record)) => scan.recording.add(Ok(record)),
            // Damaged blocks are skipped (the stream goes on behind them).
            Err(error) if !error.ends_reading() => scan.recording.add(Err(error)),
            Err(error) => {
                scan.recording.add(Err(error));
                break;
            }
        }
    }
    scan.recording.finish(stream.offset());
    drop(stream);
    let stride = engine.as_ref().map_or(0, |e| e.stride);
    let workers = engine.map_or(Vec::new(), Engine::finish);
    let bad_chunk = gather(&mut scan, workers);
    Ok(Pass {
        scan,
        root: config.root,
        stride: stride.max(1),
        bad_chunk: bad_chunk.map(|(offset, what)| FormatError::Corrupt { offset, what }),
    })
}

/// Adds up what the workers found into `scan`: records, calls and their statistics, the
/// paths, and the invocations in the order they began (their starts made whole from
/// the session's first cycle count). The first chunk a worker could not decode, if any:
/// (offset, what).
fn gather(scan: &mut Scan, workers: Vec<Worker>) -> Option<(usize, &'static str)> {
    let tsc_start = scan
        .recording
        .trace_summary
        .as_ref()
        .map_or(0, |s| s.tsc_start);
    let mut bad_chunk: Option<(usize, &'static str)> = None;
    let mut first = u64::MAX;
    let mut last = 0;
    // Invocations with their full start: (start, thread, ordinal, invocation); their
    // callees stay where each worker packed them.
    let mut invocations: Vec<(u64, u32, u64, Invocation)> = Vec::new();
    for (part, worker) in workers.into_iter().enumerate() {
        if let Some((offset, what)) = worker.error {
            if bad_chunk.is_none_or(|(o, _)| offset < o) {
                bad_chunk = Some((offset, what));
            }
        }
        scan.records += worker.words / worker.stride as u64;
        let mut bases: HashMap<u32, u64> = HashMap::new();
        for (_, thread) in worker.threads {
            match thread.first_low {
                Some(low) => {
                    // The first value at or after the session's start with these bits.
                    let start = tsc_start.wrapping_add(low.wrapping_sub(tsc_start) & TSC_MASK);
                    first = first.min(start);
                    last = last.max(start.wrapping_add(thread.now));
                    bases.insert(thread.thread, start);
                }
                None => last = last.max(tsc_start),
            }
        }
        for found in worker.sums.invocations {
            let start = bases[&found.thread].wrapping_add(found.start);
            let invocation = Invocation {
                tid: scan.threads[found.thread as usize].1,
                start,
                cycles: found.cycles,
                part: part as u32,
                first: found.first,
                count: found.count,
            };
            invocations.push((start, found.thread, found.ordinal, invocation));
        }
        scan.invocations.parts.push(worker.sums.callees);
        if let Some(tree) = worker.sums.paths {
            match &mut scan.paths {
                Some(paths) => paths.merge(tree),
                None => scan.paths = Some(tree),
            }
        }
        for (function, stats) in worker.sums.functions.into_iter().enumerate() {
            if stats.calls == 0 {
                continue;
            }
            scan.calls += stats.calls;
            scan.stats.entry(function as u32).or_default().merge(stats);
        }
    }
    for stats in scan.stats.values_mut() {
        stats.durations.finish();
    }
    scan.first = if first == u64::MAX { 0 } else { first };
    scan.last = last;
    invocations.sort_unstable_by_key(|&(start, thread, ordinal, _)| (start, thread, ordinal));
    scan.invocations.rows = invocations
        .into_iter()
        .map(|(start, _, _, mut invocation)| {
            invocation.start = start.saturating_sub(scan.first);
            invocation
        })
        .collect();
    bad_chunk
}

/// The workers: on this thread (one), or threads fed by queues.
struct Engine {
    stride: usize,
    workers: Workers,
}

enum Workers {
    Inline(Box<Worker>),
    Threads {
        /// Workers to start at most.
        most: usize,
        config: Config,
        queues: Vec<SyncSender<(usize, TraceBytes)>>,
        handles: Vec<JoinHandle<Worker>>,
    },
}

impl Engine {
    fn start(workers: usize, config: Config, stride: usize) -> Engine {
        let workers = if workers == 1 {
            Workers::Inline(Box::new(Worker::new(stride, config)))
        } else {
            Workers::Threads {
                most: workers,
                config,
                queues: Vec::new(),
                handles: Vec::new(),
            }
        };
        Engine { stride, workers }
    }

    fn chunk(&mut self, thread: usize, chunk: TraceBytes) {
        let stride = self.stride;
        match &mut self.workers {
            Workers::Inline(worker) => worker.chunk(thread, &chunk),
            Workers::Threads {
                most,
                config,
                queues,
                handles,
            } => {
                // Threads are numbered as they appear: a worker is started for each new
                // one until there are `most`, so a trace of one thread starts one.
                let worker = thread % *most;
                if worker == queues.len() {
                    let (queue, chunks) = sync_channel::<(usize, TraceBytes)>(QUEUE);
                    queues.push(queue);
                    let config = *config;
                    handles.push(std::thread::spawn(move || {
                        let mut worker = Worker::new(stride, config);
                        for (thread, chunk) in chunks {
                            worker.chunk(thread, &chunk);
                        }
                        worker.finish();
                        worker
                    }));
                }
                // A worker only stops early by panicking, which finish() passes on.
                let _ = queues[worker].send((thread, chunk));
            }
        }
    }

    fn finish(self) -> Vec<Worker> {
        match self.workers {
            Workers::Inline(mut worker) => {
                worker.finish();
                vec![*worker]
            }
            Workers::Threads {
                queues, handles, ..
            } => {
                drop(queues);
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                    .collect()
            }
        }
    }
}

/// Every call, kept (for [`super::CallTrace`]), with times relative to its thread's
/// first record.
#[derive(Default)]
pub(crate) struct CallSink {
    pub calls: Vec<super::Call>,
    /// Per call, the counters' increase over it (`counters` values per call).
    pub counter_deltas: Vec<u64>,
    pub counters: usize,
}

/// What a worker sums its threads' calls into.
pub(crate) struct Sums {
    /// By function id.
    functions: Vec<FunctionStats>,
    paths: Option<PathTree>,
    root: Option<u32>,
    invocations: Vec<Found>,
    /// The callees of `invocations`, packed.
    callees: Callees,
    /// Every call, when kept.
    pub calls: Option<CallSink>,
}

impl Sums {
    /// Sums that keep every call and nothing else.
    pub(crate) fn calls(counters: usize) -> Sums {
        Sums {
            functions: Vec::new(),
            paths: None,
            root: None,
            invocations: Vec::new(),
            callees: Callees::default(),
            calls: Some(CallSink {
                counters,
                ..CallSink::default()
            }),
        }
    }
}

/// An invocation of the root as a worker found it.
struct Found {
    thread: u32,
    /// The root call's ordinal among its thread's calls.
    ordinal: u64,
    /// Relative to its thread's first record.
    start: u64,
    cycles: u64,
    /// Its callees in the worker's [`Callees`].
    first: usize,
    count: u32,
}

/// The invocation of the root a thread is in.
struct Active {
    /// The root call's place on the stack.
    depth: usize,
    ordinal: u64,
}

/// One worker's threads and its sums.
struct Worker {
    /// Words per record: the record and one per hardware counter.
    stride: usize,
    threads: HashMap<usize, ThreadState>,
    sums: Sums,
    words: u64,
    /// The first chunk whose body did not decode; later chunks are left alone.
    error: Option<(usize, &'static str)>,
}

impl Worker {
    fn new(stride: usize, config: Config) -> Worker {
        Worker {
            stride,
            threads: HashMap::new(),
            sums: Sums {
                functions: Vec::new(),
                paths: config.paths.then(PathTree::default),
                root: config.root,
                invocations: Vec::new(),
                callees: Callees::default(),
                calls: None,
            },
            words: 0,
            error: None,
        }
    }

    fn chunk(&mut self, thread: usize, chunk: &TraceBytes) {
        if self.error.is_some() {
            return;
        }
        let stride = self.stride;
        let state = self
            .threads
            .entry(thread)
            .or_insert_with(|| ThreadState::new(thread as u32, stride));
        let sums = &mut self.sums;
        let result = if stride == 1 {
            chunk.for_each_word(|word| state.record(word, &[], sums))
        } else {
            chunk.for_each_word(|word| state.word(word, sums))
        };
        self.words += chunk.count;
        if let Err(what) = result {
            self.error = Some((chunk.offset, what));
        }
    }

    /// Closes the calls still open at each thread's last record.
    fn finish(&mut self) {
        for state in self.threads.values_mut() {
            state.finish(&mut self.sums);
        }
    }
}

/// A call entered and not yet left.
#[derive(Debug, Clone, Copy)]
struct Open {
    function: u32,
    /// A call of the same function is open below it (recursion: its time is inside
    /// that call's already).
    nested: bool,
    start: u64,
    /// Inclusive time of its callees.
    children: u64,
    /// Its call path (when paths are summed).
    node: u32,
    /// Inside an invocation of the root, the outermost call of its function there: its
    /// time is the function's in the invocation.
    counted: bool,
    /// Its index in the [`CallSink`], when calls are kept.
    call: usize,
}

/// One traced thread's replay.
pub(crate) struct ThreadState {
    /// Its index among the recording's threads.
    thread: u32,
    /// Calls entered so far.
    entries: u64,
    stride: usize,
    /// The low bits of the first record, and the time since it.
    pub first_low: Option<u64>,
    last_low: u64,
    pub now: u64,
    stack: Vec<Open>,
    /// Per function id, its calls on the stack.
    open: Vec<u32>,
    /// The invocation of the root under way, if any.
    invocation: Option<Active>,
    /// Per function id, its calls open inside the invocation (all 0 between them).
    inside: Vec<u32>,
    /// Per function id, its place in the invocation's callees (`u32::MAX`: none yet).
    callee_slot: Vec<u32>,
    /// Inclusive cycles per callee of the invocation, at its outermost call.
    callees: Vec<(u32, u64)>,
    /// The counters at each open call's entry (`stride - 1` values per call).
    at_entry: Vec<u64>,
    /// The words of a record split across chunks.
    partial: Vec<u64>,
}

impl ThreadState {
    pub fn new(thread: u32, stride: usize) -> ThreadState {
        ThreadState {
            thread,
            entries: 0,
            stride,
            first_low: None,
            last_low: 0,
            now: 0,
            stack: Vec::new(),
            open: Vec::new(),
            invocation: None,
            inside: Vec::new(),
            callee_slot: Vec::new(),
            callees: Vec::new(),
            at_entry: Vec::new(),
            partial: Vec::with_capacity(stride),
        }
    }

    /// The calls still open at the thread's last record end there, incomplete.
    pub fn finish(&mut self, sums: &mut Sums) {
        while let Some(open) = self.stack.pop() {
            let now = self.now;
            self.close(open, now, None, false, false, sums);
        }
    }

    /// A word of a record that carries counters.
    pub fn word(&mut self, word: u64, sums: &mut Sums) {
        self.partial.push(word);
        if self.partial.len() == self.stride {
            let record = std::mem::take(&mut self.partial);
            self.record(record[0], &record[1..], sums);
            self.partial = record;
            self.partial.clear();
        }
    }

    #[inline]
    pub fn record(&mut self, word: u64, values: &[u64], sums: &mut Sums) {
        let low = word & TSC_MASK;
        match self.first_low {
            Some(_) => self.now += low.wrapping_sub(self.last_low) & TSC_MASK,
            None => self.first_low = Some(low),
        }
        self.last_low = low;
        let now = self.now;
        let function = (word >> FUNCTION_SHIFT) as u32;
        let index = function as usize;
        if word & (1 << EXIT_BIT) == 0 {
            if index >= self.open.len() {
                self.open.resize(index + 1, 0);
            }
            let nested = self.open[index] > 0;
            self.open[index] += 1;
            let node = match &mut sums.paths {
                Some(paths) => {
                    let parent = self.stack.last().map_or(ROOT, |o| o.node);
                    paths.child(parent, function, (self.thread, self.entries))
                }
                None => ROOT,
            };
            let mut counted = false;
            if self.invocation.is_some() {
                if index >= self.inside.len() {
                    self.inside.resize(index + 1, 0);
                    self.callee_slot.resize(index + 1, u32::MAX);
                }
                counted = self.inside[index] == 0;
                self.inside[index] += 1;
            } else if sums.root == Some(function) && !nested {
                self.invocation = Some(Active {
                    depth: self.stack.len(),
                    ordinal: self.entries,
                });
            }
            let call = match &mut sums.calls {
                Some(sink) => {
                    sink.calls.push(super::Call {
                        function,
                        thread: self.thread as usize,
                        start: now,
                        end: now,
                        depth: self.stack.len() as u32,
                        parent: self.stack.last().map(|o| o.call),
                        children: 0,
                        unwound: false,
                        incomplete: false,
                        nested_in_itself: nested,
                    });
                    let counters = sink.counters;
                    sink.counter_deltas.extend(std::iter::repeat_n(0, counters));
                    sink.calls.len() - 1
                }
                None => 0,
            };
            self.entries += 1;
            self.stack.push(Open {
                function,
                nested,
                start: now,
                children: 0,
                node,
                counted,
                call,
            });
            self.at_entry.extend_from_slice(values);
            return;
        }
        if self.open.get(index).is_none_or(|&n| n == 0) {
            return; // its entry was lost
        }
        let unwound = word & (1 << UNWOUND_BIT) != 0;
        let position = self
            .stack
            .iter()
            .rposition(|o| o.function == function)
            .expect("an open call of the function");
        // Calls above it whose exits were lost end with it.
        while self.stack.len() > position {
            let open = self.stack.pop().unwrap();
            let matched = self.stack.len() == position;
            self.close(open, now, Some(values), matched, matched && unwound, sums);
        }
    }

    #[inline]
    fn close(
        &mut self,
        open: Open,
        end: u64,
        values: Option<&[u64]>,
        matched: bool,
        unwound: bool,
        sums: &mut Sums,
    ) {
        let cycles = end - open.start;
        let counters = self.stride - 1;
        if let Some(sink) = &mut sums.calls {
            let call = &mut sink.calls[open.call];
            call.end = end;
            call.children = open.children;
            call.unwound = unwound;
            call.incomplete = !matched;
            if let Some(values) = values {
                let entry = self.at_entry.len() - counters;
                let deltas = &mut sink.counter_deltas[open.call * counters..][..counters];
                for (i, delta) in deltas.iter_mut().enumerate() {
                    *delta = values[i].wrapping_sub(self.at_entry[entry + i]);
                }
            }
        }
        if let Some(parent) = self.stack.last_mut() {
            parent.children += cycles;
        }
        if let Some(paths) = &mut sums.paths {
            paths.close(open.node, cycles, open.children);
        }
        if let Some(active) = &mut self.invocation {
            if self.stack.len() == active.depth {
                // The root's call itself ends its invocation.
                let ordinal = active.ordinal;
                self.invocation = None;
                self.callees.sort_unstable();
                let first = sums.callees.len();
                for &(function, cycles) in &self.callees {
                    self.callee_slot[function as usize] = u32::MAX;
                    sums.callees.push(function, cycles);
                }
                sums.invocations.push(Found {
                    thread: self.thread,
                    ordinal,
                    start: open.start,
                    cycles,
                    first,
                    count: self.callees.len() as u32,
                });
                self.callees.clear();
            } else {
                let index = open.function as usize;
                self.inside[index] -= 1;
                if open.counted {
                    let slot = &mut self.callee_slot[index];
                    if *slot == u32::MAX {
                        *slot = self.callees.len() as u32;
                        self.callees.push((open.function, 0));
                    }
                    self.callees[*slot as usize].1 += cycles;
                }
            }
        }
        let functions = &mut sums.functions;
        self.open[open.function as usize] -= 1;
        let index = open.function as usize;
        if index >= functions.len() {
            functions.resize_with(index + 1, FunctionStats::default);
        }
        let stats = &mut functions[index];
        stats.calls += 1;
        stats.self_time += cycles.saturating_sub(open.children);
        // A call still open at the end of the records (under way when the trace ended)
        // has no duration of its own: min, p50, p99 and max are of whole calls.
        if matched || unwound {
            stats.durations.add(cycles);
        }
        stats.unwound += unwound as u64;
        let entry = self.at_entry.len() - counters;
        if !open.nested {
            stats.total += cycles;
            if counters > 0 {
                stats.counters.resize(counters, 0);
                // A call closed at the end of the records has no counter values.
                if let Some(values) = values {
                    for (i, sum) in stats.counters.iter_mut().enumerate() {
                        *sum = sum.wrapping_add(values[i].wrapping_sub(self.at_entry[entry + i]));
                    }
                }
            }
        }
        self.at_entry.truncate(entry);
    }
}
