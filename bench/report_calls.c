/* The traced workload of the report benchmark (bench/report_bench.py): a server-like mix
 * of many small functions at a few depths, so a trace of it packs like a real one (an
 * entry and its exit rarely alternate twice in a row, function ids change at every
 * record), not like a loop of one tiny function. Each of T threads runs N requests; a
 * request calls handle() -> 3 stages -> 4 helpers each -> sometimes a recursive walk.
 * It prints the number of calls it made, which the report must find.
 *   report_calls N [T] */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static __thread unsigned long made;

#define HELPER(n)                                                                          \
    __attribute__((noinline, noclone)) unsigned long helper##n(unsigned long x) {          \
        made++;                                                                            \
        return (x * (2 * n + 1)) ^ (x >> (n % 7 + 1));                                     \
    }
HELPER(0) HELPER(1) HELPER(2) HELPER(3) HELPER(4) HELPER(5) HELPER(6) HELPER(7)
HELPER(8) HELPER(9) HELPER(10) HELPER(11) HELPER(12) HELPER(13) HELPER(14) HELPER(15)
HELPER(16) HELPER(17) HELPER(18) HELPER(19) HELPER(20) HELPER(21) HELPER(22) HELPER(23)
HELPER(24) HELPER(25) HELPER(26) HELPER(27) HELPER(28) HELPER(29) HELPER(30) HELPER(31)

static unsigned long (*const helpers[32])(unsigned long) = {
    helper0,  helper1,  helper2,  helper3,  helper4,  helper5,  helper6,  helper7,
    helper8,  helper9,  helper10, helper11, helper12, helper13, helper14, helper15,
    helper16, helper17, helper18, helper19, helper20, helper21, helper22, helper23,
    helper24, helper25, helper26, helper27, helper28, helper29, helper30, helper31};

__attribute__((noinline, noclone)) unsigned long walk(unsigned long x, int depth) {
    made++;
    if (depth == 0) return x;
    unsigned long r = walk(x * 31 + 7, depth - 1);
    __asm__ volatile("" : "+r"(r)); /* a real call per level, not a loop */
    return r + 1;
}

#define STAGE(n)                                                                           \
    __attribute__((noinline, noclone)) unsigned long stage##n(unsigned long x) {           \
        made++;                                                                            \
        unsigned long sum = 0;                                                             \
        for (int i = 0; i < 4; i++) sum += helpers[(x + i * 11 + n * 5) & 31](x + i);      \
        if ((x & 15) == n) sum += walk(x, (int)((x >> 4) % 5));                            \
        return sum;                                                                        \
    }
STAGE(0) STAGE(1) STAGE(2) STAGE(3) STAGE(4) STAGE(5) STAGE(6) STAGE(7)

static unsigned long (*const stages[8])(unsigned long) = {stage0, stage1, stage2, stage3,
                                                         stage4, stage5, stage6, stage7};

__attribute__((noinline, noclone)) unsigned long handle(unsigned long request) {
    made++;
    unsigned long sum = 0;
    for (int i = 0; i < 3; i++) sum += stages[(request * 7 + i) & 7](request * 2654435761u + i);
    return sum;
}

static unsigned long requests;
static unsigned long calls_total;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void *serve(void *seed) {
    unsigned long sum = 0;
    for (unsigned long r = 0; r < requests; r++) sum += handle(r + (unsigned long)seed);
    pthread_mutex_lock(&lock);
    calls_total += made;
    pthread_mutex_unlock(&lock);
    return (void *)sum;
}

int main(int argc, char **argv) {
    requests = argc > 1 ? strtoul(argv[1], NULL, 10) : 100000;
    int threads = argc > 2 ? atoi(argv[2]) : 1;
    if (threads < 1 || threads > 64) threads = 1;
    pthread_t id[64];
    for (int t = 0; t < threads; t++) pthread_create(&id[t], NULL, serve, (void *)(long)(t * 1000003));
    for (int t = 0; t < threads; t++) pthread_join(id[t], NULL);
    printf("calls=%lu\n", calls_total);
    return 0;
}
