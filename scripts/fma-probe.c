/*
 * How fast this core runs the decode kernel's inner loop shape: cycles per turn of 8 256-bit
 * FMAs (4 query rows x 2 tokens of one 8-dim chunk), alone and with the loads and f16 / bf16
 * conversions that feed them (the clock measured by a chain of dependent adds). The kernel does
 * 8 such turns per token and kv head for the scores and 8 for the values (GQA 4 x 128 dims), so
 * 16 turns bound decode from below (docs/performance.md, "CPU paged attention: decode").
 *
 *   cc -O2 -mavx2 -mfma -mf16c scripts/fma-probe.c -o fma-probe && taskset -c 1 ./fma-probe
 *
 * x86-64 with AVX2, FMA and F16C only. Each figure is the median of 5 runs of 10^8 loop turns, each
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

/* Data the loops read (never written: the values do not matter, only the instructions). */
static _Alignas(64) unsigned short kf16[2][64];
static _Alignas(64) float kf32[2][64], q[4][64];

/* The loops are whole in asm, 64-byte aligned: a compiler's loop around the same FMAs ran at
 * 1.4-1.5 cycles per FMA on a Zen 1 core that does 1.0 here (code placement matters there). */
#define LOOP(body, ...)                                                                    \
    ({                                                                                   \
        long n_ = TURNS;                                                                 \
        double t_ = now();                                                               \
        __asm__ volatile(".p2align 6\n1:\n" body "dec %0\njnz 1b\n"                       \
                         : "+r"(n_)                                                      \
                         : "r"(kf16), "r"(kf32), "r"(q)                                  \
                         : __VA_ARGS__);                                                 \
        now() - t_;                                                                      \
    })
#define ADDS "add $1,%%rax\nadd $1,%%rax\nadd $1,%%rax\nadd $1,%%rax\n"
/* The score loop's 8 FMAs per chunk: 4 query rows (ymm10-13) x 2 tokens (ymm8-9). */
#define FMAS                                                                           \
    "vfmadd231ps %%ymm10,%%ymm8,%%ymm0\nvfmadd231ps %%ymm10,%%ymm9,%%ymm1\n"            \
    "vfmadd231ps %%ymm11,%%ymm8,%%ymm2\nvfmadd231ps %%ymm11,%%ymm9,%%ymm3\n"            \
    "vfmadd231ps %%ymm12,%%ymm8,%%ymm4\nvfmadd231ps %%ymm12,%%ymm9,%%ymm5\n"            \
    "vfmadd231ps %%ymm13,%%ymm8,%%ymm6\nvfmadd231ps %%ymm13,%%ymm9,%%ymm7\n"
/* The two tokens' K chunks: f16 converted by F16C, or f32 loaded. */
#define K_F16 "vcvtph2ps (%1),%%ymm8\nvcvtph2ps 64(%1),%%ymm9\n"
#define K_F32 "vmovups (%2),%%ymm8\nvmovups 64(%2),%%ymm9\n"
/* The 4 query rows' chunks. */
#define Q_LD "vmovups (%3),%%ymm10\nvmovups 64(%3),%%ymm11\nvmovups 128(%3),%%ymm12\nvmovups 192(%3),%%ymm13\n"
/* bf16 K widened in order, as the kernel did before: zero-extend 8 values, shift each up. */
#define K_BF16 "vpmovzxwd (%1),%%ymm8\nvpslld $16,%%ymm8,%%ymm8\n" \
               "vpmovzxwd 64(%1),%%ymm9\nvpslld $16,%%ymm9,%%ymm9\n"
/* bf16 K as the kernel loads it now (a split pair, kernel.rs `load8x2_avx2`): one 16-value
 * load, the even values by a shift and the odd ones by an AND with 0xffff0000 (ymm15); a turn
 * then covers two chunks of one token, so this is half of one token pair's conversions. */
#define K_BF16_SPLIT "vmovdqu (%1),%%ymm14\nvpslld $16,%%ymm14,%%ymm8\nvpand %%ymm15,%%ymm14,%%ymm9\n"
/* The same with the AND as LLVM writes it unless told otherwise (a word blend with a register
 * whose high halves are zero; ymm15 here, the same cost): kernel.rs `and_ps` says why not. */
#define K_BF16_BLEND "vmovdqu (%1),%%ymm14\nvpslld $16,%%ymm14,%%ymm8\nvpblendw $0xaa,%%ymm14,%%ymm15,%%ymm9\n"
#define YMMS "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", \
             "xmm10", "xmm11", "xmm12", "xmm13", "xmm14"

/* Cycles per loop turn: the loop's time over a dependent-add chain's (4 cycles per turn) timed
 * right before and after it (a VM's clock moves); the median of 5. */
#define CYCLES(body)                                                                   \
    ({                                                                                 \
        double v_[5];                                                                  \
        for (int r_ = 0; r_ < 5; r_++) {                                               \
            double c0_ = LOOP(ADDS, "rax"), t_ = LOOP(body, YMMS);                     \
            v_[r_] = t_ / ((c0_ + LOOP(ADDS, "rax")) / 2) * 4.0;                       \
            for (int i_ = r_; i_ > 0 && v_[i_] < v_[i_ - 1]; i_--) {                   \
                double x_ = v_[i_];                                                    \
                v_[i_] = v_[i_ - 1], v_[i_ - 1] = x_;                                  \
            }                                                                          \
        }                                                                              \
        v_[2];                                                                         \
    })

int main(void) {
    _mm256_zeroall();
    /* ymm15 = 0xffff0000 in every lane (the bf16 odd-value mask); no loop below writes it. */
    __asm__ volatile("vpcmpeqd %%ymm15,%%ymm15,%%ymm15\nvpslld $16,%%ymm15,%%ymm15" ::: "xmm15");
    double hz = 4.0 * TURNS / LOOP(ADDS, "rax");
    printf("clock %.2f GHz; cycles per turn of 8 256-bit FMAs (4 query rows x 2 tokens):\n", hz / 1e9);
    printf("FMAs only:                              %.2f\n", CYCLES(FMAS));
    printf("+ 2 f32 K loads + 4 query loads:        %.2f\n", CYCLES(K_F32 Q_LD FMAS));
    printf("+ 2 f16 K conversions (vcvtph2ps):      %.2f\n", CYCLES(K_F16 FMAS));
    printf("+ 2 f16 K conversions + 4 query loads:  %.2f\n", CYCLES(K_F16 Q_LD FMAS));
    printf("+ bf16 K widened in order + query:      %.2f\n", CYCLES(K_BF16 Q_LD FMAS));
    printf("+ bf16 K split pair + query:            %.2f\n", CYCLES(K_BF16_SPLIT Q_LD FMAS));
    printf("+ bf16 split pair, AND as vpblendw:     %.2f\n", CYCLES(K_BF16_BLEND Q_LD FMAS));
    return 0;
}
