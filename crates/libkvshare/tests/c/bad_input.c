/*
 * Bad input at the config, the NULL-cache, the sequence and the batch-builder entry points;
 * bad_input.h says what every call is held to.
 */
#include "bad_input.h"

static char dummy_object;
#define BOGUS_CACHE ((kvs_cache *)(void *)&dummy_object)

static void bad_config(kvs_config cfg, const char *field) {
    kvs_cache *out = BOGUS_CACHE;
    CHECK_STATUS(kvs_cache_new(&cfg, &out), KVS_STATUS_INVALID_CONFIG);
    CHECK(out == BOGUS_CACHE);
    CHECK_MSG(field);
}

static void configs(void) {
    kvs_config cfg = small_config();
    kvs_cache *out = BOGUS_CACHE;
    CHECK_STATUS(kvs_cache_new(NULL, &out), KVS_STATUS_NULL_ARGUMENT);
    CHECK_MSG("config");
    CHECK(out == BOGUS_CACHE);
    CHECK_STATUS(kvs_cache_new(&cfg, NULL), KVS_STATUS_NULL_ARGUMENT);
    CHECK_MSG("cache_out");

    kvs_config b;
    b = small_config(); b.page_size = 0; bad_config(b, "page_size");
    b = small_config(); b.page_size = 1025; bad_config(b, "page_size");
    b = small_config(); b.page_size = UINT32_MAX; bad_config(b, "page_size");
    b = small_config(); b.num_device_pages = 0; b.reserve_null_page = false;
    bad_config(b, "num_device_pages");
    b = small_config(); b.num_device_pages = 1; b.reserve_null_page = true;
    bad_config(b, "num_device_pages");
    b = small_config(); b.num_device_pages = UINT32_MAX; bad_config(b, "num_device_pages");
    b = small_config(); b.num_device_pages = (1u << 30) + 1; bad_config(b, "num_device_pages");
    b = small_config(); b.num_host_pages = UINT32_MAX; bad_config(b, "num_host_pages");
    b = small_config(); b.num_host_pages = (1u << 30) + 1; bad_config(b, "num_host_pages");
    b = small_config(); b.num_layers = 0; bad_config(b, "num_layers");
    b = small_config(); b.num_kv_heads = 0; bad_config(b, "num_kv_heads");
    b = small_config(); b.head_dim = 0; bad_config(b, "head_dim");
    b = small_config(); b.dtype = (uint32_t)KVS_DTYPE_INT8_PER_TOKEN_HEAD + 1; bad_config(b, "dtype");
    b = small_config(); b.dtype = UINT32_MAX; bad_config(b, "dtype");
    b = small_config(); b.defer_commit = true; b.enable_prefix_caching = false;
    bad_config(b, "defer_commit");
    /* Bytes per page overflow uint64 (2 * layers * page * heads * dim * 4). */
    b = small_config(); b.page_size = 1024; b.num_layers = UINT32_MAX;
    b.num_kv_heads = UINT32_MAX; b.head_dim = UINT32_MAX; b.dtype = T_DTYPE_F32;
    {
        kvs_cache *o = BOGUS_CACHE;
        CHECK_STATUS(kvs_cache_new(&b, &o), KVS_STATUS_INVALID_CONFIG);
        CHECK(o == BOGUS_CACHE);
    }

    /* The boundaries themselves are valid. */
    const uint32_t sizes[] = {1, 1024};
    for (size_t i = 0; i < 2; i++) {
        b = small_config();
        b.page_size = sizes[i];
        kvs_cache *ok = NULL;
        CHECK_OK(kvs_cache_new(&b, &ok));
        kvs_cache_free(ok);
    }
    b = small_config(); b.num_device_pages = 2; b.reserve_null_page = true;
    {
        kvs_cache *ok = NULL;
        CHECK_OK(kvs_cache_new(&b, &ok));
        kvs_stats s = t_stats(ok);
        CHECK_EQ(s.device_pages_free, 1);
        kvs_cache_free(ok);
    }
    b = small_config(); b.num_device_pages = 1; b.reserve_null_page = false;
    b.num_host_pages = 0; b.dtype = T_DTYPE_BF16;
    {
        kvs_cache *ok = NULL;
        CHECK_OK(kvs_cache_new(&b, &ok));
        kvs_cache_free(ok);
    }
}

/* The handle-less functions and the read-only ones with a NULL cache. */
static void null_cache(void) {
    kvs_config cfg;
    kvs_stats st;
    kvs_page_info pi;
    kvs_seq_info si;
    uint64_t ids[1] = {1};
    uint32_t q[1] = {1};
    int32_t tok[4] = {1, 2, 3, 4};
    uint32_t pages[4];
    int32_t table[4];
    int64_t slots[4];
    kvs_copy cp[4];
    size_t n1, n2;
    kvs_group_info gi;
    kvs_group_stats gs;
    uint64_t pin;
    uint32_t page;
    SENTINEL(gi);
    SENTINEL(gs);
    SENTINEL(pin);
    SENTINEL(page);
    SENTINEL(cfg);
    SENTINEL(st);
    SENTINEL(pi);
    SENTINEL(si);
    SENTINEL(pages);
    SENTINEL(table);
    SENTINEL(slots);
    SENTINEL(cp);
    SENTINEL(n1);
    SENTINEL(n2);
    EXPECT(kvs_cache_get_config(NULL, &cfg), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_cache_stats(NULL, &st), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_cache_check(NULL), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_cache_commit(NULL), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_cache_block_tables(NULL, 0, ids, 1, 4, 0, table, 4, NULL, 0),
           KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_cache_slot_mapping(NULL, 0, ids, q, 1, slots, 4, &n1), KVS_STATUS_NULL_ARGUMENT,
           "cache");
    EXPECT(kvs_pages_alloc(NULL, 0, 1, pages, 4), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_pages_acquire(NULL, 0, pages, 0), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_pages_release(NULL, 0, pages, 0), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_page_info_fn(NULL, T_TIER_DEVICE, 0, 1, &pi), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_prefix_register(NULL, 0, tok, 4, NULL, 0, NULL, &n1), KVS_STATUS_NULL_ARGUMENT,
           "cache");
    EXPECT(kvs_prefix_match(NULL, 0, tok, 4, NULL, SIZE_MAX, false, pages, 4, &n1, &n2),
           KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_prefix_clear(NULL), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_seq_begin(NULL, 50, tok, 4, NULL, SIZE_MAX, 0, &si), KVS_STATUS_NULL_ARGUMENT,
           "cache");
    EXPECT(kvs_seq_append(NULL, 1, tok, 1, 0, cp, 4, &n1), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_seq_append_pages(NULL, 1, tok, 1, 0, cp, 4, &n1, 0, pages, 4, &n2),
           KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_seq_append_batch(NULL, ids, 1, tok, 1, cp, 4, &n1), KVS_STATUS_NULL_ARGUMENT,
           "cache");
    EXPECT(kvs_seq_fork(NULL, 1, 50), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_seq_free(NULL, 1), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_seq_free_deferred(NULL, 1), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_seq_swap_out(NULL, 1, cp, 4, &n1), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_seq_swap_in(NULL, 2, cp, 4, &n1), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_seq_info_fn(NULL, 1, &si), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_seq_pages(NULL, 0, 1, pages, 4, &n1), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_cache_available(NULL, T_TIER_DEVICE, 0, &n1), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_cache_new_step(NULL), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_cache_group_info(NULL, 0, &gi), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_cache_group_stats(NULL, 0, &gs), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_cache_take_copies(NULL, cp, 4, &n1), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_cache_take_events(NULL, NULL, 0, &n1), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_prefix_find(NULL, tok, 4, NULL, SIZE_MAX, pages, 4, 4, &n1),
           KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_prefix_pin(NULL, tok, 4, NULL, &pin, &n1), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_prefix_unpin(NULL, 1), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_prefix_prefetch(NULL, tok, 4, NULL, &n1), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_seq_release_skipped(NULL, 1, 4, &n1), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_seq_set_computed(NULL, 1, 4), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_seq_state_page(NULL, 1, 0, &page), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_seq_set_priority(NULL, 1, 1), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_seq_append_need(NULL, 1, 1, 0, &n1, &n2), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_seq_swap_in_need(NULL, 2, &n1, &n2), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_seq_swap_out_need(NULL, 1, &n1, &n2), KVS_STATUS_NULL_ARGUMENT, "cache");
    UNTOUCHED(gi);
    UNTOUCHED(gs);
    UNTOUCHED(pin);
    UNTOUCHED(page);
    UNTOUCHED(cfg);
    UNTOUCHED(st);
    UNTOUCHED(pi);
    UNTOUCHED(si);
    UNTOUCHED(pages);
    UNTOUCHED(table);
    UNTOUCHED(slots);
    UNTOUCHED(cp);
    UNTOUCHED(n1);
    UNTOUCHED(n2);
    /* Out-params that are required. */
    EXPECT(kvs_cache_get_config(c, NULL), KVS_STATUS_NULL_ARGUMENT, "config_out");
    EXPECT(kvs_cache_stats(c, NULL), KVS_STATUS_NULL_ARGUMENT, "stats_out");
    EXPECT(kvs_page_info_fn(c, T_TIER_DEVICE, 0, 1, NULL), KVS_STATUS_NULL_ARGUMENT, "info_out");
    EXPECT(kvs_seq_info_fn(c, 1, NULL), KVS_STATUS_NULL_ARGUMENT, "info_out");
    EXPECT(kvs_seq_pages(c, 0, 1, pages, 4, NULL), KVS_STATUS_NULL_ARGUMENT, "num_pages_out");
    EXPECT(kvs_seq_append(c, 1, tok, 1, 0, cp, 4, NULL), KVS_STATUS_NULL_ARGUMENT,
           "num_copies_out");
    EXPECT(kvs_seq_append_batch(c, ids, 1, tok, 1, cp, 4, NULL), KVS_STATUS_NULL_ARGUMENT,
           "num_copies_out");
    EXPECT(kvs_seq_append_pages(c, 1, tok, 1, 0, cp, 4, NULL, 0, pages, 4, &n2),
           KVS_STATUS_NULL_ARGUMENT, "num_copies_out");
    EXPECT(kvs_seq_append_pages(c, 1, tok, 1, 0, cp, 4, &n1, 0, pages, 4, NULL),
           KVS_STATUS_NULL_ARGUMENT, "num_pages_out");
    EXPECT(kvs_seq_swap_out(c, 1, cp, 4, NULL), KVS_STATUS_NULL_ARGUMENT, "num_copies_out");
    EXPECT(kvs_seq_swap_in(c, 2, cp, 4, NULL), KVS_STATUS_NULL_ARGUMENT, "num_copies_out");
}

static void seqs(void) {
    int32_t t[64];
    t_iota(t, 64, 100);
    kvs_seq_info si;
    kvs_copy cp[8];
    uint32_t pg[8];
    size_t n;
    SENTINEL(si);
    SENTINEL(cp);
    SENTINEL(pg);
    SENTINEL(n);
    kvs_extra_keys null_salt = {0, NULL, 1, NULL, 0};

    /* begin */
    EXPECT(kvs_seq_begin(c, 50, NULL, 4, NULL, SIZE_MAX, 0, &si), KVS_STATUS_NULL_ARGUMENT,
           "tokens");
    EXPECT(kvs_seq_begin(c, 50, t, SIZE_MAX, NULL, SIZE_MAX, 0, &si), KVS_STATUS_INVALID_ARGUMENT,
           "tokens");
    EXPECT(kvs_seq_begin(c, 50, t, 4, &null_salt, SIZE_MAX, 0, &si), KVS_STATUS_NULL_ARGUMENT,
           "salt");
    EXPECT(kvs_seq_begin(c, 1, t, 4, NULL, SIZE_MAX, 0, &si), KVS_STATUS_SEQ_EXISTS, "1");
    EXPECT(kvs_seq_begin(c, 2, t, 4, NULL, SIZE_MAX, 0, &si), KVS_STATUS_SEQ_EXISTS, "2");
    EXPECT(kvs_seq_begin(c, 50, t, 64, NULL, SIZE_MAX, 0, &si), KVS_STATUS_NO_SPACE, NULL);
    UNTOUCHED(si);

    /* info / pages */
    EXPECT(kvs_seq_info_fn(c, 50, &si), KVS_STATUS_SEQ_NOT_FOUND, "50");
    EXPECT(kvs_seq_info_fn(c, UINT64_MAX, &si), KVS_STATUS_SEQ_NOT_FOUND, NULL);
    EXPECT(kvs_seq_pages(c, 0, 50, pg, 8, &n), KVS_STATUS_SEQ_NOT_FOUND, NULL);
    EXPECT(kvs_seq_pages(c, 0, 1, NULL, 8, &n), KVS_STATUS_NULL_ARGUMENT, "pages_out");
    EXPECT(kvs_seq_pages(c, 0, 1, pg, 1, &n), KVS_STATUS_BUFFER_TOO_SMALL, "pages_out");
    EXPECT(kvs_seq_pages(c, 0, 1, NULL, 0, &n), KVS_STATUS_BUFFER_TOO_SMALL, "pages_out");
    UNTOUCHED(si);
    UNTOUCHED(pg);
    UNTOUCHED(n);

    /* append */
    EXPECT(kvs_seq_append(c, 1, NULL, 1, 0, cp, 8, &n), KVS_STATUS_NULL_ARGUMENT, "tokens");
    EXPECT(kvs_seq_append(c, 1, t, 1, 0, NULL, 8, &n), KVS_STATUS_NULL_ARGUMENT, "copies_out");
    EXPECT(kvs_seq_append(c, 1, t, SIZE_MAX, 0, cp, 8, &n), KVS_STATUS_INVALID_ARGUMENT,
           "tokens");
    EXPECT(kvs_seq_append(c, 50, t, 1, 0, cp, 8, &n), KVS_STATUS_SEQ_NOT_FOUND, NULL);
    EXPECT(kvs_seq_append(c, UINT64_MAX, t, 1, 0, cp, 8, &n), KVS_STATUS_SEQ_NOT_FOUND, NULL);
    EXPECT(kvs_seq_append(c, 2, t, 1, 0, cp, 8, &n), KVS_STATUS_SEQ_WRONG_TIER, NULL);
    EXPECT(kvs_seq_append(c, 1, t, 64, 0, cp, 8, &n), KVS_STATUS_NO_SPACE, NULL);
    EXPECT(kvs_seq_append(c, 1, t, 1, 1000, cp, 8, &n), KVS_STATUS_NO_SPACE, NULL);
    UNTOUCHED(cp);
    UNTOUCHED(n);

    /* append_batch */
    const uint64_t ids[2] = {1, 50};
    const uint64_t dup[2] = {1, 1};
    const uint64_t swapped[1] = {2};
    EXPECT(kvs_seq_append_batch(c, NULL, 1, t, 1, cp, 8, &n), KVS_STATUS_NULL_ARGUMENT,
           "seq_ids");
    EXPECT(kvs_seq_append_batch(c, ids, 1, NULL, 1, cp, 8, &n), KVS_STATUS_NULL_ARGUMENT,
           "tokens");
    EXPECT(kvs_seq_append_batch(c, ids, 1, t, 2, cp, 8, &n), KVS_STATUS_INVALID_ARGUMENT,
           "tokens");
    EXPECT(kvs_seq_append_batch(c, dup, 2, t, 2, cp, 8, &n), KVS_STATUS_INVALID_ARGUMENT,
           "seq_ids");
    /* Sequence 1 is fine but 50 is unknown: nothing is appended to 1 either. */
    EXPECT(kvs_seq_append_batch(c, ids, 2, t, 2, cp, 8, &n), KVS_STATUS_SEQ_NOT_FOUND, "50");
    EXPECT(kvs_seq_append_batch(c, swapped, 1, t, 1, cp, 8, &n), KVS_STATUS_SEQ_WRONG_TIER,
           NULL);
    EXPECT(kvs_seq_append_batch(c, ids, SIZE_MAX, t, 1, cp, 8, &n),
           KVS_STATUS_INVALID_ARGUMENT, "seq_ids");
    UNTOUCHED(cp);
    UNTOUCHED(n);
    {
        kvs_seq_info before;
        CHECK_OK(kvs_seq_info_fn(c, 1, &before));
        CHECK_EQ(before.num_tokens, 6);
        size_t zero = 99;
        CHECK_OK(kvs_seq_append_batch(c, NULL, 0, NULL, 0, NULL, 0, &zero));
        CHECK_EQ(zero, 0);
    }

    /* fork */
    EXPECT(kvs_seq_fork(c, 50, 51), KVS_STATUS_SEQ_NOT_FOUND, "50");
    EXPECT(kvs_seq_fork(c, 1, 2), KVS_STATUS_SEQ_EXISTS, "2");
    EXPECT(kvs_seq_fork(c, 1, 1), KVS_STATUS_SEQ_EXISTS, NULL);
    EXPECT(kvs_seq_fork(c, 2, 51), KVS_STATUS_SEQ_WRONG_TIER, NULL);
    EXPECT(kvs_seq_fork(c, UINT64_MAX, 0), KVS_STATUS_SEQ_NOT_FOUND, NULL);

    /* Copy-on-write needs room for its copy: with copies_len 0 nothing changes. */
    CHECK_OK(kvs_seq_fork(c, 1, 3));
    EXPECT(kvs_seq_append(c, 3, t, 1, 0, NULL, 0, &n), KVS_STATUS_BUFFER_TOO_SMALL,
           "copies_out");
    {
        const uint64_t pair[2] = {1, 3};
        EXPECT(kvs_seq_append_batch(c, pair, 2, t, 2, cp, 0, &n), KVS_STATUS_BUFFER_TOO_SMALL,
               "copies_out");
    }
    UNTOUCHED(n);
    CHECK_OK(kvs_seq_free(c, 3));

    /* swap out / in */
    EXPECT(kvs_seq_swap_out(c, 50, cp, 8, &n), KVS_STATUS_SEQ_NOT_FOUND, NULL);
    EXPECT(kvs_seq_swap_out(c, 2, cp, 8, &n), KVS_STATUS_SEQ_WRONG_TIER, NULL);
    EXPECT(kvs_seq_swap_out(c, 1, cp, 1, &n), KVS_STATUS_BUFFER_TOO_SMALL, "copies_out");
    EXPECT(kvs_seq_swap_out(c, 1, NULL, 8, &n), KVS_STATUS_NULL_ARGUMENT, "copies_out");
    EXPECT(kvs_seq_swap_in(c, 50, cp, 8, &n), KVS_STATUS_SEQ_NOT_FOUND, NULL);
    EXPECT(kvs_seq_swap_in(c, 1, cp, 8, &n), KVS_STATUS_SEQ_WRONG_TIER, NULL);
    EXPECT(kvs_seq_swap_in(c, 2, cp, 0, &n), KVS_STATUS_BUFFER_TOO_SMALL, "copies_out");
    UNTOUCHED(cp);
    UNTOUCHED(n);
    {
        /* Host tier full: 4 host pages, seq 2 holds 2; a 16-token sequence needs 4. */
        CHECK_OK(kvs_seq_begin(c, 60, t, 16, NULL, SIZE_MAX, 0, NULL));
        EXPECT(kvs_seq_swap_out(c, 60, cp, 8, &n), KVS_STATUS_NO_SPACE, "host");
        UNTOUCHED(n);
        CHECK_OK(kvs_seq_free(c, 60));
        /* Device tier full: swap-in of seq 2 (2 pages) when no page is free or evictable. */
        uint32_t fill[NDEV];
        kvs_stats s = t_stats(c);
        size_t avail = (size_t)(s.device_pages_free + s.device_pages_cached);
        CHECK_OK(kvs_pages_alloc(c, 0, avail, fill, NDEV));
        EXPECT(kvs_seq_swap_in(c, 2, cp, 8, &n), KVS_STATUS_NO_SPACE, "device");
        EXPECT(kvs_seq_begin(c, 61, t, 1, NULL, SIZE_MAX, 0, &si), KVS_STATUS_NO_SPACE, NULL);
        EXPECT(kvs_seq_append(c, 1, t, 3, 0, cp, 8, &n), KVS_STATUS_NO_SPACE, NULL);
        UNTOUCHED(n);
        UNTOUCHED(si);
        CHECK_OK(kvs_pages_release(c, 0, fill, avail));
        CHECK_CACHE(c);
    }
    {
        /* No host tier at all. */
        kvs_config cfg = small_config();
        cfg.num_host_pages = 0;
        kvs_cache *nohost = NULL;
        CHECK_OK(kvs_cache_new(&cfg, &nohost));
        CHECK_OK(kvs_seq_begin(nohost, 1, t, 5, NULL, SIZE_MAX, 0, NULL));
        CHECK_STATUS(kvs_seq_swap_out(nohost, 1, cp, 8, &n), KVS_STATUS_NO_SPACE);
        UNTOUCHED(n);
        CHECK_EQ(t_stats(nohost).num_seqs_swapped, 0);
        CHECK_CACHE(nohost);
        kvs_cache_free(nohost);
    }

    /* Empty prompts and extreme ids are valid. */
    CHECK_OK(kvs_seq_begin(c, UINT64_MAX, NULL, 0, NULL, SIZE_MAX, 0, &si));
    CHECK_EQ(si.num_tokens, 0);
    CHECK_EQ(si.num_pages, 0);
    CHECK_OK(kvs_seq_begin(c, 0, t, 4, NULL, 0, 0, NULL));
    CHECK_CACHE(c);
    CHECK_OK(kvs_seq_append(c, UINT64_MAX, t, 1, 0, NULL, 0, &n));
    CHECK_EQ(n, 0);
    CHECK_OK(kvs_seq_append(c, UINT64_MAX, NULL, 0, 0, NULL, 0, &n)); /* nothing to append */
    CHECK_OK(kvs_seq_free(c, UINT64_MAX));
    CHECK_OK(kvs_seq_free(c, 0));

    /* free: unknown, freed, double */
    EXPECT(kvs_seq_free(c, 50), KVS_STATUS_SEQ_NOT_FOUND, "50");
    EXPECT(kvs_seq_free(c, UINT64_MAX), KVS_STATUS_SEQ_NOT_FOUND, NULL);
    CHECK_OK(kvs_seq_begin(c, 70, t, 5, NULL, SIZE_MAX, 0, NULL));
    CHECK_OK(kvs_seq_free(c, 70));
    EXPECT(kvs_seq_free(c, 70), KVS_STATUS_SEQ_NOT_FOUND, "70");
    EXPECT(kvs_seq_free_deferred(c, 70), KVS_STATUS_SEQ_NOT_FOUND, "70");
    CHECK_OK(kvs_seq_begin(c, 72, t, 5, NULL, SIZE_MAX, 0, NULL));
    CHECK_OK(kvs_seq_free_deferred(c, 72));
    EXPECT(kvs_seq_free_deferred(c, 72), KVS_STATUS_SEQ_NOT_FOUND, "72");
    CHECK_CACHE(c);
    EXPECT(kvs_seq_append(c, 70, t, 1, 0, cp, 8, &n), KVS_STATUS_SEQ_NOT_FOUND, NULL);
    EXPECT(kvs_seq_info_fn(c, 70, &si), KVS_STATUS_SEQ_NOT_FOUND, NULL);
    EXPECT(kvs_seq_fork(c, 70, 71), KVS_STATUS_SEQ_NOT_FOUND, NULL);
    EXPECT(kvs_seq_swap_out(c, 70, cp, 8, &n), KVS_STATUS_SEQ_NOT_FOUND, NULL);
}

static void batch_builders(void) {
    int32_t table[16];
    int32_t lens[4];
    int64_t slots[16];
    size_t n;
    SENTINEL(table);
    SENTINEL(lens);
    SENTINEL(slots);
    SENTINEL(n);
    const uint64_t one[1] = {1};
    const uint64_t unknown[2] = {1, 50};
    const uint64_t swapped[1] = {2};
    const uint32_t q1[2] = {1, 1};
    const uint32_t qbig[1] = {7};
    const uint32_t qmax[1] = {UINT32_MAX};

    /* block tables; seq 1 has 6 tokens in 2 pages */
    EXPECT(kvs_cache_block_tables(c, 0, NULL, 1, 4, 0, table, 16, lens, 4),
           KVS_STATUS_NULL_ARGUMENT, "seq_ids");
    EXPECT(kvs_cache_block_tables(c, 0, one, 1, 4, 0, NULL, 16, lens, 4),
           KVS_STATUS_NULL_ARGUMENT, "table_out");
    EXPECT(kvs_cache_block_tables(c, 0, one, 1, 4, 0, table, 16, NULL, 4),
           KVS_STATUS_NULL_ARGUMENT, "context_lens_out");
    EXPECT(kvs_cache_block_tables(c, 0, one, 1, 4, 0, table, 3, lens, 4),
           KVS_STATUS_BUFFER_TOO_SMALL, "table_out");
    EXPECT(kvs_cache_block_tables(c, 0, unknown, 2, 4, 0, table, 16, lens, 1),
           KVS_STATUS_BUFFER_TOO_SMALL, "context_lens_out");
    EXPECT(kvs_cache_block_tables(c, 0, one, 1, 1, 0, table, 16, lens, 4),
           KVS_STATUS_INVALID_ARGUMENT, "max_pages_per_seq");
    EXPECT(kvs_cache_block_tables(c, 0, unknown, 2, SIZE_MAX, 0, table, 16, lens, 4),
           KVS_STATUS_INVALID_ARGUMENT, "max_pages_per_seq");
    EXPECT(kvs_cache_block_tables(c, 0, one, 1, SIZE_MAX, 0, table, 16, lens, 4),
           KVS_STATUS_BUFFER_TOO_SMALL, "table_out");
    EXPECT(kvs_cache_block_tables(c, 0, unknown, 2, 4, 0, table, 16, lens, 4),
           KVS_STATUS_SEQ_NOT_FOUND, "50");
    EXPECT(kvs_cache_block_tables(c, 0, swapped, 1, 4, 0, table, 16, lens, 4),
           KVS_STATUS_SEQ_WRONG_TIER, NULL);
    EXPECT(kvs_cache_block_tables(c, 0, one, SIZE_MAX, 4, 0, table, 16, lens, 4),
           KVS_STATUS_INVALID_ARGUMENT, "seq_ids");
    EXPECT(kvs_cache_block_tables(c, 0, one, 1, 4, 0, table, SIZE_MAX, lens, 4),
           KVS_STATUS_INVALID_ARGUMENT, "table_out");
    UNTOUCHED(table);
    UNTOUCHED(lens);
    /* An empty batch is fine and writes nothing. */
    CHECK_OK(kvs_cache_block_tables(c, 0, NULL, 0, 4, 0, table, 16, lens, 4));
    CHECK_OK(kvs_cache_block_tables(c, 0, NULL, 0, SIZE_MAX, 0, NULL, 0, NULL, 0));
    UNTOUCHED(table);
    UNTOUCHED(lens);

    /* slot mapping */
    EXPECT(kvs_cache_slot_mapping(c, 0, NULL, q1, 1, slots, 16, &n), KVS_STATUS_NULL_ARGUMENT,
           "seq_ids");
    EXPECT(kvs_cache_slot_mapping(c, 0, one, NULL, 1, slots, 16, &n), KVS_STATUS_NULL_ARGUMENT,
           "query_lens");
    EXPECT(kvs_cache_slot_mapping(c, 0, one, q1, 1, NULL, 16, &n), KVS_STATUS_NULL_ARGUMENT,
           "slots_out");
    EXPECT(kvs_cache_slot_mapping(c, 0, one, qbig, 1, slots, 16, &n),
           KVS_STATUS_INVALID_ARGUMENT, "query_lens");
    EXPECT(kvs_cache_slot_mapping(c, 0, one, qmax, 1, slots, 16, &n),
           KVS_STATUS_INVALID_ARGUMENT, "query_lens");
    EXPECT(kvs_cache_slot_mapping(c, 0, unknown, q1, 2, slots, 16, &n), KVS_STATUS_SEQ_NOT_FOUND,
           "50");
    EXPECT(kvs_cache_slot_mapping(c, 0, swapped, q1, 1, slots, 16, &n),
           KVS_STATUS_SEQ_WRONG_TIER, NULL);
    {
        const uint32_t q6[1] = {6};
        EXPECT(kvs_cache_slot_mapping(c, 0, one, q6, 1, slots, 5, &n),
               KVS_STATUS_BUFFER_TOO_SMALL, "slots_out");
    }
    EXPECT(kvs_cache_slot_mapping(c, 0, one, q1, SIZE_MAX, slots, 16, &n),
           KVS_STATUS_INVALID_ARGUMENT, "seq_ids");
    UNTOUCHED(slots);
    UNTOUCHED(n);
    CHECK_OK(kvs_cache_slot_mapping(c, 0, NULL, NULL, 0, NULL, 0, &n));
    CHECK_EQ(n, 0);
    /* A zero query length is allowed (a sequence with nothing to write this step). */
    const uint32_t q0[1] = {0};
    int64_t pad[2] = {5, 5};
    CHECK_OK(kvs_cache_slot_mapping(c, 0, one, q0, 1, pad, 2, &n));
    CHECK_EQ(n, 0);
    CHECK_EQ(pad[0], (uint64_t)(int64_t)-1);
    CHECK_EQ(pad[1], (uint64_t)(int64_t)-1);
}

int main(void) {
    configs();
    fixture();
    null_cache();
    seqs();
    batch_builders();
    fixture_intact_then_free();
    printf("bad_input: ok\n");
    return 0;
}
