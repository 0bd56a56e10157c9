/* Multiboot (v1) entry of the 32-bit demo guest: QEMU's -kernel loads this ELF32 and
 * jumps to _start in 32-bit protected mode with paging off. PAGING selects what the
 * guest does before it calls kmain, so that each x86 translation mode glass walks is
 * run by a real guest:
 *   0  no paging: the kernel is linked at its physical address (KERNEL_VMA 0);
 *   2  32-bit 2-level paging: a 4 MiB page (CR4.PSE) identity-maps this code, and a
 *      page table of 4 KiB pages maps KERNEL_VMA (0xC0000000) to physical 0;
 *   3  PAE: the 4-entry PDPT, 2 MiB pages identity-map this code, two page tables of
 *      4 KiB pages map KERNEL_VMA to physical 0.
 * This file's code is linked at its physical address (.boot); everything else at
 * KERNEL_VMA, which is why the tables are addressed with V(). */
#define MB_MAGIC 0x1BADB002
#define MB_FLAGS 0x00000003
#define V(x) ((x) - KERNEL_VMA)

    .section .multiboot, "a"
    .align 4
    .long MB_MAGIC
    .long MB_FLAGS
    .long -(MB_MAGIC + MB_FLAGS)

    .section .bss
    .align 4096
page_dir:    .skip 4096     /* 2-level: the page directory; PAE: the PD of 3-4 GiB */
page_table0: .skip 4096
page_table1: .skip 4096
pae_pd0:     .skip 4096     /* PAE: the PD of 0-1 GiB */
    .align 32
pdpt:        .skip 32
    .align 16
stack_bottom: .skip 65536
stack_top:

    .section .boot, "ax"
    .code32
    .global _start
    .type _start, @function
_start:
    cli
#if PAGING == 2
    movl $V(page_table0), %edi
    xorl %ecx, %ecx
1:  movl %ecx, %eax
    shll $12, %eax
    orl $3, %eax
    movl %eax, (%edi,%ecx,4)
    incl %ecx
    cmpl $1024, %ecx
    jne 1b
    movl $V(page_dir), %edi
    movl $0x83, (%edi)                  /* 0-4 MiB -> 0: present, writable, 4 MiB */
    movl $V(page_table0), %eax
    orl $3, %eax
    movl %eax, (KERNEL_VMA >> 22) * 4(%edi)
    movl %edi, %cr3
    movl %cr4, %eax
    orl $(1 << 4), %eax                 /* PSE */
    movl %eax, %cr4
    movl %cr0, %eax
    orl $(1 << 31), %eax                /* PG */
    movl %eax, %cr0
#elif PAGING == 3
    /* The two page tables are adjacent: 1024 8-byte entries over 0-4 MiB. */
    movl $V(page_table0), %edi
    xorl %ecx, %ecx
1:  movl %ecx, %eax
    shll $12, %eax
    orl $3, %eax
    movl %eax, (%edi,%ecx,8)
    movl $0, 4(%edi,%ecx,8)
    incl %ecx
    cmpl $1024, %ecx
    jne 1b
    movl $V(pae_pd0), %edi
    movl $0x83, (%edi)                  /* 0-2 MiB, 2 MiB page */
    movl $0x200083, 8(%edi)             /* 2-4 MiB */
    movl $V(page_dir), %edi
    movl $V(page_table0), %eax
    orl $3, %eax
    movl %eax, (%edi)
    movl $V(page_table1), %eax
    orl $3, %eax
    movl %eax, 8(%edi)
    movl $V(pdpt), %edi
    movl $V(pae_pd0), %eax
    orl $1, %eax                        /* a PDPTE has only P (RW is reserved) */
    movl %eax, (%edi)
    movl $V(page_dir), %eax
    orl $1, %eax
    movl %eax, 24(%edi)                 /* 3-4 GiB */
    movl %edi, %cr3
    movl %cr4, %eax
    orl $(1 << 5), %eax                 /* PAE */
    movl %eax, %cr4
    movl %cr0, %eax
    orl $(1 << 31), %eax                /* PG */
    movl %eax, %cr0
#endif
    movl $stack_top, %esp
    xorl %ebp, %ebp                     /* the frame chain ends here */
    call kmain
2:  hlt
    jmp 2b
    .size _start, . - _start
