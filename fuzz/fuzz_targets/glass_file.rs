//! The `.glass` reader over arbitrary bytes (`glass report` and `glass info` open any
//! file they are given): no panic, overflow or runaway allocation, and every record read
//! is written back by the writer and read again unchanged. The streaming reader (what
//! `read_file` uses) reads the same as the whole-buffer one.
#![no_main]

use glass_format::{read_bytes, read_from, Reader, Record, TraceChunk, Writer, TRACE_PIECE};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(recording) = read_bytes(data) else {
        return;
    };
    // A whole file ends with its End record; one with damage may too (version 3 reads
    // on behind damaged blocks).
    assert!(recording.complete || recording.damage.is_some());
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
    // (The writer splits long call-record chunks into pieces, and writes none for a
    // chunk without words: it holds nothing.)
    let pieces: Vec<Record> = records
        .iter()
        .flat_map(|record| match record {
            Record::TraceChunk(chunk) if chunk.words.is_empty() => vec![],
            Record::TraceChunk(chunk) if chunk.words.len() > TRACE_PIECE => chunk
                .words
                .chunks(TRACE_PIECE)
                .map(|words| {
                    Record::TraceChunk(TraceChunk {
                        pid: chunk.pid,
                        tid: chunk.tid,
                        words: words.to_vec(),
                    })
                })
                .collect(),
            other => vec![other.clone()],
        })
        .collect();
    assert_eq!(again, pieces);
    let reread = read_bytes(&bytes).unwrap();
    assert_eq!(reread.complete, records.last() == Some(&Record::End));
    // Unless damaged blocks were read past, the records before the first damage are
    // all there is.
    if recording.damaged.iter().all(|d| d.ends_reading()) {
        assert_eq!(reread.samples, recording.samples);
        assert_eq!(reread.snapshots, recording.snapshots);
    }
});
