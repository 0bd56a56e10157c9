/* The demo guest timing its own calls (built with -DSELF_TIME=1, guests/demo/build.sh's
 * third argument), so that what a tracer costs a call can be read from inside the guest
 * and set against what the tracer itself reports (crates/glass/tests/trace_guest.rs,
 * bench/trace_guest_bench.py). Its TSC counts instructions under QEMU's
 * `-icount shift=0`: a call's cycles with a probe minus without are the probe's
 * instructions.
 *
 * kernel.c includes this file in place of work.h and uses its macros on lines that were
 * there before, at their ends and without a semicolon of their own, so that the default
 * image (SELF_TIME off) is byte for byte what it was: the existing tests and benchmarks
 * use it, and DWARF records every statement's line and column.
 *
 * With SELF_TIME on: every call of alpha, beta and gamma_ in dispatch, and SELF_TICKS
 * calls a round of tick (a function whose body is almost empty, so a probe's own cost
 * stands out against it) and of tock (3 bytes: traced at its call sites), are timed
 * with rdtsc before and after; before "done" the
 * guest prints one line a function:
 *     self NAME calls=N p50=CYCLES min=CYCLES
 * p50 is over the last SELF_SAMPLES calls (a fixed array a function, sorted at the end:
 * no libc, no allocation). */
#ifndef GLASS_DEMO_SELF_TIME_H
#define GLASS_DEMO_SELF_TIME_H
#if defined(SELF_TIME) && SELF_TIME && defined(SELF_UNIT_ITERATIONS)
/* Longer rounds, for a slower rate of calls (the benchmark's one call a millisecond). */
#undef UNIT_ITERATIONS
#define UNIT_ITERATIONS SELF_UNIT_ITERATIONS
#endif
#include "work.h"

#ifndef SELF_TIME
#define SELF_TIME 0
#endif

#if SELF_TIME
#include "serial.h"

#ifndef SELF_TICKS
#define SELF_TICKS 0
#endif
#define SELF_SAMPLES 4096

enum { SELF_ALPHA, SELF_BETA, SELF_GAMMA, SELF_TICK, SELF_TOCK, SELF_FUNCTIONS };
static const char *const self_names[SELF_FUNCTIONS] = {"alpha", "beta", "gamma_", "tick", "tock"};
static uint64_t self_calls[SELF_FUNCTIONS];
static uint64_t self_min[SELF_FUNCTIONS];
static uint64_t self_samples[SELF_FUNCTIONS][SELF_SAMPLES];

static inline __attribute__((always_inline)) void self_note(int function, uint64_t cycles) {
    uint64_t n = self_calls[function]++;
    if (n == 0 || cycles < self_min[function]) self_min[function] = cycles;
    self_samples[function][n % SELF_SAMPLES] = cycles;
}

/* rdtsc that the compiler keeps in place against the calls around it. */
static inline __attribute__((always_inline)) uint64_t self_rdtsc(void) {
    uint32_t lo, hi;
    __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi) : : "memory");
    return ((uint64_t)hi << 32) | lo;
}

/* The call between two rdtsc, its result kept. */
#define SELF_TIMED(function, call) ({                      \
    uint64_t self_t0_ = self_rdtsc();                      \
    uint64_t self_r_ = (call);                             \
    self_note((function), self_rdtsc() - self_t0_);        \
    self_r_; })

/* dispatch's calls are timed from the end of the line before the call to the end of
 * the call's line (kernel.c's lines keep their columns): vCPU 0 alone runs them. */
static uint64_t self_t0;

/* Called many times a round: the traced call with (almost) nothing inside it. Large
 * enough for the 5-byte entry jump; not inlined or cloned, so every call is a call. */
__attribute__((noinline, noclone, used)) uint64_t tick(uint64_t x) {
    work_sink = x;
    return x + 1;
}

/* Too short for the entry jump (xor eax,eax; ret: 3 bytes) and with no padding after it
 * (tock_after follows at once, neither aligned): a tracer must take it at its call
 * sites. noipa: the caller cannot know it returns 0, so every call stays. */
__attribute__((noipa, used, section(".text.tock"), optimize("align-functions=1")))
uint64_t tock(void) { return 0; }
__attribute__((noipa, used, section(".text.tock"), optimize("align-functions=1")))
uint64_t tock_after(uint64_t x) { return x * 3; }

static inline __attribute__((always_inline)) void self_ticks(uint64_t seed) {
    for (uint64_t i = 0; i < SELF_TICKS; i++) {
        seed = SELF_TIMED(SELF_TICK, tick(seed));
        seed += SELF_TIMED(SELF_TOCK, tock());
    }
    work_sink = seed;
}

/* Shell sort: in place, no recursion, quick enough for 4096 words once at the end. */
static void self_sort(uint64_t *v, uint64_t n) {
    static const uint64_t gaps[] = {1750, 701, 301, 132, 57, 23, 10, 4, 1};
    for (unsigned g = 0; g < sizeof gaps / sizeof gaps[0]; g++) {
        uint64_t gap = gaps[g];
        for (uint64_t i = gap; i < n; i++) {
            uint64_t x = v[i], j = i;
            for (; j >= gap && v[j - gap] > x; j -= gap) v[j] = v[j - gap];
            v[j] = x;
        }
    }
}

static void self_report(void) {
    for (int f = 0; f < SELF_FUNCTIONS; f++) {
        uint64_t n = self_calls[f] < SELF_SAMPLES ? self_calls[f] : SELF_SAMPLES;
        if (self_calls[f] == 0) continue;
        self_sort(self_samples[f], n);
        serial_puts("self ");
        serial_puts(self_names[f]);
        serial_puts(" calls=");
        serial_putu(self_calls[f]);
        serial_puts(" p50=");
        serial_putu(self_samples[f][(n - 1) / 2]);
        serial_puts(" min=");
        serial_putu(self_min[f]);
        serial_puts("\n");
    }
}

#define SELF_BEGIN() self_t0 = self_rdtsc();
#define SELF_AFTER(function) self_note((function), self_rdtsc() - self_t0);
#define SELF_ROUND(seed) self_ticks(seed);
#define SELF_END() self_report();
#else
/* Nothing at all, not even an empty statement (which would get a line entry). */
#define SELF_BEGIN()
#define SELF_AFTER(function)
#define SELF_ROUND(seed)
#define SELF_END()
#endif
#endif
