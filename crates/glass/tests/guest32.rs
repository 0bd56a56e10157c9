//! 32-bit x86 guests end to end under QEMU TCG: guests/demo32, a multiboot ELF32 guest
//! built from source, in each paging mode glass's x86 walk knows outside long mode
//! (paging off, 32-bit 2-level paging with a 4 MiB page and 4 KiB pages, PAE with
//! 2 MiB and 4 KiB pages; the kernel at 0xC0100000 when paged, so a wrong walk reads
//! the wrong bytes). The guest measures its own split with rdtsc and prints it: the
//! truth the profile is checked against. Stacks are walked by 32-bit frame records to
//! the multiboot entry, and the only `[firmware]` samples are those before the guest
//! ran its own code.

mod common;
use common::*;

use std::path::{Path, PathBuf};

fn build_demo32(dir: &Path) -> PathBuf {
    build_guest_image("demo32", dir, &[])
}

/// Records `demo32-MODE.elf` for 5 s at 199 Hz and checks the profile against the
/// guest's own split.
fn profile_in_mode(mode: &str) {
    let _alone = exclusive();
    let dir = build_demo32(&scratch(&format!("guest32_{mode}")));
    let image = dir.join(format!("demo32-{mode}.elf"));
    let recording = dir.join(format!("{mode}.glass"));
    let serial = dir.join(format!("{mode}.serial"));
    let serial_arg = format!("file:{}", serial.display());
    let mut args = vec![
        "record",
        "--vm",
        "-F",
        "199",
        "-d",
        "5",
        "-o",
        recording.to_str().unwrap(),
    ];
    args.extend(qemu_command(
        "1",
        &["-serial", &serial_arg],
        image.to_str().unwrap(),
    ));
    let output = glass(&args);
    let err = stderr(&output);
    assert!(output.status.success(), "{err}");
    assert!(!err.contains("warning"), "{err}");
    let console = std::fs::read_to_string(&serial).unwrap();
    let (paging, pae) = match mode {
        "none" => ("0", "0"),
        "2level" => ("1", "0"),
        _ => ("1", "1"),
    };
    assert!(
        console.contains(&format!("cr0={paging} (PG) pae={pae} ")),
        "the guest did not run in mode {mode}: {console}"
    );

    let stacks = folded(&recording, &["--threads"]);
    // Busy time: the guest's own split, within four standard errors (at least 3
    // points). Measured here, 600-830 busy samples a run: alpha 58.7/63.0/62.3% of
    // them against the guest's 61.4/58.7/60.7% (2-level/PAE/none), beta within 2.
    let [alpha, beta, gamma, _] = guest_split(&serial);
    let busy = under(&stacks, "vcpu0/", "dispatch");
    assert!(busy > 300, "{busy} busy samples: {stacks:?}");
    for (function, truth) in [("alpha", alpha), ("beta", beta), ("gamma_", gamma)] {
        let share = under(&stacks, "vcpu0/", function) as f64 * 100.0 / busy as f64;
        let tolerance = share_tolerance(truth, busy, 3.0);
        assert!(
            (share - truth).abs() <= tolerance,
            "{mode}: {function}: {share:.1}% of {busy} samples, the guest measured {truth}% ({tolerance:.1} points allowed)"
        );
    }
    // Whole stacks, by 32-bit frame records, to the multiboot entry. A sample in a
    // function's prologue loses its caller (frame pointers only): a few.
    let rooted: u64 = stacks
        .iter()
        .filter(|(f, _)| {
            f.windows(5)
                .any(|w| w == ["_start", "kmain", "run", "dispatch", "alpha"])
                || f.windows(5)
                    .any(|w| w == ["_start", "kmain", "run", "dispatch", "beta"])
                || f.windows(5)
                    .any(|w| w == ["_start", "kmain", "run", "dispatch", "gamma_"])
        })
        .map(|(_, n)| n)
        .sum();
    assert!(
        rooted as f64 >= 0.97 * busy as f64,
        "{mode}: {rooted} of {busy} busy samples rooted at _start;kmain;run;dispatch: {stacks:?}"
    );

    // In time order (speedscope keeps it): `[firmware]` only before the first sample of
    // the guest's own code, never after it turned paging on.
    let out = dir.join(format!("{mode}.speedscope.json"));
    let samples = speedscope_stacks(&recording, &out);
    let first_own = samples
        .iter()
        .position(|s| s.iter().any(|f| f == "kmain"))
        .unwrap_or_else(|| panic!("{mode}: no sample under kmain"));
    let firmware_after = samples[first_own..]
        .iter()
        .filter(|s| s.iter().any(|f| f == "[firmware]"))
        .count();
    assert_eq!(
        firmware_after, 0,
        "{mode}: [firmware] after the guest's code ran"
    );
    // The boot (firmware, multiboot loader) takes well under a second of the 5.
    assert!(
        first_own < samples.len() / 10,
        "{mode}: {first_own} samples before kmain"
    );
}

#[test]
fn a_32_bit_guest_with_2_level_paging_is_profiled_by_its_32_bit_frames() {
    profile_in_mode("2level");
}

#[test]
fn a_32_bit_guest_with_pae_paging_is_profiled_by_its_32_bit_frames() {
    profile_in_mode("pae");
}

#[test]
fn a_32_bit_guest_without_paging_is_profiled_by_its_32_bit_frames() {
    profile_in_mode("none");
}
