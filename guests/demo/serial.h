/* Port I/O, the time-stamp counter and COM1 output shared by the demo guests
 * (guests/demo, guests/unikernel, guests/disk): each prints its progress on the serial
 * port, which is how the tests and benchmarks watch a guest from outside. */
#ifndef GLASS_GUEST_SERIAL_H
#define GLASS_GUEST_SERIAL_H
#include <stdint.h>

static inline void outb(uint16_t port, uint8_t value) { __asm__ volatile("outb %0, %1" : : "a"(value), "Nd"(port)); }
static inline uint8_t inb(uint16_t port) { uint8_t v; __asm__ volatile("inb %1, %0" : "=a"(v) : "Nd"(port)); return v; }
static inline uint64_t rdtsc(void) { uint32_t lo, hi; __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi)); return ((uint64_t)hi << 32) | lo; }

__attribute__((unused)) static void serial_putc(char c) {
    while (!(inb(0x3f8 + 5) & 0x20)) {}
    outb(0x3f8, (uint8_t)c);
}
__attribute__((unused)) static void serial_puts(const char *s) { while (*s) serial_putc(*s++); }
__attribute__((unused)) static void serial_putu(uint64_t v) {
    char buf[24]; int i = 0;
    do { buf[i++] = (char)('0' + v % 10); v /= 10; } while (v);
    while (i) serial_putc(buf[--i]);
}
#endif
