//! The packed form of a `glass trace` chunk. Raw call records are 8 bytes; a traced
//! program can make a hundred million a second, more than a disk takes, so the drain
//! packs them: per record one varint `delta << 2 | how`, where `delta` is the time since
//! the previous record (mod 2^44) and `how` says where the upper bits (kind, function)
//! come from: 0 the previous record's, 1 those of the record before it (an entry and
//! its exit alternate), 2 a varint that follows. A tiny function called in a loop packs
//! into about 2 bytes a record.

use crate::varint::{get_u64, put_u64};
use crate::TRACE_TIME_BITS;

const TIME_MASK: u64 = (1 << TRACE_TIME_BITS) - 1;

pub fn pack(words: &[u64], out: &mut Vec<u8>) {
    out.reserve(words.len() * 3);
    let (mut time, mut last, mut before) = (0u64, u64::MAX, u64::MAX);
    for &word in words {
        let low = word & TIME_MASK;
        let high = word >> TRACE_TIME_BITS;
        let delta = low.wrapping_sub(time) & TIME_MASK;
        time = low;
        if high == last {
            put_u64(out, delta << 2);
        } else if high == before {
            put_u64(out, delta << 2 | 1);
            before = last;
            last = high;
        } else {
            put_u64(out, delta << 2 | 2);
            put_u64(out, high);
            before = last;
            last = high;
        }
    }
}

pub fn unpack(bytes: &[u8], count: u64) -> Result<Vec<u64>, &'static str> {
    // Each record takes at least one byte, which bounds the allocation.
    if count > bytes.len() as u64 {
        return Err("packed record count out of range");
    }
    let mut words = Vec::with_capacity(count as usize);
    unpack_each(bytes, count, |word| words.push(word))?;
    Ok(words)
}

/// Decodes `count` packed records, passing each word to `each` as it is decoded (no
/// buffer: a report folds a chunk straight into its tables). On an error the words
/// before it have been passed.
#[inline]
pub fn unpack_each(
    bytes: &[u8],
    count: u64,
    mut each: impl FnMut(u64),
) -> Result<(), &'static str> {
    if count > bytes.len() as u64 {
        return Err("packed record count out of range");
    }
    let (mut time, mut last, mut before) = (0u64, u64::MAX, u64::MAX);
    let mut pos = 0;
    for _ in 0..count {
        let code = get_u64(bytes, &mut pos).ok_or("bad packed record")?;
        let delta = code >> 2;
        if delta > TIME_MASK {
            return Err("packed time delta out of range");
        }
        time = (time + delta) & TIME_MASK;
        match code & 3 {
            0 => {}
            1 => std::mem::swap(&mut last, &mut before),
            2 => {
                let high = get_u64(bytes, &mut pos).ok_or("bad packed record")?;
                before = last;
                last = high;
            }
            _ => return Err("bad packed record kind"),
        }
        if last >> (64 - TRACE_TIME_BITS) != 0 {
            return Err("packed record without its upper bits");
        }
        each(time | last << TRACE_TIME_BITS);
    }
    if pos != bytes.len() {
        return Err("trailing bytes in packed chunk");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_size() {
        let mut words = Vec::new();
        let mut t = (1u64 << 44) - 500; // crosses the 44-bit wrap
        for i in 0..10_000u64 {
            t += 17 + i % 5;
            let id = 3u64 << 2;
            words.push((t & TIME_MASK) | id << 44); // entry
            t += 9;
            words.push((t & TIME_MASK) | (id | 1) << 44); // exit
        }
        words.push(5 | (77u64 << 2 | 3) << 44);
        let mut packed = Vec::new();
        pack(&words, &mut packed);
        assert!(
            packed.len() < words.len() * 2 + 16,
            "{} bytes",
            packed.len()
        );
        assert_eq!(unpack(&packed, words.len() as u64).unwrap(), words);
        assert!(unpack(&packed, words.len() as u64 + 1).is_err());
        assert!(unpack(&packed[..packed.len() - 1], words.len() as u64).is_err());
    }
}
