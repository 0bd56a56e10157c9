use std::io::{self, Write};

use crate::varint::{put_i64, put_u64};
use crate::{tag, Meta, Module, Process, Record, Snapshot, Summary, Thread, ThreadExit};
use crate::{
    GuestRam, GuestTask, JitMap, KernelSymbols, PyCode, PyStack, ThreadLost, TraceFunction,
    TraceSkipped, TraceSummary,
};
use crate::{BLOCK_HEAD_LEN, BLOCK_MARKER, BLOCK_TARGET, HEADER_LEN, MAGIC, VERSION};

/// Words per trace chunk written: a multiple of every record's length in words (a
/// record word and up to 4 counter words: 1 to 5), so no record is split between
/// chunks; packed, a few KiB.
pub const TRACE_PIECE: usize = 2400;

/// Streams records to `out`, gathered in checksummed blocks (see the crate's first
/// page). Each record is encoded into a reused scratch buffer and added whole to the
/// open block; a block goes out when it is full and at every [`Writer::flush`], so a
/// crash loses at most what was written since the last flush, and every block that did
/// go out whole reads back, checked. A writer dropped without [`Writer::flush`],
/// [`Writer::end`] or [`Writer::into_inner`] loses its open block: dropping must not
/// write, for a writer is dropped after a failed write (a full disk) on purpose.
pub struct Writer<W: Write> {
    out: W,
    scratch: Vec<u8>,
    /// The open block: room for its head, then whole records.
    block: Vec<u8>,
    /// The open block's sequence number (blocks are numbered from 0).
    sequence: u32,
}

impl<W: Write> Writer<W> {
    /// Writes the header.
    pub fn new(mut out: W) -> io::Result<Self> {
        let mut header = [0u8; HEADER_LEN];
        header[..8].copy_from_slice(&MAGIC);
        header[8..12].copy_from_slice(&VERSION.to_le_bytes());
        let crc = crc32fast::hash(&header[..12]);
        header[12..16].copy_from_slice(&crc.to_le_bytes());
        out.write_all(&header)?;
        let mut block = Vec::with_capacity(BLOCK_TARGET + BLOCK_HEAD_LEN);
        block.resize(BLOCK_HEAD_LEN, 0);
        Ok(Writer {
            out,
            scratch: Vec::with_capacity(4096),
            block,
            sequence: 0,
        })
    }

    /// Continues a file whose header and first `sequence` blocks are written (see
    /// [`crate::seal`]): writes no header.
    pub fn resume(out: W, sequence: u32) -> Self {
        let mut block = Vec::with_capacity(BLOCK_TARGET + BLOCK_HEAD_LEN);
        block.resize(BLOCK_HEAD_LEN, 0);
        Writer {
            out,
            scratch: Vec::with_capacity(4096),
            block,
            sequence,
        }
    }

    /// Blocks written so far (the open one not counted).
    pub fn blocks(&self) -> u32 {
        self.sequence
    }

    pub fn write(&mut self, record: &Record) -> io::Result<()> {
        match record {
            Record::Meta(meta) => self.meta(meta),
            Record::Process(process) => self.process(process),
            Record::Module(module) => self.module(module),
            Record::Thread(thread) => self.thread(thread),
            Record::ThreadExit(exit) => self.thread_exit(exit),
            Record::Sample(sample) => self.sample(
                sample.time_ns,
                sample.pid,
                sample.tid,
                sample.stopped_ns,
                sample.flags,
                &sample.frames,
            ),
            Record::Snapshot(snapshot) => self.snapshot(snapshot),
            Record::Summary(summary) => self.summary(summary),
            Record::TraceFunction(function) => self.trace_function(function),
            Record::TraceSkipped(skipped) => self.trace_skipped(skipped),
            Record::TraceChunk(chunk) => self.trace_chunk(chunk.pid, chunk.tid, &chunk.words),
            Record::TraceSummary(summary) => self.trace_summary(summary),
            Record::JitMap(map) => self.jit_map(map),
            Record::ThreadLost(lost) => self.thread_lost(lost),
            Record::KernelSymbols(symbols) => self.kernel_symbols(symbols),
            Record::GuestTask(task) => self.guest_task(task),
            Record::Note(note) => self.note(note),
            Record::PyCode(code) => self.py_code(code),
            Record::PyStack(stack) => self.py_stack(stack),
            Record::GuestRam(ram) => self.guest_ram(ram),
            Record::End => self.end(),
        }
    }

    pub fn meta(&mut self, meta: &Meta) -> io::Result<()> {
        let b = &mut self.scratch;
        b.clear();
        put_u64(b, meta.start_unix_ns);
        put_str(b, meta.backend.name());
        put_str(b, &meta.unwind);
        put_u64(b, meta.frequency_hz as u64);
        put_u64(b, meta.max_depth as u64);
        put_u64(b, meta.target_pid as u64);
        put_u64(b, meta.command.len() as u64);
        for arg in &meta.command {
            put_str(b, arg);
        }
        put_str(b, &meta.hostname);
        put_str(b, &meta.glass_version);
        put_str(b, &meta.capture);
        put_str(b, meta.arch.name());
        self.emit(tag::META)
    }

    pub fn process(&mut self, process: &Process) -> io::Result<()> {
        let b = &mut self.scratch;
        b.clear();
        put_u64(b, process.time_ns);
        put_u64(b, process.pid as u64);
        put_u64(b, process.parent_pid as u64);
        b.push(process.kind as u8);
        put_str(b, &process.name);
        self.emit(tag::PROCESS)
    }

    pub fn module(&mut self, module: &Module) -> io::Result<()> {
        let b = &mut self.scratch;
        b.clear();
        put_u64(b, module.time_ns);
        put_u64(b, module.pid as u64);
        put_u64(b, module.start);
        put_u64(b, module.end);
        put_u64(b, module.file_offset);
        put_bytes(b, &module.build_id);
        put_str(b, &module.path);
        self.emit(tag::MODULE)
    }

    pub fn thread(&mut self, thread: &Thread) -> io::Result<()> {
        let b = &mut self.scratch;
        b.clear();
        put_u64(b, thread.time_ns);
        put_u64(b, thread.pid as u64);
        put_u64(b, thread.tid as u64);
        put_str(b, &thread.name);
        self.emit(tag::THREAD)
    }

    pub fn thread_exit(&mut self, exit: &ThreadExit) -> io::Result<()> {
        let b = &mut self.scratch;
        b.clear();
        put_u64(b, exit.time_ns);
        put_u64(b, exit.pid as u64);
        put_u64(b, exit.tid as u64);
        self.emit(tag::THREAD_EXIT)
    }

    /// Frames are stored as the first address, then signed deltas between neighbours:
    /// return addresses of one stack mostly lie in the same module.
    pub fn sample(
        &mut self,
        time_ns: u64,
        pid: u32,
        tid: u32,
        stopped_ns: u32,
        flags: u8,
        frames: &[u64],
    ) -> io::Result<()> {
        let b = &mut self.scratch;
        b.clear();
        put_u64(b, time_ns);
        put_u64(b, pid as u64);
        put_u64(b, tid as u64);
        put_u64(b, stopped_ns as u64);
        b.push(flags);
        put_u64(b, frames.len() as u64);
        let mut previous = 0u64;
        for &frame in frames {
            put_i64(b, frame.wrapping_sub(previous) as i64);
            previous = frame;
        }
        self.emit(tag::SAMPLE)
    }

    pub fn snapshot(&mut self, s: &Snapshot) -> io::Result<()> {
        let b = &mut self.scratch;
        b.clear();
        for value in [s.time_ns, s.pid as u64, s.tid as u64, s.stopped_ns as u64] {
            put_u64(b, value);
        }
        b.push(s.flags);
        for value in [s.ip, s.sp, s.fp, s.lr] {
            put_u64(b, value);
        }
        put_bytes(b, &s.stack);
        self.emit(tag::SNAPSHOT)
    }

    pub fn thread_lost(&mut self, lost: &ThreadLost) -> io::Result<()> {
        let b = &mut self.scratch;
        b.clear();
        put_u64(b, lost.pid as u64);
        put_u64(b, lost.tid as u64);
        put_u64(b, lost.count);
        self.emit(tag::THREAD_LOST)
    }

    pub fn guest_task(&mut self, task: &GuestTask) -> io::Result<()> {
        let b = &mut self.scratch;
        b.clear();
        put_u64(b, task.time_ns);
        put_u64(b, task.pid as u64);
        put_u64(b, task.tid as u64);
        put_u64(b, task.task_pid as u64);
        put_u64(b, task.task_tgid as u64);
        b.push(task.flags);
        put_str(b, &task.comm);
        self.emit(tag::GUEST_TASK)
    }

    pub fn guest_ram(&mut self, ram: &GuestRam) -> io::Result<()> {
        let b = &mut self.scratch;
        b.clear();
        match ram {
            GuestRam::Stub => b.push(0),
            GuestRam::File { path, bytes } => {
                b.push(1);
                put_str(b, path);
                put_u64(b, *bytes);
            }
            GuestRam::Process { pid, blocks, bytes } => {
                b.push(2);
                put_u64(b, *pid as u64);
                put_u64(b, *blocks as u64);
                put_u64(b, *bytes);
            }
        }
        self.emit(tag::GUEST_RAM)
    }

    pub fn note(&mut self, note: &str) -> io::Result<()> {
        let b = &mut self.scratch;
        b.clear();
        put_str(b, note);
        self.emit(tag::NOTE)
    }

    pub fn kernel_symbols(&mut self, symbols: &KernelSymbols) -> io::Result<()> {
        let b = &mut self.scratch;
        b.clear();
        put_u64(b, symbols.symbols.len() as u64);
        let mut previous = 0u64;
        for symbol in &symbols.symbols {
            put_i64(b, symbol.start.wrapping_sub(previous) as i64);
            previous = symbol.start;
            put_u64(b, symbol.len);
            put_str(b, &symbol.name);
            put_str(b, &symbol.module);
        }
        self.emit(tag::KERNEL_SYMBOLS)
    }

    pub fn py_code(&mut self, code: &PyCode) -> io::Result<()> {
        let b = &mut self.scratch;
        b.clear();
        put_u64(b, code.pid as u64);
        put_u64(b, code.id as u64);
        put_str(b, &code.name);
        put_str(b, &code.file);
        put_u64(b, code.first_line as u64);
        self.emit(tag::PY_CODE)
    }

    pub fn py_stack(&mut self, stack: &PyStack) -> io::Result<()> {
        let b = &mut self.scratch;
        b.clear();
        put_u64(b, stack.time_ns);
        put_u64(b, stack.pid as u64);
        put_u64(b, stack.tid as u64);
        put_u64(b, stack.frames.len() as u64);
        for frame in &stack.frames {
            put_u64(b, frame.code as u64);
            put_u64(b, frame.line as u64);
            b.push(frame.entry as u8);
        }
        self.emit(tag::PY_STACK)
    }

    pub fn summary(&mut self, s: &Summary) -> io::Result<()> {
        let b = &mut self.scratch;
        b.clear();
        for value in [
            s.duration_ns,
            s.samples,
            s.ticks,
            s.threads as u64,
            s.processes as u64,
            s.missed_deadlines,
            s.stopped_mean_ns,
            s.stopped_p50_ns,
            s.stopped_p99_ns,
            s.stopped_max_ns,
            s.stopped_total_ns,
            s.lost_samples,
        ] {
            put_u64(b, value);
        }
        put_i64(b, s.exit_status as i64);
        self.emit(tag::SUMMARY)
    }

    pub fn trace_function(&mut self, f: &TraceFunction) -> io::Result<()> {
        let b = &mut self.scratch;
        b.clear();
        put_u64(b, f.id as u64);
        put_str(b, &f.module);
        put_u64(b, f.address);
        put_u64(b, f.size);
        put_str(b, &f.name);
        put_str(b, &f.probe);
        self.emit(tag::TRACE_FUNCTION)
    }

    pub fn trace_skipped(&mut self, s: &TraceSkipped) -> io::Result<()> {
        let b = &mut self.scratch;
        b.clear();
        put_str(b, &s.module);
        put_u64(b, s.address);
        put_str(b, &s.name);
        put_str(b, &s.reason);
        put_str(b, &s.kind);
        self.emit(tag::TRACE_SKIPPED)
    }

    /// Writes one thread's call records packed (see `packed`): about a quarter of
    /// their 8 bytes each, so the drain keeps up with a fast program on a slow disk.
    /// A long run is written as several chunks of [`TRACE_PIECE`] words at most, each
    /// in a block of a few KiB: a drain hands over megabytes at once, and one block that
    /// large was lost whole when the disk filled inside it.
    pub fn trace_chunk(&mut self, pid: u32, tid: u32, words: &[u64]) -> io::Result<()> {
        for piece in words.chunks(TRACE_PIECE) {
            let b = &mut self.scratch;
            b.clear();
            put_u64(b, pid as u64);
            put_u64(b, tid as u64);
            put_u64(b, piece.len() as u64);
            crate::packed::pack(piece, b);
            self.emit(tag::TRACE_PACKED)?;
        }
        Ok(())
    }

    pub fn trace_summary(&mut self, s: &TraceSummary) -> io::Result<()> {
        let b = &mut self.scratch;
        b.clear();
        for value in [
            s.tsc_hz,
            s.tsc_start,
            s.lost,
            s.no_area_lost,
            s.unwound,
            s.skipped,
        ] {
            put_u64(b, value);
        }
        for value in [s.threads, s.patched, s.not_patched] {
            put_u64(b, value as u64);
        }
        put_u64(b, s.counters.len() as u64);
        for counter in &s.counters {
            put_str(b, counter);
        }
        put_str(b, &s.counters_note);
        put_i64(b, s.exit_status as i64);
        put_u64(b, s.duration_ns);
        put_u64(b, s.attach_stop_ns);
        put_u64(b, s.detach_stop_ns);
        put_u64(b, s.in_flight_at_detach);
        self.emit(tag::TRACE_SUMMARY)
    }

    pub fn jit_map(&mut self, map: &JitMap) -> io::Result<()> {
        let b = &mut self.scratch;
        b.clear();
        put_u64(b, map.pid as u64);
        put_str(b, &map.name);
        put_str(b, &map.text);
        self.emit(tag::JIT_MAP)
    }

    pub fn end(&mut self) -> io::Result<()> {
        self.scratch.clear();
        self.emit(tag::END)?;
        self.flush()
    }

    /// Writes the open block (if it holds anything) and flushes `out`.
    pub fn flush(&mut self) -> io::Result<()> {
        self.close_block()?;
        self.out.flush()
    }

    /// `out`, with the open block written first (an error writing it is ignored: use
    /// [`Writer::flush`] before to see it).
    pub fn into_inner(mut self) -> W {
        let _ = self.close_block();
        self.out
    }

    fn emit(&mut self, tag: u8) -> io::Result<()> {
        let len = 5 + self.scratch.len();
        if self.block.len() > BLOCK_HEAD_LEN && self.block.len() + len > BLOCK_TARGET {
            self.close_block()?;
        }
        self.block.push(tag);
        self.block
            .extend_from_slice(&(self.scratch.len() as u32).to_le_bytes());
        self.block.extend_from_slice(&self.scratch);
        if self.block.len() >= BLOCK_TARGET {
            self.close_block()?;
        }
        Ok(())
    }

    /// Writes the open block with its head: marker, sequence, length, and the CRC-32 of
    /// sequence, length and records. The block is gone from memory even when the write
    /// fails: a write that failed once (a full disk) is not retried with the same bytes
    /// behind a part that may have gone out.
    fn close_block(&mut self) -> io::Result<()> {
        if self.block.len() == BLOCK_HEAD_LEN {
            return Ok(());
        }
        let len = (self.block.len() - BLOCK_HEAD_LEN) as u32;
        self.block[0..4].copy_from_slice(&BLOCK_MARKER);
        self.block[4..8].copy_from_slice(&self.sequence.to_le_bytes());
        self.block[8..12].copy_from_slice(&len.to_le_bytes());
        let mut crc = crc32fast::Hasher::new();
        crc.update(&self.block[4..12]);
        crc.update(&self.block[BLOCK_HEAD_LEN..]);
        let crc = crc.finalize();
        self.block[12..16].copy_from_slice(&crc.to_le_bytes());
        self.sequence = self.sequence.wrapping_add(1);
        let written = self.out.write_all(&self.block);
        self.block.truncate(BLOCK_HEAD_LEN);
        if self.block.capacity() > 4 * BLOCK_TARGET {
            // A huge record had a block of its own: give the memory back.
            self.block.shrink_to(BLOCK_TARGET + BLOCK_HEAD_LEN);
        }
        written
    }
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_u64(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn put_str(out: &mut Vec<u8>, text: &str) {
    put_bytes(out, text.as_bytes());
}
