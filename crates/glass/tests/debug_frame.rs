//! Code whose CFI is only in `.debug_frame`: a program built as kernels and unikernels
//! build their C code (`-fno-asynchronous-unwind-tables -fomit-frame-pointer`), whose
//! start files still bring a small `.eh_frame` and `.eh_frame_hdr`. Its stacks must be
//! whole under both backends and with raw capture, and `glass info` must say which CFI
//! sources each module has.

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::Command;

use object::{Object, ObjectSymbol};

const FUNCTIONS: [&str; 5] = ["main", "drive", "route", "heavy", "light"];

fn compile_fixture(dir: &Path) -> PathBuf {
    let out = dir.join("debug_frame");
    let status = Command::new("gcc")
        .args([
            "-O2",
            "-g",
            "-fno-asynchronous-unwind-tables",
            "-fomit-frame-pointer",
        ])
        .arg(format!("-I{}", fixtures_dir().display()))
        .arg(fixtures_dir().join("debug_frame.c"))
        .arg("-o")
        .arg(&out)
        .status()
        .expect("gcc runs");
    assert!(status.success(), "gcc failed for debug_frame.c");
    out
}

/// Address ranges (start, end) of FDEs.
type Ranges = Vec<(u64, u64)>;

/// The address ranges of the FDEs of `.eh_frame` and of `.debug_frame`, as readelf
/// decodes them.
fn fde_ranges(binary: &Path) -> (Ranges, Ranges) {
    let output = Command::new("readelf")
        .arg("--debug-dump=frames")
        .arg(binary)
        .output()
        .expect("readelf runs");
    let text = String::from_utf8_lossy(&output.stdout);
    let (mut eh, mut debug) = (Vec::new(), Vec::new());
    let mut in_debug = false;
    for line in text.lines() {
        if line.starts_with("Contents of the .eh_frame section") {
            in_debug = false;
        } else if line.starts_with("Contents of the .debug_frame section") {
            in_debug = true;
        } else if let Some(pc) = line.split("pc=").nth(1) {
            let (start, end) = pc.trim().split_once("..").unwrap();
            let hex = |s: &str| u64::from_str_radix(s, 16).unwrap();
            let range = (hex(start), hex(end));
            if in_debug {
                debug.push(range);
            } else {
                eh.push(range);
            }
        }
    }
    (eh, debug)
}

/// The fixture's own functions have no CFI in `.eh_frame` and all of it in
/// `.debug_frame`, while the binary has both sections (so the test cannot pass because
/// of a build that put everything in `.eh_frame`).
fn assert_split_cfi(binary: &Path) {
    let bytes = std::fs::read(binary).unwrap();
    let elf = object::File::parse(&*bytes).unwrap();
    let (eh, debug) = fde_ranges(binary);
    assert!(
        !eh.is_empty(),
        "no .eh_frame FDEs: the test needs both sources"
    );
    for name in FUNCTIONS {
        let address = elf
            .symbols()
            .find(|s| s.name() == Ok(name))
            .unwrap_or_else(|| panic!("no symbol {name}"))
            .address();
        let covers =
            |ranges: &[(u64, u64)]| ranges.iter().any(|&(s, e)| address >= s && address < e);
        assert!(!covers(&eh), "{name} has CFI in .eh_frame");
        assert!(covers(&debug), "{name} has no CFI in .debug_frame");
    }
}

/// Of the samples in the fixture's work (heavy, light and what is inlined into them or
/// called by them), 95% have the whole chain main;drive;route;heavy|light and no unknown
/// frame; heavy has its share of the work.
fn check_stacks(stacks: &[(Vec<String>, u64)], what: &str) {
    let working: Vec<&(Vec<String>, u64)> = stacks
        .iter()
        .filter(|(frames, _)| {
            frames.last().is_some_and(|leaf| {
                ["heavy", "light", "spin_units", "work_checkpoint"].contains(&leaf.as_str())
            })
        })
        .collect();
    let total: u64 = working.iter().map(|(_, n)| n).sum();
    assert!(total >= 1000, "{what}: {total} samples in the workload");
    let whole: u64 = working
        .iter()
        .filter(|(frames, _)| {
            let full = ["main", "drive", "route", "heavy"];
            let light = ["main", "drive", "route", "light"];
            (frames.windows(4).any(|w| w == full) || frames.windows(4).any(|w| w == light))
                && !frames.iter().any(|f| f.contains("unknown"))
        })
        .map(|(_, n)| n)
        .sum();
    assert!(
        whole as f64 >= 0.95 * total as f64,
        "{what}: {whole} of {total} stacks whole; {:?}",
        working
            .iter()
            .filter(|(f, _)| !f.windows(3).any(|w| w == ["main", "drive", "route"]))
            .take(5)
            .collect::<Vec<_>>()
    );
    let heavy = samples_in(stacks, "heavy") as f64;
    let light = samples_in(stacks, "light") as f64;
    let share = heavy * 100.0 / (heavy + light).max(1.0);
    // ±5: a shared VM's steal time moves a 2 s run by more than the ±3 of
    // record_accuracy (which checks the sampling itself).
    assert!((share - 75.0).abs() <= 5.0, "{what}: heavy {share:.1}%");
}

#[test]
fn debug_frame_only_code_gives_whole_stacks_under_both_backends_and_raw_capture() {
    let _alone = exclusive();
    let dir = scratch("debug_frame");
    let binary = compile_fixture(&dir);
    assert_split_cfi(&binary);
    let program = binary.to_str().unwrap();
    for (name, options) in [
        ("perf", &["--backend", "perf"][..]),
        ("ptrace", &["--backend", "ptrace"][..]),
        ("perf-raw", &["--backend", "perf", "--capture", "raw"][..]),
        (
            "ptrace-raw",
            &["--backend", "ptrace", "--capture", "raw"][..],
        ),
    ] {
        let recording = dir.join(format!("{name}.glass"));
        record_with(&recording, 999, options, &[program, "20000"]);
        check_stacks(&folded(&recording, &[]), name);
    }
}

#[test]
fn glass_info_lists_the_cfi_sources_of_each_module() {
    let _alone = exclusive();
    let dir = scratch("debug_frame_info");
    let binary = compile_fixture(&dir);
    let recording = dir.join("info.glass");
    record_with(&recording, 99, &[], &[binary.to_str().unwrap(), "2000"]);
    let output = glass(&["info", recording.to_str().unwrap()]);
    assert!(output.status.success(), "{}", stderr(&output));
    let info = stdout(&output);
    let line_of = |needle: &str| -> &str {
        info.lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no line with {needle} in:\n{info}"))
    };
    // The program: the start files' few FDEs in .eh_frame, its five functions and a
    // helper in .debug_frame.
    let program = line_of(&format!("{}: ", binary.display()));
    assert!(program.starts_with("cfi:"), "{info}");
    let (eh, debug) = fde_ranges(&binary);
    assert!(
        program.ends_with(&format!(
            ": .eh_frame ({} FDEs), .debug_frame ({} FDEs)",
            eh.len(),
            debug.len()
        )),
        "{program}"
    );
    // libc: .eh_frame only.
    let libc = line_of("libc.so");
    assert!(libc.contains(": .eh_frame ("), "{libc}");
    assert!(!libc.contains(".debug_frame"), "{libc}");

    // A module whose file is gone.
    std::fs::remove_file(&binary).unwrap();
    let output = glass(&["info", recording.to_str().unwrap()]);
    let info = stdout(&output);
    assert!(
        info.contains(&format!("{}: file missing", binary.display())),
        "{info}"
    );
}
