//! Xen 4.17's hypercall ABI as glass uses it: the domctls (interface version 0x15), the
//! x86-64 PV vCPU context, multicall entries. Offsets, not `#[repr(C)]` copies of Xen's
//! structs: glass reads a handful of fields out of buffers the hypervisor fills, and
//! `tests/xen_abi.rs` checks every offset here against Xen's own headers (libxen-dev)
//! with a C compiler, so a header that moved a field fails a test instead of a sample.

/// `XEN_DOMCTL_INTERFACE_VERSION` of Xen 4.17. A hypervisor of another version rejects
/// every domctl with EACCES.
pub const DOMCTL_INTERFACE_VERSION: u32 = 0x15;

pub const HYPERVISOR_MULTICALL: u32 = 13;
pub const HYPERVISOR_SCHED_OP: u64 = 29;
pub const HYPERVISOR_DOMCTL: u32 = 36;

pub const DOMCTL_PAUSEDOMAIN: u32 = 3;
pub const DOMCTL_UNPAUSEDOMAIN: u32 = 4;
pub const DOMCTL_GETDOMAININFO: u32 = 5;
pub const DOMCTL_GETVCPUCONTEXT: u32 = 13;
pub const DOMCTL_GETVCPUINFO: u32 = 14;
pub const DOMCTL_GET_ADDRESS_SIZE: u32 = 36;
pub const DOMCTL_GETHVMCONTEXT_PARTIAL: u32 = 55;

/// `sizeof(struct xen_domctl)` and its fields.
pub const DOMCTL_SIZE: usize = 144;
pub const DOMCTL_CMD: usize = 0;
pub const DOMCTL_VERSION: usize = 4;
pub const DOMCTL_DOMAIN: usize = 8;
/// `u.getdomaininfo`.
pub const INFO_DOMAIN: usize = 16;
pub const INFO_FLAGS: usize = 20;
pub const INFO_NR_ONLINE_VCPUS: usize = 80;
pub const INFO_MAX_VCPU_ID: usize = 84;
/// `u.vcpucontext`: the vCPU and the guest handle of the context buffer.
pub const VCPUCONTEXT_VCPU: usize = 16;
pub const VCPUCONTEXT_CTXT: usize = 24;
/// `u.getvcpuinfo`.
pub const VCPUINFO_VCPU: usize = 16;
pub const VCPUINFO_ONLINE: usize = 20;
pub const VCPUINFO_BLOCKED: usize = 21;
/// `u.address_size.size`: the guest's address size in bits.
pub const ADDRESS_SIZE_SIZE: usize = 16;
/// `u.hvmcontext_partial`: one save record (type, instance) into a guest handle.
pub const HVMCONTEXT_TYPE: usize = 16;
pub const HVMCONTEXT_INSTANCE: usize = 20;
pub const HVMCONTEXT_BUFSZ: usize = 24;
pub const HVMCONTEXT_BUFFER: usize = 32;

/// `HVM_SAVE_CODE(CPU)`: an HVM/PVH vCPU's registers as `struct hvm_hw_cpu`, which
/// `getvcpucontext` lacks EFER of (long mode or not).
pub const HVM_SAVE_CPU: u32 = 2;
pub const HVM_CPU_SIZE: usize = 1032;
pub const HVM_CPU_RBP: usize = 544;
pub const HVM_CPU_RDI: usize = 560;
pub const HVM_CPU_RSP: usize = 568;
pub const HVM_CPU_RIP: usize = 640;
pub const HVM_CPU_CR0: usize = 656;
pub const HVM_CPU_CR3: usize = 672;
pub const HVM_CPU_CR4: usize = 680;
pub const HVM_CPU_EFER: usize = 992;
/// The GS base in use, and the one `swapgs` exchanges it with (KERNEL_GS_BASE): a Linux
/// guest's per-CPU area is one of them (its current task, its IRQ stack).
pub const HVM_CPU_GS_BASE: usize = 840;
pub const HVM_CPU_SHADOW_GS: usize = 944;

/// `XEN_DOMINF_*` flags of `getdomaininfo`.
pub const DOMINF_DYING: u32 = 1 << 0;
pub const DOMINF_HVM_GUEST: u32 = 1 << 1;
pub const DOMINF_SHUTDOWN: u32 = 1 << 2;
pub const DOMINF_PAUSED: u32 = 1 << 3;

/// `sizeof(vcpu_guest_context_x86_64_t)` and the fields glass reads.
pub const CONTEXT_SIZE: usize = 5168;
pub const CONTEXT_FLAGS: usize = 512;
pub const CONTEXT_RBP: usize = 552;
pub const CONTEXT_RAX: usize = 600;
pub const CONTEXT_RDI: usize = 632;
pub const CONTEXT_RIP: usize = 648;
pub const CONTEXT_RSP: usize = 672;
/// `ctrlreg[8]`; on x86-64 PV `ctrlreg[1]` is the user page table's base.
pub const CONTEXT_CTRLREG: usize = 4984;
/// A PV guest's GS bases for kernel and user mode (Xen swaps them for it).
pub const CONTEXT_GS_BASE_KERNEL: usize = 5152;
pub const CONTEXT_GS_BASE_USER: usize = 5160;
/// `VGCF_in_kernel`: the vCPU runs guest-kernel code (else guest-user code).
pub const VGCF_IN_KERNEL: u64 = 1 << 2;

/// `sizeof(struct multicall_entry)`: op, result, args[6].
pub const MULTICALL_ENTRY_SIZE: usize = 64;

/// `SCHEDOP_block` and `SCHEDOP_poll`: the hypercalls an idle PV vCPU waits in.
pub const SCHEDOP_BLOCK: u64 = 1;
pub const SCHEDOP_POLL: u64 = 3;

/// The bytes Xen writes into each 32-byte slot of a 64-bit PV guest's hypercall page
/// (`push %rcx; push %r11; mov $NR,%eax; syscall; pop %r11; pop %rcx; ret`), with the
/// hypercall number at bytes 4..8.
pub const HYPERCALL_STUB: [u8; 14] = [
    0x51, 0x41, 0x53, 0xb8, 0, 0, 0, 0, 0x0f, 0x05, 0x41, 0x5b, 0x59, 0xc3,
];
/// Where a vCPU inside a hypercall has its instruction pointer: after the `syscall`.
pub const HYPERCALL_STUB_RETURN: usize = 10;
/// The stub Xen writes for an HVM/PVH guest (`mov $NR,%eax; vmcall|vmmcall; ret`), with
/// the hypercall number at bytes 1..5 and the third byte of the call instruction
/// Intel's `c1` (vmcall) or AMD's `d9` (vmmcall). It pushes nothing: the return
/// address is at the stack pointer.
pub const HVM_HYPERCALL_STUB: [u8; 9] = [0xb8, 0, 0, 0, 0, 0x0f, 0x01, 0xc1, 0xc3];
pub const HVM_VMCALL: u8 = 0xc1;
pub const HVM_VMMCALL: u8 = 0xd9;
/// After the vmcall/vmmcall: where Xen leaves the instruction pointer of a vCPU blocked
/// in the hypercall.
pub const HVM_HYPERCALL_STUB_RETURN: usize = 8;

pub fn read_u16(buf: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(buf[at..at + 2].try_into().unwrap())
}

pub fn read_u32(buf: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(buf[at..at + 4].try_into().unwrap())
}

pub fn read_u64(buf: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(buf[at..at + 8].try_into().unwrap())
}

pub fn write_u16(buf: &mut [u8], at: usize, value: u16) {
    buf[at..at + 2].copy_from_slice(&value.to_le_bytes());
}

pub fn write_u32(buf: &mut [u8], at: usize, value: u32) {
    buf[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

pub fn write_u64(buf: &mut [u8], at: usize, value: u64) {
    buf[at..at + 8].copy_from_slice(&value.to_le_bytes());
}

/// Fills `buf` (one `struct xen_domctl`) for `cmd` on `domid`, payload zeroed.
pub fn domctl(buf: &mut [u8], cmd: u32, domid: u32) {
    buf[..DOMCTL_SIZE].fill(0);
    write_u32(buf, DOMCTL_CMD, cmd);
    write_u32(buf, DOMCTL_VERSION, DOMCTL_INTERFACE_VERSION);
    write_u16(buf, DOMCTL_DOMAIN, domid as u16);
}
