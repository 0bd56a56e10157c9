//! Names for the vDSO, the small library the kernel maps into every process (`[vdso]`):
//! it has no file, so the recorder reads its image from the target's memory while the
//! target runs and keeps its function symbols in the recording, as a perf map named
//! `[vdso]` (the report names `[vdso]` frames from it, as it names JIT code). Where two
//! symbols start at one address (`clock_gettime`, weak, and `__vdso_clock_gettime`,
//! global) the global one is kept, as perf does.

use object::{Object, ObjectSymbol};

/// The module name the frames show, and the name of the kept map.
pub const MODULE: &str = "[vdso]";

/// Is `path` (a recorded module's) the vDSO?
pub fn is_vdso(path: &str) -> bool {
    path == MODULE
}

/// The vDSO's functions as a perf map (`START SIZE name` lines, hexadecimal), at the
/// addresses of an image mapped at `mapped_at`; None when `image` is no ELF file or
/// names no function.
pub fn perf_map(image: &[u8], mapped_at: u64) -> Option<String> {
    let elf = object::File::parse(image).ok()?;
    // The image's own addresses are relative to its first byte (its link address is 0
    // on x86-64 and arm64; otherwise the first segment's address is where byte 0 goes).
    let base = object::ObjectSegment::address(&elf.segments().next()?);
    let mut functions: Vec<(u64, u64, bool, String)> = elf
        .dynamic_symbols()
        .filter(|s| s.kind() == object::SymbolKind::Text && s.is_definition() && s.size() > 0)
        .filter_map(|s| {
            let weak = s.is_weak();
            let name = s.name().ok()?.to_string();
            Some((s.address() - base + mapped_at, s.size(), weak, name))
        })
        .collect();
    // By address, the global before the weak, then __vdso_ names first.
    functions.sort_by(|a, b| {
        (a.0, a.2, !a.3.starts_with("__vdso_"), &a.3).cmp(&(
            b.0,
            b.2,
            !b.3.starts_with("__vdso_"),
            &b.3,
        ))
    });
    functions.dedup_by_key(|f| f.0);
    if functions.is_empty() {
        return None;
    }
    Some(
        functions
            .iter()
            .map(|(start, size, _, name)| format!("{start:x} {size:x} {name}\n"))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This process's own vDSO, as the kernel maps it (AT_SYSINFO_EHDR).
    fn own_vdso() -> Option<(u64, Vec<u8>)> {
        // SAFETY: getauxval has no preconditions.
        let at = unsafe { libc_getauxval(33) };
        if at == 0 {
            return None;
        }
        let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
        let line = maps.lines().find(|l| l.ends_with("[vdso]"))?;
        let (start, end) = line.split_whitespace().next()?.split_once('-')?;
        let (start, end) = (
            u64::from_str_radix(start, 16).ok()?,
            u64::from_str_radix(end, 16).ok()?,
        );
        assert_eq!(start, at);
        // SAFETY: the vDSO mapping is readable for its whole length.
        let image =
            unsafe { std::slice::from_raw_parts(start as *const u8, (end - start) as usize) };
        Some((start, image.to_vec()))
    }

    extern "C" {
        #[link_name = "getauxval"]
        fn libc_getauxval(kind: u64) -> u64;
    }

    #[test]
    fn the_running_kernels_vdso_names_its_clock_functions_as_perf_does() {
        let Some((at, image)) = own_vdso() else {
            return;
        };
        let map = perf_map(&image, at).expect("the vDSO names functions");
        let names: Vec<&str> = map.lines().filter_map(|l| l.split(' ').nth(2)).collect();
        assert!(names.contains(&"__vdso_clock_gettime"), "{map}");
        assert!(names.contains(&"__vdso_gettimeofday"), "{map}");
        assert!(
            !names.contains(&"clock_gettime"),
            "the weak alias is kept: {map}"
        );
        let entries = crate::jit::parse_perf_map(&map);
        let clock = entries
            .iter()
            .find(|e| e.2 == "__vdso_clock_gettime")
            .unwrap();
        assert!(clock.0 >= at && clock.0 + clock.1 <= at + image.len() as u64);
        assert!(perf_map(b"not an elf", 0).is_none());
    }
}
