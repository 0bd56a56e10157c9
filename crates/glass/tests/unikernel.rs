//! End to end under QEMU TCG on a guest built the way real unikernels are
//! (guests/unikernel): C without frame pointers and with its CFI only in `.debug_frame`,
//! assembly with `.eh_frame`, a 48 KiB deep recursion, an idle loop that halts, one vCPU
//! started under `-smp 2` (the other stays in the firmware), and a stripped 32-bit boot
//! image with the symbols in a separate ELF. The guest measures its own split with its
//! time-stamp counter and prints it: that is the truth the profile is checked against.

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn build_unikernel(dir: &Path) -> PathBuf {
    build_guest_image("unikernel", dir, &["0"])
}

/// `glass record --vm` of the guest on two vCPUs for `seconds`; the guest's serial
/// output goes to `serial`.
fn record_vm(
    image: &Path,
    recording: &Path,
    serial: &Path,
    seconds: &str,
    options: &[&str],
) -> Output {
    let serial_arg = format!("file:{}", serial.display());
    // 997 Hz: about 3000 busy samples in 6 s, so sampling noise (a standard error near
    // 1 point for alpha's 60%) stays well inside the 3 points the split test allows.
    let mut args = vec![
        "record",
        "--vm",
        "-F",
        "997",
        "-d",
        seconds,
        "-o",
        recording.to_str().unwrap(),
    ];
    args.extend_from_slice(options);
    args.extend(qemu_command(
        "2",
        &["-serial", &serial_arg],
        image.to_str().unwrap(),
    ));
    glass(&args)
}

#[test]
fn a_unikernel_without_frame_pointers_is_profiled_whole_with_its_vcpu_states_named() {
    let _alone = exclusive();
    let dir = build_unikernel(&scratch("unikernel_split"));
    let recording = dir.join("uk.glass");
    let serial = dir.join("uk.serial");
    let elf = dir.join("uk.elf");
    let output = record_vm(
        &dir.join("uk-stripped.img"),
        &recording,
        &serial,
        "6",
        &["--symbols", elf.to_str().unwrap()],
    );
    let err = stderr(&output);
    assert!(output.status.success(), "{err}");
    // The firmware and the boot loader ran outside the image first: not a wrong image.
    assert!(!err.contains("outside the text"), "{err}");
    assert!(!err.contains("warning"), "{err}");
    // Both CFI sources are named at record time.
    let tables = err
        .lines()
        .find(|l| l.contains("unwind tables of"))
        .unwrap_or_else(|| panic!("no unwind tables line: {err}"));
    assert!(
        tables.contains(".eh_frame (") && tables.contains(".debug_frame ("),
        "{tables}"
    );
    let stacks = folded(&recording, &["--threads"]);

    // The second vCPU never left the firmware: named so, and nothing else.
    let vcpu1: u64 = stacks
        .iter()
        .filter(|(f, _)| f[1].starts_with("vcpu1/"))
        .map(|(_, n)| n)
        .sum();
    assert!(vcpu1 > 1000, "{stacks:?}");
    assert_eq!(under(&stacks, "vcpu1/", "[firmware]"), vcpu1, "{stacks:?}");

    // The first vCPU: halted in the idle loop, named, under idle_wait.
    let halted = under(&stacks, "vcpu0/", "[halted]");
    let idle_chain = ["kmain", "run", "idle_wait", "[halted]"];
    let halted_in_idle: u64 = stacks
        .iter()
        .filter(|(f, _)| f.windows(4).any(|w| w == idle_chain))
        .map(|(_, n)| n)
        .sum();
    assert!(halted > 100, "{stacks:?}");
    assert!(
        halted_in_idle as f64 >= 0.95 * halted as f64,
        "{halted_in_idle} of {halted} halted samples under kmain;run;idle_wait"
    );

    // Busy time: the split the guest measured itself, within 3 points, from stacks
    // unwound by .debug_frame (C) and .eh_frame (mix_block) alone.
    let [alpha, beta, gamma, _] = guest_split(&serial);
    let busy = under(&stacks, "vcpu0/", "dispatch");
    assert!(busy > 800, "{busy} busy samples: {stacks:?}");
    for (function, truth) in [("alpha", alpha), ("beta", beta), ("gamma", gamma)] {
        let share = under(&stacks, "vcpu0/", function) as f64 * 100.0 / busy as f64;
        let tolerance = share_tolerance(truth, busy, 3.0);
        assert!(
            (share - truth).abs() <= tolerance,
            "{function}: {share:.1}% of {busy} samples, the guest measured {truth}% ({tolerance:.1} points allowed)"
        );
    }
    // Whole stacks: every busy sample reaches kmain, and beta's all 80 frames deep.
    let rooted: u64 = stacks
        .iter()
        .filter(|(f, _)| f.windows(3).any(|w| w == ["kmain", "run", "dispatch"]))
        .map(|(_, n)| n)
        .sum();
    assert!(
        rooted as f64 >= 0.97 * busy as f64,
        "{rooted} of {busy} busy samples rooted at kmain;run;dispatch: {stacks:?}"
    );
    // The recursion: whole stacks (below beta, its depth varies while it is built and
    // unwound; its work is at the bottom, 80 frames deep), cut only while the copy grows.
    let recursion = under(&stacks, "vcpu0/", "descend");
    let beta_samples = under(&stacks, "vcpu0/", "beta");
    let deep: u64 = stacks
        .iter()
        .filter(|(f, _)| {
            f.windows(2).any(|w| w == ["dispatch", "beta"])
                && f.iter().filter(|x| *x == "descend").count() == 80
        })
        .map(|(_, n)| n)
        .sum();
    assert!(
        beta_samples + 4 >= recursion,
        "{beta_samples} of {recursion} samples in the recursion reach beta"
    );
    assert!(
        deep as f64 >= 0.9 * beta_samples as f64,
        "{deep} of {beta_samples} samples in beta hold all 80 descend frames"
    );
    assert!(
        under(&stacks, "vcpu0/", "[unknown]") as f64 <= 0.01 * busy as f64,
        "{stacks:?}"
    );
    // The walks end at the boot stub that calls the never-returning kmain (code without
    // CFI in an image with CFI), not marked truncated; only the first deep stacks, taken
    // before the copy grew to them, are.
    let truncated = under(&stacks, "vcpu0/", "[truncated]");
    assert!(
        truncated as f64 <= 0.03 * busy as f64,
        "{truncated} truncated stacks: {stacks:?}"
    );
    // Deep stacks were copied whole once the copy had grown to them.
    assert!(err.contains("vcpu0:") && err.contains("halted"), "{err}");
    assert!(err.contains("in firmware"), "{err}");

    // --no-idle at report time leaves the halted samples out.
    let busy_only = folded(&recording, &["--threads", "--no-idle"]);
    assert_eq!(under(&busy_only, "vcpu0/", "[halted]"), 0);
    assert_eq!(under(&busy_only, "vcpu0/", "dispatch"), busy);
}

#[test]
fn a_stripped_boot_image_alone_is_announced_and_no_idle_leaves_halted_samples_out() {
    let _alone = exclusive();
    let dir = build_unikernel(&scratch("unikernel_stripped"));
    let recording = dir.join("stripped.glass");
    let serial = dir.join("stripped.serial");
    let output = record_vm(
        &dir.join("uk-stripped.img"),
        &recording,
        &serial,
        "3",
        // The sampler pinned to a CPU of its own applies to guests too.
        &["--no-idle", "--sampler-cpu", "0"],
    );
    let err = stderr(&output);
    assert!(output.status.success(), "{err}");
    // Said at record time, with what to do about it.
    assert!(
        err.contains("has no function symbols (stripped)") && err.contains("--symbols"),
        "{err}"
    );
    // The halt is found in the code itself, symbols or not; the samples are left out.
    let left_out: u64 = err
        .lines()
        .find(|l| l.contains("vcpu0:"))
        .and_then(|l| l.split(" halted, left out").next())
        .and_then(|l| l.rsplit(['(', ' ']).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no halted count in: {err}"));
    assert!(left_out > 50, "{err}");
    let stacks = folded(&recording, &["--threads"]);
    assert_eq!(under(&stacks, "vcpu0/", "[halted]"), 0, "{stacks:?}");
    assert!(total(&stacks) > 500, "{stacks:?}");
}

#[test]
fn deep_stacks_are_copied_whole_through_m_packets_too() {
    let _alone = exclusive();
    let dir = build_unikernel(&scratch("unikernel_m_packets"));
    // Attached through the stub alone: no shared RAM, every stack byte comes in `m`
    // packets, whose copy must grow to the 48 KiB recursion as the RAM path's does.
    let vm = Vm::start_with(&dir, "uk.img", "uk-m", 1);
    let recording = dir.join("m.glass");
    let elf = dir.join("uk.elf");
    // Each stop copies 48 KiB in `m` packets, round trips that a loaded host stretches
    // past the default 50 ms stop bound (51 ms in one fresh-clone run): this test is of
    // the copy's size, so the bound is a second.
    let output = Command::new(GLASS)
        .args([
            "record",
            "-F",
            "199",
            "-d",
            "6",
            "--gdb",
            vm.socket.to_str().unwrap(),
            "--symbols",
            elf.to_str().unwrap(),
            "-o",
            recording.to_str().unwrap(),
        ])
        .env("GLASS_STOP_BOUND_MS", "1000")
        .output()
        .expect("glass runs");
    let err = stderr(&output);
    assert!(output.status.success(), "{err}");
    let copy_kib: usize = err
        .lines()
        .find(|l| l.contains("vcpu0:"))
        .and_then(|l| l.split("stack copy ").nth(1))
        .and_then(|l| l.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no stack copy size in: {err}"));
    assert!(copy_kib >= 48, "{err}");
    let stacks = folded(&recording, &[]);
    // Every sample in the recursion, whole or cut by the copy.
    let recursion = samples_in(&stacks, "descend");
    // Whole: down from kmain (the recursion's depth varies while it is built and
    // unwound; its work is at the bottom, 80 frames deep).
    let whole: u64 = stacks
        .iter()
        .filter(|(f, _)| f.windows(3).any(|w| w == ["run", "dispatch", "beta"]))
        .map(|(_, n)| n)
        .sum();
    let deep: u64 = stacks
        .iter()
        .filter(|(f, _)| {
            f.windows(2).any(|w| w == ["dispatch", "beta"])
                && f.iter().filter(|x| *x == "descend").count() == 80
        })
        .map(|(_, n)| n)
        .sum();
    assert!(recursion >= 15, "{stacks:?}");
    assert!(deep as f64 >= 0.7 * whole as f64, "{deep} of {whole}");
    // The first samples of the recursion come before the copy has grown to it (one
    // packet, then fourfold per cut sample: 2, 8, 32, 128 KiB).
    assert!(
        whole + 4 >= recursion,
        "{whole} of {recursion} samples in the recursion are whole"
    );
    vm.assert_running();
}
