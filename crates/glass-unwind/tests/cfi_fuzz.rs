//! Fuzzes the CFI path glass feeds to the unwinder: a real ELF (this test binary) whose
//! `.eh_frame` and `.eh_frame_hdr` bytes are mutated at random, unwinding random
//! registers over random stack bytes. The unwinder returns a truncated walk, never
//! panics or loops.

use std::sync::OnceLock;

use glass_unwind::{DwarfUnwinder, UnwindRegs};
use object::{Object, ObjectSection};
use proptest::prelude::*;

struct Elf {
    bytes: Vec<u8>,
    /// File ranges of the unwind sections.
    cfi: Vec<std::ops::Range<usize>>,
    text: std::ops::Range<u64>,
}

fn elf() -> &'static Elf {
    static ELF: OnceLock<Elf> = OnceLock::new();
    ELF.get_or_init(|| {
        let bytes = std::fs::read("/proc/self/exe").unwrap();
        let file = object::File::parse(&*bytes).unwrap();
        let cfi = [".eh_frame", ".eh_frame_hdr"]
            .iter()
            .filter_map(|name| file.section_by_name(name))
            .filter_map(|s| s.file_range())
            .map(|(offset, size)| offset as usize..(offset + size) as usize)
            .collect();
        let text = file.section_by_name(".text").unwrap();
        let text = text.address()..text.address() + text.size();
        Elf { bytes, cfi, text }
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(150))]

    #[test]
    fn mutated_cfi_never_panics(
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..64),
        pc_offset in any::<u64>(),
        sp in any::<u64>(),
        fp in any::<u64>(),
        stack in proptest::collection::vec(any::<u64>(), 0..256),
    ) {
        let elf = elf();
        let mut bytes = elf.bytes.clone();
        for (at, value) in flips {
            let range = &elf.cfi[at % elf.cfi.len()];
            let at = range.start + (at / elf.cfi.len()) % range.len().max(1);
            bytes[at] = value;
        }
        // Map the file where a PIE would land, with the text's file offset unchanged.
        let base = 0x5555_0000_0000u64;
        let mut unwinder = DwarfUnwinder::new();
        let added = unwinder.add_module_bytes("fuzzed", &bytes, base, base + (64 << 20), 0);
        let pc = base + elf.text.start + pc_offset % (elf.text.end - elf.text.start).max(1);
        let sp = sp & !7;
        let mut read = |address: u64| -> Option<u64> {
            let index = usize::try_from(address.checked_sub(sp)? / 8).ok()?;
            stack.get(index).copied()
        };
        let mut frames = Vec::new();
        let _ = unwinder.walk(UnwindRegs::new(pc, sp, fp), &mut read, 512, &mut frames);
        prop_assert!(frames.len() <= 512);
        let _ = added;
    }
}
