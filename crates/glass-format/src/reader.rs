use std::path::Path;

use crate::stream::{Item, Stream};
use crate::varint::{get_i64, get_u64};
use crate::{
    tag, Meta, Module, Process, ProcessKind, Record, Sample, Snapshot, Summary, Thread, ThreadExit,
};
use crate::{Arch, Backend, BLOCKS_VERSION, HEADER_LEN, MAGIC, OLDEST_VERSION, VERSION};
use crate::{GuestRam, PyCode, PyFrame, PyStack};
use crate::{GuestTask, KernelSymbol, KernelSymbols, ThreadLost};
use crate::{JitMap, TraceChunk, TraceFunction, TraceSkipped, TraceSummary};

/// Records larger than this are taken as corruption rather than allocated.
pub(crate) const MAX_RECORD_LEN: usize = 64 << 20;

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum FormatError {
    #[error("not a .glass file (bad magic)")]
    NotGlass,
    #[error(".glass format version {0} is not supported (this glass reads versions {OLDEST_VERSION} to {VERSION})")]
    UnsupportedVersion(u32),
    #[error("truncated at byte {offset}: the recorder stopped before finishing the file")]
    Truncated { offset: usize },
    #[error("corrupt record at byte {offset}: {what}")]
    Corrupt { offset: usize, what: &'static str },
    /// Version 3: blocks that failed their check, skipped; the reading goes on behind
    /// them. `blocks` 0: the damage runs to the end of the file.
    #[error("{}", damaged_text(*first_block, *blocks, *offset, *lost, what))]
    Damaged {
        first_block: u32,
        blocks: u32,
        offset: usize,
        lost: usize,
        what: &'static str,
    },
    /// Version 3: the header's magic, version or checksum was damaged (and mended from
    /// the others).
    #[error("the file header is damaged (its checksum does not match; read as version 3)")]
    HeaderDamaged,
    #[error("{0}")]
    Io(String),
}

fn damaged_text(first: u32, blocks: u32, offset: usize, lost: usize, what: &str) -> String {
    let end = offset + lost;
    match blocks {
        0 => format!("damaged from byte {offset} to the end ({what}): {lost} bytes lost"),
        1 => format!("block {first} (bytes {offset}-{end}) damaged ({what}): {lost} bytes lost"),
        n => format!(
            "blocks {first}-{} (bytes {offset}-{end}) damaged ({what}): {lost} bytes lost",
            first as u64 + n as u64 - 1
        ),
    }
}

impl FormatError {
    /// Whether nothing after this can be read (else: damaged blocks were skipped and
    /// the reading went on).
    pub fn ends_reading(&self) -> bool {
        !matches!(
            self,
            FormatError::Damaged { .. } | FormatError::HeaderDamaged
        )
    }

    /// File bytes this damage made unreadable (0 when not known here: a truncation
    /// costs what was never written).
    pub fn lost_bytes(&self) -> usize {
        match self {
            FormatError::Damaged { lost, .. } => *lost,
            _ => 0,
        }
    }
}

/// Iterates the records of an in-memory `.glass` file: [`Stream`] over the bytes, with
/// trace chunks decoded. After an error that [ends the reading](FormatError::ends_reading)
/// it yields nothing more; damaged blocks are yielded as errors and skipped.
pub struct Reader<'a> {
    stream: Stream<&'a [u8]>,
}

impl<'a> Reader<'a> {
    /// Checks the header.
    pub fn new(bytes: &'a [u8]) -> Result<Self, FormatError> {
        Ok(Reader {
            stream: Stream::new(bytes)?,
        })
    }

    /// The file's format version.
    pub fn version(&self) -> u32 {
        self.stream.version()
    }

    /// Byte offset of the next record.
    pub fn offset(&self) -> usize {
        self.stream.offset()
    }
}

impl Iterator for Reader<'_> {
    type Item = Result<Record, FormatError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.stream.next().map(decoded)
    }
}

/// A streamed item as a record, its trace chunk decoded. A chunk whose body does not
/// decode (in a checked block: a writer other than glass) is damage that ends the
/// reading: the calls behind it cannot be paired up.
fn decoded(item: Result<Item, FormatError>) -> Result<Record, FormatError> {
    match item? {
        Item::Record(record) => Ok(record),
        Item::Trace(chunk) => match chunk.words() {
            Ok(words) => Ok(Record::TraceChunk(TraceChunk {
                pid: chunk.pid,
                tid: chunk.tid,
                words,
            })),
            Err(what) => Err(chunk.damage(what)),
        },
    }
}

/// Everything a `.glass` file holds, in file order per kind.
#[derive(Debug, Default, Clone)]
pub struct Recording {
    pub meta: Option<Meta>,
    pub processes: Vec<Process>,
    pub modules: Vec<Module>,
    pub threads: Vec<Thread>,
    pub thread_exits: Vec<ThreadExit>,
    pub samples: Vec<Sample>,
    pub snapshots: Vec<Snapshot>,
    pub summary: Option<Summary>,
    pub trace_functions: Vec<TraceFunction>,
    pub trace_skipped: Vec<TraceSkipped>,
    pub trace_chunks: Vec<TraceChunk>,
    pub trace_summary: Option<TraceSummary>,
    /// Copies of the processes' JIT description files, kept when the recording ended.
    pub jit_maps: Vec<JitMap>,
    /// Samples the kernel dropped, per thread (perf backend).
    pub thread_lost: Vec<ThreadLost>,
    /// Names of the kernel frames (perf backend with kernel stacks).
    pub kernel_symbols: KernelSymbols,
    /// The tasks VM guests' vCPUs ran, in file order (see [`GuestTask`]).
    pub guest_tasks: Vec<GuestTask>,
    /// The recorder's warnings that every report repeats ([`Record::Note`]).
    pub notes: Vec<String>,
    /// The Python code objects the Python frames name.
    pub py_codes: Vec<PyCode>,
    /// The Python frames of samples (each after its sample).
    pub py_stacks: Vec<PyStack>,
    /// Where a VM guest's RAM was read from (absent in other recordings and in files
    /// written before it was recorded).
    pub guest_ram: Option<GuestRam>,
    /// The file ended with an End record.
    pub complete: bool,
    /// The first damage found, if any (what stopped the reader early, or the first
    /// damaged blocks of several): the records of the intact blocks are kept.
    pub damage: Option<FormatError>,
    /// Every damage found, in file order (the first is [`Recording::damage`]).
    pub damaged: Vec<FormatError>,
    /// File bytes the damaged blocks held (a truncation not counted).
    pub lost_bytes: usize,
    pub file_len: usize,
    /// The file's format version.
    pub version: u32,
}

/// Reads a whole recording. Errors only when nothing can be read at all (not a .glass
/// file, unsupported version, unreadable file); a damaged or truncated tail is reported
/// in [`Recording::damage`] with everything before it kept.
///
/// The file is streamed in blocks (see [`crate::stream`]), not read whole: only the
/// decoded records take memory.
pub fn read_file(path: &Path) -> Result<Recording, FormatError> {
    let file = std::fs::File::open(path).map_err(|e| FormatError::Io(e.to_string()))?;
    let file_len = file
        .metadata()
        .map_err(|e| FormatError::Io(e.to_string()))?
        .len() as usize;
    read_from(file, file_len)
}

/// [`read_file`] from any reader (`file_len`: what [`Recording::file_len`] says).
pub fn read_from(input: impl std::io::Read, file_len: usize) -> Result<Recording, FormatError> {
    let mut recording = Recording {
        file_len,
        ..Recording::default()
    };
    let mut stream = Stream::new(input)?;
    recording.version = stream.version();
    for item in &mut stream {
        let record = decoded(item);
        let stop = record.as_ref().is_err_and(|e| e.ends_reading());
        recording.add(record);
        if stop {
            break;
        }
    }
    recording.finish(stream.offset());
    Ok(recording)
}

pub fn read_bytes(bytes: &[u8]) -> Result<Recording, FormatError> {
    read_from(bytes, bytes.len())
}

impl Recording {
    /// The damage in one line (`None`: the file is whole): the first damage, and how
    /// many more and what they cost.
    pub fn damage_summary(&self) -> Option<String> {
        let first = match self.damaged.first()? {
            FormatError::Truncated { offset } if self.file_len > *offset => format!(
                "{} ({} bytes after it dropped: written in part)",
                self.damaged[0],
                self.file_len - offset
            ),
            first => first.to_string(),
        };
        let more = self.damaged.len() - 1;
        Some(match (more, self.lost_bytes) {
            (0, _) => first.to_string(),
            (more, lost) => format!(
                "{first}; {more} more damaged place{} ({lost} bytes lost in all, of {})",
                if more == 1 { "" } else { "s" },
                self.file_len
            ),
        })
    }

    /// Files one record (or the error that ended the reading) under its kind.
    pub fn add(&mut self, record: Result<Record, FormatError>) {
        match record {
            Ok(Record::Meta(meta)) => self.meta = Some(meta),
            Ok(Record::Process(process)) => self.processes.push(process),
            Ok(Record::Module(module)) => self.modules.push(module),
            Ok(Record::Thread(thread)) => self.threads.push(thread),
            Ok(Record::ThreadExit(exit)) => self.thread_exits.push(exit),
            Ok(Record::Sample(sample)) => self.samples.push(sample),
            Ok(Record::Snapshot(snapshot)) => self.snapshots.push(snapshot),
            Ok(Record::Summary(summary)) => self.summary = Some(summary),
            Ok(Record::TraceFunction(f)) => self.trace_functions.push(f),
            Ok(Record::TraceSkipped(s)) => self.trace_skipped.push(s),
            Ok(Record::TraceChunk(chunk)) => self.trace_chunks.push(chunk),
            Ok(Record::TraceSummary(summary)) => self.trace_summary = Some(summary),
            Ok(Record::JitMap(map)) => self.jit_maps.push(map),
            Ok(Record::ThreadLost(lost)) => self.thread_lost.push(lost),
            Ok(Record::KernelSymbols(symbols)) => {
                self.kernel_symbols.symbols.extend(symbols.symbols);
                self.kernel_symbols.symbols.sort_by_key(|s| s.start);
                self.kernel_symbols.symbols.dedup_by_key(|s| s.start);
            }
            Ok(Record::GuestTask(task)) => self.guest_tasks.push(task),
            Ok(Record::Note(note)) => self.notes.push(note),
            Ok(Record::PyCode(code)) => self.py_codes.push(code),
            Ok(Record::PyStack(stack)) => self.py_stacks.push(stack),
            Ok(Record::GuestRam(ram)) => self.guest_ram = Some(ram),
            Ok(Record::End) => self.complete = true,
            Err(error) => {
                self.lost_bytes += error.lost_bytes();
                if self.damage.is_none() {
                    self.damage = Some(error.clone());
                }
                self.damaged.push(error);
            }
        }
    }

    /// After the last record: a file that stopped without damage and without its End
    /// record was cut off at `offset`.
    pub fn finish(&mut self, offset: usize) {
        // (Damage that ran to the end of the file took the End record with it.)
        let ended = self.damaged.last().is_some_and(|e| {
            e.ends_reading() || matches!(e, FormatError::Damaged { blocks: 0, .. })
        });
        if !self.complete && !ended {
            self.add(Err(FormatError::Truncated { offset }));
        }
    }
}

/// The file's format version, from a header at the start of `bytes` (the whole file
/// or its first block), and whether the header is damaged.
///
/// A version 3 header carries the CRC-32 of its magic and version, so a damaged byte
/// among them is found and mended: a header whose checksum matches the magic and
/// version 3 in place of what it holds is a version 3 file with a damaged header (a
/// version 1 or 2 file has zeros there, which match no header).
pub(crate) fn check_header(bytes: &[u8]) -> Result<(u32, bool), FormatError> {
    if bytes.len() >= HEADER_LEN {
        let crc = u32::from_le_bytes(bytes[12..16].try_into().unwrap());
        let mut mended = [0u8; 12];
        mended[..8].copy_from_slice(&MAGIC);
        mended[8..].copy_from_slice(&BLOCKS_VERSION.to_le_bytes());
        if crc != 0 && crc32fast::hash(&mended) == crc {
            let damaged = bytes[..12] != mended;
            return Ok((BLOCKS_VERSION, damaged));
        }
    }
    if bytes.len() < 8 || bytes[..8] != MAGIC {
        return Err(FormatError::NotGlass);
    }
    if bytes.len() < HEADER_LEN {
        return Err(FormatError::Truncated {
            offset: bytes.len(),
        });
    }
    let version = u32::from_le_bytes(bytes[8..12].try_into().unwrap());
    if !(OLDEST_VERSION..=VERSION).contains(&version) {
        return Err(FormatError::UnsupportedVersion(version));
    }
    // Version 3 with a checksum that matched nothing above: the checksum itself is
    // damaged (the magic and version are as they should be).
    Ok((version, version >= BLOCKS_VERSION))
}

/// A trace chunk's pid, tid and word count, and where its words start in the payload;
/// checks what can be checked without decoding them.
pub(crate) fn trace_head(
    record_tag: u8,
    bytes: &[u8],
) -> Result<(u32, u32, u64, usize), &'static str> {
    let mut p = Payload { bytes, pos: 0 };
    let (pid, tid, count) = (p.u32()?, p.u32()?, p.u64()?);
    let rest = (bytes.len() - p.pos) as u64;
    if record_tag == tag::TRACE_CHUNK {
        if count.checked_mul(8) != Some(rest) {
            return Err("trace chunk length does not match its count");
        }
    } else if count > rest {
        // Each packed record takes at least one byte.
        return Err("packed record count out of range");
    }
    Ok((pid, tid, count, p.pos))
}

/// A cursor over one record's payload; every getter fails instead of panicking.
struct Payload<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Payload<'a> {
    fn u64(&mut self) -> Result<u64, &'static str> {
        get_u64(self.bytes, &mut self.pos).ok_or("bad integer")
    }
    fn i64(&mut self) -> Result<i64, &'static str> {
        get_i64(self.bytes, &mut self.pos).ok_or("bad integer")
    }
    fn u32(&mut self) -> Result<u32, &'static str> {
        u32::try_from(self.u64()?).map_err(|_| "integer out of range")
    }
    fn u8(&mut self) -> Result<u8, &'static str> {
        let byte = *self.bytes.get(self.pos).ok_or("record too short")?;
        self.pos += 1;
        Ok(byte)
    }
    fn bytes(&mut self) -> Result<&'a [u8], &'static str> {
        let len = usize::try_from(self.u64()?).map_err(|_| "length out of range")?;
        let end = self.pos.checked_add(len).ok_or("length out of range")?;
        let slice = self
            .bytes
            .get(self.pos..end)
            .ok_or("string runs past record")?;
        self.pos = end;
        Ok(slice)
    }
    fn string(&mut self) -> Result<String, &'static str> {
        Ok(String::from_utf8_lossy(self.bytes()?).into_owned())
    }
    /// Nothing left of the record (a field added later is absent).
    fn is_empty(&self) -> bool {
        self.pos == self.bytes.len()
    }
    fn finish<T>(&self, value: T) -> Result<T, &'static str> {
        if self.pos == self.bytes.len() {
            Ok(value)
        } else {
            Err("trailing bytes in record")
        }
    }
}

/// One record from its tag and payload, as written by a file of `version`.
pub(crate) fn decode(tag: u8, bytes: &[u8], version: u32) -> Result<Record, &'static str> {
    let mut p = Payload { bytes, pos: 0 };
    let record = match tag {
        tag::META => Record::Meta(meta(&mut p, version)?),
        tag::PROCESS => Record::Process(Process {
            time_ns: p.u64()?,
            pid: p.u32()?,
            parent_pid: p.u32()?,
            kind: match p.u8()? {
                0 => ProcessKind::Attached,
                1 => ProcessKind::Forked,
                2 => ProcessKind::Exec,
                _ => return Err("unknown process kind"),
            },
            name: p.string()?,
        }),
        tag::MODULE => Record::Module(Module {
            time_ns: p.u64()?,
            pid: p.u32()?,
            start: p.u64()?,
            end: p.u64()?,
            file_offset: p.u64()?,
            build_id: p.bytes()?.to_vec(),
            path: p.string()?,
        }),
        tag::THREAD => Record::Thread(Thread {
            time_ns: p.u64()?,
            pid: p.u32()?,
            tid: p.u32()?,
            name: p.string()?,
        }),
        tag::THREAD_EXIT => Record::ThreadExit(ThreadExit {
            time_ns: p.u64()?,
            pid: p.u32()?,
            tid: p.u32()?,
        }),
        tag::SAMPLE => Record::Sample(sample(&mut p)?),
        tag::SNAPSHOT => Record::Snapshot(Snapshot {
            time_ns: p.u64()?,
            pid: p.u32()?,
            tid: p.u32()?,
            stopped_ns: p.u32()?,
            flags: p.u8()?,
            ip: p.u64()?,
            sp: p.u64()?,
            fp: p.u64()?,
            lr: if version >= 2 { p.u64()? } else { 0 },
            stack: p.bytes()?.to_vec(),
        }),
        tag::JIT_MAP => Record::JitMap(JitMap {
            pid: p.u32()?,
            name: p.string()?,
            text: p.string()?,
        }),
        tag::THREAD_LOST => Record::ThreadLost(ThreadLost {
            pid: p.u32()?,
            tid: p.u32()?,
            count: p.u64()?,
        }),
        tag::NOTE => Record::Note(p.string()?),
        tag::KERNEL_SYMBOLS => Record::KernelSymbols(kernel_symbols(&mut p)?),
        tag::PY_CODE => Record::PyCode(PyCode {
            pid: p.u32()?,
            id: p.u32()?,
            name: p.string()?,
            file: p.string()?,
            first_line: p.u32()?,
        }),
        tag::PY_STACK => Record::PyStack(py_stack(&mut p)?),
        tag::SUMMARY => Record::Summary(Summary {
            duration_ns: p.u64()?,
            samples: p.u64()?,
            ticks: p.u64()?,
            threads: p.u32()?,
            processes: p.u32()?,
            missed_deadlines: p.u64()?,
            stopped_mean_ns: p.u64()?,
            stopped_p50_ns: p.u64()?,
            stopped_p99_ns: p.u64()?,
            stopped_max_ns: p.u64()?,
            stopped_total_ns: p.u64()?,
            lost_samples: p.u64()?,
            exit_status: i32::try_from(p.i64()?).map_err(|_| "exit status out of range")?,
        }),
        tag::TRACE_FUNCTION => Record::TraceFunction(TraceFunction {
            id: p.u32()?,
            module: p.string()?,
            address: p.u64()?,
            size: p.u64()?,
            name: p.string()?,
            // Written before the probe was recorded: none.
            probe: if p.is_empty() {
                String::new()
            } else {
                p.string()?
            },
        }),
        tag::TRACE_SKIPPED => Record::TraceSkipped(trace_skipped(&mut p)?),
        tag::TRACE_CHUNK | tag::TRACE_PACKED => Record::TraceChunk(trace_chunk(tag, &mut p)?),
        tag::TRACE_SUMMARY => Record::TraceSummary(trace_summary(&mut p)?),
        tag::GUEST_TASK => Record::GuestTask(GuestTask {
            time_ns: p.u64()?,
            pid: p.u32()?,
            tid: p.u32()?,
            task_pid: p.u32()?,
            task_tgid: p.u32()?,
            flags: p.u8()?,
            comm: p.string()?,
        }),
        tag::GUEST_RAM => Record::GuestRam(match p.u8()? {
            0 => GuestRam::Stub,
            1 => GuestRam::File {
                path: p.string()?,
                bytes: p.u64()?,
            },
            2 => GuestRam::Process {
                pid: p.u32()?,
                blocks: p.u32()?,
                bytes: p.u64()?,
            },
            _ => return Err("unknown guest RAM source"),
        }),
        tag::END => Record::End,
        _ => return Err("unknown record tag"),
    };
    p.finish(record)
}

/// The recording's first record: what was recorded, how, and where.
fn meta(p: &mut Payload, version: u32) -> Result<Meta, &'static str> {
    let start_unix_ns = p.u64()?;
    let backend = Backend::from_name(&p.string()?);
    let unwind = p.string()?;
    let frequency_hz = p.u32()?;
    let max_depth = p.u32()?;
    let target_pid = p.u32()?;
    let argc = p.u64()?;
    // Each argument takes at least one byte, which bounds the allocation.
    if argc > p.bytes.len() as u64 {
        return Err("argument count out of range");
    }
    let command = (0..argc).map(|_| p.string()).collect::<Result<_, _>>()?;
    let (hostname, glass_version, capture) = (p.string()?, p.string()?, p.string()?);
    let arch = if version >= 2 {
        let name = p.string()?;
        Arch::from_name(&name).ok_or("unknown architecture")?
    } else {
        Arch::X86_64
    };
    Ok(Meta {
        start_unix_ns,
        backend,
        arch,
        unwind,
        frequency_hz,
        max_depth,
        target_pid,
        command,
        hostname,
        glass_version,
        capture,
    })
}

/// A stack sample; its frames are stored as differences from the one before.
fn sample(p: &mut Payload) -> Result<Sample, &'static str> {
    let time_ns = p.u64()?;
    let pid = p.u32()?;
    let tid = p.u32()?;
    let stopped_ns = p.u32()?;
    let flags = p.u8()?;
    let count = p.u64()?;
    if count > p.bytes.len() as u64 {
        return Err("frame count out of range");
    }
    let mut frames = Vec::with_capacity(count as usize);
    let mut previous = 0u64;
    for _ in 0..count {
        previous = previous.wrapping_add(p.i64()? as u64);
        frames.push(previous);
    }
    Ok(Sample {
        time_ns,
        pid,
        tid,
        stopped_ns,
        flags,
        frames,
    })
}

/// The kernel's symbols; each start is stored as the difference from the one before.
fn kernel_symbols(p: &mut Payload) -> Result<KernelSymbols, &'static str> {
    let count = p.u64()?;
    // Each symbol takes at least four bytes, which bounds the allocation.
    if count > p.bytes.len() as u64 {
        return Err("symbol count out of range");
    }
    let mut symbols = Vec::with_capacity(count as usize);
    let mut start = 0u64;
    for _ in 0..count {
        start = start.wrapping_add(p.i64()? as u64);
        symbols.push(KernelSymbol {
            start,
            len: p.u64()?,
            name: p.string()?,
            module: p.string()?,
        });
    }
    Ok(KernelSymbols { symbols })
}

/// A thread's Python frames at a sample.
fn py_stack(p: &mut Payload) -> Result<PyStack, &'static str> {
    let (time_ns, pid, tid, count) = (p.u64()?, p.u32()?, p.u32()?, p.u64()?);
    // Each frame takes at least three bytes, which bounds the allocation.
    if count > p.bytes.len() as u64 {
        return Err("python frame count out of range");
    }
    let mut frames = Vec::with_capacity(count as usize);
    for _ in 0..count {
        frames.push(PyFrame {
            code: p.u32()?,
            line: p.u32()?,
            entry: p.u8()? != 0,
        });
    }
    Ok(PyStack {
        time_ns,
        pid,
        tid,
        frames,
    })
}

/// A function `glass trace` did not patch, and why.
fn trace_skipped(p: &mut Payload) -> Result<TraceSkipped, &'static str> {
    let module = p.string()?;
    let address = p.u64()?;
    let name = p.string()?;
    let reason = p.string()?;
    let kind = match p.is_empty() {
        // Written before the kind was: the reason's text before any detail.
        true => reason
            .split(['(', '`'])
            .next()
            .unwrap_or(&reason)
            .trim()
            .to_string(),
        false => p.string()?,
    };
    Ok(TraceSkipped {
        module,
        address,
        name,
        reason,
        kind,
    })
}

/// A thread's call records, as words (`TRACE_CHUNK`) or packed (`TRACE_PACKED`).
fn trace_chunk(tag: u8, p: &mut Payload) -> Result<TraceChunk, &'static str> {
    let (pid, tid, count, start) = trace_head(tag, p.bytes)?;
    let rest = &p.bytes[start..];
    let words = if tag == tag::TRACE_CHUNK {
        rest.chunks_exact(8)
            .map(|w| u64::from_le_bytes(w.try_into().unwrap()))
            .collect()
    } else {
        crate::packed::unpack(rest, count)?
    };
    p.pos = p.bytes.len();
    Ok(TraceChunk { pid, tid, words })
}

/// The summary of a `glass trace` recording.
fn trace_summary(p: &mut Payload) -> Result<TraceSummary, &'static str> {
    let mut summary = TraceSummary {
        tsc_hz: p.u64()?,
        tsc_start: p.u64()?,
        lost: p.u64()?,
        no_area_lost: p.u64()?,
        unwound: p.u64()?,
        skipped: p.u64()?,
        threads: p.u32()?,
        patched: p.u32()?,
        not_patched: p.u32()?,
        ..TraceSummary::default()
    };
    let count = p.u64()?;
    if count > p.bytes.len() as u64 {
        return Err("counter count out of range");
    }
    summary.counters = (0..count).map(|_| p.string()).collect::<Result<_, _>>()?;
    summary.counters_note = p.string()?;
    summary.exit_status = i32::try_from(p.i64()?).map_err(|_| "exit status out of range")?;
    summary.duration_ns = p.u64()?;
    // Added later: absent from launch-mode recordings of older versions.
    if p.pos < p.bytes.len() {
        summary.attach_stop_ns = p.u64()?;
        summary.detach_stop_ns = p.u64()?;
        summary.in_flight_at_detach = p.u64()?;
    }
    Ok(summary)
}
