//! Calls into another module run through the PLT's stubs, which have no symbols: they
//! are named `x@plt` after the GOT slot they jump through, as perf and objdump name them,
//! not after `_init`, the unsized symbol before the PLT (libpython's stubs were). Checked
//! against objdump's names for the same binary, in each of the layouts gcc and ld make:
//! the lazy `.plt`, IBT's `.plt.sec` beside it, `-z now`, and `.plt.got`.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use glass_symbols::{ModuleRef, Symbolizer};

const SOURCE: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(int argc, char **argv) {
    char *b = malloc(64);
    strcpy(b, argc > 5 ? argv[1] : "hello");
    puts(b);
    printf("%zu\n", strlen(b));
    free(b);
    return 0;
}
"#;

/// objdump's `<x@plt>` labels: address -> name.
fn objdump_stubs(binary: &Path) -> BTreeMap<u64, String> {
    let output = Command::new("objdump")
        .arg("-d")
        .arg(binary)
        .output()
        .expect("objdump runs (binutils)");
    assert!(output.status.success());
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| {
            // "0000000000001030 <free@plt>:"
            let (address, rest) = line.split_once(" <")?;
            let name = rest.strip_suffix(">:")?;
            name.ends_with("@plt")
                .then(|| Some((u64::from_str_radix(address, 16).ok()?, name.to_string())))?
        })
        .collect()
}

#[test]
fn plt_stubs_are_named_as_objdump_names_them() {
    let dir = std::env::temp_dir().join(format!("glass-plt-names-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let source = dir.join("plt.c");
    std::fs::write(&source, SOURCE).unwrap();
    let layouts: &[(&str, &[&str])] = &[
        ("lazy", &[]),
        ("ibt", &["-fcf-protection=full", "-Wl,-z,ibtplt"]),
        ("now", &["-Wl,-z,now"]),
    ];
    for (layout, flags) in layouts {
        let binary = dir.join(format!("plt-{layout}"));
        let status = Command::new("gcc")
            .args(["-O1", "-g"])
            .args(*flags)
            .arg("-o")
            .arg(&binary)
            .arg(&source)
            .status()
            .unwrap();
        assert!(status.success(), "gcc {flags:?}");
        let expected = objdump_stubs(&binary);
        for name in ["malloc@plt", "puts@plt", "strlen@plt", "free@plt"] {
            assert!(
                expected.values().any(|n| n == name),
                "{layout}: objdump names no {name}: {expected:?}"
            );
        }
        // A PIE mapped whole from offset 0, where the loader would put it.
        let base = 0x5555_5555_4000;
        let path = binary.to_string_lossy().into_owned();
        let module = ModuleRef {
            path: &path,
            build_id: &[],
            start: base,
            file_offset: 0,
        };
        let mut symbolizer = Symbolizer::new();
        for (&address, name) in &expected {
            // Entries are 16 bytes, or 8 in a `.plt.got` without IBT.
            for inside in [0, 3, 7] {
                let frames = symbolizer.symbolize(&module, base + address + inside, false);
                assert_eq!(
                    &frames[0].function, name,
                    "{layout}: {:#x}+{inside}",
                    address
                );
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
