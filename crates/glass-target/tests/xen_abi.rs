//! The Xen ABI glass speaks (`glass_target::xen::abi`) against Xen's own headers: a C
//! program compiled with the installed libxen-dev prints every offset and size glass
//! relies on, and each must match. `./x test` installs libxen-dev.

use std::process::Command;

use glass_target::xen::abi::*;

#[test]
fn offsets_and_sizes_match_xens_headers() {
    assert!(
        std::path::Path::new("/usr/include/xen/domctl.h").exists(),
        "Xen's headers are missing: apt-get install libxen-dev (./x test does)"
    );
    let dir = std::env::temp_dir().join(format!("glass-xen-abi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let source = dir.join("abi.c");
    std::fs::write(
        &source,
        r#"
#define __XEN_TOOLS__ 1
#include <stdio.h>
#include <stddef.h>
#include <stdint.h>
#include <xen/xen.h>
#include <xen/domctl.h>
#include <xen/sched.h>
#include <xen/foreign/x86_64.h>
#include <xen/hvm/save.h>
#define D(f) offsetof(struct xen_domctl, f)
#define C(f) offsetof(vcpu_guest_context_x86_64_t, f)
int main(void) {
    printf("%d %d %d %d %d %d %d %d %d %d\n", XEN_DOMCTL_INTERFACE_VERSION, __HYPERVISOR_multicall,
           __HYPERVISOR_sched_op, __HYPERVISOR_domctl, XEN_DOMCTL_pausedomain, XEN_DOMCTL_unpausedomain,
           XEN_DOMCTL_getdomaininfo, XEN_DOMCTL_getvcpucontext, XEN_DOMCTL_getvcpuinfo, XEN_DOMCTL_get_address_size);
    printf("%zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu\n", sizeof(struct xen_domctl), D(cmd),
           D(interface_version), D(domain), D(u.getdomaininfo.domain), D(u.getdomaininfo.flags),
           D(u.getdomaininfo.nr_online_vcpus), D(u.getdomaininfo.max_vcpu_id), D(u.vcpucontext.vcpu),
           D(u.vcpucontext.ctxt), D(u.getvcpuinfo.vcpu), D(u.getvcpuinfo.online), D(u.getvcpuinfo.blocked));
    printf("%d %d %d %d\n", XEN_DOMINF_dying, XEN_DOMINF_hvm_guest, XEN_DOMINF_shutdown, XEN_DOMINF_paused);
    printf("%zu %zu %zu %zu %zu %zu %zu %zu %d\n", sizeof(vcpu_guest_context_x86_64_t), C(flags),
           C(user_regs.rbp), C(user_regs.rax), C(user_regs.rdi), C(user_regs.rip), C(user_regs.rsp),
           C(ctrlreg), VGCF_in_kernel);
    printf("%zu %d %d %zu\n", sizeof(struct multicall_entry), SCHEDOP_block, SCHEDOP_poll,
           offsetof(struct xen_domctl, u.address_size.size));
#define H(f) offsetof(struct hvm_hw_cpu, f)
    printf("%d %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu\n", XEN_DOMCTL_gethvmcontext_partial,
           D(u.hvmcontext_partial.type), D(u.hvmcontext_partial.instance), D(u.hvmcontext_partial.bufsz),
           D(u.hvmcontext_partial.buffer), HVM_SAVE_CODE(CPU), sizeof(struct hvm_hw_cpu), H(rbp), H(rdi),
           H(rsp), H(rip), H(cr0), H(cr3), H(cr4), H(msr_efer));
    printf("%zu %zu %zu %zu\n", H(gs_base), H(shadow_gs), C(gs_base_kernel), C(gs_base_user));
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
        "the C program against Xen's headers did not build"
    );
    let out = Command::new(&binary).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let numbers: Vec<u64> = text
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    let ours: Vec<u64> = vec![
        DOMCTL_INTERFACE_VERSION as u64,
        HYPERVISOR_MULTICALL as u64,
        HYPERVISOR_SCHED_OP,
        HYPERVISOR_DOMCTL as u64,
        DOMCTL_PAUSEDOMAIN as u64,
        DOMCTL_UNPAUSEDOMAIN as u64,
        DOMCTL_GETDOMAININFO as u64,
        DOMCTL_GETVCPUCONTEXT as u64,
        DOMCTL_GETVCPUINFO as u64,
        DOMCTL_GET_ADDRESS_SIZE as u64,
        DOMCTL_SIZE as u64,
        DOMCTL_CMD as u64,
        DOMCTL_VERSION as u64,
        DOMCTL_DOMAIN as u64,
        INFO_DOMAIN as u64,
        INFO_FLAGS as u64,
        INFO_NR_ONLINE_VCPUS as u64,
        INFO_MAX_VCPU_ID as u64,
        VCPUCONTEXT_VCPU as u64,
        VCPUCONTEXT_CTXT as u64,
        VCPUINFO_VCPU as u64,
        VCPUINFO_ONLINE as u64,
        VCPUINFO_BLOCKED as u64,
        DOMINF_DYING as u64,
        DOMINF_HVM_GUEST as u64,
        DOMINF_SHUTDOWN as u64,
        DOMINF_PAUSED as u64,
        CONTEXT_SIZE as u64,
        CONTEXT_FLAGS as u64,
        CONTEXT_RBP as u64,
        CONTEXT_RAX as u64,
        CONTEXT_RDI as u64,
        CONTEXT_RIP as u64,
        CONTEXT_RSP as u64,
        CONTEXT_CTRLREG as u64,
        VGCF_IN_KERNEL,
        MULTICALL_ENTRY_SIZE as u64,
        SCHEDOP_BLOCK,
        SCHEDOP_POLL,
        ADDRESS_SIZE_SIZE as u64,
        DOMCTL_GETHVMCONTEXT_PARTIAL as u64,
        HVMCONTEXT_TYPE as u64,
        HVMCONTEXT_INSTANCE as u64,
        HVMCONTEXT_BUFSZ as u64,
        HVMCONTEXT_BUFFER as u64,
        HVM_SAVE_CPU as u64,
        HVM_CPU_SIZE as u64,
        HVM_CPU_RBP as u64,
        HVM_CPU_RDI as u64,
        HVM_CPU_RSP as u64,
        HVM_CPU_RIP as u64,
        HVM_CPU_CR0 as u64,
        HVM_CPU_CR3 as u64,
        HVM_CPU_CR4 as u64,
        HVM_CPU_EFER as u64,
        HVM_CPU_GS_BASE as u64,
        HVM_CPU_SHADOW_GS as u64,
        CONTEXT_GS_BASE_KERNEL as u64,
        CONTEXT_GS_BASE_USER as u64,
    ];
    assert_eq!(
        numbers, ours,
        "Xen's headers (left) and glass's ABI (right)"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
