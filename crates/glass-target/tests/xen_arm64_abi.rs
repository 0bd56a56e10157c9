//! The arm64 vCPU context glass reads on Xen on ARM64 (`glass_target::xen::arm64`) against
//! Xen's own header for it: `xen/foreign/arm64.h` (libxen-dev, on any architecture)
//! describes `vcpu_guest_context_arm64_t` with explicit alignment, and a C program compiled
//! here prints every offset glass relies on.

use std::process::Command;

use glass_target::xen::arm64::*;

#[test]
fn arm64_context_offsets_match_xens_header() {
    assert!(
        std::path::Path::new("/usr/include/xen/foreign/arm64.h").exists(),
        "Xen's headers are missing: apt-get install libxen-dev (./x test does)"
    );
    let dir = std::env::temp_dir().join(format!("glass-xen-arm64-abi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let source = dir.join("abi.c");
    std::fs::write(
        &source,
        r#"
#include <stdio.h>
#include <stddef.h>
#include <stdint.h>
#include <xen/foreign/arm64.h>
#define C(f) offsetof(vcpu_guest_context_arm64_t, f)
int main(void) {
    printf("%zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu\n", sizeof(vcpu_guest_context_arm64_t),
           C(user_regs.x29), C(user_regs.x30), C(user_regs.pc64), C(user_regs.cpsr),
           C(user_regs.sp_el0), C(user_regs.sp_el1), C(sctlr), C(ttbcr), C(ttbr0), C(ttbr1));
    return 0;
}
"#,
    )
    .unwrap();
    let binary = dir.join("abi");
    let built = Command::new("gcc")
        .arg(&source)
        .arg("-o")
        .arg(&binary)
        .status()
        .unwrap();
    assert!(
        built.success(),
        "the C program against xen/foreign/arm64.h did not build"
    );
    let out = Command::new(&binary).output().unwrap();
    let theirs: Vec<usize> = String::from_utf8(out.stdout)
        .unwrap()
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    let ours = vec![
        CONTEXT_SIZE,
        CONTEXT_X29,
        CONTEXT_X30,
        CONTEXT_PC,
        CONTEXT_CPSR,
        CONTEXT_SP_EL0,
        CONTEXT_SP_EL1,
        CONTEXT_SCTLR,
        CONTEXT_TCR,
        CONTEXT_TTBR0,
        CONTEXT_TTBR1,
    ];
    assert_eq!(ours, theirs);
    let _ = std::fs::remove_dir_all(&dir);
}
