/*
 * The Ascend backend through the C ABI, as an engine on an NPU drives it: the engine owns ACL
 * (aclInit, aclrtSetDevice), its device buffers and its stream; kvshare loads CANN at run time,
 * enqueues the KV write and paged attention (decode, then a chunked prefill) on that stream and
 * returns; the engine synchronises and reads the output, which is compared with a reference
 * computed here in double precision from the host copy of the K/V written. Then the same two
 * launches on int8 caches the engine wrote itself (MindIE's "C8" KV: per-channel scales and
 * offsets, passed as FIA's antiquant arguments), through kvs_attention_launch_scaled.
 *
 * CANN here is the emulated runtime of tests/cann_emu: tests/ascend_c.rs builds it and runs this
 * program with KVS_ASCEND_EMU_DIR set to its directory. Without that variable (e.g. when the
 * generic C harness, tests/c_harness.rs, runs every C program of tests/c) there is no CANN to load and
 * the program prints why and exits 0: the emulator is built by the Rust test, not by the
 * harness. Against a real CANN, scripts/validate-ascend.sh runs the same program with
 * KVS_ASCEND_LIB_DIR=$ASCEND_HOME_PATH/lib64 (and KVS_ASCEND_DEVICE): the emulator-only checks
 * (live object and fault counters, work still queued before the sync) are then skipped.
 * Exit code 0 = pass.
 */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>

#include "kvs_test.h"

/* Raw values (the header's enum names are not relied on). */
enum { BACKEND_ASCEND = 1, DTYPE_BF16 = 2, DTYPE_INT8 = 5, INDEX_INT32 = 0, ST_OK = 0, ST_UNSUPPORTED = 6,
       ST_ATTN_INVALID = 501,
       ST_UNAVAILABLE = 500 };
enum { H2D = 1, D2H = 2 };

enum {
    PAGE = 128,
    NUM_PAGES = 8,
    KVH = 2,
    GROUP = 4,
    HEADS = KVH * GROUP,
    DIM = 128,
    NSEQ = 2,
    MAXP = 3,
};

/* The runtime functions the engine itself calls. */
typedef int (*init_fn)(const char *);
typedef int (*dev_fn)(int32_t);
typedef int (*malloc_fn)(void **, size_t, int);
typedef int (*free_fn)(void *);
typedef int (*memcpy_fn)(void *, size_t, const void *, size_t, int);
typedef int (*stream_new_fn)(void **);
typedef int (*stream_fn)(void *);
typedef long (*counter_fn)(const char *);
static init_fn acl_init;
static dev_fn set_device;
static malloc_fn dmalloc;
static free_fn dfree;
static memcpy_fn dmemcpy;
static stream_new_fn stream_new;
static stream_fn stream_sync, stream_destroy;
static counter_fn counter;

/* Counters of the emulator (NULL on a real CANN). */
static long cnt(const char *name, long if_real) { return counter ? counter(name) : if_real; }

static void *sym(void *h, const char *name) {
    void *p = dlsym(h, name);
    if (!p) T_FAIL("emulator symbol %s missing", name);
    return p;
}
#define BIND(var, name)                                                                \
    do {                                                                               \
        void *p_ = sym(h, name);                                                       \
        memcpy(&var, &p_, sizeof p_);                                                  \
    } while (0)

/* bf16 <-> float, written here. */
static float bf(uint16_t b) {
    uint32_t x = (uint32_t)b << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}
static uint16_t to_bf(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}
static double d_abs(double x) { return x < 0 ? -x : x; }
static double d_exp(double x) { /* exp for x <= 0, no libm */
    int k = 0;
    while (x < -0.5) { x /= 2; k++; }
    double s = 1, t = 1;
    for (int i = 1; i < 20; i++) { t *= x / i; s += t; }
    while (k-- > 0) s *= s;
    return s;
}

static uint32_t rng = 12345;
static float rnd(void) {
    rng = rng * 1664525u + 1013904223u;
    return (float)((rng >> 8) & 0xffff) / 32768.0f - 1.0f;
}

/* The cache the reference reads: bf16 (hk, hv) or int8 codes with their scales. */
static const uint16_t *ref_k, *ref_v;
static const int8_t *ref_k8, *ref_v8;
static const float *ref_ks, *ref_vs, *ref_ko, *ref_vo;
static float ref_kscale, ref_vscale;
static double cache_at(int value, size_t slot, int g, int d) {
    size_t i = (slot * KVH + (size_t)g) * DIM + (size_t)d, ch = (size_t)g * DIM + (size_t)d;
    if (!ref_k8) return bf(value ? ref_v[i] : ref_k[i]);
    if (value) return ((double)ref_v8[i] + ref_vo[ch]) * ref_vs[ch] * ref_vscale;
    return ((double)ref_k8[i] + ref_ko[ch]) * ref_ks[ch] * ref_kscale;
}

/* Checks a launch's output against attention over the reference cache, in double precision;
 * returns the worst relative error. */
static double check_output(const char *what, const uint16_t *hq, const uint16_t *ho, const int *ctx,
                           const int32_t *bt, const int *qlen, const int32_t *qsl) {
    double worst = 0;
    for (int s = 0; s < NSEQ; s++)
        for (int i = 0; i < qlen[s]; i++) {
            int tok = qsl[s] + i, pos = ctx[s] - qlen[s] + i;
            for (int n = 0; n < HEADS; n++) {
                int g = n / GROUP;
                const uint16_t *q = hq + ((size_t)tok * HEADS + n) * DIM;
                double sc[256], mx = -1e300, sum = 0, acc[DIM];
                for (int j = 0; j <= pos; j++) {
                    size_t slot = (size_t)bt[s * MAXP + j / PAGE] * PAGE + (size_t)(j % PAGE);
                    double dot = 0;
                    for (int d = 0; d < DIM; d++) dot += bf(q[d]) * cache_at(0, slot, g, d);
                    sc[j] = dot * 0.08838834764;
                    if (sc[j] > mx) mx = sc[j];
                }
                for (int d = 0; d < DIM; d++) acc[d] = 0;
                for (int j = 0; j <= pos; j++) {
                    size_t slot = (size_t)bt[s * MAXP + j / PAGE] * PAGE + (size_t)(j % PAGE);
                    double e = d_exp(sc[j] - mx);
                    sum += e;
                    for (int d = 0; d < DIM; d++) acc[d] += e * cache_at(1, slot, g, d);
                }
                for (int d = 0; d < DIM; d++) {
                    double want = acc[d] / sum;
                    double got = bf(ho[((size_t)tok * HEADS + n) * DIM + d]);
                    double err = d_abs(got - want) / (d_abs(want) + 0.1);
                    if (err > worst) worst = err;
                    if (err > 2e-2)
                        T_FAIL("%s seq %d token %d head %d dim %d: got %f want %f", what, s, i, n, d, got,
                               want);
                }
            }
        }
    return worst;
}

static void *dev_upload(const void *src, size_t n) {
    void *p = NULL;
    CHECK(dmalloc(&p, n, 0) == 0);
    CHECK(dmemcpy(p, n, src, n, H2D) == 0);
    return p;
}

/* Decode (pass 0: one query token per sequence) or a chunked prefill (pass 1: the last 9 and 3
 * tokens) over the caches dk, dv of `lay`, launched on `stream` (scaled when `sc` is not NULL),
 * then checked against the reference cache. */
static void attend(kvs_backend *be, void *stream, int pass, void *dk, void *dv, kvs_kv_layout lay,
                   const kvs_kv_scales *sc, const int *ctx, const int32_t *bt, void *dbt) {
    const int qlen[NSEQ] = {pass ? 9 : 1, pass ? 3 : 1};
    const int ntok = qlen[0] + qlen[1];
    int32_t qsl[NSEQ + 1] = {0, qlen[0], qlen[0] + qlen[1]};
    size_t qn = (size_t)ntok * HEADS * DIM;
    uint16_t *hq = malloc(qn * 2), *ho = malloc(qn * 2);
    for (size_t i = 0; i < qn; i++) hq[i] = to_bf(rnd());
    void *dq = dev_upload(hq, qn * 2);
    void *dout = dev_upload(hq, qn * 2);
    kvs_attention_args a;
    memset(&a, 0, sizeof a);
    a.num_seqs = NSEQ;
    a.num_tokens = (uint32_t)ntok;
    a.num_heads = HEADS;
    a.query = dq;
    a.query_dtype = DTYPE_BF16;
    a.output = dout;
    a.output_dtype = DTYPE_BF16;
    a.key_cache = dk;
    a.value_cache = dv;
    a.cache = lay;
    a.block_table = dbt;
    a.max_pages_per_seq = MAXP;
    a.context_lens = ctx;
    a.query_start_loc = pass ? qsl : NULL;
    a.scale = 0.08838834764f; /* 1/sqrt(128) */
    long syncs = cnt("calls:aclrtSynchronizeStream", 0);
    if (sc) {
        if (pass == 0) { /* the unscaled launch has no channel scales for an int8 cache */
            CHECK_STATUS(kvs_attention_launch(be, &a, stream), ST_ATTN_INVALID);
            CHECK(strstr(kvs_last_error_message(), "k_channel_scales") != NULL);
        }
        CHECK_STATUS(kvs_attention_launch_scaled(be, &a, sc, stream), ST_OK);
    } else {
        CHECK_STATUS(kvs_attention_launch(be, &a, stream), ST_OK);
    }
    CHECK(cnt("calls:aclrtSynchronizeStream", 0) == syncs); /* kvshare never syncs */
    CHECK(cnt("pending_tasks", 1) > 0);
    CHECK(stream_sync(stream) == 0);
    CHECK(dmemcpy(ho, qn * 2, dout, qn * 2, D2H) == 0);
    const char *what = pass ? (sc ? "int8 chunked prefill" : "chunked prefill")
                            : (sc ? "int8 decode" : "decode");
    double worst = check_output(what, hq, ho, ctx, bt, qlen, qsl);
    printf("%s: ok (worst relative error %.2e)\n", what, worst);
    CHECK(dfree(dq) == 0);
    CHECK(dfree(dout) == 0);
    free(hq);
    free(ho);
}

int main(void) {
    const char *dir = getenv("KVS_ASCEND_EMU_DIR");
    int real = 0;
    if (!dir || !dir[0]) {
        dir = getenv("KVS_ASCEND_LIB_DIR");
        real = 1;
    }
    if (!dir || !dir[0]) {
        printf("ascend_backend: skipped: neither KVS_ASCEND_EMU_DIR nor KVS_ASCEND_LIB_DIR is set "
               "(no CANN on this machine; tests/ascend_c.rs builds the emulated CANN and runs this "
               "program with it)\n");
        return 0;
    }
    const char *devs = getenv("KVS_ASCEND_DEVICE");
    int device = devs && devs[0] ? atoi(devs) : 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/libascendcl.so", dir);
    void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (!h) T_FAIL("dlopen %s: %s", path, dlerror());
    BIND(acl_init, "aclInit");
    BIND(set_device, "aclrtSetDevice");
    BIND(dmalloc, "aclrtMalloc");
    BIND(dfree, "aclrtFree");
    BIND(dmemcpy, "aclrtMemcpy");
    BIND(stream_new, "aclrtCreateStream");
    BIND(stream_sync, "aclrtSynchronizeStream");
    BIND(stream_destroy, "aclrtDestroyStream");
    if (!real) BIND(counter, "emu_counter");

    /* The engine initialises ACL first; kvshare must accept that. */
    int r = acl_init(NULL);
    CHECK(r == 0 || r == 100002);
    CHECK(set_device(device) == 0);
    void *stream = NULL;
    CHECK(stream_new(&stream) == 0);

    /* Missing libraries: a clear status naming the library. */
    kvs_backend_options opts;
    memset(&opts, 0, sizeof opts);
    opts.library_dir = "/nonexistent/cann/lib64";
    kvs_backend *be = NULL;
    CHECK_STATUS(kvs_backend_new(BACKEND_ASCEND, &opts, &be), ST_UNAVAILABLE);
    CHECK(strstr(kvs_last_error_message(), "libascendcl.so") != NULL);
    CHECK(be == NULL);

    opts.library_dir = dir;
    opts.device_id = device;
    CHECK_STATUS(kvs_backend_new(BACKEND_ASCEND, &opts, &be), ST_OK);
    size_t len = 0;
    CHECK_STATUS(kvs_backend_describe(be, NULL, 0, &len), ST_OK);
    char *desc = malloc(len + 1);
    CHECK_STATUS(kvs_backend_describe(be, desc, len + 1, &len), ST_OK);
    printf("%s\n", desc);
    CHECK(strstr(desc, "aclnnFusedInferAttentionScore") != NULL);
    free(desc);

    /* Sequence 0 has 150 tokens (pages 5, 2), sequence 1 has 40 (page 6). Every token's K/V is
     * written with kvs_kv_write from a [T, KVH, DIM] batch and its slot mapping. */
    const int ctx[NSEQ] = {150, 40};
    const int32_t bt[NSEQ * MAXP] = {5, 2, -1, 6, -1, -1};
    const int T = ctx[0] + ctx[1];
    size_t cache_n = (size_t)NUM_PAGES * PAGE * KVH * DIM;
    uint16_t *hk = calloc(cache_n, 2), *hv = calloc(cache_n, 2);
    uint16_t *nk = malloc((size_t)T * KVH * DIM * 2), *nv = malloc((size_t)T * KVH * DIM * 2);
    int32_t *slots = malloc((size_t)T * 4);
    for (int s = 0, t = 0; s < NSEQ; s++)
        for (int p = 0; p < ctx[s]; p++, t++) {
            slots[t] = bt[s * MAXP + p / PAGE] * PAGE + p % PAGE;
            for (int i = 0; i < KVH * DIM; i++) {
                nk[(size_t)t * KVH * DIM + i] = to_bf(rnd());
                nv[(size_t)t * KVH * DIM + i] = to_bf(rnd());
                hk[(size_t)slots[t] * KVH * DIM + i] = nk[(size_t)t * KVH * DIM + i];
                hv[(size_t)slots[t] * KVH * DIM + i] = nv[(size_t)t * KVH * DIM + i];
            }
        }
    void *dk = dev_upload(hk, cache_n * 2), *dv = dev_upload(hv, cache_n * 2);
    /* Start the device caches from garbage: only the write may fill them. */
    {
        uint16_t *junk = malloc(cache_n * 2);
        for (size_t i = 0; i < cache_n; i++) junk[i] = to_bf(rnd() * 50);
        CHECK(dmemcpy(dk, cache_n * 2, junk, cache_n * 2, H2D) == 0);
        CHECK(dmemcpy(dv, cache_n * 2, junk, cache_n * 2, H2D) == 0);
        free(junk);
    }
    void *dnk = dev_upload(nk, (size_t)T * KVH * DIM * 2);
    void *dnv = dev_upload(nv, (size_t)T * KVH * DIM * 2);
    void *dslots = dev_upload(slots, (size_t)T * 4);
    void *dbt = dev_upload(bt, sizeof bt);

    kvs_kv_layout lay = kvs_kv_layout_dense(DTYPE_BF16, NUM_PAGES, PAGE, KVH, DIM);
    kvs_kv_write_args w;
    memset(&w, 0, sizeof w);
    w.num_tokens = (uint32_t)T;
    w.key = dnk;
    w.value = dnv;
    w.src_dtype = DTYPE_BF16;
    w.key_cache = dk;
    w.value_cache = dv;
    w.cache = lay;
    w.slot_mapping = dslots;
    w.slot_mapping_type = INDEX_INT32;
    long syncs = cnt("calls:aclrtSynchronizeStream", 0);
    CHECK_STATUS(kvs_kv_write(be, &w, stream), ST_OK);
    CHECK(cnt("calls:aclrtSynchronizeStream", 0) == syncs); /* kvshare never syncs */

    /* Two launches on the same stream after the write: decode, then a chunked prefill. */
    ref_k = hk;
    ref_v = hv;
    for (int pass = 0; pass < 2; pass++) attend(be, stream, pass, dk, dv, lay, NULL, ctx, bt, dbt);

    /* int8 caches the engine wrote itself (kvshare's write does not quantize on Ascend): the
     * same tokens' slots hold codes; per-channel scales with four significant bits (exact in
     * bf16, the dtype of FIA's antiquant tensors), offsets in halves, per-tensor scales 0.5 and 2.
     * Decode, then a chunked prefill, through kvs_attention_launch_scaled. */
    {
        int8_t *k8 = malloc(cache_n), *v8 = malloc(cache_n);
        for (size_t i = 0; i < cache_n; i++) {
            k8[i] = (int8_t)((int)(rnd() * 127.0f));
            v8[i] = (int8_t)((int)(rnd() * 127.0f));
        }
        float ks[KVH * DIM], vs[KVH * DIM], ko[KVH * DIM], vo[KVH * DIM];
        for (int i = 0; i < KVH * DIM; i++) {
            rng = rng * 1664525u + 1013904223u;
            ks[i] = (1.0f + (float)((rng >> 8) % 8) / 8.0f) / (float)(1 << (6 + (rng >> 12) % 3));
            vs[i] = (1.0f + (float)((rng >> 16) % 8) / 8.0f) / (float)(1 << (6 + (rng >> 20) % 3));
            ko[i] = (float)((int)((rng >> 4) % 129) - 64) / 2.0f;
            vo[i] = (float)((int)((rng >> 24) % 129) - 64) / 2.0f;
        }
        void *dk8 = dev_upload(k8, cache_n), *dv8 = dev_upload(v8, cache_n);
        kvs_kv_scales sc;
        memset(&sc, 0, sizeof sc);
        sc.k_scale = 0.5f;
        sc.v_scale = 2.0f;
        sc.k_channel_scales = ks;
        sc.v_channel_scales = vs;
        sc.k_channel_offsets = ko;
        sc.v_channel_offsets = vo;
        ref_k8 = k8;
        ref_v8 = v8;
        ref_ks = ks;
        ref_vs = vs;
        ref_ko = ko;
        ref_vo = vo;
        ref_kscale = sc.k_scale;
        ref_vscale = sc.v_scale;
        kvs_kv_layout lay8 = kvs_kv_layout_dense(DTYPE_INT8, NUM_PAGES, PAGE, KVH, DIM);
        for (int pass = 0; pass < 2; pass++) attend(be, stream, pass, dk8, dv8, lay8, &sc, ctx, bt, dbt);
        ref_k8 = ref_v8 = NULL;
        CHECK(dfree(dk8) == 0);
        CHECK(dfree(dv8) == 0);
        free(k8);
        free(v8);
    }

    /* Page size 16 with a prefill: CANN refuses it, so kvshare does before any launch. */
    {
        kvs_attention_args a;
        memset(&a, 0, sizeof a);
        int32_t qsl[2] = {0, 4};
        int c1[1] = {4};
        a.num_seqs = 1;
        a.num_tokens = 4;
        a.num_heads = HEADS;
        a.query = dnk;
        a.query_dtype = DTYPE_BF16;
        a.output = dnv;
        a.output_dtype = DTYPE_BF16;
        a.key_cache = dk;
        a.value_cache = dv;
        a.cache = kvs_kv_layout_dense(DTYPE_BF16, NUM_PAGES * 8, 16, KVH, DIM);
        a.block_table = dbt;
        a.max_pages_per_seq = 1;
        a.context_lens = c1;
        a.query_start_loc = qsl;
        a.scale = 0.1f;
        CHECK_STATUS(kvs_attention_launch(be, &a, stream), ST_UNSUPPORTED);
        CHECK(strstr(kvs_last_error_message(), "page_size 16") != NULL);
    }

    CHECK(cnt("live_tensors", 0) == 0 && cnt("live_executors", 0) == 0);
    CHECK(cnt("live_int_arrays", 0) == 0 && cnt("live_tensor_lists", 0) == 0);
    CHECK(cnt("faults", 0) == 0);
    kvs_backend_free(be); /* after the stream was synchronised */
    CHECK(stream_destroy(stream) == 0);
    void *bufs[] = {dk, dv, dnk, dnv, dslots, dbt};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) CHECK(dfree(bufs[i]) == 0);
    free(hk);
    free(hv);
    free(nk);
    free(nv);
    free(slots);
    CHECK(cnt("live_device_allocs", 0) == 0);
    CHECK(cnt("faults", 0) == 0);
    printf("ascend_backend: ok\n");
    return 0;
}
