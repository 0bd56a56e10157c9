//! Python frames (ptrace backend): a CPython 3.11 or 3.12 program's time is split
//! between its Python functions as the program itself measured it, Python and native
//! frames interleave in call order, `--pid` of a running Python works, and a Python
//! glass cannot read says why in one line.
//!
//! The programs run on the machine's Pythons: Debian's `/usr/bin/python3.11` (a static,
//! stripped build: `_PyRuntime` and `Py_Version` from its dynamic symbols), and pyenv's
//! shared builds with debug info where present (skipped with a printed reason if not).

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const DEBIAN_311: &str = "/usr/bin/python3.11";
const FUNCTIONS: [&str; 4] = ["alpha", "beta", "gamma", "sorter"];

/// Whether Debian's python3.11 is here (said when it is not: the test is skipped).
fn debian_311() -> bool {
    let here = Path::new(DEBIAN_311).exists();
    if !here {
        println!("skipped: {DEBIAN_311} is not installed");
    }
    here
}

fn script() -> PathBuf {
    fixtures_dir().join("python_split.py")
}

fn pyenv(version: &str) -> Option<PathBuf> {
    let minor = version.rsplit_once('.').map_or(version, |(m, _)| m);
    let path = PathBuf::from(format!("/root/.pyenv/versions/{version}/bin/python{minor}"));
    if path.exists() {
        Some(path)
    } else {
        println!("skipped: {} is not installed", path.display());
        None
    }
}

/// Whether a folded frame is the Python function `name` (`name (file.py:line)`).
fn is_py(frame: &str, name: &str) -> bool {
    frame
        .strip_prefix(name)
        .is_some_and(|rest| rest.starts_with(" (python_split.py:"))
}

/// The script's own measure: function -> ns of wall-clock time. The ptrace backend
/// samples on the wall clock, so a thread that waits for a core (the machine is shared)
/// is sampled where it waits: wall time is the split it measures. But when the machine
/// is so loaded that glass waits for a core too (no ticks meanwhile), the samples follow
/// the CPU time instead (seen at a load of 8-9 on 2 cores: beta's wall share 37.8%, its
/// CPU share 30%, sampled 30.7%): a share is right when it is within the tolerance of
/// either of the script's measures ([`cpu_truth`]).
fn truth(stdout: &str) -> Vec<(String, f64)> {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("alpha="))
        .unwrap_or_else(|| panic!("no truth line in {stdout:?}"));
    line.split_whitespace()
        .map(|pair| {
            let (name, ns) = pair.split_once('=').unwrap();
            (name.to_string(), ns.parse().unwrap())
        })
        .collect()
}

/// The script's CPU-time measure (`time.thread_time_ns`), in the same order.
fn cpu_truth(stdout: &str) -> Vec<(String, f64)> {
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("cpu "))
        .unwrap_or_else(|| panic!("no CPU truth line in {stdout:?}"));
    truth(line)
}

/// Records the script under `python`, checks the split and the interleaving; returns
/// glass's stderr and the recording.
fn split_under(python: &Path, name: &str) -> (String, PathBuf) {
    let _guard = exclusive();
    let dir = scratch(name);
    let recording = dir.join("py.glass");
    let output = record_with(
        &recording,
        499,
        &[],
        &[python.to_str().unwrap(), script().to_str().unwrap(), "40"],
    );
    let err = stderr(&output);
    assert!(err.contains("frames read in"), "{err}");
    let truth = truth(&stdout(&output));
    let stacks = folded(&recording, &[]);
    let under = |function: &str| -> u64 {
        stacks
            .iter()
            .filter(|(frames, _)| frames.iter().any(|f| is_py(f, function)))
            .map(|(_, n)| n)
            .sum()
    };
    let counted: u64 = FUNCTIONS.iter().map(|f| under(f)).sum();
    let true_total: f64 = truth.iter().map(|(_, ns)| ns).sum();
    assert!(
        counted > 200,
        "too few samples under the functions: {stacks:?}"
    );
    let cpu = cpu_truth(&stdout(&output));
    let cpu_total: f64 = cpu.iter().map(|(_, ns)| ns).sum();
    for ((function, ns), (_, cpu_ns)) in truth.iter().zip(&cpu) {
        let expected = 100.0 * ns / true_total;
        let expected_cpu = 100.0 * cpu_ns / cpu_total;
        let measured = 100.0 * under(function) as f64 / counted as f64;
        let bound = share_tolerance(expected, counted, 3.0);
        let bound_cpu = share_tolerance(expected_cpu, counted, 3.0);
        println!(
            "{name}: {function} {measured:.1}% (wall {expected:.1}% ± {bound:.1}, cpu {expected_cpu:.1}% ± {bound_cpu:.1})"
        );
        assert!(
            (measured - expected).abs() <= bound || (measured - expected_cpu).abs() <= bound_cpu,
            "{function}: {measured:.1}% against {expected:.1}% wall (bound {bound:.1}), {expected_cpu:.1}% CPU (bound {bound_cpu:.1}); {err}"
        );
    }
    // sorted() is C calling back into Python: sorter's Python frame, then native
    // frames (the interpreter's, sorted's), then by_key's Python frame.
    let interleaved = stacks.iter().find(|(frames, _)| {
        let sorter = frames.iter().position(|f| is_py(f, "sorter"));
        let key = frames.iter().position(|f| is_py(f, "by_key"));
        match (sorter, key) {
            (Some(s), Some(k)) if s < k => {
                frames[s + 1..k].iter().any(|f| !f.contains(".py:"))
                    && frames.get(k + 1).is_some_and(|f| is_py(f, "work"))
            }
            _ => false,
        }
    });
    assert!(
        interleaved.is_some(),
        "no sorter -> native -> by_key -> work stack: {stacks:?}"
    );
    // No interpreter frame is left between Python frames of one eval call.
    for (frames, _) in &stacks {
        for pair in frames.windows(2) {
            assert!(
                !(is_py(&pair[0], "alpha") && pair[1] == "_PyEval_EvalFrameDefault"),
                "{frames:?}"
            );
        }
    }
    // Lines: each frame's line comes from its code's location table; work's frames
    // are on the lines of its body (the loop, mostly), or of its `def` (3.12's RESUME
    // at the function's start is located there), never outside it.
    let kept = glass_format::read_file(&recording).unwrap();
    let work = kept
        .py_codes
        .iter()
        .find(|c| c.name == "work" && c.file.ends_with("python_split.py"))
        .expect("work's code object recorded");
    let body = work.first_line..=work.first_line + 4;
    let mut lines = std::collections::BTreeMap::new();
    for stack in &kept.py_stacks {
        for frame in stack.frames.iter().filter(|f| f.code == work.id) {
            *lines.entry(frame.line).or_insert(0u64) += 1;
        }
    }
    assert!(
        lines.keys().all(|line| body.contains(line)),
        "work's lines {lines:?} outside its body {body:?}"
    );
    let in_loop: u64 = lines
        .range(work.first_line + 2..=work.first_line + 3)
        .map(|(_, n)| n)
        .sum();
    assert!(
        in_loop * 10 >= lines.values().sum::<u64>() * 9,
        "work's samples not in its loop: {lines:?}"
    );
    (err, recording)
}

#[test]
fn debian_python311_split_and_interleaving() {
    if !debian_311() {
        return;
    }
    let (err, recording) = split_under(Path::new(DEBIAN_311), "py_debian311");
    assert!(err.contains("Python 3.11 (/usr/bin/python3.11)"), "{err}");
    let info = stdout(&glass(&["info", recording.to_str().unwrap()]));
    assert!(info.contains("samples with Python frames"), "{info}");
    // Every exporter is a view of the same model: the Python frames are in each.
    for format in ["top", "flamegraph", "speedscope", "folded"] {
        let output = glass(&["report", recording.to_str().unwrap(), "--format", format]);
        assert!(output.status.success(), "{}", stderr(&output));
        assert!(
            stdout(&output).contains("work (python_split.py:"),
            "--format {format}: no Python frame"
        );
    }
}

/// `--backend perf` asked for a Python target: recorded without Python frames, and
/// the summary says why.
#[test]
fn perf_backend_says_python_frames_are_not_read() {
    if !Path::new(DEBIAN_311).exists() || perf_event_paranoid() > 2 {
        println!("skipped: no {DEBIAN_311} or no perf_event_open here");
        return;
    }
    let _guard = exclusive();
    let dir = scratch("py_perf");
    let recording = dir.join("py.glass");
    let output = record_with(
        &recording,
        99,
        &["--backend", "perf"],
        &[DEBIAN_311, script().to_str().unwrap(), "2"],
    );
    let err = stderr(&output);
    assert!(
        err.contains("Python frames are not read with the perf backend"),
        "{err}"
    );
    assert!(!err.contains("frames read in"), "{err}");
}

#[test]
fn pyenv_python311_split() {
    if let Some(python) = pyenv("3.11.7") {
        let (err, _) = split_under(&python, "py_pyenv311");
        assert!(
            err.contains("Python 3.11 (") && err.contains("libpython3.11"),
            "{err}"
        );
    }
}

/// 3.13: the offsets come from the interpreter's own `_Py_DebugOffsets`.
#[test]
fn pyenv_python313_split() {
    if let Some(python) = pyenv("3.13.0") {
        let (err, _) = split_under(&python, "py_pyenv313");
        assert!(err.contains("Python 3.13 ("), "{err}");
    }
}

#[test]
fn pyenv_python312_split() {
    if let Some(python) = pyenv("3.12.1") {
        let (err, _) = split_under(&python, "py_pyenv312");
        assert!(err.contains("Python 3.12 ("), "{err}");
    }
}

/// `--no-python` leaves the interpreter's frames as they are.
#[test]
fn no_python_keeps_the_interpreter_frames() {
    if !debian_311() {
        return;
    }
    let _guard = exclusive();
    let dir = scratch("py_off");
    let recording = dir.join("py.glass");
    // 40 rounds (~1.6 s on a quiet machine): a fresh-clone run of 5 rounds (0.2 s) on a
    // loaded machine recorded no sample at all, the program over before the first tick.
    let output = record_with(
        &recording,
        199,
        &["--no-python", "--backend", "ptrace"],
        &[DEBIAN_311, script().to_str().unwrap(), "40"],
    );
    let err = stderr(&output);
    assert!(!err.contains("Python"), "{err}");
    let stacks = folded(&recording, &[]);
    assert!(
        samples_in(&stacks, "_PyEval_EvalFrameDefault") > 0,
        "{err}\n{stacks:?}"
    );
    assert!(
        !stacks
            .iter()
            .any(|(f, _)| f.iter().any(|f| f.contains(".py:"))),
        "{stacks:?}"
    );
}

/// `--pid` of a Python already running: its frames are read, and it is left running,
/// untraced.
#[test]
fn pid_of_a_running_python() {
    if !debian_311() {
        return;
    }
    let _guard = exclusive();
    let dir = scratch("py_pid");
    let recording = dir.join("pid.glass");
    let mut target = Command::new(DEBIAN_311)
        .args([script().to_str().unwrap(), "100000"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let pid = target.id();
    // The interpreter runs main() once its module is loaded: wait for the script's
    // code object in its memory map's stead, i.e. for CPU time spent in it.
    let deadline = Instant::now() + Duration::from_secs(20);
    while user_ticks(pid) < 10 {
        assert!(Instant::now() < deadline, "python never ran");
        std::thread::sleep(Duration::from_millis(10));
    }
    let output = glass(&[
        "record",
        "-F",
        "199",
        "-d",
        "1.5",
        "--pid",
        &pid.to_string(),
        "-o",
        recording.to_str().unwrap(),
    ]);
    let err = stderr(&output);
    let state = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let _ = target.kill();
    let _ = target.wait();
    assert_eq!(output.status.code(), Some(0), "{err}");
    assert!(err.contains("ptrace backend"), "{err}");
    assert!(err.contains("Python 3.11 (/usr/bin/python3.11)"), "{err}");
    assert!(state.contains("TracerPid:\t0"), "left traced: {state}");
    assert!(!state.contains("State:\tt"), "left stopped: {state}");
    let stacks = folded(&recording, &[]);
    let total = total(&stacks);
    let under: u64 = stacks
        .iter()
        .filter(|(f, _)| f.iter().any(|f| is_py(f, "main")))
        .map(|(_, n)| n)
        .sum();
    assert!(total > 100, "{stacks:?}");
    assert!(
        under * 10 >= total * 9,
        "{under} of {total} under main(): {stacks:?}"
    );
}

/// A Python without `_PyRuntime` (Debian's python3.11 with the symbol renamed: what a
/// build glass does not know looks like) and a version glass does not read (3.10) are
/// recorded as native code, the summary saying why in one line.
#[test]
fn unknown_python_builds_say_why() {
    if !debian_311() {
        return;
    }
    let _guard = exclusive();
    let dir = scratch("py_unknown");
    let mut binary = std::fs::read(DEBIAN_311).unwrap();
    let renamed = replace_all(&mut binary, b"\0_PyRuntime\0", b"\0_PyRuntimX\0");
    assert!(renamed > 0, "no _PyRuntime in {DEBIAN_311}'s symbols");
    let python = dir.join("python3.11");
    std::fs::write(&python, &binary).unwrap();
    std::fs::set_permissions(&python, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut cases = vec![(python, "no _PyRuntime symbol".to_string())];
    for version in ["3.10.13"] {
        if let Some(python) = pyenv(version) {
            let minor = version.rsplit_once('.').unwrap().0;
            cases.push((
                python,
                format!("Python {minor} (/root/.pyenv/versions/{version}/lib/libpython{minor}.so.1.0): glass reads the frames of 3.11, 3.12 and 3.13 only"),
            ));
        }
    }
    for (python, why) in cases {
        let recording = dir.join("py.glass");
        let output = record_with(
            &recording,
            199,
            &[],
            &[python.to_str().unwrap(), script().to_str().unwrap(), "10"],
        );
        let err = stderr(&output);
        let lines: Vec<&str> = err.lines().filter(|l| l.contains(&why)).collect();
        assert_eq!(
            lines.len(),
            1,
            "{}: expected one line with {why:?}: {err}",
            python.display()
        );
        assert!(!err.contains("frames read in"), "{err}");
        let stacks = folded(&recording, &[]);
        assert!(
            samples_in(&stacks, "_PyEval_EvalFrameDefault") > 0,
            "{stacks:?}"
        );
    }
}

fn replace_all(haystack: &mut [u8], from: &[u8], to: &[u8]) -> usize {
    let mut count = 0;
    let mut at = 0;
    while let Some(found) = haystack[at..].windows(from.len()).position(|w| w == from) {
        let start = at + found;
        haystack[start..start + to.len()].copy_from_slice(to);
        at = start + from.len();
        count += 1;
    }
    count
}

/// The per-version offsets glass reads the chain with (`glass_target::python`, from
/// CPython's headers) are those of the interpreters' own debug info: gdb reads each
/// field's offset from the DWARF of pyenv's builds (which have it).
#[test]
fn layout_tables_match_the_interpreters_debug_info() {
    use glass_target::python::{PyLayout, PY311, PY312};
    if Command::new("gdb").arg("--version").output().is_err() {
        println!("skipped: gdb is not installed");
        return;
    }
    type Field = (&'static str, fn(&PyLayout) -> u64);
    let fields: [Field; 18] = [
        ("((_PyRuntimeState*)0)->interpreters.head", |l| {
            l.runtime_interpreters_head
        }),
        ("((PyInterpreterState*)0)->next", |l| l.interp_next),
        ("((PyInterpreterState*)0)->threads.head", |l| {
            l.interp_threads_head
        }),
        ("((PyThreadState*)0)->next", |l| l.tstate_next),
        ("((PyThreadState*)0)->native_thread_id", |l| {
            l.tstate_native_thread_id
        }),
        ("((PyThreadState*)0)->cframe", |l| l.tstate_cframe),
        ("((_PyCFrame*)0)->current_frame", |l| {
            l.cframe_current_frame.unwrap()
        }),
        ("((_PyInterpreterFrame*)0)->f_code", |l| l.frame_code),
        ("((_PyInterpreterFrame*)0)->previous", |l| l.frame_previous),
        ("((_PyInterpreterFrame*)0)->prev_instr", |l| {
            l.frame_prev_instr
        }),
        ("((_PyInterpreterFrame*)0)->owner", |l| l.frame_owner),
        ("((PyCodeObject*)0)->co_name", |l| l.code_name),
        ("((PyCodeObject*)0)->co_qualname", |l| l.code_qualname),
        ("((PyCodeObject*)0)->co_filename", |l| l.code_filename),
        ("((PyCodeObject*)0)->co_firstlineno", |l| l.code_firstlineno),
        ("((PyCodeObject*)0)->co_linetable", |l| l.code_linetable),
        ("((PyCodeObject*)0)->co_code_adaptive", |l| {
            l.code_code_adaptive
        }),
        ("sizeof(PyASCIIObject)", |l| l.ascii_size),
    ];
    for (version, layout) in [("3.11.7", &PY311), ("3.12.1", &PY312)] {
        let minor = version.rsplit_once('.').unwrap().0;
        let library = format!("/root/.pyenv/versions/{version}/lib/libpython{minor}.so.1.0");
        if !Path::new(&library).exists() {
            println!("skipped {version}: {library} is not installed");
            continue;
        }
        let mut expressions: Vec<String> = fields
            .iter()
            .map(|(field, _)| match field.strip_prefix("sizeof") {
                Some(_) => field.to_string(),
                None => format!("(unsigned long)&{field}"),
            })
            .collect();
        expressions.push("sizeof(PyCompactUnicodeObject)".into());
        let mut wanted: Vec<u64> = fields.iter().map(|(_, get)| get(layout)).collect();
        wanted.push(layout.compact_size);
        if let Some(at) = layout.frame_is_entry {
            expressions.push("(unsigned long)&((_PyInterpreterFrame*)0)->is_entry".into());
            wanted.push(at);
        }
        if let Some(owner) = layout.cstack_owner {
            expressions.push("(int)FRAME_OWNED_BY_CSTACK".into());
            wanted.push(owner.into());
        }
        let mut gdb = Command::new("gdb");
        gdb.args(["-batch", "-nx", &library]);
        for expression in &expressions {
            gdb.args(["-ex", &format!("print {expression}")]);
        }
        let output = gdb.output().unwrap();
        let text = String::from_utf8_lossy(&output.stdout);
        let values: Vec<u64> = text
            .lines()
            .filter_map(|l| l.split_once(" = ").map(|(_, v)| v.trim().parse().unwrap()))
            .collect();
        assert_eq!(
            values.len(),
            expressions.len(),
            "{version}: gdb answered {text} {}",
            String::from_utf8_lossy(&output.stderr)
        );
        for ((expression, value), want) in expressions.iter().zip(&values).zip(&wanted) {
            assert_eq!(value, want, "{version}: {expression}");
        }
    }
}

/// `glass top` shows the same Python frames as the report (its live model is the
/// report's), and writes them into its `-o` file.
#[test]
fn top_shows_python_frames() {
    if !debian_311() {
        return;
    }
    let _guard = exclusive();
    let dir = scratch("py_top");
    let recording = dir.join("top.glass");
    // About 1.5 s: by_key holds 8% of the time, so a short run may not sample it.
    let rounds = python_split_rounds(DEBIAN_311, 1.5);
    let output = glass(&[
        "top",
        "--batch",
        "--interval",
        "0.5",
        "--limit",
        "500",
        "-F",
        "199",
        "-o",
        recording.to_str().unwrap(),
        "--",
        DEBIAN_311,
        script().to_str().unwrap(),
        &rounds,
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let table = stdout(&output);
    assert!(table.contains("work (python_split.py:12)"), "{table}");
    assert!(table.contains("by_key (python_split.py:31)"), "{table}");
    let stacks = folded(&recording, &[]);
    assert!(
        stacks
            .iter()
            .any(|(f, _)| f.iter().any(|f| is_py(f, "by_key"))),
        "{stacks:?}"
    );
}
