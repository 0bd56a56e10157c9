//! Raw stack snapshot decoding (`glass report` of a `--capture raw` recording expands
//! each compacted stack): any encoding expands or is refused, with no panic or overflow
//! (a crafted snapshot once overflowed `(zeros + literals) * 8`). What expands compacts
//! and expands back: exactly when every word is kept, and otherwise to the kept words
//! at their offsets with zeros elsewhere.
//!
//! Input: the stack pointer (8 bytes, little-endian), one byte choosing which words the
//! compaction keeps, then the encoded snapshot as it is stored in the file.
#![no_main]

use glass_unwind::snapshot::{compact, expand};
use libfuzzer_sys::fuzz_target;

fn words(stack: &[u8]) -> Vec<u64> {
    stack
        .chunks_exact(8)
        .map(|w| u64::from_le_bytes(w.try_into().unwrap()))
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let mut stack = Vec::new();
    let Some((head, encoded)) = data.split_first_chunk::<9>() else {
        let _ = expand(data, &mut stack);
        return;
    };
    let sp = u64::from_le_bytes(head[..8].try_into().unwrap());
    let choice = head[8];
    if expand(encoded, &mut stack).is_none() {
        return;
    }
    assert!(stack.len().is_multiple_of(8));

    // Keeping everything is lossless.
    let mut compacted = Vec::new();
    compact(&stack, sp, &|_| true, &[], usize::MAX, &mut compacted);
    let mut back = Vec::new();
    expand(&compacted, &mut back).expect("expands what compact wrote");
    assert_eq!(back, stack);

    // Keeping some words below a reach: each one kept is unchanged, the rest (and all
    // beyond the reach) read as zero, and compacting the result again changes nothing.
    let modulus = u64::from(choice | 1);
    let keep = |value: u64| (value >> 4).is_multiple_of(modulus);
    let step = usize::from(choice >> 4) + 1;
    let read_words: Vec<usize> = (0..stack.len() / 8).step_by(step).collect();
    let reach = (stack.len() / 8).saturating_sub(usize::from(choice & 7));
    compacted.clear();
    compact(&stack, sp, &keep, &read_words, reach, &mut compacted);
    expand(&compacted, &mut back).expect("expands what compact wrote");
    assert_eq!(back.len(), stack.len());
    for (i, (&kept, &original)) in words(&back).iter().zip(&words(&stack)).enumerate() {
        assert!(kept == original || kept == 0);
        if i >= reach {
            assert_eq!(kept, 0);
        } else if keep(original) || read_words.contains(&i) {
            assert_eq!(kept, original);
        }
    }
    let mut again = Vec::new();
    compact(&back, sp, &keep, &read_words, reach, &mut again);
    let mut twice = Vec::new();
    expand(&again, &mut twice).expect("expands what compact wrote");
    assert_eq!(twice, back);
});
