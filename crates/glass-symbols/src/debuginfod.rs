//! A debuginfod client: debug files (and executables) fetched by build id from the
//! servers in `DEBUGINFOD_URLS`, kept in a cache shared with elfutils' tools (gdb, perf,
//! eu-stack).
//!
//! As elfutils' client does:
//! - `DEBUGINFOD_URLS`: space-separated server URLs, asked in order; unset or empty turns
//!   the client off;
//! - `GET URL/buildid/HEX/debuginfo` for the separate debug file, `.../executable` for the
//!   file itself;
//! - the cache is `$DEBUGINFOD_CACHE_PATH`, else `$XDG_CACHE_HOME/debuginfod_client`, else
//!   `~/.cache/debuginfod_client`, laid out `CACHE/HEX/debuginfo` and `CACHE/HEX/executable`;
//!   a cached file is used without asking any server (so reports work offline);
//! - a file no server has is remembered as an empty file for `cache_miss_s` seconds (the
//!   number in `CACHE/cache_miss_s`, 600 by default), so later runs do not ask again;
//! - `DEBUGINFOD_TIMEOUT` (seconds, default 90): how long to wait to connect and for
//!   each read.
//!
//! A server that cannot be reached is not asked again by the same client. Downloads are
//! written under a temporary name and renamed, and a file whose build id is not the one
//! asked for is thrown away.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// Which file of a build to fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The separate debug file (`objcopy --only-keep-debug`).
    Debuginfo,
    /// The ELF file itself.
    Executable,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Debuginfo => "debuginfo",
            Kind::Executable => "executable",
        }
    }
}

/// Why [`Debuginfod::fetch`] has no file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FetchError {
    /// No server has it (each answered 404), now or in the cache's recent memory.
    NotFound,
    /// A server could not be reached, failed, or sent a wrong file.
    Failed(String),
}

impl std::fmt::Display for FetchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FetchError::NotFound => write!(f, "not on the debuginfod servers"),
            FetchError::Failed(reason) => write!(f, "{reason}"),
        }
    }
}

pub struct Debuginfod {
    urls: Vec<String>,
    cache: PathBuf,
    agent: ureq::Agent,
    /// Servers that failed to answer (connection refused, timeout): skipped from then on.
    unreachable: std::cell::RefCell<Vec<usize>>,
}

const DEFAULT_TIMEOUT_S: u64 = 90;
const DEFAULT_CACHE_MISS_S: u64 = 600;

pub fn hex(build_id: &[u8]) -> String {
    build_id.iter().map(|b| format!("{b:02x}")).collect()
}

/// The cache directory elfutils would use, from the environment.
pub fn default_cache_dir() -> Option<PathBuf> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(path) = var("DEBUGINFOD_CACHE_PATH") {
        return Some(PathBuf::from(path));
    }
    if let Some(xdg) = var("XDG_CACHE_HOME") {
        return Some(Path::new(&xdg).join("debuginfod_client"));
    }
    var("HOME").map(|home| Path::new(&home).join(".cache/debuginfod_client"))
}

impl Debuginfod {
    /// A client configured from the environment; None when `DEBUGINFOD_URLS` names no
    /// server or there is no cache directory.
    pub fn from_env() -> Option<Debuginfod> {
        let urls = std::env::var("DEBUGINFOD_URLS").ok()?;
        let urls: Vec<String> = urls.split_whitespace().map(str::to_string).collect();
        if urls.is_empty() {
            return None;
        }
        let timeout = std::env::var("DEBUGINFOD_TIMEOUT")
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
            .filter(|&t| t > 0)
            .unwrap_or(DEFAULT_TIMEOUT_S);
        Some(Debuginfod::new(
            urls,
            default_cache_dir()?,
            Duration::from_secs(timeout),
        ))
    }

    pub fn new(urls: Vec<String>, cache: PathBuf, timeout: Duration) -> Debuginfod {
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(timeout)
            .timeout_read(timeout)
            .timeout_write(timeout)
            .user_agent(concat!("glass/", env!("CARGO_PKG_VERSION")))
            .build();
        Debuginfod {
            urls,
            cache,
            agent,
            unreachable: Default::default(),
        }
    }

    pub fn cache_dir(&self) -> &Path {
        &self.cache
    }

    /// Where the cache keeps `kind` of `build_id`.
    pub fn cache_path(&self, build_id: &[u8], kind: Kind) -> PathBuf {
        self.cache.join(hex(build_id)).join(kind.name())
    }

    fn cache_miss_s(&self) -> u64 {
        std::fs::read_to_string(self.cache.join("cache_miss_s"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(DEFAULT_CACHE_MISS_S)
    }

    /// Only the cache: the file if it was fetched before.
    pub fn cached(&self, build_id: &[u8], kind: Kind) -> Option<PathBuf> {
        let path = self.cache_path(build_id, kind);
        let meta = std::fs::metadata(&path).ok()?;
        (meta.is_file() && meta.len() > 0).then_some(path)
    }

    /// The file `kind` of the build `build_id`: from the cache, else from the first server
    /// that has it (then cached). The error says why there is none.
    pub fn fetch(&self, build_id: &[u8], kind: Kind) -> Result<PathBuf, FetchError> {
        if build_id.is_empty() {
            return Err(FetchError::NotFound);
        }
        if let Some(path) = self.cached(build_id, kind) {
            return Ok(path);
        }
        let path = self.cache_path(build_id, kind);
        // An empty file: no server had it, not long ago.
        if let Ok(meta) = std::fs::metadata(&path) {
            let age = meta
                .modified()
                .ok()
                .and_then(|m| SystemTime::now().duration_since(m).ok())
                .unwrap_or_default();
            if age < Duration::from_secs(self.cache_miss_s()) {
                return Err(FetchError::NotFound);
            }
        }
        let hex = hex(build_id);
        let mut errors = Vec::new();
        let mut all_missing = true;
        let mut asked = false;
        for (index, url) in self.urls.iter().enumerate() {
            if self.unreachable.borrow().contains(&index) {
                all_missing = false;
                continue;
            }
            asked = true;
            let url = format!(
                "{}/buildid/{hex}/{}",
                url.trim_end_matches('/'),
                kind.name()
            );
            match self.agent.get(&url).call() {
                Ok(response) => match self.store(response, &path, build_id, kind) {
                    Ok(()) => return Ok(path),
                    Err(e) => {
                        all_missing = false;
                        errors.push(format!("{url}: {e}"));
                    }
                },
                Err(ureq::Error::Status(code, _)) => {
                    // 404: this server does not have it; other codes are its trouble.
                    if code != 404 {
                        all_missing = false;
                    }
                    errors.push(format!("{url}: HTTP {code}"));
                }
                Err(ureq::Error::Transport(e)) => {
                    all_missing = false;
                    self.unreachable.borrow_mut().push(index);
                    // The message names the URL already.
                    errors.push(e.to_string());
                }
            }
        }
        if all_missing {
            // Remembered as elfutils does: an empty file.
            if std::fs::create_dir_all(path.parent().unwrap()).is_ok() {
                let _ = std::fs::File::create(&path);
            }
            return Err(FetchError::NotFound);
        }
        if !asked {
            // Every server failed earlier, and was reported then.
            return Err(FetchError::NotFound);
        }
        Err(FetchError::Failed(errors.join("; ")))
    }

    /// Writes a download to the cache under a temporary name, checks its build id and
    /// renames it into place.
    fn store(
        &self,
        response: ureq::Response,
        path: &Path,
        build_id: &[u8],
        kind: Kind,
    ) -> Result<(), String> {
        let dir = path.parent().unwrap();
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let temporary = dir.join(format!(".{}.{}.tmp", kind.name(), std::process::id()));
        let result = (|| {
            let mut file = std::fs::File::create(&temporary)
                .map_err(|e| format!("{}: {e}", temporary.display()))?;
            std::io::copy(&mut response.into_reader(), &mut file)
                .map_err(|e| format!("download: {e}"))?;
            file.flush().map_err(|e| e.to_string())?;
            drop(file);
            match crate::build_id(&temporary) {
                Some(id) if id == build_id => {}
                Some(id) => return Err(format!("the server sent build {}", self::hex(&id))),
                None => return Err("the server sent no ELF file with a build id".to_string()),
            }
            std::fs::rename(&temporary, path).map_err(|e| format!("{}: {e}", path.display()))
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&temporary);
        }
        result
    }
}
