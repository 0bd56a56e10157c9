//! End to end: glass samples real fixture processes and the profile matches the known
//! truth of each fixture.

mod common;
use common::*;

/// Within 3 percentage points of 60/30/10, with at least 2000 samples, at depth >= 4.
#[test]
fn split_matches_its_known_ratio() {
    let _alone = exclusive();
    let dir = scratch("split_ratio");
    let split = compile(&dir, "split.c", "split", &[]);
    let recording = dir.join("split.glass");
    let output = record(&recording, 999, &[split.to_str().unwrap(), "12000"]);
    assert!(
        stdout(&output).contains("done rounds=12000"),
        "target output passes through"
    );

    let stacks = folded(&recording, &[]);
    let work = samples_in(&stacks, "run_workload");
    assert!(work >= 1500, "only {work} samples in the workload");
    for (function, truth) in [("alpha", 60.0), ("beta", 30.0), ("gamma_", 10.0)] {
        let share = samples_in(&stacks, function) as f64 * 100.0 / work as f64;
        let tolerance = share_tolerance(truth, work, 3.0);
        assert!(
            (share - truth).abs() <= tolerance,
            "{function}: {share:.1}% vs {truth}% ({work} samples, {tolerance:.1} points allowed)"
        );
    }
    // The full chain is there: main -> run_workload -> dispatch -> alpha.
    let chain = ["main", "run_workload", "dispatch", "alpha"];
    let deep = stacks
        .iter()
        .filter(|(frames, _)| frames.windows(4).any(|w| w == chain))
        .map(|(_, n)| n)
        .sum::<u64>();
    assert!(
        deep as f64 >= 0.5 * work as f64,
        "chain main;run_workload;dispatch;alpha in {deep} of {work}"
    );
}

#[test]
fn each_thread_appears_under_its_own_thread() {
    let _alone = exclusive();
    let dir = scratch("threads");
    let threads = compile(&dir, "threads.c", "threads", &["-pthread"]);
    let recording = dir.join("threads.glass");
    record(&recording, 499, &[threads.to_str().unwrap(), "40000"]);
    let stacks = folded(&recording, &["--threads"]);
    let under = |thread: &str, function: &str| -> u64 {
        stacks
            .iter()
            .filter(|(frames, _)| {
                frames
                    .get(1)
                    .is_some_and(|t| t.starts_with(&format!("{thread}/")))
            })
            .filter(|(frames, _)| frames.iter().any(|f| f == function))
            .map(|(_, n)| n)
            .sum()
    };
    assert!(under("cruncher", "crunch_numbers") > 100, "{stacks:?}");
    assert!(under("hasher", "hash_bytes") > 100, "{stacks:?}");
    assert_eq!(under("cruncher", "hash_bytes"), 0);
    assert_eq!(under("hasher", "crunch_numbers"), 0);

    // --tid keeps exactly one thread.
    let cruncher_tid = stacks
        .iter()
        .find_map(|(frames, _)| {
            frames
                .get(1)
                .filter(|t| t.starts_with("cruncher/"))
                .cloned()
        })
        .unwrap();
    let tid = cruncher_tid.rsplit('/').next().unwrap();
    let one = folded(&recording, &["--tid", tid]);
    assert!(samples_in(&one, "crunch_numbers") > 100);
    assert_eq!(samples_in(&one, "hash_bytes"), 0);
}

#[test]
fn a_recursion_300_deep_is_captured_whole() {
    let _alone = exclusive();
    let dir = scratch("recursion");
    let program = compile(&dir, "recursion.c", "recursion", &[]);
    let recording = dir.join("recursion.glass");
    record(
        &recording,
        499,
        &[program.to_str().unwrap(), "30000", "300"],
    );
    let stacks = folded(&recording, &[]);
    let at_bottom: Vec<_> = stacks
        .iter()
        // The work is inlined into `bottom`: it is the last or next-to-last frame.
        .filter(|(f, _)| f.iter().rev().take(2).any(|l| l == "bottom"))
        .collect();
    let bottom_samples: u64 = at_bottom.iter().map(|(_, n)| n).sum();
    assert!(
        bottom_samples > 200,
        "{bottom_samples} samples at the bottom"
    );
    let full: u64 = at_bottom
        .iter()
        .filter(|(frames, _)| {
            frames.iter().filter(|f| *f == "descend").count() == 300
                && frames.iter().any(|f| f == "main")
        })
        .map(|(_, n)| n)
        .sum();
    assert!(
        full as f64 >= 0.95 * bottom_samples as f64,
        "{full} of {bottom_samples} samples have all 300 frames"
    );
}

#[test]
fn a_library_loaded_with_dlopen_is_named() {
    let _alone = exclusive();
    let dir = scratch("dlopen");
    let library = compile_library(&dir, "plugin.c", "libplugin.so", &[]);
    let program = compile(&dir, "dlopen.c", "dlopen", &["-ldl"]);
    let recording = dir.join("dlopen.glass");
    record(
        &recording,
        999,
        &[
            program.to_str().unwrap(),
            library.to_str().unwrap(),
            "60000",
        ],
    );
    let stacks = folded(&recording, &[]);
    let plugin = samples_in(&stacks, "plugin_transform") as f64;
    let local = samples_in(&stacks, "local_transform") as f64;
    // Half the work is in the library, half in the program.
    let share = plugin * 100.0 / (plugin + local);
    assert!(plugin + local > 1500.0, "{plugin} + {local} samples");
    let tolerance = share_tolerance(50.0, (plugin + local) as u64, 3.0);
    assert!(
        (share - 50.0).abs() <= tolerance,
        "plugin share {share:.1}% ({tolerance:.1} points allowed)"
    );
}

#[test]
fn forked_and_execed_children_are_sampled_with_their_own_symbols() {
    let _alone = exclusive();
    let dir = scratch("forkexec");
    let parent = compile(&dir, "forkexec.c", "forkexec", &[]);
    let child = compile(&dir, "split.c", "split", &[]);
    let recording = dir.join("forkexec.glass");
    let output = record(
        &recording,
        499,
        &[
            parent.to_str().unwrap(),
            "60000",
            child.to_str().unwrap(),
            "8000",
        ],
    );
    assert!(stdout(&output).contains("child_status=0"));
    let stacks = folded(&recording, &[]);
    let in_process = |process: &str, function: &str| -> u64 {
        stacks
            .iter()
            .filter(|(frames, _)| frames[0] == process && frames.iter().any(|f| f == function))
            .map(|(_, n)| n)
            .sum()
    };
    assert!(in_process("forkexec", "parent_work") > 100, "{stacks:?}");
    assert!(in_process("split", "alpha") > 100, "{stacks:?}");
    assert_eq!(in_process("split", "parent_work"), 0);
}

#[test]
fn the_launched_command_exit_status_is_returned() {
    let _alone = exclusive();
    let dir = scratch("exit_status");
    let recording = dir.join("exit.glass");
    let output = glass(&[
        "record",
        "-q",
        "-o",
        recording.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        "exit 7",
    ]);
    assert_eq!(output.status.code(), Some(7), "{}", stderr(&output));
    let info = glass(&["info", recording.to_str().unwrap()]);
    assert!(info.status.success(), "{}", stderr(&info));
}
