/* Runs tests/aarch64/fixtures.S's functions through glass-patch's AArch64 call-style
 * trampolines (glass_patch::aarch64_call), as the spec file given says (written by
 * tests/aarch64_call.rs): each fixture is called before, patched, called again, and
 * must return what it returned before; then its ring is printed for the test to decode.
 * Spec lines: NAME PATCH_AT PATCH_HEX TRAMPOLINE TRAMPOLINE_HEX RING CAPACITY, the ring
 * being head, tail and dropped (u64 each) at RING and CAPACITY records of 16 bytes at
 * RING + 64, in the page after the trampoline's. Output per fixture:
 *   ring NAME HEAD DROPPED
 *   rec NAME TSC WORD        (each record the ring holds, in order)
 *   ok NAME | FAIL NAME ...
 * Exit 1 if any failed. Fixtures entered with flags (fx_bcond) or left through another
 * register than x30 (fx_bl) are not C functions and are not here. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define FIXTURES(X) X(fx_adrp) X(fx_adr) X(fx_ldr_x) X(fx_ldr_w) X(fx_ldrsw) X(fx_ldr_d) \
    X(fx_ldr_q) X(fx_prfm) X(fx_cbz) X(fx_cbnz) X(fx_tbz) X(fx_tbnz) X(fx_b) X(fx_bti) \
    X(fx_pac) X(fx_loop) X(fx_x16)
#define DECLARE(name) long name(long);
FIXTURES(DECLARE)

struct fixture {
    const char *name;
    long (*call)(long);
};
#define ENTRY(name) {#name, name},
static struct fixture fixtures[] = {FIXTURES(ENTRY)};
#define COUNT (sizeof fixtures / sizeof fixtures[0])
static const long args[] = {0, 1, 3, 5, 8, 9, 1L << 40, -1};
#define ARGS (sizeof args / sizeof args[0])

static void unhex(const char *hex, uint8_t *out, size_t *len) {
    *len = 0;
    for (; hex[0] && hex[1]; hex += 2) {
        unsigned byte;
        sscanf(hex, "%2x", &byte);
        out[(*len)++] = (uint8_t)byte;
    }
}

int main(int argc, char **argv) {
    static long before[COUNT][ARGS];
    for (size_t i = 0; i < COUNT; i++)
        for (size_t j = 0; j < ARGS; j++) before[i][j] = fixtures[i].call(args[j]);
    FILE *spec = fopen(argc > 1 ? argv[1] : "", "r");
    if (!spec) {
        perror("spec");
        return 2;
    }
    static char name[64], patch_hex[128], tramp_hex[8192];
    unsigned long patch_at, tramp, ring, capacity;
    int failed = 0;
    while (fscanf(spec, "%63s %lx %127s %lx %8191s %lx %lu", name, &patch_at, patch_hex, &tramp,
                  tramp_hex, &ring, &capacity) == 7) {
        struct fixture *f = NULL;
        for (size_t i = 0; i < COUNT; i++)
            if (!strcmp(fixtures[i].name, name)) f = &fixtures[i];
        if (!f) {
            printf("FAIL %s: no such fixture\n", name);
            failed = 1;
            continue;
        }
        uint8_t bytes[4096];
        size_t len;
        void *page = mmap((void *)(tramp & ~0xfffUL), 0x2000, PROT_READ | PROT_WRITE | PROT_EXEC,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
        if (page != (void *)(tramp & ~0xfffUL)) {
            printf("FAIL %s: cannot map the trampoline at %#lx\n", name, tramp);
            failed = 1;
            continue;
        }
        unhex(tramp_hex, bytes, &len);
        memcpy((void *)tramp, bytes, len);
        __builtin___clear_cache((char *)tramp, (char *)tramp + len);
        unhex(patch_hex, bytes, &len);
        uint64_t start = patch_at & ~0xfffUL, end = (patch_at + len + 0xfff) & ~0xfffUL;
        if (mprotect((void *)start, end - start, PROT_READ | PROT_WRITE | PROT_EXEC)) {
            perror("mprotect");
            return 2;
        }
        memcpy((void *)patch_at, bytes, len);
        __builtin___clear_cache((char *)patch_at, (char *)patch_at + len);
        size_t i = (size_t)(f - fixtures);
        int ok = 1;
        for (size_t j = 0; j < ARGS; j++) {
            long after = f->call(args[j]);
            if (after != before[i][j]) {
                printf("FAIL %s: (%ld) returned %#lx patched, %#lx before\n", name, args[j],
                       after, before[i][j]);
                ok = 0;
            }
        }
        volatile uint64_t *words = (volatile uint64_t *)ring;
        uint64_t head = words[0], dropped = words[2];
        printf("ring %s %lu %lu\n", name, (unsigned long)head, (unsigned long)dropped);
        volatile uint64_t *records = words + 8;
        for (uint64_t r = 0; r < head && r < capacity; r++)
            printf("rec %s %lx %lx\n", name, (unsigned long)records[2 * r],
                   (unsigned long)records[2 * r + 1]);
        printf("%s %s\n", ok ? "ok" : "FAIL", name);
        failed |= !ok;
    }
    return failed;
}
