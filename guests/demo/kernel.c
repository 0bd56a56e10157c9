/* The demo unikernel: runs work with a known split (alpha 60%, beta 30%, gamma 10%)
 * at stack depth >= 4 (kmain -> run_workload -> dispatch -> alpha), and prints its work
 * rate on the serial port so a profiler's cost can be read from inside. Powers off
 * (isa-debug-exit) after ROUNDS rounds, or runs forever if ROUNDS is 0. */
#include <stdint.h>
#include "serial.h"

#ifndef ROUNDS
#define ROUNDS 0
#endif
#define UNIT_ITERATIONS 20000
#include "self_time.h"

__attribute__((noinline)) uint64_t alpha(uint64_t seed) { return spin_units(6, seed); }
__attribute__((noinline)) uint64_t beta(uint64_t seed) { return spin_units(3, seed); }
__attribute__((noinline)) uint64_t gamma_(uint64_t seed) { return spin_units(1, seed); }

__attribute__((noinline)) uint64_t dispatch(uint64_t round) {
    uint64_t sum = 0; SELF_BEGIN()
    sum += alpha(round); SELF_AFTER(SELF_ALPHA)
    work_sink = sum; SELF_BEGIN()
    sum += beta(round + 1); SELF_AFTER(SELF_BETA)
    work_sink = sum; SELF_BEGIN()
    sum += gamma_(round + 2); SELF_AFTER(SELF_GAMMA)
    work_sink = sum;
    return sum;
}

__attribute__((noinline)) void run_workload(void) {
    uint64_t checksum = 0, rounds_done = 0, last = rdtsc();
    for (uint64_t round = 0; ROUNDS == 0 || round < ROUNDS; round++) {
        checksum ^= dispatch(round); SELF_ROUND(round)
        work_sink = checksum;
        if (++rounds_done % 200 == 0) {
            uint64_t now = rdtsc();
            serial_puts("rate rounds=200 cycles=");
            serial_putu(now - last);
            serial_puts("\n");
            last = now;
        }
    } SELF_END()
    serial_puts("done\n");
}

/* The second vCPU's workload: all of it in checksum_blocks, at depth 3. */
__attribute__((noinline)) uint64_t checksum_blocks(uint64_t seed) { return spin_units(2, seed); }

__attribute__((noinline)) void ap_work_loop(void) {
    uint64_t sum = 0;
    for (uint64_t i = 0;; i++) {
        sum += checksum_blocks(i);
        work_sink = sum;
    }
}

void ap_main(void) {
    ap_work_loop();
}

void kmain(void) {
    serial_puts("glass demo guest: alpha 60% beta 30% gamma 10%\n");
    run_workload();
    outb(0xf4, 0);      /* isa-debug-exit: QEMU exits */
    for (;;) __asm__ volatile("hlt");
}
