/* The target of the stopped-time benchmark: it watches its own clock in a tight loop,
 * at stack depth 4 with frame pointers, and notes every gap longer than a threshold.
 * A gap is time the thread did not run: a stop by a profiler (or a preemption). It
 * measures any tool's intrusion from the target's side, the same way for all tools.
 * Usage: stall THRESHOLD_NS; prints its gaps (one per line, ns) on SIGTERM or SIGINT. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define MAX_GAPS 200000
static long gaps[MAX_GAPS];
static volatile long gap_count;
static volatile sig_atomic_t stop;

static void on_signal(int s) { (void)s; stop = 1; }

static inline long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

__attribute__((noinline)) void watch(long threshold) {
    long last = now_ns();
    while (!stop) {
        long t = now_ns();
        if (t - last > threshold && gap_count < MAX_GAPS) gaps[gap_count++] = t - last;
        last = t;
    }
}
__attribute__((noinline)) void level3(long threshold) { watch(threshold); __asm__ volatile(""); }
__attribute__((noinline)) void level2(long threshold) { level3(threshold); __asm__ volatile(""); }

int main(int argc, char **argv) {
    long threshold = argc > 1 ? atol(argv[1]) : 5000;
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    printf("ready\n");
    fflush(stdout);
    level2(threshold);
    for (long i = 0; i < gap_count; i++) printf("%ld\n", gaps[i]);
    return 0;
}
