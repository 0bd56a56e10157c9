/* PL011 output, the generic timer and PSCI for the AArch64 demo guest (the counterpart
 * of guests/demo/serial.h): the guest prints its progress on the UART, which is how the
 * tests and benchmarks watch it from outside. Runs with the MMU on only: the UART is
 * reached at its high-half address. Both vCPUs print, one line at a time (serial_lock). */
#ifndef GLASS_AARCH64_SERIAL_H
#define GLASS_AARCH64_SERIAL_H
#include <stdint.h>
#include "layout.h"

#define UART ((volatile uint32_t *)(KERNEL_OFFSET + UART_PA))
#define UART_DR 0x00
#define UART_FR 0x18
#define UART_FR_TXFF (1 << 5)

/* The virtual count (CNTVCT_EL0), ordered after the instructions before it. */
static inline uint64_t counter(void) {
    uint64_t v;
    __asm__ volatile("isb; mrs %0, cntvct_el0" : "=r"(v) : : "memory");
    return v;
}
static inline uint64_t counter_hz(void) { uint64_t v; __asm__ volatile("mrs %0, cntfrq_el0" : "=r"(v)); return v; }

/* PSCI 0.2+ call through the HVC conduit (QEMU virt without EL2/EL3). */
static inline int64_t psci_call(uint64_t fn, uint64_t a1, uint64_t a2, uint64_t a3) {
    register uint64_t x0 __asm__("x0") = fn;
    register uint64_t x1 __asm__("x1") = a1;
    register uint64_t x2 __asm__("x2") = a2;
    register uint64_t x3 __asm__("x3") = a3;
    __asm__ volatile("hvc #0" : "+r"(x0), "+r"(x1), "+r"(x2), "+r"(x3) : :
                     "x4", "x5", "x6", "x7", "x8", "x9", "x10", "x11", "x12", "x13",
                     "x14", "x15", "x16", "x17", "memory");
    return (int64_t)x0;
}
#define PSCI_CPU_ON_64   0xc4000003
#define PSCI_SYSTEM_OFF  0x84000008

static uint32_t serial_lock_word;
__attribute__((unused)) static void serial_lock(void) {
    while (__atomic_exchange_n(&serial_lock_word, 1, __ATOMIC_ACQUIRE)) {}
}
__attribute__((unused)) static void serial_unlock(void) {
    __atomic_store_n(&serial_lock_word, 0, __ATOMIC_RELEASE);
}

__attribute__((unused)) static void serial_putc(char c) {
    while (UART[UART_FR / 4] & UART_FR_TXFF) {}
    UART[UART_DR / 4] = (uint32_t)(uint8_t)c;
}
__attribute__((unused)) static void serial_puts(const char *s) { while (*s) serial_putc(*s++); }
__attribute__((unused)) static void serial_putu(uint64_t v) {
    char buf[24]; int i = 0;
    do { buf[i++] = (char)('0' + v % 10); v /= 10; } while (v);
    while (i) serial_putc(buf[--i]);
}
__attribute__((unused)) static void serial_putx(uint64_t v) {
    serial_puts("0x");
    for (int shift = 60; shift >= 0; shift -= 4) serial_putc("0123456789abcdef"[(v >> shift) & 15]);
}
#endif
