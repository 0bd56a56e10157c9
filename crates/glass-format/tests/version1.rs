//! Files written by glass before format version 2 (no architecture in the meta record,
//! no link register in snapshots) still read, as x86-64 recordings; version 2 files
//! carry both. The version 1 bytes are laid out here by hand, as docs/format.md's
//! version 1 describes them, so the test does not depend on the current writer.

use glass_format::{read_bytes, Arch, Backend, Record, Snapshot, Writer};

fn leb(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn text(out: &mut Vec<u8>, value: &str) {
    leb(out, value.len() as u64);
    out.extend_from_slice(value.as_bytes());
}

fn record(file: &mut Vec<u8>, tag: u8, payload: &[u8]) {
    file.push(tag);
    file.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    file.extend_from_slice(payload);
}

#[test]
fn version_1_files_read_as_x86_64_without_a_link_register() {
    let mut file = b"GLASSREC".to_vec();
    file.extend_from_slice(&1u32.to_le_bytes());
    file.extend_from_slice(&[0; 4]);
    let mut meta = Vec::new();
    leb(&mut meta, 1_700_000_000_000_000_000);
    text(&mut meta, "ptrace");
    text(&mut meta, "fp");
    for value in [999, 512, 4242, 0] {
        leb(&mut meta, value);
    }
    for value in ["host", "0.1.0", "raw"] {
        text(&mut meta, value);
    }
    record(&mut file, 1, &meta);
    let mut snapshot = Vec::new();
    for value in [5_000, 4242, 4243, 120] {
        leb(&mut snapshot, value);
    }
    snapshot.push(0);
    for value in [0x40_1000u64, 0x7ffd_0000, 0x7ffd_0040] {
        leb(&mut snapshot, value);
    }
    leb(&mut snapshot, 3);
    snapshot.extend_from_slice(&[1, 2, 3]);
    record(&mut file, 8, &snapshot);
    record(&mut file, 0xff, &[]);

    let recording = read_bytes(&file).expect("a version 1 file reads");
    assert!(recording.complete, "{:?}", recording.damage);
    let meta = recording.meta.expect("meta");
    assert_eq!(meta.backend, Backend::Ptrace);
    assert_eq!(meta.arch, Arch::X86_64);
    assert_eq!(meta.capture, "raw");
    assert_eq!(
        recording.snapshots,
        vec![Snapshot {
            time_ns: 5_000,
            pid: 4242,
            tid: 4243,
            stopped_ns: 120,
            flags: 0,
            ip: 0x40_1000,
            sp: 0x7ffd_0000,
            fp: 0x7ffd_0040,
            lr: 0,
            stack: vec![1, 2, 3],
        }]
    );
}

#[test]
fn version_2_files_keep_the_architecture_and_the_link_register() {
    let mut bytes = Vec::new();
    let mut writer = Writer::new(&mut bytes).unwrap();
    let meta = glass_format::Meta {
        backend: Backend::GdbStub,
        arch: Arch::Aarch64,
        capture: "raw".into(),
        ..Default::default()
    };
    writer.write(&Record::Meta(meta.clone())).unwrap();
    let snapshot = Snapshot {
        time_ns: 1,
        pid: 1,
        tid: 2,
        stopped_ns: 3,
        flags: 0,
        ip: 0xffff_ff80_0008_1234,
        sp: 0xffff_ff80_0100_0000,
        fp: 0xffff_ff80_0100_0040,
        lr: 0xffff_ff80_0008_1000,
        stack: vec![9; 16],
    };
    writer.write(&Record::Snapshot(snapshot.clone())).unwrap();
    writer.end().unwrap();
    let recording = read_bytes(&bytes).unwrap();
    assert_eq!(recording.meta, Some(meta));
    assert_eq!(recording.snapshots, vec![snapshot]);
    // A backend this reader does not know keeps its name.
    assert_eq!(
        Backend::from_name("hyperv"),
        Backend::Other("hyperv".into())
    );
    assert_eq!(Backend::from_name("gdbstub"), Backend::GdbStub);
    assert_eq!(Backend::from_name("xen"), Backend::Xen);
    assert_eq!(Backend::Xen.name(), "xen");
}
