/* Kernels for test_x86emu.py (the emulator's own test), built twice by the test:
 *   AVX-512 build:  cc -O2 -mavx512f -mavx512bw -mavx512vl -mavx512dq -mf16c -mfma -mamx-tile
 *                      -shared -fPIC   (run under the emulator)
 *   reference:      cc -O2 -DSELFTEST_REF -shared -fPIC ... -lm   (run natively)
 * Same exported names in both; the reference versions are plain scalar C reproducing the
 * AVX-512 semantics (including _mm512_reduce_add_ps's summation order). */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

__thread int64_t tls_value = 0;
int64_t tls_get(void) { return tls_value; }
void tls_set(int64_t v) { tls_value = v; }
int64_t tls_add(int64_t k) { tls_value += k; return tls_value; }

/* scalar integer loop (an LCG): the instruction count and speed check */
uint64_t spin(uint64_t n, uint64_t x) {
    for (uint64_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        __asm__ volatile("" : "+r"(x));
    }
    return x;
}

#ifndef SELFTEST_REF
#include <immintrin.h>

/* n multiple of 16 */
void k_cvtph_ps(const uint16_t *h, float *out, size_t n) {
    for (size_t i = 0; i < n; i += 16)
        _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + i))));
}
void k_scalef(const float *a, const float *b, float *out, size_t n) {
    for (size_t i = 0; i < n; i += 16)
        _mm512_storeu_ps(out + i, _mm512_scalef_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i)));
}
void k_fmadd(const float *a, const float *b, const float *c, float *out, size_t n) {
    for (size_t i = 0; i < n; i += 16)
        _mm512_storeu_ps(out + i, _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i),
                                                  _mm512_loadu_ps(c + i)));
}
/* any n: full vectors + masked tail; dst[i] = src[i]*2 + 1 for i < n, dst[n..] untouched */
void k_masked(const float *src, float *dst, size_t n) {
    const __m512 two = _mm512_set1_ps(2.0f), one = _mm512_set1_ps(1.0f);
    for (size_t i = 0; i < n; i += 16) {
        size_t left = n - i;
        __mmask16 m = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
        __m512 v = _mm512_maskz_loadu_ps(m, src + i);
        _mm512_mask_storeu_ps(dst + i, m, _mm512_fmadd_ps(v, two, one));
    }
}
/* n multiple of 16; returns the float sum's bit pattern */
uint32_t k_reduce_add(const float *a, size_t n) {
    __m512 acc = _mm512_setzero_ps();
    for (size_t i = 0; i < n; i += 16) acc = _mm512_add_ps(acc, _mm512_loadu_ps(a + i));
    float s = _mm512_reduce_add_ps(acc);
    uint32_t u; memcpy(&u, &s, 4); return u;
}
void k_permute(const float *a, const int32_t *idx, float *out) {
    _mm512_storeu_ps(out, _mm512_permutexvar_ps(_mm512_loadu_si512(idx), _mm512_loadu_ps(a)));
}
/* bf16 -> f32 by shift; n multiple of 16 */
void k_bf16(const uint16_t *in, float *out, size_t n) {
    for (size_t i = 0; i < n; i += 16) {
        __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(in + i)));
        _mm512_storeu_ps(out + i, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
    }
}
/* thread-local read inside an AVX-512 kernel: out[i] = a[i] * (float)tls_value */
void k_tls_scale(const float *a, float *out, size_t n) {
    __m512 s = _mm512_set1_ps((float)tls_value);
    for (size_t i = 0; i < n; i += 16) _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_loadu_ps(a + i), s));
}

/* Gathers with an index register above 15 (EVEX.V'), which this Bochs build refuses (#UD) and
 * x86emu re-runs with the index in a low register: out[i] = base[idx[i]] for lanes whose bit of
 * `mask` is set, others keep `fill`; also returns the opmask after the gather (0) and checks
 * that zmm0 (the low register x86emu borrows when the destination is zmm1) is unchanged. */
int64_t g_qword_high(const int64_t *base, const int32_t *idx, int64_t *out, uint32_t mask,
                     int64_t fill, int64_t *zmm0_out) {
    uint32_t k_after;
    __asm__ volatile(
        "vpbroadcastq %[fill], %%zmm1\n\t"
        "vpternlogd $0xff, %%zmm0, %%zmm0, %%zmm0\n\t"   /* zmm0 = all ones */
        "vmovdqu32 (%[idx]), %%ymm21\n\t"
        "kmovw %[mask], %%k1\n\t"
        "vpgatherdq (%[base],%%ymm21,8), %%zmm1%{%%k1%}\n\t"
        "vmovdqu64 %%zmm1, (%[out])\n\t"
        "vmovdqu64 %%zmm0, (%[z0])\n\t"
        "kmovw %%k1, %[kafter]\n\t"
        : [kafter] "=r"(k_after)
        : [base] "r"(base), [idx] "r"(idx), [out] "r"(out), [mask] "r"(mask), [fill] "r"(fill),
          [z0] "r"(zmm0_out)
        : "memory", "xmm0", "xmm1", "xmm21", "k1");
    return k_after;
}
/* The same with 16 dword lanes, index zmm29, destination zmm0 (x86emu borrows zmm1). */
int64_t g_dword_high(const int32_t *base, const int32_t *idx, int32_t *out, uint32_t mask,
                     int32_t fill, int64_t *zmm0_out) {
    uint32_t k_after;
    __asm__ volatile(
        "vpbroadcastd %[fill], %%zmm0\n\t"
        "vpternlogd $0xff, %%zmm1, %%zmm1, %%zmm1\n\t"
        "vmovdqu32 (%[idx]), %%zmm29\n\t"
        "kmovw %[mask], %%k2\n\t"
        "vpgatherdd 12(%[base],%%zmm29,4), %%zmm0%{%%k2%}\n\t"
        "vmovdqu32 %%zmm0, (%[out])\n\t"
        "vmovdqu64 %%zmm1, (%[z0])\n\t"
        "kmovw %%k2, %[kafter]\n\t"
        : [kafter] "=r"(k_after)
        : [base] "r"(base), [idx] "r"(idx), [out] "r"(out), [mask] "r"(mask), [fill] "r"(fill),
          [z0] "r"(zmm0_out)
        : "memory", "xmm0", "xmm1", "xmm29", "k2");
    return k_after;
}
/* AMX: loads a tile configuration (this Bochs build has no AMX: #UD expected). */
void amx_loadcfg(const void *cfg) { _tile_loadconfig(cfg); }

#else /* ---------------- scalar references (no AVX-512) ---------------- */
#include <math.h>
static float bits_f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t f_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static float half_to_float(uint16_t h) {
    uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 0x3ff;
    if (e == 31) return bits_f(s | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0));  /* NaN -> quiet */
    if (e == 0) {
        if (!m) return bits_f(s);
        float f = ldexpf((float)m, -24);   /* exact */
        return s ? -f : f;
    }
    return bits_f(s | ((e + 112) << 23) | (m << 13));
}
void k_cvtph_ps(const uint16_t *h, float *out, size_t n) { for (size_t i = 0; i < n; i++) out[i] = half_to_float(h[i]); }
/* scalef for finite normal inputs with moderate exponents: a * 2^floor(b) */
void k_scalef(const float *a, const float *b, float *out, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = ldexpf(a[i], (int)floorf(b[i]));
}
void k_fmadd(const float *a, const float *b, const float *c, float *out, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = fmaf(a[i], b[i], c[i]);
}
void k_masked(const float *src, float *dst, size_t n) { for (size_t i = 0; i < n; i++) dst[i] = fmaf(src[i], 2.0f, 1.0f); }
uint32_t k_reduce_add(const float *a, size_t n) {
    float v[16] = {0}, s8[8], s4[4];
    for (size_t i = 0; i < n; i += 16) for (int j = 0; j < 16; j++) v[j] = v[j] + a[i + j];
    for (int j = 0; j < 8; j++) s8[j] = v[8 + j] + v[j];
    for (int j = 0; j < 4; j++) s4[j] = s8[4 + j] + s8[j];
    float t0 = s4[0] + s4[2], t1 = s4[1] + s4[3];
    return f_bits(t0 + t1);
}
void k_permute(const float *a, const int32_t *idx, float *out) { for (int i = 0; i < 16; i++) out[i] = a[idx[i] & 15]; }
void k_bf16(const uint16_t *in, float *out, size_t n) { for (size_t i = 0; i < n; i++) out[i] = bits_f((uint32_t)in[i] << 16); }
void k_tls_scale(const float *a, float *out, size_t n) {
    float s = (float)tls_value; for (size_t i = 0; i < n; i++) out[i] = a[i] * s;
}

int64_t g_qword_high(const int64_t *base, const int32_t *idx, int64_t *out, uint32_t mask,
                     int64_t fill, int64_t *zmm0_out) {
    for (int i = 0; i < 8; i++) out[i] = (mask >> i) & 1 ? base[idx[i]] : fill;
    for (int i = 0; i < 8; i++) zmm0_out[i] = -1;
    return 0;
}
int64_t g_dword_high(const int32_t *base, const int32_t *idx, int32_t *out, uint32_t mask,
                     int32_t fill, int64_t *zmm0_out) {
    for (int i = 0; i < 16; i++) out[i] = (mask >> i) & 1 ? base[idx[i] + 3] : fill;
    for (int i = 0; i < 8; i++) zmm0_out[i] = -1;
    return 0;
}
#endif
