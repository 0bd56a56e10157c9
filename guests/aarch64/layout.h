/* Memory layout of the AArch64 demo guest, shared by boot.S, kernel.c and link.ld.S
 * (the linker script goes through cpp). QEMU's virt machine: RAM at guest-physical
 * 0x4000_0000, GICv2 distributor 0x0800_0000 and CPU interface 0x0801_0000, PL011 at
 * 0x0900_0000. QEMU's -kernel loads the ELF at its physical (LMA) addresses and puts the
 * DTB at the start of RAM, below PHYS_BASE.
 *
 * Two translation regimes, 4 KiB granule, 39-bit both (T0SZ = T1SZ = 25, 3 levels):
 *   TTBR0  identity: 0x0000_0000-0x3fff_ffff one 1 GiB device block (UART, GIC),
 *          0x4000_0000-0x7fff_ffff one 1 GiB normal block (the boot code); used only
 *          until each vCPU has jumped to the high half.
 *   TTBR1  high half, VA = PA + KERNEL_OFFSET (0xffff_ff80_0000_0000):
 *          the kernel image (text, rodata, eh_frame, data, bss) with 2 MiB blocks,
 *          the stacks (own 2 MiB slot after the image) with 4 KiB pages and an unmapped
 *          guard page below each stack, the GIC and the UART with 2 MiB device blocks. */
#ifndef GLASS_AARCH64_LAYOUT_H
#define GLASS_AARCH64_LAYOUT_H

#define PHYS_BASE       0x40200000          /* load address of the image, 2 MiB aligned */
#define KERNEL_OFFSET   0xffffff8000000000  /* high-half VA minus PA */
#ifdef GLASS_XEN
/* Xen's guest memory map on ARM (xen/include/public/arch-arm.h): GUEST_RAM0_BASE
 * 0x4000_0000, vGICv2 distributor 0x0300_1000 and CPU interface 0x0300_2000, and the
 * emulated SBSA UART of vuart="sbsa_uart" at 0x2200_0000 (build.sh ... xen). */
#define UART_PA         0x22000000
#define GICD_PA         0x03001000
#define GICC_PA         0x03002000
#else
#define UART_PA         0x09000000
#define GICD_PA         0x08000000
#define GICC_PA         0x08010000
#endif
#define BLOCK_2M(pa)    ((pa) & ~0x1fffff)  /* the 2 MiB block holding pa */
#define STACK0_SIZE     0x20000             /* vCPU0: 128 KiB */
#define STACK1_SIZE     0x10000             /* vCPU1: 64 KiB */
#define GUARD_SIZE      0x1000              /* one unmapped 4 KiB page below each stack */

/* MAIR_EL1: Attr0 = 0x00 Device-nGnRnE, Attr1 = 0xff Normal write-back RW-allocate. */
#define MAIR_VALUE      0xff00
#define ATTR_DEVICE     0
#define ATTR_NORMAL     1
/* TCR_EL1: T0SZ=25 IRGN0=ORGN0=WBWA SH0=inner TG0=4K, T1SZ=25 IRGN1=ORGN1=WBWA
 * SH1=inner TG1=4K, IPS=36 bits. */
#define TCR_VALUE       0x1b5193519

/* Descriptor bits. */
#define DESC_BLOCK      0x1                 /* level 1/2 block */
#define DESC_TABLE      0x3                 /* level 1/2 table */
#define DESC_PAGE       0x3                 /* level 3 page */
#define DESC_AF         (1 << 10)
#define DESC_SH_INNER   (3 << 8)
#define DESC_XN         (3 << 53)           /* PXN | UXN */
#define NORMAL_BLOCK    (DESC_BLOCK | (ATTR_NORMAL << 2) | DESC_SH_INNER | DESC_AF)
#define NORMAL_PAGE     (DESC_PAGE | (ATTR_NORMAL << 2) | DESC_SH_INNER | DESC_AF | DESC_XN)
#define DEVICE_BLOCK    (DESC_BLOCK | (ATTR_DEVICE << 2) | DESC_AF | DESC_XN)

#endif
