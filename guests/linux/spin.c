/* userspin: the guest workload's user-space process. It spins in user space, in a call
 * chain with frame pointers (_start -> spin_outer -> spin_inner), so that a sample taken in it
 * names a user-mode leaf under a known process and stacks through its frames can be told. */
#include <stdint.h>

/* Freestanding (-nostdlib): no libc to cross-build or ship for either architecture. */

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

void _start(void)
{
    spin_outer();
}
