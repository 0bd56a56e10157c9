//! What the unwinder's tests on real linked images share.

use object::{Object, ObjectSegment, SegmentFlags};

/// The image's executable segment: (address, end, file offset).
pub fn executable_segment(bytes: &[u8]) -> (u64, u64, u64) {
    let elf = object::File::parse(bytes).unwrap();
    let segment = elf
        .segments()
        .find(|s| {
            matches!(s.flags(), SegmentFlags::Elf { p_flags, .. } if p_flags.0 & object::elf::PF_X.0 != 0)
        })
        .expect("an executable segment");
    (
        segment.address(),
        segment.address() + segment.size(),
        segment.file_range().0,
    )
}
