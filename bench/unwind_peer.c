/* The libunwind side of the unwinding benchmark. It builds a stack DEPTH frames deep
 * (compiled without frame pointers), then at the bottom
 *   - times unw_backtrace() and the unw_step() loop, as seed 002 measured them, and
 *   - writes the registers and the top of its stack, and its executable mappings, to
 *     OUT so that glass unwinds exactly the same stack (bench/run does that).
 * Usage: unwind_peer DEPTH ITERATIONS OUT */
#define UNW_LOCAL_ONLY
#include <libunwind.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static long iterations;
static const char *out_path;
volatile long sink;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

__attribute__((noinline)) static void measure_and_dump(void) {
    void *frames[512];
    int depth = 0;
    double start = now();
    for (long i = 0; i < iterations; i++) depth = unw_backtrace(frames, 512);
    double backtrace_ns = (now() - start) / iterations;

    int steps = 0;
    start = now();
    for (long i = 0; i < iterations; i++) {
        unw_context_t context;
        unw_cursor_t cursor;
        unw_getcontext(&context);
        unw_init_local(&cursor, &context);
        steps = 0;
        while (unw_step(&cursor) > 0) steps++;
    }
    double step_ns = (now() - start) / iterations;
    printf("unw_backtrace_ns %.1f frames %d\nunw_step_ns %.1f steps %d\n", backtrace_ns, depth, step_ns, steps);

    /* The same stack for glass: registers here, then the stack above. */
    uint64_t rsp, rbp, rip;
    __asm__ volatile("mov %%rsp, %0; mov %%rbp, %1; lea 0(%%rip), %2" : "=r"(rsp), "=r"(rbp), "=r"(rip));
    size_t size = 32768;
    FILE *out = fopen(out_path, "w");
    if (!out) { perror(out_path); exit(1); }
    fprintf(out, "%llx %llx %llx %zu\n", (unsigned long long)rip, (unsigned long long)rsp, (unsigned long long)rbp, size);
    FILE *maps = fopen("/proc/self/maps", "r");
    char line[4096];
    while (maps && fgets(line, sizeof line, maps)) {
        unsigned long long start_addr, end_addr, offset;
        char perms[8], path[3000] = "";
        if (sscanf(line, "%llx-%llx %7s %llx %*s %*s %2999s", &start_addr, &end_addr, perms, &offset, path) >= 4 &&
            perms[2] == 'x' && path[0] == '/')
            fprintf(out, "map %llx %llx %llx %s\n", start_addr, end_addr, offset, path);
    }
    fprintf(out, "stack\n");
    fwrite((void *)rsp, 1, size, out);
    fclose(out);
}

__attribute__((noinline)) static void descend(int depth) {
    if (depth > 0) descend(depth - 1);
    else measure_and_dump();
    sink += depth;
}

int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: unwind_peer DEPTH ITERATIONS OUT\n"); return 2; }
    iterations = atol(argv[2]);
    out_path = argv[3];
    descend(atoi(argv[1]));
    return 0;
}
