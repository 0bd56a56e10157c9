//! The symbol cache: a report keeps each module's symbol index by build id, the next
//! report names frames from it without reading DWARF, and exactly as it would have
//! from DWARF; a module whose files change (rebuilt, debug file installed or removed)
//! is indexed afresh; a cache that cannot be written costs nothing but time.

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::Command;

fn report_cached(cache: &str, recording: &Path, format: &str) -> String {
    let output = report_output(recording, &["--format", format], |command| {
        command.env("GLASS_SYMBOL_CACHE", cache);
    });
    stdout(&output)
}

fn build_id(binary: &Path) -> String {
    let notes = Command::new("readelf")
        .arg("-n")
        .arg(binary)
        .output()
        .unwrap();
    stdout(&notes)
        .lines()
        .find_map(|line| line.trim().strip_prefix("Build ID: ").map(str::to_string))
        .expect("the binary has a build id")
}

fn touch(path: &Path) {
    let file = std::fs::File::options().write(true).open(path).unwrap();
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
    file.set_modified(later).unwrap();
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn a_later_report_names_frames_from_the_index_exactly_as_from_dwarf() {
    let dir = scratch("symbol-cache-index");
    let split = compile(&dir, "split.c", "split", &[]);
    let recording = dir.join("split.glass");
    record(&recording, 499, &[split.to_str().unwrap(), "2000"]);
    let cache = dir.join("cache");
    let cache_arg = cache.to_str().unwrap();

    let without = report_cached("off", &recording, "folded");
    assert!(!dir.join("off").exists() && !Path::new("off").exists());
    let first = report_cached(cache_arg, &recording, "folded");
    assert_eq!(first, without, "the index names frames as DWARF does");
    assert!(first.contains("alpha;spin_units"), "{first}");
    let index_file = cache.join(build_id(&split));
    assert!(
        index_file.is_file(),
        "no index for split in {}",
        cache.display()
    );
    // Every module the samples ran in was indexed by the first report (side by side):
    // the program and libc (__libc_start_call_main is in every stack).
    let libc = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
    assert!(cache.join(build_id(libc)).is_file(), "no index for libc");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&cache).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700, "the cache directory is private");
    assert_eq!(report_cached(cache_arg, &recording, "folded"), first);
    assert_eq!(
        report_cached(cache_arg, &recording, "top"),
        report_cached("off", &recording, "top")
    );

    // The index is what names the frames: renamed in it, renamed in the report, while
    // the program's DWARF still says alpha.
    let bytes = std::fs::read(&index_file).unwrap();
    assert!(contains(&bytes, b"alpha"));
    let mut renamed = bytes.clone();
    for at in 0..renamed.len() - 4 {
        if &renamed[at..at + 5] == b"alpha" {
            renamed[at..at + 5].copy_from_slice(b"ALPHA");
        }
    }
    std::fs::write(&index_file, &renamed).unwrap();
    let from_index = report_cached(cache_arg, &recording, "folded");
    assert!(from_index.contains("ALPHA;spin_units") && !from_index.contains("alpha"));

    // The program changed on disk (even just its time): indexed afresh.
    touch(&split);
    assert_eq!(report_cached(cache_arg, &recording, "folded"), first);
    assert!(!contains(&std::fs::read(&index_file).unwrap(), b"ALPHA"));
}

#[test]
fn a_debug_file_installed_or_removed_after_a_report_changes_the_next() {
    let dir = scratch("symbol-cache-debuglink");
    let split = compile(&dir, "split.c", "split", &[]);
    let stored = dir.join("stored.debug");
    let run = |program: &str, args: &[&str]| {
        let status = Command::new(program).args(args).status().unwrap();
        assert!(status.success(), "{program} {args:?}");
    };
    let path = |p: &PathBuf| p.to_str().unwrap().to_string();
    run(
        "objcopy",
        &["--only-keep-debug", &path(&split), &path(&stored)],
    );
    run("strip", &[&path(&split)]);
    // The link names the debug file; it is looked for beside the program and in .debug/.
    let linked = dir.join("split.debug");
    std::fs::copy(&stored, &linked).unwrap();
    run(
        "objcopy",
        &["--add-gnu-debuglink", &path(&linked), &path(&split)],
    );
    std::fs::remove_file(&linked).unwrap();

    let recording = dir.join("split.glass");
    record(&recording, 499, &[split.to_str().unwrap(), "2000"]);
    let cache = dir.join("cache");
    let cache_arg = cache.to_str().unwrap();

    let stripped = report_cached(cache_arg, &recording, "folded");
    assert!(!stripped.contains("alpha"), "{stripped}");
    assert!(stripped.contains(";sub_"), "{stripped}");
    assert_eq!(report_cached(cache_arg, &recording, "folded"), stripped);

    std::fs::create_dir_all(dir.join(".debug")).unwrap();
    std::fs::copy(&stored, dir.join(".debug/split.debug")).unwrap();
    let installed = report_cached(cache_arg, &recording, "folded");
    assert!(installed.contains("alpha;spin_units"), "{installed}");
    assert_eq!(installed, report_cached("off", &recording, "folded"));

    std::fs::remove_file(dir.join(".debug/split.debug")).unwrap();
    assert_eq!(report_cached(cache_arg, &recording, "folded"), stripped);
}

#[test]
fn a_cache_that_cannot_be_written_only_costs_time() {
    let dir = scratch("symbol-cache-unwritable");
    let split = compile(&dir, "split.c", "split", &[]);
    let recording = dir.join("split.glass");
    record(&recording, 499, &[split.to_str().unwrap(), "1000"]);
    // A file where the directory should be.
    let blocked = dir.join("blocked");
    std::fs::write(&blocked, b"not a directory").unwrap();
    let cache = blocked.join("cache");
    let output = Command::new(GLASS)
        .args(["report", recording.to_str().unwrap(), "--format", "folded"])
        .env("GLASS_SYMBOL_CACHE", &cache)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(stderr(&output).is_empty(), "{}", stderr(&output));
    assert_eq!(stdout(&output), report_cached("off", &recording, "folded"));
}
