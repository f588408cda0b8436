/*
 * How fast this core issues 256-bit FMAs in the decode kernel's score-loop pattern, in cycles
 * per FMA (the clock measured here by a chain of dependent adds). README "what limits it" uses
 * it: the 128 FMAs per token and kv head (GQA 4 x 128 dims) bound decode from below, and the
 * kernel's cycles per token against that bound say how far from the arithmetic it runs.
 *
 *   cc -O2 -mavx2 -mfma scripts/fma-probe.c -o fma-probe && taskset -c 1 ./fma-probe
 *
 * x86-64 with AVX2 and FMA only. Each figure is the median of 5 runs of 10^8 loop turns, each
 * against the clock chain timed right around it.
 */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define TURNS 100000000L

/* The loops are whole in asm, 64-byte aligned: a compiler's loop around the same FMAs ran at
 * 1.4-1.5 cycles per FMA on a Zen 1 core that does 1.0 here (code placement matters there). */
#define LOOP(body, ...)                                                                      \
    ({                                                                                     \
        long n_ = TURNS;                                                                   \
        double t_ = now();                                                                 \
        __asm__ volatile(".p2align 6\n1:\n" body "dec %0\njnz 1b\n" : "+r"(n_)::__VA_ARGS__); \
        now() - t_;                                                                        \
    })
#define ADDS "add $1,%%rax\nadd $1,%%rax\nadd $1,%%rax\nadd $1,%%rax\n"
/* Every FMA reads the same two sources. */
#define SAME                                                                         \
    "vfmadd213ps %%ymm8,%%ymm9,%%ymm0\nvfmadd213ps %%ymm8,%%ymm9,%%ymm1\n"            \
    "vfmadd213ps %%ymm8,%%ymm9,%%ymm2\nvfmadd213ps %%ymm8,%%ymm9,%%ymm3\n"            \
    "vfmadd213ps %%ymm8,%%ymm9,%%ymm4\nvfmadd213ps %%ymm8,%%ymm9,%%ymm5\n"            \
    "vfmadd213ps %%ymm8,%%ymm9,%%ymm6\nvfmadd213ps %%ymm8,%%ymm9,%%ymm7\n"
/* The score loop: 4 query rows (ymm8-11) x 2 tokens (ymm12-13), 8 accumulators. */
#define SCORE                                                                        \
    "vfmadd231ps %%ymm8,%%ymm12,%%ymm0\nvfmadd231ps %%ymm8,%%ymm13,%%ymm1\n"          \
    "vfmadd231ps %%ymm9,%%ymm12,%%ymm2\nvfmadd231ps %%ymm9,%%ymm13,%%ymm3\n"          \
    "vfmadd231ps %%ymm10,%%ymm12,%%ymm4\nvfmadd231ps %%ymm10,%%ymm13,%%ymm5\n"        \
    "vfmadd231ps %%ymm11,%%ymm12,%%ymm6\nvfmadd231ps %%ymm11,%%ymm13,%%ymm7\n"
#define YMMS "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", \
             "xmm10", "xmm11", "xmm12", "xmm13"

/* Cycles per FMA: the FMA loop's time over a dependent-add chain's (4 cycles per turn) timed
 * right before and after it (a VM's clock moves); the median of 5. */
static double cycles_per_fma(int score) {
    double v[5];
    for (int r = 0; r < 5; r++) {
        double c0 = LOOP(ADDS, "rax");
        double t = score ? LOOP(SCORE, YMMS) : LOOP(SAME, YMMS);
        v[r] = t / ((c0 + LOOP(ADDS, "rax")) / 2) * 4.0 / 8.0;
        for (int i = r; i > 0 && v[i] < v[i - 1]; i--) {
            double x = v[i];
            v[i] = v[i - 1], v[i - 1] = x;
        }
    }
    return v[2];
}

int main(void) {
    _mm256_zeroall();
    double hz = 4.0 * TURNS / LOOP(ADDS, "rax");
    double same = cycles_per_fma(0), qk = cycles_per_fma(1);
    printf("clock %.2f GHz\n", hz / 1e9);
    printf("256-bit FMA, shared sources:      %.2f cycles per FMA\n", same);
    printf("256-bit FMA, score-loop pattern:  %.2f cycles per FMA\n", qk);
    return 0;
}
