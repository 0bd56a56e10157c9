/* The disk guest: a unikernel that writes to a legacy virtio-blk disk in a loop, so a
 * profiler's cost on a VM with a block device can be read from inside (QEMU drains and
 * flushes every block device at each stop of the VM).
 *
 * It finds the virtio-blk PCI device (vendor 0x1af4, device 0x1001: legacy I/O-port
 * interface, `-device virtio-blk-pci,...,disable-modern=on`) through the PCI
 * configuration ports 0xCF8/0xCFC, sets it up (reset, ACKNOWLEDGE, DRIVER, queue 0 with a
 * vring in its own identity-mapped RAM, DRIVER_OK), and writes 4 KiB blocks one request
 * at a time (header, data and status descriptors; notify; poll the used ring: interrupts
 * stay off), cycling over the first DISK_MIB MiB of the disk.
 *
 * Each block holds a recognizable pattern: "GLASSBLK", the block number and the pass
 * (both u64, little-endian) in its first 24 bytes, then u64 words (block << 32 | word).
 *
 * Serial (COM1):
 *   "glass disk guest: virtio-blk io=0x.. capacity=SECTORS queue=N mib=M tsc_hz=HZ"
 *   "rate writes=N cycles=TSC" every ~250 ms of guest time (the TSC, calibrated against
 *   the PIT; QEMU stops both while the VM is stopped)
 *   "disk: ..." and a halt on any failure.
 * Call chain: kmain -> write_loop -> write_block -> submit / wait_used. */
#include <stdint.h>
#include "../demo/serial.h"

#ifndef DISK_MIB
#define DISK_MIB 16
#endif
#define BLOCK 4096
#define SECTORS_PER_BLOCK (BLOCK / 512)

static inline void outw(uint16_t port, uint16_t v) { __asm__ volatile("outw %0, %1" : : "a"(v), "Nd"(port)); }
static inline void outl(uint16_t port, uint32_t v) { __asm__ volatile("outl %0, %1" : : "a"(v), "Nd"(port)); }
static inline uint16_t inw(uint16_t port) { uint16_t v; __asm__ volatile("inw %1, %0" : "=a"(v) : "Nd"(port)); return v; }
static inline uint32_t inl(uint16_t port) { uint32_t v; __asm__ volatile("inl %1, %0" : "=a"(v) : "Nd"(port)); return v; }
/* The device reads and writes the rings from another thread: order our stores. */
static inline void barrier(void) { __asm__ volatile("mfence" ::: "memory"); }

static void serial_puthex(uint64_t v) {
    serial_puts("0x");
    for (int shift = 60; shift >= 0; shift -= 4) {
        int d = (v >> shift) & 15;
        if (d || shift < 16) serial_putc((char)(d < 10 ? '0' + d : 'a' + d - 10));
    }
}

static __attribute__((noreturn)) void fail(const char *what) {
    serial_puts("disk: ");
    serial_puts(what);
    serial_puts("\n");
    for (;;) __asm__ volatile("cli; hlt");
}

/* --- PCI configuration space (mechanism #1) ------------------------------------------ */
static uint32_t pci_read(uint32_t bus, uint32_t dev, uint32_t fn, uint32_t reg) {
    outl(0xcf8, 0x80000000u | bus << 16 | dev << 11 | fn << 8 | (reg & 0xfc));
    return inl(0xcfc);
}
static void pci_write(uint32_t bus, uint32_t dev, uint32_t fn, uint32_t reg, uint32_t v) {
    outl(0xcf8, 0x80000000u | bus << 16 | dev << 11 | fn << 8 | (reg & 0xfc));
    outl(0xcfc, v);
}

/* --- legacy virtio over I/O ports ---------------------------------------------------- */
enum {
    VIRTIO_HOST_FEATURES = 0x00, VIRTIO_GUEST_FEATURES = 0x04, VIRTIO_QUEUE_PFN = 0x08,
    VIRTIO_QUEUE_SIZE = 0x0c, VIRTIO_QUEUE_SELECT = 0x0e, VIRTIO_QUEUE_NOTIFY = 0x10,
    VIRTIO_STATUS = 0x12, VIRTIO_ISR = 0x13, VIRTIO_BLK_CAPACITY = 0x14, /* no MSI-X */
};
enum { STATUS_ACK = 1, STATUS_DRIVER = 2, STATUS_DRIVER_OK = 4, STATUS_FAILED = 128 };
enum { DESC_NEXT = 1, DESC_WRITE = 2, AVAIL_NO_INTERRUPT = 1 };
enum { BLK_T_OUT = 1, BLK_F_FLUSH = 1 << 9 };
#define MAX_QUEUE 1024

struct desc { uint64_t addr; uint32_t len; uint16_t flags, next; };
struct blk_header { uint32_t type, reserved; uint64_t sector; };

/* The vring (legacy layout: descriptors, available ring, then the used ring on the next
 * page) for the largest queue the device may have; the RAM is identity-mapped, so its
 * addresses are physical addresses. */
static uint8_t vring[65536] __attribute__((aligned(4096)));
static uint8_t data[BLOCK] __attribute__((aligned(4096)));
static struct blk_header header __attribute__((aligned(16)));
static volatile uint8_t status_byte;

static uint16_t io;
static uint16_t queue_size;
static struct desc *descs;
static volatile uint16_t *avail;      /* flags, idx, ring[queue_size] */
static volatile uint16_t *used;       /* flags, idx, then {u32 id, u32 len}[queue_size] */
static uint16_t avail_idx, used_seen;

static void find_device(void) {
    for (uint32_t bus = 0; bus < 256; bus++)
        for (uint32_t dev = 0; dev < 32; dev++) {
            uint32_t id = pci_read(bus, dev, 0, 0);
            if (id != (0x1001u << 16 | 0x1af4u)) continue;
            uint32_t bar0 = pci_read(bus, dev, 0, 0x10);
            if (!(bar0 & 1)) fail("BAR0 of the virtio-blk device is not an I/O BAR");
            io = (uint16_t)(bar0 & ~3u);
            /* I/O space and bus mastering on (the firmware may have left them off). */
            uint32_t command = pci_read(bus, dev, 0, 0x04);
            pci_write(bus, dev, 0, 0x04, (command & 0xffff) | 0x5);
            return;
        }
    fail("no legacy virtio-blk PCI device (1af4:1001): use -device virtio-blk-pci,disable-modern=on");
}

static void setup_device(void) {
    outb(io + VIRTIO_STATUS, 0);                                 /* reset */
    outb(io + VIRTIO_STATUS, STATUS_ACK);
    outb(io + VIRTIO_STATUS, STATUS_ACK | STATUS_DRIVER);
    /* Only VIRTIO_BLK_F_FLUSH: without it QEMU turns the disk's write cache off (a
     * legacy guest that cannot flush gets writethrough, an fdatasync per write), and
     * cache=writeback would not be what the guest runs with. */
    uint32_t features = inl(io + VIRTIO_HOST_FEATURES);
    outl(io + VIRTIO_GUEST_FEATURES, features & BLK_F_FLUSH);
    outw(io + VIRTIO_QUEUE_SELECT, 0);
    queue_size = inw(io + VIRTIO_QUEUE_SIZE);
    if (queue_size < 3 || queue_size > MAX_QUEUE) {
        outb(io + VIRTIO_STATUS, STATUS_FAILED);
        fail("queue 0 has an unusable size");
    }
    for (unsigned i = 0; i < sizeof vring; i++) vring[i] = 0;
    descs = (struct desc *)vring;
    avail = (volatile uint16_t *)(vring + 16 * queue_size);
    uint64_t used_offset = (16 * queue_size + 2 * (3 + queue_size) + 4095) & ~4095ull;
    used = (volatile uint16_t *)(vring + used_offset);
    avail[0] = AVAIL_NO_INTERRUPT;                               /* we poll */
    outl(io + VIRTIO_QUEUE_PFN, (uint32_t)((uint64_t)vring >> 12));
    outb(io + VIRTIO_STATUS, STATUS_ACK | STATUS_DRIVER | STATUS_DRIVER_OK);
    /* One request is three chained descriptors: header, data (read by the device),
     * status (written by it). They never change but for the header's sector. */
    descs[0] = (struct desc){ (uint64_t)&header, sizeof header, DESC_NEXT, 1 };
    descs[1] = (struct desc){ (uint64_t)data, BLOCK, DESC_NEXT, 2 };
    descs[2] = (struct desc){ (uint64_t)&status_byte, 1, DESC_WRITE, 0 };
}

__attribute__((noinline)) void submit(uint64_t sector) {
    header.type = BLK_T_OUT;
    header.reserved = 0;
    header.sector = sector;
    status_byte = 0xff;
    avail[2 + avail_idx % queue_size] = 0;                       /* head descriptor */
    barrier();
    avail[1] = ++avail_idx;
    barrier();
    outw(io + VIRTIO_QUEUE_NOTIFY, 0);
}

/* No `pause` in the loop: under TCG it leaves the translated code for QEMU's vCPU loop
 * (and its global lock) every time; with it the guest wrote about a quarter less here. */
__attribute__((noinline)) void wait_used(void) {
    while (used[1] == used_seen) {}
    used_seen++;
    barrier();
    if (status_byte != 0) fail("a write failed (status not OK)");
}

__attribute__((noinline)) void fill_block(uint64_t block, uint64_t pass) {
    uint64_t *words = (uint64_t *)data;
    words[0] = 0x4b4c425353414c47ull;                           /* "GLASSBLK" */
    words[1] = block;
    words[2] = pass;
    for (uint64_t i = 3; i < BLOCK / 8; i++) words[i] = block << 32 | i;
}

__attribute__((noinline)) void write_block(uint64_t block, uint64_t pass) {
    fill_block(block, pass);
    submit(block * SECTORS_PER_BLOCK);
    wait_used();
}

/* TSC ticks per second, against PIT channel 2 counting down 50 ms. */
static uint64_t tsc_hz(void) {
    const uint32_t count = 59659;                                /* 1193182 Hz * 50 ms */
    outb(0x61, (inb(0x61) & ~0x02) | 0x01);                     /* gate on, speaker off */
    outb(0x43, 0xb0);                                            /* ch 2, lo/hi, mode 0 */
    outb(0x42, count & 0xff);
    outb(0x42, count >> 8);
    uint64_t start = rdtsc();
    while (!(inb(0x61) & 0x20)) {}
    return (rdtsc() - start) * 20;
}

__attribute__((noinline)) void write_loop(uint64_t hz) {
    const uint64_t blocks = (uint64_t)DISK_MIB * 1024 * 1024 / BLOCK;
    uint64_t interval = hz / 4, writes = 0, last = rdtsc();
    for (uint64_t pass = 0;; pass++)
        for (uint64_t block = 0; block < blocks; block++) {
            write_block(block, pass);
            writes++;
            uint64_t now = rdtsc();
            if (now - last >= interval) {
                serial_puts("rate writes=");
                serial_putu(writes);
                serial_puts(" cycles=");
                serial_putu(now - last);
                serial_puts("\n");
                writes = 0;
                last = now;
            }
        }
}

void kmain(void) {
    find_device();
    setup_device();
    uint64_t capacity = (uint64_t)inl(io + VIRTIO_BLK_CAPACITY) |
                        (uint64_t)inl(io + VIRTIO_BLK_CAPACITY + 4) << 32;
    if (capacity < (uint64_t)DISK_MIB * 2048) fail("the disk is smaller than DISK_MIB");
    uint64_t hz = tsc_hz();
    serial_puts("glass disk guest: virtio-blk io=");
    serial_puthex(io);
    serial_puts(" capacity=");
    serial_putu(capacity);
    serial_puts(" queue=");
    serial_putu(queue_size);
    serial_puts(" mib=");
    serial_putu(DISK_MIB);
    serial_puts(" tsc_hz=");
    serial_putu(hz);
    serial_puts("\n");
    write_loop(hz);
}
