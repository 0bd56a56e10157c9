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
    /// The PAC-protected builds of nf.c, on the host: with `paciasp` where gcc schedules
    /// it (after the instructions the patch displaces), and first.
    nf_pac_binary: std::path::PathBuf,
    nf_pac_entry_binary: std::path::PathBuf,
}

/// `glass trace` in the guest: each fixture run natively (stdout to NAME.native, status
/// to NAME.native.status), then traced with -f PATTERN (NAME.traced, NAME.traced.status,
/// glass's own lines in NAME.err, the recording NAME.glass). Rings for 8 threads: the
/// guest's RAM holds them.
const TRACE_PAIRS: &str = r#"set -f
pair() {
    name=$1 options=$2
    shift 2
    "$@" >$OUT/$name.native 2>/dev/null
    echo $? >$OUT/$name.native.status
    ./glass trace --max-threads 8 --ring-size 1048576 -o $OUT/$name.glass $options -- "$@" >$OUT/$name.traced 2>$OUT/$name.err
    echo $? >$OUT/$name.traced.status
    echo "trace $name: $(cat $OUT/$name.traced.status)"
}
echo "pairs $(cut -d' ' -f1 /proc/uptime)" >>$OUT/phases
pair nf '-f process_batch,parse_*,classify,rule_match,rewrite,forward' ./nf 200
pair nf-pac '-f process_batch,parse_*,classify,rule_match,rewrite,forward' ./nf-pac 200
pair nf-pac-entry '-f process_batch,parse_*,classify,rule_match,rewrite,forward' ./nf-pac-entry 200
pair recursion '-f descend' ./recursion
pair threads '-f work_*' ./threads
pair throw '-f catcher,level1,level2,level3' ./throw
pair longjmp '-f driver,jump_*' ./longjmp
pair nf-all '-f * --lib libc.so*' ./nf-pac 20
pair throw-all '-f * --lib libstdc++*,libgcc_s*,libc.so*' ./throw
pair longjmp-all '-f * --lib libc.so*' ./longjmp
pair tailcall '-f leaf,middle,outer,in_child' ./tailcall
pair signal '-f busy_step,on_signal_work' ./signal
pair crash '-f work' ./crash
for variant in lazy now_relro no_plt; do
    pair libcalls-$variant '--libcalls malloc,free,mem*' ./libcalls-$variant
done
# Far patches (adrp, add, br x16), which a module spanning more than B's reach takes,
# forced on these small ones.
export GLASS_TEST_AARCH64_REACH=page
pair nf-far '-f process_batch,parse_*,classify,rule_match,rewrite,forward' ./nf 200
pair nf-pac-entry-far '-f process_batch,parse_*,classify,rule_match,rewrite,forward' ./nf-pac-entry 200
pair recursion-far '-f descend' ./recursion
unset GLASS_TEST_AARCH64_REACH
./glass trace --pmc cycles -f descend -o $OUT/pmc.glass -- ./recursion >$OUT/pmc.out 2>$OUT/pmc.err
echo $? >$OUT/pmc.status
"#;

/// `glass trace --pid` in the guest: inflight.c (calls in flight at every attach and
/// detach; plain, and built with `paciasp` first) attached three times each; states.c
/// (a thread in every state a tracer meets, x7 and vector registers held across a spin)
/// attached again and again; then glass killed at the two steps whose undoing is
/// AArch64's own (an injected call under way, which its landing's sigreturn ends; the
/// returns in flight given back), its guardian alive or killed too, each followed by an
/// attach that must work. (Every step is tried on x86-64 by trace_states, whose undoing
/// code the two architectures share.)
const PID_SCRIPT: &str = r#"set +f
phase() { echo "$1 $(cut -d' ' -f1 /proc/uptime)" >>$OUT/phases; }
phase pid
ready() { i=0; while ! grep -q ready $1 && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; }
guardians_gone() { i=0; while grep -qs __trace-guardian /proc/[0-9]*/cmdline && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done; }
for prog in inflight inflight-pac; do
    ./$prog >$OUT/$prog.out 2>$OUT/$prog.err &
    pid=$!
    ready $OUT/$prog.err
    for round in 1 2; do
        ./glass trace --max-threads 8 --pid $pid -f hold -d 0.3 -o $OUT/$prog-$round.glass 2>$OUT/$prog-$round.log
        echo "$prog $round $?" >>$OUT/inflight.status
    done
    GLASS_TEST_AARCH64_REACH=page ./glass trace --max-threads 8 --pid $pid -f hold -d 0.3 -o $OUT/$prog-far.glass 2>$OUT/$prog-far.log
    echo "$prog far $?" >>$OUT/inflight.status
    sleep 0.2
    kill -TERM $pid; wait $pid; echo "$prog exit $?" >>$OUT/inflight.status
done
phase states
./states >$OUT/states.out 2>$OUT/states.err &
spid=$!
ready $OUT/states.err
for round in 1 2 3 4; do
    ./glass trace --max-threads 16 --pid $spid -f mix -d 0.1 -o $OUT/states.glass 2>>$OUT/states-attach.log
    echo "attach $round $?" >>$OUT/states-attach.status
done
for step in inject-call detach-restored; do
    for guardian in lives killed; do
        phase "$step-$guardian"
        GLASS_TEST_STOP_AT=$step ./glass trace --max-threads 16 --pid $spid -f mix -d 0.2 -o $OUT/killed.glass 2>$OUT/killed-$step-$guardian.log &
        g=$!
        i=0
        while [ "$(cut -d' ' -f3 /proc/$g/stat 2>/dev/null)" != T ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done
        reached=$(cut -d' ' -f3 /proc/$g/stat 2>/dev/null)
        if [ $guardian = killed ]; then
            for c in /proc/[0-9]*/cmdline; do
                if grep -qs __trace-guardian $c; then p=${c#/proc/}; kill -9 ${p%/cmdline}; fi
            done
        fi
        kill -9 $g; wait $g 2>/dev/null
        guardians_gone
        kill -0 $spid 2>/dev/null && alive=alive || alive=dead
        ./glass trace --max-threads 16 --pid $spid -f mix -d 0.1 -o $OUT/next.glass 2>$OUT/next-$step-$guardian.log
        echo "$step $guardian reached=$reached $alive next=$?" >>$OUT/killed.status
    done
done
kill -TERM $spid; wait $spid; echo "states exit $?" >>$OUT/states-attach.status
phase end
"#;

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
        let nf = compile_aarch64(&dir, "trace/nf.c", "nf", &[]);
        let nf_pac = compile_aarch64(
            &dir,
            "trace/nf.c",
            "nf-pac",
            &["-mbranch-protection=standard"],
        );
        // The same with each signing function's `paciasp` first, before the patch (gcc
        // otherwise schedules it after the first instructions, which the patch displaces).
        let nf_pac_entry = compile_aarch64(
            &dir,
            "trace/nf.c",
            "nf-pac-entry",
            &[
                "-mbranch-protection=standard",
                "-fno-schedule-insns2",
                "-fno-shrink-wrap",
            ],
        );
        let recursion = compile_aarch64(&dir, "trace/recursion.c", "recursion", &[]);
        let threads = compile_aarch64(&dir, "trace/threads.c", "threads", &["-lpthread"]);
        let longjmp = compile_aarch64(&dir, "trace/longjmp.c", "longjmp", &[]);
        let tailcall = compile_aarch64(&dir, "trace/tailcall.c", "tailcall", &[]);
        let signal = compile_aarch64(&dir, "trace/signal.c", "signal", &[]);
        let crash = compile_aarch64(&dir, "trace/crash.c", "crash", &[]);
        let inflight = compile_aarch64(&dir, "trace/inflight.c", "inflight", &["-pthread"]);
        let inflight_pac = compile_aarch64(
            &dir,
            "trace/inflight.c",
            "inflight-pac",
            &[
                "-pthread",
                "-mbranch-protection=standard",
                "-fno-schedule-insns2",
                "-fno-shrink-wrap",
            ],
        );
        let states = compile_aarch64(&dir, "trace/states.c", "states", &["-pthread"]);
        let libcalls = [
            ("libcalls-lazy", "-Wl,-z,lazy"),
            ("libcalls-now_relro", "-Wl,-z,now,-z,relro"),
            ("libcalls-no_plt", "-fno-plt"),
        ]
        .map(|(name, flag)| compile_aarch64(&dir, "trace/libcalls.c", name, &[flag]));
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
{TRACE_PAIRS}{PID_SCRIPT}"
        );
        let run = run_in_aarch64_vm(
            "trace-aarch64-harness",
            &script,
            &[
                &glass,
                &split,
                &pac,
                &throw,
                &nf,
                &nf_pac,
                &nf_pac_entry,
                &recursion,
                &threads,
                &longjmp,
                &tailcall,
                &signal,
                &crash,
                &inflight,
                &inflight_pac,
                &states,
                &libcalls[0],
                &libcalls[1],
                &libcalls[2],
            ],
            "max",
        );
        eprintln!("console:\n{}", run.serial);
        run.assert_success();
        HarnessRun {
            run,
            pac_binary: pac,
            nf_pac_binary: nf_pac,
            nf_pac_entry_binary: nf_pac_entry,
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
    let HarnessRun {
        run, pac_binary, ..
    } = harness_run();
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

// ---------------------------------------------------------------------------------------
// glass trace on AArch64 (launch mode), in the same boot: each traced run prints what the
// untraced one printed and exits the same, and the records count every call.

/// The traced run of NAME behaved as the native one; its recording's counts.
fn traced_same(run: &VmRun, name: &str) -> Counts {
    let err = run.read(&format!("{name}.err"));
    assert_eq!(
        run.read(&format!("{name}.traced.status")),
        run.read(&format!("{name}.native.status")),
        "{name}: exit status differs; glass said: {err}"
    );
    assert_eq!(
        run.read(&format!("{name}.traced")),
        run.read(&format!("{name}.native")),
        "{name}: traced output differs; glass said: {err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    eprintln!("{name}: {}", err.trim_end());
    counts(&run.path(&format!("{name}.glass")))
}

/// nf's traced run NAME behaved as the native one, and counted every call of its six
/// traced functions as nf printed them, entries and exits, none lost.
fn nf_counted_exactly(run: &VmRun, name: &str) -> Counts {
    let counted = traced_same(run, name);
    assert_eq!(counted.lost(), 0, "{name}");
    let expected = printed_counts(&run.read(&format!("{name}.native")));
    assert_eq!(expected.len(), 6, "{expected:?}");
    for (function, n) in &expected {
        assert_eq!(counted.calls(function), *n, "{name}: entries of {function}");
        assert_eq!(counted.ended(function), *n, "{name}: exits of {function}");
    }
    counted
}

#[test]
fn trace_counts_every_call_exactly_on_aarch64_with_and_without_pointer_authentication() {
    let HarnessRun {
        run,
        nf_pac_binary,
        nf_pac_entry_binary,
        ..
    } = harness_run();
    // Times are the generic timer's, and the summary says so.
    let summary = run.read("nf.err");
    assert!(
        summary.contains("; timer rate ") && summary.contains(" MHz;"),
        "{summary}"
    );
    for name in ["nf", "nf-pac", "nf-pac-entry"] {
        let counted = nf_counted_exactly(run, name);
        assert!(counted.unwound.is_empty(), "{name}: {:?}", counted.unwound);
    }
    // Both PAC builds sign in the traced functions that call others. In nf-pac the
    // probe takes x30 before the function signs it; in nf-pac-entry the entry signed it
    // before the patch, and the trampoline authenticated it and signed it again around
    // the probe (or the function's own autiasp would have faulted under -cpu max).
    let first_instructions = |binary: &std::path::Path, function: &str| {
        let disassembly = std::process::Command::new("aarch64-linux-gnu-objdump")
            .args(["-d", &format!("--disassemble={function}")])
            .arg(binary)
            .output()
            .expect("aarch64-linux-gnu-objdump runs");
        let text = stdout(&disassembly);
        let words: Vec<String> = text
            .lines()
            .filter_map(|l| Some(l.split('\t').nth(2)?.split_whitespace().next()?.to_string()))
            .collect();
        (text, words)
    };
    for function in ["classify", "process_batch"] {
        let (text, words) = first_instructions(nf_pac_binary, function);
        assert!(words.iter().any(|w| w == "paciasp"), "{text}");
        assert_ne!(words.first().map(String::as_str), Some("paciasp"), "{text}");
        let (text, words) = first_instructions(nf_pac_entry_binary, function);
        assert_eq!(words.first().map(String::as_str), Some("paciasp"), "{text}");
    }

    let counted = traced_same(run, "recursion");
    assert_eq!(counted.calls("descend"), 100 * 1000);
    assert_eq!(counted.ended("descend"), 100 * 1000);

    let counted = traced_same(run, "threads");
    assert_eq!(counted.calls("work_a"), 100_000);
    assert_eq!(counted.calls("work_b"), 50_000);
    assert_eq!(counted.ended("work_a"), 100_000);
    let threads: std::collections::BTreeSet<u32> = counted
        .recording
        .trace_chunks
        .iter()
        .map(|c| c.tid)
        .collect();
    assert_eq!(threads.len(), 2, "one ring per thread");
}

#[test]
fn exceptions_and_longjmp_behave_as_without_glass_on_aarch64() {
    let HarnessRun { run, .. } = harness_run();
    let counted = traced_same(run, "throw");
    assert_eq!(run.read("throw.traced.status").trim(), "3");
    for name in ["catcher", "level1", "level2", "level3"] {
        assert_eq!(counted.calls(name), 1000, "{name}");
        assert_eq!(counted.ended(name), 1000, "{name}");
    }
    // level3 throws: each of its calls ends by the exception, not a return.
    assert_eq!(counted.unwound.get("level3").copied(), Some(1000));

    let counted = traced_same(run, "longjmp");
    assert!(counted.calls("jump_a") > 0);
    assert_eq!(counted.calls("jump_a"), counted.ended("jump_a"));
    assert!(counted.unwound.values().sum::<u64>() > 0);
}

#[test]
fn tail_calls_a_forked_child_signals_and_a_fault_on_aarch64() {
    let HarnessRun { run, .. } = harness_run();
    let counted = traced_same(run, "tailcall");
    assert_eq!(counted.lost(), 0);
    for (name, calls) in [
        ("outer", 2500),
        ("middle", 2500),
        ("leaf", 2500),
        ("in_child", 500),
    ] {
        assert_eq!(counted.calls(name), calls, "{name}");
        // A tail call shares its caller's return: both end there, as returns.
        assert_eq!(
            counted.exits.get(name).copied(),
            Some(calls),
            "{name} returns"
        );
    }
    let pids: std::collections::BTreeSet<u32> = counted
        .recording
        .trace_chunks
        .iter()
        .map(|c| c.pid)
        .collect();
    assert_eq!(pids.len(), 2, "the child records into its own ring");

    let counted = traced_same(run, "signal");
    assert_eq!(counted.calls("busy_step"), 2_000_000);
    assert_eq!(counted.ended("busy_step"), 2_000_000);
    assert!(counted.calls("on_signal_work") >= 1, "handlers are traced");

    // crash.c dies of SIGSEGV in work(), traced or not (the shell's status: 139).
    let counted = traced_same(run, "crash");
    assert_eq!(run.read("crash.traced.status").trim(), "139");
    let err = run.read("crash.err");
    assert!(
        err.contains("died of SIGSEGV at pc ") && err.contains("in its own code, in work+0x"),
        "{err}"
    );
    assert_eq!(counted.calls("work"), 1001);
}

#[test]
fn every_function_of_a_program_and_its_libraries_patched_on_aarch64() {
    let HarnessRun { run, .. } = harness_run();
    // The PAC build of nf with every function of it and of libc; throw.cpp with the C++
    // runtime and the unwinder's library too (whose own functions glass leaves alone);
    // longjmp.c with libc's setjmp family left alone.
    for name in ["nf-all", "throw-all", "longjmp-all"] {
        let counted = traced_same(run, name);
        assert!(
            counted.recording.trace_functions.len() > 100,
            "{name}: {} functions instrumented",
            counted.recording.trace_functions.len()
        );
        assert!(counted.entries.values().sum::<u64>() > 0, "{name}");
    }
}

#[test]
fn library_calls_through_the_got_on_aarch64_lazy_bind_now_and_no_plt() {
    let HarnessRun { run, .. } = harness_run();
    for variant in ["lazy", "now_relro", "no_plt"] {
        let counted = traced_same(run, &format!("libcalls-{variant}"));
        for call in ["malloc@plt", "memset@plt", "free@plt"] {
            assert_eq!(counted.calls(call), 10_000, "{variant}: {call}");
            assert_eq!(counted.ended(call), 10_000, "{variant}: {call}");
        }
    }
}

/// Far patches (`adrp x16; add x16; br x16`, ±4 GiB), which glass takes where a module's
/// code spans more than a B's ±128 MiB of one place for its trampolines, forced on the
/// fixtures by a test hook: every call counted as with B, launched (plain, and with
/// `paciasp` first: the patch follows it) and attached with calls in flight.
#[test]
fn far_patches_through_x16_count_every_call_exactly_on_aarch64() {
    let HarnessRun { run, .. } = harness_run();
    for name in ["nf-far", "nf-pac-entry-far"] {
        nf_counted_exactly(run, name);
        let err = run.read(&format!("{name}.err"));
        assert!(
            err.contains("6 functions patched with adrp, add and br x16"),
            "{err}"
        );
    }
    let counted = traced_same(run, "recursion-far");
    assert_eq!(counted.calls("descend"), 100 * 1000);
    assert_eq!(counted.ended("descend"), 100 * 1000);
    let status = run.read("inflight.status");
    for prog in ["inflight", "inflight-pac"] {
        let log = run.read(&format!("{prog}-far.log"));
        assert!(
            status.contains(&format!("{prog} far 0\n")),
            "{status}\n{log}"
        );
        assert!(log.contains("patched with adrp, add and br x16"), "{log}");
        assert!(log.contains("detached from pid"), "{log}");
        assert!(counts(&run.path(&format!("{prog}-far.glass"))).calls("hold") > 0);
    }
}

#[test]
fn calls_in_flight_at_attach_and_detach_keep_their_returns_with_and_without_pac() {
    let HarnessRun { run, .. } = harness_run();
    let status = run.read("inflight.status");
    for prog in ["inflight", "inflight-pac"] {
        for round in 1..=2 {
            let log = run.read(&format!("{prog}-{round}.log"));
            assert!(
                status.contains(&format!("{prog} {round} 0\n")),
                "{prog} attach {round}: {status}\n{log}"
            );
            assert!(log.contains("detached from pid"), "{log}");
            assert!(!log.contains("panicked"), "{log}");
        }
        // Threads asleep inside hold(), its return address replaced, at each detach:
        // given back (signed again, for the PAC build, by the process itself).
        let in_flight: u64 = (1..=2)
            .filter_map(|round| {
                let log = run.read(&format!("{prog}-{round}.log"));
                let line = log
                    .lines()
                    .find(|l| l.contains("calls in flight"))?
                    .to_string();
                line.split("; ")
                    .find(|part| part.ends_with("calls in flight finish untimed"))?
                    .split_whitespace()
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum();
        assert!(in_flight > 0, "{prog}: no call was in flight at a detach");
        assert!(status.contains(&format!("{prog} exit 0\n")), "{status}");
        assert_eq!(run.read(&format!("{prog}.out")), "errors: 0 calls: ok\n");
        let counted = counts(&run.path(&format!("{prog}-1.glass")));
        assert!(counted.calls("hold") > 0, "{prog}");
    }
}

#[test]
fn every_thread_state_survives_repeated_attaches_and_glass_killed_at_each_step() {
    let HarnessRun { run, .. } = harness_run();
    let status = run.read("states-attach.status");
    let log = run.read("states-attach.log");
    for round in 1..=4 {
        assert!(
            status.contains(&format!("attach {round} 0\n")),
            "{status}\n{log}"
        );
    }
    assert!(!log.contains("panicked"), "{log}");
    // SIGTERM at the end: every thread checked every call, x7 and the vector registers
    // held across their spin included, and found no error.
    assert!(status.contains("states exit 0\n"), "{status}");
    assert_eq!(run.read("states.out"), "errors: 0\n");
    let killed = run.read("killed.status");
    for step in ["inject-call", "detach-restored"] {
        for guardian in ["lives", "killed"] {
            let line = killed
                .lines()
                .find(|l| l.starts_with(&format!("{step} {guardian} ")))
                .unwrap_or_else(|| panic!("{step} {guardian} not run: {killed}"));
            let said = run.read(&format!("killed-{step}-{guardian}.log"));
            let next = run.read(&format!("next-{step}-{guardian}.log"));
            assert_eq!(
                line,
                format!("{step} {guardian} reached=T alive next=0"),
                "glass said: {said}\nthe next attach said: {next}"
            );
            if guardian == "lives" {
                assert!(
                    said.contains("glass ended while tracing pid"),
                    "{step}: {said}"
                );
                assert!(!said.contains("could not"), "{step}: {said}");
                assert!(!next.contains("died attached"), "{step}: {next}");
            }
        }
    }
}

#[test]
fn hardware_counters_are_refused_on_aarch64_in_one_line() {
    let HarnessRun { run, .. } = harness_run();
    let err = run.read("pmc.err");
    assert_eq!(run.read("pmc.status").trim(), "2", "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("--pmc cycles: hardware counters are read by the x86-64 probes only"),
        "{err}"
    );
}
