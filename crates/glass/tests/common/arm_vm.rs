//! Programs run inside an AArch64 Linux guest under QEMU TCG (guests/linux/run-script.sh
//! on the Linux kit): the aarch64 build of glass, fixtures cross-compiled with Debian's
//! aarch64-linux-gnu-gcc/g++, and a shell script that runs them and leaves what the host
//! checks in `$OUT`, brought back to the host in a directory.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::*;

/// Rust's name for the aarch64 build of glass (target/aarch64-unknown-linux-gnu).
pub const AARCH64_TRIPLE: &str = "aarch64-unknown-linux-gnu";

/// The aarch64 release build of glass, which `./x test` builds first
/// (`build_aarch64_glass`, cross-linked with Debian's gcc-aarch64-linux-gnu; release
/// because it runs under TCG, where an unoptimized unwinder would take most of the
/// guest's time itself), or why it cannot be used: missing, or more than 10 minutes
/// older than this test's own glass (the sources changed since).
pub fn aarch64_glass_built() -> Result<PathBuf, String> {
    let arm = repo()
        .join("target")
        .join(AARCH64_TRIPLE)
        .join("release/glass");
    let modified = |path: &Path| std::fs::metadata(path).and_then(|m| m.modified()).ok();
    match (modified(&arm), modified(Path::new(GLASS))) {
        (Some(arm_time), Some(host_time))
            if arm_time + std::time::Duration::from_secs(600) >= host_time =>
        {
            Ok(arm)
        }
        _ => Err(format!(
            "{} is missing or older than this test's glass: ./x test builds it (build_aarch64_glass), or \
             CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc cargo build --release -p glass --target {AARCH64_TRIPLE}",
            arm.display()
        )),
    }
}

/// [`aarch64_glass_built`], or a panic saying how to build it.
pub fn aarch64_glass() -> PathBuf {
    aarch64_glass_built().unwrap_or_else(|why| panic!("{why}"))
}

/// Compiles `tests/fixtures/<source>` for aarch64 Linux (glibc, dynamically linked) into
/// `dir/<output>` with frame pointers and debug information, by Debian's cross compilers:
/// aarch64-linux-gnu-g++ for `.cc`/`.cpp`, aarch64-linux-gnu-gcc otherwise (installed
/// here if missing, as `./x test` installs them). `extra`: more options, e.g.
/// `-mbranch-protection=standard`.
pub fn compile_aarch64(dir: &Path, source: &str, output: &str, extra: &[&str]) -> PathBuf {
    let cxx = source.ends_with(".cc") || source.ends_with(".cpp");
    let (compiler, package) = if cxx {
        ("aarch64-linux-gnu-g++", "g++-aarch64-linux-gnu")
    } else {
        ("aarch64-linux-gnu-gcc", "gcc-aarch64-linux-gnu")
    };
    let found = |command: &str| {
        Command::new(command)
            .arg("--version")
            .stdout(std::process::Stdio::null())
            .status()
            .is_ok()
    };
    if !found(compiler) {
        apt_install(package);
    }
    if !Path::new("/usr/aarch64-linux-gnu/include/stdio.h").exists() {
        apt_install("libc6-dev-arm64-cross");
    }
    let out = dir.join(output);
    let result = Command::new(compiler)
        .args(["-O2", "-g", "-fno-omit-frame-pointer"])
        .arg(fixtures_dir().join(source))
        .arg("-o")
        .arg(&out)
        .args(extra)
        .output()
        .unwrap_or_else(|e| panic!("{compiler} runs: {e}"));
    assert!(
        result.status.success(),
        "{compiler} failed for {source}: {}",
        stderr(&result)
    );
    out
}

/// What a guest's run left: `/out` brought back, the console and the script's status.
pub struct VmRun {
    /// The guest's `/out`, with `serial.log` and `status` beside its files.
    pub out_dir: PathBuf,
    /// The console: the kernel's messages, init's, and the script's stdout and stderr.
    pub serial: String,
    /// The script's exit status (`sh /work/run.sh`).
    pub status: i32,
}

impl VmRun {
    /// `out_dir/name`, a file the script wrote in `$OUT/name`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.out_dir.join(name)
    }

    /// The text of `$OUT/name`, or a panic with the console.
    pub fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(name))
            .unwrap_or_else(|e| panic!("$OUT/{name} of the guest: {e}; console:\n{}", self.serial))
    }

    /// Panics with the console unless the script exited with 0.
    pub fn assert_success(&self) {
        assert_eq!(
            self.status, 0,
            "the guest's script exited with {}; console:\n{}",
            self.status, self.serial
        );
    }
}

/// Runs `script` (shell, run by busybox sh in /work with `OUT=/out`) in a Linux guest of
/// the kit (`arch`: aarch64 or x86_64) with `files` copied into /work (base names kept)
/// and more `options` of run-script.sh (`--cpu max`, `--smp 1`, `--timeout 600` ...);
/// its /out comes back in a fresh `scratch(name)`. Panics if the guest did not finish
/// (timeout, crash) or wrote nothing; the script's own status is [`VmRun::status`].
pub fn run_in_linux_vm(
    arch: &str,
    name: &str,
    script: &str,
    files: &[&Path],
    options: &[&str],
) -> VmRun {
    let kit = linux_kit();
    let out_dir = scratch(name);
    let script_path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}.run.sh"));
    std::fs::write(&script_path, script).unwrap();
    let started = std::time::Instant::now();
    let result = Command::new(repo().join("guests/linux/run-script.sh"))
        .args(["--arch", arch])
        .args(options)
        .arg(kit)
        .arg(&out_dir)
        .arg(&script_path)
        .args(files)
        .output()
        .expect("guests/linux/run-script.sh runs");
    let serial = std::fs::read_to_string(out_dir.join("serial.log")).unwrap_or_default();
    eprintln!(
        "{name}: {arch} guest ({options:?}) ran its script in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(
        result.status.success(),
        "guests/linux/run-script.sh failed ({}): {}; console:\n{serial}",
        result.status,
        stderr(&result).trim_end()
    );
    let status = std::fs::read_to_string(out_dir.join("status"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .expect("run-script.sh writes the script's status");
    VmRun {
        out_dir,
        serial,
        status,
    }
}

/// [`run_in_linux_vm`] on aarch64 with `-cpu cpu` (`cortex-a57`, or `max`: pointer
/// authentication and BTI, run as `max,pauth-impdef=on`), 2 vCPUs and 512 MiB.
pub fn run_in_aarch64_vm(name: &str, script: &str, files: &[&Path], cpu: &str) -> VmRun {
    run_in_linux_vm("aarch64", name, script, files, &["--cpu", cpu])
}
