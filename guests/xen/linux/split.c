/* split: a CPU workload with a known time split, the ground truth for profiling a Xen PV
 * domU. Two threads, each pinned to its own vCPU:
 *   vCPU0: rounds of alpha (6 units), beta (3 units, reached through a recursion
 *          BETA_DEPTH frames deep) and gamma (1 unit) = a 60/30/10 split; each function
 *          measures its own inclusive time (rdtsc by default, or clock_gettime
 *          (CLOCK_MONOTONIC) with timer "clock") and the thread prints, every ~2 s,
 *          `split alpha=A% beta=B% gamma=G% rounds=N time=TA/TB/TG` (cumulative, one
 *          decimal; TA/TB/TG the cumulative stamps themselves).
 *   vCPU1: only delta (busy), printing `delta rounds=N` every ~2 s.
 * All work happens in the one leaf spin_unit(), called from every function; every call is
 * followed by work so gcc emits no tail calls and each caller stays on the stack. gcc 12
 * gives the leaf spin_unit no frame (no push rbp) even with -fno-omit-frame-pointer: a
 * pure frame-pointer walk from a sample inside it skips its caller; .eh_frame has its CFI.
 * Build: gcc -static -no-pie -O2 -g -fno-omit-frame-pointer -fno-builtin-gamma -pthread
 *        split.c -o split   (gamma is also a libm builtin name)
 * Usage: split [UNIT_ITERS [tsc|clock]]   (default 1000000 loop iterations per unit, tsc)
 * In a Xen PV domU under TCG clock_gettime is a real syscall (no vDSO: the TSC is not
 * stable), 15-200 µs there, which would inflate the small gamma; split prints
 * what each timer costs at start. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BETA_DEPTH 20
#define REPORT_NS 2000000000ull

static unsigned long unit_iters = 1000000;
static int use_clock; /* 0: rdtsc, 1: clock_gettime(CLOCK_MONOTONIC) */
volatile uint64_t sink;                 /* keeps results alive; written after every call */
static uint64_t t_alpha, t_beta, t_gamma; /* inclusive stamps, written by the vCPU0 thread only */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t rdtsc(void)
{
    uint32_t lo, hi;
    __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
    return ((uint64_t)hi << 32) | lo;
}

/* The timestamp for the inclusive times: only their ratios matter. */
static inline uint64_t stamp(void)
{
    return use_clock ? now_ns() : rdtsc();
}

/* The unit of work: an LCG the compiler cannot fold away. */
__attribute__((noinline)) uint64_t spin_unit(uint64_t x)
{
    for (unsigned long i = 0; i < unit_iters; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        __asm__ volatile("" : "+r"(x));
    }
    return x;
}

__attribute__((noinline)) uint64_t alpha(uint64_t x)
{
    uint64_t t0 = stamp();
    for (int i = 0; i < 6; i++) {
        x = spin_unit(x);
        sink = x;
    }
    t_alpha += stamp() - t0;
    return x;
}

__attribute__((noinline)) uint64_t beta_rec(int depth, uint64_t x)
{
    if (depth == 0) {
        for (int i = 0; i < 3; i++) {
            x = spin_unit(x);
            sink = x;
        }
        return x;
    }
    x = beta_rec(depth - 1, x + (uint64_t)depth);
    sink = x;                        /* work after the call: no tail call, no loop */
    __asm__ volatile("" ::: "memory");
    return x ^ (uint64_t)depth;
}

__attribute__((noinline)) uint64_t beta(uint64_t x)
{
    uint64_t t0 = stamp();
    x = beta_rec(BETA_DEPTH - 1, x);
    sink = x;
    t_beta += stamp() - t0;
    return x;
}

__attribute__((noinline)) uint64_t gamma(uint64_t x)
{
    uint64_t t0 = stamp();
    x = spin_unit(x);
    sink = x;
    t_gamma += stamp() - t0;
    return x;
}

__attribute__((noinline)) uint64_t delta(uint64_t x)
{
    for (int i = 0; i < 10; i++) {
        x = spin_unit(x);
        sink = x;
    }
    return x;
}

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof buf - 1)
        n = sizeof buf - 1;
    (void)!write(1, buf, (size_t)n); /* one write per line: the two threads never interleave */
}

static void pin(int cpu, const char *who)
{
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(ncpu > cpu ? cpu : 0, &set);
    int err = pthread_setaffinity_np(pthread_self(), sizeof set, &set);
    say("split: %s pinned to vcpu %d%s (tid %ld)\n", who, ncpu > cpu ? cpu : 0,
        err ? " FAILED" : ncpu > cpu ? "" : " (only one vcpu online)", (long)gettid());
}

static void *delta_thread(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "split-delta");
    pin(1, "delta");
    uint64_t x = 2, rounds = 0, last = now_ns();
    for (;;) {
        x = delta(x);
        sink = x;
        rounds++;
        uint64_t t = now_ns();
        if (t - last >= REPORT_NS) {
            say("delta rounds=%llu\n", (unsigned long long)rounds);
            last = t;
        }
    }
    return NULL;
}

static void pct(uint64_t part, uint64_t total, unsigned *whole, unsigned *tenth)
{
    uint64_t p = total ? (part * 1000 + total / 2) / total : 0; /* tenths of a percent */
    *whole = (unsigned)(p / 10);
    *tenth = (unsigned)(p % 10);
}

int main(int argc, char **argv)
{
    if (argc > 1 && atol(argv[1]) > 0)
        unit_iters = (unsigned long)atol(argv[1]);
    if (argc > 2)
        use_clock = strcmp(argv[2], "clock") == 0;
    /* What the timers and one unit cost here (ns, measured with CLOCK_MONOTONIC). */
    uint64_t c0 = now_ns();
    for (int i = 0; i < 200; i++)
        sink = now_ns();
    uint64_t c1 = now_ns();
    for (int i = 0; i < 200; i++)
        sink = rdtsc();
    uint64_t c2 = now_ns();
    sink = spin_unit(3);
    uint64_t c3 = now_ns();
    say("split: start unit_iters=%lu beta_depth=%d vcpus=%ld pid=%ld timer=%s;"
        " unit=%llu us clock_gettime=%llu ns rdtsc=%llu ns\n",
        unit_iters, BETA_DEPTH, sysconf(_SC_NPROCESSORS_ONLN), (long)getpid(),
        use_clock ? "clock" : "tsc", (unsigned long long)(c3 - c2) / 1000,
        (unsigned long long)(c1 - c0) / 200, (unsigned long long)(c2 - c1) / 200);
    pthread_t th;
    if (pthread_create(&th, NULL, delta_thread, NULL) != 0) {
        say("split: pthread_create failed\n");
        return 1;
    }
    pthread_setname_np(pthread_self(), "split-abg");
    pin(0, "alpha/beta/gamma");
    uint64_t x = 1, rounds = 0, last = now_ns();
    for (;;) {
        x = alpha(x);
        sink = x;
        x = beta(x);
        sink = x;
        x = gamma(x);
        sink = x;
        rounds++;
        uint64_t t = now_ns();
        if (t - last >= REPORT_NS) {
            uint64_t total = t_alpha + t_beta + t_gamma;
            unsigned aw, at, bw, bt, gw, gt;
            pct(t_alpha, total, &aw, &at);
            pct(t_beta, total, &bw, &bt);
            pct(t_gamma, total, &gw, &gt);
            /* time=: the cumulative times themselves, so that a profile of any window
             * can be checked against the difference of two lines. */
            say("split alpha=%u.%u%% beta=%u.%u%% gamma=%u.%u%% rounds=%llu time=%llu/%llu/%llu\n",
                aw, at, bw, bt, gw, gt, (unsigned long long)rounds, (unsigned long long)t_alpha,
                (unsigned long long)t_beta, (unsigned long long)t_gamma);
            last = t;
        }
    }
}
