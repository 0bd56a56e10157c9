//! The symbol cache on disk: per build id, the module's [symbol index](crate::index)
//! (every address range of its code with the functions running there), so that a
//! report of any recording of a build seen before names its frames without reading
//! DWARF again.
//!
//! Reading a module's DWARF is most of a short report's time (libc's separate debug
//! file alone is 2.4 MB of compressed sections to inflate and parse). perf keeps whole
//! binaries by build id (`~/.debug`); glass keeps what it reads from them.
//!
//! An index holds only what the files it came from say: each cache file records its
//! [`Origin`], every file whose presence or contents decided the names (the module's
//! file, the debug file candidates, with size and modification time), and a report
//! that would read other files (a debug file installed since, a binary replaced, one
//! fetched by debuginfod) builds the module's index afresh. While the origin holds, the
//! module's file is not even opened: its segments are in the cache too.
//!
//! Format: the magic line, the origin (u32 length, bytes), zeros up to a multiple of 8,
//! the index. A file that does not parse is ignored and replaced. Files are replaced
//! whole (written beside, then renamed), so concurrent reports never read a half-written
//! one, and a mapped file stays as it was while mapped.
//!
//! Size: every rebuild of a program is a new build id, so the cache would only grow.
//! Each use of an index sets its file's modification time, and when a new index takes
//! the cache past `GLASS_SYMBOL_CACHE_MAX` (MiB; 2 GiB by default) the least recently
//! used ones are removed down to nine tenths of it (unlinking a file another report has
//! mapped leaves that report's mapping as it was).

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::index::SymbolIndex;

/// Bumped whenever what an address is named with changes (the index's rules or
/// format), so that indexes of an older glass are not used.
// 4: FDE-named functions (sub_<address>) among the symbols.
// 5: PLT stubs named `x@plt`.
const MAGIC: &[u8] = b"glass symbol cache 5\n";

/// Where the cache lives: `GLASS_SYMBOL_CACHE` (`off` turns it off), else
/// `$XDG_CACHE_HOME/glass/symbols`, else `~/.cache/glass/symbols`.
pub fn default_dir() -> Option<PathBuf> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = var("GLASS_SYMBOL_CACHE") {
        return (dir != "off").then(|| PathBuf::from(dir));
    }
    if let Some(xdg) = var("XDG_CACHE_HOME") {
        return Some(Path::new(&xdg).join("glass/symbols"));
    }
    var("HOME").map(|home| Path::new(&home).join(".cache/glass/symbols"))
}

/// The cache's size by default, above which the least recently used indexes go.
const DEFAULT_MAX_BYTES: u64 = 2 << 30;

/// The cache's largest size: `GLASS_SYMBOL_CACHE_MAX` (MiB), else 2 GiB; an error line
/// for a value that is not a number of MiB.
pub(crate) fn max_bytes() -> Result<u64, String> {
    static MAX: std::sync::OnceLock<Result<u64, String>> = std::sync::OnceLock::new();
    MAX.get_or_init(|| match std::env::var("GLASS_SYMBOL_CACHE_MAX") {
        Err(_) => Ok(DEFAULT_MAX_BYTES),
        Ok(value) => value
            .trim()
            .parse::<u64>()
            .ok()
            .and_then(|mib| mib.checked_mul(1 << 20))
            .ok_or_else(|| {
                format!(
                    "GLASS_SYMBOL_CACHE_MAX={value}: not a size in MiB; the symbol cache \
                     keeps its default limit of 2048 MiB"
                )
            }),
    })
    .clone()
}

/// Removes the least recently used indexes of `dir` (by modification time: each use
/// sets it) until the cache is at most nine tenths of `max` bytes, if it is above
/// `max`; never `keep` (the index just written), never a file whose name is not a build
/// id. Temporary files of writers that died (an hour old) go too.
pub(crate) fn prune(dir: &Path, max: u64, keep: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let now = std::time::SystemTime::now();
    let age = |metadata: &std::fs::Metadata| {
        metadata
            .modified()
            .ok()
            .and_then(|modified| now.duration_since(modified).ok())
            .unwrap_or_default()
    };
    let mut indexes = Vec::new();
    let mut total = 0u64;
    for entry in entries.flatten() {
        let Ok(metadata) = entry.metadata() else {
            continue;
        };
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if !metadata.is_file() {
            continue;
        }
        if name.starts_with('.') {
            if age(&metadata) > std::time::Duration::from_secs(3600) {
                let _ = std::fs::remove_file(entry.path());
            }
            continue;
        }
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_hexdigit()) {
            continue;
        }
        total += metadata.len();
        indexes.push((age(&metadata), metadata.len(), entry.path()));
    }
    if total <= max {
        return;
    }
    // The oldest use first.
    indexes.sort_by_key(|(age, _, _)| std::cmp::Reverse(*age));
    let target = max / 10 * 9;
    for (_, size, path) in indexes {
        if total <= target {
            break;
        }
        if path != keep && std::fs::remove_file(&path).is_ok() {
            total -= size;
        }
    }
}

/// A file's size and modification time (seconds, nanoseconds).
type Stamp = (u64, i64, i64);

fn stamp(path: &str) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let metadata = std::fs::metadata(path).ok()?;
    Some((metadata.size(), metadata.mtime(), metadata.mtime_nsec()))
}

/// Where a module's names come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Origin {
    /// The module's path in the recording.
    pub module_path: String,
    /// Its loadable segments: (file offset, file size, virtual address).
    pub segments: Vec<(u64, u64, u64)>,
    /// The files names are read from: the debug file (or the file itself) and the file.
    pub debug: String,
    pub path: String,
    /// Every file whose presence or contents decided the names, as it was.
    files: Vec<(String, Option<Stamp>)>,
    /// Neither the file nor a debug file on this machine has DWARF: a debuginfod
    /// server, when one is configured, may have it (now or later).
    lacks_debug_info: bool,
}

impl Origin {
    pub(crate) fn new(
        module_path: &str,
        segments: Vec<(u64, u64, u64)>,
        debug: &str,
        path: &str,
        files: &[&str],
        lacks_debug_info: bool,
    ) -> Origin {
        Origin {
            module_path: module_path.to_string(),
            segments,
            debug: debug.to_string(),
            path: path.to_string(),
            files: files.iter().map(|f| (f.to_string(), stamp(f))).collect(),
            lacks_debug_info,
        }
    }

    /// Every file is as it was: the module would be read from the same files (and
    /// there is no debuginfod server to ask for what they lack).
    fn holds(&self, debuginfod: bool) -> bool {
        !(self.lacks_debug_info && debuginfod)
            && self.files.iter().all(|(path, was)| stamp(path) == *was)
    }

    fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = Vec::new();
        let put_str = |bytes: &mut Vec<u8>, s: &str| {
            bytes.extend_from_slice(&(s.len() as u32).to_le_bytes());
            bytes.extend_from_slice(s.as_bytes());
        };
        put_str(&mut bytes, &self.module_path);
        put_str(&mut bytes, &self.debug);
        put_str(&mut bytes, &self.path);
        bytes.push(u8::from(self.lacks_debug_info));
        bytes.extend_from_slice(&(self.segments.len() as u32).to_le_bytes());
        for (offset, size, address) in &self.segments {
            for value in [offset, size, address] {
                bytes.extend_from_slice(&value.to_le_bytes());
            }
        }
        bytes.extend_from_slice(&(self.files.len() as u32).to_le_bytes());
        for (path, stamp) in &self.files {
            put_str(&mut bytes, path);
            match stamp {
                None => bytes.push(0),
                Some((size, seconds, nanoseconds)) => {
                    bytes.push(1);
                    bytes.extend_from_slice(&size.to_le_bytes());
                    bytes.extend_from_slice(&seconds.to_le_bytes());
                    bytes.extend_from_slice(&nanoseconds.to_le_bytes());
                }
            }
        }
        bytes
    }

    fn from_bytes(bytes: &[u8]) -> Option<Origin> {
        let mut reader = Reader { bytes };
        let module_path = reader.string()?;
        let debug = reader.string()?;
        let path = reader.string()?;
        let lacks_debug_info = reader.take(1)?[0] != 0;
        let count = reader.u32()? as usize;
        let mut segments = Vec::with_capacity(count.min(bytes.len() / 24));
        for _ in 0..count {
            segments.push((reader.u64()?, reader.u64()?, reader.u64()?));
        }
        let count = reader.u32()? as usize;
        let mut files = Vec::with_capacity(count.min(bytes.len() / 5));
        for _ in 0..count {
            let path = reader.string()?;
            let stamp = match reader.take(1)?[0] {
                0 => None,
                _ => Some((reader.u64()?, reader.u64()? as i64, reader.u64()? as i64)),
            };
            files.push((path, stamp));
        }
        reader.bytes.is_empty().then_some(Origin {
            module_path,
            segments,
            debug,
            path,
            files,
            lacks_debug_info,
        })
    }
}

/// The bytes of an index: mapped from the cache, or just built.
pub(crate) enum Backing {
    Mapped(memmap2::Mmap, usize),
    Built(Vec<u8>),
}

impl AsRef<[u8]> for Backing {
    fn as_ref(&self) -> &[u8] {
        match self {
            Backing::Mapped(map, offset) => &map[*offset..],
            Backing::Built(bytes) => bytes,
        }
    }
}

/// The cache of one module (one build id): where its names come from, and its index
/// once there is one.
pub(crate) struct ModuleCache {
    file: PathBuf,
    origin: Origin,
    index: Option<SymbolIndex<Backing>>,
    /// An index was built (or tried) by this report.
    built: bool,
}

impl ModuleCache {
    /// The cache of `build_id` in `dir` for names read from `origin`: with the index
    /// kept there if it was read from the same files.
    pub(crate) fn open(dir: &Path, build_id: &[u8], origin: Origin) -> ModuleCache {
        let file = dir.join(crate::debuginfod::hex(build_id));
        let index = read(&file)
            .filter(|(found, _)| *found == origin)
            .map(|(_, index)| index);
        ModuleCache {
            file,
            origin,
            index,
            built: false,
        }
    }

    /// The cache of `build_id` for the module at `module_path`, if the files it was
    /// read from are all as they were: then the module's own files need not be opened.
    /// `debuginfod`: a server is configured.
    pub(crate) fn open_if_current(
        dir: &Path,
        build_id: &[u8],
        module_path: &str,
        debuginfod: bool,
    ) -> Option<ModuleCache> {
        let file = dir.join(crate::debuginfod::hex(build_id));
        let (origin, index) = read(&file)?;
        (origin.module_path == module_path && origin.holds(debuginfod)).then_some(ModuleCache {
            file,
            origin,
            index: Some(index),
            built: false,
        })
    }

    pub(crate) fn origin(&self) -> &Origin {
        &self.origin
    }

    pub(crate) fn index(&self) -> Option<&SymbolIndex<Backing>> {
        self.index.as_ref()
    }

    /// Builds the index with `build` (from the origin's files) if there is none and
    /// this report has not tried yet (a module the index cannot describe is left to
    /// addr2line).
    pub(crate) fn build_once(&mut self, build: impl FnOnce() -> Option<Vec<u8>>) {
        if self.wants_index() {
            self.built_as(build());
        }
    }

    /// There is no index yet and this report has not tried to build one.
    pub(crate) fn wants_index(&self) -> bool {
        self.index.is_none() && !self.built
    }

    /// Keeps what a build of the index gave (None: the module is left to addr2line).
    pub(crate) fn built_as(&mut self, index: Option<Vec<u8>>) {
        self.built = true;
        if let Some(index) = index {
            let _ = self.store(index);
        }
    }

    /// Keeps `index` (built from the origin's files) for this report and the next
    /// ones. Failing to write it is not an error of the report: the next one builds
    /// it again.
    pub(crate) fn store(&mut self, index: Vec<u8>) -> std::io::Result<()> {
        let Some(parsed) = SymbolIndex::parse(Backing::Built(index)) else {
            return Ok(());
        };
        let written = write(&self.file, &self.origin.to_bytes(), parsed.bytes().as_ref());
        self.index = Some(parsed);
        if written.is_ok() {
            if let Some(dir) = self.file.parent() {
                prune(dir, max_bytes().unwrap_or(DEFAULT_MAX_BYTES), &self.file);
            }
        }
        written
    }
}

/// The origin and index of a cache file, if it parses.
fn read(path: &Path) -> Option<(Origin, SymbolIndex<Backing>)> {
    let file = std::fs::File::open(path).ok()?;
    // SAFETY: read-only map of a file glass replaces by renaming, never in place.
    let map = unsafe { memmap2::Mmap::map(&file) }.ok()?;
    let mut reader = Reader { bytes: &map };
    if reader.take(MAGIC.len())? != MAGIC {
        return None;
    }
    let length = reader.u32()? as usize;
    let origin = Origin::from_bytes(reader.take(length)?)?;
    let offset = (MAGIC.len() + 4 + length).checked_add(7)? & !7;
    if offset > map.len() {
        return None;
    }
    let index = SymbolIndex::parse(Backing::Mapped(map, offset))?;
    // Used now: the last to go when the cache is pruned. (Not being allowed to is no
    // reason to refuse the index.)
    let _ = file.set_modified(std::time::SystemTime::now());
    Some((origin, index))
}

fn write(path: &Path, origin: &[u8], index: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    // The names of the code a user profiles are theirs: the directory is private.
    std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
        .create(dir)?;
    let mut bytes = Vec::with_capacity(MAGIC.len() + 4 + origin.len() + 8 + index.len());
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&(origin.len() as u32).to_le_bytes());
    bytes.extend_from_slice(origin);
    while !bytes.len().is_multiple_of(8) {
        bytes.push(0);
    }
    bytes.extend_from_slice(index);
    // Unique to this writer: other reports (and other symbolizers of this one) may be
    // writing the same build's index at the same time; the last rename wins whole.
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let temporary = dir.join(format!(
        ".{}.{}.{}",
        path.file_name()
            .map_or_else(Default::default, |n| n.to_string_lossy()),
        std::process::id(),
        WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let written = std::fs::File::create(&temporary)
        .and_then(|mut file| file.write_all(&bytes))
        .and_then(|()| std::fs::rename(&temporary, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.bytes.len() {
            return None;
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Some(head)
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    fn string(&mut self) -> Option<String> {
        let length = self.u32()? as usize;
        Some(std::str::from_utf8(self.take(length)?).ok()?.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::Lookup;

    /// An index naming 0x1000..0x1010 `main` (from the symbol table: /bin/true has no
    /// DWARF).
    fn index() -> Vec<u8> {
        crate::index::build("/bin/true", &[(0x1000, 0x10, "main".to_string())], 1).unwrap()
    }

    #[test]
    fn an_index_is_kept_and_used_only_while_its_origin_holds() {
        let dir = std::env::temp_dir().join(format!("glass-cache-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let module = dir.join("libdemo.so");
        std::fs::write(&module, b"one build").unwrap();
        let module = module.to_str().unwrap();
        let debug = format!("{}/libdemo.debug", dir.display());
        const HAS: bool = false;
        const LACKS: bool = true;
        let origin = |lacks_debug_info| {
            Origin::new(
                module,
                vec![(0, 0x1000, 0x400000)],
                module,
                module,
                &[module, &debug],
                lacks_debug_info,
            )
        };
        let build_id = [0xab, 0xcd, 0x01];
        let cache_dir = dir.join("cache");
        let mut cache = ModuleCache::open(&cache_dir, &build_id, origin(HAS));
        assert!(cache.index().is_none());
        cache.store(index()).unwrap();
        assert_eq!(
            cache.index().unwrap().lookup(0x1004),
            Lookup::Symbol("main")
        );
        assert!(cache_dir.join("abcd01").is_file());

        let again = ModuleCache::open_if_current(&cache_dir, &build_id, module, false).unwrap();
        assert_eq!(again.origin(), &origin(HAS));
        assert_eq!(
            again.index().unwrap().lookup(0x100f),
            Lookup::Symbol("main")
        );
        assert_eq!(again.index().unwrap().lookup(0x1010), Lookup::None);
        let elsewhere = "/elsewhere/libdemo.so";
        assert!(ModuleCache::open_if_current(&cache_dir, &build_id, elsewhere, false).is_none());

        // A debug file installed since: the cache no longer holds, nothing is reused.
        std::fs::write(&debug, b"debug info").unwrap();
        assert!(ModuleCache::open_if_current(&cache_dir, &build_id, module, false).is_none());
        assert!(ModuleCache::open(&cache_dir, &build_id, origin(HAS))
            .index()
            .is_none());
        std::fs::remove_file(&debug).unwrap();
        assert!(ModuleCache::open_if_current(&cache_dir, &build_id, module, false).is_some());

        // Names a debuginfod server may improve are reused only after asking it.
        let mut lacking = ModuleCache::open(&cache_dir, &build_id, origin(LACKS));
        assert!(lacking.index().is_none());
        lacking.store(index()).unwrap();
        assert!(ModuleCache::open_if_current(&cache_dir, &build_id, module, true).is_none());
        assert!(ModuleCache::open_if_current(&cache_dir, &build_id, module, false).is_some());
        assert!(ModuleCache::open(&cache_dir, &build_id, origin(LACKS))
            .index()
            .is_some());

        // A damaged or cut file is ignored, never trusted in part.
        let path = cache_dir.join("abcd01");
        let bytes = std::fs::read(&path).unwrap();
        for cut in [0, 5, MAGIC.len() + 2, bytes.len() / 2, bytes.len() - 1] {
            std::fs::write(&path, &bytes[..cut]).unwrap();
            assert!(read(&path).is_none(), "cut at {cut}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_least_recently_used_indexes_go_when_the_cache_is_too_large() {
        let dir = std::env::temp_dir().join(format!("glass-cache-prune-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let now = std::time::SystemTime::now();
        let file = |name: &str, size: usize, age_secs: u64| {
            let path = dir.join(name);
            std::fs::write(&path, vec![0u8; size]).unwrap();
            let when = now - std::time::Duration::from_secs(age_secs);
            std::fs::File::options()
                .write(true)
                .open(&path)
                .unwrap()
                .set_modified(when)
                .unwrap();
            path
        };
        let oldest = file("aa01", 1000, 400);
        let old = file("aa02", 1000, 300);
        let recent = file("aa03", 1000, 200);
        let just_written = file("aa04", 1000, 500);
        let not_ours = file("notes.txt", 5000, 1000);
        let dead_writer = file(".aa05.123.0", 100, 7200);
        let live_writer = file(".aa06.124.0", 100, 10);
        // Under the limit: nothing goes but a dead writer's temporary file.
        prune(&dir, 4000, &just_written);
        assert!(oldest.exists() && !dead_writer.exists() && live_writer.exists());
        // 4000 bytes of indexes against 3000: down to 2700, the oldest uses first,
        // never the one just written or a file that is not an index.
        prune(&dir, 3000, &just_written);
        assert!(!oldest.exists() && !old.exists());
        assert!(recent.exists() && just_written.exists() && not_ours.exists());
        // Reading an index marks it used: it outlives an index written after it.
        let origin = Origin::new("/bin/true", vec![], "/bin/true", "/bin/true", &[], false);
        for id in [[0xbb, 0x01], [0xbb, 0x02]] {
            ModuleCache::open(&dir, &id, origin.clone())
                .store(index())
                .unwrap();
        }
        let (read_since, written_later) = (dir.join("bb01"), dir.join("bb02"));
        for (path, age_secs) in [(&read_since, 100), (&written_later, 50)] {
            let when = now - std::time::Duration::from_secs(age_secs);
            let file = std::fs::File::options().write(true).open(path).unwrap();
            file.set_modified(when).unwrap();
        }
        assert!(ModuleCache::open_if_current(&dir, &[0xbb, 0x01], "/bin/true", false).is_some());
        let size = |path: &Path| std::fs::metadata(path).unwrap().len();
        let max = (size(&just_written) + size(&read_since)) * 10 / 9 + 10;
        prune(&dir, max, &just_written);
        assert!(read_since.exists() && !written_later.exists() && !recent.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
