/* The exact-count builds' witness of their own code (guests/aarch64 and guests/xenpv, which
 * print it as `text fnv=HASH`): FNV-1a, 64-bit, of the bytes from `from` to `to` as this
 * CPU reads them now, through the guest's own page tables. Volatile: each byte is read
 * from memory every time, never from an earlier hash. */
#ifndef GLASS_DEMO_TEXT_HASH_H
#define GLASS_DEMO_TEXT_HASH_H
#include <stdint.h>

static inline uint64_t text_fnv(const volatile unsigned char *from,
                                const volatile unsigned char *to) {
    uint64_t hash = 0xcbf29ce484222325ULL;
    for (const volatile unsigned char *p = from; p < to; p++)
        hash = (hash ^ *p) * 0x100000001b3ULL;
    return hash;
}
#endif
