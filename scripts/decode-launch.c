/*
 * One decode launch shape through the C ABI, for counting the instructions a launch executes
 * (scripts/count-decode-instructions runs it under callgrind, collecting inside
 * kvs_attention_launch only). Not a timing: machines are noisy, instruction counts are not.
 *
 *   decode-launch SEQS CTX PAGE_SIZE DTYPE LAUNCHES THREADS
 *
 * 32 query heads, 8 KV heads x 128 (GQA 4), f32 query and output, DTYPE (f16, bf16 or f32) K/V
 * in the dense [pages, page_size, kv_heads, head_dim] layout, every sequence CTX tokens long
 * with its pages interleaved with the others' (as a paged cache holds them). Exit code 0 =
 * every launch returned KVS_STATUS_OK and the output is finite.
 */
#include "kvshare.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: %s SEQS CTX PAGE_SIZE f16|bf16|f32 LAUNCHES THREADS\n", argv[0]);
        return 2;
    }
    int seqs = atoi(argv[1]), ctx = atoi(argv[2]), ps = atoi(argv[3]);
    int launches = atoi(argv[5]), threads = atoi(argv[6]);
    uint32_t dtype;
    size_t esize;
    if (!strcmp(argv[4], "f16")) {
        dtype = KVS_DTYPE_F16, esize = 2;
    } else if (!strcmp(argv[4], "bf16")) {
        dtype = KVS_DTYPE_BF16, esize = 2;
    } else if (!strcmp(argv[4], "f32")) {
        dtype = KVS_DTYPE_F32, esize = 4;
    } else {
        fprintf(stderr, "dtype: f16, bf16 or f32\n");
        return 2;
    }
    if (seqs < 1 || ctx < 1 || ps < 1 || launches < 0 || threads < 0) {
        fprintf(stderr, "bad arguments\n");
        return 2;
    }
    const int H = 32, KH = 8, D = 128;
    int per_seq = (ctx + ps - 1) / ps, pages = seqs * per_seq;
    size_t n = (size_t)pages * ps * KH * D;
    unsigned char *k = malloc(n * esize), *v = malloc(n * esize);
    float *q = malloc(sizeof(float) * seqs * H * D), *o = malloc(sizeof(float) * seqs * H * D);
    int32_t *table = malloc(sizeof(int32_t) * seqs * per_seq), *lens = malloc(sizeof(int32_t) * seqs);
    if (!k || !v || !q || !o || !table || !lens) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    /* Small values of either width: 0x3000 + noise is about 0.125..0.25 in f16, a small
     * positive number in bf16 (upper half of a float), and a tiny float in f32. */
    for (size_t i = 0; i < n * esize / 2; i++) {
        ((uint16_t *)k)[i] = (uint16_t)(0x3000 + (i * 7919 % 1024));
        ((uint16_t *)v)[i] = (uint16_t)(0x3000 + (i * 104729 % 1024));
    }
    for (int i = 0; i < seqs * H * D; i++) q[i] = (float)(i % 17) * 0.01f;
    for (int s = 0; s < seqs; s++) {
        lens[s] = ctx;
        for (int p = 0; p < per_seq; p++) table[s * per_seq + p] = p * seqs + s;
    }
    kvs_backend_options opt;
    memset(&opt, 0, sizeof opt);
    opt.num_threads = (uint32_t)threads;
    kvs_backend *b;
    if (kvs_backend_new(KVS_BACKEND_KIND_CPU, &opt, &b) != KVS_STATUS_OK) {
        fprintf(stderr, "kvs_backend_new failed\n");
        return 1;
    }
    kvs_attention_args a;
    memset(&a, 0, sizeof a);
    a.num_seqs = (uint32_t)seqs;
    a.num_tokens = (uint32_t)seqs;
    a.num_heads = H;
    a.query = q;
    a.query_dtype = KVS_DTYPE_F32;
    a.output = o;
    a.output_dtype = KVS_DTYPE_F32;
    a.key_cache = k;
    a.value_cache = v;
    a.cache.dtype = dtype;
    a.cache.num_pages = (uint32_t)pages;
    a.cache.page_size = (uint32_t)ps;
    a.cache.num_kv_heads = KH;
    a.cache.head_dim = D;
    a.block_table = table;
    a.max_pages_per_seq = (uint32_t)per_seq;
    a.context_lens = lens;
    a.scale = 0.0884f;
    for (int i = 0; i < launches; i++) {
        if (kvs_attention_launch(b, &a, NULL) != KVS_STATUS_OK) {
            fprintf(stderr, "kvs_attention_launch failed\n");
            return 1;
        }
    }
    int ok = 1;
    for (int i = 0; i < seqs * H * D; i++) ok &= o[i] == o[i] && o[i] - o[i] == 0.0f;
    kvs_backend_free(b);
    if (!ok && launches > 0) {
        fprintf(stderr, "non-finite output\n");
        return 1;
    }
    return 0;
}
