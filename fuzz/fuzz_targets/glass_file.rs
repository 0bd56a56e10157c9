//! The `.glass` reader over arbitrary bytes (`glass report` and `glass info` open any
//! file they are given): no panic, overflow or runaway allocation, and every record read
//! is written back by the writer and read again unchanged. The streaming reader (what
//! `read_file` uses) reads the same as the whole-buffer one.
#![no_main]

use glass_format::{read_bytes, read_from, Reader, Record, Writer};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(recording) = read_bytes(data) else {
        return;
    };
    assert_eq!(recording.complete, recording.damage.is_none());
    let streamed = read_from(data, data.len()).expect("the same header");
    assert_eq!(streamed.damage, recording.damage);
    assert_eq!(streamed.complete, recording.complete);
    assert_eq!(streamed.samples, recording.samples);
    assert_eq!(streamed.snapshots, recording.snapshots);
    assert_eq!(streamed.trace_chunks, recording.trace_chunks);
    assert_eq!(streamed.modules, recording.modules);
    for sample in &recording.samples {
        assert!(sample.frames.len() <= data.len());
    }
    // The records before the first damage, as the reader yields them.
    let records: Vec<Record> = Reader::new(data)
        .expect("read_bytes accepted the header")
        .map_while(Result::ok)
        .collect();
    let mut writer = Writer::new(Vec::new()).unwrap();
    for record in &records {
        writer.write(record).unwrap();
    }
    let bytes = writer.into_inner();
    let again: Vec<Record> = Reader::new(&bytes)
        .expect("the writer's header")
        .map(|record| record.expect("a record the writer wrote"))
        .collect();
    assert_eq!(again, records);
    let reread = read_bytes(&bytes).unwrap();
    assert_eq!(reread.complete, records.last() == Some(&Record::End));
    assert_eq!(reread.samples, recording.samples);
    assert_eq!(reread.snapshots, recording.snapshots);
});
