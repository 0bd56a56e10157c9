//! The block-streaming reader (`read_file`, `stream::Stream`) reads exactly what the
//! whole-buffer reader (`read_bytes`) reads: records that straddle its blocks, records
//! larger than a block, files cut at any of those places, damaged chunk bodies, and an
//! input that hands out one byte per read.

use std::io::Read;

use glass_format::stream::{Item, Stream, BLOCK_LEN};
use glass_format::*;

/// Trace chunks of `words` words each (packed), samples between them, until `bytes`.
fn big_file(bytes: usize, words: usize) -> Vec<u8> {
    let mut file = big_file_without_end(bytes, words);
    file.extend_from_slice(&end_block());
    file
}

/// The blocks of a file holding only the End record (no header).
fn end_block() -> Vec<u8> {
    let mut writer = Writer::new(Vec::new()).unwrap();
    writer.write(&Record::End).unwrap();
    writer.into_inner()[HEADER_LEN..].to_vec()
}

fn big_file_without_end(bytes: usize, words: usize) -> Vec<u8> {
    let mut writer = Writer::new(Vec::new()).unwrap();
    writer
        .write(&Record::Meta(Meta {
            backend: Backend::Trace,
            ..Meta::default()
        }))
        .unwrap();
    let mut time = 0u64;
    let mut chunk = 0u64;
    let mut written = 0;
    loop {
        written += words * 2 + 100;
        let words: Vec<u64> = (0..words as u64)
            .map(|i| {
                time += 1 + (i * 7919 + chunk) % 300;
                (time & ((1 << TRACE_TIME_BITS) - 1)) | ((i + chunk) % 5) << TRACE_TIME_BITS
            })
            .collect();
        writer
            .write(&Record::TraceChunk(TraceChunk {
                pid: 1,
                tid: 1 + (chunk % 3) as u32,
                words,
            }))
            .unwrap();
        writer
            .write(&Record::Sample(Sample {
                time_ns: chunk,
                pid: 1,
                tid: 1,
                stopped_ns: 0,
                flags: 0,
                frames: (0..(chunk % 50)).map(|f| 0x40_0000 + f * 0x10).collect(),
            }))
            .unwrap();
        chunk += 1;
        if written > bytes {
            break;
        }
    }
    writer.into_inner()
}

fn assert_same(a: &Recording, b: &Recording) {
    assert_eq!(a.meta, b.meta);
    assert_eq!(a.samples, b.samples);
    assert_eq!(a.trace_chunks, b.trace_chunks);
    assert_eq!(a.complete, b.complete);
    assert_eq!(a.damage, b.damage);
}

fn read_via_file(bytes: &[u8], name: &str) -> Recording {
    let path = std::env::temp_dir().join(format!("glass-stream-{}-{name}", std::process::id()));
    std::fs::write(&path, bytes).unwrap();
    let recording = read_file(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    recording
}

#[test]
fn blocks_are_invisible_in_what_is_read() {
    // Chunks of ~20 KB across 3 blocks, then one chunk larger than a block.
    let bytes = big_file(3 * BLOCK_LEN, 10_000);
    let whole = read_bytes(&bytes).unwrap();
    assert!(whole.complete && whole.damage.is_none());
    assert_same(&read_via_file(&bytes, "whole"), &whole);
    let huge = big_file(BLOCK_LEN, BLOCK_LEN);
    assert_same(&read_via_file(&huge, "huge"), &read_bytes(&huge).unwrap());

    // Cut around each block boundary and inside the big chunk.
    for cut in [
        BLOCK_LEN - 3,
        BLOCK_LEN + 2,
        2 * BLOCK_LEN - 1,
        2 * BLOCK_LEN + 4,
        bytes.len() - 1,
    ] {
        let cut_bytes = &bytes[..cut];
        let expected = read_bytes(cut_bytes).unwrap();
        assert!(matches!(
            expected.damage,
            Some(FormatError::Truncated { .. })
        ));
        assert_same(&read_via_file(cut_bytes, "cut"), &expected);
    }
    for cut in [BLOCK_LEN / 2, BLOCK_LEN + 100, huge.len() - 10] {
        assert_same(
            &read_via_file(&huge[..cut], "hugecut"),
            &read_bytes(&huge[..cut]).unwrap(),
        );
    }

    // A damaged body far in: the same records kept, the same damage reported, and the
    // blocks behind it read.
    let mut damaged = bytes.clone();
    let middle = 2 * BLOCK_LEN + 7;
    damaged[middle..middle + 12].fill(0xff);
    let expected = read_bytes(&damaged).unwrap();
    assert!(
        matches!(expected.damage, Some(FormatError::Damaged { .. })),
        "{:?}",
        expected.damage
    );
    assert!(expected.complete, "the blocks behind the damage are read");
    let records = |r: &Recording| r.samples.len() + r.trace_chunks.len();
    assert!(records(&expected) < records(&whole));
    assert!(records(&expected) + 6 >= records(&whole));
    assert!(expected.lost_bytes > 0 && expected.lost_bytes < 40 << 10);
    assert_same(&read_via_file(&damaged, "damaged"), &expected);
}

/// Hands out one byte per read.
struct Trickle<'a>(&'a [u8]);

impl Read for Trickle<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        match (self.0.split_first(), out.first_mut()) {
            (Some((&byte, rest)), Some(slot)) => {
                *slot = byte;
                self.0 = rest;
                Ok(1)
            }
            _ => Ok(0),
        }
    }
}

#[test]
fn short_reads_and_chunks_held_past_their_block() {
    let bytes = big_file(BLOCK_LEN + BLOCK_LEN / 2, 3000);
    let whole = read_bytes(&bytes).unwrap();
    // Every chunk kept (undecoded) until the end: each block stays alive with them and
    // the stream takes new ones.
    let mut held = Vec::new();
    let mut samples = 0;
    for item in Stream::new(Trickle(&bytes)).unwrap() {
        match item.unwrap() {
            Item::Trace(chunk) => held.push(chunk),
            Item::Record(Record::Sample(_)) => samples += 1,
            Item::Record(_) => {}
        }
    }
    assert_eq!(samples, whole.samples.len());
    let words: Vec<Vec<u64>> = held.iter().map(|c| c.words().unwrap()).collect();
    let expected: Vec<Vec<u64>> = whole.trace_chunks.iter().map(|c| c.words.clone()).collect();
    assert_eq!(words, expected);
    let mut count = 0;
    held[3].for_each_word(|_| count += 1).unwrap();
    assert_eq!(count, held[3].count);
}

#[test]
fn a_limited_pool_with_records_larger_than_a_block_does_not_wait_forever() {
    // Chunks alternately larger and smaller than a block, handed to a thread that
    // drops them after a while: the stream may wait for blocks, never for ever.
    let mut bytes = big_file_without_end(BLOCK_LEN / 2, 1000);
    let big = big_file_without_end(BLOCK_LEN, BLOCK_LEN);
    for _ in 0..3 {
        bytes.extend_from_slice(&big[HEADER_LEN..]);
        let small = big_file_without_end(3 * BLOCK_LEN, 20_000);
        bytes.extend_from_slice(&small[HEADER_LEN..]);
    }
    bytes.extend_from_slice(&end_block());
    let expected = read_bytes(&bytes).unwrap();
    assert!(expected.complete);
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let (to_worker, chunks) = std::sync::mpsc::sync_channel::<stream::TraceBytes>(4);
        let worker = std::thread::spawn(move || {
            let mut words = Vec::new();
            for chunk in chunks {
                words.push(chunk.words().unwrap());
            }
            words
        });
        let mut stream = Stream::new(&bytes[..]).unwrap();
        stream.limit_blocks(2);
        for item in stream {
            if let Item::Trace(chunk) = item.unwrap() {
                to_worker.send(chunk).unwrap();
            }
        }
        drop(to_worker);
        let _ = done.send(worker.join().unwrap());
    });
    let words = finished
        .recv_timeout(std::time::Duration::from_secs(120))
        .expect("the stream finished");
    let expected: Vec<Vec<u64>> = expected
        .trace_chunks
        .iter()
        .map(|c| c.words.clone())
        .collect();
    assert_eq!(words, expected);
}
