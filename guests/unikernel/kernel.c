/* The "unikernel" demo guest: built the way real unikernels (Unikraft) are, to test a
 * VM profiler on it. C compiled with -fno-asynchronous-unwind-tables and without frame
 * pointers, so these C functions' CFI is only in .debug_frame; the assembly leaf and the
 * interrupt stubs (entry.S) have .eh_frame; the image has .eh_frame_hdr; the bootable
 * image is a stripped 32-bit multiboot ELF, the symbols in a separate 64-bit ELF.
 *
 * One vCPU only: the guest never starts another, so under -smp 2 the second vCPU stays
 * in the firmware (SeaBIOS) for the whole run.
 *
 * Busy time splits alpha 60%, beta 30%, gamma 10% (units of the same spin loop as
 * guests/demo/kernel.c, 6:3:1):
 *   kmain -> run -> dispatch -> alpha                              60%
 *   kmain -> run -> dispatch -> beta -> descend x80 (depth 79..0)  30%, all of it in the
 *        bottom descend (depth 0), each descend frame holding >= 576 bytes of locals,
 *        so the stack there is > 40 KiB deep (printed as "stack depth=")
 *   kmain -> run -> dispatch -> gamma -> mix_block                 10%, all of it in
 *        mix_block, an assembly leaf whose frame is described by .cfi_* (entry.S)
 * After each round, kmain -> run -> idle_wait halts (sti; hlt) until IDLE_TICKS ticks of
 * the PIT (1 kHz, vector 32, handler timer_isr in entry.S) have passed: about 30% of
 * wall time is spent halted under TCG (25-30% measured on a 2-core host; the TSC
 * accounting prints it as "halted=").
 * Interrupts are off (cli) outside idle_wait, so no interrupt frame lands on the work.
 *
 * Serial (COM1) lines:
 *   glass unikernel guest: alpha 60% beta 30% gamma 10% ...     once, first
 *   stack depth=BYTES frames=80 (bottom of descend)               once, after round 1
 *   rate rounds=REPORT_ROUNDS cycles=TSC_CYCLES                   every REPORT_ROUNDS rounds
 *   split alpha=A% beta=B% gamma=G% halted=H% rounds=N            right after each rate line
 *   done rounds=N                                                 at the end (ROUNDS > 0)
 * alpha/beta/gamma are shares of busy TSC cycles (each function's inclusive time, from
 * rdtsc around its call in dispatch), halted is the share of all TSC cycles since run
 * started spent between sti;hlt and the wake-up; both cumulative.
 * Powers off (isa-debug-exit, port 0x501 or 0xf4: QEMU exits 1; else ACPI S5: QEMU exits 0) after ROUNDS rounds, or
 * runs forever if ROUNDS is 0. */
#include <stdint.h>
#include "../demo/serial.h"

#ifndef ROUNDS
#define ROUNDS 0
#endif
#define UNIT_ITERATIONS 500000  /* 25x the demo's: under TCG a round is then ~7 ms busy */
#include "../demo/work.h"
#define DESCEND_FRAMES 80       /* descend frames on the stack at the bottom */
#define FRAME_WORDS 72          /* 576 bytes of locals in each descend frame */
#define PIT_HZ 1000
#define IDLE_TICKS 4            /* per round; the first is usually already pending */
#define REPORT_ROUNDS 25

/* part/whole as a percentage with one decimal. */
static void serial_putpct(uint64_t part, uint64_t whole) {
    uint64_t permille = whole ? (part * 1000 + whole / 2) / whole : 0;
    serial_putu(permille / 10);
    serial_putc('.');
    serial_putu(permille % 10);
    serial_putc('%');
}

/* entry.S */
extern uint64_t mix_block(uint64_t seed, uint64_t iterations);
extern void timer_isr(void);
extern void spurious_isr(void);
extern char fault_stubs[];      /* 32 stubs of 16 bytes, one per exception vector */

volatile uint64_t pit_ticks;    /* incremented by timer_isr */
static uint64_t cycles_alpha, cycles_beta, cycles_gamma, cycles_halted;
static uint64_t stack_top, stack_bottom_sp;

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

__attribute__((noinline, noclone)) uint64_t dispatch(uint64_t round) {
    uint64_t sum = 0, t0 = rdtsc(), t1, t2, t3;
    sum += alpha(round);
    work_sink = sum;
    t1 = rdtsc();
    sum += beta(round + 1);
    work_sink = sum;
    t2 = rdtsc();
    sum += gamma(round + 2);
    work_sink = sum;
    t3 = rdtsc();
    cycles_alpha += t1 - t0;
    cycles_beta += t2 - t1;
    cycles_gamma += t3 - t2;
    return sum;
}

/* Halts until `ticks` timer interrupts have been taken. Interrupts are enabled only
 * here: sti's one-instruction shadow makes "sti; hlt" atomic, and a halted vCPU's
 * pc is the cli after hlt, inside idle_wait. */
__attribute__((noinline, noclone)) void idle_wait(uint64_t ticks) {
    uint64_t target = pit_ticks + ticks;
    while (pit_ticks < target) {
        uint64_t t0 = rdtsc();
        __asm__ volatile("sti; hlt; cli" : : : "memory");
        cycles_halted += rdtsc() - t0;
    }
    work_sink++;
}

static void print_split(uint64_t rounds, uint64_t wall) {
    uint64_t busy = cycles_alpha + cycles_beta + cycles_gamma;
    serial_puts("split alpha=");
    serial_putpct(cycles_alpha, busy);
    serial_puts(" beta=");
    serial_putpct(cycles_beta, busy);
    serial_puts(" gamma=");
    serial_putpct(cycles_gamma, busy);
    serial_puts(" halted=");
    serial_putpct(cycles_halted, wall);
    serial_puts(" rounds=");
    serial_putu(rounds);
    serial_puts("\n");
}

__attribute__((noinline, noclone)) void run(void) {
    uint64_t checksum = 0, rounds_done = 0, start = rdtsc(), last = start;
    const uint64_t max_rounds = ROUNDS;
    for (uint64_t round = 0; max_rounds == 0 || round < max_rounds; round++) {
        checksum ^= dispatch(round);
        work_sink = checksum;
        idle_wait(IDLE_TICKS);
        if (++rounds_done == 1) {
            serial_puts("stack depth=");
            serial_putu(stack_top - stack_bottom_sp);
            serial_puts(" frames=");
            serial_putu(DESCEND_FRAMES);
            serial_puts(" (bottom of descend)\n");
        }
        if (rounds_done % REPORT_ROUNDS == 0) {
            uint64_t now = rdtsc();
            serial_puts("rate rounds=");
            serial_putu(REPORT_ROUNDS);
            serial_puts(" cycles=");
            serial_putu(now - last);
            serial_puts("\n");
            print_split(rounds_done, now - start);
            last = now;
        }
    }
    print_split(rounds_done, rdtsc() - start);
    serial_puts("done rounds=");
    serial_putu(rounds_done);
    serial_puts("\n");
}

/* Interrupt gates (64-bit, DPL 0, IF cleared on entry) for the exceptions, the timer
 * (vector 32) and the other remapped PIC lines (33..47, spurious). */
struct idt_gate {
    uint16_t offset_low, selector;
    uint8_t ist, type;
    uint16_t offset_mid;
    uint32_t offset_high, reserved;
} __attribute__((packed));
static struct idt_gate idt[48] __attribute__((aligned(16)));

static void set_gate(int vector, uint64_t handler) {
    idt[vector] = (struct idt_gate){
        .offset_low = (uint16_t)handler, .selector = 0x08, .type = 0x8e,
        .offset_mid = (uint16_t)(handler >> 16), .offset_high = (uint32_t)(handler >> 32),
    };
}

static void setup_interrupts(void) {
    for (int v = 0; v < 32; v++) set_gate(v, (uint64_t)fault_stubs + 16 * (uint64_t)v);
    set_gate(32, (uint64_t)timer_isr);
    for (int v = 33; v < 48; v++) set_gate(v, (uint64_t)spurious_isr);
    struct { uint16_t limit; uint64_t base; } __attribute__((packed)) idtr = { sizeof idt - 1, (uint64_t)idt };
    __asm__ volatile("lidt %0" : : "m"(idtr));
    /* 8259 PICs: IRQ 0-7 -> vectors 32-39, 8-15 -> 40-47; only IRQ 0 (the PIT) unmasked. */
    outb(0x20, 0x11); outb(0xa0, 0x11);
    outb(0x21, 0x20); outb(0xa1, 0x28);
    outb(0x21, 0x04); outb(0xa1, 0x02);
    outb(0x21, 0x01); outb(0xa1, 0x01);
    outb(0x21, 0xfe); outb(0xa1, 0xff);
    /* PIT channel 0, rate generator at PIT_HZ. */
    uint16_t divisor = (uint16_t)(1193182 / PIT_HZ);
    outb(0x43, 0x34);
    outb(0x40, (uint8_t)divisor);
    outb(0x40, (uint8_t)(divisor >> 8));
}

/* isa-debug-exit at its default port (0x501, "-device isa-debug-exit") and at the
 * demo's (0xf4, "-device isa-debug-exit,iobase=0xf4,iosize=0x04"): QEMU exits with
 * status (code << 1) | 1. A write to the port without the device is ignored. Without
 * it, an ACPI soft-off (S5: SLP_TYP 0 with SLP_EN into PM1a_CNT, which QEMU's PIIX4 PM
 * has at 0x604 once SeaBIOS enabled it): QEMU shuts down as for any guest power-off
 * (the QMP SHUTDOWN event, its GDB stub's W00) and exits 0. */
static void power_off(uint8_t code) {
    outb(0x501, code);
    outb(0xf4, code);
    __asm__ volatile("outw %0, %1" : : "a"((uint16_t)0x2000), "Nd"((uint16_t)0x604));
}

/* Called by entry.S's fault stubs (interrupts off): reports and powers off. */
__attribute__((noreturn)) void guest_fault(uint64_t vector) {
    serial_puts("fault vector=");
    serial_putu(vector);
    serial_puts("\n");
    power_off(1);
    for (;;) __asm__ volatile("cli; hlt");
}

void kmain(void) {
    /* boot.S calls kmain with rsp at the top of the boot stack: kmain's CFA. */
    stack_top = (uint64_t)__builtin_dwarf_cfa();
    serial_puts("glass unikernel guest: alpha 60% beta 30% gamma 10% (busy time; beta at the "
                "bottom of descend x80, gamma in mix_block), halted in idle_wait between rounds, "
                "one vCPU\n");
    setup_interrupts();
    run();
    power_off(0);
    for (;;) __asm__ volatile("cli; hlt");
}
