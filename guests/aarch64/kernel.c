/* The AArch64 demo guest: a small high-half unikernel for QEMU's virt machine (see
 * boot.S and layout.h for the boot path and the translation tables), to test a VM
 * profiler on AArch64. Built twice from this source (build.sh): with frame pointers and
 * no unwind tables at all, and without frame pointers with .eh_frame.
 *
 * vCPU0's busy time splits alpha 60%, beta 30%, gamma 10% (units of the same spin loop
 * as guests/demo and guests/unikernel, 6:3:1):
 *   kernel_entry -> kmain -> run -> dispatch -> alpha -> spin_block     60%, in the
 *        leaf spin_block (return address only in x30 without frame pointers)
 *   kernel_entry -> kmain -> run -> dispatch -> beta -> descend x80     30%, all of it in
 *        the bottom descend (depth 0), each descend frame holding >= 576 bytes of
 *        locals, so the stack there is > 40 KiB deep, across 4 KiB pages
 *   kernel_entry -> kmain -> run -> dispatch -> gamma -> mix_block      10%, in the
 *        assembly leaf mix_block (mix_block.S)
 * After each round, kmain -> run -> idle_wait waits in wfi for IDLE_TICKS 1 ms ticks of
 * the virtual timer (interrupts stay masked: the GIC only wakes wfi), about 30% of wall
 * time ("halted=").
 * vCPU1, started with PSCI CPU_ON, runs only delta, 100% busy:
 *   secondary_entry -> second_cpu_main -> delta_loop -> delta
 *
 * Serial (PL011) lines:
 *   glass aarch64 guest: alpha 60% beta 30% gamma 10% ...      once, first (vCPU0)
 *   mmu sctlr=... tcr=... mair=... ttbr0=... ttbr1=...           once (vCPU0)
 *   vcpu1 started: delta mpidr=... sp=...                        once (vCPU1)
 *   stack depth=BYTES frames=80 (bottom of descend)              once, after round 1
 *   rate rounds=REPORT_ROUNDS cycles=TICKS                       every REPORT_ROUNDS rounds
 *   split alpha=A% beta=B% gamma=G% halted=H% rounds=N time=TA/TB/TG/TH/TW
 *                                                                right after each rate line
 *   vcpu1 delta rounds=N                                         right after each split line
 *   done rounds=N                                                at the end (ROUNDS > 0)
 * "cycles" are ticks of the generic timer's virtual count (CNTVCT_EL0, at the CNTFRQ_EL0
 * frequency the banner prints), not CPU cycles. alpha/beta/gamma are shares of busy
 * ticks (each function's inclusive time, from the counter around its call in
 * dispatch), halted is the share of all ticks since run started spent in wfi; both
 * cumulative; in the Xen build (-DGLASS_XEN) they leave out the time vCPU0 was
 * offline (the domain paused: Xen's runstate area). time= gives the cumulative ticks
 * themselves (alpha/beta/gamma/halted/all), so that a profiler started later takes the
 * split of its own window from two lines.
 * Powers off (PSCI SYSTEM_OFF: QEMU exits 0) after ROUNDS rounds, or runs forever if
 * ROUNDS is 0; on an unexpected exception prints "fault ..." and powers off.
 *
 * The exact-count build (build.sh's AARCH64_DEFINES="-DSTART_IDLE_MS=.. -DEXACT_ROUNDS=..
 * -DHOLD_MS=..", as guests/xenpv's): vCPU0 idles START_IDLE_MS before its first round
 * and HOLD_MS after round EXACT_ROUNDS, so that a tracer attached in the first idle and
 * detached in the second sees exactly EXACT_ROUNDS rounds; and it hashes its own .text
 * (FNV-1a, read as its MMU maps it) with every split line, so that a test sees code
 * patched and put back without trusting the tool that did it. Lines:
 *   idle before the work / work begins                            around START_IDLE_MS
 *   exact rounds=N done / work goes on                            around HOLD_MS
 *   text fnv=HASH                                                 after "idle before the
 *                                                                 work" and each split */
#include <stdint.h>
#include "serial.h"

#ifndef ROUNDS
#define ROUNDS 0
#endif
#ifndef START_IDLE_MS
#define START_IDLE_MS 0
#endif
#ifndef EXACT_ROUNDS
#define EXACT_ROUNDS 0
#endif
#ifndef HOLD_MS
#define HOLD_MS 0
#endif
#define UNIT_ITERATIONS 500000  /* as guests/unikernel: a round is ~10 ms busy under TCG */
#include "../demo/work.h"
#include "../demo/text_hash.h"
#define DESCEND_FRAMES 80       /* descend frames on the stack at the bottom */
#define FRAME_WORDS 72          /* 576 bytes of locals in each descend frame */
#define TICK_HZ 1000
#define IDLE_TICKS 4            /* per round, to the 4th 1 ms boundary from now */
#ifdef GLASS_XEN
#define REPORT_ROUNDS 5         /* a profiler's window is a few seconds of rounds under a
                                 * nested Xen: lines often enough to bound it closely */
#else
#define REPORT_ROUNDS 25
#endif

#define GICD ((volatile uint32_t *)(KERNEL_OFFSET + GICD_PA))
#define GICC ((volatile uint32_t *)(KERNEL_OFFSET + GICC_PA))
#define VTIMER_PPI 27           /* the virtual timer's interrupt (PPI 11) */

/* boot.S, mix_block.S, link.ld.S */
extern uint64_t mix_block(uint64_t seed, uint64_t iterations);
extern const uint64_t secondary_start_pa;
extern char stack0_top[];
extern const unsigned char __text_start[], __text_end[];

#define SYSREG(name) ({ uint64_t v_; __asm__ volatile("mrs %0, " #name : "=r"(v_)); v_; })

/* part/whole as a percentage with one decimal. */
static void serial_putpct(uint64_t part, uint64_t whole) {
    uint64_t permille = whole ? (part * 1000 + whole / 2) / whole : 0;
    serial_putu(permille / 10);
    serial_putc('.');
    serial_putu(permille % 10);
    serial_putc('%');
}

#ifdef GLASS_XEN
/* Xen's runstate area of vCPU0 (public/vcpu.h: state, state_entry_time, time[4] in ns
 * of running, runnable, blocked, offline), which Xen updates each time it switches the
 * vCPU in. A domain paused by a profiler from dom0 is offline while the virtual count
 * runs on: the split is kept in the time the vCPU was not offline, so that the guest's
 * own account does not count the profiler's pauses into whatever it was running (as
 * guests/xenpv keeps its split). */
struct xen_runstate {
    int32_t state;
    uint32_t pad;
    uint64_t state_entry_time;
    uint64_t time[4];
};
static struct xen_runstate runstate0 __attribute__((aligned(64)));
#define HYPERVISOR_vcpu_op 24
#define VCPUOP_register_runstate_memory_area 5
#define RUNSTATE_offline 3

/* Xen on ARM's hypercall: hvc #0xEA1, the number in x16, arguments from x0; x0-x4 and
 * x16 may come back changed. */
static int64_t xen_hypercall3(uint64_t nr, uint64_t a0, uint64_t a1, uint64_t a2) {
    register uint64_t x0 __asm__("x0") = a0;
    register uint64_t x1 __asm__("x1") = a1;
    register uint64_t x2 __asm__("x2") = a2;
    register uint64_t x16 __asm__("x16") = nr;
    __asm__ volatile("hvc #0xea1" : "+r"(x0), "+r"(x1), "+r"(x2), "+r"(x16) : : "x3", "x4", "memory");
    return (int64_t)x0;
}

static int64_t runstate_setup(void) {
    uint64_t area = (uint64_t)&runstate0; /* struct vcpu_register_runstate_memory_area */
    return xen_hypercall3(HYPERVISOR_vcpu_op, VCPUOP_register_runstate_memory_area, 0, (uint64_t)&area);
}

static uint64_t offline_ticks(void) {
    uint64_t ns = ((volatile struct xen_runstate *)&runstate0)->time[RUNSTATE_offline];
    return ns / 1000 * counter_hz() / 1000000;
}
#else
static int64_t runstate_setup(void) { return 0; }
static uint64_t offline_ticks(void) { return 0; }
#endif

/* vCPU0's clock for the split: the virtual count, less (on Xen) the time it was
 * offline. Deadlines stay on the plain count. */
static uint64_t split_clock(void) { return counter() - offline_ticks(); }

static uint64_t ticks_alpha, ticks_beta, ticks_gamma, ticks_halted;
static uint64_t stack_bottom_sp;
volatile uint64_t delta_rounds;

/* The unit loop of work.h as a function of its own, a leaf. It counts down, so that it
 * compiles to the same three instructions (madd, subs, b.ne) as work.h's loop with a
 * constant unit count and as mix_block: the three parts cost the same per unit. */
__attribute__((noinline, noclone)) uint64_t spin_block(uint64_t units, uint64_t seed) {
    uint64_t x = seed | 1;
    for (uint64_t i = units * UNIT_ITERATIONS; i != 0; i--) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        __asm__ volatile("" : "+r"(x));
    }
    return x;
}

__attribute__((noinline, noclone)) uint64_t alpha(uint64_t seed) {
    checkpoint();
    uint64_t r = spin_block(6, seed);
    work_sink = r;
    return r + 1;
}

/* 576 bytes of locals per level that the compiler must keep (their address escapes
 * into an asm that clobbers memory), work after the recursive call so it is no tail
 * call, and beta's 3 units at the bottom. */
__attribute__((noinline, noclone)) uint64_t descend(uint64_t depth, uint64_t seed) {
    uint64_t frame[FRAME_WORDS];
    if (depth == 0) {
        uint64_t sp;
        __asm__ volatile("mov %0, sp" : "=r"(sp));
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

__attribute__((noinline, noclone)) uint64_t dispatch(uint64_t round) {
    uint64_t sum = 0, t0 = split_clock(), t1, t2, t3;
    sum += alpha(round);
    work_sink = sum;
    t1 = split_clock();
    sum += beta(round + 1);
    work_sink = sum;
    t2 = split_clock();
    sum += gamma(round + 2);
    work_sink = sum;
    t3 = split_clock();
    ticks_alpha += t1 - t0;
    ticks_beta += t2 - t1;
    ticks_gamma += t3 - t2;
    return sum;
}

/* Waits in wfi until the counter reaches the `ticks`-th 1 ms boundary from now. The
 * virtual timer's compare value wakes wfi through the GIC; PSTATE.I stays set, so no
 * interrupt is taken and a halted vCPU's pc is in idle_wait, after the wfi. */
__attribute__((noinline, noclone)) void idle_wait(uint64_t ticks) {
    uint64_t tick = counter_hz() / TICK_HZ;
    uint64_t deadline = (counter() / tick + ticks) * tick;
    __asm__ volatile("msr cntv_cval_el0, %0; msr cntv_ctl_el0, %1; isb" : : "r"(deadline), "r"(1UL));
    uint64_t now;
    while ((now = counter()) < deadline) {
        uint64_t before = split_clock();
        __asm__ volatile("dsb sy; wfi" : : : "memory");
        ticks_halted += split_clock() - before;
#ifdef GLASS_XEN
        /* Xen's vGIC keeps the timer's interrupt pending until the guest acknowledges
         * it (QEMU's drops with the line): unacknowledged, every later wfi returns at
         * once and the vCPU spins instead of blocking. Acknowledged and ended here,
         * with PSTATE.I still set. */
        uint32_t iar = GICC[0x00c / 4];                         /* GICC_IAR */
        if ((iar & 0x3ff) != 1023) GICC[0x010 / 4] = iar;       /* GICC_EOIR */
#endif
    }
    __asm__ volatile("msr cntv_ctl_el0, %0; isb" : : "r"(0UL));   /* the line drops */
    work_sink++;
}

static void print_split(uint64_t rounds, uint64_t wall) {
    uint64_t busy = ticks_alpha + ticks_beta + ticks_gamma;
    serial_puts("split alpha=");
    serial_putpct(ticks_alpha, busy);
    serial_puts(" beta=");
    serial_putpct(ticks_beta, busy);
    serial_puts(" gamma=");
    serial_putpct(ticks_gamma, busy);
    serial_puts(" halted=");
    serial_putpct(ticks_halted, wall);
    serial_puts(" rounds=");
    serial_putu(rounds);
    serial_puts(" time=");
    serial_putu(ticks_alpha);
    serial_putc('/');
    serial_putu(ticks_beta);
    serial_putc('/');
    serial_putu(ticks_gamma);
    serial_putc('/');
    serial_putu(ticks_halted);
    serial_putc('/');
    serial_putu(wall);
    serial_puts("\nvcpu1 delta rounds=");
    serial_putu(delta_rounds);
    serial_puts("\n");
}

#if START_IDLE_MS
/* "text fnv=HASH": FNV-1a of .text as vCPU0 reads it now (serial lock held). */
static void print_text_hash(void) {
    serial_puts("text fnv=");
    serial_putx(text_fnv(__text_start, __text_end));
    serial_puts("\n");
}

/* Idles `ms` milliseconds of the virtual count in idle_wait's ticks. */
static void idle_for(uint64_t ms) {
    for (uint64_t until = counter() + ms * (counter_hz() / 1000); counter() < until;)
        idle_wait(IDLE_TICKS);
}
#endif

__attribute__((noinline, noclone)) void run(void) {
#if START_IDLE_MS
    /* Idle first (the exact-count build): a tracer attaches before the first round. */
    serial_lock();
    serial_puts("idle before the work\n");
    print_text_hash();
    serial_unlock();
    idle_for(START_IDLE_MS);
    serial_lock();
    serial_puts("work begins\n");
    serial_unlock();
    ticks_halted = 0;   /* halted= is a share of the time from here */
#endif
    uint64_t checksum = 0, rounds_done = 0, start = split_clock(), last = counter();
    const uint64_t max_rounds = ROUNDS;
    for (uint64_t round = 0; max_rounds == 0 || round < max_rounds; round++) {
        checksum ^= dispatch(round);
        work_sink = checksum;
        idle_wait(IDLE_TICKS);
#if EXACT_ROUNDS
        if (rounds_done + 1 == EXACT_ROUNDS) {
            /* Its tracer detaches now, while nothing it traces runs. */
            serial_lock();
            serial_puts("exact rounds=");
            serial_putu(EXACT_ROUNDS);
            serial_puts(" done\n");
            serial_unlock();
            idle_for(HOLD_MS);
            serial_lock();
            serial_puts("work goes on\n");
            serial_unlock();
        }
#endif
        if (++rounds_done == 1) {
            serial_lock();
            serial_puts("stack depth=");
            serial_putu((uint64_t)stack0_top - stack_bottom_sp);
            serial_puts(" frames=");
            serial_putu(DESCEND_FRAMES);
            serial_puts(" (bottom of descend)\n");
            serial_unlock();
        }
        if (rounds_done % REPORT_ROUNDS == 0) {
            uint64_t now = counter(), wall = split_clock() - start;
            serial_lock();
            serial_puts("rate rounds=");
            serial_putu(REPORT_ROUNDS);
            serial_puts(" cycles=");
            serial_putu(now - last);
            serial_puts("\n");
            print_split(rounds_done, wall);
#if START_IDLE_MS
            print_text_hash();
#endif
            serial_unlock();
            last = now;
        }
    }
    serial_lock();
    print_split(rounds_done, split_clock() - start);
    serial_puts("done rounds=");
    serial_putu(rounds_done);
    serial_puts("\n");
    serial_unlock();
}

/* vCPU1's workload: all of it in delta, at depth 4 from secondary_entry. */
__attribute__((noinline, noclone)) uint64_t delta(uint64_t seed) { return spin_units(2, seed); }

__attribute__((noinline, noclone)) void delta_loop(void) {
    uint64_t sum = 0;
    for (uint64_t i = 0;; i++) {
        sum += delta(i);
        work_sink = sum;
        delta_rounds = i + 1;
    }
}

/* PSCI CPU_ON entry (boot.S secondary_start -> secondary_entry), MMU on, own stack. */
void second_cpu_main(void) {
    uint64_t sp;
    __asm__ volatile("mov %0, sp" : "=r"(sp));
    serial_lock();
    serial_puts("vcpu1 started: delta mpidr=");
    serial_putx(SYSREG(mpidr_el1));
    serial_puts(" sp=");
    serial_putx(sp);
    serial_puts("\n");
    serial_unlock();
    delta_loop();
}

/* The distributor and this vCPU's CPU interface, so that the virtual timer's PPI
 * reaches the vCPU (and wakes wfi). */
static void timer_irq_setup(void) {
    GICD[0x000 / 4] = 1;                                        /* GICD_CTLR: enable */
    ((volatile uint8_t *)GICD)[0x400 + VTIMER_PPI] = 0x80;      /* GICD_IPRIORITYR */
    GICD[0x100 / 4] = 1u << VTIMER_PPI;                         /* GICD_ISENABLER0 */
    GICC[0x004 / 4] = 0xff;                                     /* GICC_PMR */
    GICC[0x000 / 4] = 1;                                        /* GICC_CTLR: enable */
    __asm__ volatile("msr cntv_ctl_el0, %0; isb" : : "r"(0UL));
}

static __attribute__((noreturn)) void power_off(void) {
    psci_call(PSCI_SYSTEM_OFF, 0, 0, 0);
    for (;;) __asm__ volatile("wfi");
}

/* boot.S's exception vectors (no exception is expected): reports and powers off. */
__attribute__((noreturn)) void guest_fault(uint64_t vector, uint64_t esr, uint64_t far, uint64_t elr) {
    serial_puts("fault vector=");
    serial_putu(vector);
    serial_puts(" esr=");
    serial_putx(esr);
    serial_puts(" far=");
    serial_putx(far);
    serial_puts(" elr=");
    serial_putx(elr);
    serial_puts("\n");
    power_off();
}

void kmain(void) {
    serial_lock();
    serial_puts("glass aarch64 guest: alpha 60% beta 30% gamma 10% (busy time; alpha in "
                "spin_block, beta at the bottom of descend x80, gamma in mix_block), halted "
                "in idle_wait between rounds, delta on vcpu1, counter hz=");
    serial_putu(counter_hz());
    serial_puts("\nmmu sctlr=");
    serial_putx(SYSREG(sctlr_el1));
    serial_puts(" tcr=");
    serial_putx(SYSREG(tcr_el1));
    serial_puts(" mair=");
    serial_putx(SYSREG(mair_el1));
    serial_puts(" ttbr0=");
    serial_putx(SYSREG(ttbr0_el1));
    serial_puts(" ttbr1=");
    serial_putx(SYSREG(ttbr1_el1));
    serial_puts("\n");
#ifdef GLASS_XEN
    serial_puts("xen runstate area of vcpu0: ret=");
    int64_t registered = runstate_setup();
    serial_putu((uint64_t)(registered < 0 ? -registered : registered));
    serial_puts(registered ? " (failed: the split counts pauses)\n" : " (the split leaves out offline time)\n");
#else
    (void)runstate_setup;
#endif
    serial_unlock();
    timer_irq_setup();
    int64_t ret = psci_call(PSCI_CPU_ON_64, 1, secondary_start_pa, 0);
    if (ret != 0) {
        serial_lock();
        serial_puts("psci cpu_on failed ret=");
        serial_putu((uint64_t)-ret);
        serial_puts("\n");
        serial_unlock();
    }
    run();
    power_off();
}
