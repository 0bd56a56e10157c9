//! The symbol index names every address as addr2line does (the frames glass shows must
//! not depend on whether the symbol cache has the module): compared address by address
//! on DWARF of several kinds: a C program with inlining compiled here (DWARF 5, and 4),
//! this test's own Rust binary (namespaces, generics, deep inlining, cross-unit
//! origins), and libc's separate, compressed debug file when installed.

use std::path::{Path, PathBuf};
use std::process::Command;

use glass_symbols::index::{build, Lookup, SymbolIndex};

/// Every `stride`-th address of `[low, high)` and each range edge of the index: the
/// index's names against addr2line's. Returns the addresses compared.
fn compare(path: &str, stride: u64) -> usize {
    let bytes = build(path, &[], 2).expect("the index builds");
    let index = SymbolIndex::parse(&bytes[..]).expect("the index parses");
    let loader = addr2line::Loader::new(path).unwrap();
    let elf_bytes = std::fs::read(path).unwrap();
    let elf = object::File::parse(&*elf_bytes).unwrap();
    use object::{Object, ObjectSection};
    let text = elf.section_by_name(".text").expect(".text");
    let (low, high) = (text.address(), text.address() + text.size());
    let mut compared = 0;
    let mut mismatches = Vec::new();
    let mut address = low;
    while address < high {
        let mut expected = Vec::new();
        if let Ok(mut frames) = loader.find_frames(address) {
            while let Ok(Some(frame)) = frames.next() {
                if let Some(function) = frame.function.as_ref() {
                    if let Ok(name) = function.demangle() {
                        expected.push(name.into_owned());
                    }
                }
            }
        }
        expected.reverse();
        let found: Vec<String> = match index.lookup(address) {
            Lookup::Dwarf(names) => names.into_iter().map(str::to_string).collect(),
            Lookup::Symbol(_) | Lookup::None => Vec::new(),
        };
        if found != expected {
            mismatches.push(format!(
                "{address:#x}: index {found:?}, addr2line {expected:?}"
            ));
        }
        compared += 1;
        address += stride;
    }
    assert!(
        mismatches.is_empty(),
        "{path}: {} of {compared} addresses differ, e.g.\n{}",
        mismatches.len(),
        mismatches[..mismatches.len().min(12)].join("\n")
    );
    compared
}

const INLINING: &str = r#"
#include <stdlib.h>
static inline __attribute__((always_inline)) int leaf(int x) { return x * 3 + 1; }
static inline __attribute__((always_inline)) int middle(int x) { return leaf(x) ^ leaf(x + 1); }
__attribute__((noinline)) int outer(int x) { int s = 0; for (int i = 0; i < x; i++) s += middle(i); return s; }
static int helper(int x) { return x > 3 ? outer(x) : middle(x); }
int main(int argc, char **argv) { return helper(argc + (argv[1] ? atoi(argv[1]) : 0)) & 1; }
"#;

fn compile(dir: &Path, name: &str, flags: &[&str]) -> PathBuf {
    let source = dir.join("inlining.c");
    std::fs::write(&source, INLINING).unwrap();
    let binary = dir.join(name);
    let status = Command::new("gcc")
        .args(flags)
        .arg(&source)
        .arg("-o")
        .arg(&binary)
        .status()
        .unwrap();
    assert!(status.success());
    binary
}

#[test]
fn a_c_program_with_inlined_calls_is_named_as_addr2line_names_it() {
    let dir = std::env::temp_dir().join(format!("glass-index-c-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, flags) in [
        ("dwarf5", &["-O2", "-g"][..]),
        ("dwarf4", &["-O2", "-gdwarf-4"][..]),
        ("compressed", &["-O2", "-g", "-gz"][..]),
        ("O0", &["-O0", "-g"][..]),
    ] {
        let binary = compile(&dir, name, flags);
        let path = binary.to_str().unwrap();
        compare(path, 1);
        // The inlined calls are there, outermost first.
        if name != "O0" {
            let bytes = build(path, &[], 2).unwrap();
            let index = SymbolIndex::parse(&bytes[..]).unwrap();
            let chains: Vec<Vec<&str>> = (0..0x10000u64)
                .filter_map(|address| match index.lookup(address) {
                    Lookup::Dwarf(names) => Some(names),
                    _ => None,
                })
                .collect();
            assert!(
                chains.iter().any(|c| c.starts_with(&["outer", "middle"])),
                "{name}: {chains:?}"
            );
            assert!(
                chains
                    .iter()
                    .any(|c| c.ends_with(&["helper", "middle", "leaf"])),
                "{name}: {chains:?}"
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn rust_with_generics_and_deep_inlining_is_named_as_addr2line_names_it() {
    let me = std::env::current_exe().unwrap();
    let compared = compare(me.to_str().unwrap(), 13);
    assert!(compared > 10_000, "{compared}");
}

/// libc's separate debug file (libc6-dbg), where it is installed.
fn libc_debug_file() -> Option<String> {
    let build_id = glass_symbols::build_id(Path::new("/lib/x86_64-linux-gnu/libc.so.6"))?;
    let hex = glass_symbols::debuginfod::hex(&build_id);
    let debug = format!("/usr/lib/debug/.build-id/{}/{}.debug", &hex[..2], &hex[2..]);
    if !Path::new(&debug).is_file() {
        eprintln!("libc6-dbg not installed: {debug} missing, libc's part skipped");
        return None;
    }
    Some(debug)
}

#[test]
fn libc_separate_compressed_debug_file_is_named_as_addr2line_names_it() {
    // The debug file has no .text contents but the section headers: its addresses.
    if let Some(debug) = libc_debug_file() {
        compare(&debug, 3);
    }
}

#[test]
fn the_index_is_the_same_whatever_the_threads_that_walk_the_dwarf() {
    // This test's own binary (many units, cross-unit origins), and libc's debug file.
    let me = std::env::current_exe().unwrap();
    let mut files = vec![me.to_str().unwrap().to_string()];
    files.extend(libc_debug_file());
    for file in &files {
        let one = build(file, &[], 1).expect("the index builds");
        for threads in [2, 3, 8] {
            assert!(
                build(file, &[], threads).unwrap() == one,
                "{file}: {threads} threads built another index"
            );
        }
    }
}

#[test]
fn a_damaged_index_is_refused_or_still_answers_without_panicking() {
    let me = std::env::current_exe().unwrap();
    let bytes = build(me.to_str().unwrap(), &[(0x1000, 0x10, "first".into())], 2).unwrap();
    assert!(SymbolIndex::parse(&bytes[..]).is_some());
    for cut in [0, 7, 8, 40, 88, bytes.len() / 2, bytes.len() - 1] {
        assert!(SymbolIndex::parse(&bytes[..cut]).is_none(), "cut at {cut}");
    }
    let mut bad_magic = bytes.clone();
    bad_magic[0] ^= 1;
    assert!(SymbolIndex::parse(&bad_magic[..]).is_none());
    // Any byte changed: refused, or every reference still inside the file.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..300 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let mut damaged = bytes.clone();
        let at = (state % damaged.len() as u64) as usize;
        damaged[at] = damaged[at].wrapping_add(1 + (state >> 56) as u8 % 255);
        if let Some(index) = SymbolIndex::parse(&damaged[..]) {
            for address in (0..0x40_0000u64).step_by(0x101) {
                let _ = index.lookup(address);
            }
        }
    }
}

/// `GLASS_INDEX_COMPARE=FILE cargo test -p glass-symbols --test symbol_index -- --ignored`
/// compares the index with addr2line on any file (every address).
#[test]
#[ignore]
fn any_file_given_is_named_as_addr2line_names_it() {
    let path = std::env::var("GLASS_INDEX_COMPARE").expect("GLASS_INDEX_COMPARE=FILE");
    let started = std::time::Instant::now();
    let bytes = build(&path, &[], 2).expect("the index builds");
    eprintln!(
        "{path}: index of {} bytes built in {:?}",
        bytes.len(),
        started.elapsed()
    );
    eprintln!("{} addresses compared", compare(&path, 1));
}
