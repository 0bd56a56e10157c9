/* Linker script of the AArch64 demo guest (preprocessed with cpp, constants from
 * layout.h). The boot code (.boot.*) is linked at its physical address (VMA = LMA,
 * runs with the MMU off); everything else at PA + KERNEL_OFFSET in the TTBR1 half. */
#include "layout.h"
ENTRY(_start)
SECTIONS {
    . = PHYS_BASE;
    __image_phys_start = .;
    .boot : { *(.boot.text) }
    .note.gnu.build-id : { *(.note.gnu.build-id) }
    .boot.bss (NOLOAD) : ALIGN(4096) { *(.boot.bss) }   /* page tables */

    . = ALIGN(4096) + KERNEL_OFFSET;
    __kernel_start = PHYS_BASE + KERNEL_OFFSET;          /* first 2 MiB block */
    .text : AT(ADDR(.text) - KERNEL_OFFSET) {
        __text_start = .; *(.text.vectors) *(.text*) __text_end = .;
    }
    /* Code, read-only data and written data on 4 KiB pages of their own: a store to a
     * page holding translated code sends QEMU's TCG down its slow path (self-modifying
     * code checks), which would skew the guest's timing of the code there. */
    . = ALIGN(4096);
    .rodata : AT(ADDR(.rodata) - KERNEL_OFFSET) { *(.rodata*) }
    .eh_frame_hdr : AT(ADDR(.eh_frame_hdr) - KERNEL_OFFSET) { *(.eh_frame_hdr) }
    .eh_frame : AT(ADDR(.eh_frame) - KERNEL_OFFSET) { *(.eh_frame*) }
    . = ALIGN(4096);
    .data : AT(ADDR(.data) - KERNEL_OFFSET) { *(.data*) }
    .bss (NOLOAD) : AT(ADDR(.bss) - KERNEL_OFFSET) ALIGN(16) {
        __bss_start = .; *(.bss*) *(COMMON) . = ALIGN(16); __bss_end = .;
    }
    . = ALIGN(0x200000);
    __kernel_end = .;                                    /* end of the 2 MiB blocks */

    /* The stacks' own 2 MiB slot, mapped with 4 KiB pages; guard pages unmapped. */
    .stacks (NOLOAD) : AT(ADDR(.stacks) - KERNEL_OFFSET) {
        __stacks_start = .;
        . += GUARD_SIZE;
        stack0_bottom = .; . += STACK0_SIZE; stack0_top = .;
        . += GUARD_SIZE;
        stack1_bottom = .; . += STACK1_SIZE; stack1_top = .;
        __stacks_end = .;
    }
    ASSERT(__stacks_end - __stacks_start <= 0x200000, "stacks exceed their 2 MiB slot")
    ASSERT(__stacks_end - KERNEL_OFFSET <= 0x80000000, "image beyond the first GiB of RAM")
    /DISCARD/ : { *(.note.gnu.property) *(.comment) }
}
