//! glass-patch's AArch64 call-style trampolines (`aarch64_call`, the guest tracer's) run
//! for real: tests/aarch64/fixtures.S's C-callable functions, each starting with a
//! PC-relative instruction of another kind (and one signing its return address with
//! `paciasp`, one with a `bti c` landing pad), are compiled into an aarch64 program
//! that runs under qemu-aarch64 (user mode, `-cpu max`: PAC enforced). Each is patched
//! with one `B` to its trampoline, must return what it did unpatched, and its ring must
//! hold an entry and an exit record per call, paired by their slot, with the function's
//! id and time stamps that never go back; a ring too small drops and counts the rest.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use glass_patch::aarch64::{analyze, patch_words, to_bytes, Reach};
use glass_patch::aarch64_call::{build, room};
use glass_patch::call_trampoline::{Record, Ring};
use object::{Object, ObjectSection, ObjectSymbol};

/// Calls the harness makes of each fixture.
const CALLS: u64 = 8;

fn harness() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("aarch64_call");
    std::fs::create_dir_all(&dir).unwrap();
    let tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let binary = dir.join("harness");
    let out = Command::new("aarch64-linux-gnu-gcc")
        .args(["-O1", "-static", "-no-pie"])
        .arg(tests.join("aarch64_call/harness.c"))
        .arg(tests.join("aarch64/fixtures.S"))
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

/// The fixtures the harness calls as C functions: name -> (address, bytes).
fn fixtures(elf: &object::File) -> BTreeMap<String, (u64, Vec<u8>)> {
    let text = elf.section_by_name(".text").unwrap();
    let data = text.data().unwrap();
    elf.symbols()
        .filter(|s| s.name().is_ok_and(|n| n.starts_with("fx_")) && s.size() > 0)
        .filter(|s| {
            let name = s.name().unwrap();
            !name.ends_with("_call") && !["fx_b_target", "fx_bcond", "fx_bl"].contains(&name)
        })
        .map(|s| {
            let start = (s.address() - text.address()) as usize;
            let bytes = data[start..start + s.size() as usize].to_vec();
            (s.name().unwrap().to_string(), (s.address(), bytes))
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// What the harness printed of one fixture.
#[derive(Default, Debug)]
struct Run {
    ok: bool,
    head: u64,
    dropped: u64,
    records: Vec<Record>,
}

/// Patches every fixture (`capacity`: records in each ring) and runs the harness.
fn patch_and_run(harness: &Path, capacity: u64) -> (BTreeMap<String, Run>, Vec<String>) {
    let bytes = std::fs::read(harness).unwrap();
    let elf = object::File::parse(&*bytes).unwrap();
    let mut spec = String::new();
    let mut names = Vec::new();
    for (index, (name, (address, code))) in fixtures(&elf).iter().enumerate() {
        let trampoline = (address & !0xfff) + (64 << 20) + 0x2000 * index as u64;
        let plan = analyze(code, *address, Reach::Near).unwrap_or_else(|r| panic!("{name}: {r}"));
        let ring_at = trampoline + 0x1000;
        let ring = Ring {
            head: ring_at,
            tail: ring_at + 8,
            dropped: ring_at + 16,
            records: ring_at + 64,
            capacity,
        };
        let (code, moves) = build(&plan, index as u16, trampoline, &ring, false).unwrap();
        assert!(moves.is_empty(), "{name}: a near patch moves no vCPU");
        assert!(code.len() as u64 <= room(&plan), "{name}");
        let patch = to_bytes(&patch_words(&plan, trampoline).unwrap());
        writeln!(
            spec,
            "{name} {:x} {} {trampoline:x} {} {ring_at:x} {capacity}",
            plan.patch_at,
            hex(&patch),
            hex(&code)
        )
        .unwrap();
        names.push(name.clone());
    }
    let spec_path = harness.with_extension(format!("{capacity}.spec"));
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
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut runs: BTreeMap<String, Run> = BTreeMap::new();
    for line in stdout.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let run = runs.entry(fields[1].to_string()).or_default();
        let number = |i: usize, radix| u64::from_str_radix(fields[i], radix).unwrap();
        match fields[0] {
            "ring" => (run.head, run.dropped) = (number(2, 10), number(3, 10)),
            "rec" => run.records.push(
                Record::decode(number(2, 16), number(3, 16))
                    .unwrap_or_else(|| panic!("an unpublished record: {line}")),
            ),
            "ok" => run.ok = true,
            _ => panic!("{line}"),
        }
    }
    (runs, names)
}

#[test]
fn every_fixture_runs_through_its_call_trampoline_and_each_call_is_recorded() {
    let harness = harness();
    let (runs, names) = patch_and_run(&harness, 32);
    assert!(names.contains(&"fx_pac".to_string()) && names.contains(&"fx_bti".to_string()));
    for (id, name) in names.iter().enumerate() {
        let run = &runs[name];
        assert!(run.ok, "{name}: {run:?}");
        assert_eq!((run.head, run.dropped), (2 * CALLS, 0), "{name}");
        assert_eq!(run.records.len() as u64, 2 * CALLS, "{name}");
        for call in run.records.chunks(2) {
            let (entry, exit) = (call[0], call[1]);
            assert!(!entry.exit && exit.exit, "{name}: {call:?}");
            assert_eq!((entry.id, exit.id), (id as u16, id as u16), "{name}");
            // The slot is the stack pointer at the entry: the same for its exit, and an
            // address of the harness's stack.
            assert_eq!(entry.slot, exit.slot, "{name}");
            assert!(
                entry.slot > 0x1000 && entry.slot % 16 == 0,
                "{name}: {call:?}"
            );
        }
        assert!(
            run.records
                .windows(2)
                .all(|w| w[0].tsc <= w[1].tsc && w[0].tsc > 0),
            "{name}: {:?}",
            run.records
        );
    }
}

#[test]
fn a_full_ring_drops_and_counts_and_the_calls_go_on() {
    let (runs, names) = patch_and_run(&harness(), 4);
    for name in &names {
        let run = &runs[name];
        assert!(run.ok, "{name}: {run:?}");
        // The first two calls' records, then every record dropped.
        assert_eq!((run.head, run.dropped), (4, 2 * CALLS - 4), "{name}");
        assert_eq!(run.records.len(), 4, "{name}");
    }
}
