//! Every CFI source of an image, per address, on real linked images: a freestanding
//! image (tests/fixtures/cfi/) whose `middle` has its CFI in `.eh_frame` and whose
//! `inner` and `outer` have theirs only in `.debug_frame` (plus the FDE, at address 0,
//! of a function the linker discarded), linked low and in the high half (a kernel's
//! 0xffffffff80001000), and loaded at its link address or elsewhere. The stack is the
//! one the fixture's frames describe: `outer` -> `middle` -> `inner`, stopped in
//! `inner`, with a junk word where a frameless guess would look for the return address.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use glass_unwind::{cfi_sources, CfiSources, DwarfUnwinder, UnwindRegs, WalkEnd};
use object::{Object, ObjectSymbol};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/cfi")
        .join(name)
}

/// Links the fixture with its text at `text` and returns the image's bytes.
fn link(text: u64) -> Vec<u8> {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cfi_sources");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(format!("image-{text:x}"));
    let status = Command::new("gcc")
        .args(["-nostdlib", "-static", "-no-pie", "-Wl,--gc-sections"])
        .args(["-Wl,--eh-frame-hdr", "-Wl,-e,outer"])
        .arg(format!("-Wl,-Ttext={text:#x}"))
        .arg(fixture("debug_frame.S"))
        .arg(fixture("eh_frame.S"))
        .arg("-o")
        .arg(&out)
        .status()
        .expect("gcc runs");
    assert!(status.success(), "gcc failed");
    std::fs::read(&out).unwrap()
}

struct Image {
    bytes: Vec<u8>,
    /// The executable segment: address, end, file offset.
    text: (u64, u64, u64),
}

impl Image {
    fn new(text: u64) -> Image {
        let bytes = link(text);
        let text = common::executable_segment(&bytes);
        Image { bytes, text }
    }

    fn symbol(&self, name: &str) -> u64 {
        let elf = object::File::parse(&*self.bytes).unwrap();
        elf.symbols()
            .find(|s| s.name() == Ok(name))
            .unwrap_or_else(|| panic!("no {name}"))
            .address()
    }

    /// Unwinds the fixture's stack with the image loaded `bias` bytes above its link
    /// address; the frames (instruction pointer, then return addresses) less the bias.
    fn unwind(&self, bias: u64) -> (Vec<u64>, WalkEnd) {
        let mut unwinder = DwarfUnwinder::new();
        let (start, end, offset) = self.text;
        let sources = unwinder
            .add_module_bytes("image", &self.bytes, start + bias, end + bias, offset)
            .unwrap();
        assert_eq!(unwinder.cfi_sources(start + bias), Some(sources));
        assert!(unwinder.has_module(start + bias));
        // The stack, from inner's frame up (see the fixture's comments).
        let sp = 0x7fff_0000_0000u64;
        let mut stack = vec![0u64; 0x100 / 8];
        let mut put = |at: u64, value: u64| stack[((at - sp) / 8) as usize] = value;
        put(sp, 0xdead_beef); // not a return address
        put(sp + 0x38, self.symbol("middle_ret") + bias); // inner: CFA = sp + 0x40
        put(sp + 0x40 + 0x20, 0x1234); // middle's saved rbx
        put(sp + 0x40 + 0x28, self.symbol("outer_ret") + bias); // middle: CFA = sp + 0x70
        put(sp + 0x70 + 0x18, 0); // outer: CFA = sp + 0x90, called from nowhere
        let mut read = |address: u64| -> Option<u64> {
            let index = usize::try_from(address.checked_sub(sp)? / 8).ok()?;
            stack.get(index).copied()
        };
        let regs = UnwindRegs::new(self.symbol("inner_pc") + bias, sp, 0);
        let mut frames = Vec::new();
        let end = unwinder.walk(regs, &mut read, 64, &mut frames);
        (frames.iter().map(|f| f - bias).collect(), end)
    }

    fn expected(&self) -> Vec<u64> {
        vec![
            self.symbol("inner_pc"),
            self.symbol("middle_ret"),
            self.symbol("outer_ret"),
        ]
    }
}

#[test]
fn eh_frame_and_debug_frame_functions_of_one_image_both_unwind() {
    let image = Image::new(0x40_1000);
    for bias in [0, 0x5555_0000_0000] {
        let (frames, _) = image.unwind(bias);
        assert_eq!(frames, image.expected(), "bias {bias:#x}");
    }
}

#[test]
fn an_image_linked_in_the_high_half_unwinds_with_its_cfi() {
    let image = Image::new(0xffff_ffff_8000_1000);
    let (frames, end) = image.unwind(0);
    assert_eq!(frames, image.expected(), "{end:?}");
}

#[test]
fn the_cfi_sources_of_an_image_are_counted() {
    // The discarded function's FDE (at address 0) covers no code: not counted.
    for text in [0x40_1000, 0xffff_ffff_8000_1000] {
        let image = Image::new(text);
        let sources = cfi_sources(&image.bytes);
        assert_eq!(
            sources,
            CfiSources {
                eh_frame_fdes: 1,
                debug_frame_fdes: 2
            }
        );
        assert_eq!(
            sources.to_string(),
            ".eh_frame (1 FDEs), .debug_frame (2 FDEs)"
        );
    }
    // This test binary: Rust code, all of it in .eh_frame.
    let own = std::fs::read("/proc/self/exe").unwrap();
    let sources = cfi_sources(&own);
    assert!(sources.eh_frame_fdes > 1000, "{sources:?}");
}
