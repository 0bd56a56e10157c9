//! Round trips, truncation at every byte, and a property-based fuzz of the reader over
//! random and mutated bytes: the reader returns errors, never panics.

use glass_format::*;
use proptest::prelude::*;

fn sample_records() -> Vec<Record> {
    vec![
        Record::Meta(Meta {
            start_unix_ns: 1_700_000_000_000_000_000,
            backend: glass_format::Backend::Ptrace,
            arch: glass_format::Arch::Aarch64,
            unwind: "fp".into(),
            frequency_hz: 999,
            max_depth: 512,
            target_pid: 4242,
            command: vec!["./prog".into(), "--flag".into(), "ünïcode".into()],
            hostname: "host".into(),
            glass_version: "0.1.0".into(),
            capture: "raw".into(),
        }),
        Record::Process(Process {
            time_ns: 5,
            pid: 4242,
            parent_pid: 1,
            kind: ProcessKind::Exec,
            name: "prog".into(),
        }),
        Record::Module(Module {
            time_ns: 6,
            pid: 4242,
            start: 0x5555_5555_4000,
            end: 0x5555_5555_9000,
            file_offset: 0x1000,
            build_id: vec![0xde, 0xad, 0xbe, 0xef],
            path: "/usr/bin/prog".into(),
        }),
        Record::Thread(Thread {
            time_ns: 7,
            pid: 4242,
            tid: 4243,
            name: "worker".into(),
        }),
        Record::Sample(Sample {
            time_ns: 1_000_000,
            pid: 4242,
            tid: 4243,
            stopped_ns: 12_345,
            flags: SAMPLE_TRUNCATED,
            frames: vec![
                0x5555_5555_5123,
                0x5555_5555_5001,
                0x7fff_f7a0_0000,
                0,
                u64::MAX,
            ],
        }),
        Record::Snapshot(Snapshot {
            time_ns: 2_000_000,
            pid: 4242,
            tid: 4243,
            stopped_ns: 0,
            flags: 0,
            ip: 0x5555_5555_5123,
            sp: 0x7ffd_0000_1000,
            fp: 0x7ffd_0000_1040,
            lr: 0x5555_5555_5000,
            stack: vec![3, 1, 2, 1, 2, 3, 4, 5, 6, 7, 8],
        }),
        Record::ThreadExit(ThreadExit {
            time_ns: 9,
            pid: 4242,
            tid: 4243,
        }),
        Record::Summary(Summary {
            duration_ns: 3_000_000_000,
            samples: 1,
            ticks: 1,
            threads: 2,
            processes: 1,
            missed_deadlines: 3,
            stopped_mean_ns: 10,
            stopped_p50_ns: 9,
            stopped_p99_ns: 20,
            stopped_max_ns: 30,
            stopped_total_ns: 10,
            lost_samples: 7,
            exit_status: -1,
        }),
        Record::ThreadLost(ThreadLost {
            pid: 4242,
            tid: 4243,
            count: 7,
        }),
        Record::GuestTask(GuestTask {
            time_ns: 1_000_500,
            pid: 1,
            tid: 2,
            task_pid: 312,
            task_tgid: 310,
            flags: glass_format::GUEST_TASK_KERNEL_THREAD,
            comm: "kworker/1:0".into(),
        }),
        Record::KernelSymbols(KernelSymbols {
            symbols: vec![
                KernelSymbol {
                    start: 0xffff_ffff_8100_0000,
                    len: 0x40,
                    name: "do_syscall_64".into(),
                    module: String::new(),
                },
                KernelSymbol {
                    start: 0xffff_ffff_c000_1000,
                    len: 0x100,
                    name: "ext4_file_read_iter".into(),
                    module: "ext4".into(),
                },
            ],
        }),
        Record::Note("the guest kernel's place (KASLR) was not found".into()),
        Record::GuestRam(GuestRam::Stub),
        Record::GuestRam(GuestRam::File {
            path: "/dev/shm/guest-ram".into(),
            bytes: 256 << 20,
        }),
        Record::GuestRam(GuestRam::Process {
            pid: 5151,
            blocks: 3,
            bytes: 128 << 20,
        }),
        Record::PyCode(PyCode {
            pid: 4242,
            id: 3,
            name: "Parser.parse".into(),
            file: "/usr/lib/python3.11/parse.py".into(),
            first_line: 120,
        }),
        Record::PyStack(PyStack {
            time_ns: 2_000_000,
            pid: 4242,
            tid: 4243,
            frames: vec![
                PyFrame {
                    code: 3,
                    line: 127,
                    entry: false,
                },
                PyFrame {
                    code: 0,
                    line: 0,
                    entry: true,
                },
            ],
        }),
        Record::End,
    ]
}

fn encode(records: &[Record]) -> Vec<u8> {
    let mut writer = Writer::new(Vec::new()).unwrap();
    for record in records {
        writer.write(record).unwrap();
    }
    writer.into_inner()
}

/// As a recorder writes: a flush (and so a block) after every record.
fn encode_flushed(records: &[Record]) -> Vec<u8> {
    let mut writer = Writer::new(Vec::new()).unwrap();
    for record in records {
        writer.write(record).unwrap();
        writer.flush().unwrap();
    }
    writer.into_inner()
}

/// A block as the writer frames it, around `records` (raw record bytes).
fn block(sequence: u32, records: &[u8]) -> Vec<u8> {
    let mut head = Vec::new();
    head.extend_from_slice(&BLOCK_MARKER);
    head.extend_from_slice(&sequence.to_le_bytes());
    head.extend_from_slice(&(records.len() as u32).to_le_bytes());
    let mut crc = crc32fast::Hasher::new();
    crc.update(&head[4..12]);
    crc.update(records);
    head.extend_from_slice(&crc.finalize().to_le_bytes());
    head.extend_from_slice(records);
    head
}

#[test]
fn every_record_round_trips() {
    let records = sample_records();
    let bytes = encode(&records);
    let decoded: Vec<Record> = Reader::new(&bytes).unwrap().map(Result::unwrap).collect();
    assert_eq!(decoded, records);
    let recording = read_bytes(&bytes).unwrap();
    assert!(recording.complete);
    assert!(recording.damage.is_none());
    assert_eq!(recording.samples.len(), 1);
    assert_eq!(recording.thread_lost.len(), 1);
    assert_eq!(recording.guest_tasks.len(), 1);
    assert_eq!(recording.guest_tasks[0].comm, "kworker/1:0");
    assert_eq!(recording.guest_tasks[0].task_pid, 312);
    // One per recording; the last written is the one kept.
    assert_eq!(
        recording.guest_ram.as_ref().unwrap().to_string(),
        "QEMU's own memory (pid 5151, its address space read with process_vm_readv: 128 MiB in 3 RAM blocks)"
    );
    let kernel = &recording.kernel_symbols;
    assert_eq!(
        kernel.find(0xffff_ffff_8100_0010).unwrap().name,
        "do_syscall_64"
    );
    assert_eq!(kernel.find(0xffff_ffff_c000_10ff).unwrap().module, "ext4");
    assert!(kernel.find(0xffff_ffff_8100_0040).is_none());
    assert!(kernel.find(0x1000).is_none());
}

#[test]
fn every_truncation_keeps_the_complete_prefix() {
    let records = sample_records();
    let bytes = encode_flushed(&records);
    // Where each record's block ends.
    let ends: Vec<usize> = (1..=records.len())
        .map(|n| encode_flushed(&records[..n]).len())
        .collect();
    for cut in 16..bytes.len() {
        let recording = read_bytes(&bytes[..cut]).unwrap();
        assert!(!recording.complete, "cut at {cut}");
        assert!(
            matches!(recording.damage, Some(FormatError::Truncated { .. })),
            "cut at {cut}: {:?}",
            recording.damage
        );
        assert_eq!(recording.damaged.len(), 1, "cut at {cut}");
        // Records are written in order, so the prefix holds every whole block.
        let whole = ends.iter().filter(|&&end| end <= cut).count();
        let read = Reader::new(&bytes[..cut])
            .unwrap()
            .filter(Result::is_ok)
            .count();
        assert_eq!(read, whole, "cut at {cut}");
    }
}

#[test]
fn rejects_foreign_files() {
    assert_eq!(read_bytes(b"").unwrap_err(), FormatError::NotGlass);
    assert_eq!(
        read_bytes(b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0").unwrap_err(),
        FormatError::NotGlass
    );
    // A newer version (its header's checksum matches it).
    let mut bytes = encode(&sample_records());
    bytes[8] = 99;
    let crc = crc32fast::hash(&bytes[..12]);
    bytes[12..16].copy_from_slice(&crc.to_le_bytes());
    assert_eq!(
        read_bytes(&bytes).unwrap_err(),
        FormatError::UnsupportedVersion(99)
    );
    // A damaged version byte: mended from the checksum, and reported.
    let mut bytes = encode(&sample_records());
    bytes[8] = 99;
    let recording = read_bytes(&bytes).unwrap();
    assert_eq!(recording.damage, Some(FormatError::HeaderDamaged));
    assert!(recording.complete);
}

#[test]
fn skips_unknown_record_kinds() {
    let mut bytes = encode(&sample_records()[..2]);
    bytes.extend_from_slice(&block(1, &[0x42, 3, 0, 0, 0, 1, 2, 3]));
    bytes.extend_from_slice(&block(2, &[0xff, 0, 0, 0, 0]));
    let recording = read_bytes(&bytes).unwrap();
    assert!(recording.complete);
    assert_eq!(recording.processes.len(), 1);
}

/// Every byte of a file flipped in turn: the damage is always found (nothing passes as
/// whole), and every block but the damaged one is kept.
#[test]
fn every_flipped_byte_is_found_and_costs_one_block() {
    let records = sample_records();
    let bytes = encode_flushed(&records);
    let whole = read_bytes(&bytes).unwrap();
    let kept = |r: &Recording| {
        r.processes.len()
            + r.modules.len()
            + r.threads.len()
            + r.samples.len()
            + r.snapshots.len()
            + r.meta.is_some() as usize
            + r.summary.is_some() as usize
            + r.complete as usize
    };
    let all = kept(&whole);
    for at in 0..bytes.len() {
        for mask in [0x01u8, 0x80, 0xff] {
            let mut mutated = bytes.clone();
            mutated[at] ^= mask;
            // (A damaged header is mended from its checksum.)
            let recording = read_bytes(&mutated).unwrap();
            assert!(
                recording.damage.is_some(),
                "byte {at} ^ {mask:#x} passed as whole"
            );
            if at >= HEADER_LEN {
                assert!(
                    kept(&recording) + 1 >= all,
                    "byte {at}: {:?}",
                    recording.damaged
                );
                assert!(recording.lost_bytes > 0 || !recording.complete, "byte {at}");
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_bytes_never_panic(tail in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut bytes = encode(&[]);
        bytes.extend_from_slice(&tail);
        let _ = read_bytes(&bytes);
        let _ = read_bytes(&tail);
    }

    #[test]
    fn mutated_files_never_panic(
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
        cut in any::<usize>(),
    ) {
        let mut bytes = encode(&sample_records());
        for (at, value) in flips {
            let at = HEADER_LEN + at % (bytes.len() - HEADER_LEN);
            bytes[at] = value;
        }
        let cut = HEADER_LEN + cut % (bytes.len() - HEADER_LEN + 1);
        if let Ok(recording) = read_bytes(&bytes[..cut]) {
            // Whatever was read must be internally sane: no sample with an absurd frame count.
            for sample in &recording.samples {
                prop_assert!(sample.frames.len() <= bytes.len());
            }
        }
    }
}

/// A file whose last block was written in part (a full disk): `seal` cuts it after the
/// last whole block and ends it there with the records given, and a whole file is left
/// as it is.
#[test]
fn seal_ends_a_file_after_its_last_whole_block() {
    let records = sample_records();
    let whole = encode_flushed(&records[..records.len() - 1]);
    let path = std::env::temp_dir().join(format!("glass-seal-{}", std::process::id()));
    for cut in [whole.len() - 3, whole.len() - 40, HEADER_LEN + 20] {
        std::fs::write(&path, &whole[..cut]).unwrap();
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        let summary = Record::Summary(Summary {
            samples: 7,
            ..Summary::default()
        });
        let sealed = seal(&file, std::slice::from_ref(&summary)).unwrap();
        let before = read_bytes(&whole[..cut]).unwrap();
        let after = read_file(&path).unwrap();
        assert!(
            after.complete && after.damage.is_none(),
            "cut {cut}: {:?}",
            after.damage
        );
        assert_eq!(after.samples, before.samples, "cut {cut}");
        assert_eq!(after.modules, before.modules, "cut {cut}");
        assert_eq!(after.summary.as_ref().map(|s| s.samples), Some(7));
        assert_eq!(sealed.bytes, std::fs::metadata(&path).unwrap().len());
        assert!(sealed.cut > 0, "cut {cut}");
        // Sealing again changes nothing.
        let again = seal(&file, &[]).unwrap();
        assert_eq!((again.bytes, again.cut), (sealed.bytes, 0));
    }
    std::fs::remove_file(&path).unwrap();
}
