//! Reading a `.glass` file as a stream, at disk speed. A `glass trace` of a busy server
//! writes 10^8 call records in seconds; reading such a file whole and decoding every
//! chunk into a `Vec<u64>` touches gigabytes of fresh memory, and on a virtual machine
//! the page faults of that first touch cost more than the decoding. So the file is read
//! with read(2) into a few reused blocks (no mmap: each of its pages would fault once),
//! records are framed in place, and trace chunks are handed out undecoded
//! ([`TraceBytes`]: a shared block and a range) for other threads to decode into no
//! buffer at all ([`TraceBytes::for_each_word`]). A block goes back to the pool when the
//! last chunk in it is dropped.
//!
//! The stream yields the same records, damage and end as [`crate::Reader`], except that
//! a trace chunk's packed body is checked when it is decoded, not when it is framed.
//!
//! Version 3 files hold their records in checksummed blocks: a block is read whole and
//! checked before any record in it is framed. A block that fails (a bad marker, length
//! or checksum) is yielded as [`FormatError::Damaged`] and the stream goes on from the
//! next block it finds whole (by its marker and checksum), so the bytes a damage costs
//! are those of its blocks. Work stays linear in the file's size whatever the damage:
//! the search looks at each byte once and checks a checksum only behind a marker.

use std::fs::File;
use std::io::{ErrorKind, Read};
use std::path::Path;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;

use crate::reader::{decode, trace_head, MAX_RECORD_LEN};
use crate::{tag, FormatError, Record, HEADER_LEN};
use crate::{BLOCKS_VERSION, BLOCK_HEAD_LEN, BLOCK_MARKER};

/// A block longer than this is taken as damage (one record of the largest size fits).
const MAX_BLOCK_LEN: usize = MAX_RECORD_LEN + 5;

/// What lies at the stream's position, where a block should start.
enum Probe {
    /// A whole block whose checksum matches: its sequence number and length.
    Valid { sequence: u32, len: usize },
    /// Nothing: the file ends here.
    End,
    /// The file ends inside the block.
    Short,
    /// Not a whole, checked block.
    Bad(&'static str),
}

/// Bytes read per block: large enough that a read is a few hundred microseconds of
/// copying (few system calls), small enough that the blocks in flight stay in cache.
pub const BLOCK_LEN: usize = 2 << 20;

/// A buffer of file bytes shared by the chunks framed in it. Dropping the last
/// reference gives the buffer back to its stream.
pub struct Block {
    data: Vec<u8>,
    home: Option<Sender<Vec<u8>>>,
}

impl Drop for Block {
    fn drop(&mut self) {
        if let Some(home) = self.home.take() {
            // The stream may be gone (its receiver dropped): the buffer is then freed.
            let _ = home.send(std::mem::take(&mut self.data));
        }
    }
}

/// A trace chunk (tag 11 raw or 13 packed) as it lies in the file, not yet decoded. It
/// can be sent to another thread; its block is shared, not copied.
#[derive(Clone)]
pub struct TraceBytes {
    pub pid: u32,
    pub tid: u32,
    /// Byte offset of the record in the file (for the damage a bad body is).
    pub offset: usize,
    /// Words the chunk holds (records and their counter words).
    pub count: u64,
    packed: bool,
    block: Arc<Block>,
    body: std::ops::Range<usize>,
}

impl TraceBytes {
    /// Calls `each` with every word in order. On a bad body, the words before the fault
    /// have been passed and the error says what was wrong.
    #[inline]
    pub fn for_each_word(&self, each: impl FnMut(u64)) -> Result<(), &'static str> {
        let body = &self.block.data[self.body.clone()];
        if self.packed {
            crate::packed::unpack_each(body, self.count, each)
        } else {
            body.chunks_exact(8)
                .map(|w| u64::from_le_bytes(w.try_into().unwrap()))
                .for_each(each);
            Ok(())
        }
    }

    /// The words, as [`crate::TraceChunk`] holds them.
    pub fn words(&self) -> Result<Vec<u64>, &'static str> {
        let mut words = Vec::with_capacity(self.count as usize);
        self.for_each_word(|w| words.push(w))?;
        Ok(words)
    }

    /// The error a bad body is, as the whole-file reader reports it.
    pub fn damage(&self, what: &'static str) -> FormatError {
        FormatError::Corrupt {
            offset: self.offset,
            what,
        }
    }
}

/// One framed record.
pub enum Item {
    /// Any record but a trace chunk, decoded.
    Record(Record),
    /// A trace chunk, undecoded.
    Trace(TraceBytes),
}

/// Frames the records of a `.glass` file read in blocks. After the first error, or the
/// End record, it yields nothing more.
pub struct Stream<R: Read = File> {
    input: R,
    /// The block being framed: `block.data[pos..filled]` are read and not yet framed.
    block: Arc<Block>,
    pos: usize,
    filled: usize,
    /// File offset of `block.data[0]`.
    base: usize,
    eof: bool,
    version: u32,
    failed: bool,
    ended: bool,
    pool: Receiver<Vec<u8>>,
    home: Sender<Vec<u8>>,
    /// Version 3: file offset where the open block's records end (at or past it, the
    /// next block is opened); `usize::MAX` for older versions.
    block_end: usize,
    /// The sequence number the next block should have.
    next_sequence: u32,
    /// Where the last whole block read ends (the header's end before any).
    whole_end: usize,
    /// Damage found in the header, yielded before the first record.
    pending: Option<FormatError>,
    /// Pool blocks allocated, and how many may be (then the stream waits for one back).
    blocks: usize,
    max_blocks: usize,
}

impl Stream<File> {
    /// Opens a file and checks its header.
    pub fn open(path: &Path) -> Result<Stream<File>, FormatError> {
        let file = File::open(path).map_err(|e| FormatError::Io(e.to_string()))?;
        Stream::new(file)
    }
}

impl<R: Read> Stream<R> {
    /// Reads and checks the header.
    pub fn new(input: R) -> Result<Stream<R>, FormatError> {
        let (home, pool) = channel();
        let mut stream = Stream {
            input,
            block: Arc::new(Block {
                data: vec![0; BLOCK_LEN],
                home: Some(home.clone()),
            }),
            pos: 0,
            filled: 0,
            base: 0,
            eof: false,
            version: 0,
            failed: false,
            ended: false,
            pool,
            home,
            block_end: usize::MAX,
            next_sequence: 0,
            whole_end: HEADER_LEN,
            pending: None,
            blocks: 1,
            max_blocks: usize::MAX,
        };
        stream.fill(HEADER_LEN)?;
        let header = &stream.block.data[..stream.filled];
        let (version, damaged) = crate::reader::check_header(header)?;
        stream.version = version;
        stream.pos = HEADER_LEN;
        if version >= BLOCKS_VERSION {
            stream.block_end = HEADER_LEN;
        }
        if damaged {
            stream.pending = Some(FormatError::HeaderDamaged);
        }
        Ok(stream)
    }

    /// Waits for a block to come back rather than allocate more than `blocks` (of
    /// [`BLOCK_LEN`]; a record larger than that still gets its own). Only for a reader
    /// whose chunks are dropped by other threads that do not wait on it: a caller that
    /// keeps every chunk would wait forever.
    pub fn limit_blocks(&mut self, blocks: usize) {
        self.max_blocks = blocks.max(2);
    }

    /// The file's format version.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// File offset of the next record.
    pub fn offset(&self) -> usize {
        self.base + self.pos
    }

    /// Makes at least `need` unframed bytes available from `pos`, unless the file ends
    /// first; reads as much as the block holds.
    fn fill(&mut self, need: usize) -> Result<(), FormatError> {
        let kept = self.filled - self.pos;
        if kept >= need || self.eof {
            return Ok(());
        }
        let capacity = need.max(BLOCK_LEN);
        match Arc::get_mut(&mut self.block) {
            // Nothing framed from the block is still held: reuse it in place.
            Some(block) if block.data.len() >= capacity => {
                block.data.copy_within(self.pos..self.filled, 0);
            }
            _ => {
                // The pool holds blocks of the usual size only; a larger record gets a
                // buffer of its own, freed with it.
                let returned = if capacity > BLOCK_LEN {
                    None
                } else {
                    match self.pool.try_recv() {
                        Ok(data) => Some(data),
                        // Threads hold every block: wait for one rather than grow.
                        Err(_) if self.blocks >= self.max_blocks => self.pool.recv().ok(),
                        Err(_) => None,
                    }
                };
                let mut data = match returned {
                    Some(data) => data,
                    None => {
                        self.blocks += (capacity == BLOCK_LEN) as usize;
                        vec![0; capacity]
                    }
                };
                data[..kept].copy_from_slice(&self.block.data[self.pos..self.filled]);
                // Only blocks of the usual size go back to the pool.
                let home = (data.len() == BLOCK_LEN).then(|| self.home.clone());
                self.block = Arc::new(Block { data, home });
            }
        }
        self.base += self.pos;
        self.pos = 0;
        self.filled = kept;
        let block = Arc::get_mut(&mut self.block).expect("a block of its own");
        while self.filled < block.data.len() {
            match self.input.read(&mut block.data[self.filled..]) {
                Ok(0) => {
                    self.eof = true;
                    break;
                }
                Ok(n) => self.filled += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(FormatError::Io(e.to_string())),
            }
        }
        Ok(())
    }

    fn next_item(&mut self) -> Result<Option<Item>, FormatError> {
        loop {
            if self.offset() >= self.block_end && !self.open_block()? {
                return Ok(None);
            }
            let start = self.offset();
            // Version 3: records never leave their block (checked, so only a writer
            // other than glass breaks this).
            let room = self.block_end - start;
            self.fill(5)?;
            let available = (self.filled - self.pos).min(room);
            if available == 0 {
                return Ok(None);
            }
            if available < 5 && self.version < BLOCKS_VERSION {
                return Err(FormatError::Truncated { offset: start });
            }
            if available < 5 {
                return Err(self.bad_record(start, "record runs past its block"));
            }
            let frame = &self.block.data[self.pos..self.pos + 5];
            let record_tag = frame[0];
            let len = u32::from_le_bytes(frame[1..5].try_into().unwrap()) as usize;
            if len > MAX_RECORD_LEN {
                return Err(self.bad_record(start, "record length out of range"));
            }
            if 5 + len > room {
                return Err(self.bad_record(start, "record runs past its block"));
            }
            self.fill(5 + len)?;
            if self.filled - self.pos < 5 + len {
                return Err(FormatError::Truncated { offset: start });
            }
            let body = self.pos + 5..self.pos + 5 + len;
            self.pos = body.end;
            let payload = &self.block.data[body.clone()];
            if record_tag == tag::TRACE_CHUNK || record_tag == tag::TRACE_PACKED {
                let (pid, tid, count, skip) = match trace_head(record_tag, payload) {
                    Ok(head) => head,
                    Err(what) => return Err(self.bad_record(start, what)),
                };
                return Ok(Some(Item::Trace(TraceBytes {
                    pid,
                    tid,
                    offset: start,
                    count,
                    packed: record_tag == tag::TRACE_PACKED,
                    block: self.block.clone(),
                    body: body.start + skip..body.end,
                })));
            }
            match decode(record_tag, payload, self.version) {
                Ok(record) => return Ok(Some(Item::Record(record))),
                // A newer writer's record type: its length is known, so skip it.
                Err("unknown record tag") => continue,
                Err(what) => return Err(self.bad_record(start, what)),
            }
        }
    }

    /// A record that does not decode at `start`. Before version 3 nothing behind it can
    /// be framed reliably: the reading ends there. In a checked block (written by
    /// something other than glass) the rest of the block is skipped.
    fn bad_record(&mut self, start: usize, what: &'static str) -> FormatError {
        if self.version < BLOCKS_VERSION {
            return FormatError::Corrupt {
                offset: start,
                what,
            };
        }
        let lost = self.block_end - start;
        self.pos = self.block_end - self.base;
        FormatError::Damaged {
            first_block: self.next_sequence.wrapping_sub(1),
            blocks: 1,
            offset: start,
            lost,
            what,
        }
    }

    /// Version 3, at a block's start: opens the next whole block, past any damaged
    /// ones (returned as [`FormatError::Damaged`], the stream then standing at the
    /// whole block behind them). `Ok(false)`: the file ends here.
    fn open_block(&mut self) -> Result<bool, FormatError> {
        let start = self.offset();
        let what = match self.probe()? {
            Probe::End => return Ok(false),
            Probe::Valid { sequence, len } => {
                self.accept(sequence, len);
                return Ok(true);
            }
            Probe::Short => None,
            Probe::Bad(what) => Some(what),
        };
        let first_block = self.next_sequence;
        self.pos += 1;
        match self.resync()? {
            Some((sequence, len)) => {
                let lost = self.offset() - start;
                self.accept(sequence, len);
                Err(FormatError::Damaged {
                    first_block,
                    blocks: sequence.wrapping_sub(first_block).max(1),
                    offset: start,
                    lost,
                    what: what.unwrap_or("block cut short"),
                })
            }
            // The last block, cut short: the file was truncated.
            None if what.is_none() => Err(FormatError::Truncated { offset: start }),
            None => {
                self.block_end = self.offset();
                Err(FormatError::Damaged {
                    first_block,
                    blocks: 0,
                    offset: start,
                    lost: self.offset() - start,
                    what: what.unwrap_or_default(),
                })
            }
        }
    }

    /// Stands in the block `probe` found whole.
    fn accept(&mut self, sequence: u32, len: usize) {
        self.pos += BLOCK_HEAD_LEN;
        self.block_end = self.offset() + len;
        self.whole_end = self.block_end;
        self.next_sequence = sequence.wrapping_add(1);
    }

    /// Version 3: where the last whole block read so far ends, and the sequence number
    /// a block written there takes.
    pub fn whole_end(&self) -> (usize, u32) {
        (self.whole_end, self.next_sequence)
    }

    /// Looks at the block that should start at the stream's position (reading all of
    /// it into the buffer), without moving.
    fn probe(&mut self) -> Result<Probe, FormatError> {
        self.fill(BLOCK_HEAD_LEN)?;
        let available = self.filled - self.pos;
        if available == 0 {
            return Ok(Probe::End);
        }
        if available < BLOCK_HEAD_LEN {
            return Ok(Probe::Short);
        }
        let head = &self.block.data[self.pos..self.pos + BLOCK_HEAD_LEN];
        if head[..4] != BLOCK_MARKER {
            return Ok(Probe::Bad("no block marker"));
        }
        let sequence = u32::from_le_bytes(head[4..8].try_into().unwrap());
        let len = u32::from_le_bytes(head[8..12].try_into().unwrap()) as usize;
        let crc = u32::from_le_bytes(head[12..16].try_into().unwrap());
        if len > MAX_BLOCK_LEN {
            return Ok(Probe::Bad("block length out of range"));
        }
        self.fill(BLOCK_HEAD_LEN + len)?;
        if self.filled - self.pos < BLOCK_HEAD_LEN + len {
            return Ok(Probe::Short);
        }
        let block = &self.block.data[self.pos..self.pos + BLOCK_HEAD_LEN + len];
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&block[4..12]);
        hasher.update(&block[BLOCK_HEAD_LEN..]);
        if hasher.finalize() != crc {
            return Ok(Probe::Bad("checksum mismatch"));
        }
        Ok(Probe::Valid { sequence, len })
    }

    /// From the stream's position, finds the next whole block: its sequence number and
    /// length, the stream standing at its start; `None` at the end of the file.
    fn resync(&mut self) -> Result<Option<(u32, usize)>, FormatError> {
        loop {
            self.fill(BLOCK_HEAD_LEN)?;
            let data = &self.block.data[self.pos..self.filled];
            if data.len() < BLOCK_HEAD_LEN {
                self.pos = self.filled;
                return Ok(None);
            }
            match data.windows(4).position(|w| w == BLOCK_MARKER) {
                None => {
                    // Keep the last bytes: a marker may start in them.
                    self.pos = self.filled - (BLOCK_MARKER.len() - 1);
                }
                Some(at) => {
                    self.pos += at;
                    match self.probe()? {
                        Probe::Valid { sequence, len } => return Ok(Some((sequence, len))),
                        _ => self.pos += 1,
                    }
                }
            }
        }
    }
}

impl<R: Read> Iterator for Stream<R> {
    type Item = Result<Item, FormatError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(damage) = self.pending.take() {
            return Some(Err(damage));
        }
        if self.failed || self.ended {
            return None;
        }
        match self.next_item() {
            Ok(Some(Item::Record(Record::End))) => {
                self.ended = true;
                Some(Ok(Item::Record(Record::End)))
            }
            Ok(item) => item.map(Ok),
            Err(error) => {
                // Damaged blocks are skipped; anything else ends the reading.
                self.failed = error.ends_reading();
                Some(Err(error))
            }
        }
    }
}
