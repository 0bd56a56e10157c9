//! A copy of a stretch of the target's stack, filled with as few reads as possible.
//!
//! Reading the stack word by word (one `ptrace(PEEKDATA)` or one `process_vm_readv` per
//! word, as remote libunwind does) costs a system call per word while the target is
//! stopped. Instead the window copies a whole stretch above the stack pointer in one
//! call, sized from what the previous walk of the same thread needed, and only reads
//! again when a frame pointer leads past it.

/// Reads the target's memory. Returns how many bytes from `addr` were copied into
/// `buf` (a short count means the rest is unmapped).
pub trait RemoteMemory {
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> usize;
}

const MIN_WINDOW: usize = 4096;
const MAX_WINDOW: usize = 1 << 20;
/// A frame pointer further than this above the last window starts a fresh, small read
/// instead of copying the whole gap (a huge local array between two frames).
const MAX_GAP: u64 = 64 << 10;

/// One contiguous copy of the stack starting at `base`, reused across samples so the
/// sample path does not allocate once it has grown to the thread's usual depth.
#[derive(Debug)]
pub struct StackWindow {
    base: u64,
    bytes: Vec<u8>,
    /// Bytes of `bytes` that hold target memory.
    valid: usize,
    /// A second, detached piece for frames far above the main copy.
    far_base: u64,
    far: Vec<u8>,
    far_valid: usize,
    /// Size of the first read of the next sample, learned from this one.
    next_size: usize,
    /// Highest address the walk needed in this sample.
    high_water: u64,
    reads: u32,
}

impl Default for StackWindow {
    fn default() -> Self {
        Self::new()
    }
}

impl StackWindow {
    pub fn new() -> Self {
        StackWindow {
            base: 0,
            bytes: Vec::new(),
            valid: 0,
            far_base: 0,
            far: Vec::new(),
            far_valid: 0,
            next_size: 16 << 10,
            high_water: 0,
            reads: 0,
        }
    }

    /// Starts a new sample: copies the stack from `sp` upwards in one read.
    pub fn fill(&mut self, memory: &mut impl RemoteMemory, sp: u64) {
        self.base = sp;
        self.high_water = sp;
        self.far_valid = 0;
        self.reads = 0;
        let size = self.next_size;
        if self.bytes.len() < size {
            self.bytes.resize(size, 0);
        }
        self.valid = memory.read(sp, &mut self.bytes[..size]);
        self.reads += 1;
    }

    /// The 8-byte little-endian word at `addr`, reading more of the stack if needed.
    pub fn word(&mut self, memory: &mut impl RemoteMemory, addr: u64) -> Option<u64> {
        self.high_water = self.high_water.max(addr + 8);
        if let Some(word) = Self::word_in(self.base, &self.bytes[..self.valid], addr) {
            return Some(word);
        }
        if let Some(word) = Self::word_in(self.far_base, &self.far[..self.far_valid], addr) {
            return Some(word);
        }
        let end = self.base + self.valid as u64;
        if addr < self.base {
            return None;
        }
        if self.valid == self.bytes.len() && addr >= end && addr - end < MAX_GAP {
            // The walk ran off the end of a full read: extend it contiguously.
            // Doubling keeps a deep walk to a handful of reads.
            let needed = ((addr + 8 - self.base) as usize).next_multiple_of(MIN_WINDOW);
            let want = needed
                .max(self.valid * 2)
                .min(MAX_WINDOW)
                .max(self.valid + 8);
            self.bytes.resize(want, 0);
            let got = memory.read(end, &mut self.bytes[self.valid..want]);
            self.reads += 1;
            self.valid += got;
            return Self::word_in(self.base, &self.bytes[..self.valid], addr);
        }
        // Far away: a separate small read around the address.
        self.far_base = addr & !(MIN_WINDOW as u64 - 1);
        if self.far.len() < 2 * MIN_WINDOW {
            self.far.resize(2 * MIN_WINDOW, 0);
        }
        self.far_valid = memory.read(self.far_base, &mut self.far[..2 * MIN_WINDOW]);
        self.reads += 1;
        Self::word_in(self.far_base, &self.far[..self.far_valid], addr)
    }

    /// Ends a sample: remembers how much stack it needed, so the next sample of this
    /// thread reads it all at once.
    pub fn finish(&mut self) {
        let needed = (self.high_water.saturating_sub(self.base)) as usize;
        self.next_size =
            (needed.next_multiple_of(MIN_WINDOW) + MIN_WINDOW).clamp(MIN_WINDOW, MAX_WINDOW);
    }

    /// Reads issued for the current sample.
    pub fn reads(&self) -> u32 {
        self.reads
    }

    fn word_in(base: u64, bytes: &[u8], addr: u64) -> Option<u64> {
        let offset = usize::try_from(addr.checked_sub(base)?).ok()?;
        let word = bytes.get(offset..offset.checked_add(8)?)?;
        Some(u64::from_le_bytes(word.try_into().ok()?))
    }
}
