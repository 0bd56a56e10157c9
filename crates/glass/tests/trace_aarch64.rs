//! glass on AArch64 Linux: the aarch64 build of glass and fixtures cross-compiled with
//! aarch64-linux-gnu-gcc run inside Debian 12's arm64 kernel under qemu-system-aarch64
//! TCG (guests/linux/run-script.sh, through `common::run_in_aarch64_vm`), and what they
//! write comes back to be checked here.

mod common;

use std::sync::OnceLock;

use common::*;

// ---------------------------------------------------------------------------------------
// The harness itself: one boot (-cpu max, for pointer authentication) runs the aarch64
// glass, records a cross-compiled fixture, and runs a PAC-protected build of it and a C++
// fixture (libstdc++ and unwinding through exceptions in the guest).

/// split.c's rounds: ~3300 a second under TCG on the project's host (measured), so ~2.5 s
/// of recording.
const SPLIT_ROUNDS: &str = "8000";

struct HarnessRun {
    run: VmRun,
    /// The PAC-protected build of split.c, on the host.
    pac_binary: std::path::PathBuf,
}

fn harness_run() -> &'static HarnessRun {
    static RUN: OnceLock<HarnessRun> = OnceLock::new();
    RUN.get_or_init(|| {
        let glass = aarch64_glass();
        let dir = scratch("trace-aarch64-harness-bin");
        let split = compile_aarch64(&dir, "split.c", "split", &[]);
        let pac = compile_aarch64(
            &dir,
            "split.c",
            "split-pac",
            &["-mbranch-protection=standard"],
        );
        let throw = compile_aarch64(&dir, "trace/throw.cpp", "throw", &[]);
        let script = format!(
            "./glass --version >$OUT/version.txt 2>&1
echo \"version: $?\"
grep -m1 -o -w paca /proc/cpuinfo >$OUT/cpu-paca.txt
./split-pac 200 >$OUT/pac.log 2>&1
echo \"split-pac: $?\" | tee $OUT/pac.status
./throw >$OUT/throw.log 2>&1
echo \"throw: $?\" | tee $OUT/throw.status
./glass record -o $OUT/x.glass -- ./split {SPLIT_ROUNDS} >$OUT/record.log 2>&1
echo \"record: $?\" | tee $OUT/record.status
./glass report $OUT/x.glass --format folded >$OUT/x.folded 2>$OUT/report.log
"
        );
        let run = run_in_aarch64_vm(
            "trace-aarch64-harness",
            &script,
            &[&glass, &split, &pac, &throw],
            "max",
        );
        eprintln!("console:\n{}", run.serial);
        run.assert_success();
        HarnessRun {
            run,
            pac_binary: pac,
        }
    })
}

#[test]
fn the_aarch64_glass_records_a_cross_compiled_fixture_in_the_vm() {
    let HarnessRun { run, .. } = harness_run();
    let version = run.read("version.txt");
    assert!(version.starts_with("glass "), "glass --version: {version}");
    assert_eq!(
        run.read("record.status").trim(),
        "record: 0",
        "glass record in the guest: {}",
        run.read("record.log")
    );
    let log = run.read("record.log");
    assert!(log.contains("done rounds=8000"), "{log}");
    // Read on the host: a whole recording with samples of the fixture's thread.
    let recording = glass_format::read_file(&run.path("x.glass")).expect("a readable recording");
    assert!(recording.damage.is_none(), "{:?}", recording.damage);
    let samples = recording.samples.len();
    eprintln!("x.glass: {samples} samples; {}", log.trim_end());
    assert!(samples >= 50, "only {samples} samples in x.glass: {log}");
    // Symbolized in the guest (the binary is there): the fixture's own functions.
    let folded = run.read("x.folded");
    let alpha: u64 = folded
        .lines()
        .filter(|line| line.contains("dispatch;alpha"))
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<u64>().ok())
        .sum();
    assert!(
        alpha * 4 >= samples as u64,
        "{alpha} of {samples} samples in dispatch;alpha (60% of the work):\n{folded}"
    );
}

#[test]
fn a_pac_protected_fixture_runs_under_cpu_max() {
    let HarnessRun { run, pac_binary } = harness_run();
    // The build really signs return addresses.
    let disassembly = std::process::Command::new("aarch64-linux-gnu-objdump")
        .arg("-d")
        .arg(pac_binary)
        .output()
        .expect("aarch64-linux-gnu-objdump runs (binutils-aarch64-linux-gnu)");
    let text = stdout(&disassembly);
    assert!(
        text.contains("paciasp") && text.contains("autiasp"),
        "{} has no paciasp/autiasp",
        pac_binary.display()
    );
    assert_eq!(run.read("cpu-paca.txt").trim(), "paca", "-cpu max has PAC");
    assert_eq!(run.read("pac.status").trim(), "split-pac: 0");
    let log = run.read("pac.log");
    assert!(log.contains("done rounds=200"), "{log}");
}

#[test]
fn a_cross_compiled_cpp_fixture_throws_and_catches_in_the_vm() {
    let HarnessRun { run, .. } = harness_run();
    // throw.cpp exits with 3 on purpose; its counts are the same on every architecture.
    assert_eq!(run.read("throw.status").trim(), "throw: 3");
    assert_eq!(
        run.read("throw.log").trim(),
        "caught=1000 destroyed=2000 rethrown=500 sum=1000"
    );
}
// ---------------------------------------------------------------------------------------
