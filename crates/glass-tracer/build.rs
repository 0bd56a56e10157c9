//! Builds the probe runtime (crates/glass-probe, a cdylib) and leaves it in OUT_DIR, where
//! `include_bytes!` embeds it in the tracer: glass is then one file to install, and
//! `cargo install --path crates/glass` gives a working `glass trace`.
//!
//! Why a nested cargo: stable cargo (1.95 here) cannot depend on another package's cdylib
//! as an artifact (`-Z bindeps` is nightly only). The nested build has its own target
//! directory under OUT_DIR (the outer cargo holds the lock of its own) and the outer
//! build's profile, target and rustflags.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap());
    let crates = manifest_dir.parent().unwrap().to_path_buf();
    let probe = crates.join("glass-probe");
    for watched in [
        probe.join("Cargo.toml"),
        probe.join("src"),
        crates.join("glass-probe-abi/Cargo.toml"),
        crates.join("glass-probe-abi/src"),
    ] {
        println!("cargo:rerun-if-changed={}", watched.display());
    }
    if !probe.join("Cargo.toml").is_file() {
        panic!(
            "glass-tracer embeds the probe runtime built from {}, which is missing: build glass from its repository (cargo install --path crates/glass)",
            probe.display()
        );
    }
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").unwrap());
    // The probe runtime is written for x86-64 and AArch64 (crates/glass-probe).
    if !matches!(
        std::env::var("CARGO_CFG_TARGET_ARCH").as_deref(),
        Ok("x86_64" | "aarch64")
    ) {
        panic!("glass trace's probe runtime is written for x86-64 and AArch64 only");
    }
    let target_dir = out_dir.join("probe-target");
    let target = std::env::var("TARGET").unwrap();
    let release = std::env::var("PROFILE").as_deref() == Ok("release");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());

    let mut build = Command::new(cargo);
    build
        .arg("build")
        .arg("--manifest-path")
        .arg(probe.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir)
        .arg("--target")
        .arg(&target)
        .arg("-p")
        .arg("glass-probe");
    if release {
        build.arg("--release");
    }
    // The outer build's rustflags reach the nested one through CARGO_ENCODED_RUSTFLAGS;
    // these would point it at the outer build's files.
    for var in [
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET_DIR",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
    ] {
        build.env_remove(var);
    }
    let status = build
        .status()
        .unwrap_or_else(|e| panic!("cannot run cargo to build the probe runtime: {e}"));
    if !status.success() {
        panic!("building the probe runtime (glass-probe) failed: {status}");
    }
    let built = target_dir
        .join(&target)
        .join(if release { "release" } else { "debug" })
        .join("libglass_probe.so");
    let embedded = out_dir.join("libglass_probe.so");
    std::fs::copy(&built, &embedded)
        .unwrap_or_else(|e| panic!("cannot copy {}: {e}", built.display()));
}
