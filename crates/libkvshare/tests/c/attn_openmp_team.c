/*
 * kvs_backend_new_cpu_team on a real OpenMP runtime (built with -fopenmp: libgomp, the runtime
 * PyTorch's Linux wheels run their CPU ops on).
 *
 *   1. libgomp's GOMP_parallel passed as is (the header says its signature is
 *      kvs_cpu_parallel_fn): a decode launch with a sequence long enough to be split across
 *      threads gives the same bits as the own pool of as many threads;
 *   2. through a wrapper that records which OpenMP threads called kvshare's work: every thread
 *      of the team did (so the work ran on the host's team, not on threads of kvshare's);
 *   3. launches from two threads of an OpenMP parallel region at once, on one backend (nested:
 *      libgomp gives each inner region one thread unless nesting is on) compute everything;
 *   4. describe names the team; bad teams are refused.
 */
#include <math.h>
#include <omp.h>

#include "kvs_test.h"

/* libgomp's entry point for `#pragma omp parallel` (not declared by omp.h). */
extern void GOMP_parallel(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags);

enum { THREADS = 4, SEQS = 3, HEADS = 8, KV_HEADS = 2, DIM = 64, PAGE = 16, MAX_PAGES = 200 };
static const int32_t LENS[SEQS] = {3000, 7, 130};

static int seen[64];
static kvs_cpu_work_fn inner_work;

static void recording_work(void *arg) {
    int t = omp_get_thread_num();
    if (t >= 0 && t < 64) __atomic_store_n(&seen[t], 1, __ATOMIC_RELAXED);
    inner_work(arg);
}

/* A kvs_cpu_parallel_fn: GOMP_parallel with kvshare's work wrapped to record the threads. */
static void recording_parallel(kvs_cpu_work_fn work, void *arg, unsigned n, unsigned flags) {
    inner_work = work;
    GOMP_parallel(recording_work, arg, n, flags);
}

static float *query, *key_cache, *value_cache;
static int32_t table[SEQS * MAX_PAGES];

static void launch(kvs_backend *be, float *out) {
    kvs_attention_args a;
    memset(&a, 0, sizeof a);
    a.num_seqs = SEQS;
    a.num_tokens = SEQS;
    a.num_heads = HEADS;
    a.query = query;
    a.query_dtype = KVS_DTYPE_F32;
    a.output = out;
    a.output_dtype = KVS_DTYPE_F32;
    a.key_cache = key_cache;
    a.value_cache = value_cache;
    a.cache = kvs_kv_layout_dense(KVS_DTYPE_F32, SEQS * MAX_PAGES, PAGE, KV_HEADS, DIM);
    a.block_table = table;
    a.max_pages_per_seq = MAX_PAGES;
    a.context_lens = LENS;
    a.scale = 0.125f;
    memset(out, 0, sizeof(float) * SEQS * HEADS * DIM);
    CHECK_OK(kvs_attention_launch(be, &a, NULL));
}

static kvs_backend *team_backend(kvs_cpu_parallel_fn parallel, uint32_t threads) {
    kvs_cpu_team team = {parallel, threads};
    kvs_backend *be = NULL;
    CHECK_OK(kvs_backend_new_cpu_team(&team, &be));
    CHECK(be != NULL);
    return be;
}

int main(void) {
    size_t cache_elems = (size_t)SEQS * MAX_PAGES * PAGE * KV_HEADS * DIM;
    query = malloc(sizeof(float) * SEQS * HEADS * DIM);
    key_cache = malloc(sizeof(float) * cache_elems);
    value_cache = malloc(sizeof(float) * cache_elems);
    CHECK(query && key_cache && value_cache);
    uint32_t x = 12345;
    for (size_t i = 0; i < cache_elems; i++) {
        x = x * 1664525u + 1013904223u;
        key_cache[i] = (float)(x >> 8) / 16777216.0f - 0.5f;
        x = x * 1664525u + 1013904223u;
        value_cache[i] = (float)(x >> 8) / 16777216.0f - 0.5f;
    }
    for (size_t i = 0; i < SEQS * HEADS * DIM; i++) query[i] = sinf((float)i * 0.37f);
    /* Pages in reverse order: sequence s uses pages from the end of the cache. */
    for (int s = 0; s < SEQS; s++)
        for (int p = 0; p < MAX_PAGES; p++) table[s * MAX_PAGES + p] = SEQS * MAX_PAGES - 1 - (s * MAX_PAGES + p);

    static float want[SEQS * HEADS * DIM], got[SEQS * HEADS * DIM];
    kvs_backend_options opts = {0};
    opts.num_threads = THREADS;
    kvs_backend *pool = NULL;
    CHECK_OK(kvs_backend_new(KVS_BACKEND_KIND_CPU, &opts, &pool));
    launch(pool, want);
    double sum = 0;
    for (size_t i = 0; i < SEQS * HEADS * DIM; i++) sum += fabs(want[i]);
    CHECK(sum > 0);

    /* 1. GOMP_parallel as is. */
    kvs_backend *omp = team_backend(GOMP_parallel, THREADS);
    launch(omp, got);
    CHECK(memcmp(want, got, sizeof want) == 0);
    char text[512];
    size_t len = 0;
    CHECK_OK(kvs_backend_describe(omp, text, sizeof text, &len));
    CHECK(strstr(text, "4 threads (the host's team") != NULL);
    uint32_t n = 0;
    CHECK_OK(kvs_backend_num_threads(omp, &n));
    CHECK_EQ(n, THREADS);

    /* 2. Every thread of the team ran kvshare's work. */
    kvs_backend *rec = team_backend(recording_parallel, THREADS);
    launch(rec, got);
    CHECK(memcmp(want, got, sizeof want) == 0);
    for (int t = 0; t < THREADS; t++) CHECK(seen[t] == 1);

    /* 3. Launched from inside a parallel region: the inner region is the caller alone. */
    int ok = 1;
#pragma omp parallel num_threads(2) reduction(& : ok)
    {
        static float inner[2][SEQS * HEADS * DIM];
        int t = omp_get_thread_num();
        launch(omp, inner[t]); /* both threads at once, on one backend */
        ok = memcmp(want, inner[t], sizeof want) == 0;
    }
    CHECK(ok);

    /* 4. Bad teams. */
    kvs_backend *bad = NULL;
    kvs_cpu_team none = {NULL, 2};
    CHECK_FAILS(kvs_backend_new_cpu_team(&none, &bad), KVS_STATUS_NULL_ARGUMENT, "team.parallel");
    kvs_cpu_team many = {GOMP_parallel, 5000};
    CHECK_FAILS(kvs_backend_new_cpu_team(&many, &bad), KVS_STATUS_INVALID_ARGUMENT, "num_threads");
    CHECK_FAILS(kvs_backend_new_cpu_team(NULL, &bad), KVS_STATUS_NULL_ARGUMENT, "team");
    CHECK(bad == NULL);

    kvs_backend_free(rec);
    kvs_backend_free(omp);
    kvs_backend_free(pool);
    free(query);
    free(key_cache);
    free(value_cache);
    printf("attn_openmp_team: ok\n");
    return 0;
}
