/* Assembly of the Xen PV guest (guests/xenpv): the Xen ELF notes, the hypercall page,
 * the entry points (vCPU0's _start, vCPU1's ap_entry), the event and failsafe callbacks,
 * and mix_block (the hot leaf under gamma, the same as guests/unikernel/entry.S's).
 * Everything here has .cfi_* directives: the entry points end the DWARF unwind
 * (.cfi_undefined rip), the callbacks describe the frame Xen pushed. */
#include "xen.h"

#define VIRT_BASE 0xffffffff80000000

/* One Xen ELF note: namesz, descsz, type, "Xen\0", desc (4-byte aligned). Xen's libelf
 * finds them through the PT_NOTE program header (link.ld) or the SHT_NOTE section. */
#define ELFNOTE(type, desc)                 \
    .pushsection .note.Xen, "a", @note;     \
    .balign 4;                              \
    .long 2f - 1f;                          \
    .long 4f - 3f;                          \
    .long type;                             \
1:  .asciz "Xen";                           \
2:  .balign 4;                              \
3:  desc;                                   \
4:  .balign 4;                              \
    .popsection

#ifndef XEN_HVM
ELFNOTE(XEN_ELFNOTE_GUEST_OS,       .asciz "glass-pv")
ELFNOTE(XEN_ELFNOTE_GUEST_VERSION,  .asciz "1")
ELFNOTE(XEN_ELFNOTE_XEN_VERSION,    .asciz "xen-3.0")
ELFNOTE(XEN_ELFNOTE_LOADER,         .asciz "generic")
/* The image is linked at VIRT_BASE (link.ld) with p_paddr = p_vaddr - VIRT_BASE, so a
 * PADDR_OFFSET of 0: the domain builder puts pseudo-physical frame 0 at VIRT_BASE and
 * loads the image from there. */
ELFNOTE(XEN_ELFNOTE_VIRT_BASE,      .quad VIRT_BASE)
ELFNOTE(XEN_ELFNOTE_PADDR_OFFSET,   .quad 0)
ELFNOTE(XEN_ELFNOTE_ENTRY,          .quad _start)
ELFNOTE(XEN_ELFNOTE_HYPERCALL_PAGE, .quad hypercall_page)
/* No XEN_ELFNOTE_FEATURES: the guest needs none of the optional features (it keeps
 * Xen's default PV page-table handling: page tables are read-only, updated by hypercall). */
#else
/* The PVH/HVM build (build.sh hvm): loaded by physical address (p_paddr = p_vaddr -
 * VIRT_BASE, from 1 MiB), entered at pvh_start in 32-bit protected mode with paging off,
 * as PVH enters a kernel (XEN_ELFNOTE_PHYS32_ENTRY) and as an HVM domain enters the
 * firmware it was given (xl's firmware_override). */
ELFNOTE(XEN_ELFNOTE_GUEST_OS,       .asciz "glass-hvm")
ELFNOTE(XEN_ELFNOTE_GUEST_VERSION,  .asciz "1")
ELFNOTE(XEN_ELFNOTE_XEN_VERSION,    .asciz "xen-3.0")
ELFNOTE(XEN_ELFNOTE_LOADER,         .asciz "generic")
ELFNOTE(XEN_ELFNOTE_PHYS32_ENTRY,   .long pvh_start - VIRT_BASE)
#endif

/* Xen writes the hypercall stubs (32 bytes each) into this page when it builds the
 * domain; `ret` until then. */
    .section .hypercall_page, "ax", @progbits
    .balign 4096
    .globl hypercall_page
    .type hypercall_page, @function
hypercall_page:
    .fill 4096, 1, 0xc3
    .size hypercall_page, . - hypercall_page

    .text

#ifndef XEN_HVM
/* vCPU0 enters here with rsi = the start_info page (virtual), rsp = the builder's boot
 * stack page: move onto boot_stack (kernel.c) and call kmain(start_info). */
    .globl _start
    .type _start, @function
    .align 16
_start:
    .cfi_startproc
    .cfi_undefined %rip
    leaq boot_stack_top(%rip), %rsp
    xorl %ebp, %ebp
    movq %rsi, %rdi
    call kmain
    ud2
    .cfi_endproc
    .size _start, . - _start
#endif

#ifdef XEN_HVM
/* The 32-bit entry (physical addresses: the symbols minus VIRT_BASE), ebx = the PVH
 * start_info (unused). Builds page tables that map physical 0-4 GiB twice, at 0 (the
 * entry itself, and the console ring and other pages Xen puts below 4 GiB) and at
 * VIRT_BASE (the image, 2 GiB of it), in 2 MiB pages; turns on PAE, long mode and
 * paging; far-jumps to 64-bit code. Events and interrupts stay off: no IDT. */
#define PA(x) ((x) - VIRT_BASE)
    .section .text.boot32, "ax", @progbits
    .code32
    .globl pvh_start
    .type pvh_start, @function
pvh_start:
    cli
    cld
    /* pd0..pd3: 2048 entries of 2 MiB pages, present + writable + large */
    movl $PA(boot_pd), %edi
    xorl %ecx, %ecx
1:  movl %ecx, %eax
    shll $21, %eax
    orl $0x83, %eax
    movl %eax, (%edi,%ecx,8)
    movl $0, 4(%edi,%ecx,8)
    incl %ecx
    cmpl $2048, %ecx
    jb 1b
    /* the low directory pointer table: 4 GiB */
    movl $PA(boot_pdpt_low), %edi
    movl $PA(boot_pd) + 3, %eax
    movl %eax, 0(%edi)
    addl $4096, %eax
    movl %eax, 8(%edi)
    addl $4096, %eax
    movl %eax, 16(%edi)
    addl $4096, %eax
    movl %eax, 24(%edi)
    /* the high one: entries 510 and 511 (VIRT_BASE) map physical 0-2 GiB */
    movl $PA(boot_pdpt_high), %edi
    movl $PA(boot_pd) + 3, %eax
    movl %eax, 510 * 8(%edi)
    addl $4096, %eax
    movl %eax, 511 * 8(%edi)
    movl $PA(boot_pml4), %edi
    movl $PA(boot_pdpt_low) + 3, %eax
    movl %eax, 0(%edi)
    movl $PA(boot_pdpt_high) + 3, %eax
    movl %eax, 511 * 8(%edi)
    movl %cr4, %eax
    orl $0x20, %eax                 /* PAE */
    movl %eax, %cr4
    movl %edi, %cr3
    movl $0xc0000080, %ecx          /* EFER */
    rdmsr
    orl $0x100, %eax                /* LME */
    wrmsr
    movl %cr0, %eax
    orl $0x80000001, %eax           /* PG, PE */
    movl %eax, %cr0
    lgdt PA(boot_gdt_desc)
    ljmp $0x08, $PA(pvh_long)
    .code64
pvh_long:
    movabsq $pvh_high, %rax
    jmp *%rax
    .size pvh_start, . - pvh_start

    .section .rodata
    .balign 16
boot_gdt:
    .quad 0
    .quad 0x00af9a000000ffff        /* 0x08: 64-bit code */
    .quad 0x00cf92000000ffff        /* 0x10: data */
boot_gdt_desc:
    .word boot_gdt_desc - boot_gdt - 1
    .long PA(boot_gdt)

    .section .bss
    .balign 4096
boot_pml4:      .skip 4096
boot_pdpt_low:  .skip 4096
boot_pdpt_high: .skip 4096
boot_pd:        .skip 4 * 4096

    .text
/* Now at VIRT_BASE: onto boot_stack (kernel.c) and kmain_hvm(). */
    .type pvh_high, @function
    .align 16
pvh_high:
    .cfi_startproc
    .cfi_undefined %rip
    movl $0x10, %eax
    movl %eax, %ds
    movl %eax, %es
    movl %eax, %ss
    leaq boot_stack_top(%rip), %rsp
    xorl %ebp, %ebp
    call kmain_hvm
    ud2
    .cfi_endproc
    .size pvh_high, . - pvh_high
#endif

/* vCPU1 enters here (VCPUOP_initialise in kernel.c sets rip and rsp = ap_stack_top). */
    .globl ap_entry
    .type ap_entry, @function
    .align 16
ap_entry:
    .cfi_startproc
    .cfi_undefined %rip
    xorl %ebp, %ebp
    call ap_main
    ud2
    .cfi_endproc
    .size ap_entry, . - ap_entry

/* The event callback. Xen delivers events here (only after SCHEDOP_block unmasked them:
 * idle_wait) with the upcall mask set and this frame on the kernel stack (16-byte
 * aligned below the interrupted rsp):
 *   rsp+0 rcx, +8 r11 (Xen returns with sysret: their interrupted values),
 *   +16 rip, +24 cs (saved upcall mask in bits 32-39), +32 rflags (IF = !saved mask),
 *   +40 rsp, +48 ss.
 * do_event (kernel.c) clears the pending bits; the return is HYPERVISOR_iret with
 * rflags.IF cleared, which leaves events masked (Xen sets the mask to !IF). */
#define SAVED_CFI(off)                 \
    .cfi_signal_frame;                 \
    .cfi_def_cfa %rsp, (off) + 40;     \
    .cfi_offset %rip, -40;             \
    .cfi_offset %rsp, -16

    .globl hypervisor_callback
    .type hypervisor_callback, @function
    .align 16
hypervisor_callback:
    .cfi_startproc simple
    SAVED_CFI(16)
    .cfi_offset %rcx, -56
    .cfi_offset %r11, -48
    popq %rcx
    .cfi_adjust_cfa_offset -8
    .cfi_same_value %rcx
    popq %r11
    .cfi_adjust_cfa_offset -8
    .cfi_same_value %r11
    /* rsp is 8 mod 16 here; nine pushes make it 16-byte aligned for the call */
    pushq %rax
    .cfi_adjust_cfa_offset 8
    .cfi_rel_offset %rax, 0
    pushq %rcx
    .cfi_adjust_cfa_offset 8
    .cfi_rel_offset %rcx, 0
    pushq %rdx
    .cfi_adjust_cfa_offset 8
    .cfi_rel_offset %rdx, 0
    pushq %rsi
    .cfi_adjust_cfa_offset 8
    .cfi_rel_offset %rsi, 0
    pushq %rdi
    .cfi_adjust_cfa_offset 8
    .cfi_rel_offset %rdi, 0
    pushq %r8
    .cfi_adjust_cfa_offset 8
    .cfi_rel_offset %r8, 0
    pushq %r9
    .cfi_adjust_cfa_offset 8
    .cfi_rel_offset %r9, 0
    pushq %r10
    .cfi_adjust_cfa_offset 8
    .cfi_rel_offset %r10, 0
    pushq %r11
    .cfi_adjust_cfa_offset 8
    .cfi_rel_offset %r11, 0
    call do_event
    popq %r11
    .cfi_adjust_cfa_offset -8
    .cfi_same_value %r11
    popq %r10
    .cfi_adjust_cfa_offset -8
    .cfi_same_value %r10
    popq %r9
    .cfi_adjust_cfa_offset -8
    .cfi_same_value %r9
    popq %r8
    .cfi_adjust_cfa_offset -8
    .cfi_same_value %r8
    popq %rdi
    .cfi_adjust_cfa_offset -8
    .cfi_same_value %rdi
    popq %rsi
    .cfi_adjust_cfa_offset -8
    .cfi_same_value %rsi
    popq %rdx
    .cfi_adjust_cfa_offset -8
    .cfi_same_value %rdx
    popq %rcx
    .cfi_adjust_cfa_offset -8
    .cfi_same_value %rcx
    popq %rax
    .cfi_adjust_cfa_offset -8
    .cfi_same_value %rax
    andl $~0x200, 16(%rsp)          /* rflags.IF = 0: return with events masked */
    pushq $0                        /* iret flags: not VGCF_in_syscall, restore all */
    .cfi_adjust_cfa_offset 8
    jmp hypercall_page + __HYPERVISOR_iret * 32
    .cfi_endproc
    .size hypervisor_callback, . - hypervisor_callback

/* Xen calls this when it cannot load the guest's segment registers on a return: never
 * expected here; guest_failsafe (kernel.c) reports it and crashes the domain. */
    .globl failsafe_callback
    .type failsafe_callback, @function
    .align 16
failsafe_callback:
    .cfi_startproc simple
    .cfi_signal_frame
    .cfi_def_cfa %rsp, 88           /* rcx, r11, ds, es, fs, gs, then the iret frame */
    .cfi_offset %rip, -40
    .cfi_offset %rsp, -16
    movq 48(%rsp), %rdi             /* the rip that failed */
    andq $-16, %rsp
    call guest_failsafe
    ud2
    .cfi_endproc
    .size failsafe_callback, . - failsafe_callback

/* uint64_t mix_block(uint64_t seed, uint64_t iterations): as in guests/unikernel/entry.S,
 * the same LCG as the C spin loop, one step per iteration (registers only), the result
 * passed through the frame; 48 bytes of frame below the return address, no frame
 * pointer: only its CFI unwinds it. */
    .globl mix_block
    .type mix_block, @function
    .align 16
mix_block:
    .cfi_startproc
    pushq %rbx
    .cfi_adjust_cfa_offset 8
    .cfi_rel_offset %rbx, 0
    pushq %r12
    .cfi_adjust_cfa_offset 8
    .cfi_rel_offset %r12, 0
    subq $32, %rsp
    .cfi_adjust_cfa_offset 32
    movabsq $6364136223846793005, %rbx
    movabsq $1442695040888963407, %r12
    movq %rdi, %rax
    orq $1, %rax
    testq %rsi, %rsi
    jz 2f
1:  imulq %rbx, %rax
    addq %r12, %rax
    subq $1, %rsi
    jnz 1b
2:  movq %rax, 8(%rsp)
    movq 8(%rsp), %rax
    addq $32, %rsp
    .cfi_adjust_cfa_offset -32
    popq %r12
    .cfi_adjust_cfa_offset -8
    .cfi_restore %r12
    popq %rbx
    .cfi_adjust_cfa_offset -8
    .cfi_restore %rbx
    ret
    .cfi_endproc
    .size mix_block, . - mix_block

    .section .note.GNU-stack, "", @progbits
