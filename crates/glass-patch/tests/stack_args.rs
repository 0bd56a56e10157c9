//! The DWARF check behind the call-style trampoline: which functions take every argument
//! in registers. tests/fixtures/patch/arguments.c names each function after its verdict
//! (`regs_*`, `stack_*`); compiled here at -O0 and -O2, every one must get its own.

use std::path::Path;
use std::process::Command;

use glass_patch::functions;
use glass_patch::stack_args::{argument_passing, Arguments};

#[test]
fn every_function_gets_the_verdict_its_name_says() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("stack_args");
    std::fs::create_dir_all(&dir).unwrap();
    let source =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/patch/arguments.c");
    for optimisation in ["-O0", "-O2"] {
        let binary = dir.join(format!("arguments{optimisation}"));
        let status = Command::new("gcc")
            .args([optimisation, "-g"])
            .arg(&source)
            .arg("-o")
            .arg(&binary)
            .status()
            .unwrap();
        assert!(status.success());
        let bytes = std::fs::read(&binary).unwrap();
        let elf = object::File::parse(&*bytes).unwrap();
        let verdicts = argument_passing(&elf);
        let mut checked = 0;
        for function in functions(&elf) {
            let expected_in_registers = if function.name.starts_with("regs_") {
                true
            } else if function.name.starts_with("stack_") {
                false
            } else {
                continue;
            };
            checked += 1;
            let verdict = verdicts.get(&function.address).unwrap_or_else(|| {
                panic!("{optimisation}: no DWARF verdict for {}", function.name)
            });
            assert_eq!(
                *verdict == Arguments::InRegisters,
                expected_in_registers,
                "{optimisation}: {} {verdict:?}",
                function.name
            );
            eprintln!("{optimisation} {}: {verdict:?}", function.name);
        }
        assert_eq!(checked, 14, "{optimisation}");
    }
}
