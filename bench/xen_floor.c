/* The floor of sampling a Xen guest from dom0 with libxenctrl, the way any tool built on
 * it does (bench/xen_bench.py; runs in the nested dom0 of guests/xen).
 *
 *   xen_floor DOMID ctx|bare N HZ [SECONDS]
 *
 * N times (or until SECONDS have passed, if given), HZ times a second (sleeping to absolute
 * deadlines; a late sample starts the next period afresh), the domain is held paused:
 *   ctx:  xc_domain_pause, xc_vcpu_getcontext for every vCPU, xc_domain_unpause
 *   bare: xc_domain_pause, xc_domain_unpause
 * Each window is timed with CLOCK_MONOTONIC from before the pause to after the unpause
 * returned (as glass times its own), and each part of it apart: the pause call, the
 * context calls, the unpause call. No stack is read. Five windows first, not counted.
 * Prints one line: mode=M hz=HZ n=SAMPLES vcpus=V p50_us=.. p99_us=.. mean_us=.. max_us=..
 * pause_p50_us=.. ctx_p50_us=.. unpause_p50_us=.. cpu_us=.. per_s=..
 * (cpu_us: the process's own CPU time, user + system, per counted window, from
 * getrusage: in a Xen dom0 the system part holds the hypercalls' time in Xen; per_s: the
 * windows taken per second of the counted time.)
 *
 * Build: gcc -O2 bench/xen_floor.c -o xen_floor -lxenctrl */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <xenctrl.h>

#include "bench_clock.h"

static double pct(const double *sorted, int n, double p) {
    int i = (int)((n - 1) * p + 0.5);
    return sorted[i < n ? i : n - 1];
}

int main(int argc, char **argv) {
    if (argc != 5 && argc != 6) {
        fprintf(stderr, "usage: %s DOMID ctx|bare N HZ [SECONDS]\n", argv[0]);
        return 2;
    }
    uint32_t domid = (uint32_t)atoi(argv[1]);
    int with_ctx = strcmp(argv[2], "ctx") == 0;
    if (!with_ctx && strcmp(argv[2], "bare") != 0) {
        fprintf(stderr, "xen_floor: mode is ctx or bare, not %s\n", argv[2]);
        return 2;
    }
    int n = atoi(argv[3]);
    double hz = atof(argv[4]);
    double limit_ns = argc == 6 ? atof(argv[5]) * 1e9 : 0;
    if (n < 1 || hz <= 0) {
        fprintf(stderr, "xen_floor: N and HZ must be positive\n");
        return 2;
    }
    xc_interface *xch = xc_interface_open(NULL, NULL, 0);
    if (!xch) {
        perror("xen_floor: xc_interface_open");
        return 1;
    }
    xc_dominfo_t info;
    if (xc_domain_getinfo(xch, domid, 1, &info) != 1 || info.domid != domid) {
        fprintf(stderr, "xen_floor: no domain %u\n", domid);
        return 1;
    }
    unsigned vcpus = info.max_vcpu_id + 1;
    vcpu_guest_context_any_t ctx;
    double *window = calloc(n, sizeof *window), *paused = calloc(n, sizeof *paused),
           *read = calloc(n, sizeof *read), *unpaused = calloc(n, sizeof *unpaused);
    const int warm = 5;
    long period = (long)(1e9 / hz);
    struct timespec next;
    clock_gettime(CLOCK_MONOTONIC, &next);
    double began = 0, cpu_began = 0;
    int done = 0;
    for (int i = -warm; i < n; i++) {
        if (i == 0) {
            began = now_ns();
            cpu_began = cpu_us();
        }
        else if (i > 0 && limit_ns > 0 && now_ns() - began > limit_ns)
            break;
        double t0 = now_ns();
        if (xc_domain_pause(xch, domid)) {
            perror("xen_floor: xc_domain_pause");
            return 1;
        }
        double t1 = now_ns();
        if (with_ctx)
            for (unsigned v = 0; v < vcpus; v++)
                if (xc_vcpu_getcontext(xch, domid, v, &ctx) && errno != ENODATA) {
                    perror("xen_floor: xc_vcpu_getcontext");
                    xc_domain_unpause(xch, domid);
                    return 1;
                }
        double t2 = now_ns();
        if (xc_domain_unpause(xch, domid)) {
            perror("xen_floor: xc_domain_unpause");
            return 1;
        }
        double t3 = now_ns();
        if (i >= 0) {
            window[i] = (t3 - t0) / 1e3;
            paused[i] = (t1 - t0) / 1e3;
            read[i] = (t2 - t1) / 1e3;
            unpaused[i] = (t3 - t2) / 1e3;
            done = i + 1;
        }
        next.tv_nsec += period;
        while (next.tv_nsec >= 1000000000L) {
            next.tv_nsec -= 1000000000L;
            next.tv_sec++;
        }
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (t.tv_sec > next.tv_sec || (t.tv_sec == next.tv_sec && t.tv_nsec >= next.tv_nsec))
            next = t; /* late: no burst to catch up */
        else
            clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL);
    }
    n = done;
    double cpu = (cpu_us() - cpu_began) / (n > 0 ? n : 1), elapsed_s = (now_ns() - began) / 1e9;
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += window[i];
    qsort(window, n, sizeof *window, cmp);
    qsort(paused, n, sizeof *paused, cmp);
    qsort(read, n, sizeof *read, cmp);
    qsort(unpaused, n, sizeof *unpaused, cmp);
    printf("mode=%s hz=%g n=%d vcpus=%u p50_us=%.1f p99_us=%.1f mean_us=%.1f max_us=%.1f pause_p50_us=%.1f "
           "ctx_p50_us=%.1f unpause_p50_us=%.1f cpu_us=%.1f per_s=%.1f\n",
           argv[2], hz, n, vcpus, pct(window, n, 0.5), pct(window, n, 0.99), sum / n, window[n - 1],
           pct(paused, n, 0.5), pct(read, n, 0.5), pct(unpaused, n, 0.5), cpu, n / elapsed_s);
    xc_interface_close(xch);
    return 0;
}
