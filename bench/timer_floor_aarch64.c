/* The floor of a traced call on AArch64: its two timestamps, two back-to-back reads of
 * the generic timer's virtual count (CNTVCT_EL0, as glass's probe reads it: a plain
 * `mrs`, no `isb`), N times (default 20 million). Timed as tests/fixtures/trace/callloop.c
 * times its loop: with GLASS_FIXTURE_TIMING set, work_seconds=... on stderr. Also prints
 * on stdout the timer's frequency (CNTFRQ_EL0) and the ticks between the two reads of a
 * pair, on average. Built by bench/trace_aarch64_bench.py with aarch64-linux-gnu-gcc -O2. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static inline unsigned long cntvct(void) {
    unsigned long value;
    __asm__ volatile("mrs %0, cntvct_el0" : "=r"(value));
    return value;
}

static inline unsigned long cntfrq(void) {
    unsigned long value;
    __asm__ volatile("mrs %0, cntfrq_el0" : "=r"(value));
    return value;
}

int main(int argc, char **argv) {
    unsigned long pairs = argc > 1 ? strtoul(argv[1], NULL, 10) : 20000000ul;
    unsigned long delta = 0;
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (unsigned long i = 0; i < pairs; i++) {
        unsigned long first = cntvct();
        unsigned long second = cntvct();
        delta += second - first;
    }
    clock_gettime(CLOCK_MONOTONIC, &end);
    printf("cntfrq=%lu pairs=%lu ticks_between=%.4f\n", cntfrq(), pairs, pairs ? (double)delta / pairs : 0.0);
    if (getenv("GLASS_FIXTURE_TIMING"))
        fprintf(stderr, "work_seconds=%.6f\n",
                (end.tv_sec - start.tv_sec) + (end.tv_nsec - start.tv_nsec) / 1e9);
    return 0;
}
