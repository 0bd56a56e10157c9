//! Unwinding without frame pointers: DWARF CFI through code built without them, through
//! libc, from frameless leaves and from prologues and epilogues; both backends.

mod common;
use common::*;

/// Shares of alpha/beta/gamma_ among the samples under run_workload.
fn split_shares(stacks: &[(Vec<String>, u64)]) -> (u64, [f64; 3]) {
    let work = samples_in(stacks, "run_workload");
    let share = |f: &str| samples_in(stacks, f) as f64 * 100.0 / work.max(1) as f64;
    (work, [share("alpha"), share("beta"), share("gamma_")])
}

fn chain_count(stacks: &[(Vec<String>, u64)], chain: &[&str]) -> u64 {
    stacks
        .iter()
        .filter(|(frames, _)| frames.windows(chain.len()).any(|w| w == chain))
        .map(|(_, n)| n)
        .sum()
}

#[test]
fn without_frame_pointers_the_split_and_chains_match_the_frame_pointer_twin() {
    let _alone = exclusive();
    let dir = scratch("omit_fp");
    let source = fixtures_dir().join("split.c");
    for (name, flags) in [
        ("split_fp", "-fno-omit-frame-pointer"),
        ("split_nofp", "-fomit-frame-pointer"),
    ] {
        let binary = dir.join(name);
        let status = std::process::Command::new("gcc")
            .args(["-O2", "-g", flags])
            .arg(&source)
            .arg("-o")
            .arg(&binary)
            .status()
            .unwrap();
        assert!(status.success());
        for backend in ["perf", "ptrace"] {
            let recording = dir.join(format!("{name}-{backend}.glass"));
            record_with(
                &recording,
                999,
                &["--backend", backend],
                &[binary.to_str().unwrap(), "10000"],
            );
            let stacks = folded(&recording, &[]);
            let (work, shares) = split_shares(&stacks);
            assert!(work >= 1500, "{name} {backend}: {work} samples");
            for (share, truth) in shares.iter().zip([60.0, 30.0, 10.0]) {
                // These check the unwinding: the sampled split itself is checked to ±3
                // in record_accuracy; a shared VM's steal time moves a 2 s run by more.
                assert!((share - truth).abs() <= 5.0, "{name} {backend}: {shares:?}");
            }
            let chain = chain_count(&stacks, &["main", "run_workload", "dispatch", "alpha"]);
            let alpha = samples_in(&stacks, "alpha");
            assert!(
                chain as f64 >= 0.97 * alpha as f64,
                "{name} {backend}: chain in {chain} of {alpha}"
            );
        }
    }
}

#[test]
fn a_callback_called_from_libc_unwinds_back_to_main() {
    let _alone = exclusive();
    let dir = scratch("qsort");
    let program = compile(&dir, "qsort.c", "qsort", &[]);
    let recording = dir.join("qsort.glass");
    record_with(
        &recording,
        999,
        &["--unwind", "dwarf"],
        &[program.to_str().unwrap(), "600"],
    );
    let stacks = folded(&recording, &[]);
    let in_callback = samples_in(&stacks, "compare_records");
    assert!(in_callback > 300, "{in_callback} samples in the comparator");
    // Through libc's qsort (no frame pointers) back to the fixture's main.
    let through: u64 = stacks
        .iter()
        .filter(|(frames, _)| {
            let at = |name: &str| frames.iter().position(|f| f == name);
            matches!((at("main"), at("sort_records"), at("compare_records")), (Some(m), Some(s), Some(c)) if m < s && s < c)
                && frames.iter().any(|f| f.contains("qsort") || f.contains("msort"))
        })
        .map(|(_, n)| n)
        .sum();
    assert!(
        through as f64 >= 0.95 * in_callback as f64,
        "{through} of {in_callback} unwound through qsort"
    );
}

#[test]
fn frameless_leaves_are_attributed_to_their_real_caller() {
    let _alone = exclusive();
    let dir = scratch("leaves");
    let program = compile(&dir, "leaves.c", "leaves", &[]);
    let run = |unwind: &str, backend: &[&str]| {
        let recording = dir.join(format!("leaves-{unwind}-{}.glass", backend.len()));
        record_with(
            &recording,
            999,
            &[&["--unwind", unwind], backend].concat(),
            &[program.to_str().unwrap(), "6000"],
        );
        folded(&recording, &[])
    };
    let with_cfi = run("auto", &[]);
    let in_leaf = samples_in(&with_cfi, "leaf_sum");
    let via_caller = chain_count(&with_cfi, &["via_alpha", "leaf_sum"])
        + chain_count(&with_cfi, &["via_beta", "leaf_sum"]);
    assert!(in_leaf > 300);
    assert!(
        via_caller as f64 >= 0.99 * in_leaf as f64,
        "CFI: {via_caller} of {in_leaf}"
    );
    // A bare frame-pointer walk loses the leaf's caller, as `perf record -g` does; glass
    // takes the leaf's return address from the stack pointer when the chain skips it
    // (glass_unwind::unchained_return_address): in the walk of the perf backend's copy
    // (the default backend here) and in the ptrace backend's walk of the stopped thread.
    for backend in [&[][..], &["--backend", "ptrace"][..]] {
        let with_fp = run("fp", backend);
        let fp_in_leaf = samples_in(&with_fp, "leaf_sum");
        let fp_via_caller = chain_count(&with_fp, &["via_alpha", "leaf_sum"])
            + chain_count(&with_fp, &["via_beta", "leaf_sum"]);
        assert!(fp_in_leaf > 300, "{backend:?}: {fp_in_leaf}");
        assert!(
            fp_via_caller as f64 >= 0.95 * fp_in_leaf as f64,
            "fp {backend:?}: {fp_via_caller} of {fp_in_leaf}"
        );
    }
}

#[test]
fn samples_in_tiny_hot_leaves_unwind_to_main() {
    let _alone = exclusive();
    let dir = scratch("tiny_leaves");
    let program = compile(&dir, "leaves.c", "leaves", &[]);
    let recording = dir.join("tiny.glass");
    record_with(&recording, 999, &[], &[program.to_str().unwrap(), "6000"]);
    let stacks = folded(&recording, &[]);
    let tiny: Vec<_> = stacks
        .iter()
        .filter(|(frames, _)| frames.iter().any(|f| f == "tiny_calls"))
        .collect();
    let total: u64 = tiny.iter().map(|(_, n)| n).sum();
    let to_main: u64 = tiny
        .iter()
        .filter(|(frames, _)| {
            chain_count(
                &[((*frames).clone(), 1)],
                &["main", "run_leaves", "tiny_calls"],
            ) == 1
        })
        .map(|(_, n)| n)
        .sum();
    assert!(total > 300, "{total}");
    assert!(
        to_main as f64 >= 0.99 * total as f64,
        "{to_main} of {total} reach main"
    );
    // Samples inside the tiny functions themselves (prologue, body, epilogue) too.
    let in_tiny = samples_in(&stacks, "tiny_add") + samples_in(&stacks, "tiny_mix");
    assert!(in_tiny > 20, "{in_tiny}");
}

#[test]
fn raw_capture_gives_the_same_profile_as_frames() {
    let _alone = exclusive();
    let dir = scratch("raw_capture");
    let program = compile(&dir, "split.c", "split", &["-fomit-frame-pointer"]);
    let recording = dir.join("raw.glass");
    record_with(
        &recording,
        999,
        &["--capture", "raw"],
        &[program.to_str().unwrap(), "10000"],
    );
    let stacks = folded(&recording, &[]);
    let (work, shares) = split_shares(&stacks);
    assert!(work >= 1500, "{work} samples");
    for (share, truth) in shares.iter().zip([60.0, 30.0, 10.0]) {
        // As above: the split to ±5 here, the unwinding exactly.
        assert!((share - truth).abs() <= 5.0, "{shares:?}");
    }
    assert!(
        chain_count(&stacks, &["main", "run_workload", "dispatch", "alpha"]) as f64
            >= 0.97 * samples_in(&stacks, "alpha") as f64
    );
}

#[test]
fn threads_and_forked_children_under_each_backend() {
    let _alone = exclusive();
    let dir = scratch("backends");
    let threads = compile(&dir, "threads.c", "threads", &["-pthread"]);
    let parent = compile(&dir, "forkexec.c", "forkexec", &[]);
    let child = compile(&dir, "split.c", "split", &[]);
    for backend in ["perf", "ptrace"] {
        let recording = dir.join(format!("threads-{backend}.glass"));
        record_with(
            &recording,
            499,
            &["--backend", backend],
            &[threads.to_str().unwrap(), "30000"],
        );
        let stacks = folded(&recording, &["--threads"]);
        let under = |thread: &str, function: &str| -> u64 {
            stacks
                .iter()
                .filter(|(f, _)| {
                    f.get(1)
                        .is_some_and(|t| t.starts_with(&format!("{thread}/")))
                        && f.iter().any(|x| x == function)
                })
                .map(|(_, n)| n)
                .sum()
        };
        assert!(
            under("cruncher", "crunch_numbers") > 50,
            "{backend}: {stacks:?}"
        );
        assert!(under("hasher", "hash_bytes") > 50, "{backend}: {stacks:?}");
        assert_eq!(
            under("cruncher", "hash_bytes") + under("hasher", "crunch_numbers"),
            0,
            "{backend}"
        );

        let recording = dir.join(format!("fork-{backend}.glass"));
        record_with(
            &recording,
            499,
            &["--backend", backend],
            &[
                parent.to_str().unwrap(),
                "40000",
                child.to_str().unwrap(),
                "5000",
            ],
        );
        let stacks = folded(&recording, &[]);
        let in_process = |process: &str, function: &str| -> u64 {
            stacks
                .iter()
                .filter(|(f, _)| f[0] == process && f.iter().any(|x| x == function))
                .map(|(_, n)| n)
                .sum()
        };
        assert!(
            in_process("forkexec", "parent_work") > 50,
            "{backend}: {stacks:?}"
        );
        assert!(in_process("split", "alpha") > 50, "{backend}: {stacks:?}");
    }
}
