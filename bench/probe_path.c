/* The process probe's instruction path, counted (bench/trace_guest_bench.py): a call of
 * `empty` (a body of two instructions) in a loop, after `marker`, which gdb stops at
 * before it single-steps one call of `empty` to its return, with and without glass trace
 * patching `empty`. Hardware counters are not available on every host (perf stat counts
 * nothing in most VMs); single-stepping counts every instruction the probe runs. */
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

volatile uint64_t sink;
volatile int go_on = 1;

__attribute__((noinline, noclone)) uint64_t empty(uint64_t x) {
    sink = x;
    return x + 1;
}

__attribute__((noinline, noclone)) void marker(void) { __asm__ volatile(""); }

int main(void) {
    uint64_t x = 0;
    /* The probe's first calls in a thread set its area up: not the path measured. */
    for (int i = 0; i < 100000; i++) x = empty(x);
    printf("%d\n", (int)getpid());
    fflush(stdout);
    while (go_on) {
        marker();
        x = empty(x);
    }
    return (int)(x & 1);
}
