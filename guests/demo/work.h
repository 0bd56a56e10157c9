/* The unit of work of the demo guests (guests/demo, guests/unikernel): a spin loop of
 * UNIT_ITERATIONS (defined by each guest before including this) per unit, inlined into
 * each caller so that the caller's own frame holds the time, after a call to a tiny
 * function so the caller is never a leaf. */
#ifndef GLASS_GUEST_WORK_H
#define GLASS_GUEST_WORK_H
#include <stdint.h>

volatile uint64_t work_sink;

__attribute__((noinline, noclone)) static void checkpoint(void) { work_sink++; }

static inline __attribute__((always_inline)) uint64_t spin_units(uint64_t units, uint64_t seed) {
    checkpoint();
    uint64_t x = seed | 1;
    for (uint64_t i = 0; i < units * UNIT_ITERATIONS; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        __asm__ volatile("" : "+r"(x));
    }
    return x;
}
#endif
