//! Damaged unwind information never crashes the recorder or the report: a binary whose
//! `.eh_frame` is garbage, and a binary deleted while it runs.

mod common;
use common::*;

use object::{Object, ObjectSection};

#[test]
fn a_corrupt_eh_frame_gives_truncated_stacks_not_a_crash() {
    let _alone = exclusive();
    let dir = scratch("corrupt_eh_frame");
    let program = compile(&dir, "split.c", "split", &["-fomit-frame-pointer"]);
    let mut bytes = std::fs::read(&program).unwrap();
    let range = {
        let elf = object::File::parse(&*bytes).unwrap();
        let (offset, size) = elf
            .section_by_name(".eh_frame")
            .unwrap()
            .file_range()
            .unwrap();
        offset as usize..(offset + size) as usize
    };
    let mut x: u64 = 7;
    for byte in &mut bytes[range] {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        *byte = (x >> 56) as u8;
    }
    let corrupt = dir.join("split_corrupt");
    std::fs::write(&corrupt, &bytes).unwrap();
    std::fs::set_permissions(
        &corrupt,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    for capture in ["frames", "raw"] {
        let recording = dir.join(format!("corrupt-{capture}.glass"));
        let output = record_with(
            &recording,
            499,
            &["--unwind", "dwarf", "--capture", capture],
            &[corrupt.to_str().unwrap(), "2000"],
        );
        assert!(!stderr(&output).contains("panicked"));
        let report = glass(&["report", recording.to_str().unwrap(), "--format", "folded"]);
        assert!(report.status.success(), "{}", stderr(&report));
        // The sampled instruction is still named from the symbol table.
        let stacks = folded(&recording, &[]);
        assert!(samples_in(&stacks, "spin_units") > 100, "{stacks:?}");
    }
}

#[test]
fn a_binary_deleted_while_recorded_shows_offsets_with_its_name() {
    let _alone = exclusive();
    let dir = scratch("deleted_binary");
    let program = compile(&dir, "split.c", "doomed", &["-fomit-frame-pointer"]);
    let recording = dir.join("deleted.glass");
    let recorder = std::process::Command::new(GLASS)
        .args([
            "record",
            "-F",
            "499",
            "-o",
            recording.to_str().unwrap(),
            "--",
            program.to_str().unwrap(),
            "4000",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    std::fs::remove_file(&program).unwrap();
    let output = recorder.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report = glass(&["report", recording.to_str().unwrap(), "--format", "folded"]);
    assert!(report.status.success(), "{}", stderr(&report));
    assert!(stderr(&report).contains("doomed"), "{}", stderr(&report));
    assert!(stdout(&report).contains("doomed+0x"), "{}", stdout(&report));
}
