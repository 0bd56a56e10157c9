//! Where a relocated (KASLR) Linux kernel runs, when the symbol table (`--symbols`, a
//! kallsyms or System.map) gives the addresses it was linked at: arm64 from VBAR_EL1
//! against the table's exception vector tables, x86-64 by finding `linux_banner`'s text
//! in guest memory at the 2 MiB steps x86-64's KASLR uses. The guest loop moves its
//! image once the slide is found.

use std::ops::Range;
use std::path::Path;

use glass_format::Arch;

use crate::entries::VECTOR_TABLES;
use crate::kernel_map::table_symbols;

/// x86-64 KASLR places the kernel in 2 MiB steps within 1 GiB.
const X86_KASLR_ALIGN: u64 = 2 << 20;
const X86_KASLR_RANGE: u64 = 1 << 30;
const BANNER: &[u8] = b"Linux version ";
/// How many samples outside the symbol table may try to find the slide.
const SLIDE_TRIES: u32 = 64;

/// A symbol table's symbols that tell where a relocated kernel runs, and the search.
#[derive(Default)]
pub struct Kaslr {
    /// The exception vectors (arm64's VBAR_EL1 points at one) and `linux_banner` (its
    /// text is found in the guest's memory), in the table's order.
    anchors: Vec<(String, u64)>,
    /// Samples in the kernel outside the table that did not tell the slide.
    tries: u32,
    /// How far the running kernel lies above the table, once found.
    pub slide: Option<u64>,
}

impl Kaslr {
    /// From a symbol table.
    pub fn from_table(path: &Path) -> Kaslr {
        let names: Vec<&str> = VECTOR_TABLES
            .iter()
            .copied()
            .chain(["linux_banner"])
            .collect();
        Kaslr {
            anchors: table_symbols(path, &names),
            tries: 0,
            slide: None,
        }
    }

    /// Whether the search goes on.
    pub fn searching(&self) -> bool {
        self.slide.is_none() && self.tries < SLIDE_TRIES
    }

    /// After a sample: takes what its vCPUs told (`found`: a slide; `outside`: one
    /// was in the kernel outside the table). Only a sample outside the table counts as a
    /// try; Err holds the note to keep once the tries are spent.
    pub fn settle(
        &mut self,
        found: Option<(u64, &'static str)>,
        outside: bool,
    ) -> Result<Option<(u64, &'static str)>, String> {
        let Some((slide, how)) = found else {
            self.tries += u32::from(outside);
            if self.tries == SLIDE_TRIES {
                return Err(
                    "the guest kernel runs outside the symbol table and where it was moved (KASLR) could not be found (no vector table or linux_banner matched): give the running kernel's own /proc/kallsyms, or boot it with nokaslr".into(),
                );
            }
            return Ok(None);
        };
        self.slide = Some(slide);
        Ok(Some((slide, how)))
    }

    /// Where a relocated kernel runs, from a vCPU stopped in it at `ip`: arm64 from
    /// `vector_base` (VBAR_EL1) against the table's vector tables, x86-64 by finding
    /// `linux_banner`'s text through `read` where the table puts it or at the 2 MiB steps
    /// that put `ip` inside the table (`text`). The slide (0: the kernel runs where the
    /// table says) and how it was found, or None. An x86-64 kernel slid by less than its
    /// own size runs partly inside the table (one boot in a few dozen): an `ip` there is
    /// no proof that it did not move.
    pub fn find(
        &self,
        arch: Arch,
        ip: u64,
        vector_base: Option<u64>,
        text: Range<u64>,
        read: &mut dyn FnMut(u64, &mut [u8]) -> usize,
    ) -> Option<(u64, &'static str)> {
        let inside = |slide: u64| text.contains(&ip.wrapping_sub(slide));
        if ip >> 63 == 0 {
            return None;
        }
        match arch {
            // (An arm64 kernel's slide spans the vmalloc area: one slid by less than its
            // size is left to the samples outside the table.)
            Arch::Aarch64 if text.contains(&ip) => None,
            Arch::Aarch64 => {
                let vbar = vector_base.filter(|&v| v != 0)?;
                self.anchors
                    .iter()
                    .filter(|(name, _)| VECTOR_TABLES.contains(&name.as_str()))
                    .map(|(_, at)| vbar.wrapping_sub(*at))
                    .find(|&slide| inside(slide))
                    .map(|slide| (slide, "VBAR_EL1 against the table's vectors"))
            }
            Arch::X86_64 => {
                // Inside the table, the slides that keep `ip` there are few (a 2 MiB step
                // per 2 MiB below it): cheap to try at every sample.
                let banner = self.anchors.iter().find(|(n, _)| n == "linux_banner")?.1;
                let mut text = [0u8; BANNER.len()];
                (0..=X86_KASLR_RANGE / X86_KASLR_ALIGN)
                    .map(|step| step * X86_KASLR_ALIGN)
                    .filter(|&slide| inside(slide))
                    .find(|&slide| {
                        read(banner.wrapping_add(slide), &mut text) == text.len() && text == *BANNER
                    })
                    .map(|slide| (slide, "linux_banner found in guest memory"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: u64 = 0xffff_ffff_8100_0000;
    const SIZE: u64 = 16 << 20;

    fn kaslr(lines: &str) -> Kaslr {
        let path = std::env::temp_dir().join(format!(
            "glass-kaslr-{}-{}",
            std::process::id(),
            lines.len()
        ));
        std::fs::write(&path, lines).unwrap();
        let kaslr = Kaslr::from_table(&path);
        std::fs::remove_file(&path).unwrap();
        kaslr
    }

    #[test]
    fn arm64_slide_from_vbar_against_the_vector_tables() {
        let vectors = TEXT + 0x1_0800;
        let k = kaslr(&format!("{TEXT:x} T _text\n{vectors:x} T vectors\n"));
        let slide = 32 << 20;
        let ip = TEXT + slide + 0x1000;
        let found = k.find(
            Arch::Aarch64,
            ip,
            Some(vectors + slide),
            TEXT..TEXT + SIZE,
            &mut |_, _| 0,
        );
        assert_eq!(found.map(|f| f.0), Some(slide));
        // A pc inside the table proves nothing on arm64: left to samples outside it.
        let inside = k.find(
            Arch::Aarch64,
            TEXT + 0x10,
            Some(vectors),
            TEXT..TEXT + SIZE,
            &mut |_, _| 0,
        );
        assert_eq!(inside, None);
    }

    #[test]
    fn x86_slide_where_linux_banner_reads_back() {
        let banner = TEXT + 0x80_0000;
        let mut k = kaslr(&format!("{TEXT:x} T _text\n{banner:x} D linux_banner\n"));
        let slide = 6 << 20;
        let found = k.find(
            Arch::X86_64,
            TEXT + slide + 0x100,
            None,
            TEXT..TEXT + SIZE,
            &mut |at, buf| {
                if at != banner + slide {
                    return 0;
                }
                buf.copy_from_slice(BANNER);
                buf.len()
            },
        );
        assert_eq!(found.map(|f| f.0), Some(slide));
        assert_eq!(k.settle(found, true).unwrap().map(|f| f.0), Some(slide));
        assert!(!k.searching());
    }

    #[test]
    fn the_search_gives_up_once_with_a_note() {
        let mut k = kaslr("");
        for _ in 1..SLIDE_TRIES {
            assert_eq!(k.settle(None, true), Ok(None));
            // A sample inside the table is no try.
            assert_eq!(k.settle(None, false), Ok(None));
        }
        assert!(k.settle(None, true).unwrap_err().contains("KASLR"));
        assert!(!k.searching());
    }
}
