/* A uniprof-like sampler of a Xen PV guest, the reference glass is held against in
 * bench/xen_versus.py (issue 34). Written from a description of what uniprof does, not
 * from its code: per tick it pauses the domain, reads each vCPU's context, walks the
 * frame records from rbp reading only their two words through foreign mappings, and
 * unpauses; traces go to a file as raw addresses, symbolized offline.
 *
 *   xen_reference DOMID HZ SECONDS TRACES_FILE
 *
 * The stop, as uniprof's fast ("libxencall") variant makes it: every domctl (pause,
 * getvcpucontext, unpause) goes straight to Xen through libxencall, in ONE hypercall
 * buffer allocated at start and reused, rather than through libxenctrl, which bounces
 * each call's arguments through a fresh hypercall buffer (bench/xen_floor.c measures that
 * path). Guest-virtual pages are translated with xc_translate_foreign_address and mapped
 * once with libxenforeignmemory; the mapping is kept per page and never invalidated (as
 * uniprof does: a unikernel's stack and text do not move).
 *
 * The loop: deadlines start + n/HZ; a tick that is late is taken at once (no sleep, so a
 * sampler that cannot keep up runs back to back); a deadline closer than the shortest
 * nanosleep measured at start is busy-waited for; otherwise clock_nanosleep to it. No
 * budget on the guest's stopped time.
 *
 * TRACES_FILE: one line per vCPU per stop, "REALTIME_S VCPU ADDR ADDR ...", addresses in
 * hex, leaf first (the leaf is rip; the others are return addresses). REALTIME_S is
 * CLOCK_REALTIME at the pause, comparable with dom0's $EPOCHREALTIME stamps.
 * stdout, one line: hz= stops= traces= vcpus= seconds= per_s= p50_us= p99_us= mean_us=
 * max_us= pause_p50_us= ctx_p50_us= walk_p50_us= unpause_p50_us= cpu_us= frames_mean=
 * walk_cut= late= min_sleep_us= pages= start_real= end_real=
 * (the stopped window is CLOCK_MONOTONIC from before the pause until the unpause
 * returned; each part is timed apart; cpu_us is getrusage user + system per stop over
 * the loop, writing included; walk_cut counts walks ended by an unmappable page; late
 * counts ticks taken after their deadline had passed).
 *
 * Build: gcc -O2 -Wall bench/xen_reference.c -o xen_reference -lxenctrl -lxencall -lxenforeignmemory */
#define _GNU_SOURCE
#define __XEN_TOOLS__ 1
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <xen/domctl.h>
#include <xencall.h>
#include <xenctrl.h>

#include "bench_clock.h"
#include <xenforeignmemory.h>

/* The hypervisor rejects a domctl of another interface version outright; the kit runs Xen
 * 4.17, whose version this is (crates/glass-target/src/xen/abi.rs has the same). */
_Static_assert(XEN_DOMCTL_INTERFACE_VERSION == 0x15, "libxen-dev is not Xen 4.17's");

#define MAX_DEPTH 128
#define PAGE 4096UL

static double real_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static double pct(double *v, long n, double p) {
    if (n == 0)
        return 0;
    qsort(v, n, sizeof *v, cmp);
    long i = (long)((n - 1) * p + 0.5);
    return v[i < n ? i : n - 1];
}

/* Per-stop figures, grown as the run goes (a late loop takes more stops than HZ * SECONDS). */
struct series {
    double *v;
    long n, cap;
};

static void push(struct series *s, double x) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 4096;
        s->v = realloc(s->v, s->cap * sizeof *s->v);
        if (!s->v) {
            perror("xen_reference: realloc");
            exit(1);
        }
    }
    s->v[s->n++] = x;
}

static xencall_handle *xcall;
static xc_interface *xch;
static xenforeignmemory_handle *fmem;
static uint32_t domid;
/* The one hypercall buffer: the domctl, then the vCPU context it points Xen at. */
static struct xen_domctl *domctl;
static vcpu_guest_context_t *context;

static int do_domctl(uint32_t cmd) {
    domctl->cmd = cmd;
    domctl->interface_version = XEN_DOMCTL_INTERFACE_VERSION;
    domctl->domain = (domid_t)domid;
    return xencall1(xcall, __HYPERVISOR_domctl, (uint64_t)(uintptr_t)domctl);
}

static int get_context(unsigned vcpu) {
    memset(&domctl->u, 0, sizeof domctl->u);
    domctl->u.vcpucontext.vcpu = vcpu;
    /* _raw: xenctrl.h redefines set_xen_guest_handle for its own bounce buffers. */
    set_xen_guest_handle_raw(domctl->u.vcpucontext.ctxt, context);
    return do_domctl(XEN_DOMCTL_getvcpucontext);
}

/* Guest-virtual page -> its mapping in dom0, an open-addressed table that is never
 * invalidated. A page that fails to translate or map is not remembered (retried when met
 * again), as a page the guest has not touched yet may be mapped later. */
#define SLOTS 8192
static struct {
    uint64_t page;
    const uint8_t *map;
} cache[SLOTS];
static long pages_mapped;

static const uint8_t *page_of(unsigned vcpu, uint64_t va) {
    uint64_t page = va & ~(PAGE - 1);
    unsigned slot = (unsigned)((page >> 12) * 0x9E3779B97F4A7C15ULL >> 51) % SLOTS;
    for (unsigned probe = 0; probe < SLOTS; probe++, slot = (slot + 1) % SLOTS) {
        if (cache[slot].map && cache[slot].page == page)
            return cache[slot].map;
        if (!cache[slot].map)
            break;
    }
    if (cache[slot].map)
        return NULL; /* full: never expected with a unikernel's few pages */
    unsigned long frame = xc_translate_foreign_address(xch, domid, (int)vcpu, page);
    if (!frame)
        return NULL;
    xen_pfn_t pfn = frame;
    int err = 0;
    void *map = xenforeignmemory_map(fmem, domid, PROT_READ, 1, &pfn, &err);
    if (!map || err) {
        if (map)
            xenforeignmemory_unmap(fmem, map, 1);
        return NULL;
    }
    cache[slot].page = page;
    cache[slot].map = map;
    pages_mapped++;
    return map;
}

static int read_word(unsigned vcpu, uint64_t va, uint64_t *out) {
    const uint8_t *map = page_of(vcpu, va);
    if (!map)
        return -1;
    memcpy(out, map + (va & (PAGE - 1)), sizeof *out);
    return 0;
}

/* The frame-record walk: [rbp] is the caller's rbp, [rbp + 8] the return address. Only
 * those two words are read per frame; it ends at rbp 0, at an rbp that does not grow
 * (the stack grows down, so the callers' records lie above), at a page it cannot map, or
 * at MAX_DEPTH. Returns the number of addresses in `trace`; *cut is set when a page could
 * not be mapped. */
static int walk(unsigned vcpu, uint64_t rip, uint64_t rbp, uint64_t *trace, int *cut) {
    int n = 0;
    trace[n++] = rip;
    while (n < MAX_DEPTH && rbp) {
        uint64_t next, ret;
        if (read_word(vcpu, rbp, &next) || read_word(vcpu, rbp + 8, &ret)) {
            *cut = 1;
            break;
        }
        if (!ret)
            break;
        trace[n++] = ret;
        if (next <= rbp)
            break;
        rbp = next;
    }
    return n;
}

/* The shortest wait clock_nanosleep gives here: deadlines closer than that are spun for. */
static double shortest_sleep_ns(void) {
    double best = 1e18;
    for (int i = 0; i < 20; i++) {
        struct timespec us = {0, 1000};
        double t0 = now_ns();
        clock_nanosleep(CLOCK_MONOTONIC, 0, &us, NULL);
        double t = now_ns() - t0;
        if (t < best)
            best = t;
    }
    return best;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s DOMID HZ SECONDS TRACES_FILE\n", argv[0]);
        return 2;
    }
    domid = (uint32_t)atoi(argv[1]);
    double hz = atof(argv[2]), seconds = atof(argv[3]);
    if (hz <= 0 || seconds <= 0) {
        fprintf(stderr, "xen_reference: HZ and SECONDS must be positive\n");
        return 2;
    }
    FILE *traces = fopen(argv[4], "w");
    if (!traces) {
        perror("xen_reference: TRACES_FILE");
        return 1;
    }
    /* Writing happens after each unpause; a large buffer keeps it to few write calls. */
    setvbuf(traces, NULL, _IOFBF, 1 << 20);
    xch = xc_interface_open(NULL, NULL, 0);
    xcall = xencall_open(NULL, 0);
    fmem = xenforeignmemory_open(NULL, 0);
    if (!xch || !xcall || !fmem) {
        perror("xen_reference: opening libxenctrl, libxencall or libxenforeignmemory");
        return 1;
    }
    xc_dominfo_t info;
    if (xc_domain_getinfo(xch, domid, 1, &info) != 1 || info.domid != domid) {
        fprintf(stderr, "xen_reference: no domain %u\n", domid);
        return 1;
    }
    if (info.hvm) {
        /* rip/rbp come from the PV context layout below; an HVM domain's would need
         * the HVM context record instead. */
        fprintf(stderr, "xen_reference: domain %u is HVM/PVH; this reference samples PV guests\n", domid);
        return 1;
    }
    unsigned vcpus = info.max_vcpu_id + 1;
    size_t ctx_at = (sizeof *domctl + 63) & ~(size_t)63;
    uint8_t *buffer = xencall_alloc_buffer(xcall, ctx_at + sizeof *context);
    if (!buffer) {
        perror("xen_reference: xencall_alloc_buffer");
        return 1;
    }
    domctl = (struct xen_domctl *)buffer;
    context = (vcpu_guest_context_t *)(buffer + ctx_at);

    double min_sleep = shortest_sleep_ns();
    struct series window = {0}, paused = {0}, contexts = {0}, walked = {0}, unpaused = {0};
    long frames = 0, cut_walks = 0, late = 0, traces_n = 0;
    static uint64_t walks[64][MAX_DEPTH];
    uint64_t rip[64], rbp[64];
    int online[64];
    if (vcpus > 64) {
        fprintf(stderr, "xen_reference: %u vCPUs; this reference walks at most 64\n", vcpus);
        return 1;
    }

    double start = now_ns(), end = start + seconds * 1e9, period = 1e9 / hz;
    double start_real = real_s(), cpu_began = cpu_us();
    for (long n = 0;; n++) {
        double deadline = start + n * period, now = now_ns();
        /* Both ends: a sampler that fell behind stops at SECONDS of wall time, not after
         * HZ * SECONDS stops. */
        if (deadline >= end || now >= end)
            break;
        if (now >= deadline) {
            if (n > 0)
                late++;
        } else if (deadline - now < min_sleep) {
            while (now_ns() < deadline)
                ;
        } else {
            struct timespec at = {(time_t)(deadline / 1e9), (long)((uint64_t)deadline % 1000000000ULL)};
            clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &at, NULL);
        }

        double stamp = real_s();
        double t0 = now_ns();
        if (do_domctl(XEN_DOMCTL_pausedomain)) {
            perror("xen_reference: pausedomain");
            return 1;
        }
        double t1 = now_ns();
        for (unsigned v = 0; v < vcpus; v++) {
            online[v] = get_context(v) == 0;
            if (!online[v] && errno != ENODATA) {
                perror("xen_reference: getvcpucontext");
                do_domctl(XEN_DOMCTL_unpausedomain);
                return 1;
            }
            if (online[v]) {
                rip[v] = context->user_regs.rip;
                rbp[v] = context->user_regs.rbp;
            }
        }
        double t2 = now_ns();
        /* The walks, while paused (the stack would change under a running guest); they are
         * written out only after the unpause, to keep the file's cost out of the stop. */
        int depth[64];
        for (unsigned v = 0; v < vcpus; v++) {
            depth[v] = 0;
            if (!online[v])
                continue;
            int cut = 0;
            depth[v] = walk(v, rip[v], rbp[v], walks[v], &cut);
            cut_walks += cut;
        }
        double t3 = now_ns();
        if (do_domctl(XEN_DOMCTL_unpausedomain)) {
            perror("xen_reference: unpausedomain");
            return 1;
        }
        double t4 = now_ns();
        push(&window, (t4 - t0) / 1e3);
        push(&paused, (t1 - t0) / 1e3);
        push(&contexts, (t2 - t1) / 1e3);
        push(&walked, (t3 - t2) / 1e3);
        push(&unpaused, (t4 - t3) / 1e3);
        for (unsigned v = 0; v < vcpus; v++) {
            if (!depth[v])
                continue;
            fprintf(traces, "%.6f %u", stamp, v);
            for (int i = 0; i < depth[v]; i++)
                fprintf(traces, " %llx", (unsigned long long)walks[v][i]);
            fputc('\n', traces);
            frames += depth[v];
            traces_n++;
        }
    }
    double elapsed_s = (now_ns() - start) / 1e9, end_real = real_s();
    long stops = window.n;
    double cpu = (cpu_us() - cpu_began) / (stops ? stops : 1);
    if (fclose(traces)) {
        perror("xen_reference: writing TRACES_FILE");
        return 1;
    }
    double sum = 0;
    for (long i = 0; i < window.n; i++)
        sum += window.v[i];
    double mean = stops ? sum / stops : 0;
    double p50 = pct(window.v, window.n, 0.5), p99 = pct(window.v, window.n, 0.99);
    double max = stops ? window.v[window.n - 1] : 0;
    printf("hz=%g stops=%ld traces=%ld vcpus=%u seconds=%.3f per_s=%.1f p50_us=%.1f p99_us=%.1f mean_us=%.1f "
           "max_us=%.1f pause_p50_us=%.1f ctx_p50_us=%.1f walk_p50_us=%.1f unpause_p50_us=%.1f cpu_us=%.1f "
           "frames_mean=%.1f walk_cut=%ld late=%ld min_sleep_us=%.1f pages=%ld start_real=%.6f end_real=%.6f\n",
           hz, stops, traces_n, vcpus, elapsed_s, traces_n / elapsed_s, p50, p99, mean, max,
           pct(paused.v, paused.n, 0.5), pct(contexts.v, contexts.n, 0.5), pct(walked.v, walked.n, 0.5),
           pct(unpaused.v, unpaused.n, 0.5), cpu, traces_n ? (double)frames / traces_n : 0, cut_walks, late,
           min_sleep / 1e3, pages_mapped, start_real, end_real);
    xencall_free_buffer(xcall, buffer);
    xenforeignmemory_close(fmem);
    xencall_close(xcall);
    xc_interface_close(xch);
    return 0;
}
