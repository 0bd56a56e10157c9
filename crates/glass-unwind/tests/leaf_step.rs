//! The leaf's CFI step, as glass remembers it per pc, against framehop's own, at every
//! address of real code: a program this test compiles with and without frame pointers
//! (prologues, epilogues, pushes and pops of callee-saved registers, a frame sized at run
//! time), and the C library it links (hand-written assembly, a signal trampoline whose CFA
//! is an expression).

mod common;

use std::path::Path;
use std::process::Command;

use glass_unwind::{DwarfUnwinder, UnwindRegs};
use object::{Object, ObjectSection};

const FIXTURE: &str = r#"
#include <alloca.h>
#include <string.h>
volatile unsigned long sink;
__attribute__((noinline)) unsigned long leaf(unsigned long x) { return x * 2654435761u ^ (x >> 7); }
__attribute__((noinline)) unsigned long saves(unsigned long a, unsigned long b, unsigned long c) {
    unsigned long r = 0;
    for (unsigned long i = 0; i < a; i++) r += leaf(i ^ b) + leaf(c + r);
    return r + a * b * c;
}
__attribute__((noinline)) unsigned long sized_at_run_time(unsigned long n) {
    char *buf = alloca(n + 16);
    memset(buf, (int)n, n + 16);
    return saves(buf[n], n, buf[3]);
}
__attribute__((noinline)) unsigned long many(unsigned long a, unsigned long b, unsigned long c,
                                             unsigned long d, unsigned long e, unsigned long f) {
    unsigned long x = leaf(a) + leaf(b), y = leaf(c) * leaf(d), z = leaf(e) - leaf(f);
    return sized_at_run_time(x & 63) + x * y + y * z + z * x;
}
int main(int argc, char **argv) {
    sink = many(argc, 2, 3, 4, 5, (unsigned long)argv);
    return 0;
}
"#;

fn compile(out: &Path, frame_pointers: bool) {
    let source = out.with_extension("c");
    std::fs::write(&source, FIXTURE).unwrap();
    let status = Command::new("gcc")
        .args(["-O2", "-g"])
        .arg(if frame_pointers {
            "-fno-omit-frame-pointer"
        } else {
            "-fomit-frame-pointer"
        })
        .arg(&source)
        .arg("-o")
        .arg(out)
        .status()
        .expect("gcc runs");
    assert!(status.success(), "gcc failed");
}

/// A made-up stack word per address (the same each time it is read).
fn word(address: u64) -> u64 {
    let mut z = address.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Compares the remembered step with framehop's at every `stride`-th address of the
/// file's executable segment, loaded at `base`; returns how many addresses framehop
/// stepped from.
fn compare(file: &Path, base: u64, stride: u64) -> usize {
    let bytes = std::fs::read(file).unwrap();
    let elf = object::File::parse(&*bytes).unwrap();
    let (address, end, offset) = common::executable_segment(&bytes);
    let text = elf.section_by_name(".text").unwrap();
    let bias = base - address;
    let mut unwinder = DwarfUnwinder::new();
    unwinder
        .add_module_bytes(
            &file.to_string_lossy(),
            &bytes,
            base,
            base + (end - address),
            offset,
        )
        .unwrap();
    let mut stepped = 0;
    let mut address = text.address();
    while address < text.address() + text.size() {
        let ip = address + bias;
        // A frame record above the stack pointer, words made up, and stack words that
        // are unreadable outside a window (so that failures are compared too).
        let sp = 0x7fff_0000_1000 + (address & 0xf8);
        for fp in [sp + 0x40, sp - 0x40, 0] {
            let regs = UnwindRegs::new(ip, sp, fp);
            let mut read = |a: u64| (a >= sp - 0x100 && a < sp + 0x1000).then(|| word(a));
            let expected = unwinder.framehop_leaf_step(regs, &mut read);
            // Twice: the first finds and remembers the step, the second takes it.
            for round in 0..2 {
                let got = unwinder.caller_of_leaf(regs, &mut read);
                assert_eq!(
                    got,
                    expected,
                    "{}: pc {:#x} (file {address:#x}), bp {fp:#x}, round {round}",
                    file.display(),
                    ip
                );
            }
            stepped += usize::from(expected.is_some());
        }
        address += stride;
    }
    stepped
}

#[test]
fn each_remembered_leaf_step_is_framehops_at_every_address() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("leaf_step");
    std::fs::create_dir_all(&dir).unwrap();
    for frame_pointers in [true, false] {
        let program = dir.join(if frame_pointers { "fp" } else { "nofp" });
        compile(&program, frame_pointers);
        let stepped = compare(&program, 0x5555_5555_4000, 1);
        assert!(stepped > 100, "{}: only {stepped} steps", program.display());
    }
    // The C library the program links (every seventh address: its text is large).
    let output = Command::new("gcc")
        .arg("-print-file-name=libc.so.6")
        .output()
        .expect("gcc runs");
    let libc = String::from_utf8(output.stdout).unwrap();
    let libc = std::fs::canonicalize(libc.trim()).unwrap();
    let stepped = compare(&libc, 0x7f00_0000_0000, 7);
    assert!(stepped > 5_000, "libc: only {stepped} steps");
}
