/* The 32-bit demo guest (guests/demo32): the busy split of the 64-bit demo guests
 * (alpha 60%, beta 30%, gamma 10% of the same spin loop's units), measured by the guest
 * itself with rdtsc around each call and printed on the serial port as
 *   split alpha=A% beta=B% gamma=G% halted=0% rounds=N
 * every REPORT_ROUNDS rounds, the truth a profile is checked against. No libgcc (a
 * freestanding -m32 build without multilib): no 64-bit division, so the percentages
 * are computed in 32 bits. Built with frame pointers: glass walks 32-bit frames by
 * them. */
#include <stdint.h>
#include "../demo/serial.h"

#define UNIT_ITERATIONS 20000
#define REPORT_ROUNDS 64
#include "../demo/work.h"

static uint64_t cycles_alpha, cycles_beta, cycles_gamma;

__attribute__((noinline, noclone)) uint64_t alpha(uint64_t seed) { return spin_units(6, seed); }
__attribute__((noinline, noclone)) uint64_t beta(uint64_t seed) { return spin_units(3, seed); }
__attribute__((noinline, noclone)) uint64_t gamma_(uint64_t seed) { return spin_units(1, seed); }

__attribute__((noinline, noclone)) uint64_t dispatch(uint32_t round) {
    uint64_t sum = 0, t0 = rdtsc(), t1, t2, t3;
    sum += alpha(round);
    work_sink = sum;
    t1 = rdtsc();
    sum += beta(round + 1);
    work_sink = sum;
    t2 = rdtsc();
    sum += gamma_(round + 2);
    work_sink = sum;
    t3 = rdtsc();
    cycles_alpha += t1 - t0;
    cycles_beta += t2 - t1;
    cycles_gamma += t3 - t2;
    return sum;
}

static void put_u32(uint32_t v) {
    char buf[12];
    int i = 0;
    do { buf[i++] = (char)('0' + v % 10); v /= 10; } while (v);
    while (i) serial_putc(buf[--i]);
}

/* part/whole as a percentage with one decimal, both scaled down into 22 bits first. */
static void put_pct(uint64_t part, uint64_t whole) {
    while (whole >= (1u << 22)) { part >>= 1; whole >>= 1; }
    uint32_t tenths = whole ? (uint32_t)part * 1000u / (uint32_t)whole : 0;
    put_u32(tenths / 10);
    serial_putc('.');
    put_u32(tenths % 10);
    serial_putc('%');
}

__attribute__((noinline, noclone)) void run(void) {
    uint64_t checksum = 0;
    for (uint32_t round = 1;; round++) {
        checksum ^= dispatch(round);
        work_sink = checksum;
        if (round % REPORT_ROUNDS == 0) {
            uint64_t busy = cycles_alpha + cycles_beta + cycles_gamma;
            serial_puts("split alpha=");
            put_pct(cycles_alpha, busy);
            serial_puts(" beta=");
            put_pct(cycles_beta, busy);
            serial_puts(" gamma=");
            put_pct(cycles_gamma, busy);
            serial_puts(" halted=0% rounds=");
            put_u32(round);
            serial_puts("\n");
        }
    }
}

void kmain(void) {
    uint32_t cr0, cr4;
    __asm__ volatile("mov %%cr0, %0" : "=r"(cr0));
    __asm__ volatile("mov %%cr4, %0" : "=r"(cr4));
    serial_puts("glass demo32 guest: cr0=");
    put_u32(cr0 >> 31);
    serial_puts(" (PG) pae=");
    put_u32((cr4 >> 5) & 1);
    serial_puts(" alpha 60% beta 30% gamma 10%\n");
    run();
}
