//! glass is one file to install: the probe runtime `glass trace` loads into a program is
//! embedded in the binary (crates/glass-tracer/build.rs) and handed over from a sealed
//! memfd. A copy of glass alone in an empty directory traces a launched program and a
//! running one (of another user), and `cargo install --path crates/glass` from a copy of
//! the sources with nothing built gives a glass that traces.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// Traces nf (launched) with `glass`, run from its own directory, and checks the calls.
fn trace_launched(glass: &Path, nf: &Path, dir: &Path) {
    let recording = dir.join("nf.glass");
    let output = Command::new(glass)
        .current_dir(glass.parent().unwrap())
        .args(["trace", "-f", "process_batch,classify", "-o"])
        .arg(&recording)
        .arg("--")
        .arg(nf)
        .arg("40")
        .stdout(Stdio::null())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let calls = reported_calls(&recording);
    assert_eq!(calls.get("process_batch"), Some(&40), "{calls:?}");
    assert!(calls.get("classify").copied().unwrap_or(0) > 0, "{calls:?}");
}

#[test]
fn a_copied_glass_alone_traces() {
    let dir = scratch("install_copied");
    let alone = dir.join("alone");
    std::fs::create_dir(&alone).unwrap();
    let glass = alone.join("glass");
    std::fs::copy(GLASS, &glass).unwrap();
    assert_eq!(std::fs::read_dir(&alone).unwrap().count(), 1);
    let nf = compile(&dir, "trace/nf.c", "nf", &[]);
    trace_launched(&glass, &nf, &dir);

    // A running program of another user (nobody), attached by root's copied glass: the
    // runtime travels in a memfd of the target's own, which it loads as /proc/self/fd/N.
    let nfd = compile(&dir, "trace/nfd.c", "nfd", &["-pthread"]);
    open_to_nobody(&dir);
    let mut target = Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
        .arg(&nfd)
        .args(["2", "0", "500"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = target.id() as i32;
    std::thread::sleep(Duration::from_millis(300));
    assert_runs_as_nobody(pid);
    let recording = dir.join("nfd.glass");
    let output = Command::new(&glass)
        .current_dir(&alone)
        .args([
            "trace",
            "--pid",
            &pid.to_string(),
            "-f",
            "process_batch,classify",
        ])
        .args(["-d", "1", "-o"])
        .arg(&recording)
        .output()
        .unwrap();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let fds: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .map(|p| p.display().to_string())
        .collect();
    let _ = target.kill();
    let _ = target.wait();
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        maps.contains("/memfd:libglass_probe-"),
        "the runtime is not mapped from a memfd:\n{maps}"
    );
    assert!(
        !fds.iter().any(|f| f.contains("memfd:")),
        "the memfd was left open in the target: {fds:?}"
    );
    let calls = reported_calls(&recording);
    assert!(
        calls.get("process_batch").copied().unwrap_or(0) > 0,
        "{calls:?}"
    );
    // The copy of glass (150 MB unoptimized) and all: disk a CI machine lacked.
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Copies `from` into `to`, leaving out build output.
fn copy_sources(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let name = entry.file_name();
        if name == "target" {
            continue;
        }
        let path = entry.path();
        if entry.file_type().unwrap().is_dir() {
            copy_sources(&path, &to.join(&name));
        } else {
            std::fs::copy(&path, to.join(&name)).unwrap();
        }
    }
}

/// The workspace's own debug build, target/debug, gives the install's build directory
/// the registry crates it needs (compiled libraries, build-script output, fingerprints):
/// cargo takes each one whose fingerprint matches and builds the rest, every crate of
/// the copied sources among them (their paths differ, so none of the workspace's
/// artifacts is ever taken for theirs). A fresh clone's install built every dependency
/// from nothing (404-515 s on 2 cores under load); seeded, 40 s, 94 crates built.
fn seed_build_directory(target_dir: &Path) {
    let built = Path::new(env!("CARGO_TARGET_TMPDIR")).join("../debug");
    if target_dir.exists() || !built.join("deps").is_dir() {
        return;
    }
    let debug = target_dir.join("debug");
    std::fs::create_dir_all(debug.join("deps")).unwrap();
    for dir in ["build", ".fingerprint"] {
        let status = Command::new("cp")
            .arg("-r")
            .arg(built.join(dir))
            .arg(&debug)
            .status()
            .unwrap();
        assert!(status.success(), "cp -r {}", built.join(dir).display());
    }
    for entry in std::fs::read_dir(built.join("deps")).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let library = name.starts_with("lib")
            && (name.ends_with(".rlib") || name.ends_with(".rmeta") || name.ends_with(".so"));
        if library {
            std::fs::copy(entry.path(), debug.join("deps").join(&name)).unwrap();
        }
    }
}

/// The sources are copied afresh each run (no probe runtime built anywhere in them) and
/// installed with `cargo install --debug`, which builds glass and, through
/// glass-tracer's build script, the probe runtime it embeds. The build directory,
/// target/tmp/install-target, is seeded from the workspace's build and removed when the
/// install worked: it held 1.8 GB, which a CI machine's disk did not have to spare.
#[test]
fn cargo_install_gives_a_working_glass() {
    let dir = scratch("install_cargo");
    let workspace = repo();
    let sources = dir.join("src");
    std::fs::create_dir_all(&sources).unwrap();
    for file in ["Cargo.toml", "Cargo.lock"] {
        std::fs::copy(workspace.join(file), sources.join(file)).unwrap();
    }
    copy_sources(&workspace.join("crates"), &sources.join("crates"));
    let root = dir.join("root");
    let target_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("install-target");
    seed_build_directory(&target_dir);
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let started = Instant::now();
    let output = Command::new(cargo)
        .args(["install", "--debug", "--locked", "--offline", "--path"])
        .arg(sources.join("crates/glass"))
        .arg("--root")
        .arg(&root)
        .arg("--target-dir")
        .arg(&target_dir)
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET_DIR")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    eprintln!(
        "cargo install --debug took {:.0} s",
        started.elapsed().as_secs_f64()
    );
    let installed: Vec<PathBuf> = std::fs::read_dir(root.join("bin"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(installed, [root.join("bin/glass")]);
    let _ = std::fs::remove_dir_all(&target_dir);
    let nf = compile(&dir, "trace/nf.c", "nf", &[]);
    trace_launched(&root.join("bin/glass"), &nf, &dir);
    std::fs::remove_dir_all(&dir).unwrap();
}
