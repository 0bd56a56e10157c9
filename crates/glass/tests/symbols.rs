//! Offline symbolization of real recordings: stripped binaries fall back to .dynsym, their
//! FDEs (`sub_<address>`) or `module+0xoffset`, a rebuilt binary is detected by its build id, inline frames are
//! named.

mod common;
use common::*;

use std::process::Command;

fn strip(path: &std::path::Path) {
    assert!(Command::new("strip").arg(path).status().unwrap().success());
}

#[test]
fn a_stripped_library_still_has_dynsym_names_and_a_stripped_program_has_offsets() {
    let _alone = exclusive();
    let dir = scratch("stripped");
    let library = compile_library(&dir, "plugin.c", "libplugin.so", &[]);
    strip(&library);
    let program = compile(&dir, "dlopen.c", "dlopen", &["-ldl"]);
    strip(&program);
    let recording = dir.join("stripped.glass");
    record(
        &recording,
        499,
        &[
            program.to_str().unwrap(),
            library.to_str().unwrap(),
            "20000",
        ],
    );
    let stacks = folded(&recording, &[]);
    // Exported from the library: .dynsym names it.
    assert!(samples_in(&stacks, "plugin_transform") > 50, "{stacks:?}");
    // The program's own functions have no symbols left: their FDEs' names
    // (sub_<address>), never a wrong name.
    assert_eq!(samples_in(&stacks, "local_transform"), 0);
    let offsets: u64 = stacks
        .iter()
        .filter(|(frames, _)| frames.iter().any(|f| f.starts_with("sub_")))
        .map(|(_, n)| n)
        .sum();
    assert!(offsets > 50, "{stacks:?}");
}

#[test]
fn a_rebuilt_binary_shows_offsets_not_wrong_names() {
    let _alone = exclusive();
    let dir = scratch("rebuilt");
    let split = compile(&dir, "split.c", "split", &[]);
    let recording = dir.join("split.glass");
    record(&recording, 499, &[split.to_str().unwrap(), "2000"]);
    assert!(samples_in(&folded(&recording, &[]), "alpha") > 0);
    // Same path, different code: a different build id.
    compile(&dir, "split.c", "split", &["-DGLASS_REBUILT", "-O1"]);
    let report = glass(&["report", recording.to_str().unwrap(), "--format", "folded"]);
    assert!(report.status.success());
    assert!(
        stderr(&report).contains("build id differs"),
        "{}",
        stderr(&report)
    );
    assert!(!stdout(&report).contains("alpha"), "{}", stdout(&report));
    assert!(stdout(&report).contains("split+0x"), "{}", stdout(&report));
}

#[test]
fn inlined_functions_appear_under_their_caller() {
    let _alone = exclusive();
    let dir = scratch("inline");
    let split = compile(&dir, "split.c", "split", &[]);
    let recording = dir.join("split.glass");
    record(&recording, 499, &[split.to_str().unwrap(), "2000"]);
    let stacks = folded(&recording, &[]);
    // spin_units is always_inline: DWARF names it inside each caller.
    let inlined: u64 = stacks
        .iter()
        .filter(|(frames, _)| {
            frames
                .windows(2)
                .any(|w| w[0] == "alpha" && w[1] == "spin_units")
        })
        .map(|(_, n)| n)
        .sum();
    assert!(inlined as f64 >= 0.9 * samples_in(&stacks, "alpha") as f64);
}
