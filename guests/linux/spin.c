/* userspin: the guest workload's user-space process. It spins in user space, in a call
 * chain with frame pointers (_start -> main -> spin_outer -> spin_inner, none inlined nor
 * tail-called), so that a sample taken in it names a user-mode leaf under a known process
 * and a walk of its user stack (glass --guest-root) can be checked frame by frame. */
#include <stdint.h>

/* Freestanding (-nostdlib): no libc to cross-build or ship for either architecture.
 * With -DUSERSPIN_LIBC it is userspin-dyn instead: a PIE linked against glibc, whose
 * _start and __libc_start_main (in libc.so.6) call main. */

static volatile uint64_t counter;

__attribute__((noinline)) void spin_inner(uint64_t n)
{
    for (uint64_t i = 0; i < n; i++)
        counter += i ^ (counter >> 3);
}

__attribute__((noinline)) void spin_outer(void)
{
    for (;;) {
        spin_inner(100000);
        __asm__ volatile("" ::: "memory"); /* work after the call: no tail jump */
    }
}

__attribute__((noinline)) int main(void)
{
    spin_outer();
    __asm__ volatile("" ::: "memory");
    return 0;
}

#ifndef USERSPIN_LIBC
void _start(void)
{
    main();
    for (;;)
        __asm__ volatile("" ::: "memory");
}
#endif
