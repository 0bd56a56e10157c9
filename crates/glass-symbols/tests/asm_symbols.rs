//! Assembly labels its code in ways C compilers do not: symbols without a type
//! (NOTYPE) or without a size. Such code is named after the nearest symbol before it, as
//! nm-based tools do, and never after a sized function that ended before it.

use std::path::{Path, PathBuf};
use std::process::Command;

use glass_symbols::{ModuleRef, Symbolizer};
use object::{Object, ObjectSection, ObjectSymbol};

const SOURCE: &str = r#"
    .text
    .globl sized_function
    .type sized_function, @function
sized_function:
    nop
    .globl label_inside               /* NOTYPE inside a sized function */
label_inside:
    nop
    nop
    ret
    .size sized_function, . - sized_function
    /* padding after a sized function, before any other symbol */
    .skip 16, 0x90
    .globl notype_entry
notype_entry:                     /* NOTYPE, no size: a multiboot-style entry */
    nop
    nop
    nop
    nop
    .globl trampoline_end             /* NOTYPE at the same address as a function */
trampoline_end:
    .globl zero_size_function
    .type zero_size_function, @function
zero_size_function:               /* FUNC, but no .size */
    nop
    nop
    nop
    ret
"#;

fn build(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let source = dir.join("labels.S");
    std::fs::write(&source, SOURCE).unwrap();
    let elf = dir.join("labels.elf");
    let status = Command::new("gcc")
        .args(["-nostdlib", "-static", "-Wl,-e,sized_function", "-o"])
        .arg(&elf)
        .arg(&source)
        .status()
        .unwrap();
    assert!(status.success());
    elf
}

#[test]
fn notype_and_unsized_assembly_symbols_name_their_code() {
    let dir = std::env::temp_dir().join(format!("glass-asm-symbols-{}", std::process::id()));
    let elf_path = build(&dir);
    let bytes = std::fs::read(&elf_path).unwrap();
    let elf = object::File::parse(&*bytes).unwrap();
    let address = |name: &str| {
        elf.symbols()
            .find(|s| s.name() == Ok(name))
            .unwrap_or_else(|| panic!("no symbol {name}"))
            .address()
    };
    let notype = elf
        .symbols()
        .find(|s| s.name() == Ok("notype_entry"))
        .unwrap();
    assert_eq!(notype.kind(), object::SymbolKind::Unknown, "not NOTYPE");
    // The module is mapped at its link addresses, from the text section's file offset.
    let text = elf.section_by_name(".text").unwrap();
    let (offset, _) = text.file_range().unwrap();
    let start = text.address();
    let path = elf_path.to_string_lossy().into_owned();
    let module = ModuleRef {
        path: &path,
        build_id: &[],
        start,
        file_offset: offset,
    };
    let mut symbolizer = Symbolizer::new();
    let mut name = |at: u64| symbolizer.symbolize(&module, at, false)[0].function.clone();
    assert_eq!(name(address("sized_function") + 1), "sized_function");
    // A label inside a function does not rename the rest of it.
    assert_eq!(name(address("label_inside") + 1), "sized_function");
    // A label and a function at one address: the function names it.
    assert_eq!(address("trampoline_end"), address("zero_size_function"));
    assert_eq!(name(address("notype_entry") + 2), "notype_entry");
    assert_eq!(
        name(address("zero_size_function") + 3),
        "zero_size_function"
    );
    // In the padding after a sized function: not that function's name.
    let padding = address("sized_function") + 10;
    assert!(padding < address("notype_entry"));
    let shown = name(padding);
    assert!(
        shown != "sized_function" && shown.contains("+0x"),
        "padding named {shown}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
