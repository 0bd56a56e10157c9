//! debuginfod: a stripped binary (no symbols, no local debug file) is recorded; Debian's
//! `debuginfod` server, started on a loopback port over a directory holding its separate
//! debug file (`objcopy --only-keep-debug`) and the stripped file, names its functions
//! through `DEBUGINFOD_URLS`; with the recorded file deleted, the server sends the
//! executable too; with the server stopped, the cache (`DEBUGINFOD_CACHE_PATH`, elfutils'
//! layout CACHE/HEX/debuginfo) still names them, offline.

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use glass_symbols::debuginfod::{hex, Debuginfod, FetchError, Kind};

/// Installs Debian's debuginfod if missing, as ./x installs packages.
fn ensure_debuginfod() {
    let present = || {
        Command::new("debuginfod")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if present() {
        return;
    }
    apt_install("debuginfod");
    assert!(present(), "debuginfod installed");
}

/// The server, stopped (and reaped) when dropped.
struct Server {
    child: Child,
    url: String,
}

impl Server {
    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Starts debuginfod over `served` on a free loopback port and waits until it serves
/// `build_id`'s debug file.
fn start_server(dir: &Path, served: &Path, build_id: &[u8]) -> Server {
    for attempt in 0..5 {
        // A port free now; another process taking it before the server does makes the
        // server exit, and the next attempt takes another.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = std::fs::File::create(dir.join(format!("server{attempt}.log"))).unwrap();
        let child = Command::new("debuginfod")
            .args(["-F", "-p", &port.to_string(), "-d"])
            .arg(dir.join(format!("index{attempt}.sqlite")))
            .arg(served)
            // No upstream servers: a miss is a miss, not a query to the internet.
            .env_remove("DEBUGINFOD_URLS")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("debuginfod runs");
        let mut server = Server {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        // Ask through the client itself (its own cache, misses not remembered) until the
        // server has indexed the directory.
        let probe_cache = dir.join(format!("probe{attempt}"));
        std::fs::create_dir_all(&probe_cache).unwrap();
        std::fs::write(probe_cache.join("cache_miss_s"), "0").unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if server.child.try_wait().unwrap().is_some() {
                break; // the port was taken: try another
            }
            // A fresh client per try: one that failed to connect does not ask again.
            let client = Debuginfod::new(
                vec![server.url.clone()],
                probe_cache.clone(),
                Duration::from_secs(5),
            );
            if client.fetch(build_id, Kind::Debuginfo).is_ok() {
                return server;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        server.stop();
    }
    panic!("debuginfod did not serve {}", hex(build_id));
}

/// `glass report` with the given debuginfod environment: (stdout, stderr).
fn report_served(recording: &Path, cache: &Path, urls: Option<&str>) -> (String, String) {
    let started = Instant::now();
    let output = report_output(recording, &["--limit", "20"], |command| {
        command
            .env("DEBUGINFOD_CACHE_PATH", cache)
            .env("DEBUGINFOD_TIMEOUT", "10");
        match urls {
            Some(urls) => command.env("DEBUGINFOD_URLS", urls),
            None => command.env_remove("DEBUGINFOD_URLS"),
        };
    });
    // Nothing waits for a timeout: a stopped server refuses at once.
    assert!(started.elapsed() < Duration::from_secs(30));
    (stdout(&output), stderr(&output))
}

/// The self share of `function` in a top table.
fn share(top: &str, function: &str) -> Option<f64> {
    top.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields.len() >= 6 && fields[4] == function)
            .then(|| fields[0].trim_end_matches('%').parse().ok())
            .flatten()
    })
}

fn assert_named(top: &str, what: &str) {
    let alpha = share(top, "alpha").unwrap_or_else(|| panic!("{what}: alpha not named:\n{top}"));
    let beta = share(top, "beta").unwrap_or_else(|| panic!("{what}: beta not named:\n{top}"));
    assert!(share(top, "gamma_").is_some(), "{what}: gamma_:\n{top}");
    // 60/30/10 by construction.
    assert!(
        alpha > 45.0 && beta > 20.0 && alpha > beta,
        "{what}:\n{top}"
    );
}

#[test]
fn stripped_binary_symbolized_through_debuginfod_then_offline_from_the_cache() {
    ensure_debuginfod();
    let dir = scratch("debuginfod");
    let full = compile(&dir, "split.c", "split-full", &[]);
    let served = dir.join("served");
    std::fs::create_dir_all(&served).unwrap();
    let run = |program: &str, args: &[&std::ffi::OsStr]| {
        let status = Command::new(program).args(args).status().unwrap();
        assert!(status.success(), "{program} {args:?}");
    };
    let debug: PathBuf = served.join("split.debug");
    run(
        "objcopy",
        &[
            "--only-keep-debug".as_ref(),
            full.as_os_str(),
            debug.as_os_str(),
        ],
    );
    // The program recorded: stripped of everything (no .symtab, no debuglink).
    let program = dir.join("split");
    run(
        "strip",
        &[
            "--strip-all".as_ref(),
            "-o".as_ref(),
            program.as_os_str(),
            full.as_os_str(),
        ],
    );
    std::fs::copy(&program, served.join("split")).unwrap();
    std::fs::remove_file(&full).unwrap();
    let build_id = glass_symbols::build_id(&program).expect("gcc writes a build id");

    let recording = dir.join("split.glass");
    record(&recording, 499, &[program.to_str().unwrap(), "2000"]);

    // Without debuginfod: its FDEs' names only (this machine has no debug file for it).
    let cache = dir.join("cache");
    let (top, _) = report_served(&recording, &cache, None);
    assert!(
        share(&top, "alpha").is_none(),
        "named without debug info:\n{top}"
    );
    assert!(top.contains("sub_"), "{top}");

    let mut server = start_server(&dir, &served, &build_id);
    let (top, _) = report_served(&recording, &cache, Some(&server.url));
    assert_named(&top, "through the server");
    let cached = cache.join(hex(&build_id)).join("debuginfo");
    assert_eq!(
        glass_symbols::build_id(&cached).as_deref(),
        Some(&build_id[..]),
        "the debug file is cached at {}",
        cached.display()
    );

    // The recorded file gone: the server sends the executable as well.
    std::fs::remove_file(&program).unwrap();
    let (top, _) = report_served(&recording, &cache, Some(&server.url));
    assert_named(&top, "file gone, executable from the server");
    assert!(cache.join(hex(&build_id)).join("executable").is_file());

    // A build the server does not have: remembered as a miss (an empty file, as
    // elfutils does), not asked again while the miss is recent.
    let client = Debuginfod::new(
        vec![server.url.clone()],
        cache.clone(),
        Duration::from_secs(5),
    );
    let unknown = [0x5a; 20];
    assert_eq!(
        client.fetch(&unknown, Kind::Debuginfo),
        Err(FetchError::NotFound)
    );
    let miss = cache.join(hex(&unknown)).join("debuginfo");
    assert_eq!(std::fs::metadata(&miss).map(|m| m.len()).ok(), Some(0));

    // The server stopped: the cache alone, offline.
    server.stop();
    let client = Debuginfod::new(
        vec![server.url.clone()],
        cache.clone(),
        Duration::from_secs(5),
    );
    assert_eq!(
        client.fetch(&unknown, Kind::Debuginfo),
        Err(FetchError::NotFound)
    );
    assert_eq!(client.fetch(&build_id, Kind::Debuginfo), Ok(cached.clone()));
    assert!(matches!(
        client.fetch(&[0x6b; 20], Kind::Debuginfo),
        Err(FetchError::Failed(_))
    ));
    let (top, _) = report_served(&recording, &cache, Some(&server.url));
    assert_named(&top, "offline, from the cache");
    // ... and the cache is what names them: a fresh one has nothing to offer.
    let (top, warnings) = report_served(&recording, &dir.join("empty-cache"), Some(&server.url));
    assert!(share(&top, "alpha").is_none(), "{top}");
    assert!(warnings.contains("debuginfod"), "{warnings}");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
