//! The symbol cache on disk: per build id, the frames each address of the module was
//! named with, so that a later report of the same builds names them without reading
//! DWARF again.
//!
//! Reading a module's DWARF is most of a short report's time (libc's separate debug
//! file alone is 2.4 MB of compressed sections to inflate and parse), while a report
//! needs a few hundred addresses of it, mostly the same ones from one recording of a
//! program to the next. perf keeps whole binaries by build id (`~/.debug`); glass keeps
//! the answers, which are small. There is no library for this: it is a map from address
//! to names in a file of glass's own format.
//!
//! An entry holds only what the files it came from say: each cache file records its
//! [`Origin`], every file whose presence or contents decided the answers (the module's
//! file, the debug file candidates, with size and modification time), and a report
//! that would read other files (a debug file installed since, a binary replaced, one
//! fetched by debuginfod) starts the module's cache afresh. While the origin holds, the
//! module's file is not even parsed: its segments are in the cache too.
//!
//! Format (little endian): the magic line, the origin (u32 length, bytes), the names
//! (u32 count, then u32 length + UTF-8 bytes each), the entries (u32 count, then u64
//! address, u16 frame count, u32 name index per frame, outermost first). A file that
//! does not parse is ignored and rewritten. Files are replaced whole (written beside,
//! then renamed), so concurrent reports never read a half-written one.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// Bumped whenever what an address is named with changes (the lookup's rules), so
/// that answers of an older glass are not reused.
const MAGIC: &[u8] = b"glass symbol cache 2\n";

/// Entries kept per module at most: a cache is a help, never a burden on the disk.
const MAX_ENTRIES: usize = 1 << 20;

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

/// A file's size and modification time (seconds, nanoseconds).
type Stamp = (u64, i64, i64);

fn stamp(path: &str) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let metadata = std::fs::metadata(path).ok()?;
    Some((metadata.size(), metadata.mtime(), metadata.mtime_nsec()))
}

/// Where a module's answers come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Origin {
    /// The module's path in the recording.
    pub module_path: String,
    /// Its loadable segments: (file offset, file size, virtual address).
    pub segments: Vec<(u64, u64, u64)>,
    /// The files names are read from: the debug file (or the file itself) and the file.
    pub debug: String,
    pub path: String,
    /// Every file whose presence or contents decided the answers, as it was.
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

/// The cached answers of one module (one build id).
pub(crate) struct ModuleCache {
    file: PathBuf,
    origin: Origin,
    entries: HashMap<u64, Rc<[String]>>,
    /// Answers found by this report and not yet written.
    added: bool,
}

impl ModuleCache {
    /// The cache of `build_id` in `dir`, if its answers came from `origin`; else an
    /// empty one that will replace it.
    pub(crate) fn open(dir: &Path, build_id: &[u8], origin: Origin) -> ModuleCache {
        let file = dir.join(crate::debuginfod::hex(build_id));
        let entries = std::fs::read(&file)
            .ok()
            .and_then(|bytes| parse(&bytes))
            .filter(|(found, _)| *found == origin)
            .map(|(_, entries)| entries)
            .unwrap_or_default();
        ModuleCache {
            file,
            origin,
            entries,
            added: false,
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
        let (origin, entries) = parse(&std::fs::read(&file).ok()?)?;
        (origin.module_path == module_path && origin.holds(debuginfod)).then_some(ModuleCache {
            file,
            origin,
            entries,
            added: false,
        })
    }

    pub(crate) fn origin(&self) -> &Origin {
        &self.origin
    }

    pub(crate) fn get(&self, address: u64) -> Option<&Rc<[String]>> {
        self.entries.get(&address)
    }

    pub(crate) fn insert(&mut self, address: u64, names: Rc<[String]>) {
        if self.entries.len() < MAX_ENTRIES {
            self.entries.insert(address, names);
            self.added = true;
        }
    }

    /// Writes the cache if this report added to it. Failing to is not an error of the
    /// report: the next one reads the DWARF again.
    pub(crate) fn save(&mut self) -> std::io::Result<()> {
        if !self.added {
            return Ok(());
        }
        self.added = false;
        let dir = self.file.parent().unwrap_or(Path::new("."));
        // The names of the code a user profiles are theirs: the directory is private.
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
            .create(dir)?;
        let bytes = serialize(&self.origin.to_bytes(), &self.entries);
        let temporary = dir.join(format!(
            ".{}.{}",
            self.file
                .file_name()
                .map_or_else(Default::default, |n| n.to_string_lossy()),
            std::process::id()
        ));
        let written = std::fs::File::create(&temporary)
            .and_then(|mut file| file.write_all(&bytes))
            .and_then(|()| std::fs::rename(&temporary, &self.file));
        if written.is_err() {
            let _ = std::fs::remove_file(&temporary);
        }
        written
    }
}

fn serialize(origin: &[u8], entries: &Entries) -> Vec<u8> {
    let mut names: HashMap<&str, u32> = HashMap::new();
    let mut name_list: Vec<&str> = Vec::new();
    let mut body = Vec::with_capacity(entries.len() * 16);
    let mut addresses: Vec<&u64> = entries.keys().collect();
    addresses.sort_unstable();
    for address in addresses {
        let frames = &entries[address];
        body.extend_from_slice(&address.to_le_bytes());
        body.extend_from_slice(&(frames.len().min(u16::MAX as usize) as u16).to_le_bytes());
        for name in frames.iter().take(u16::MAX as usize) {
            let index = *names.entry(name.as_str()).or_insert_with(|| {
                name_list.push(name.as_str());
                (name_list.len() - 1) as u32
            });
            body.extend_from_slice(&index.to_le_bytes());
        }
    }
    let mut bytes = Vec::with_capacity(body.len() + 64 * name_list.len() + 64);
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&(origin.len() as u32).to_le_bytes());
    bytes.extend_from_slice(origin);
    bytes.extend_from_slice(&(name_list.len() as u32).to_le_bytes());
    for name in name_list {
        bytes.extend_from_slice(&(name.len() as u32).to_le_bytes());
        bytes.extend_from_slice(name.as_bytes());
    }
    bytes.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&body);
    bytes
}

type Entries = HashMap<u64, Rc<[String]>>;

/// The origin and entries of a cache file, if it parses.
fn parse(bytes: &[u8]) -> Option<(Origin, Entries)> {
    let mut reader = Reader { bytes };
    if reader.take(MAGIC.len())? != MAGIC {
        return None;
    }
    let length = reader.u32()? as usize;
    let origin = Origin::from_bytes(reader.take(length)?)?;
    let name_count = reader.u32()? as usize;
    let mut names = Vec::with_capacity(name_count.min(bytes.len() / 4));
    for _ in 0..name_count {
        let length = reader.u32()? as usize;
        names.push(std::str::from_utf8(reader.take(length)?).ok()?.to_string());
    }
    let entry_count = reader.u32()? as usize;
    let mut entries = HashMap::with_capacity(entry_count.min(bytes.len() / 10));
    for _ in 0..entry_count {
        let address = u64::from_le_bytes(reader.take(8)?.try_into().ok()?);
        let frames = u16::from_le_bytes(reader.take(2)?.try_into().ok()?) as usize;
        let mut frame_names = Vec::with_capacity(frames);
        for _ in 0..frames {
            frame_names.push(names.get(reader.u32()? as usize)?.clone());
        }
        entries.insert(address, Rc::from(frame_names));
    }
    reader.bytes.is_empty().then_some((origin, entries))
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

    fn names(list: &[&str]) -> Rc<[String]> {
        list.iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .into()
    }

    #[test]
    fn answers_round_trip_and_only_while_their_origin_holds() {
        let dir = std::env::temp_dir().join(format!("glass-cache-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let module = dir.join("libdemo.so");
        std::fs::write(&module, b"one build").unwrap();
        let module = module.to_str().unwrap();
        let debug = format!("{dir}/libdemo.debug", dir = dir.display());
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
        const HAS: bool = false;
        const LACKS: bool = true;
        let build_id = [0xab, 0xcd, 0x01];
        let cache_dir = dir.join("cache");
        let mut cache = ModuleCache::open(&cache_dir, &build_id, origin(HAS));
        assert!(cache.get(0x10).is_none());
        cache.insert(0x10, names(&["main", "inlined_helper"]));
        cache.insert(0x20, names(&["main"]));
        cache.insert(0x30, names(&[]));
        cache.save().unwrap();
        assert!(cache_dir.join("abcd01").is_file());

        let again = ModuleCache::open_if_current(&cache_dir, &build_id, module, false).unwrap();
        assert_eq!(again.origin(), &origin(HAS));
        assert_eq!(again.entries.len(), 3);
        assert_eq!(
            &**again.get(0x10).unwrap(),
            &names(&["main", "inlined_helper"])[..]
        );
        assert_eq!(&**again.get(0x20).unwrap(), &names(&["main"])[..]);
        assert!(again.get(0x30).unwrap().is_empty());
        assert!(ModuleCache::open_if_current(
            &cache_dir,
            &build_id,
            "/elsewhere/libdemo.so",
            false
        )
        .is_none());

        // A debug file installed since: the cache no longer holds, nothing is reused.
        std::fs::write(&debug, b"debug info").unwrap();
        assert!(ModuleCache::open_if_current(&cache_dir, &build_id, module, false).is_none());
        assert!(ModuleCache::open(&cache_dir, &build_id, origin(HAS))
            .entries
            .is_empty());
        std::fs::remove_file(&debug).unwrap();
        assert!(ModuleCache::open_if_current(&cache_dir, &build_id, module, false).is_some());
        // Answers a debuginfod server may improve are reused only after asking it.
        let mut lacking = ModuleCache::open(&cache_dir, &build_id, origin(LACKS));
        lacking.insert(0x10, names(&["main"]));
        lacking.save().unwrap();
        assert!(ModuleCache::open_if_current(&cache_dir, &build_id, module, true).is_none());
        assert!(ModuleCache::open_if_current(&cache_dir, &build_id, module, false).is_some());
        assert_eq!(
            ModuleCache::open(&cache_dir, &build_id, origin(LACKS))
                .entries
                .len(),
            1
        );

        // A damaged or cut file is ignored, never trusted in part.
        let bytes = std::fs::read(cache_dir.join("abcd01")).unwrap();
        assert!(parse(&bytes).is_some());
        for cut in [0, 5, MAGIC.len() + 2, bytes.len() / 2, bytes.len() - 1] {
            assert!(parse(&bytes[..cut]).is_none(), "cut at {cut}");
        }
        let mut bad_index = bytes.clone();
        let last = bad_index.len() - 1;
        bad_index[last] = 0xff;
        assert!(parse(&bad_index).is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
