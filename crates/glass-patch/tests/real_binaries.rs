//! The patchability analysis over every function of real binaries: a fixture compiled
//! here (with known verdicts) and programs of this machine. It must decide for every
//! function, never panic, and accept most of them.

use std::collections::BTreeMap;
use std::path::Path;

use glass_patch::{analyze, function_bytes, functions, Reason};

fn verdicts(path: &Path) -> (BTreeMap<String, Result<u64, Reason>>, usize) {
    let bytes = std::fs::read(path).unwrap();
    let elf = object::File::parse(&*bytes).unwrap();
    let mut out = BTreeMap::new();
    let found = functions(&elf);
    for function in &found {
        let Some(code) = function_bytes(&elf, function) else {
            continue;
        };
        out.insert(
            function.name.clone(),
            analyze(code, function.address).map(|plan| plan.displaced),
        );
    }
    (out, found.len())
}

#[test]
fn known_verdicts_on_a_compiled_fixture() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("patch_fixture");
    std::fs::create_dir_all(&dir).unwrap();
    let binary = dir.join("leaves");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/leaves.c");
    let status = std::process::Command::new("gcc")
        .args(["-O2", "-g"])
        .arg(&source)
        .arg("-o")
        .arg(&binary)
        .status()
        .unwrap();
    assert!(status.success());
    let (verdicts, _) = verdicts(&binary);
    // `lea 0x3(%rdi),%rax; ret` is 5 bytes: the whole function moves to the trampoline.
    assert!(verdicts["tiny_add"].is_ok(), "{:?}", verdicts["tiny_add"]);
    assert!(verdicts["leaf_sum"].is_ok(), "{:?}", verdicts["leaf_sum"]);
    assert!(
        verdicts["run_leaves"].is_ok(),
        "{:?}",
        verdicts["run_leaves"]
    );
    assert!(verdicts["main"].is_ok(), "{:?}", verdicts["main"]);
}

#[test]
fn programs_of_this_machine_are_mostly_patchable() {
    // This test program (Rust), the interpreter's library where the machine's Python
    // has one (pyenv builds keep their symbols), and stripped distribution programs,
    // whose local functions come from their .eh_frame.
    let python = std::process::Command::new("python3")
        .args([
            "-c",
            "import sys, sysconfig; print(sysconfig.get_config_var('LIBDIR') or '')",
        ])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let me = std::fs::read_link("/proc/self/exe").unwrap();
    let candidates = [
        me.to_string_lossy().into_owned(),
        format!("{python}/libpython3.11.so.1.0"),
        "/usr/bin/xz".to_string(),
        "/usr/bin/gzip".to_string(),
    ];
    let mut checked = 0;
    for program in candidates.iter().map(String::as_str) {
        let path = Path::new(program);
        if !path.exists() {
            continue;
        }
        checked += 1;
        let (verdicts, total) = verdicts(path);
        let patchable = verdicts.values().filter(|v| v.is_ok()).count();
        let mut reasons: BTreeMap<&str, usize> = BTreeMap::new();
        for verdict in verdicts.values() {
            if let Err(reason) = verdict {
                let kind = reason.kind();
                *reasons.entry(kind).or_insert(0) += 1;
            }
        }
        eprintln!("{program}: {total} functions, {patchable} patchable, skipped {reasons:?}");
        assert!(total > 0, "{program}: no functions found");
        assert!(
            patchable * 10 >= verdicts.len() * 8,
            "{program}: only {patchable} of {} patchable ({reasons:?})",
            verdicts.len()
        );
    }
    assert!(checked >= 3, "only {checked} binaries found");
}

#[test]
fn the_c_library_names_a_function_as_its_callers_do() {
    // The C library this test runs with: it exports functions under several names.
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let libc = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|path| {
            Path::new(path)
                .file_name()
                .is_some_and(|f| f.to_string_lossy().starts_with("libc.so"))
        })
        .expect("this test links the C library");
    let bytes = std::fs::read(libc).unwrap();
    let elf = object::File::parse(&*bytes).unwrap();
    let found = functions(&elf);
    let aliases = glass_patch::function_aliases(&elf);
    let named = |name: &str| {
        found
            .iter()
            .find(|f| f.name == name)
            .unwrap_or_else(|| panic!("{libc}: no function named {name}"))
            .address
    };
    // perf's choice among aliases: strong and global, fewer leading underscores.
    let malloc = named("malloc");
    assert!(
        aliases[&malloc].iter().any(|a| a == "__libc_malloc"),
        "{:?}",
        aliases[&malloc]
    );
    assert!(!found.iter().any(|f| f.name == "__libc_malloc"));
    // `puts` is weak: the function is _IO_puts, and `puts` an alias of it.
    let puts = named("_IO_puts");
    assert!(
        aliases[&puts].iter().any(|a| a == "puts"),
        "{:?}",
        aliases[&puts]
    );
}
