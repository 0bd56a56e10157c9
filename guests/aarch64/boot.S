/* Boot code of the AArch64 demo guest. QEMU's -kernel (virt, no EL2/EL3) loads the ELF
 * at its physical addresses and enters _start at EL1 with the MMU and caches off; the
 * second vCPU starts powered off and enters secondary_start (also EL1, MMU off) when
 * vCPU0 asks PSCI CPU_ON (HVC conduit) for it.
 *
 * _start (physical, .boot.text): zero .bss, build the page tables (layout.h), turn on
 * the MMU and caches, and jump to kernel_entry in the high half, which takes its stack
 * (4 KiB pages) and calls kmain. secondary_start: MMU on with the same tables, jump to
 * secondary_entry (high half), own stack, second_cpu_main.
 *
 * The high-half code that calls C has .cfi_* directives (CFI_* macros), so the build
 * without frame pointers has .eh_frame for it; the frame-pointer build (GLASS_FP) has no
 * CFI at all, and kernel_entry/secondary_entry set x29 = 0, the end of the frame-record
 * chain. Both entries are the root of their vCPU's stacks (CFI: x30 undefined). */
#include "layout.h"

#ifdef GLASS_FP
#define CFI_STARTPROC
#define CFI_ENDPROC
#define CFI_UNDEFINED(r)
#else
#define CFI_STARTPROC .cfi_startproc
#define CFI_ENDPROC .cfi_endproc
#define CFI_UNDEFINED(r) .cfi_undefined r
#endif

/* ---- physical part: runs with the MMU off --------------------------------------- */
    .section .boot.bss, "aw", %nobits
    .balign 4096
    .globl ttbr0_l1, ttbr1_l1, ttbr1_l2_dev, ttbr1_l2_ram, ttbr1_l3_stacks
ttbr0_l1:        .skip 4096      /* identity: two 1 GiB blocks */
ttbr1_l1:        .skip 4096      /* [0] -> l2_dev, [1] -> l2_ram */
ttbr1_l2_dev:    .skip 4096      /* 2 MiB device blocks: GIC, UART */
ttbr1_l2_ram:    .skip 4096      /* 2 MiB blocks of the image, [stacks] -> l3_stacks */
ttbr1_l3_stacks: .skip 4096      /* 4 KiB pages of the stacks */

    .section .boot.text, "ax"
    .globl _start
    .type _start, %function
_start:
    msr daifset, #0xf
    mrs x0, CurrentEL
    cmp x0, #(1 << 2)
    b.ne hang                      /* expects EL1 (no virtualization=on / secure=on) */

    /* zero .bss (physical addresses) */
    ldr x9, =KERNEL_OFFSET
    ldr x0, =__bss_start
    ldr x1, =__bss_end
    sub x0, x0, x9
    sub x1, x1, x9
1:  cmp x0, x1
    b.hs 2f
    str xzr, [x0], #8
    b 1b
2:
    /* zero the page tables */
    adrp x0, ttbr0_l1
    add x1, x0, #(5 * 4096)
3:  stp xzr, xzr, [x0], #16
    cmp x0, x1
    b.lo 3b

    /* TTBR0, identity: [0] 0-1 GiB device, [1] 1-2 GiB normal */
    adrp x0, ttbr0_l1
    ldr x1, =(0x00000000 | DEVICE_BLOCK)
    str x1, [x0, #0]
    ldr x1, =(0x40000000 | NORMAL_BLOCK)
    str x1, [x0, #8]

    /* TTBR1 level 1: [0] -> l2_dev (PA 0-1 GiB), [1] -> l2_ram (PA 1-2 GiB) */
    adrp x0, ttbr1_l1
    adrp x1, ttbr1_l2_dev
    orr x1, x1, #DESC_TABLE
    str x1, [x0, #0]
    adrp x1, ttbr1_l2_ram
    orr x1, x1, #DESC_TABLE
    str x1, [x0, #8]

    /* l2_dev: the 2 MiB blocks holding the GIC and the UART */
    adrp x0, ttbr1_l2_dev
    ldr x1, =(BLOCK_2M(GICD_PA) | DEVICE_BLOCK)
    str x1, [x0, #((GICD_PA >> 21) * 8)]
    ldr x1, =(BLOCK_2M(GICC_PA) | DEVICE_BLOCK)
    str x1, [x0, #((GICC_PA >> 21) * 8)]
    ldr x1, =(BLOCK_2M(UART_PA) | DEVICE_BLOCK)
    str x1, [x0, #((UART_PA >> 21) * 8)]

    /* l2_ram: 2 MiB blocks from __kernel_start to __kernel_end */
    adrp x0, ttbr1_l2_ram
    ldr x2, =__kernel_start
    ldr x3, =__kernel_end
    sub x2, x2, x9
    sub x3, x3, x9
    ldr x4, =NORMAL_BLOCK
4:  ubfx x5, x2, #21, #9
    orr x6, x2, x4
    str x6, [x0, x5, lsl #3]
    add x2, x2, #0x200000
    cmp x2, x3
    b.lo 4b

    /* l2_ram[stacks slot] -> l3_stacks */
    ldr x2, =__stacks_start
    sub x2, x2, x9
    ubfx x5, x2, #21, #9
    adrp x1, ttbr1_l3_stacks
    orr x1, x1, #DESC_TABLE
    str x1, [x0, x5, lsl #3]

    /* l3_stacks: 4 KiB pages for each stack, the guard pages stay invalid */
    adrp x0, ttbr1_l3_stacks
    ldr x4, =NORMAL_PAGE
    .macro map_pages bottom, top
    ldr x2, =\bottom
    ldr x3, =\top
    sub x2, x2, x9
    sub x3, x3, x9
5:  ubfx x5, x2, #12, #9
    orr x6, x2, x4
    str x6, [x0, x5, lsl #3]
    add x2, x2, #4096
    cmp x2, x3
    b.lo 5b
    .endm
    map_pages stack0_bottom, stack0_top
    map_pages stack1_bottom, stack1_top
    dsb ish

    bl enable_mmu
    ldr x0, =kernel_entry
    br x0
    .size _start, . - _start

/* PSCI CPU_ON entry of the second vCPU (EL1, MMU off, x0 = context id). */
    .globl secondary_start
    .type secondary_start, %function
secondary_start:
    msr daifset, #0xf
    bl enable_mmu
    ldr x0, =secondary_entry
    br x0
    .size secondary_start, . - secondary_start

/* MAIR, TCR, both TTBRs, then SCTLR_EL1.M|C|I. Leaf, x0-x1 only. */
    .type enable_mmu, %function
enable_mmu:
    ldr x0, =MAIR_VALUE
    msr mair_el1, x0
    ldr x0, =TCR_VALUE
    msr tcr_el1, x0
    adrp x0, ttbr0_l1
    msr ttbr0_el1, x0
    adrp x0, ttbr1_l1
    msr ttbr1_el1, x0
    mov x0, #(3 << 20)             /* CPACR_EL1.FPEN: no trap on FP/SIMD */
    msr cpacr_el1, x0
    isb
    tlbi vmalle1
    dsb nsh
    isb
    mrs x0, sctlr_el1
    mov x1, #((1 << 0) | (1 << 2) | (1 << 12))   /* M, C, I */
    orr x0, x0, x1
    bic x0, x0, #(1 << 1)          /* A: no alignment checks */
    bic x0, x0, #(1 << 19)         /* WXN */
    msr sctlr_el1, x0
    isb
    ret
    .size enable_mmu, . - enable_mmu

hang:
    wfe
    b hang
    .ltorg

/* ---- high half: MMU on, VA = PA + KERNEL_OFFSET -------------------------------- */
    .text
    .globl kernel_entry
    .type kernel_entry, %function
    .balign 16
kernel_entry:
    CFI_STARTPROC
    CFI_UNDEFINED(x30)
    adr x0, vectors
    msr vbar_el1, x0
    isb
    ldr x0, =stack0_top
    mov sp, x0
    mov x29, #0
    mov x30, #0
    bl kmain
1:  wfi
    b 1b
    CFI_ENDPROC
    .size kernel_entry, . - kernel_entry

    .globl secondary_entry
    .type secondary_entry, %function
    .balign 16
secondary_entry:
    CFI_STARTPROC
    CFI_UNDEFINED(x30)
    adr x0, vectors
    msr vbar_el1, x0
    isb
    ldr x0, =stack1_top
    mov sp, x0
    mov x29, #0
    mov x30, #0
    bl second_cpu_main
1:  wfi
    b 1b
    CFI_ENDPROC
    .size secondary_entry, . - secondary_entry
    .ltorg

/* Exception vectors: none is expected (interrupts stay masked; the timer only wakes
 * wfi). Each of the 16 entries passes its index to guest_fault on a fault stack. */
    .section .text.vectors, "ax"
    .balign 2048
    .globl vectors
vectors:
    .set index, 0
    .rept 16
    .balign 128
    mov x0, #index
    b fault_common
    .set index, index + 1
    .endr
    .type fault_common, %function
fault_common:
    CFI_STARTPROC
    CFI_UNDEFINED(x30)
    ldr x1, =fault_stack_top
    mov sp, x1
    mov x29, #0
    mrs x1, esr_el1
    mrs x2, far_el1
    mrs x3, elr_el1
    bl guest_fault
2:  wfi
    b 2b
    CFI_ENDPROC
    .size fault_common, . - fault_common
    .ltorg

/* The physical address of secondary_start for PSCI CPU_ON: C code in the high half
 * cannot form it PC-relatively (more than 4 GiB away). */
    .section .rodata
    .balign 8
    .globl secondary_start_pa
secondary_start_pa: .quad secondary_start

    .bss
    .balign 16
fault_stack: .skip 4096
fault_stack_top:
