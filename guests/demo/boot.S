/* Multiboot entry of the demo unikernel: QEMU's -kernel loads it (as an ELF32 image)
 * and jumps here in 32-bit protected mode. We build page tables (the first 1 GiB
 * identity-mapped with 2 MiB pages, the stack region remapped with 4 KiB pages),
 * enter long mode, and call kmain with a fresh stack.
 *
 * Other guests reuse this file (guests/unikernel/build.sh) with two knobs:
 *   -DBOOT_SINGLE_VCPU     leave out the second vCPU's bring-up (INIT/SIPI, trampoline,
 *                          ap_main): under -smp N the other vCPUs stay in the firmware;
 *   -DBOOT_STACK_SIZE=N    size of the boot vCPU's stack (default 64 KiB).
 * Without them the demo is built exactly as before. */
#ifndef BOOT_STACK_SIZE
#define BOOT_STACK_SIZE 65536
#endif
#define MB_MAGIC 0x1BADB002
#define MB_FLAGS 0x00000003

    .section .multiboot, "a"
    .align 4
    .long MB_MAGIC
    .long MB_FLAGS
    .long -(MB_MAGIC + MB_FLAGS)

    .section .bss
    .align 4096
pml4:   .skip 4096
pdpt:   .skip 4096
pd:     .skip 4096
pt_stack: .skip 4096
    .align 16
stack_bottom: .skip BOOT_STACK_SIZE
stack_top:
#ifndef BOOT_SINGLE_VCPU
    .align 16
ap_stack_bottom: .skip 65536
ap_stack_top:
#endif

    .section .data
    .align 8
gdt:
    .quad 0
    .quad 0x00af9a000000ffff   /* 64-bit code */
    .quad 0x00cf92000000ffff   /* data */
    .quad 0x00cf9a000000ffff   /* 32-bit code */
gdt_end:
gdt_pointer:
    .word gdt_end - gdt - 1
    .long gdt

    .section .text
    .code32
    .global _start
_start:
    cli
    /* PML4[0] -> PDPT, PDPT[0] -> PD, PD[i] -> 2 MiB pages. */
    movl $pdpt, %eax
    orl $3, %eax
    movl %eax, pml4
    movl $pd, %eax
    orl $3, %eax
    movl %eax, pdpt
    xorl %ecx, %ecx
1:  movl %ecx, %eax
    shll $21, %eax
    orl $0x83, %eax
    movl %eax, pd(,%ecx,8)
    incl %ecx
    cmpl $512, %ecx
    jne 1b
    /* The 2 MiB page holding the stack is remapped with 4 KiB pages (same addresses),
     * so the profiler's page walk sees both page sizes on the sample path. */
    movl $stack_bottom, %ebx
    shrl $21, %ebx                 /* PD index of the stack */
    movl %ebx, %edx
    shll $21, %edx                 /* base of that 2 MiB region */
    xorl %ecx, %ecx
2:  movl %ecx, %eax
    shll $12, %eax
    addl %edx, %eax
    orl $3, %eax
    movl %eax, pt_stack(,%ecx,8)
    incl %ecx
    cmpl $512, %ecx
    jne 2b
    movl $pt_stack, %eax
    orl $3, %eax
    movl %eax, pd(,%ebx,8)

#ifndef BOOT_SINGLE_VCPU
    /* Start the second vCPU: copy the real-mode trampoline to 0x8000, then INIT and
     * two SIPIs (vector 0x08 -> 0x8000) through the local APIC, still unpaged. */
    movl $ap_trampoline, %esi
    movl $0x8000, %edi
    movl $(ap_trampoline_end - ap_trampoline), %ecx
    rep movsb
    movl $0x000C4500, 0xFEE00300    /* INIT, all excluding self */
    movl $200000, %ecx
4:  loop 4b
    movl $0x000C4608, 0xFEE00300    /* SIPI, vector 8 */
    movl $200000, %ecx
5:  loop 5b
    movl $0x000C4608, 0xFEE00300
#endif

    call enter_long_mode
    movw $0x10, %ax
    movw %ax, %ds
    movw %ax, %es
    movw %ax, %ss
    ljmp $0x08, $long_mode

/* Paging and long mode, shared by both vCPUs (32-bit, returns with paging on). */
enter_long_mode:
    movl $pml4, %eax
    movl %eax, %cr3
    movl %cr4, %eax
    orl $(1 << 5), %eax            /* PAE */
    movl %eax, %cr4
    movl $0xC0000080, %ecx         /* EFER */
    rdmsr
    orl $(1 << 8), %eax            /* LME */
    wrmsr
    movl %cr0, %eax
    orl $0x80000001, %eax          /* PG | PE */
    movl %eax, %cr0
    lgdt gdt_pointer
    ret

#ifndef BOOT_SINGLE_VCPU
/* The second vCPU arrives here in 32-bit protected mode from the trampoline. */
ap_protected:
    movw $0x10, %ax
    movw %ax, %ds
    movw %ax, %es
    movw %ax, %ss
    movl $ap_stack_top, %esp
    call enter_long_mode
    ljmp $0x08, $ap_long_mode

/* Real-mode start of the second vCPU, copied to 0x8000. */
    .code16
ap_trampoline:
    cli
    xorw %ax, %ax
    movw %ax, %ds
    lgdtl 0x8000 + (ap_gdt_pointer - ap_trampoline)
    movl %cr0, %eax
    orl $1, %eax
    movl %eax, %cr0
    ljmpl $0x18, $ap_protected
    .align 8
ap_gdt:
    .quad 0
    .quad 0x00af9a000000ffff
    .quad 0x00cf92000000ffff
    .quad 0x00cf9a000000ffff       /* 32-bit code */
ap_gdt_pointer:
    .word ap_gdt_pointer - ap_gdt - 1
    .long 0x8000 + (ap_gdt - ap_trampoline)
ap_trampoline_end:
    .code32
#endif

    .code64
    .type long_mode, @function
long_mode:
    movw $0x10, %ax
    movw %ax, %ds
    movw %ax, %es
    movw %ax, %ss
    movq $stack_top, %rsp
    xorq %rbp, %rbp
    call kmain
3:  hlt
    jmp 3b

#ifndef BOOT_SINGLE_VCPU
    .type ap_long_mode, @function
ap_long_mode:
    movw $0x10, %ax
    movw %ax, %ds
    movw %ax, %es
    movw %ax, %ss
    movq $ap_stack_top, %rsp
    xorq %rbp, %rbp
    call ap_main
6:  hlt
    jmp 6b
#endif
