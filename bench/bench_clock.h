/* The clock, CPU time and sort order both standalone Xen bench programs use
 * (bench/xen_floor.c, bench/xen_reference.c). */
#ifndef GLASS_BENCH_CLOCK_H
#define GLASS_BENCH_CLOCK_H

#include <sys/resource.h>
#include <time.h>

/* CLOCK_MONOTONIC in nanoseconds. */
static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

/* This process's user + system CPU time in microseconds. */
static double cpu_us(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e6 + u.ru_utime.tv_usec + u.ru_stime.tv_usec;
}

/* qsort's order for doubles, ascending. */
static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#endif
