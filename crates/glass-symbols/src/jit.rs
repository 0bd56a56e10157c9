//! Names for code generated at run time (JIT compilers), which lives in anonymous memory
//! and has no file to read symbols from.
//!
//! Runtimes describe their code in two files, both read by perf too:
//! - `/tmp/perf-PID.map`, text, one `START SIZE name` line per piece of code (hexadecimal,
//!   `0x` optional): `node --perf-basic-prof`, `python3.12 -X perf`, JVM agents;
//! - `jit-PID.dump`, the binary jitdump format (tools/perf/Documentation/
//!   jitdump-specification.txt in the Linux tree): a header, then `JIT_CODE_LOAD`
//!   (address, size, name, code), `JIT_CODE_MOVE`, `JIT_CODE_DEBUG_INFO` (source lines),
//!   `JIT_CODE_UNWINDING_INFO` and `JIT_CODE_CLOSE` records: `node --perf-prof`, JVM
//!   agents. The runtime writes it where it likes (node: its working directory) and maps
//!   it executable once so that a profiler sees its path among the process's mappings.
//!
//! Code is often recompiled into memory that held other code: a later entry overrides
//! the earlier ones it overlaps ([`JitSymbols::insert`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// The code ranges of one process's JIT code, with their names. Later insertions replace
/// the parts of earlier ranges they overlap.
#[derive(Debug, Default, Clone)]
pub struct JitSymbols {
    /// start -> (end, name, index into `sources`).
    ranges: BTreeMap<u64, (u64, Rc<str>, usize)>,
    /// The file (base name) each range came from, for the frame's module.
    sources: Vec<String>,
}

impl JitSymbols {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Number of distinct ranges (after overrides).
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    fn source_index(&mut self, source: &str) -> usize {
        match self.sources.iter().position(|s| s == source) {
            Some(index) => index,
            None => {
                self.sources.push(source.to_string());
                self.sources.len() - 1
            }
        }
    }

    /// Adds `[start, start + size)` named `name`, from the file `source`; it replaces
    /// whatever part of earlier ranges it overlaps (their parts outside it stay).
    pub fn insert(&mut self, start: u64, size: u64, name: &str, source: &str) {
        let source = self.source_index(source);
        self.insert_shared(start, size, name.into(), source);
    }

    fn insert_shared(&mut self, start: u64, size: u64, name: Rc<str>, source: usize) {
        if size == 0 {
            return;
        }
        let end = start.saturating_add(size);
        // A range that starts before `start` and reaches into the new one is cut short,
        // and keeps its tail past `end` if it has one.
        if let Some((&before, &(before_end, ref before_name, before_source))) =
            self.ranges.range(..start).next_back()
        {
            if before_end > start {
                let before_name = before_name.clone();
                self.ranges
                    .insert(before, (start, before_name.clone(), before_source));
                if before_end > end {
                    self.ranges
                        .insert(end, (before_end, before_name, before_source));
                }
            }
        }
        // Ranges starting inside the new one go, except for a tail past `end`.
        let inside: Vec<u64> = self.ranges.range(start..end).map(|(&s, _)| s).collect();
        for s in inside {
            let (old_end, old_name, old_source) = self.ranges.remove(&s).unwrap();
            if old_end > end {
                self.ranges.insert(end, (old_end, old_name, old_source));
            }
        }
        self.ranges.insert(start, (end, name, source));
    }

    /// The name of the code at `address` and the file it came from.
    pub fn lookup(&self, address: u64) -> Option<(&str, &str)> {
        let (_, (end, name, source)) = self.ranges.range(..=address).next_back()?;
        (address < *end).then(|| (&**name, self.sources[*source].as_str()))
    }

    /// The ranges as a perf map (`START SIZE name` lines, by address), after overrides:
    /// a compact copy of everything the files said (a jitdump also holds the code
    /// itself, megabytes a second for node), for a recorder to keep.
    pub fn to_perf_map(&self) -> String {
        let mut text = String::new();
        for (start, (end, name, _)) in &self.ranges {
            text.push_str(&format!("{start:x} {:x} {name}\n", end - start));
        }
        text
    }

    /// Adds the entries of a perf map (`START SIZE name` lines), in file order.
    pub fn add_perf_map(&mut self, text: &str, source: &str) {
        let source = self.source_index(source);
        for (start, size, name) in parse_perf_map(text) {
            self.insert_shared(start, size, name.into(), source);
        }
    }

    /// Adds the code of a jitdump: every `JIT_CODE_LOAD`, and every `JIT_CODE_MOVE` at
    /// its new address, in file order.
    pub fn add_jitdump(&mut self, dump: &JitDump, source: &str) {
        let source = self.source_index(source);
        let mut names: std::collections::HashMap<u64, Rc<str>> = Default::default();
        for record in &dump.records {
            match record {
                JitRecord::CodeLoad(load) => {
                    let name: Rc<str> = load.name.as_str().into();
                    names.insert(load.code_index, name.clone());
                    self.insert_shared(load.code_address, load.code_size, name, source);
                }
                JitRecord::CodeMove(moved) => {
                    let name = names
                        .get(&moved.code_index)
                        .cloned()
                        .or_else(|| self.lookup(moved.old_code_address).map(|(n, _)| n.into()));
                    if let Some(name) = name {
                        self.insert_shared(moved.new_code_address, moved.code_size, name, source);
                    }
                }
                _ => {}
            }
        }
    }

    /// Reads a perf map or a jitdump (told apart by the jitdump magic) and adds it.
    pub fn add_bytes(&mut self, bytes: &[u8], source: &str) -> Result<(), JitDumpError> {
        if is_jitdump(bytes) {
            let dump = parse_jitdump(bytes)?;
            self.add_jitdump(&dump, source);
        } else {
            self.add_perf_map(&String::from_utf8_lossy(bytes), source);
        }
        Ok(())
    }

    /// Reads and adds a perf map or jitdump file; the frames it names show its base name
    /// as their module.
    pub fn add_file(&mut self, path: &Path) -> Result<(), String> {
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let source = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        self.add_bytes(&bytes, &source)
            .map_err(|e| format!("{}: {e}", path.display()))
    }
}

/// The entries of a perf map: `START SIZE name` per line, hexadecimal with or without
/// `0x`; the name is the rest of the line (it may hold spaces). Other lines are skipped.
pub fn parse_perf_map(text: &str) -> Vec<(u64, u64, &str)> {
    let hex = |field: &str| {
        let field = field
            .strip_prefix("0x")
            .or_else(|| field.strip_prefix("0X"))
            .unwrap_or(field);
        u64::from_str_radix(field, 16).ok()
    };
    text.lines()
        .filter_map(|line| {
            let line = line.trim_start();
            let (start, rest) = line.split_once(char::is_whitespace)?;
            let rest = rest.trim_start();
            let (size, name) = rest
                .split_once(char::is_whitespace)
                .unwrap_or((rest.trim_end(), ""));
            let name = name.trim();
            Some((
                hex(start)?,
                hex(size)?,
                if name.is_empty() { "?" } else { name },
            ))
        })
        .collect()
}

/// "JiTD" as the writer's native u32.
pub const JITDUMP_MAGIC: u32 = 0x4A69_5444;
pub const JIT_CODE_LOAD: u32 = 0;
pub const JIT_CODE_MOVE: u32 = 1;
pub const JIT_CODE_DEBUG_INFO: u32 = 2;
pub const JIT_CODE_CLOSE: u32 = 3;
pub const JIT_CODE_UNWINDING_INFO: u32 = 4;
/// Size of the jitdump file header (version 1) and of a record's prefix.
pub const JITDUMP_HEADER_SIZE: usize = 40;
pub const JITDUMP_RECORD_PREFIX_SIZE: usize = 16;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JitDump {
    pub version: u32,
    /// ELF machine of the code (EM_X86_64 = 62, EM_AARCH64 = 183).
    pub elf_mach: u32,
    pub pid: u32,
    pub timestamp: u64,
    pub flags: u64,
    pub big_endian: bool,
    pub records: Vec<JitRecord>,
    /// The file ended inside a record (the runtime was still writing, or was killed):
    /// the records before it are kept.
    pub truncated: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeLoad {
    pub timestamp: u64,
    pub pid: u32,
    pub tid: u32,
    pub vma: u64,
    pub code_address: u64,
    pub code_size: u64,
    pub code_index: u64,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeMove {
    pub timestamp: u64,
    pub pid: u32,
    pub tid: u32,
    pub vma: u64,
    pub old_code_address: u64,
    pub new_code_address: u64,
    pub code_size: u64,
    pub code_index: u64,
}

/// One line-table entry of `JIT_CODE_DEBUG_INFO`: the code at `address` comes from
/// `file:line`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DebugEntry {
    pub address: u64,
    pub line: u32,
    pub discriminator: u32,
    pub file: Rc<str>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JitRecord {
    CodeLoad(CodeLoad),
    CodeMove(CodeMove),
    DebugInfo {
        timestamp: u64,
        code_address: u64,
        entries: Vec<DebugEntry>,
    },
    UnwindingInfo {
        timestamp: u64,
        unwinding_size: u64,
        eh_frame_hdr_size: u64,
        mapped_size: u64,
    },
    Close {
        timestamp: u64,
    },
    /// A record type this reader does not know (newer versions may add some).
    Other {
        id: u32,
        timestamp: u64,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JitDumpError {
    NotJitdump,
    TooShort,
    BadHeaderSize(u32),
    /// A record whose size cannot hold its fields (the rest of the file is not read).
    BadRecord {
        offset: usize,
        id: u32,
        size: u32,
    },
}

impl std::fmt::Display for JitDumpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JitDumpError::NotJitdump => write!(f, "not a jitdump file (no JiTD magic)"),
            JitDumpError::TooShort => write!(f, "jitdump header cut short"),
            JitDumpError::BadHeaderSize(size) => write!(f, "jitdump header size {size}"),
            JitDumpError::BadRecord { offset, id, size } => write!(
                f,
                "jitdump record {id} at offset {offset} has an impossible size {size}"
            ),
        }
    }
}

impl std::error::Error for JitDumpError {}

/// The file starts with the jitdump magic, in either byte order.
pub fn is_jitdump(bytes: &[u8]) -> bool {
    bytes.len() >= 4 && {
        let magic = u32::from_le_bytes(bytes[..4].try_into().unwrap());
        magic == JITDUMP_MAGIC || magic == JITDUMP_MAGIC.swap_bytes()
    }
}

/// Reads fields in the file's byte order.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    big_endian: bool,
}

impl<'a> Reader<'a> {
    fn u32(&mut self) -> Option<u32> {
        let b: [u8; 4] = self.bytes.get(self.at..self.at + 4)?.try_into().ok()?;
        self.at += 4;
        Some(if self.big_endian {
            u32::from_be_bytes(b)
        } else {
            u32::from_le_bytes(b)
        })
    }

    fn u64(&mut self) -> Option<u64> {
        let b: [u8; 8] = self.bytes.get(self.at..self.at + 8)?.try_into().ok()?;
        self.at += 8;
        Some(if self.big_endian {
            u64::from_be_bytes(b)
        } else {
            u64::from_le_bytes(b)
        })
    }

    /// A NUL-terminated string (the rest, if no NUL).
    fn cstr(&mut self) -> Option<&'a [u8]> {
        let rest = self.bytes.get(self.at..)?;
        let len = rest.iter().position(|&b| b == 0)?;
        self.at += len + 1;
        Some(&rest[..len])
    }
}

/// Parses a jitdump file. A record cut off at the end (a file still being written) ends
/// the list with `truncated` set; a record whose declared size cannot hold its fixed
/// fields is an error, since nothing after it can be trusted.
pub fn parse_jitdump(bytes: &[u8]) -> Result<JitDump, JitDumpError> {
    if bytes.len() < 4 {
        return Err(JitDumpError::TooShort);
    }
    let magic = u32::from_le_bytes(bytes[..4].try_into().unwrap());
    let big_endian = if magic == JITDUMP_MAGIC {
        false
    } else if magic == JITDUMP_MAGIC.swap_bytes() {
        true
    } else {
        return Err(JitDumpError::NotJitdump);
    };
    let mut header = Reader {
        bytes,
        at: 4,
        big_endian,
    };
    let (version, total_size, elf_mach, _pad, pid, timestamp, flags) = (|| {
        Some((
            header.u32()?,
            header.u32()?,
            header.u32()?,
            header.u32()?,
            header.u32()?,
            header.u64()?,
            header.u64()?,
        ))
    })()
    .ok_or(JitDumpError::TooShort)?;
    // The header's own size says where the records start (later versions may grow it).
    if (total_size as usize) < JITDUMP_HEADER_SIZE - 8 || total_size as usize > bytes.len() {
        return Err(JitDumpError::BadHeaderSize(total_size));
    }
    let mut dump = JitDump {
        version,
        elf_mach,
        pid,
        timestamp,
        flags,
        big_endian,
        records: Vec::new(),
        truncated: false,
    };
    let mut offset = total_size as usize;
    while offset < bytes.len() {
        let mut prefix = Reader {
            bytes,
            at: offset,
            big_endian,
        };
        let (Some(id), Some(size), Some(timestamp)) = (prefix.u32(), prefix.u32(), prefix.u64())
        else {
            dump.truncated = true;
            break;
        };
        let bad = JitDumpError::BadRecord { offset, id, size };
        let size = size as usize;
        if size < JITDUMP_RECORD_PREFIX_SIZE {
            return Err(bad);
        }
        let Some(body) = bytes.get(offset..offset + size) else {
            dump.truncated = true;
            break;
        };
        let mut r = Reader {
            bytes: body,
            at: JITDUMP_RECORD_PREFIX_SIZE,
            big_endian,
        };
        let record = match id {
            JIT_CODE_LOAD => (|| {
                let (pid, tid) = (r.u32()?, r.u32()?);
                let (vma, code_address, code_size, code_index) =
                    (r.u64()?, r.u64()?, r.u64()?, r.u64()?);
                let name = String::from_utf8_lossy(r.cstr()?).into_owned();
                Some(JitRecord::CodeLoad(CodeLoad {
                    timestamp,
                    pid,
                    tid,
                    vma,
                    code_address,
                    code_size,
                    code_index,
                    name,
                }))
            })(),
            JIT_CODE_MOVE => (|| {
                Some(JitRecord::CodeMove(CodeMove {
                    timestamp,
                    pid: r.u32()?,
                    tid: r.u32()?,
                    vma: r.u64()?,
                    old_code_address: r.u64()?,
                    new_code_address: r.u64()?,
                    code_size: r.u64()?,
                    code_index: r.u64()?,
                }))
            })(),
            JIT_CODE_DEBUG_INFO => (|| {
                let code_address = r.u64()?;
                let count = r.u64()?;
                let mut entries = Vec::new();
                let mut previous: Rc<str> = "".into();
                for _ in 0..count {
                    let address = r.u64()?;
                    let line = r.u32()?;
                    let discriminator = r.u32()?;
                    let name = r.cstr()?;
                    // "\xff" alone repeats the previous entry's file name.
                    if name != b"\xff" {
                        previous = String::from_utf8_lossy(name).as_ref().into();
                    }
                    entries.push(DebugEntry {
                        address,
                        line,
                        discriminator,
                        file: previous.clone(),
                    });
                }
                Some(JitRecord::DebugInfo {
                    timestamp,
                    code_address,
                    entries,
                })
            })(),
            JIT_CODE_UNWINDING_INFO => (|| {
                Some(JitRecord::UnwindingInfo {
                    timestamp,
                    unwinding_size: r.u64()?,
                    eh_frame_hdr_size: r.u64()?,
                    mapped_size: r.u64()?,
                })
            })(),
            JIT_CODE_CLOSE => Some(JitRecord::Close { timestamp }),
            _ => Some(JitRecord::Other { id, timestamp }),
        };
        dump.records.push(record.ok_or(bad)?);
        offset += size;
    }
    Ok(dump)
}

/// Writes jitdump files (the header, then records), as runtimes do; for tests and for
/// tools that generate code.
pub struct JitDumpWriter<W: std::io::Write> {
    out: W,
    next_index: u64,
}

impl<W: std::io::Write> JitDumpWriter<W> {
    /// Writes the header (native byte order, version 1).
    pub fn new(mut out: W, pid: u32, elf_mach: u32, timestamp: u64) -> std::io::Result<Self> {
        out.write_all(&JITDUMP_MAGIC.to_ne_bytes())?;
        out.write_all(&1u32.to_ne_bytes())?;
        out.write_all(&(JITDUMP_HEADER_SIZE as u32).to_ne_bytes())?;
        out.write_all(&elf_mach.to_ne_bytes())?;
        out.write_all(&0u32.to_ne_bytes())?;
        out.write_all(&pid.to_ne_bytes())?;
        out.write_all(&timestamp.to_ne_bytes())?;
        out.write_all(&0u64.to_ne_bytes())?;
        Ok(JitDumpWriter { out, next_index: 0 })
    }

    fn prefix(&mut self, id: u32, size: usize, timestamp: u64) -> std::io::Result<()> {
        self.out.write_all(&id.to_ne_bytes())?;
        self.out.write_all(&(size as u32).to_ne_bytes())?;
        self.out.write_all(&timestamp.to_ne_bytes())
    }

    /// A `JIT_CODE_LOAD` of `code` at `address`; returns its code index.
    pub fn code_load(
        &mut self,
        timestamp: u64,
        pid: u32,
        tid: u32,
        address: u64,
        code: &[u8],
        name: &str,
    ) -> std::io::Result<u64> {
        let size = JITDUMP_RECORD_PREFIX_SIZE + 8 + 32 + name.len() + 1 + code.len();
        self.prefix(JIT_CODE_LOAD, size, timestamp)?;
        let index = self.next_index;
        self.next_index += 1;
        for v in [pid, tid] {
            self.out.write_all(&v.to_ne_bytes())?;
        }
        for v in [address, address, code.len() as u64, index] {
            self.out.write_all(&v.to_ne_bytes())?;
        }
        self.out.write_all(name.as_bytes())?;
        self.out.write_all(&[0])?;
        self.out.write_all(code)?;
        Ok(index)
    }

    /// A `JIT_CODE_MOVE` of the code `index` from `old` to `new`.
    #[allow(clippy::too_many_arguments)]
    pub fn code_move(
        &mut self,
        timestamp: u64,
        pid: u32,
        tid: u32,
        old: u64,
        new: u64,
        size: u64,
        index: u64,
    ) -> std::io::Result<()> {
        self.prefix(
            JIT_CODE_MOVE,
            JITDUMP_RECORD_PREFIX_SIZE + 8 + 40,
            timestamp,
        )?;
        for v in [pid, tid] {
            self.out.write_all(&v.to_ne_bytes())?;
        }
        for v in [new, old, new, size, index] {
            self.out.write_all(&v.to_ne_bytes())?;
        }
        Ok(())
    }

    /// A `JIT_CODE_DEBUG_INFO` for the code at `address`: (address, line, file) entries.
    pub fn debug_info(
        &mut self,
        timestamp: u64,
        address: u64,
        entries: &[(u64, u32, &str)],
    ) -> std::io::Result<()> {
        let size = JITDUMP_RECORD_PREFIX_SIZE
            + 16
            + entries
                .iter()
                .map(|(_, _, file)| 16 + file.len() + 1)
                .sum::<usize>();
        self.prefix(JIT_CODE_DEBUG_INFO, size, timestamp)?;
        self.out.write_all(&address.to_ne_bytes())?;
        self.out.write_all(&(entries.len() as u64).to_ne_bytes())?;
        for (address, line, file) in entries {
            self.out.write_all(&address.to_ne_bytes())?;
            self.out.write_all(&line.to_ne_bytes())?;
            self.out.write_all(&0u32.to_ne_bytes())?;
            self.out.write_all(file.as_bytes())?;
            self.out.write_all(&[0])?;
        }
        Ok(())
    }

    pub fn close(mut self, timestamp: u64) -> std::io::Result<W> {
        self.prefix(JIT_CODE_CLOSE, JITDUMP_RECORD_PREFIX_SIZE, timestamp)?;
        self.out.flush()?;
        Ok(self.out)
    }
}

/// `perf-123.map` or `jit-123.dump`: a JIT description file, by its name.
pub fn is_jit_file_name(name: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    name.strip_prefix("perf-")
        .and_then(|rest| rest.strip_suffix(".map"))
        .is_some_and(digits)
        || name
            .strip_prefix("jit-")
            .and_then(|rest| rest.strip_suffix(".dump"))
            .is_some_and(digits)
}

/// Is `path` (a module's path as recorded) a jitdump file the runtime mapped as a
/// marker for profilers?
pub fn is_jitdump_marker(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.starts_with("jit-") && is_jit_file_name(name)
}

/// The JIT description files a running process `pid` has now: `/tmp/perf-PID.map`, the
/// jitdump files it has mapped (their path as /proc/PID/maps shows it), and
/// `jit-PID.dump` in its working directory or /tmp. A recorder that should keep them
/// after the process is gone (runtimes may delete them at exit) copies these paths,
/// after the recording ends, since they grow while the process runs.
pub fn files_for_pid(pid: u32) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut push = |path: PathBuf| {
        if path.is_file() && !files.contains(&path) {
            files.push(path);
        }
    };
    push(PathBuf::from(format!("/tmp/perf-{pid}.map")));
    if let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) {
        for line in maps.lines() {
            // address perms offset dev inode path
            let path = line.splitn(6, ' ').nth(5).unwrap_or("").trim_start();
            if is_jitdump_marker(path) {
                push(PathBuf::from(path));
            }
        }
    }
    if let Ok(cwd) = std::fs::read_link(format!("/proc/{pid}/cwd")) {
        push(cwd.join(format!("jit-{pid}.dump")));
    }
    push(PathBuf::from(format!("/tmp/jit-{pid}.dump")));
    files
}

/// What the JIT files of process `pid` name, as one perf map, or None if it has none:
/// [`files_for_pid`] and `also` (jitdump files the recording saw the process map, whose
/// paths a recorder can no longer find in /proc once the process is gone), read in that
/// order. For a recorder to keep in the recording when the recording ends (the files are
/// complete then, and runtimes may delete them at exit); the report passes it back
/// through [`crate::Symbolizer::add_jit_bytes`].
pub fn snapshot(pid: u32, also: &[PathBuf]) -> Option<String> {
    let mut paths = files_for_pid(pid);
    for path in also {
        if path.is_file() && !paths.contains(path) {
            paths.push(path.clone());
        }
    }
    let mut symbols = JitSymbols::new();
    for path in paths {
        let _ = symbols.add_file(&path);
    }
    (!symbols.is_empty()).then(|| symbols.to_perf_map())
}

/// The files a report looks at for process `pid` when nothing else is known:
/// `/tmp/perf-PID.map` and `/tmp/jit-PID.dump`.
pub fn default_files(pid: u32) -> Vec<PathBuf> {
    [
        format!("/tmp/perf-{pid}.map"),
        format!("/tmp/jit-{pid}.dump"),
    ]
    .into_iter()
    .map(PathBuf::from)
    .filter(|p| p.is_file())
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_ranges_override_the_parts_they_overlap() {
        let mut jit = JitSymbols::new();
        jit.insert(0x1000, 0x100, "a", "m");
        jit.insert(0x1040, 0x20, "b", "m");
        assert_eq!(jit.lookup(0x103f).unwrap().0, "a");
        assert_eq!(jit.lookup(0x1040).unwrap().0, "b");
        assert_eq!(jit.lookup(0x105f).unwrap().0, "b");
        assert_eq!(jit.lookup(0x1060).unwrap().0, "a");
        assert_eq!(jit.lookup(0x10ff).unwrap().0, "a");
        assert!(jit.lookup(0x1100).is_none());
        assert!(jit.lookup(0xfff).is_none());
        // One range over several.
        jit.insert(0x0f00, 0x180, "c", "m");
        assert_eq!(jit.lookup(0x0f00).unwrap().0, "c");
        assert_eq!(jit.lookup(0x107f).unwrap().0, "c");
        assert_eq!(jit.lookup(0x1080).unwrap().0, "a");
        assert_eq!(jit.len(), 2);
        // Its perf map says the same.
        let mut copy = JitSymbols::new();
        copy.add_perf_map(&jit.to_perf_map(), "copy");
        for address in (0xe00..0x1200).step_by(8) {
            assert_eq!(
                copy.lookup(address).map(|l| l.0),
                jit.lookup(address).map(|l| l.0)
            );
        }
    }

    #[test]
    fn perf_map_lines() {
        let text = "7f00 10 JS:*fib /tmp/x.js:1:1\n0x8000 0x20 py::f:/x.py\nbogus\n9000 4\n";
        let entries = parse_perf_map(text);
        assert_eq!(
            entries,
            vec![
                (0x7f00, 0x10, "JS:*fib /tmp/x.js:1:1"),
                (0x8000, 0x20, "py::f:/x.py"),
                (0x9000, 4, "?"),
            ]
        );
    }

    #[test]
    fn jit_file_names() {
        assert!(is_jit_file_name("perf-12.map"));
        assert!(is_jit_file_name("jit-12.dump"));
        assert!(!is_jit_file_name("jit-.dump"));
        assert!(!is_jit_file_name("perf-12.mapx"));
        assert!(is_jitdump_marker("/home/u/jit-77.dump"));
        assert!(!is_jitdump_marker("/tmp/perf-77.map"));
    }
}
