//! Lossless compaction of stack snapshots (seed 002's idea, made exact).
//!
//! An unwinder reads two kinds of words from a stack: return addresses (which point
//! into executable code) and saved frame pointers and CFA-relative slots (which point
//! into the stack itself). Every other word — locals, spilled integers, buffers — is
//! never read by an unwinder that recovers only the instruction, stack and frame
//! pointers. So the compacted copy keeps the words that point into executable mappings
//! or into the copied stack, replaces the rest with zeros, and run-length-encodes the
//! zeros. The stack's layout (every kept word at its offset) survives, and the frames
//! unwound from the compacted copy equal the frames unwound from the full copy; the
//! tests check that over every sample of real programs. One exception needs the caller:
//! where unwinding falls back on a frame-pointer guess, it can read a word that is
//! neither (a garbage "return address"); the recorder unwinds each snapshot anyway and
//! passes the words it read as `read_words`, which are kept too, so even the garbage is
//! reproduced exactly.
//!
//! Nothing above the last word that unwind read is kept (`reach`): the unwind ended
//! there, at the outermost frame, and what lies beyond — for a shallow stack, the
//! arrays of pointers to the arguments and environment strings, which point into the
//! stack — is never read. The copy keeps its length, so a read past the copy still
//! fails as it did.

/// Encodes `stack` (copied from `sp` upwards), keeping, below word index `reach`, the
/// words for which `keep` is true, words pointing into the stack itself, and the words
/// at the indices in `read_words` (sorted). Appends to `out`.
pub fn compact(
    stack: &[u8],
    sp: u64,
    keep: &dyn Fn(u64) -> bool,
    read_words: &[usize],
    reach: usize,
    out: &mut Vec<u8>,
) {
    let words = stack.len() / 8;
    let word = |i: usize| u64::from_le_bytes(stack[i * 8..i * 8 + 8].try_into().unwrap());
    // Into the copy: `sp + len` itself may pass 2^64 (a guest's stack pointer is any
    // value), so the offset from `sp` is compared instead.
    let into_stack = |value: u64| value.wrapping_sub(sp) < (words * 8) as u64;
    let kept_at = |i: usize| {
        let value = word(i);
        i < reach
            && value != 0
            && (into_stack(value) || keep(value) || read_words.binary_search(&i).is_ok())
    };
    put_varint(out, words as u64);
    let mut i = 0;
    while i < words {
        let zero_start = i;
        while i < words && !kept_at(i) {
            i += 1;
        }
        let literal_start = i;
        while i < words && kept_at(i) {
            i += 1;
        }
        put_varint(out, (literal_start - zero_start) as u64);
        put_varint(out, (i - literal_start) as u64);
        for j in literal_start..i {
            out.extend_from_slice(&word(j).to_le_bytes());
        }
    }
}

/// Decodes a compacted snapshot into the stack bytes it stands for. `None` if the
/// encoding is damaged.
pub fn expand(encoded: &[u8], out: &mut Vec<u8>) -> Option<()> {
    let mut pos = 0;
    let words = get_varint(encoded, &mut pos)? as usize;
    // Each word of output needs at least... nothing: a zero run is two bytes for any
    // length. Bound the allocation by a sane stack size instead.
    if words > (64 << 20) / 8 {
        return None;
    }
    out.clear();
    out.reserve(words * 8);
    while out.len() < words * 8 {
        let zeros = get_varint(encoded, &mut pos)? as usize;
        let literals = get_varint(encoded, &mut pos)? as usize;
        // Runs are counted from untrusted bytes: a sum that overflows is damage too.
        let run_bytes = zeros.checked_add(literals)?.checked_mul(8)?;
        if run_bytes > words * 8 - out.len() {
            return None;
        }
        out.resize(out.len() + zeros * 8, 0);
        let bytes = encoded.get(pos..pos.checked_add(literals * 8)?)?;
        out.extend_from_slice(bytes);
        pos += literals * 8;
        if zeros == 0 && literals == 0 {
            return None;
        }
    }
    Some(())
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn get_varint(bytes: &[u8], pos: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *bytes.get(*pos)?;
        *pos += 1;
        value |= ((byte & 0x7f) as u64) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_lengths_that_overflow_are_damage_not_a_panic() {
        // 4 words, then a zero run and a literal run whose sum times 8 overflows usize.
        let mut encoded = Vec::new();
        put_varint(&mut encoded, 4);
        put_varint(&mut encoded, 1);
        put_varint(&mut encoded, (usize::MAX / 8) as u64);
        let mut out = Vec::new();
        assert_eq!(expand(&encoded, &mut out), None);
        let mut encoded = Vec::new();
        put_varint(&mut encoded, 4);
        put_varint(&mut encoded, u64::MAX);
        put_varint(&mut encoded, 1);
        assert_eq!(expand(&encoded, &mut out), None);
    }

    #[test]
    fn a_stack_at_the_top_of_the_address_space_compacts() {
        // Found by fuzz/ (target snapshot): `sp + len` overflowed. Two words up to 2^64.
        let words = [u64::MAX - 7, 0x40_1000];
        let (back, _) = compact_and_expand(&words, u64::MAX - 15, &|_| false, &[]);
        assert_eq!(back, vec![u64::MAX - 7, 0]);
    }

    /// The words `compact` keeps of `words`, expanded again, and the encoding's length.
    fn compact_and_expand(
        words: &[u64],
        sp: u64,
        keep: &dyn Fn(u64) -> bool,
        read_words: &[usize],
    ) -> (Vec<u64>, usize) {
        let stack: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let mut encoded = Vec::new();
        compact(&stack, sp, keep, read_words, usize::MAX, &mut encoded);
        let mut expanded = Vec::new();
        expand(&encoded, &mut expanded).unwrap();
        let back = expanded
            .chunks(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        (back, encoded.len())
    }

    #[test]
    fn keeps_code_and_stack_pointers_and_zeroes_the_rest() {
        let sp = 0x7000_0000u64;
        let words = [
            0x1234u64,
            0x40_1000,
            sp + 64,
            0,
            0xdead_beef,
            0x40_2000,
            7,
            7,
            7,
        ];
        let keep = |v: u64| (0x40_0000..0x50_0000).contains(&v);
        let (back, encoded_len) = compact_and_expand(&words, sp, &keep, &[6]);
        assert!(encoded_len < words.len() * 8);
        assert_eq!(back, vec![0, 0x40_1000, sp + 64, 0, 0, 0x40_2000, 7, 0, 0]);
    }

    #[test]
    fn nothing_beyond_the_reach_is_kept_and_the_length_stays() {
        let sp = 0x7000_0000u64;
        // A return address, then the argument and environment pointers (into the stack).
        let words = [0x40_1000u64, 0x40_1004, sp + 48, sp + 56, sp + 64, 0];
        let keep = |v: u64| (0x40_0000..0x50_0000).contains(&v);
        let stack: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let mut encoded = Vec::new();
        compact(&stack, sp, &keep, &[0], 2, &mut encoded);
        let mut expanded = Vec::new();
        expand(&encoded, &mut expanded).unwrap();
        assert_eq!(expanded.len(), stack.len());
        assert_eq!(&expanded[..16], &stack[..16]);
        assert!(expanded[16..].iter().all(|&b| b == 0));
    }

    #[test]
    fn damaged_encodings_are_refused() {
        let mut out = Vec::new();
        assert!(expand(&[], &mut out).is_none());
        assert!(expand(&[4, 1, 1], &mut out).is_none());
        assert!(expand(
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
            &mut out
        )
        .is_none());
        assert!(expand(&[2, 0, 0], &mut out).is_none());
        assert!(expand(&[0], &mut out).is_some());
    }
}
