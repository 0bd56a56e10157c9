//! Stack compaction is lossless: over every sample of fixtures and of real programs on
//! this machine, the frames unwound from the compacted snapshot equal the frames unwound
//! from the full copy the kernel made.

mod common;
use common::*;

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use glass_target::launch::spawn_paused;
use glass_target::perf::{PerfRecord, PerfSampler};
use glass_unwind::snapshot::{compact, expand};
use glass_unwind::{DwarfUnwinder, UnwindRegs};

struct Captured {
    pid: u32,
    regs: UnwindRegs,
    stack: Vec<u8>,
}

/// Runs `argv` under the perf sampler and keeps every sample's full stack copy and the
/// executable mappings of every process.
/// Per process: (start, end, file offset, path) of each executable mapping.
type Mappings = HashMap<u32, Vec<(u64, u64, u64, String)>>;

fn capture(argv: &[&str]) -> (Vec<Captured>, Mappings) {
    let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
    let child = spawn_paused(&argv).expect("spawn");
    let pid = child.pid;
    let mut sampler = PerfSampler::open(&[pid], 999, 16384, true).expect("perf_event_open");
    child.release().expect("exec");
    let mut samples = Vec::new();
    let mut mappings: Mappings = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut exited = false;
    loop {
        sampler.drain(&mut |record| match record {
            PerfRecord::Sample {
                pid,
                ip,
                sp,
                fp,
                stack,
                ..
            } => samples.push(Captured {
                pid,
                regs: UnwindRegs::new(ip, sp, fp),
                stack: stack.to_vec(),
            }),
            PerfRecord::Mmap {
                pid,
                start,
                len,
                file_offset,
                executable: true,
                path,
                ..
            } => mappings.entry(pid).or_default().push((
                start,
                start + len,
                file_offset,
                path.to_string(),
            )),
            _ => {}
        });
        if exited {
            break;
        }
        let mut status = 0;
        // SAFETY: waitpid on our own child.
        exited = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid;
        assert!(Instant::now() < deadline, "{argv:?} did not finish");
        std::thread::sleep(Duration::from_millis(5));
    }
    (samples, mappings)
}

/// Unwinds every sample from the full and from the compacted stack; returns how many
/// samples were compared and the total bytes before and after compaction.
fn assert_lossless(argv: &[&str]) -> (usize, usize, usize) {
    let (samples, mappings) = capture(argv);
    assert!(
        samples.len() > 100,
        "{argv:?}: only {} samples",
        samples.len()
    );
    let mut unwinders: HashMap<u32, DwarfUnwinder> = HashMap::new();
    let (mut full_bytes, mut compact_bytes) = (0, 0);
    for sample in &samples {
        let maps = mappings.get(&sample.pid).cloned().unwrap_or_default();
        let unwinder = unwinders.entry(sample.pid).or_insert_with(|| {
            let mut unwinder = DwarfUnwinder::new();
            for (start, end, offset, path) in &maps {
                if path.starts_with('/') {
                    let _ = unwinder.add_module(Path::new(path), *start, *end, *offset);
                }
            }
            unwinder
        });
        // The words an unwind reads: the recorder keeps those of its own unwind.
        let unwind = |unwinder: &mut DwarfUnwinder, stack: &[u8], read_words: &mut Vec<usize>| {
            let sp = sample.regs.sp;
            let mut read = |address: u64| -> Option<u64> {
                let offset = usize::try_from(address.checked_sub(sp)?).ok()?;
                read_words.push(offset / 8);
                if offset % 8 != 0 {
                    read_words.push(offset / 8 + 1);
                }
                Some(u64::from_le_bytes(
                    stack.get(offset..offset + 8)?.try_into().ok()?,
                ))
            };
            let mut frames = Vec::new();
            let end = unwinder.walk(sample.regs, &mut read, 512, &mut frames);
            (frames, end)
        };
        let mut read_words = Vec::new();
        let full = unwind(unwinder, &sample.stack, &mut read_words);
        read_words.sort_unstable();
        read_words.dedup();
        let in_code = |value: u64| {
            maps.iter()
                .any(|(start, end, _, _)| value >= *start && value < *end)
        };
        // As the recorder does: nothing beyond the last word its unwind read.
        let reach = read_words.last().map_or(0, |&last| last + 1);
        let mut encoded = Vec::new();
        compact(
            &sample.stack,
            sample.regs.sp,
            &in_code,
            &read_words,
            reach,
            &mut encoded,
        );
        let mut expanded = Vec::new();
        expand(&encoded, &mut expanded).expect("expands");
        assert_eq!(expanded.len(), sample.stack.len() / 8 * 8);
        let compacted = unwind(unwinder, &expanded, &mut Vec::new());
        assert_eq!(full, compacted, "{argv:?}: frames differ after compaction");
        full_bytes += sample.stack.len();
        compact_bytes += encoded.len();
    }
    (samples.len(), full_bytes, compact_bytes)
}

#[test]
fn compaction_is_lossless_on_fixtures() {
    let _alone = exclusive();
    let dir = scratch("compaction_fixtures");
    let split = compile(&dir, "split.c", "split", &[]);
    let split_nofp = compile(&dir, "split.c", "split_nofp", &["-fomit-frame-pointer"]);
    let qsort = compile(&dir, "qsort.c", "qsort", &[]);
    let threads = compile(&dir, "threads.c", "threads", &["-pthread"]);
    let recursion = compile(&dir, "recursion.c", "recursion", &["-fomit-frame-pointer"]);
    for argv in [
        vec![split.to_str().unwrap(), "3000"],
        vec![split_nofp.to_str().unwrap(), "3000"],
        vec![qsort.to_str().unwrap(), "300"],
        vec![threads.to_str().unwrap(), "15000"],
        vec![recursion.to_str().unwrap(), "10000", "300"],
    ] {
        let (samples, full, compacted) = assert_lossless(&argv);
        // Deep recursion without frame pointers is mostly return addresses and the words
        // the unwinder reads: little to drop (about 55%); the other stacks halve.
        let most = if argv[0].ends_with("recursion") { 3 } else { 2 };
        assert!(
            compacted * most < full * (most - 1),
            "{argv:?}: {full} -> {compacted} bytes over {samples} samples"
        );
    }
}

#[test]
fn compaction_is_lossless_on_real_programs() {
    let _alone = exclusive();
    let dir = scratch("compaction_real");
    let python = ["/usr/bin/python3", "/usr/local/bin/python3"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .unwrap_or("python3");
    assert_lossless(&[
        python,
        "-c",
        "s = 0\nfor i in range(3_000_000): s += i * i % 7\nprint(s)",
    ]);
    // xz compressing a file of mixed text and noise.
    let input = dir.join("input.txt");
    let mut text = String::new();
    let mut x: u64 = 1;
    while text.len() < 6 << 20 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        text.push_str(&format!("line {} value {:x}\n", text.len(), x >> 40));
    }
    std::fs::write(&input, text).unwrap();
    assert_lossless(&[
        "/usr/bin/xz",
        "-6",
        "-k",
        "-f",
        "-T1",
        input.to_str().unwrap(),
    ]);
}
