//! glass's side of the shared memory: creating it, and draining the thread rings.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::{area, header, MAGIC, VERSION};

/// The session's shared memory, created by glass and mapped by the probe runtime.
pub struct SessionMemory {
    path: PathBuf,
    map: memmap2::MmapMut,
    area_count: usize,
    capacity: usize,
}

/// The user and group the session file is given to: the traced process's own (its
/// filesystem uid and gid), so that a process that dropped root's privileges, a server's
/// worker running as `nobody`, can still open it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}

/// A thread area's counters, as glass reads them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AreaStats {
    pub tid: u32,
    pub pid: u32,
    pub lost: u64,
    pub unwound: u64,
    pub skipped: u64,
    pub depth: u64,
}

impl SessionMemory {
    /// Creates the file (tmpfs where possible: the pages are the ring memory itself) with
    /// `area_count` thread areas of `capacity` record words each.
    /// `counters`: perf_event (type, config) of each hardware counter every record
    /// carries (at most [`crate::MAX_COUNTERS`]). The file is mode 0600 whatever the
    /// umask, and belongs to `owner` when given (glass's own user otherwise): only the
    /// target's user and root may open it.
    pub fn create(
        area_count: usize,
        capacity: usize,
        counters: &[(u32, u64)],
        owner: Option<Owner>,
    ) -> io::Result<Self> {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        assert!(capacity.is_power_of_two());
        assert!(counters.len() <= crate::MAX_COUNTERS);
        let stride = area::RECORDS + capacity * 8;
        let size = header::SIZE + area_count * stride;
        // The file is sparse: its pages are allocated as the target writes them, and a
        // page the filesystem cannot provide would be a SIGBUS in the target. So only a
        // filesystem with room for all of it will do.
        let dir = ["/dev/shm", "/tmp"]
            .into_iter()
            .map(Path::new)
            .find(|d| d.is_dir() && free_bytes(d) >= size as u64)
            .ok_or_else(|| {
                io::Error::other(format!(
                    "neither /dev/shm nor /tmp has {} MiB free for the rings (lower --max-threads or --ring-size)",
                    size >> 20
                ))
            })?;
        let mut attempt = 0u32;
        let (path, file) = loop {
            let path = dir.join(format!(
                "glass-trace-{}-{}-{attempt}",
                std::process::id(),
                crate::rdtsc() % 1_000_000
            ));
            match std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
            {
                Ok(file) => break (path, file),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempt < 100 => attempt += 1,
                Err(e) => return Err(e),
            }
        };
        let cleanup = |e| {
            let _ = std::fs::remove_file(&path);
            e
        };
        // The owner first, then the mode: a umask may have taken bits off 0600, and no
        // moment exists where anyone else could open the file.
        // SAFETY: plain system calls without arguments.
        let ours = unsafe { (libc::geteuid(), libc::getegid()) };
        if let Some(owner) = owner.filter(|o| (o.uid, o.gid) != ours) {
            std::os::unix::fs::fchown(&file, Some(owner.uid), Some(owner.gid)).map_err(cleanup)?;
        }
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(cleanup)?;
        file.set_len(size as u64).map_err(cleanup)?;
        // SAFETY: the file is ours; the target only ever writes the fields the layout
        // gives it, and glass reads them with atomics.
        let map = unsafe { memmap2::MmapMut::map_mut(&file) }.map_err(cleanup)?;
        let mut memory = SessionMemory {
            path,
            map,
            area_count,
            capacity,
        };
        memory.put(header::VERSION, VERSION);
        memory.put(header::AREA_COUNT, area_count as u64);
        memory.put(header::AREA_STRIDE, stride as u64);
        memory.put(header::CAPACITY, capacity as u64);
        memory.put(header::COUNTERS, counters.len() as u64);
        for (i, &(kind, config)) in counters.iter().enumerate() {
            memory.put(header::COUNTER_CONFIG + 16 * i, kind as u64);
            memory.put(header::COUNTER_CONFIG + 16 * i + 8, config);
        }
        memory.put(header::TSC_START, crate::rdtsc());
        for index in 0..area_count {
            let base = header::SIZE + index * stride;
            memory.put(base + area::MASK, capacity as u64 - 1);
            memory.put(base + area::LIMIT, capacity as u64);
            memory.put(base + area::RECORD_WORDS, 1 + counters.len() as u64);
        }
        // The magic last: the runtime trusts a mapping only once it is there.
        memory.word(header::MAGIC).store(MAGIC, Ordering::Release);
        Ok(memory)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the file; mappings (the target's, ours) stay valid.
    pub fn unlink(&self) {
        let _ = std::fs::remove_file(&self.path);
    }

    pub fn tsc_start(&self) -> u64 {
        self.get(header::TSC_START)
    }

    /// The runtime's pid and its `glass_enter`, once it has mapped the session.
    /// The fault the launched program (or a child it forked) died of, as its runtime
    /// noted it: (pid, signal, instruction pointer, faulting address).
    pub fn fatal_fault(&self) -> Option<(u32, u32, u64, u64)> {
        let signal = self.word(header::FATAL_SIGNAL).load(Ordering::Acquire);
        (signal != 0).then(|| {
            (
                self.word(header::FATAL_PID).load(Ordering::Relaxed) as u32,
                signal as u32,
                self.word(header::FATAL_PC).load(Ordering::Relaxed),
                self.word(header::FATAL_ADDRESS).load(Ordering::Relaxed),
            )
        })
    }

    pub fn runtime(&self) -> Option<(u32, u64)> {
        let pid = self.get(header::RUNTIME_PID);
        (pid != 0).then(|| (pid as u32, self.get(header::ENTER)))
    }

    pub fn exit_stub(&self) -> u64 {
        self.get(header::EXIT_STUB)
    }

    /// The runtime's return-site probes: Go's entry and exit, and native code's exit
    /// (whose entry is `glass_enter`).
    pub fn site_probes(&self) -> (u64, u64, u64) {
        (
            self.get(header::SITE_ENTER),
            self.get(header::SITE_EXIT),
            self.get(header::SITE_RETURN),
        )
    }

    /// Tells the Go probes where the running goroutine lies relative to the thread
    /// pointer (see [`header::GO_G_OFFSET`]).
    pub fn set_go_g_offset(&self, offset: i64) {
        self.word(header::GO_G_OFFSET)
            .store(offset as u64, Ordering::Relaxed);
    }

    /// Where the runtime mapped the session in the target.
    pub fn mapped_at(&self) -> u64 {
        self.get(header::MAPPED_AT)
    }

    /// Areas threads have claimed so far.
    pub fn claimed(&self) -> usize {
        (self.get(header::NEXT_AREA) as usize).min(self.area_count)
    }

    /// Probe events lost because more threads wanted an area than there are.
    pub fn no_area_lost(&self) -> u64 {
        self.get(header::NO_AREA_LOST)
    }

    fn stride(&self) -> usize {
        area::RECORDS + self.capacity * 8
    }

    pub fn stats(&self, index: usize) -> AreaStats {
        let base = header::SIZE + index * self.stride();
        AreaStats {
            tid: self.get(base + area::TID) as u32,
            pid: self.get(base + area::PID) as u32,
            lost: self.get(base + area::LOST),
            unwound: self.get(base + area::UNWOUND),
            skipped: self.get(base + area::SKIPPED),
            depth: self.get(base + area::DEPTH),
        }
    }

    /// Whether the thread that claimed area `index` has filled in who it is.
    pub fn is_ready(&self, index: usize) -> bool {
        let base = header::SIZE + index * self.stride();
        self.get(base + area::CLAIMED) != 0
    }

    /// Appends the records of area `index` that are ready to `out` and frees their
    /// space. `all`: take everything written, published or not — only when the
    /// producer cannot be running (its process ended or is stopped).
    pub fn drain(&self, index: usize, all: bool, out: &mut Vec<u64>) -> usize {
        let base = header::SIZE + index * self.stride();
        let end = if all {
            self.word(base + area::CURSOR).load(Ordering::Acquire)
        } else {
            self.word(base + area::HEAD).load(Ordering::Acquire)
        };
        let tail = self.get(base + area::TAIL);
        if end <= tail {
            return 0;
        }
        // A producer that overran glass's tail would be a bug; never read more than a ring.
        let count = (end - tail).min(self.capacity as u64) as usize;
        let start = end - count as u64;
        let records = base + area::RECORDS;
        let mask = self.capacity - 1;
        let first = start as usize & mask;
        let words = self.words(records, self.capacity);
        let until_wrap = (self.capacity - first).min(count);
        out.extend_from_slice(&words[first..first + until_wrap]);
        out.extend_from_slice(&words[..count - until_wrap]);
        self.word(base + area::TAIL).store(end, Ordering::Release);
        count
    }

    fn words(&self, offset: usize, count: usize) -> &[u64] {
        let bytes = &self.map[offset..offset + count * 8];
        // SAFETY: the mapping is page aligned and offset is a multiple of 8; the target
        // may be writing other words concurrently (never these: they are below head).
        unsafe { std::slice::from_raw_parts(bytes.as_ptr() as *const u64, count) }
    }

    fn word(&self, offset: usize) -> &AtomicU64 {
        assert!(offset.is_multiple_of(8) && offset + 8 <= self.map.len());
        // SAFETY: aligned, in bounds, and shared words are only accessed atomically or
        // by plain stores of one owner (x86-64 stores of aligned words are atomic).
        unsafe { &*(self.map.as_ptr().add(offset) as *const AtomicU64) }
    }

    fn get(&self, offset: usize) -> u64 {
        self.word(offset).load(Ordering::Acquire)
    }

    fn put(&mut self, offset: usize, value: u64) {
        self.word(offset).store(value, Ordering::Relaxed);
    }
}

fn free_bytes(dir: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return 0;
    };
    // SAFETY: statvfs fills the struct for a valid path.
    unsafe {
        let mut stat: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(path.as_ptr(), &mut stat) != 0 {
            return 0;
        }
        stat.f_bavail as u64 * stat.f_frsize as u64
    }
}

impl Drop for SessionMemory {
    fn drop(&mut self) {
        self.unlink();
    }
}
