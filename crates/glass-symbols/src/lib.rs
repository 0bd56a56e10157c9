//! Offline symbolization: turn (module, address) into function names, after the target
//! is gone.
//!
//! Names come from DWARF with inline frames when the file (or its separate debug file,
//! found by build id under /usr/lib/debug/.build-id or by `.gnu_debuglink`) has it, else
//! from `.symtab`, else `.dynsym` (a stripped binary keeps its exported names), else
//! the `.eh_frame` FDE around the address (`sub_<address>`, as glass trace names a
//! stripped binary's static functions), else `module+0xoffset`. Symbol lookups check the symbol's size: an address in a function
//! without a symbol is never named after the function before it.
//! Files are checked against the build id recorded at sampling time, so a binary that
//! was rebuilt since shows offsets rather than wrong names. The parsing is done by
//! `addr2line` (which uses `gimli` and `object`); this crate only maps process addresses
//! to file addresses and caches.
//!
//! Two more sources, each in its own module:
//! - [`jit`]: code a JIT compiler generated in anonymous memory (`[anon]` modules) is
//!   named from the runtime's `/tmp/perf-PID.map` and jitdump files;
//! - [`vdso`]: the kernel's `[vdso]`, from the copy of its symbols the recorder kept;
//! - [`debuginfod`]: a module whose debug info is not on this machine (a stripped binary
//!   without a local debug file), or whose file is gone, is fetched by build id from the
//!   servers in `DEBUGINFOD_URLS`, into elfutils' cache;
//! - [`index`] and [`cache`]: a module's names are read once per build into a symbol
//!   index (every address range with the functions running there, by addr2line's
//!   rules) kept on disk by build id, so later reports of any recording of that build
//!   look addresses up without reading its DWARF; addr2line itself names modules the
//!   index leaves to it (split DWARF, dwz) and everything when the cache is off.

pub mod cache;
pub mod debuginfod;
pub mod index;
pub mod jit;
pub mod vdso;

use std::cell::OnceCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol};
// Answers are looked up once per distinct address of a report: FxHash, not SipHash.
use rustc_hash::FxHashMap;

/// The GNU build id of an ELF file, read through a memory map (only the notes are
/// touched, so this is cheap even for large files).
pub fn build_id(path: &Path) -> Option<Vec<u8>> {
    let file = std::fs::File::open(path).ok()?;
    // SAFETY: read-only map; a file truncated underneath us could fault, which is why
    // callers pass files the target itself has mapped.
    let map = unsafe { memmap2::Mmap::map(&file) }.ok()?;
    let elf = object::File::parse(&*map).ok()?;
    elf.build_id().ok().flatten().map(<[u8]>::to_vec)
}

/// One frame of a symbolized address. An address inside inlined code yields several,
/// outermost first.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Frame {
    pub function: String,
    /// The module's file name (no directory).
    pub module: String,
    /// This frame was inlined into the one before it.
    pub inlined: bool,
}

/// What the recording says about the module an address lies in.
#[derive(Debug, Clone, Copy)]
pub struct ModuleRef<'a> {
    pub path: &'a str,
    pub build_id: &'a [u8],
    /// Where the mapping starts in the process, and from which file offset.
    pub start: u64,
    pub file_offset: u64,
}

/// A loadable segment: (file offset, file size, virtual address).
type Segment = (u64, u64, u64);

/// An opened module file: its segments at once, its names when first needed (reading
/// DWARF is the expensive part, and the symbol cache often spares it).
struct ModuleFile {
    segments: Vec<Segment>,
    basename: String,
    /// The files names are read from, when found and of the recorded build: the debug
    /// file (or the file itself) and the file.
    source: Option<(String, String)>,
    names: OnceCell<Names>,
    /// The build id, when the module's index may be kept in the symbol cache.
    cache_key: Option<Vec<u8>>,
}

struct Names {
    /// DWARF, when the file or its debug file has it.
    loader: Option<addr2line::Loader>,
    /// Function symbols sorted by address: (address, size, demangled name).
    symbols: Vec<(u64, u64, String)>,
}

impl Names {
    fn read(debug: &str, path: &str) -> Names {
        Names {
            loader: addr2line::Loader::new(debug).ok(),
            symbols: module_symbols(debug, path),
        }
    }

    fn is_empty(&self) -> bool {
        self.loader.is_none() && self.symbols.is_empty()
    }
}

impl ModuleFile {
    fn names(&self) -> &Names {
        self.names.get_or_init(|| match &self.source {
            Some((debug, path)) => Names::read(debug, path),
            None => Names {
                loader: None,
                symbols: Vec::new(),
            },
        })
    }

    /// The file's virtual address (what its symbols and DWARF use) for a file offset.
    fn address_for_offset(&self, offset: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|(file_offset, size, _)| offset >= *file_offset && offset < file_offset + size)
            .map(|(file_offset, _, vaddr)| vaddr + (offset - file_offset))
    }
}

type BuildId = Vec<u8>;
/// Frames by (mapping start, file offset, address).
type Answers = FxHashMap<(u64, u64, u64), Rc<[Frame]>>;

/// A JIT description registered for a process (in addition to `/tmp/perf-PID.map` and
/// `/tmp/jit-PID.dump`, which are always looked at).
enum JitSource {
    File(PathBuf),
    Bytes(String, Vec<u8>),
}

/// Symbolizes addresses of many modules, opening each file once and remembering every
/// answer.
#[derive(Default)]
pub struct Symbolizer {
    /// By path, then build id.
    files: FxHashMap<String, Vec<(BuildId, Rc<ModuleFile>)>>,
    /// None until first needed; then the cache directory, if the cache is on.
    cache_dir: Option<Option<PathBuf>>,
    /// Per build id, the module's symbol cache (its index, once built or mapped).
    cached: HashMap<Vec<u8>, cache::ModuleCache>,
    /// By path, then (mapping start, file offset, address).
    answers: FxHashMap<String, Answers>,
    /// Per process: the JIT files registered, the symbols read from them (once), and the
    /// answers for addresses in anonymous memory.
    jit_sources: HashMap<u32, Vec<JitSource>>,
    jit: HashMap<u32, jit::JitSymbols>,
    jit_answers: HashMap<(u32, u64), Option<Rc<[Frame]>>>,
    /// None until first needed; then the client from the environment, if any.
    debuginfod: Option<Option<debuginfod::Debuginfod>>,
    /// Warnings for the user, one per module (build id mismatch, unreadable file).
    pub warnings: Vec<String>,
}

fn basename(path: &str) -> String {
    path.rsplit('/').next().unwrap_or(path).to_string()
}

/// Anonymous memory, where JIT compilers put their code: `[anon]` (or `[anon:NAME]`) as
/// glass records it, `//anon` as perf names it, or no path at all.
pub fn is_anonymous(path: &str) -> bool {
    path.is_empty()
        || path.starts_with("[anon")
        || path.starts_with("//anon")
        || path.starts_with("/memfd:")
        || path == "[heap]"
}

/// What [`Symbolizer::inspect`] learns of a module's file.
struct Inspected {
    segments: Vec<Segment>,
    /// A separate debug file found on this machine.
    debug_file: Option<String>,
    /// Where one was looked for.
    debug_candidates: Vec<String>,
    /// The file has DWARF of its own.
    has_dwarf: bool,
}

impl Symbolizer {
    pub fn new() -> Self {
        Self::default()
    }

    /// Uses `client` (or no debuginfod at all) instead of the one `DEBUGINFOD_URLS` and
    /// the other elfutils variables describe.
    pub fn set_debuginfod(&mut self, client: Option<debuginfod::Debuginfod>) {
        self.debuginfod = Some(client);
    }

    fn debuginfod(&mut self) -> Option<&debuginfod::Debuginfod> {
        self.debuginfod
            .get_or_insert_with(debuginfod::Debuginfod::from_env)
            .as_ref()
    }

    /// Fetches `kind` of `build_id` through debuginfod, if configured.
    fn fetch(&mut self, build_id: &[u8], kind: debuginfod::Kind, path: &str) -> Option<String> {
        if build_id.is_empty() {
            return None;
        }
        let result = self.debuginfod()?.fetch(build_id, kind);
        match result {
            Ok(fetched) => Some(fetched.to_string_lossy().into_owned()),
            Err(debuginfod::FetchError::NotFound) => None,
            Err(debuginfod::FetchError::Failed(reason)) => {
                self.warnings.push(format!("{path}: debuginfod: {reason}"));
                None
            }
        }
    }

    fn open(&mut self, module: &ModuleRef) -> Rc<ModuleFile> {
        let known = self.files.get(module.path).and_then(|files| {
            files
                .iter()
                .find(|(build_id, _)| build_id == module.build_id)
        });
        if let Some((_, file)) = known {
            return file.clone();
        }
        let opened = self
            .open_from_cache(module)
            .unwrap_or_else(|| self.open_file(module));
        let file = Rc::new(opened);
        self.files
            .entry(module.path.to_string())
            .or_default()
            .push((module.build_id.to_vec(), file.clone()));
        file
    }

    /// The module as the symbol cache describes it, when the files it was read from are
    /// all as they were: its segments and index, without opening it.
    fn open_from_cache(&mut self, module: &ModuleRef) -> Option<ModuleFile> {
        if module.build_id.is_empty() || self.cached.contains_key(module.build_id) {
            return None;
        }
        let dir = self.symbol_cache_dir()?;
        let debuginfod = self.debuginfod().is_some();
        let cache =
            cache::ModuleCache::open_if_current(&dir, module.build_id, module.path, debuginfod)?;
        let origin = cache.origin();
        let file = ModuleFile {
            segments: origin.segments.clone(),
            basename: basename(module.path),
            source: Some((origin.debug.clone(), origin.path.clone())),
            names: OnceCell::new(),
            cache_key: Some(module.build_id.to_vec()),
        };
        self.cached.insert(module.build_id.to_vec(), cache);
        Some(file)
    }

    fn symbol_cache_dir(&mut self) -> Option<PathBuf> {
        if self.cache_dir.is_none() {
            let dir = cache::default_dir();
            if let (Some(_), Err(warning)) = (&dir, cache::max_bytes()) {
                self.warnings.push(warning);
            }
            self.cache_dir = Some(dir);
        }
        self.cache_dir.clone().flatten()
    }

    fn open_file(&mut self, module: &ModuleRef) -> ModuleFile {
        let mut opened = ModuleFile {
            segments: Vec::new(),
            basename: basename(module.path),
            source: None,
            names: OnceCell::new(),
            cache_key: None,
        };
        // Pseudo-files ([vdso], [anon], ...) have nothing on disk.
        if module.path.starts_with('[') || is_anonymous(module.path) {
            return opened;
        }
        let mut path = module.path.to_string();
        let mut inspected = Self::inspect(&path, module.build_id);
        // The file is gone or was rebuilt since: the build's own file, by build id.
        if inspected.is_err() {
            if let Some(fetched) =
                self.fetch(module.build_id, debuginfod::Kind::Executable, module.path)
            {
                if let Ok(found) = Self::inspect(&fetched, module.build_id) {
                    inspected = Ok(found);
                    path = fetched;
                }
            }
        }
        match inspected {
            Ok(mut inspected) => {
                let lacks_debug_info = inspected.debug_file.is_none() && !inspected.has_dwarf;
                if lacks_debug_info {
                    inspected.debug_file =
                        self.fetch(module.build_id, debuginfod::Kind::Debuginfo, module.path);
                }
                let debug = inspected.debug_file.unwrap_or_else(|| path.clone());
                // Every file whose presence or contents decides the names.
                let mut files = vec![module.path, path.as_str()];
                files.extend(inspected.debug_candidates.iter().map(String::as_str));
                files.push(&debug);
                files.dedup();
                let origin = cache::Origin::new(
                    module.path,
                    inspected.segments.clone(),
                    &debug,
                    &path,
                    &files,
                    lacks_debug_info,
                );
                opened.segments = inspected.segments;
                if !module.build_id.is_empty() {
                    opened.cache_key = self.open_module_cache(module.build_id, origin);
                }
                opened.source = Some((debug, path));
            }
            Err(reason) => match nm_table(module.path) {
                // uniprof's symbol table format, for guests whose ELF is not at hand.
                Some(symbols) => {
                    let start = symbols.first().map_or(0, |s| s.0);
                    opened.segments = vec![(0, u64::MAX / 2, start)];
                    let _ = opened.names.set(Names {
                        loader: None,
                        symbols,
                    });
                }
                None => self
                    .warnings
                    .push(format!("{}: {reason}; showing offsets", module.path)),
            },
        }
        opened
    }

    /// Opens the symbol cache of `build_id` for names read from `origin`: the key to use,
    /// None when the cache is off or already holds the build from other files (the
    /// same build at two paths: the first one's index is kept).
    fn open_module_cache(&mut self, build_id: &[u8], origin: cache::Origin) -> Option<Vec<u8>> {
        if let Some(open) = self.cached.get(build_id) {
            return (*open.origin() == origin).then(|| build_id.to_vec());
        }
        let dir = self.symbol_cache_dir()?;
        let cache = cache::ModuleCache::open(&dir, build_id, origin);
        self.cached.insert(build_id.to_vec(), cache);
        Some(build_id.to_vec())
    }

    /// Checks the file at `path` is the build that was mapped, and reads its segments.
    fn inspect(path: &str, build_id: &[u8]) -> Result<Inspected, String> {
        let file = std::fs::File::open(path).map_err(|e| format!("cannot open ({e})"))?;
        // SAFETY: read-only map of a regular file.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| format!("cannot map ({e})"))?;
        let elf = object::File::parse(&*map).map_err(|e| format!("not an ELF file ({e})"))?;
        let on_disk = elf.build_id().ok().flatten().unwrap_or(&[]);
        if !build_id.is_empty() && on_disk != build_id {
            return Err("changed since recording (build id differs)".to_string());
        }
        let segments = elf
            .segments()
            .map(|s| {
                let (offset, size) = s.file_range();
                (offset, size, s.address())
            })
            .collect();
        let has_dwarf = elf
            .section_by_name(".debug_info")
            .is_some_and(|s| s.size() > 0 && s.file_range().is_some());
        let debug_candidates = debug_file_candidates(path, on_disk, &elf);
        Ok(Inspected {
            segments,
            debug_file: debug_candidates
                .iter()
                .find(|candidate| Path::new(candidate).is_file())
                .cloned(),
            debug_candidates,
            has_dwarf,
        })
    }

    /// Registers a JIT description file (perf map or jitdump) for process `pid`, read
    /// when its anonymous code is first symbolized. `/tmp/perf-PID.map` and
    /// `/tmp/jit-PID.dump` need no registering; a jitdump elsewhere does (node writes it
    /// in its working directory), as does a copy kept with the recording.
    pub fn add_jit_file(&mut self, pid: u32, path: &Path) {
        self.add_jit_source(pid, JitSource::File(path.to_path_buf()));
    }

    /// Registers the contents of a JIT description file (a copy kept in the recording,
    /// such as [`jit::snapshot`] makes); `name` is shown as the module of the frames it
    /// names. A process with such copies is named from them alone: the files on this
    /// machine may be gone, or belong to a later process that had the same pid.
    pub fn add_jit_bytes(&mut self, pid: u32, name: &str, bytes: Vec<u8>) {
        self.add_jit_source(pid, JitSource::Bytes(name.to_string(), bytes));
    }

    /// Tells the symbolizer about a module the recording has: a jitdump file that a
    /// runtime mapped (as it does for profilers to find it) is registered for `pid`.
    /// Other paths are ignored, so every recorded module can be passed.
    pub fn note_module(&mut self, pid: u32, path: &str) {
        if jit::is_jitdump_marker(path) {
            let path = Path::new(path);
            let known = self.jit_sources.get(&pid).is_some_and(|sources| {
                sources
                    .iter()
                    .any(|s| matches!(s, JitSource::File(p) if p == path))
            });
            if !known {
                self.add_jit_file(pid, path);
            }
        }
    }

    fn add_jit_source(&mut self, pid: u32, source: JitSource) {
        self.jit_sources.entry(pid).or_default().push(source);
        // Read again (with the new source) when next needed.
        self.jit.remove(&pid);
        self.jit_answers.retain(|(p, _), _| *p != pid);
    }

    fn jit_symbols(&mut self, pid: u32) -> &jit::JitSymbols {
        if !self.jit.contains_key(&pid) {
            let mut symbols = jit::JitSymbols::new();
            let copied = self
                .jit_sources
                .get(&pid)
                .is_some_and(|sources| sources.iter().any(|s| matches!(s, JitSource::Bytes(..))));
            let mut paths = if copied {
                Vec::new()
            } else {
                jit::default_files(pid)
            };
            let mut data = Vec::new();
            for source in self.jit_sources.get(&pid).into_iter().flatten() {
                match source {
                    JitSource::File(path) => {
                        if !copied && !paths.contains(path) {
                            paths.push(path.clone());
                        }
                    }
                    JitSource::Bytes(name, bytes) => data.push((name, bytes)),
                }
            }
            for path in paths {
                if let Err(e) = symbols.add_file(&path) {
                    self.warnings.push(format!("JIT symbols: {e}"));
                }
            }
            for (name, bytes) in data {
                if let Err(e) = symbols.add_bytes(bytes, name) {
                    self.warnings.push(format!("JIT symbols: {name}: {e}"));
                }
            }
            self.jit.insert(pid, symbols);
        }
        &self.jit[&pid]
    }

    /// The JIT code at `address` in process `pid`, if a perf map or jitdump of the
    /// process names it.
    pub fn jit_frames(
        &mut self,
        pid: u32,
        address: u64,
        is_return_address: bool,
    ) -> Option<Rc<[Frame]>> {
        let probe = if is_return_address {
            address.saturating_sub(1)
        } else {
            address
        };
        if let Some(answer) = self.jit_answers.get(&(pid, probe)) {
            return answer.clone();
        }
        let answer = self.jit_symbols(pid).lookup(probe).map(|(name, source)| {
            Rc::from(vec![Frame {
                function: name.to_string(),
                module: source.to_string(),
                inlined: false,
            }])
        });
        self.jit_answers.insert((pid, probe), answer.clone());
        answer
    }

    /// [`Symbolizer::symbolize`] for an address of process `pid`: code in anonymous
    /// memory is looked up in the process's JIT files first.
    pub fn symbolize_in(
        &mut self,
        pid: u32,
        module: &ModuleRef,
        address: u64,
        is_return_address: bool,
    ) -> Rc<[Frame]> {
        if is_anonymous(module.path) || vdso::is_vdso(module.path) {
            if let Some(frames) = self.jit_frames(pid, address, is_return_address) {
                return frames;
            }
        }
        self.symbolize(module, address, is_return_address)
    }

    /// The frames for `address` in `module`. `is_return_address` marks an address taken
    /// from the stack: it points after the call, so the call instruction (one byte
    /// before) is what is looked up.
    pub fn symbolize(
        &mut self,
        module: &ModuleRef,
        address: u64,
        is_return_address: bool,
    ) -> Rc<[Frame]> {
        let probe = if is_return_address {
            address.saturating_sub(1)
        } else {
            address
        };
        let key = (module.start, module.file_offset, probe);
        if let Some(frames) = self.answers.get(module.path).and_then(|a| a.get(&key)) {
            return frames.clone();
        }
        let file = self.open(module);
        let offset = probe
            .wrapping_sub(module.start)
            .wrapping_add(module.file_offset);
        let frames: Rc<[Frame]> = match file.address_for_offset(offset) {
            Some(svma) => self.named(&file, svma),
            None => Rc::from(vec![Frame {
                function: format!("{}+0x{offset:x}", file.basename),
                module: file.basename.clone(),
                inlined: false,
            }]),
        };
        self.answers
            .entry(module.path.to_string())
            .or_default()
            .insert(key, frames.clone());
        frames
    }

    /// The frames at file address `svma` of `file`: from the module's symbol index
    /// (built and kept in the symbol cache at its first use), else from its DWARF or
    /// symbols through addr2line.
    fn named(&mut self, file: &ModuleFile, svma: u64) -> Rc<[Frame]> {
        let frames_of = |names: &[&str]| -> Rc<[Frame]> {
            names
                .iter()
                .enumerate()
                .map(|(i, function)| Frame {
                    function: function.to_string(),
                    module: file.basename.clone(),
                    inlined: i > 0,
                })
                .collect::<Vec<_>>()
                .into()
        };
        let offset_name = || format!("{}+0x{svma:x}", file.basename);
        if let Some(cache) = self.module_cache(file) {
            if let Some((debug, path)) = &file.source {
                cache.build_once(|| index::build(debug, &module_symbols(debug, path), cores()));
            }
            if let Some(index) = cache.index() {
                return match index.lookup(svma) {
                    index::Lookup::Dwarf(names) => frames_of(&names),
                    index::Lookup::Symbol(name) => frames_of(&[name]),
                    index::Lookup::None => frames_of(&[&offset_name()]),
                };
            }
        }
        let names = file.names();
        if names.is_empty() {
            return frames_of(&[&offset_name()]);
        }
        let found = lookup(names, &file.basename, svma);
        let found: Vec<&str> = found.iter().map(String::as_str).collect();
        frames_of(&found)
    }

    /// Opens `modules` (those a report is about to name) and builds the symbol indexes
    /// the cache lacks for them side by side, one module per core: the first report of
    /// a program's builds then waits for the largest index, not for all in turn.
    pub fn prepare<'m>(&mut self, modules: impl IntoIterator<Item = ModuleRef<'m>>) {
        let mut pending: Vec<(BuildId, String, String)> = Vec::new();
        for module in modules {
            if module.path.starts_with('[') || is_anonymous(module.path) {
                continue;
            }
            let file = self.open(&module);
            let (Some(key), Some((debug, path))) = (&file.cache_key, &file.source) else {
                continue;
            };
            let wanted = self.cached.get(key).is_some_and(|c| c.wants_index());
            if wanted && !pending.iter().any(|(k, _, _)| k == key) {
                pending.push((key.clone(), debug.clone(), path.clone()));
            }
        }
        if pending.is_empty() {
            return;
        }
        // The largest first, so that no core is left with a big one at the end.
        let size = |path: &str| std::fs::metadata(path).map_or(0, |m| m.len());
        pending.sort_by_key(|(_, debug, _)| std::cmp::Reverse(size(debug)));
        let workers = cores().min(pending.len());
        // A large module walks its DWARF on several threads when fewer large ones than
        // cores are pending (a program beside libc); never more threads than cores.
        let large = pending
            .iter()
            .filter(|(_, debug, _)| size(debug) >= LARGE_DEBUG_FILE)
            .count();
        let threads_each = (cores() / large.max(1)).max(1);
        let next = std::sync::atomic::AtomicUsize::new(0);
        let built: Vec<(usize, Option<Vec<u8>>)> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..workers)
                .map(|_| {
                    scope.spawn(|| {
                        let mut done = Vec::new();
                        loop {
                            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            let Some((_, debug, path)) = pending.get(i) else {
                                return done;
                            };
                            let symbols = module_symbols(debug, path);
                            done.push((i, index::build(debug, &symbols, threads_each)));
                        }
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|handle| handle.join().unwrap_or_default())
                .collect()
        });
        for (i, index) in built {
            if let Some(cache) = self.cached.get_mut(&pending[i].0) {
                cache.built_as(index);
            }
        }
    }

    /// The symbol cache of `file`'s build, if it is kept.
    fn module_cache(&mut self, file: &ModuleFile) -> Option<&mut cache::ModuleCache> {
        self.cached.get_mut(file.cache_key.as_ref()?)
    }
}

/// The names at `svma`, outermost first (an inlined function after the one it was
/// inlined into).
fn lookup(names: &Names, module: &str, svma: u64) -> Vec<String> {
    let mut frames = Vec::new();
    if let Some(loader) = &names.loader {
        if let Ok(mut iter) = loader.find_frames(svma) {
            // addr2line yields the innermost (inlined) function first.
            while let Ok(Some(frame)) = iter.next() {
                if let Some(function) = frame.function.as_ref() {
                    if let Ok(name) = function.demangle() {
                        frames.push(name.into_owned());
                    }
                }
            }
        }
    }
    if frames.is_empty() {
        let index = names
            .symbols
            .partition_point(|(address, _, _)| *address <= svma);
        if let Some((address, size, name)) = index.checked_sub(1).map(|i| &names.symbols[i]) {
            if *size == 0 || svma < address + size {
                frames.push(name.clone());
            }
        }
    }
    if frames.is_empty() {
        frames.push(format!("{module}+0x{svma:x}"));
    }
    frames.reverse();
    frames
}

/// Debug files at least this large (bytes) are indexed on several threads when cores
/// are free: libc's compressed one is 4 MB, a small program's a few KB.
const LARGE_DEBUG_FILE: u64 = 1 << 20;

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The function symbols that name a module: its debug file's, else its own; and for
/// code no symbol covers (a stripped binary's static functions), the module's
/// `.eh_frame` FDEs, one function each, named `sub_<address>` as glass trace names them
/// (glass_patch::fde_function_name), so that a report's name can be passed to `-f`.
fn module_symbols(debug: &str, path: &str) -> Vec<(u64, u64, String)> {
    let mut symbols = function_symbols(debug);
    if symbols.is_empty() && debug != path {
        symbols = function_symbols(path);
    }
    // The PLT's stubs have no symbols (and a debug file has no PLT bytes to read them
    // from): named from the module's own file, `x@plt` as perf names them, before the
    // unsized symbols are sized, so that `_init` (unsized, just before `.plt`) stops
    // where the stubs begin.
    let stubs = map_elf(path, glass_patch::plt_stubs).unwrap_or_default();
    if !stubs.is_empty() {
        let named: std::collections::HashSet<u64> = symbols.iter().map(|s| s.0).collect();
        symbols.extend(
            stubs
                .into_iter()
                .filter(|stub| !named.contains(&stub.address))
                .map(|stub| (stub.address, stub.size, stub.name)),
        );
        symbols.sort_by_key(|s| s.0);
    }
    size_unsized(&mut symbols);
    let fdes = map_elf(path, glass_patch::fde_ranges).unwrap_or_default();
    if fdes.is_empty() {
        return symbols;
    }
    let covered = |address: u64, symbols: &[(u64, u64, String)]| {
        let index = symbols.partition_point(|s| s.0 <= address);
        index > 0 && address < symbols[index - 1].0 + symbols[index - 1].1.max(1)
    };
    let unnamed: Vec<(u64, u64, String)> = fdes
        .into_iter()
        .filter(|&(address, _)| !covered(address, &symbols))
        .map(|(address, size)| (address, size, glass_patch::fde_function_name(address)))
        .collect();
    symbols.extend(unnamed);
    symbols.sort_by_key(|s| s.0);
    symbols.dedup_by_key(|s| s.0);
    symbols
}

/// `f` of the ELF file at `path`, mapped read-only; None if it cannot be read.
fn map_elf<T>(path: &str, f: impl FnOnce(&object::File) -> T) -> Option<T> {
    let file = std::fs::File::open(path).ok()?;
    // SAFETY: read-only map of a regular file.
    let map = unsafe { memmap2::Mmap::map(&file) }.ok()?;
    let elf = object::File::parse(&*map).ok()?;
    Some(f(&elf))
}

/// The function symbols of an ELF file: `.symtab`, or `.dynsym` when it has none;
/// unsized ones still without a size.
fn function_symbols(path: &str) -> Vec<(u64, u64, String)> {
    let Ok(file) = std::fs::File::open(path) else {
        return Vec::new();
    };
    // SAFETY: read-only map of a regular file.
    let Ok(map) = (unsafe { memmap2::Mmap::map(&file) }) else {
        return Vec::new();
    };
    let Ok(elf) = object::File::parse(&*map) else {
        return Vec::new();
    };
    // Assembly often labels its entry points without a type or a size
    // (`_multiboot_entry`, `ukarch_ctx_switch`): a NOTYPE symbol in an executable
    // section names code too, up to the next symbol, as nm-based tools do.
    let in_code = |s: &object::Symbol<'_, '_>| {
        s.section_index()
            .and_then(|index| elf.section_by_index(index).ok())
            .is_some_and(|section| section.kind() == object::SectionKind::Text)
    };
    // (address, size, name, typed as a function)
    let collect =
        |symbols: &mut dyn Iterator<Item = object::Symbol<'_, '_>>| -> Vec<(u64, u64, String, bool)> {
            symbols
                .filter(|s| match s.kind() {
                    object::SymbolKind::Text => s.is_definition() && s.address() != 0,
                    object::SymbolKind::Unknown => {
                        s.address() != 0
                            && in_code(s)
                            && s.name()
                                .is_ok_and(|name| !name.is_empty() && !name.starts_with(".L"))
                    }
                    _ => false,
                })
                .filter_map(|s| {
                    let name = s.name().ok()?;
                    Some((
                        s.address(),
                        s.size(),
                        addr2line::demangle_auto(name.into(), None).into_owned(),
                        s.kind() == object::SymbolKind::Text,
                    ))
                })
                .collect()
        };
    let mut symbols = collect(&mut elf.symbols());
    if symbols.is_empty() {
        symbols = collect(&mut elf.dynamic_symbols());
    }
    // Several names for one address (aliases): keep a function's, the sized one first.
    symbols.sort_by(|a, b| a.0.cmp(&b.0).then(b.3.cmp(&a.3)).then(b.1.cmp(&a.1)));
    symbols.dedup_by_key(|s| s.0);
    // A label inside a sized function (a loop's or a trampoline's end) does not rename
    // the rest of the function.
    let mut enclosing_end = 0;
    symbols.retain(|&(address, size, _, function)| {
        if !function && address < enclosing_end {
            return false;
        }
        if function && size > 0 {
            enclosing_end = enclosing_end.max(address + size);
        }
        true
    });
    symbols
        .into_iter()
        .map(|(address, size, name, _)| (address, size, name))
        .collect()
}

/// A symbol without a size reaches the next symbol (the lookup needs the end so that an
/// address past a sized function is never named after an unsized one before it).
fn size_unsized(symbols: &mut [(u64, u64, String)]) {
    for i in 0..symbols.len() {
        if symbols[i].1 == 0 {
            if let Some(next) = symbols.get(i + 1).map(|s| s.0) {
                symbols[i].1 = next - symbols[i].0;
            }
        }
    }
}

/// Where a separate debug file for `path` may be, in the order they are tried: by
/// build id under /usr/lib/debug/.build-id, then by the `.gnu_debuglink` name next to
/// the file, in its `.debug/`, or under /usr/lib/debug.
fn debug_file_candidates(path: &str, build_id: &[u8], elf: &object::File) -> Vec<String> {
    let mut candidates = Vec::new();
    if build_id.len() > 1 {
        let hex = debuginfod::hex(build_id);
        candidates.push(format!(
            "/usr/lib/debug/.build-id/{}/{}.debug",
            &hex[..2],
            &hex[2..]
        ));
    }
    let link = elf.gnu_debuglink().ok().flatten();
    let name = link.and_then(|(name, _crc)| std::str::from_utf8(name).ok());
    let dir = Path::new(path).parent().and_then(Path::to_str);
    if let (Some(name), Some(dir)) = (name, dir) {
        candidates.extend(
            [
                format!("{dir}/{name}"),
                format!("{dir}/.debug/{name}"),
                format!("/usr/lib/debug{dir}/{name}"),
            ]
            .into_iter()
            .filter(|candidate| candidate != path),
        );
    }
    candidates
}

/// A symbol table in `nm -n` / System.map / `/proc/kallsyms` form
/// (`ffffffff81000000 T _stext`, `ffffffffc0201000 t virtblk_probe\t[virtio_blk]`): the
/// text symbols sorted by address, each sized up to the next, a module's named
/// `func [module]`. None if the file is not one.
pub fn nm_table(path: &str) -> Option<Vec<(u64, u64, String)>> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut symbols: Vec<(u64, u64, String)> = text
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let address = u64::from_str_radix(fields.next()?, 16).ok()?;
            let kind = fields.next()?;
            let name = fields.next()?;
            // AArch64 mapping symbols ($x, $d) mark code and data, not functions.
            if name.starts_with('$') {
                return None;
            }
            // /proc/kallsyms ends a loaded module's symbols with `[module]`.
            let name = match fields.next() {
                Some(module) if module.starts_with('[') => format!("{name} {module}"),
                _ => name.to_string(),
            };
            matches!(kind, "T" | "t" | "W" | "w").then_some((address, 0, name))
        })
        .collect();
    if symbols.is_empty() {
        return None;
    }
    symbols.sort_by_key(|s| s.0);
    for i in 0..symbols.len() {
        let next = symbols.get(i + 1).map_or(symbols[i].0 + 4096, |s| s.0);
        symbols[i].1 = next.saturating_sub(symbols[i].0);
    }
    Some(symbols)
}

#[cfg(test)]
mod nm_table_tests {
    #[test]
    fn kallsyms_modules_are_named_and_mapping_symbols_left_out() {
        let path = std::env::temp_dir().join(format!("glass-kallsyms-{}", std::process::id()));
        std::fs::write(
            &path,
            "ffff800000d0b000 t $x\t[virtio_blk]\n\
             ffff800000d0b000 t virtblk_probe\t[virtio_blk]\n\
             ffff800000d0b400 t virtblk_remove\t[virtio_blk]\n\
             ffff800008010000 T _stext\n\
             ffff800008010040 D some_data\n",
        )
        .unwrap();
        let table = super::nm_table(&path.to_string_lossy()).unwrap();
        let _ = std::fs::remove_file(&path);
        let names: Vec<_> = table.iter().map(|s| (s.0, s.2.as_str())).collect();
        assert_eq!(
            names,
            [
                (0xffff800000d0b000, "virtblk_probe [virtio_blk]"),
                (0xffff800000d0b400, "virtblk_remove [virtio_blk]"),
                (0xffff800008010000, "_stext"),
            ]
        );
    }
}
