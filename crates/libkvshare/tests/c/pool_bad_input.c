/*
 * The pool tier's entry points: a round (lookup, begin with the store's answer, loads taken
 * and reported, stores handed out at commit), then bad input at each of them. Every refused
 * call returns its documented status, leaves its out-params untouched, and changes neither
 * the cache's stats nor the pool tier's counters.
 */
#include "bad_input.h"

static kvs_pool_stats t_pool_stats(const kvs_cache *cache) {
    kvs_pool_stats s;
    CHECK_OK(kvs_cache_pool_stats(cache, &s));
    return s;
}

/* EXPECT, and the pool tier's counters unchanged too. */
#define EXPECT_POOL(call, status, needle)                                              \
    do {                                                                               \
        kvs_pool_stats pb_ = t_pool_stats(c);                                          \
        EXPECT(call, status, needle);                                                  \
        kvs_pool_stats pa_ = t_pool_stats(c);                                          \
        CHECK(memcmp(&pa_, &pb_, sizeof pa_) == 0);                                    \
    } while (0)

static const char NS[] = "test";
static const char ID[] = "tiny-model/f32/dense";

static kvs_pool_config pool_config(void) {
    kvs_pool_config p;
    memset(&p, 0, sizeof p);
    p.key_namespace = (const uint8_t *)NS;
    p.key_namespace_len = strlen(NS);
    p.identity = (const uint8_t *)ID;
    p.identity_len = strlen(ID);
    p.tp_size = p.pp_size = p.pcp_size = p.dcp_size = 1;
    p.store = KVS_POOL_STORE_WRITE_THROUGH;
    return p;
}

static void creation(void) {
    kvs_config cfg = small_config();
    kvs_pool_config p = pool_config();
    kvs_cache *out;
    SENTINEL(out);
    CHECK_FAILS(kvs_cache_new_pooled(NULL, &p, &out), KVS_STATUS_NULL_ARGUMENT, "config");
    CHECK_FAILS(kvs_cache_new_pooled(&cfg, NULL, &out), KVS_STATUS_NULL_ARGUMENT, "pool");
    CHECK_FAILS(kvs_cache_new_pooled(&cfg, &p, NULL), KVS_STATUS_NULL_ARGUMENT, "cache_out");
    kvs_pool_config bad = p;
    bad.key_namespace = (const uint8_t *)"a/b";
    bad.key_namespace_len = 3;
    CHECK_FAILS(kvs_cache_new_pooled(&cfg, &bad, &out), KVS_STATUS_INVALID_CONFIG, "pool");
    bad = p;
    bad.key_namespace_len = 0;
    CHECK_FAILS(kvs_cache_new_pooled(&cfg, &bad, &out), KVS_STATUS_INVALID_CONFIG, "pool");
    bad = p;
    bad.identity = NULL;
    CHECK_FAILS(kvs_cache_new_pooled(&cfg, &bad, &out), KVS_STATUS_NULL_ARGUMENT,
                "pool.identity");
    bad = p;
    bad.tp_rank = 2;
    bad.tp_size = 2;
    CHECK_FAILS(kvs_cache_new_pooled(&cfg, &bad, &out), KVS_STATUS_INVALID_CONFIG, "tp");
    bad = p;
    bad.dcp_size = 0;
    CHECK_FAILS(kvs_cache_new_pooled(&cfg, &bad, &out), KVS_STATUS_INVALID_CONFIG, "dcp");
    bad = p;
    bad.store = 3;
    CHECK_FAILS(kvs_cache_new_pooled(&cfg, &bad, &out), KVS_STATUS_INVALID_ARGUMENT,
                "pool.store");
    bad = p;
    bad.store = KVS_POOL_STORE_ON_DEMOTION;
    kvs_config no_host = cfg;
    no_host.num_host_pages = 0;
    CHECK_FAILS(kvs_cache_new_pooled(&no_host, &bad, &out), KVS_STATUS_INVALID_CONFIG,
                "demotion");
    kvs_config no_caching = cfg;
    no_caching.enable_prefix_caching = false;
    CHECK_FAILS(kvs_cache_new_pooled(&no_caching, &p, &out), KVS_STATUS_INVALID_CONFIG,
                "prefix_caching");
    UNTOUCHED(out);
}

/* A cache without a pool tier refuses every pool call. */
static void without_pool(void) {
    kvs_config cfg = small_config();
    CHECK_OK(kvs_cache_new(&cfg, &c));
    int32_t t[9];
    t_iota(t, 9, 0);
    kvs_pool_key keys[4];
    size_t n, first;
    SENTINEL(n);
    EXPECT(kvs_pool_lookup(c, t, 9, NULL, 8, keys, 4, &n, &first), KVS_STATUS_UNSUPPORTED,
           "pool tier");
    const uint8_t hits[] = {1, 1};
    EXPECT(kvs_seq_begin_pooled(c, 1, t, 9, NULL, 8, 0, 0, hits, 2, NULL, NULL),
           KVS_STATUS_UNSUPPORTED, "pool tier");
    kvs_pool_work w[2];
    int32_t toks[2 * PS];
    EXPECT(kvs_pool_take_work(c, w, 2, toks, 2 * PS, &n), KVS_STATUS_UNSUPPORTED, "pool tier");
    EXPECT(kvs_pool_done(c, 1, true), KVS_STATUS_UNSUPPORTED, "pool tier");
    kvs_pool_stats st;
    SENTINEL(st);
    EXPECT(kvs_cache_pool_stats(c, &st), KVS_STATUS_UNSUPPORTED, "pool tier");
    UNTOUCHED(st);
    UNTOUCHED(n);
    kvs_cache_free(c);
}

int main(void) {
    creation();
    without_pool();

    kvs_config cfg = small_config();
    kvs_pool_config p = pool_config();
    CHECK_OK(kvs_cache_new_pooled(&cfg, &p, &c));
    int32_t t[13];
    t_iota(t, 13, 100);

    /* lookup: 3 full pages within 12 tokens, none local */
    kvs_pool_key keys[4];
    size_t n = 0, first = 99;
    SENTINEL(keys);
    EXPECT_POOL(kvs_pool_lookup(c, NULL, 13, NULL, 12, keys, 4, &n, &first),
                KVS_STATUS_NULL_ARGUMENT, "tokens");
    EXPECT_POOL(kvs_pool_lookup(c, t, 13, NULL, 12, NULL, 4, &n, &first),
                KVS_STATUS_NULL_ARGUMENT, "keys_out");
    EXPECT_POOL(kvs_pool_lookup(c, t, 13, NULL, 12, keys, 2, &n, &first),
                KVS_STATUS_BUFFER_TOO_SMALL, "keys_out");
    EXPECT_POOL(kvs_pool_lookup(c, t, 13, NULL, 12, keys, SIZE_MAX, &n, &first),
                KVS_STATUS_INVALID_ARGUMENT, "keys_out");
    EXPECT_POOL(kvs_pool_lookup(c, t, 13, NULL, 12, keys, 4, NULL, &first),
                KVS_STATUS_NULL_ARGUMENT, "num_keys_out");
    EXPECT_POOL(kvs_pool_lookup(c, t, 13, NULL, 12, keys, 4, &n, NULL),
                KVS_STATUS_NULL_ARGUMENT, "first_page_out");
    UNTOUCHED(keys);
    CHECK_EQ(n, 0);
    CHECK_OK(kvs_pool_lookup(c, t, 13, NULL, 12, keys, 4, &n, &first));
    CHECK_EQ(n, 3);
    CHECK_EQ(first, 0);
    for (size_t i = 0; i < n; i++) {
        CHECK_EQ(keys[i].position, i);
        CHECK_EQ(keys[i].group, 0);
        CHECK_EQ(keys[i].key_len, strlen((const char *)keys[i].key));
        CHECK(strncmp((const char *)keys[i].key, "kvs1/test/", 10) == 0);
        CHECK(strstr((const char *)keys[i].key, "/0-0-0-0/g0/") != NULL);
    }
    CHECK(strcmp((const char *)keys[0].key, (const char *)keys[1].key) != 0);
    CHECK_EQ(t_pool_stats(c).lookups, 1);

    /* begin with the answer: pages 0 and 1 in the store */
    const uint8_t bad_hits[] = {1, 2, 0};
    const uint8_t hits[] = {1, 1, 0};
    kvs_seq_info info;
    size_t loading = 7;
    SENTINEL(info);
    EXPECT_POOL(kvs_seq_begin_pooled(c, 1, t, 13, NULL, 12, 0, 0, bad_hits, 3, &info, &loading),
                KVS_STATUS_INVALID_ARGUMENT, "hits");
    EXPECT_POOL(kvs_seq_begin_pooled(c, 1, t, 13, NULL, 12, 0, 0, NULL, 3, &info, &loading),
                KVS_STATUS_NULL_ARGUMENT, "hits");
    EXPECT_POOL(kvs_seq_begin_pooled(c, 1, NULL, 13, NULL, 12, 0, 0, hits, 3, &info, &loading),
                KVS_STATUS_NULL_ARGUMENT, "tokens");
    UNTOUCHED(info);
    CHECK_EQ(loading, 7);
    CHECK_OK(kvs_seq_begin_pooled(c, 1, t, 13, NULL, 12, 0, 0, hits, 3, &info, &loading));
    CHECK_EQ(info.matched_tokens, 8);
    CHECK_EQ(loading, 2);
    EXPECT_POOL(kvs_seq_begin_pooled(c, 1, t, 13, NULL, 12, 0, 0, hits, 3, &info, NULL),
                KVS_STATUS_SEQ_EXISTS, NULL);
    size_t outstanding;
    CHECK_OK(kvs_seq_pool_loading(c, 1, &outstanding));
    CHECK_EQ(outstanding, 2);
    SENTINEL(outstanding);
    EXPECT_POOL(kvs_seq_pool_loading(c, 99, &outstanding), KVS_STATUS_SEQ_NOT_FOUND, NULL);
    EXPECT_POOL(kvs_seq_pool_loading(c, 1, NULL), KVS_STATUS_NULL_ARGUMENT, "loading_out");
    UNTOUCHED(outstanding);

    /* take the loads: the tokens buffer must hold a page per item asked for */
    kvs_pool_work w[4];
    int32_t toks[4 * PS];
    size_t nw = 5;
    SENTINEL(w);
    EXPECT_POOL(kvs_pool_take_work(c, w, 4, toks, 4 * PS - 1, &nw), KVS_STATUS_BUFFER_TOO_SMALL,
                "tokens_out");
    EXPECT_POOL(kvs_pool_take_work(c, NULL, 4, toks, 4 * PS, &nw), KVS_STATUS_NULL_ARGUMENT,
                "work_out");
    EXPECT_POOL(kvs_pool_take_work(c, w, 4, toks, 4 * PS, NULL), KVS_STATUS_NULL_ARGUMENT,
                "num_work_out");
    UNTOUCHED(w);
    CHECK_EQ(nw, 5);
    /* a ticket still queued is not reported */
    EXPECT_POOL(kvs_pool_done(c, 1, true), KVS_STATUS_INVALID_ARGUMENT, "ticket");
    CHECK_OK(kvs_pool_take_work(c, w, 4, toks, 4 * PS, &nw));
    CHECK_EQ(nw, 2);
    for (size_t i = 0; i < nw; i++) {
        CHECK_EQ(w[i].op, KVS_POOL_OP_LOAD);
        CHECK_EQ(w[i].tier, KVS_TIER_DEVICE);
        CHECK_EQ(w[i].num_tokens, PS);
        CHECK(strcmp((const char *)w[i].key, (const char *)keys[i].key) == 0);
        for (size_t k = 0; k < PS; k++) {
            CHECK_EQ(toks[i * PS + k], t[i * PS + k]);
        }
    }
    EXPECT_POOL(kvs_pool_done(c, 999, true), KVS_STATUS_INVALID_ARGUMENT, "ticket");
    EXPECT_POOL(kvs_pool_done(c, UINT64_MAX, false), KVS_STATUS_INVALID_ARGUMENT, "ticket");
    EXPECT_POOL(kvs_pool_done(NULL, w[0].ticket, true), KVS_STATUS_NULL_ARGUMENT, NULL);
    CHECK_OK(kvs_pool_done(c, w[0].ticket, true));
    EXPECT_POOL(kvs_pool_done(c, w[0].ticket, true), KVS_STATUS_INVALID_ARGUMENT, "ticket");
    CHECK_OK(kvs_pool_done(c, w[1].ticket, false)); /* the second load fails */
    CHECK_OK(kvs_seq_pool_loading(c, 1, &outstanding));
    CHECK_EQ(outstanding, 0);
    kvs_seq_info now;
    CHECK_OK(kvs_seq_info_fn(c, 1, &now));
    CHECK_EQ(now.matched_tokens, PS);
    CHECK_CACHE(c);

    /* commit hands out the stores of the pages the sequence computes */
    CHECK_OK(kvs_cache_commit(c));
    CHECK_OK(kvs_pool_take_work(c, w, 4, toks, 4 * PS, &nw));
    CHECK_EQ(nw, 2);
    for (size_t i = 0; i < nw; i++) {
        CHECK_EQ(w[i].op, KVS_POOL_OP_STORE);
        CHECK_OK(kvs_pool_done(c, w[i].ticket, true));
    }
    kvs_pool_stats ps = t_pool_stats(c);
    CHECK_EQ(ps.loads_ok, 1);
    CHECK_EQ(ps.loads_failed, 1);
    CHECK_EQ(ps.hit_tokens, PS);
    CHECK_EQ(ps.stores_ok, 2);
    CHECK_EQ(ps.pending, 0);
    kvs_pool_stats st;
    SENTINEL(st);
    CHECK_FAILS(kvs_cache_pool_stats(c, NULL), KVS_STATUS_NULL_ARGUMENT, "stats_out");
    CHECK_FAILS(kvs_cache_pool_stats(NULL, &st), KVS_STATUS_NULL_ARGUMENT, NULL);
    UNTOUCHED(st);
    CHECK_OK(kvs_seq_free(c, 1));
    CHECK_CACHE(c);
    kvs_cache_free(c);
    printf("pool_bad_input: ok\n");
    return 0;
}
