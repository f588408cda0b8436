/*
 * How fast this machine reads K/V in the decode kernel's order, with no arithmetic: the read
 * side's ceiling. README "Stop 33" uses it. K and V are 256 MiB each of token slots of 2 KiB
 * (8 kv heads x 128 bf16, token-major as the kernel's usual layout), read by 64-byte loads
 * summed into two registers, split evenly over the threads. Patterns:
 *
 *   seq        plain sequential reading of K and V (the streaming-read baseline)
 *   kernel-t1  the decode kernel's order: blocks of 32 tokens; per block, each kv head's 32
 *              rows (256 bytes each, a slot apart); while a block is read, the next block's
 *              lines are requested in address order, 4 per row read (prefetcht1, as the kernel)
 *   kernel-t0  the same with prefetcht0
 *   kernel     the same order with no software prefetch
 *   head-page  a head-major page (each head's 128 rows contiguous) read head by head, whole
 *              pages (what the hardware prefetchers follow), no software prefetch
 *
 *   cc -O2 -mavx512f scripts/decode-read-probe.c -o decode-read-probe -lpthread
 *   ./decode-read-probe THREADS          (prints GB/s per pattern, best of 5)
 *
 * x86-64 with AVX-512F only.
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BYTES ((size_t)256 << 20)
#define SLOT 2048
#define ROW 256
#define HEADS 8
#define BLOCK 32
#define PAGE_TOKENS 128

enum { SEQ, KERNEL_T1, KERNEL_T0, KERNEL, HEAD_PAGE, PATTERNS };
static const char *NAMES[PATTERNS] = {"seq", "kernel-t1", "kernel-t0", "kernel", "head-page"};

static char *K, *V;
static int pattern, threads;
static volatile float sink;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Adds the 4 lines of row `off` of K and V. */
#define ROW_READ(off)                                                                  \
    for (int c = 0; c < ROW; c += 64) {                                                \
        a = _mm512_add_ps(a, _mm512_load_ps((const float *)(K + (off) + c)));          \
        b = _mm512_add_ps(b, _mm512_load_ps((const float *)(V + (off) + c)));          \
    }

static void *run(void *arg) {
    size_t per = BYTES / threads, lo = (size_t)arg * per, hi = lo + per;
    __m512 a = _mm512_setzero_ps(), b = _mm512_setzero_ps();
    if (pattern == SEQ) {
        for (size_t i = lo; i < hi; i += 64) {
            a = _mm512_add_ps(a, _mm512_load_ps((const float *)(K + i)));
            b = _mm512_add_ps(b, _mm512_load_ps((const float *)(V + i)));
        }
    } else if (pattern == HEAD_PAGE) {
        size_t page = (size_t)PAGE_TOKENS * SLOT;
        for (size_t p = lo; p < hi; p += page)
            for (int h = 0; h < HEADS; h++)
                for (int t = 0; t < PAGE_TOKENS; t++) ROW_READ(p + (size_t)h * PAGE_TOKENS * ROW + t * ROW)
    } else {
        size_t blk = (size_t)BLOCK * SLOT;
        for (size_t s = lo; s < hi; s += blk) {
            size_t next = s + blk, at = 0;
            int ahead = next < hi && pattern != KERNEL;
            for (int h = 0; h < HEADS; h++)
                for (int t = 0; t < BLOCK; t++) {
                    ROW_READ(s + (size_t)t * SLOT + h * ROW)
                    for (int j = 0; ahead && j < 4 && at < blk; j++, at += 64) {
                        if (pattern == KERNEL_T1) {
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
    _mm512_storeu_ps(out, _mm512_add_ps(a, b));
    sink = out[0];
    return NULL;
}

int main(int argc, char **argv) {
    threads = argc > 1 ? atoi(argv[1]) : 1;
    if (threads < 1 || threads > 64) {
        fprintf(stderr, "usage: decode-read-probe THREADS (1-64)\n");
        return 2;
    }
    K = aligned_alloc(4096, BYTES);
    V = aligned_alloc(4096, BYTES);
    if (!K || !V) return 1;
    memset(K, 1, BYTES);
    memset(V, 1, BYTES);
    for (pattern = 0; pattern < PATTERNS; pattern++) {
        double best = 1e30;
        for (int r = 0; r < 5; r++) {
            pthread_t th[64];
            double t0 = now();
            for (long i = 0; i < threads; i++) pthread_create(&th[i], NULL, run, (void *)i);
            for (int i = 0; i < threads; i++) pthread_join(th[i], NULL);
            double t = now() - t0;
            if (t < best) best = t;
        }
        printf("%-10s %d threads: %5.1f GB/s\n", NAMES[pattern], threads, 2.0 * BYTES / best / 1e9);
    }
    return 0;
}
