/* The demo unikernel as a Xen PV guest (x86-64): the same work as guests/unikernel/kernel.c,
 * booted by Xen's domain builder (`xl create`, type="pv") instead of QEMU's multiboot, and
 * with a second vCPU running its own function.
 *
 * Busy time of vCPU0 splits alpha 60%, beta 30%, gamma 10% (units of the same spin loop as
 * guests/demo/work.h, 6:3:1):
 *   kmain -> run -> dispatch -> alpha                              60%
 *   kmain -> run -> dispatch -> beta -> descend x80 (depth 79..0)  30%, all of it in the
 *        bottom descend (depth 0), each descend frame holding >= 576 bytes of locals,
 *        so the stack there is > 40 KiB deep (printed as "stack depth=")
 *   kmain -> run -> dispatch -> gamma -> mix_block                 10%, all of it in
 *        mix_block, an assembly leaf whose frame is described by .cfi_* (head.S)
 * After each round, kmain -> run -> idle_wait blocks the vCPU (SCHEDOP_block) until a
 * one-shot Xen timer (VCPUOP_set_singleshot_timer, IDLE_NS ahead, delivered as VIRQ_TIMER
 * on an event channel) wakes it. The block is a call into the hypercall page, as Linux
 * and Mini-OS make it, so a blocked vCPU0's rip is right after the `syscall` of Xen's
 * stub there, with idle_wait its caller (glass steps out of the stub). Events stay masked
 * everywhere else (the event callback returns with them masked), so no callback frame
 * lands on the work.
 *
 * vCPU1 is brought up by vCPU0 (VCPUOP_initialise + VCPUOP_up: own stack, same page-table
 * base) and runs ap_entry -> ap_main -> delta forever: a spin loop in its own function.
 *
 * Console (the PV console ring, which xenconsoled in dom0 reads) lines:
 *   glass xenpv guest: alpha 60% beta 30% gamma 10% ...          once, first
 *   vcpu1 up (delta)  or  vcpu1 failed: ...                       once, at boot
 *   stack depth=BYTES frames=80 (bottom of descend)               once, after round 1
 *   rate rounds=REPORT_ROUNDS cycles=TSC_CYCLES                   every REPORT_ROUNDS rounds
 *   split alpha=A% beta=B% gamma=G% halted=H% rounds=N time=TA/TB/TG
 *                                                                 right after each rate line
 *                                                                 (TA/TB/TG: cumulative ns)
 *   delta rounds=N                                                right after each split line
 *   done rounds=N                                                 at the end (ROUNDS > 0)
 *   idle before the work / work begins                            around START_IDLE_MS of
 *                                                                 idling first, when set
 *   exact rounds=N done / work goes on                            around HOLD_MS of idling
 *                                                                 after EXACT_ROUNDS rounds
 *   text fnv=HASH                                                 the exact-count build:
 *                                                                 after "idle before the
 *                                                                 work" and before each
 *                                                                 rate line
 * alpha/beta/gamma are shares of busy time (each function's inclusive time around its
 * call in dispatch, in ns of Xen system time the vCPU was not offline: see active_ns;
 * TA/TB/TG are those ns), halted is the share of all TSC cycles since run
 * started spent in SCHEDOP_block; both cumulative. delta rounds counts vCPU1's loops.
 * After ROUNDS rounds (ROUNDS > 0) the domain powers off (SCHEDOP_shutdown); ROUNDS 0
 * runs forever.
 *
 * Memory: linked at VIRT_BASE = 0xffffffff80000000 (-mcmodel=kernel), the image is
 * pseudo-physical frame 0 onwards; the domain builder maps frames 0..N at VIRT_BASE + 4 KiB
 * * pfn (the image, then the p2m list, start_info, xenstore and console pages, the boot
 * page tables, its boot stack). The page tables hold machine frame numbers: virtual ->
 * pfn is VIRT_BASE arithmetic, pfn -> mfn is start_info->mfn_list, mfn -> pfn is Xen's
 * read-only machine-to-phys table at MACH2PHYS_VIRT_START. */
#include <stdint.h>
#include "xen.h"

#ifndef ROUNDS
#define ROUNDS 0
#endif
#define UNIT_ITERATIONS 500000  /* as guests/unikernel: under TCG a round is ~7 ms busy */
#include "../demo/work.h"
#include "../demo/text_hash.h"
#define DESCEND_FRAMES 80       /* descend frames on the stack at the bottom */
#define FRAME_WORDS 72          /* 576 bytes of locals in each descend frame */
/* The exact-count build (build.sh's XENPV_DEFINES): idle START_IDLE_MS before the first
 * round, and after EXACT_ROUNDS rounds idle HOLD_MS before the work goes on, so that a
 * tracer attached in the first idle and detached in the second sees exactly
 * EXACT_ROUNDS rounds. */
#ifndef START_IDLE_MS
#define START_IDLE_MS 0
#endif
#ifndef EXACT_ROUNDS
#define EXACT_ROUNDS 0
#endif
#ifndef HOLD_MS
#define HOLD_MS 5000
#endif
#ifndef IDLE_NS
#define IDLE_NS 3000000         /* blocked per round (Xen system time) */
#endif
#define REPORT_ROUNDS 25
#define VIRT_BASE 0xffffffff80000000UL
#define PAGE_SIZE 4096
#define STACK_SIZE (128 * 1024)

static inline uint64_t rdtsc(void) {
    uint32_t lo, hi;
    __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
    return ((uint64_t)hi << 32) | lo;
}

/* head.S */
extern char hypercall_page[];
extern const unsigned char _text[], __text_end[];
extern void hypervisor_callback(void);
extern void failsafe_callback(void);
extern void ap_entry(void);
extern uint64_t mix_block(uint64_t seed, uint64_t iterations);

/* Stacks (the top addresses are used by head.S and VCPUOP_initialise) and the page the
 * shared info is mapped over. */
uint8_t boot_stack[STACK_SIZE] __attribute__((aligned(PAGE_SIZE)));
extern uint8_t boot_stack_top[];
__asm__(".globl boot_stack_top\n.set boot_stack_top, boot_stack + 131072");
static uint8_t ap_stack[STACK_SIZE] __attribute__((aligned(PAGE_SIZE)));
static uint8_t shared_info_page[PAGE_SIZE] __attribute__((aligned(PAGE_SIZE)));
_Static_assert(STACK_SIZE == 131072, "boot_stack_top");

/* --- hypercalls -------------------------------------------------------------------- */
/* 64-bit PV ABI: arguments in rdi, rsi, rdx (r10, r8), result in rax; the stubs in the
 * hypercall page keep rcx and r11 but Xen may change the argument registers. */
#define HYPERCALL3(nr, a1, a2, a3) ({                                                   \
    register uint64_t _a1 __asm__("rdi") = (uint64_t)(a1);                              \
    register uint64_t _a2 __asm__("rsi") = (uint64_t)(a2);                              \
    register uint64_t _a3 __asm__("rdx") = (uint64_t)(a3);                              \
    long _ret;                                                                          \
    __asm__ volatile("call hypercall_page + %c[off]"                                    \
                     : "=a"(_ret), "+r"(_a1), "+r"(_a2), "+r"(_a3)                       \
                     : [off] "i"((nr) * 32)                                             \
                     : "memory", "rcx", "r8", "r9", "r10", "r11");                      \
    _ret; })

static long sched_op(int cmd, void *arg) { return HYPERCALL3(__HYPERVISOR_sched_op, cmd, arg, 0); }
static long vcpu_op(int cmd, unsigned vcpu, void *arg) { return HYPERCALL3(__HYPERVISOR_vcpu_op, cmd, vcpu, arg); }
static long evtchn_op(int cmd, void *arg) { return HYPERCALL3(__HYPERVISOR_event_channel_op, cmd, arg, 0); }

#ifndef XEN_HVM
static struct start_info *start_info;
#endif
static volatile struct shared_info *shared;
static volatile struct xencons_interface *cons;
static uint32_t cons_port, timer_port;

static void shutdown(unsigned reason) {
    struct sched_shutdown s = { reason };
    for (;;) sched_op(SCHEDOP_shutdown, &s);
}

/* --- console: the PV console ring ---------------------------------------------------- */
static char line[256];
static unsigned line_len;

static void cons_notify(void) {
    struct evtchn_send send = { cons_port };
    evtchn_op(EVTCHNOP_send, &send);
}

static void cons_flush(void) {
    unsigned sent = 0;
    while (cons && sent < line_len) {
        XENCONS_RING_IDX c = __atomic_load_n(&cons->out_cons, __ATOMIC_ACQUIRE);
        XENCONS_RING_IDX p = cons->out_prod;
        if (p - c >= sizeof cons->out) {        /* full: let xenconsoled drain it */
            cons_notify();
            sched_op(SCHEDOP_yield, 0);
            continue;
        }
        while (sent < line_len && p - c < sizeof cons->out) cons->out[MASK_XENCONS_IDX(p++, cons->out)] = line[sent++];
        __atomic_store_n(&cons->out_prod, p, __ATOMIC_RELEASE);
    }
    if (cons) cons_notify();
    line_len = 0;
}

#ifdef XEN_HVM
/* Xen's debug port for HVM/PVH guests: each line lands in Xen's console as "(dN) ...". */
static void debug_port_flush(void) {
    for (unsigned i = 0; i < line_len; i++) __asm__ volatile("outb %0, $0xe9" : : "a"(line[i]));
    line_len = 0;
}
#endif

static void cons_putc(char c) {
    line[line_len++] = c;
#ifdef XEN_HVM
    if (!cons && (c == '\n' || line_len == sizeof line)) { debug_port_flush(); return; }
#endif
    if (c == '\n' || line_len == sizeof line) cons_flush();
}
static void cons_puts(const char *s) { while (*s) cons_putc(*s++); }
static void cons_putu(uint64_t v) {
    char buf[24]; int i = 0;
    do { buf[i++] = (char)('0' + v % 10); v /= 10; } while (v);
    while (i) cons_putc(buf[--i]);
}
static void cons_puti(long v) {
    if (v < 0) { cons_putc('-'); v = -v; }
    cons_putu((uint64_t)v);
}
/* part/whole as a percentage with one decimal. */
static void cons_putpct(uint64_t part, uint64_t whole) {
    uint64_t permille = whole ? (part * 1000 + whole / 2) / whole : 0;
    cons_putu(permille / 10);
    cons_putc('.');
    cons_putu(permille % 10);
    cons_putc('%');
}

/* --- time and events ----------------------------------------------------------------- */
/* Xen system time (ns since boot) from vCPU0's time info: the pvclock formula. */
static uint64_t xen_now(void) {
    volatile struct vcpu_time_info *t = &shared->vcpu_info[0].time;
    uint32_t version;
    uint64_t ns;
    do {
        version = __atomic_load_n(&t->version, __ATOMIC_ACQUIRE);
        uint64_t d = rdtsc() - t->tsc_timestamp;
        int8_t shift = t->tsc_shift;
        d = shift >= 0 ? d << shift : d >> -shift;
        ns = t->system_time + (uint64_t)(((unsigned __int128)d * t->tsc_to_system_mul) >> 32);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
    } while ((version & 1) || version != t->version);
    return ns;
}

volatile uint64_t timer_events;

/* Called by head.S's hypervisor_callback (events masked): clears what is pending. Only
 * vCPU0 ever unmasks events (in SCHEDOP_block), so only its vcpu_info is looked at. */
void do_event(void) {
    volatile struct vcpu_info *v = &shared->vcpu_info[0];
    v->evtchn_upcall_pending = 0;
    unsigned long sel = __atomic_exchange_n(&v->evtchn_pending_sel, 0, __ATOMIC_SEQ_CST);
    while (sel) {
        unsigned word = (unsigned)__builtin_ctzl(sel);
        sel &= sel - 1;
        unsigned long bits = shared->evtchn_pending[word] & ~shared->evtchn_mask[word];
        __atomic_fetch_and(&shared->evtchn_pending[word], ~bits, __ATOMIC_SEQ_CST);
        if (word == timer_port / 64 && (bits >> (timer_port % 64) & 1)) timer_events++;
    }
}

/* Xen could not load a segment register on a return to the guest: never expected. */
__attribute__((noreturn)) void guest_failsafe(uint64_t rip) {
    cons_puts("failsafe callback rip=");
    cons_putu(rip);
    cons_puts("\n");
    shutdown(SHUTDOWN_crash);
    __builtin_unreachable();
}

/* --- the work ------------------------------------------------------------------------ */
static uint64_t cycles_alpha, cycles_beta, cycles_gamma, cycles_halted;
static uint64_t stack_top, stack_bottom_sp;
volatile uint64_t delta_rounds;

__attribute__((noinline, noclone)) uint64_t alpha(uint64_t seed) { return spin_units(6, seed); }

/* 576 bytes of locals per level that the compiler must keep (their address escapes
 * into an asm that clobbers memory), work after the recursive call so it is no tail
 * call, and beta's 3 units at the bottom. */
__attribute__((noinline, noclone)) uint64_t descend(uint64_t depth, uint64_t seed) {
    uint64_t frame[FRAME_WORDS];
    if (depth == 0) {
        uint64_t sp;
        __asm__ volatile("mov %%rsp, %0" : "=r"(sp));
        if (!stack_bottom_sp) stack_bottom_sp = sp;
        return spin_units(3, seed);
    }
    for (int i = 0; i < FRAME_WORDS; i++) frame[i] = seed + (uint64_t)i * depth;
    __asm__ volatile("" : : "r"(frame) : "memory");
    uint64_t r = descend(depth - 1, seed ^ frame[depth % FRAME_WORDS]);
    __asm__ volatile("" : : "r"(frame) : "memory");
    return r + frame[r % FRAME_WORDS];
}

__attribute__((noinline, noclone)) uint64_t beta(uint64_t seed) {
    uint64_t r = descend(DESCEND_FRAMES - 1, seed);
    work_sink = r;
    return r + 1;
}

__attribute__((noinline, noclone)) uint64_t gamma(uint64_t seed) {
    checkpoint();
    uint64_t r = mix_block(seed, 1 * UNIT_ITERATIONS);
    work_sink = r;
    return r + 1;
}

/* vCPU0's runstate, kept by Xen (registered in kmain). */
static struct vcpu_runstate_info runstate0;

/* ns of Xen system time vCPU0 was not offline: the time it ran or could have run. A
 * domain paused by its controller (a profiler in dom0 taking a sample) is offline, and
 * the TSC and Xen's clock run on meanwhile; the split is kept in this time so that it
 * is the guest's own account of where its time went, not of where a profiler held it
 * (a sample of a deep stack holds it longer). Xen updates the area only while vCPU0 is
 * switched out, so vCPU0 reads it consistently. */
static uint64_t active_ns(void) {
    return xen_now() - runstate0.time[RUNSTATE_offline];
}

__attribute__((noinline, noclone)) uint64_t dispatch(uint64_t round) {
    uint64_t sum = 0, t0 = active_ns(), t1, t2, t3;
    sum += alpha(round);
    work_sink = sum;
    t1 = active_ns();
    sum += beta(round + 1);
    work_sink = sum;
    t2 = active_ns();
    sum += gamma(round + 2);
    work_sink = sum;
    t3 = active_ns();
    cycles_alpha += t1 - t0;
    cycles_beta += t2 - t1;
    cycles_gamma += t3 - t2;
    return sum;
}

/* Blocks vCPU0 for `ns` of Xen system time: a one-shot timer, then SCHEDOP_block until
 * the timer's event (re-armed if something else woke the vCPU first). SCHEDOP_block
 * unmasks events atomically with blocking; the wake-up runs hypervisor_callback, which
 * returns here with them masked again. */
__attribute__((noinline, noclone)) void idle_wait(uint64_t ns) {
    uint64_t deadline = xen_now() + ns;
    do {
#ifdef XEN_HVM
        /* No event channel to wait for: SCHEDOP_poll on none, with the deadline as its
         * timeout (no callback vector, no IDT needed). */
        struct sched_poll poll = { 0, 0, deadline };
        uint64_t t0 = rdtsc();
        sched_op(SCHEDOP_poll, &poll);
#else
        struct vcpu_set_singleshot_timer timer = { deadline, 0 };
        vcpu_op(VCPUOP_set_singleshot_timer, 0, &timer);
        uint64_t t0 = rdtsc();
        sched_op(SCHEDOP_block, 0);
#endif
        cycles_halted += rdtsc() - t0;
    } while (xen_now() < deadline);
    work_sink++;
}

static void print_split(uint64_t rounds, uint64_t wall) {
    uint64_t busy = cycles_alpha + cycles_beta + cycles_gamma;
    cons_puts("split alpha=");
    cons_putpct(cycles_alpha, busy);
    cons_puts(" beta=");
    cons_putpct(cycles_beta, busy);
    cons_puts(" gamma=");
    cons_putpct(cycles_gamma, busy);
    cons_puts(" halted=");
    cons_putpct(cycles_halted, wall);
    cons_puts(" rounds=");
    cons_putu(rounds);
    /* The raw cumulative times, so that a profile of any window can be checked against
     * the difference of two lines. */
    cons_puts(" time=");
    cons_putu(cycles_alpha);
    cons_puts("/");
    cons_putu(cycles_beta);
    cons_puts("/");
    cons_putu(cycles_gamma);
    cons_puts("\n");
    cons_puts("delta rounds=");
    cons_putu(delta_rounds);
    cons_puts("\n");
}

#if START_IDLE_MS
/* "text fnv=HASH" (decimal): FNV-1a of .text as vCPU0 reads it now, through its own page
 * tables: a witness of its code that owes nothing to the tracer nor to dom0's tools (the
 * hypercall page in it is Xen's, filled at boot). Printed before the rate line, so that a
 * reader who sees a new split line has the hash taken just before it. */
static void print_text_hash(void) {
    cons_puts("text fnv=");
    cons_putu(text_fnv(_text, __text_end));
    cons_puts("\n");
}
#endif

__attribute__((noinline, noclone)) void run(void) {
#if START_IDLE_MS
    /* Idle first (the exact-count build): a tracer attaches before the first round. */
    cons_puts("idle before the work\n");
    print_text_hash();
    for (uint64_t until = xen_now() + START_IDLE_MS * 1000000ULL; xen_now() < until;)
        idle_wait(IDLE_NS);
    cons_puts("work begins\n");
#endif
    uint64_t checksum = 0, rounds_done = 0, start = rdtsc(), last = start;
    const uint64_t max_rounds = ROUNDS;
    for (uint64_t round = 0; max_rounds == 0 || round < max_rounds; round++) {
        checksum ^= dispatch(round);
        work_sink = checksum;
        idle_wait(IDLE_NS);
#if EXACT_ROUNDS
        if (rounds_done + 1 == EXACT_ROUNDS) {
            /* Its tracer detaches now, while nothing it traces runs. */
            cons_puts("exact rounds=");
            cons_putu(EXACT_ROUNDS);
            cons_puts(" done\n");
            for (uint64_t until = xen_now() + HOLD_MS * 1000000ULL; xen_now() < until;)
                idle_wait(IDLE_NS);
            cons_puts("work goes on\n");
        }
#endif
        if (++rounds_done == 1) {
            cons_puts("stack depth=");
            cons_putu(stack_top - stack_bottom_sp);
            cons_puts(" frames=");
            cons_putu(DESCEND_FRAMES);
            cons_puts(" (bottom of descend)\n");
        }
        if (rounds_done % REPORT_ROUNDS == 0) {
#if START_IDLE_MS
            print_text_hash();
#endif
            uint64_t now = rdtsc();
            cons_puts("rate rounds=");
            cons_putu(REPORT_ROUNDS);
            cons_puts(" cycles=");
            cons_putu(now - last);
            cons_puts("\n");
            print_split(rounds_done, now - start);
            last = now;
        }
    }
    print_split(rounds_done, rdtsc() - start);
    cons_puts("done rounds=");
    cons_putu(rounds_done);
    cons_puts("\n");
}

/* --- vCPU1 --------------------------------------------------------------------------- */
/* vCPU1's whole workload: a spin loop that never returns, in its own function (it calls
 * only checkpoint, from spin_units, so it is never a leaf). */
__attribute__((noinline, noclone)) void delta(uint64_t seed) {
    for (;;) {
        seed = spin_units(1, seed);
        delta_rounds++;
    }
}

volatile int ap_started;

void ap_main(void) {
    ap_started = 1;
    delta(7);
}

#ifndef XEN_HVM
static struct vcpu_guest_context ap_context;

/* The page-table base for a new vCPU: the mfn of the builder's L4 (start_info->pt_base is
 * its virtual address), through the p2m list. */
static unsigned long pt_base_mfn(void) {
    const unsigned long *p2m = (const unsigned long *)start_info->mfn_list;
    return p2m[(start_info->pt_base - VIRT_BASE) / PAGE_SIZE];
}

static void start_vcpu1(void) {
    struct vcpu_guest_context *c = &ap_context;
    uint64_t sp = (uint64_t)ap_stack + sizeof ap_stack;
    c->flags = VGCF_in_kernel;
    c->user_regs.rip = (uint64_t)ap_entry;
    c->user_regs.rsp = sp;
    c->user_regs.cs = FLAT_KERNEL_CS64;
    c->user_regs.ss = FLAT_KERNEL_SS64;
    c->user_regs.ds = c->user_regs.es = FLAT_KERNEL_DS64;
    c->user_regs.rflags = 0x2;
    c->kernel_ss = FLAT_KERNEL_SS64;
    c->kernel_sp = sp;
    c->ctrlreg[3] = xen_pfn_to_cr3(pt_base_mfn());
    c->event_callback_eip = (uint64_t)hypervisor_callback;
    c->failsafe_callback_eip = (uint64_t)failsafe_callback;
    shared->vcpu_info[1].evtchn_upcall_mask = 1;
    long rc = vcpu_op(VCPUOP_initialise, 1, c);
    if (rc) {
        cons_puts("vcpu1 failed: VCPUOP_initialise rc=");
        cons_puti(rc);
        cons_puts(" (is vcpus=2 set?); continuing on one vCPU\n");
        return;
    }
    rc = vcpu_op(VCPUOP_up, 1, 0);
    if (rc) {
        cons_puts("vcpu1 failed: VCPUOP_up rc=");
        cons_puti(rc);
        cons_puts("; continuing on one vCPU\n");
        return;
    }
    /* wait (a bounded while) for it to run, to report it */
    for (uint64_t t0 = rdtsc(); !ap_started && rdtsc() - t0 < 10000000000ULL;) sched_op(SCHEDOP_yield, 0);
    cons_puts(ap_started ? "vcpu1 up (delta)\n" : "vcpu1 up but not running yet\n");
}

#endif

/* --- boot ---------------------------------------------------------------------------- */
#ifndef XEN_HVM
static long setup_events(void) {
    long rc = HYPERCALL3(__HYPERVISOR_update_va_mapping, (uint64_t)shared_info_page,
                         start_info->shared_info | 7 /* present, rw, user */, UVMF_INVLPG);
    if (rc) return rc;
    shared = (volatile struct shared_info *)shared_info_page;
    shared->vcpu_info[0].evtchn_upcall_mask = 1;
    for (unsigned i = 0; i < 64; i++) shared->evtchn_mask[i] = ~0UL;
    rc = HYPERCALL3(__HYPERVISOR_set_callbacks, (uint64_t)hypervisor_callback, (uint64_t)failsafe_callback, 0);
    if (rc) return rc;
    struct evtchn_bind_virq bind = { .virq = VIRQ_TIMER, .vcpu = 0 };
    rc = evtchn_op(EVTCHNOP_bind_virq, &bind);
    if (rc) return rc;
    timer_port = bind.port;
    __atomic_fetch_and(&shared->evtchn_mask[timer_port / 64], ~(1UL << (timer_port % 64)), __ATOMIC_SEQ_CST);
    vcpu_op(VCPUOP_stop_periodic_timer, 0, 0);      /* only the one-shot timer wakes it */
    uint64_t runstate_area = (uint64_t)&runstate0;
    rc = vcpu_op(VCPUOP_register_runstate_memory_area, 0, &runstate_area);
    if (rc) return rc;
    return 0;
}

void kmain(struct start_info *si) {
    /* head.S calls kmain with rsp at the top of boot_stack: kmain's CFA. */
    stack_top = (uint64_t)__builtin_dwarf_cfa();
    start_info = si;
    /* The console page is one of the builder's pages, mapped at VIRT_BASE + pfn * 4 KiB;
     * start_info gives its mfn, the machine-to-phys table its pfn (as Mini-OS and XTF). */
    const unsigned long *m2p = (const unsigned long *)MACH2PHYS_VIRT_START;
    unsigned long pfn = m2p[si->console.domU.mfn];
    if (pfn < si->nr_pages) {
        cons = (volatile struct xencons_interface *)(VIRT_BASE + pfn * PAGE_SIZE);
        cons_port = si->console.domU.evtchn;
    }
    cons_puts("glass xenpv guest: alpha 60% beta 30% gamma 10% (busy time; beta at the "
              "bottom of descend x80, gamma in mix_block), blocked in idle_wait between "
              "rounds on vCPU0; delta on vCPU1\n");
    long rc = setup_events();
    if (rc) {
        cons_puts("event setup failed rc=");
        cons_puti(rc);
        cons_puts("\n");
        shutdown(SHUTDOWN_crash);
    }
    start_vcpu1();
    run();
    shutdown(SHUTDOWN_poweroff);
}
#endif

#ifdef XEN_HVM
/* --- the PVH/HVM build: head.S's pvh_start turned on long mode and calls kmain_hvm ---- */
static uint64_t boot_cr3;

static long hvm_op(int op, void *arg) { return HYPERCALL3(__HYPERVISOR_hvm_op, op, arg, 0); }

static uint64_t hvm_param(uint32_t index) {
    struct xen_hvm_param p = { DOMID_SELF, 0, index, 0 };
    return hvm_op(HVMOP_get_param, &p) ? 0 : p.value;
}

static inline void wrmsr(uint32_t msr, uint64_t v) {
    __asm__ volatile("wrmsr" : : "c"(msr), "a"((uint32_t)v), "d"((uint32_t)(v >> 32)));
}

/* Xen's CPUID leaves (0x40000000, or 0x40000100 when it also offers Viridian): leaf +2
 * gives the MSR into which the guest writes the physical address of a page for Xen to
 * fill with its hypercall stubs (vmcall or vmmcall, as the CPU has). */
static int hypercall_page_init(void) {
    for (uint32_t base = 0x40000000; base < 0x40010000; base += 0x100) {
        uint32_t a, b, c, d;
        __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(base), "c"(0));
        if (b == 0x566e6558 && c == 0x65584d4d && d == 0x4d4d566e && a >= base + 2) {
            __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(base + 2), "c"(0));
            wrmsr(b, (uint64_t)hypercall_page - VIRT_BASE);
            return 0;
        }
    }
    return -1;
}

static long setup_hvm(void) {
    /* shared_info over our own page: vCPU0's time info (xen_now) */
    struct xen_add_to_physmap map = { DOMID_SELF, 0, XENMAPSPACE_shared_info, 0,
                                      ((uint64_t)shared_info_page - VIRT_BASE) / PAGE_SIZE };
    long rc = HYPERCALL3(__HYPERVISOR_memory_op, XENMEM_add_to_physmap, &map, 0);
    if (rc) return rc;
    shared = (volatile struct shared_info *)shared_info_page;
    uint64_t runstate_area = (uint64_t)&runstate0;
    return vcpu_op(VCPUOP_register_runstate_memory_area, 0, &runstate_area);
}

/* vCPU1 straight into long mode on our page tables (VCPU_HVM_MODE_64B: flat segments). */
static struct vcpu_hvm_context ap_hvm;

static void start_vcpu1(void) {
    ap_hvm.mode = VCPU_HVM_MODE_64B;
    ap_hvm.x86_64.rip = (uint64_t)ap_entry;
    ap_hvm.x86_64.rsp = (uint64_t)ap_stack + sizeof ap_stack;
    ap_hvm.x86_64.rflags = 0x2;
    ap_hvm.x86_64.cr0 = 0x80050033;     /* PG, WP, NE, ET, MP, PE */
    ap_hvm.x86_64.cr3 = boot_cr3;
    ap_hvm.x86_64.cr4 = 0x20;           /* PAE */
    ap_hvm.x86_64.efer = 0x500;         /* LME, LMA */
    long rc = vcpu_op(VCPUOP_initialise, 1, &ap_hvm);
    if (rc) {
        cons_puts("vcpu1 failed: VCPUOP_initialise rc=");
        cons_puti(rc);
        cons_puts(" (is vcpus=2 set?); continuing on one vCPU\n");
        return;
    }
    rc = vcpu_op(VCPUOP_up, 1, 0);
    if (rc) {
        cons_puts("vcpu1 failed: VCPUOP_up rc=");
        cons_puti(rc);
        cons_puts("; continuing on one vCPU\n");
        return;
    }
    for (uint64_t t0 = rdtsc(); !ap_started && rdtsc() - t0 < 10000000000ULL;) sched_op(SCHEDOP_yield, 0);
    cons_puts(ap_started ? "vcpu1 up (delta)\n" : "vcpu1 up but not running yet\n");
}

void kmain_hvm(void) {
    stack_top = (uint64_t)__builtin_dwarf_cfa();
    __asm__ volatile("mov %%cr3, %0" : "=r"(boot_cr3));
    if (hypercall_page_init()) {
        cons_puts("no Xen CPUID leaves: not a Xen HVM/PVH guest\n");
        for (;;) __asm__ volatile("hlt");
    }
    /* The PV console, where the toolstack gave one (PVH: always): its ring lies below
     * 4 GiB, which the boot page tables map at the same address. */
    uint64_t pfn = hvm_param(HVM_PARAM_CONSOLE_PFN);
    if (pfn && pfn < (4UL << 30) / PAGE_SIZE) {
        cons = (volatile struct xencons_interface *)(pfn * PAGE_SIZE);
        cons_port = (uint32_t)hvm_param(HVM_PARAM_CONSOLE_EVTCHN);
    }
    cons_puts("glass xenpv guest (PVH/HVM build): alpha 60% beta 30% gamma 10% (busy time; beta "
              "at the bottom of descend x80, gamma in mix_block), polling in idle_wait between "
              "rounds on vCPU0; delta on vCPU1\n");
    long rc = setup_hvm();
    if (rc) {
        cons_puts("setup failed rc=");
        cons_puti(rc);
        cons_puts("\n");
        shutdown(SHUTDOWN_crash);
    }
    start_vcpu1();
    run();
    shutdown(SHUTDOWN_poweroff);
}
#endif
