/* Runs the fixtures of fixtures.S, patches them as the spec file given says (written by
 * tests/aarch64_patch.rs from glass-patch's AArch64 plans), runs them again and checks
 * each returns what it returned before, through its trampoline every time. One line per
 * fixture on stdout: "ok NAME" or "FAIL NAME ..."; exit 1 if any failed. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define FIXTURES(X) X(fx_adrp) X(fx_adr) X(fx_ldr_x) X(fx_ldr_w) X(fx_ldrsw) X(fx_ldr_d) \
    X(fx_ldr_q) X(fx_prfm) X(fx_cbz) X(fx_cbnz) X(fx_tbz) X(fx_tbnz) X(fx_bcond) X(fx_b) \
    X(fx_bl) X(fx_bti) X(fx_pac) X(fx_loop) X(fx_x16)
#define DECLARE(name) long name(long);
FIXTURES(DECLARE)
long fx_bcond_call(long);
long fx_bl_call(long);

typedef long (*entry)(long);
struct fixture {
    const char *name;
    entry call;
};
#define ENTRY(name) {#name, name},
static struct fixture fixtures[] = {FIXTURES(ENTRY)};
#define COUNT (sizeof fixtures / sizeof fixtures[0])
static const long args[] = {0, 1, 3, 5, 8, 9, 1L << 40, -1};
#define ARGS (sizeof args / sizeof args[0])

static entry caller(struct fixture *f) {
    /* Those two are entered through a wrapper that sets up what they need. */
    if (f->call == fx_bcond) return fx_bcond_call;
    if (f->call == fx_bl) return fx_bl_call;
    return f->call;
}

static void unhex(const char *hex, uint8_t *out, size_t *len) {
    *len = 0;
    for (; hex[0] && hex[1]; hex += 2) {
        unsigned byte;
        sscanf(hex, "%2x", &byte);
        out[(*len)++] = (uint8_t)byte;
    }
}

static int writable(uint64_t address, size_t len) {
    uint64_t start = address & ~0xfffUL, end = (address + len + 0xfff) & ~0xfffUL;
    return mprotect((void *)start, end - start, PROT_READ | PROT_WRITE | PROT_EXEC);
}

int main(int argc, char **argv) {
    static long before[COUNT][ARGS];
    for (size_t i = 0; i < COUNT; i++)
        for (size_t j = 0; j < ARGS; j++) before[i][j] = caller(&fixtures[i])(args[j]);
    FILE *spec = fopen(argc > 1 ? argv[1] : "", "r");
    if (!spec) {
        perror("spec");
        return 2;
    }
    char name[64], patch_hex[128], tramp_hex[4096];
    unsigned long patch_at, tramp, counter;
    int failed = 0;
    while (fscanf(spec, "%63s %lx %127s %lx %4095s %lx", name, &patch_at, patch_hex, &tramp,
                  tramp_hex, &counter) == 6) {
        struct fixture *f = NULL;
        for (size_t i = 0; i < COUNT; i++)
            if (!strcmp(fixtures[i].name, name)) f = &fixtures[i];
        if (!f) {
            printf("FAIL %s: no such fixture\n", name);
            failed = 1;
            continue;
        }
        uint8_t bytes[2048];
        size_t len;
        void *page = mmap((void *)(tramp & ~0xfffUL), 0x1000, PROT_READ | PROT_WRITE | PROT_EXEC,
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
        if (writable(patch_at, len)) {
            perror("mprotect");
            return 2;
        }
        memcpy((void *)patch_at, bytes, len);
        __builtin___clear_cache((char *)patch_at, (char *)patch_at + len);
        size_t i = (size_t)(f - fixtures);
        int ok = 1;
        for (size_t j = 0; j < ARGS; j++) {
            long after = caller(f)(args[j]);
            if (after != before[i][j]) {
                printf("FAIL %s: (%ld) returned %#lx patched, %#lx before\n", name, args[j],
                       after, before[i][j]);
                ok = 0;
            }
        }
        uint64_t counted = *(volatile uint64_t *)counter;
        if (counted != ARGS) {
            printf("FAIL %s: the trampoline ran %lu times for %zu calls\n", name,
                   (unsigned long)counted, (size_t)ARGS);
            ok = 0;
        }
        if (ok) printf("ok %s\n", name);
        failed |= !ok;
    }
    return failed;
}
