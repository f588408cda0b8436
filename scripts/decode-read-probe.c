/*
 * How fast this machine reads K/V in the decode kernel's order, with no arithmetic: the read
 * side's ceiling (docs/performance.md, "CPU paged attention: decode"). K and V are 256 MiB each
 * of token slots of 2 KiB (8 kv heads x 128 bf16, token-major as the kernel's usual layout),
 * on 2 MiB pages (MADV_HUGEPAGE before writing, as kvs_cpu_huge_pages advises an engine's
 * cache; 4 KiB pages where THP is off), read by 64-byte loads summed into registers, split evenly over the
 * threads. Patterns:
 *
 *   seq        plain sequential reading of K and V (the streaming-read baseline)
 *   kernel-t1  the decode kernel's order: blocks of 32 tokens; per block and kv head, the
 *              head's 32 rows of K (256 bytes each, a slot apart), then its 32 rows of V; while a block is read, the
 *              next block's lines are requested in address order, 4 per row read (prefetcht1,
 *              as the kernel)
 *   kernel-t0  the same with prefetcht0
 *   kernel     the same order with no software prefetch
 *   head-page  a head-major page (each head's 128 rows contiguous) read head by head, whole
 *              pages (what the hardware prefetchers follow), no software prefetch
 *   slot       per block, each token's whole slot (all heads) in turn, K then V: address order
 *              with no software prefetch (the order a kernel would need to read K and V in to
 *              leave the prefetching to the hardware)
 *   k-slot     per block, K in slot order, then V in the kernel's order (head by head), the
 *              next block's V requested in address order while the block is read (prefetcht1)
 *   staged     the kernel's order over a copy of the block in a per-thread buffer, while the
 *              next block is copied into the other buffer in address order, 4 lines per row
 *   touch      per block, K then V in windows of 4 slots: each window's lines first touched
 *              by one load each in address order (so the demand misses come in address
 *              order, as in `slot`), then its rows read in the kernel's order (from L1)
 *   kernel-d2  kernel-t1 with the block after next requested instead of the next (the first
 *              two blocks at once)
 *   slot-kv    each token's whole K slot, then its whole V slot, in address order, no software
 *              prefetch (K and V taking turns every 2 KiB)
 *   head-shuf  head-major pages as one decode item reads them: one head's run of each page
 *              (128 rows), the pages in a shuffled order, K row and V row of each token in turn,
 *              no software prefetch
 *   h4-shuf    head-shuf's pages and order, 4 K rows then the same 4 V rows (a kernel block of
 *              4 tokens: scores, then values), no software prefetch
 *
 * On a Zen 3 EPYC, slot-kv, head-shuf and h4-shuf read at about the streaming rate, where
 * the kernel's order reaches about 0.8; but the decode kernel made to read in h4-shuf's order
 * (head-major cache, blocks of 4-16 tokens, no software prefetch) ran at 0.3 of it: with the
 * arithmetic between them the loads are too few in flight for the hardware prefetchers, so
 * these patterns bound only a loop that does nothing but load.
 *
 *   cc -O2 -mavx512f scripts/decode-read-probe.c -o decode-read-probe -lpthread
 *   cc -O2 -mavx2 ...     (the same on an AVX2-only machine: each 64-byte load as two 32-byte ones)
 *   ./decode-read-probe THREADS          (prints GB/s per pattern, best of 5)
 *   ./decode-read-probe THREADS paired [ROUNDS]
 *       (each pattern's read timed once per round between two `seq` reads; prints per
 *       pattern the median and range over ROUNDS (default 15) of its rate divided by the
 *       mean of those two: this machine's bandwidth moves with other tenants' load, so
 *       best-of rates taken minutes apart compare badly)
 *
 * x86-64 with AVX-512F, or AVX2 built with -mavx2.
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#ifndef __AVX512F__
/* AVX2 machines: a 64-byte vector as two 256-bit halves (the same loads, two instructions). */
typedef struct { __m256 lo, hi; } kvs_v512;
#define __m512 kvs_v512
#define _mm512_storeu_ps kvs_mm512_storeu_ps
#define _mm512_store_ps kvs_mm512_store_ps
#define _mm512_load_ps kvs_mm512_load_ps
#define _mm512_add_ps kvs_mm512_add_ps
#define _mm512_setzero_ps kvs_mm512_setzero_ps
static inline kvs_v512 kvs_mm512_setzero_ps(void) { kvs_v512 r = {_mm256_setzero_ps(), _mm256_setzero_ps()}; return r; }
static inline kvs_v512 kvs_mm512_add_ps(kvs_v512 a, kvs_v512 b) { kvs_v512 r = {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; return r; }
static inline kvs_v512 kvs_mm512_load_ps(const float *p) { kvs_v512 r = {_mm256_load_ps(p), _mm256_load_ps(p + 8)}; return r; }
static inline void kvs_mm512_store_ps(float *p, kvs_v512 a) { _mm256_store_ps(p, a.lo); _mm256_store_ps(p + 8, a.hi); }
static inline void kvs_mm512_storeu_ps(float *p, kvs_v512 a) { _mm256_storeu_ps(p, a.lo); _mm256_storeu_ps(p + 8, a.hi); }
#endif

#define BYTES ((size_t)256 << 20)
#define SLOT 2048
#define ROW 256
#define HEADS 8
#define BLOCK 32
#define PAGE_TOKENS 128
#define BLOCK_BYTES ((size_t)BLOCK * SLOT)

enum { SEQ, KERNEL_T1, KERNEL_T0, KERNEL, HEAD_PAGE, SLOT_ORDER, K_SLOT, STAGED, TOUCH, KERNEL_D2, SLOT_KV,
       HEAD_SHUF, H4_SHUF, PATTERNS };
static const char *NAMES[PATTERNS] = {"seq",       "kernel-t1", "kernel-t0", "kernel", "head-page",
                                      "slot",      "k-slot",    "staged",    "touch",
                                      "kernel-d2", "slot-kv",   "head-shuf", "h4-shuf"};
/* Slots per window of the touch pattern. */
#define TOUCH_SLOTS 4

static char *K, *V;
static int pattern, threads;
static volatile float sink;
/* The staged pattern's two buffers (K and V of one block each), per thread. */
static _Thread_local char stage[2][2][BLOCK_BYTES] __attribute__((aligned(64)));

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Adds the 4 lines of row `off` of buffer P. */
#define ROW_READ(P, off)                                                               \
    for (int c = 0; c < ROW; c += 64) a = _mm512_add_ps(a, _mm512_load_ps((const float *)((P) + (off) + c)));

/* Copies line `at` of the block at `from` in K and V into stage buffer `buf`. */
#define STAGE_LINE(buf, from, at)                                                       \
    do {                                                                                \
        _mm512_store_ps((float *)(stage[buf][0] + (at)), _mm512_load_ps((const float *)(K + (from) + (at)))); \
        _mm512_store_ps((float *)(stage[buf][1] + (at)), _mm512_load_ps((const float *)(V + (from) + (at)))); \
    } while (0)

static void *run(void *arg) {
    size_t per = BYTES / threads, lo = (size_t)arg * per, hi = lo + per;
    __m512 a = _mm512_setzero_ps();
    if (pattern == SEQ) {
        for (size_t i = lo; i < hi; i += 64) {
            a = _mm512_add_ps(a, _mm512_load_ps((const float *)(K + i)));
            a = _mm512_add_ps(a, _mm512_load_ps((const float *)(V + i)));
        }
    } else if (pattern == HEAD_PAGE) {
        size_t page = (size_t)PAGE_TOKENS * SLOT;
        for (size_t p = lo; p < hi; p += page)
            for (int h = 0; h < HEADS; h++)
                for (int t = 0; t < PAGE_TOKENS; t++) {
                    ROW_READ(K, p + (size_t)h * PAGE_TOKENS * ROW + t * ROW)
                    ROW_READ(V, p + (size_t)h * PAGE_TOKENS * ROW + t * ROW)
                }
    } else if (pattern == SLOT_KV) {
        for (size_t o = lo; o < hi; o += SLOT)
            for (int kv = 0; kv < 2; kv++)
                for (size_t r = 0; r < SLOT; r += ROW) ROW_READ(kv ? V : K, o + r)
    } else if (pattern == HEAD_SHUF || pattern == H4_SHUF) {
        /* Page i of head h at (i * odd + h * 97) mod pages: a permutation when the page count
           is a power of two (256 MiB / threads / 256 KiB pages, threads a power of two). */
        size_t page = (size_t)PAGE_TOKENS * SLOT, np = (hi - lo) / page;
        int g = pattern == HEAD_SHUF ? 1 : 4;
        for (int h = 0; h < HEADS; h++)
            for (size_t i = 0; i < np; i++) {
                size_t o = lo + (i * 2654435761u + (size_t)h * 97) % np * page + (size_t)h * PAGE_TOKENS * ROW;
                for (int t0 = 0; t0 < PAGE_TOKENS; t0 += g)
                    for (int kv = 0; kv < 2; kv++)
                        for (int t = t0; t < t0 + g; t++) ROW_READ(kv ? V : K, o + (size_t)t * ROW)
            }
    } else if (pattern == SLOT_ORDER || pattern == K_SLOT) {
        for (size_t s = lo; s < hi; s += BLOCK_BYTES) {
            size_t next = s + BLOCK_BYTES, at = 0;
            int ahead = pattern == K_SLOT && next + BLOCK_BYTES <= hi;
            for (size_t o = 0; o < BLOCK_BYTES; o += ROW) {
                ROW_READ(K, s + o)
                for (int j = 0; ahead && j < 2; j++, at += 64) _mm_prefetch(V + next + at, _MM_HINT_T1);
            }
            if (pattern == SLOT_ORDER) {
                for (size_t o = 0; o < BLOCK_BYTES; o += ROW) ROW_READ(V, s + o)
            } else {
                for (int h = 0; h < HEADS; h++)
                    for (int t = 0; t < BLOCK; t++) {
                        ROW_READ(V, s + (size_t)t * SLOT + h * ROW)
                        for (int j = 0; ahead && j < 2; j++, at += 64) _mm_prefetch(V + next + at, _MM_HINT_T1);
                    }
            }
        }
    } else if (pattern == TOUCH) {
        __m512 b = _mm512_setzero_ps();
        for (size_t s = lo; s < hi; s += BLOCK_BYTES)
            for (int kv = 0; kv < 2; kv++) {
                const char *P = kv ? V : K;
                for (int w = 0; w < BLOCK; w += TOUCH_SLOTS) {
                    size_t base = s + (size_t)w * SLOT;
                    for (size_t o = 0; o < (size_t)TOUCH_SLOTS * SLOT; o += 64)
                        b = _mm512_add_ps(b, _mm512_load_ps((const float *)(P + base + o)));
                    for (int h = 0; h < HEADS; h++)
                        for (int t = 0; t < TOUCH_SLOTS; t++) ROW_READ(P, base + (size_t)t * SLOT + h * ROW)
                }
            }
        a = _mm512_add_ps(a, b);
    } else if (pattern == STAGED) {
        for (size_t o = 0; o < BLOCK_BYTES && lo + o < hi; o += 64) STAGE_LINE(0, lo, o);
        for (size_t s = lo; s < hi; s += BLOCK_BYTES) {
            int cur = (int)((s - lo) / BLOCK_BYTES) & 1;
            size_t next = s + BLOCK_BYTES, at = 0;
            int ahead = next + BLOCK_BYTES <= hi;
            for (int h = 0; h < HEADS; h++)
                for (int kv = 0; kv < 2; kv++)
                    for (int t = 0; t < BLOCK; t++) {
                        ROW_READ(stage[cur][kv], (size_t)t * SLOT + h * ROW)
                        for (int j = 0; ahead && j < 2; j++, at += 64) STAGE_LINE(cur ^ 1, next, at);
                    }
        }
    } else {
        size_t dist = pattern == KERNEL_D2 ? 2 * BLOCK_BYTES : BLOCK_BYTES;
        if (pattern == KERNEL_D2) /* the second block: nobody requests it otherwise */
            for (size_t at = 0; at < BLOCK_BYTES && lo + 2 * BLOCK_BYTES <= hi; at += 64) {
                _mm_prefetch(K + lo + BLOCK_BYTES + at, _MM_HINT_T1);
                _mm_prefetch(V + lo + BLOCK_BYTES + at, _MM_HINT_T1);
            }
        for (size_t s = lo; s < hi; s += BLOCK_BYTES) {
            size_t next = s + dist, at = 0;
            int ahead = next + BLOCK_BYTES <= hi && pattern != KERNEL;
            for (int h = 0; h < HEADS; h++)
                for (int kv = 0; kv < 2; kv++)
                    for (int t = 0; t < BLOCK; t++) {
                        ROW_READ(kv ? V : K, s + (size_t)t * SLOT + h * ROW)
                        for (int j = 0; ahead && j < 2 && at < BLOCK_BYTES; j++, at += 64) {
                            if (pattern != KERNEL_T0) {
                                _mm_prefetch(K + next + at, _MM_HINT_T1);
                                _mm_prefetch(V + next + at, _MM_HINT_T1);
                            } else {
                                _mm_prefetch(K + next + at, _MM_HINT_T0);
                                _mm_prefetch(V + next + at, _MM_HINT_T0);
                            }
                        }
                    }
        }
    }
    float out[16];
    _mm512_storeu_ps(out, a);
    sink = out[0];
    return NULL;
}

static char *alloc(void) {
    char *p = aligned_alloc((size_t)2 << 20, BYTES);
    if (p) {
        madvise(p, BYTES, MADV_HUGEPAGE); /* refused where THP is off: 4 KiB pages then */
        memset(p, 1, BYTES);
    }
    return p;
}

/* One read of K and V in pattern `p` by all threads; seconds. */
static double timed(int p) {
    pthread_t th[64];
    pattern = p;
    double t0 = now();
    for (long i = 0; i < threads; i++) pthread_create(&th[i], NULL, run, (void *)i);
    for (int i = 0; i < threads; i++) pthread_join(th[i], NULL);
    return now() - t0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    threads = argc > 1 ? atoi(argv[1]) : 1;
    int paired = argc > 2 && strcmp(argv[2], "paired") == 0;
    int rounds = paired && argc > 3 ? atoi(argv[3]) : 15;
    if (threads < 1 || threads > 64 || (argc > 2 && !paired) || rounds < 1 || rounds > 1000) {
        fprintf(stderr, "usage: decode-read-probe THREADS (1-64) [paired [ROUNDS (1-1000)]]\n");
        return 2;
    }
    K = alloc();
    V = alloc();
    if (!K || !V) return 1;
    if (!paired) {
        for (int p = 0; p < PATTERNS; p++) {
            double best = 1e30;
            for (int r = 0; r < 5; r++) {
                double t = timed(p);
                if (t < best) best = t;
            }
            printf("%-10s %d threads: %5.1f GB/s\n", NAMES[p], threads, 2.0 * BYTES / best / 1e9);
        }
        return 0;
    }
    static double ratio[PATTERNS][1000];
    double seq_lo = 1e30, seq_hi = 0;
    timed(SEQ); /* warm-up */
    for (int r = 0; r < rounds; r++) {
        double before = timed(SEQ);
        for (int p = 1; p < PATTERNS; p++) {
            double t = timed(p), after = timed(SEQ);
            ratio[p][r] = (1 / t) / (0.5 * (1 / before + 1 / after));
            if (before < seq_lo) seq_lo = before;
            if (before > seq_hi) seq_hi = before;
            before = after;
        }
    }
    printf("seq        %d threads: %.1f-%.1f GB/s over the run\n", threads, 2.0 * BYTES / seq_hi / 1e9,
           2.0 * BYTES / seq_lo / 1e9);
    for (int p = 1; p < PATTERNS; p++) {
        qsort(ratio[p], rounds, sizeof(double), cmp_double);
        printf("%-10s %d threads: %.2f of seq (%.2f-%.2f over %d rounds)\n", NAMES[p], threads,
               ratio[p][rounds / 2], ratio[p][0], ratio[p][rounds - 1], rounds);
    }
    return 0;
}
