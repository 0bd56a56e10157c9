//! AArch64 patches run for real: tests/aarch64/fixtures.S's functions, each starting with
//! a PC-relative instruction of another kind, are compiled into an aarch64 program
//! (aarch64-linux-gnu-gcc) that runs under qemu-aarch64 (user mode, `-cpu max`: PAC
//! enforced). For each reach (one B; adrp/add/br x16; movz/movk/br x16) glass-patch plans
//! every fixture from the program's ELF, and the program writes the patches and the
//! trampolines (a call counter, then the relocated instructions and the jump back) into
//! itself and checks that every fixture returns what it did unpatched, through its
//! trampoline at every call. The verdicts of the fixtures that must be refused are
//! checked too, with their reasons.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use glass_patch::aarch64::{analyze, patch_words, relocated_body, to_bytes, Reach};
use glass_patch::Reason;
use object::{Object, ObjectSection, ObjectSymbol};

fn harness() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("aarch64_patch");
    std::fs::create_dir_all(&dir).unwrap();
    let sources = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/aarch64");
    let binary = dir.join("harness");
    let out = Command::new("aarch64-linux-gnu-gcc")
        .args(["-O1", "-static", "-no-pie"])
        .arg(sources.join("harness.c"))
        .arg(sources.join("fixtures.S"))
        .arg("-o")
        .arg(&binary)
        .output()
        .expect("aarch64-linux-gnu-gcc (./x test installs it)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    binary
}

/// The fixtures' code: name -> (address, bytes).
fn fixtures(elf: &object::File) -> BTreeMap<String, (u64, Vec<u8>)> {
    let text = elf.section_by_name(".text").unwrap();
    let data = text.data().unwrap();
    elf.symbols()
        .filter(|s| s.name().is_ok_and(|n| n.starts_with("fx_")) && s.size() > 0)
        .filter(|s| !s.name().unwrap().ends_with("_call") && s.name() != Ok("fx_b_target"))
        .map(|s| {
            let start = (s.address() - text.address()) as usize;
            let bytes = data[start..start + s.size() as usize].to_vec();
            (s.name().unwrap().to_string(), (s.address(), bytes))
        })
        .collect()
}

/// `adr x16, counter; ldr x17, [x16]; add x17, x17, #1; str x17, [x16]`, run at `at`.
fn count_calls(at: u64, counter: u64) -> Vec<u32> {
    let offset = counter.wrapping_sub(at) as u32;
    vec![
        0x1000_0010 | (offset & 3) << 29 | ((offset >> 2) & 0x7ffff) << 5,
        0xf940_0211,
        0x9100_0631,
        0xf900_0211,
    ]
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Plans every fixture for trampolines `distance` past the text, runs the harness with
/// the patches; returns the refusals.
fn patch_and_run(harness: &Path, distance: u64, reach: Reach) -> BTreeMap<String, Reason> {
    let bytes = std::fs::read(harness).unwrap();
    let elf = object::File::parse(&*bytes).unwrap();
    let mut spec = String::new();
    let mut refused = BTreeMap::new();
    let mut patched = Vec::new();
    for (index, (name, (address, code))) in fixtures(&elf).iter().enumerate() {
        let trampoline = (address & !0xfff) + distance + 0x1000 * index as u64;
        assert_eq!(Reach::between(*address, trampoline), reach, "{name}");
        let plan = match analyze(code, *address, reach) {
            Ok(plan) => plan,
            Err(reason) => {
                refused.insert(name.clone(), reason);
                continue;
            }
        };
        let counter = trampoline + 0xff8;
        let mut words = count_calls(trampoline, counter);
        let body_at = trampoline + 4 * words.len() as u64;
        let (body, moves) = relocated_body(&plan, body_at, false).unwrap();
        assert_eq!(moves.len(), plan.displaced.len());
        assert_eq!(moves[0], (plan.patch_at, body_at));
        words.extend(body);
        let patch = patch_words(&plan, trampoline).unwrap();
        assert_eq!(4 * patch.len() as u64, reach.bytes());
        writeln!(
            spec,
            "{name} {:x} {} {trampoline:x} {} {counter:x}",
            plan.patch_at,
            hex(&to_bytes(&patch)),
            hex(&to_bytes(&words))
        )
        .unwrap();
        patched.push(name.clone());
    }
    let spec_path = harness.with_extension(format!("{reach:?}.spec"));
    std::fs::write(&spec_path, &spec).unwrap();
    let out = Command::new("qemu-aarch64")
        .args(["-cpu", "max"])
        .arg(harness)
        .arg(&spec_path)
        .output()
        .expect("qemu-aarch64 (./x test installs qemu-user)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{reach:?}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for name in &patched {
        assert!(
            stdout.lines().any(|l| l == format!("ok {name}")),
            "{reach:?}: {name} not run: {stdout}"
        );
    }
    refused
}

#[test]
fn every_relocated_instruction_runs_as_it_did_at_every_reach() {
    let harness = harness();
    // One B: everything moves, the tail call and the call included.
    let near = patch_and_run(&harness, 64 << 20, Reach::Near);
    assert!(near.is_empty(), "{near:?}");
    // adrp/add/br x16, 12 bytes: a call or a jump among the displaced instructions
    // before the last, a branch into them, and x16 are refused.
    let page = patch_and_run(&harness, 1 << 30, Reach::Page);
    let far = patch_and_run(&harness, 8 << 30, Reach::Anywhere);
    for refused in [&page, &far] {
        assert!(
            matches!(refused.get("fx_loop"), Some(Reason::JumpIntoPatch { .. })),
            "{refused:?}"
        );
        assert!(
            matches!(refused.get("fx_b"), Some(Reason::TooShortFor { .. })),
            "{refused:?}"
        );
        for name in ["fx_x16", "fx_bl"] {
            assert!(
                matches!(refused.get(name), Some(Reason::Unrelocatable { .. })),
                "{name}: {refused:?}"
            );
        }
    }
    // fx_b's whole body is one instruction: too short for the longer patches. Nothing
    // else is refused.
    for (name, reason) in page.iter().chain(far.iter()) {
        assert!(
            ["fx_loop", "fx_x16", "fx_bl", "fx_b"].contains(&name.as_str()),
            "{name} refused: {reason}"
        );
    }
}

/// Every function of Debian's aarch64 libc gets a verdict at each reach, and each plan a
/// trampoline body; nearly all take the one-B patch.
#[test]
fn every_function_of_an_aarch64_libc_gets_a_verdict() {
    let path = Path::new("/usr/aarch64-linux-gnu/lib/libc.so.6");
    let bytes = std::fs::read(path).expect("libc6-arm64-cross (./x test installs it)");
    let elf = object::File::parse(&*bytes).unwrap();
    let functions = glass_patch::functions(&elf);
    assert!(functions.len() > 1000, "{} functions", functions.len());
    for reach in [Reach::Near, Reach::Page, Reach::Anywhere] {
        let mut planned = 0;
        let mut reasons: BTreeMap<&str, usize> = BTreeMap::new();
        for function in &functions {
            let Some(code) = glass_patch::function_bytes(&elf, function) else {
                continue;
            };
            match analyze(code, function.address, reach) {
                Ok(plan) => {
                    let trampoline = function.address + (64 << 20);
                    relocated_body(&plan, trampoline, false)
                        .unwrap_or_else(|e| panic!("{}: {e}", function.name));
                    planned += 1;
                }
                Err(reason) => *reasons.entry(reason.kind()).or_default() += 1,
            }
        }
        eprintln!(
            "{reach:?}: {planned} of {} planned; refused: {reasons:?}",
            functions.len()
        );
        let share = if reach == Reach::Near { 98 } else { 85 };
        assert!(
            planned * 100 >= functions.len() * share,
            "{reach:?}: {planned} of {}: {reasons:?}",
            functions.len()
        );
    }
}
