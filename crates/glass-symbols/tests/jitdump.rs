//! The jitdump reader on files it did not write: one from a small C "JIT"
//! (tests/fixtures/jit/jitgen.c, which writes the format by hand as runtimes do), one cut
//! short as a runtime still writing leaves it; and the writer's files read back.

use std::path::{Path, PathBuf};
use std::process::Command;

use glass_symbols::jit::{
    is_jitdump, parse_jitdump, JitDumpWriter, JitRecord, JitSymbols, JIT_CODE_LOAD,
};

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs jitgen for no time at all: it writes its dump and exits. Returns the dump's path,
/// the pid, the code's address and where jit_cold was loaded before it moved.
fn run_jitgen(dir: &Path) -> (PathBuf, u32, u64, u64) {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/jit/jitgen.c");
    let program = dir.join("jitgen");
    let status = Command::new("gcc")
        .args(["-O2", "-o"])
        .arg(&program)
        .arg(&source)
        .status()
        .expect("gcc runs");
    assert!(status.success());
    let output = Command::new(&program)
        .arg("0")
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(output.status.success());
    let line = String::from_utf8_lossy(&output.stdout).into_owned();
    // "pid P code A moved_from B dump PATH"
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(fields.len(), 8, "{line}");
    let pid: u32 = fields[1].parse().unwrap();
    let code = u64::from_str_radix(fields[3], 16).unwrap();
    let first = u64::from_str_radix(fields[5], 16).unwrap();
    (dir.join(fields[7]), pid, code, first)
}

#[cfg(target_arch = "x86_64")]
#[test]
fn jitdump_of_a_c_program_is_read_record_by_record() {
    let dir = scratch("jitdump_c");
    let (path, pid, code, first) = run_jitgen(&dir);
    let bytes = std::fs::read(&path).unwrap();
    assert!(is_jitdump(&bytes));
    let dump = parse_jitdump(&bytes).unwrap();
    assert_eq!(
        (dump.version, dump.pid, dump.elf_mach, dump.truncated),
        (1, pid, 62, false)
    );
    let loads: Vec<(u64, u64, &str, u64)> = dump
        .records
        .iter()
        .filter_map(|r| match r {
            JitRecord::CodeLoad(l) => {
                assert_eq!(l.pid, pid);
                Some((l.code_address, l.code_size, l.name.as_str(), l.code_index))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        loads,
        vec![
            (code, 0x200, "stale_fn", 0),
            (code, 0x20, "jit_hot", 1),
            (first, 0x20, "jit_cold", 2)
        ]
    );
    let moved = dump
        .records
        .iter()
        .find_map(|r| match r {
            JitRecord::CodeMove(m) => Some(m),
            _ => None,
        })
        .expect("a JIT_CODE_MOVE");
    assert_eq!(
        (
            moved.old_code_address,
            moved.new_code_address,
            moved.code_size,
            moved.code_index
        ),
        (first, code + 0x100, 0x20, 2)
    );
    let lines = dump
        .records
        .iter()
        .find_map(|r| match r {
            JitRecord::DebugInfo {
                code_address,
                entries,
                ..
            } => Some((*code_address, entries)),
            _ => None,
        })
        .expect("a JIT_CODE_DEBUG_INFO");
    assert_eq!(lines.0, code);
    let entries: Vec<(u64, u32, &str)> = lines
        .1
        .iter()
        .map(|e| (e.address, e.line, &*e.file))
        .collect();
    // The second entry's "\xff" file name repeats the first's.
    assert_eq!(
        entries,
        vec![(code, 10, "hot.js"), (code + 7, 11, "hot.js")]
    );
    assert!(matches!(dump.records.last(), Some(JitRecord::Close { .. })));
    assert_eq!(dump.records.len(), 6);

    // Names: later records override the parts of earlier ones they overlap; moved code
    // is named at its new address.
    let mut symbols = JitSymbols::new();
    symbols.add_file(&path).unwrap();
    let name = |address: u64| symbols.lookup(address).map(|(name, _)| name);
    assert_eq!(name(code), Some("jit_hot"));
    assert_eq!(name(code + 0x1f), Some("jit_hot"));
    assert_eq!(name(code + 0x20), Some("stale_fn"));
    assert_eq!(name(code + 0x100), Some("jit_cold"));
    assert_eq!(name(code + 0x11f), Some("jit_cold"));
    assert_eq!(name(code + 0x120), Some("stale_fn"));
    assert_eq!(name(code + 0x1ff), Some("stale_fn"));
    assert_eq!(name(code + 0x200), None);
    let file_name = path.file_name().unwrap().to_str().unwrap();
    assert_eq!(symbols.lookup(code).unwrap().1, file_name);

    // Cut inside the last full record: the records before it stay, marked truncated.
    let cut = &bytes[..bytes.len() - 20];
    let partial = parse_jitdump(cut).unwrap();
    assert!(partial.truncated);
    assert_eq!(partial.records[..], dump.records[..partial.records.len()]);
    assert!(partial.records.len() >= 4);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn written_dumps_read_back_and_bad_ones_are_refused() {
    let mut writer = JitDumpWriter::new(Vec::new(), 77, 62, 1).unwrap();
    let a = writer
        .code_load(2, 77, 78, 0x1000, &[0xc3; 16], "JS:*fib /x.js:1")
        .unwrap();
    writer
        .code_load(3, 77, 78, 0x1008, &[0x90; 4], "inner")
        .unwrap();
    writer.code_move(4, 77, 78, 0x1000, 0x5000, 16, a).unwrap();
    writer
        .debug_info(5, 0x5000, &[(0x5000, 3, "/x.js"), (0x5004, 4, "/y.js")])
        .unwrap();
    let bytes = writer.close(6).unwrap();
    let dump = parse_jitdump(&bytes).unwrap();
    assert_eq!(dump.pid, 77);
    assert_eq!(dump.records.len(), 5);
    let mut symbols = JitSymbols::new();
    symbols.add_jitdump(&dump, "jit-77.dump");
    let name = |address: u64| symbols.lookup(address).map(|(name, _)| name);
    assert_eq!(name(0x1000), Some("JS:*fib /x.js:1"));
    assert_eq!(name(0x1008), Some("inner"));
    assert_eq!(name(0x100b), Some("inner"));
    assert_eq!(name(0x100c), Some("JS:*fib /x.js:1"));
    assert_eq!(name(0x500f), Some("JS:*fib /x.js:1"));
    assert_eq!(name(0x5010), None);

    // Not a jitdump: a perf map is read as text instead.
    let mut symbols = JitSymbols::new();
    symbols
        .add_bytes(b"1000 10 first\n1004 4 second\n", "perf-1.map")
        .unwrap();
    assert_eq!(symbols.lookup(0x1005).unwrap(), ("second", "perf-1.map"));
    assert_eq!(symbols.lookup(0x1008).unwrap(), ("first", "perf-1.map"));

    // A record whose size cannot hold its fields ends the reading with an error.
    let mut bad = bytes[..40].to_vec();
    bad.extend_from_slice(&JIT_CODE_LOAD.to_ne_bytes());
    bad.extend_from_slice(&8u32.to_ne_bytes());
    bad.extend_from_slice(&[0; 8]);
    assert!(parse_jitdump(&bad).is_err());
    // A header alone is a valid, empty dump; less than a header is not.
    assert_eq!(parse_jitdump(&bytes[..40]).unwrap().records.len(), 0);
    assert!(parse_jitdump(&bytes[..20]).is_err());
    // Big-endian files (from another machine) are read too.
    let swapped: Vec<u8> = bytes[..40]
        .chunks(4)
        .enumerate()
        .flat_map(|(i, c)| {
            // u32 fields (0..6) swap alone; the two u64 fields are zero or small here.
            let mut c = c.to_vec();
            if i < 6 {
                c.reverse();
            }
            c
        })
        .collect();
    let header = parse_jitdump(&swapped).unwrap();
    assert!(header.big_endian);
    assert_eq!(header.pid, 77);
}

#[cfg(target_arch = "x86_64")]
#[test]
fn symbolizer_names_anonymous_code_from_the_jit_files_or_their_copy() {
    use glass_symbols::{ModuleRef, Symbolizer};
    let dir = scratch("jitdump_symbolizer");
    let (path, pid, code, _) = run_jitgen(&dir);
    let anon = ModuleRef {
        path: "[anon]",
        build_id: &[],
        start: code,
        file_offset: 0,
    };
    let function = |symbolizer: &mut Symbolizer, address: u64, is_return: bool| {
        let frames = symbolizer.symbolize_in(pid, &anon, address, is_return);
        assert_eq!(frames.len(), 1);
        (frames[0].function.clone(), frames[0].module.clone())
    };
    let dump_name = path.file_name().unwrap().to_str().unwrap().to_string();

    // Unregistered (jitgen's dump is in its working directory, not /tmp): offsets.
    // (Unless another process with this pid left JIT files in /tmp.)
    if glass_symbols::jit::default_files(pid).is_empty() {
        let mut symbolizer = Symbolizer::new();
        assert!(function(&mut symbolizer, code, false)
            .0
            .starts_with("[anon]+0x"));
    }
    // The recording's module list names the dump: the code is named from it.
    let mut symbolizer = Symbolizer::new();
    symbolizer.note_module(pid, "/usr/lib/libc.so.6");
    symbolizer.note_module(pid, path.to_str().unwrap());
    assert_eq!(
        function(&mut symbolizer, code + 4, false),
        ("jit_hot".to_string(), dump_name.clone())
    );
    // A return address just past jit_hot's end is the call at its end.
    assert_eq!(function(&mut symbolizer, code + 0x20, true).0, "jit_hot");
    assert_eq!(function(&mut symbolizer, code + 0x20, false).0, "stale_fn");
    // Another process's anonymous memory is not named from this one's files.
    let other = symbolizer.symbolize_in(pid + 1, &anon, code + 4, false);
    assert!(other[0].function.starts_with("[anon]+0x"));

    // The copy a recorder keeps (the process is gone: the dump found through `also`).
    let copy = glass_symbols::jit::snapshot(pid, std::slice::from_ref(&path)).expect("a snapshot");
    std::fs::remove_file(&path).unwrap();
    let mut symbolizer = Symbolizer::new();
    symbolizer.add_jit_bytes(pid, "recorded.map", copy.into_bytes());
    assert_eq!(
        function(&mut symbolizer, code + 0x104, false),
        ("jit_cold".to_string(), "recorded.map".to_string())
    );
    assert_eq!(function(&mut symbolizer, code + 0x80, false).0, "stale_fn");
    assert!(symbolizer.warnings.is_empty(), "{:?}", symbolizer.warnings);
    let _ = std::fs::remove_dir_all(&dir);
}
