/*
 * The loop a serving engine runs, end to end through the C ABI:
 *   1. allocate pages for a batch of sequences that share a system prompt (kvs_seq_begin,
 *      prefix hits for the later ones),
 *   2. write each step's K/V into the paged layer caches by slot mapping (kvs_kv_write),
 *   3. launch paged attention with the cache's block tables and context lengths
 *      (prefill with query starts, then several decode steps after kvs_seq_append_batch),
 *   4. compare every output with a reference computed here on a contiguous copy of each
 *      sequence's K/V (K/V are a pure function of token and position, so shared pages must
 *      hold exactly what the sequence would have written itself).
 * Exit code 0 = pass.
 */
#include "kvs_test.h"

enum {
    PAGE_SIZE = 16,
    NUM_PAGES = 64,
    KV_HEADS = 2,
    GROUP = 4,
    HEADS = KV_HEADS * GROUP,
    DIM = 32,
    NUM_SEQS = 3,
    SYS_LEN = 40,
    MAX_TOKENS = 96,
    MAX_PAGES = MAX_TOKENS / PAGE_SIZE,
    DECODE_STEPS = 4,
};

/* No libm: the harness links only -lkvshare. */
static double d_abs(double x) { return x < 0 ? -x : x; }
/* exp(x) for x <= 0: halve until small, Taylor series, square back (relative error ~1e-15). */
static double d_exp(double x) {
    int k = 0;
    while (x < -0.5) {
        x /= 2;
        k++;
    }
    double term = 1, sum = 1;
    for (int i = 1; i < 20; i++) {
        term *= x / i;
        sum += term;
    }
    while (k-- > 0) sum *= sum;
    return sum;
}

/* The "model": K, V and Q are pure functions of (token, position, head, dim), values in
 * [-1, 1) from an integer hash. */
static float hashf(uint32_t a, uint32_t b, uint32_t c, uint32_t d, uint32_t e) {
    uint32_t h = 2166136261u;
    uint32_t v[5] = {a, b, c, d, e};
    for (int i = 0; i < 5; i++) {
        h = (h ^ v[i]) * 16777619u;
        h ^= h >> 15;
        h *= 0x2c1b3c6du;
        h ^= h >> 12;
    }
    return (float)((double)(h >> 8) / (double)(1u << 23) - 1.0);
}
static float kv_val(int which, int32_t tok, size_t pos, int head, int x) {
    return hashf((uint32_t)which, (uint32_t)tok, (uint32_t)pos, (uint32_t)head, (uint32_t)x);
}
static float q_val(int32_t tok, size_t pos, int head, int x) {
    return hashf(7u, (uint32_t)tok, (uint32_t)pos, (uint32_t)head, (uint32_t)x);
}

typedef struct {
    uint64_t id;
    int32_t tokens[MAX_TOKENS];
    size_t len;
} seq_t;

static float key_cache[NUM_PAGES * PAGE_SIZE * KV_HEADS * DIM];
static float value_cache[NUM_PAGES * PAGE_SIZE * KV_HEADS * DIM];

/* One step for `n` sequences whose last `qlens[i]` tokens are new: write their K/V, attend,
 * and check against the reference. */
static void step(kvs_cache *cache, kvs_backend *be, seq_t **seqs, size_t n, const uint32_t *qlens,
                 int decode) {
    uint64_t ids[NUM_SEQS];
    int32_t qsl[NUM_SEQS + 1];
    size_t total = 0;
    qsl[0] = 0;
    for (size_t i = 0; i < n; i++) {
        ids[i] = seqs[i]->id;
        total += qlens[i];
        qsl[i + 1] = (int32_t)total;
    }

    /* New K/V rows [total, KV_HEADS, DIM] and their slots. */
    static float newk[MAX_TOKENS * NUM_SEQS * KV_HEADS * DIM];
    static float newv[MAX_TOKENS * NUM_SEQS * KV_HEADS * DIM];
    static float query[MAX_TOKENS * NUM_SEQS * HEADS * DIM];
    static float out[MAX_TOKENS * NUM_SEQS * HEADS * DIM];
    int64_t slots[MAX_TOKENS * NUM_SEQS];
    size_t num_slots = 0;
    CHECK_OK(kvs_cache_slot_mapping(cache, 0, ids, qlens, n, slots, total, &num_slots));
    CHECK(num_slots == total);
    size_t t = 0;
    for (size_t i = 0; i < n; i++) {
        for (size_t j = seqs[i]->len - qlens[i]; j < seqs[i]->len; j++, t++) {
            int32_t tok = seqs[i]->tokens[j];
            for (int h = 0; h < KV_HEADS; h++)
                for (int x = 0; x < DIM; x++) {
                    newk[(t * KV_HEADS + h) * DIM + x] = kv_val(0, tok, j, h, x);
                    newv[(t * KV_HEADS + h) * DIM + x] = kv_val(1, tok, j, h, x);
                }
            for (int h = 0; h < HEADS; h++)
                for (int x = 0; x < DIM; x++) query[(t * HEADS + h) * DIM + x] = q_val(tok, j, h, x);
        }
    }

    kvs_kv_layout layout = kvs_kv_layout_dense(KVS_DTYPE_F32, NUM_PAGES, PAGE_SIZE, KV_HEADS, DIM);
    kvs_kv_write_args w;
    memset(&w, 0, sizeof w);
    w.num_tokens = (uint32_t)total;
    w.key = newk;
    w.value = newv;
    w.src_dtype = KVS_DTYPE_F32;
    w.key_cache = key_cache;
    w.value_cache = value_cache;
    w.cache = layout;
    w.slot_mapping = slots;
    w.slot_mapping_type = KVS_INDEX_TYPE_INT64;
    CHECK_OK(kvs_kv_write(be, &w, NULL));

    int32_t table[NUM_SEQS * MAX_PAGES];
    int32_t ctx[NUM_SEQS];
    CHECK_OK(kvs_cache_block_tables(cache, 0, ids, n, MAX_PAGES, 0, table, n * MAX_PAGES, ctx, n));
    for (size_t i = 0; i < n; i++) CHECK((size_t)ctx[i] == seqs[i]->len);

    kvs_attention_args a;
    memset(&a, 0, sizeof a);
    a.num_seqs = (uint32_t)n;
    a.num_tokens = (uint32_t)total;
    a.num_heads = HEADS;
    a.query = query;
    a.query_dtype = KVS_DTYPE_F32;
    a.output = out;
    a.output_dtype = KVS_DTYPE_F32;
    a.key_cache = key_cache;
    a.value_cache = value_cache;
    a.cache = layout;
    a.block_table = table;
    a.max_pages_per_seq = MAX_PAGES;
    a.context_lens = ctx;
    a.query_start_loc = decode ? NULL : qsl;
    a.scale = 0.17677669529663687f; /* 1 / sqrt(DIM) */
    CHECK_OK(kvs_attention_launch(be, &a, NULL));

    /* Reference on a contiguous copy of each sequence's K/V, computed from the model. */
    static double kc[MAX_TOKENS * KV_HEADS * DIM], vc[MAX_TOKENS * KV_HEADS * DIM];
    double worst = 0;
    t = 0;
    for (size_t i = 0; i < n; i++) {
        const seq_t *s = seqs[i];
        for (size_t p = 0; p < s->len; p++)
            for (int h = 0; h < KV_HEADS; h++)
                for (int x = 0; x < DIM; x++) {
                    kc[(p * KV_HEADS + h) * DIM + x] = kv_val(0, s->tokens[p], p, h, x);
                    vc[(p * KV_HEADS + h) * DIM + x] = kv_val(1, s->tokens[p], p, h, x);
                }
        for (size_t j = s->len - qlens[i]; j < s->len; j++, t++) {
            for (int h = 0; h < HEADS; h++) {
                int kh = h / GROUP;
                double sc[MAX_TOKENS], m = -1e300, l = 0;
                for (size_t p = 0; p <= j; p++) {
                    double dot = 0;
                    for (int x = 0; x < DIM; x++)
                        dot += (double)query[(t * HEADS + h) * DIM + x] * kc[(p * KV_HEADS + kh) * DIM + x];
                    sc[p] = dot * a.scale;
                    if (sc[p] > m) m = sc[p];
                }
                for (size_t p = 0; p <= j; p++) {
                    sc[p] = d_exp(sc[p] - m);
                    l += sc[p];
                }
                for (int x = 0; x < DIM; x++) {
                    double o = 0;
                    for (size_t p = 0; p <= j; p++) o += sc[p] * vc[(p * KV_HEADS + kh) * DIM + x];
                    o /= l;
                    double err = d_abs(o - out[(t * HEADS + h) * DIM + x]);
                    if (err > worst) worst = err;
                    if (err > 1e-4 * (1 + d_abs(o)))
                        T_FAIL("seq %llu token %zu head %d dim %d: got %f, want %f",
                             (unsigned long long)s->id, j, h, x, out[(t * HEADS + h) * DIM + x], o);
                }
            }
        }
    }
    printf("attn_loop: %s step, %zu seqs, %zu query tokens: max abs error %.2e\n",
           decode ? "decode" : "prefill", n, total, worst);
}

int main(void) {
    kvs_config cfg = kvs_config_default();
    cfg.page_size = PAGE_SIZE;
    cfg.num_device_pages = NUM_PAGES;
    cfg.num_host_pages = 0;
    cfg.num_layers = 1;
    cfg.num_kv_heads = KV_HEADS;
    cfg.head_dim = DIM;
    cfg.dtype = KVS_DTYPE_F32;
    cfg.enable_prefix_caching = true;
    cfg.reserve_null_page = true;
    kvs_cache *cache = NULL;
    CHECK_OK(kvs_cache_new(&cfg, &cache));
    kvs_backend_options opts;
    memset(&opts, 0, sizeof opts);
    opts.num_threads = 2;
    kvs_backend *be = NULL;
    CHECK_OK(kvs_backend_new(KVS_BACKEND_KIND_CPU, &opts, &be));

    /* Three requests: one system prompt, different user turns. */
    static seq_t seqs[NUM_SEQS];
    const size_t own[NUM_SEQS] = {8, 13, 3};
    for (int i = 0; i < NUM_SEQS; i++) {
        seqs[i].id = 100 + (uint64_t)i;
        for (int p = 0; p < SYS_LEN; p++) seqs[i].tokens[p] = 1000 + p;
        for (size_t p = 0; p < own[i]; p++) seqs[i].tokens[SYS_LEN + p] = 5000 + 100 * i + (int32_t)p;
        seqs[i].len = SYS_LEN + own[i];
    }

    /* Step 1: the first request alone, full prefill. */
    kvs_seq_info info;
    CHECK_OK(kvs_seq_begin(cache, seqs[0].id, seqs[0].tokens, seqs[0].len, NULL, seqs[0].len - 1, 0, &info));
    CHECK(info.matched_tokens == 0);
    seq_t *batch[NUM_SEQS] = {&seqs[0]};
    uint32_t qlens[NUM_SEQS] = {(uint32_t)seqs[0].len};
    step(cache, be, batch, 1, qlens, 0);

    /* Step 2: the other two hit the cached system-prompt pages and prefill only the rest. */
    for (int i = 1; i < NUM_SEQS; i++) {
        CHECK_OK(kvs_seq_begin(cache, seqs[i].id, seqs[i].tokens, seqs[i].len, NULL, seqs[i].len - 1, 0, &info));
        CHECK(info.matched_tokens == (SYS_LEN / PAGE_SIZE) * PAGE_SIZE);
        batch[i - 1] = &seqs[i];
        qlens[i - 1] = (uint32_t)(seqs[i].len - info.matched_tokens);
    }
    step(cache, be, batch, NUM_SEQS - 1, qlens, 0);

    /* Decode steps for the whole batch. */
    for (int s = 0; s < DECODE_STEPS; s++) {
        uint64_t ids[NUM_SEQS];
        int32_t toks[NUM_SEQS];
        for (int i = 0; i < NUM_SEQS; i++) {
            ids[i] = seqs[i].id;
            toks[i] = 7000 + 10 * s + i;
            seqs[i].tokens[seqs[i].len++] = toks[i];
            batch[i] = &seqs[i];
            qlens[i] = 1;
        }
        kvs_copy copies[NUM_SEQS];
        size_t num_copies = 0;
        CHECK_OK(kvs_seq_append_batch(cache, ids, NUM_SEQS, toks, NUM_SEQS, copies, NUM_SEQS, &num_copies));
        if (num_copies > 0) {
            kvs_kv_copy_args c;
            memset(&c, 0, sizeof c);
            c.key_cache = key_cache;
            c.value_cache = value_cache;
            c.cache = kvs_kv_layout_dense(KVS_DTYPE_F32, NUM_PAGES, PAGE_SIZE, KV_HEADS, DIM);
            CHECK_OK(kvs_kv_copy(be, &c, copies, num_copies, NULL));
        }
        step(cache, be, batch, NUM_SEQS, qlens, 1);
    }

    for (int i = 0; i < NUM_SEQS; i++) CHECK_OK(kvs_seq_free(cache, seqs[i].id));
    kvs_backend_free(be);
    kvs_cache_free(cache);
    printf("attn_loop: ok\n");
    return 0;
}
