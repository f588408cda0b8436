/*
 * How fast this core issues 256-bit FMAs in the decode kernel's score-loop pattern, in cycles
 * per FMA (the clock measured here by a chain of dependent adds). README "what limits it" uses
 * it: the 128 FMAs per token and kv head (GQA 4 x 128 dims) bound decode from below.
 *
 *   cc -O2 -mavx2 -mfma scripts/fma-probe.c -o fma-probe && taskset -c 1 ./fma-probe
 *
 * x86-64 with AVX2 and FMA only. Each figure is the best of 5 runs of 10^8 loop turns.
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
#define BEST(...)                                        \
    ({                                                   \
        double best_ = 1e30;                             \
        for (int r_ = 0; r_ < 5; r_++) {                 \
            double t_ = now();                           \
            __VA_ARGS__;                                 \
            t_ = now() - t_;                             \
            best_ = t_ < best_ ? t_ : best_;             \
        }                                                \
        best_;                                           \
    })

int main(void) {
    /* Clock: 4 dependent adds per turn, one cycle each. */
    double t_clock = BEST({
        long x = 0, n = TURNS;
        __asm__ volatile("1: add $1,%0\n add $1,%0\n add $1,%0\n add $1,%0\n sub $1,%1\n jnz 1b"
                         : "+r"(x), "+r"(n));
    });
    double hz = 4.0 * TURNS / t_clock;
    __m256 a0 = _mm256_set1_ps(0.1f), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    __m256 x = _mm256_set1_ps(0.999f), y = _mm256_set1_ps(1e-4f);
    __m256 q0 = _mm256_set1_ps(0.5f), q1 = _mm256_set1_ps(0.25f), q2 = _mm256_set1_ps(0.125f),
           q3 = _mm256_set1_ps(0.0625f), k0 = _mm256_set1_ps(0.9f), k1 = _mm256_set1_ps(0.8f);
    /* Every FMA reads the same two sources: the core's FMA rate. */
    double t_same = BEST({
        for (long i = 0; i < TURNS; i++)
            __asm__ volatile(
                "vfmadd213ps %[y],%[x],%[a0]\n vfmadd213ps %[y],%[x],%[a1]\n"
                "vfmadd213ps %[y],%[x],%[a2]\n vfmadd213ps %[y],%[x],%[a3]\n"
                "vfmadd213ps %[y],%[x],%[a4]\n vfmadd213ps %[y],%[x],%[a5]\n"
                "vfmadd213ps %[y],%[x],%[a6]\n vfmadd213ps %[y],%[x],%[a7]\n"
                : [a0] "+x"(a0), [a1] "+x"(a1), [a2] "+x"(a2), [a3] "+x"(a3), [a4] "+x"(a4),
                  [a5] "+x"(a5), [a6] "+x"(a6), [a7] "+x"(a7)
                : [x] "x"(x), [y] "x"(y));
    });
    /* The score loop: 4 query rows x 2 tokens, each FMA reading three different registers. */
    double t_qk = BEST({
        for (long i = 0; i < TURNS; i++)
            __asm__ volatile(
                "vfmadd231ps %[q0],%[k0],%[a0]\n vfmadd231ps %[q0],%[k1],%[a1]\n"
                "vfmadd231ps %[q1],%[k0],%[a2]\n vfmadd231ps %[q1],%[k1],%[a3]\n"
                "vfmadd231ps %[q2],%[k0],%[a4]\n vfmadd231ps %[q2],%[k1],%[a5]\n"
                "vfmadd231ps %[q3],%[k0],%[a6]\n vfmadd231ps %[q3],%[k1],%[a7]\n"
                : [a0] "+x"(a0), [a1] "+x"(a1), [a2] "+x"(a2), [a3] "+x"(a3), [a4] "+x"(a4),
                  [a5] "+x"(a5), [a6] "+x"(a6), [a7] "+x"(a7)
                : [q0] "x"(q0), [q1] "x"(q1), [q2] "x"(q2), [q3] "x"(q3), [k0] "x"(k0),
                  [k1] "x"(k1));
    });
    float out[8];
    _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                                        _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7))));
    printf("clock %.2f GHz\n", hz / 1e9);
    printf("256-bit FMA, shared sources:      %.2f cycles per FMA\n", t_same * hz / (8.0 * TURNS));
    printf("256-bit FMA, score-loop pattern:  %.2f cycles per FMA\n", t_qk * hz / (8.0 * TURNS));
    printf("(checksum %g)\n", out[0]);
    return 0;
}
