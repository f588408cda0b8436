/*
 * A cache of KV-cache groups from C: config validation of the groups (every bad field named,
 * out-param untouched), a sliding-window + full-attention flow (the cross-group hit of
 * kvs_prefix_find, null pages after the window moved, per-group block tables and slot
 * mappings, group stats, events with their group), a KV connector's tokens past the hit
 * (kvs_seq_begin_computed), and bad input at the group arguments
 * (unknown group and sequence, short buffers) leaving out-params untouched and the cache
 * consistent.
 */
#include "kvs_test.h"

#define PS 4u
#define SENT 0xA5A5A5A5u

static kvs_config cfg_of(const kvs_group *g, size_t n) {
    kvs_config c = t_groups_config(PS, 32, g, n);
    c.enable_events = true;
    return c;
}

static void bad_config(kvs_config c, uint32_t status, const char *field) {
    kvs_cache *h = (kvs_cache *)(uintptr_t)0x1;
    CHECK_FAILS(kvs_cache_new(&c, &h), status, field);
    CHECK(h == (kvs_cache *)(uintptr_t)0x1);
}

/* A KV connector's tokens after the hit (kvs_seq_begin_computed): the window takes the null
 * page where it no longer reads at the computed count, so a pool of 13 free pages admits a
 * sequence of 40 slots whose first 36 tokens are computed (window 8: 3 pages, full: 10) that
 * kvs_seq_begin (20 pages) refuses. */
static void external_tokens(const kvs_group *g) {
    kvs_config c = cfg_of(g, 2);
    c.num_device_pages = 14; /* the null page and 13 */
    kvs_cache *h = NULL;
    CHECK_OK(kvs_cache_new(&c, &h));
    int32_t toks[4];
    t_iota(toks, 4, 500);
    kvs_seq_info si;
    CHECK_FAILS(kvs_seq_begin(h, 1, toks, 4, NULL, 0, 36, &si), KVS_STATUS_NO_SPACE, NULL);
    CHECK_OK(kvs_seq_begin_computed(h, 1, toks, 4, NULL, 0, 36, 36, &si));
    CHECK_EQ(si.new_pages, 13);
    CHECK_EQ(si.num_pages, 10);
    uint32_t pages[10];
    CHECK_EQ(t_pages(h, 0, 1, pages, 10), 10);
    for (size_t j = 0; j < 10; j++) {
        CHECK((pages[j] == KVS_NULL_PAGE) == (j < 7));
    }
    CHECK_EQ(t_pages(h, 1, 1, pages, 10), 10);
    for (size_t j = 0; j < 10; j++) {
        CHECK(pages[j] != KVS_NULL_PAGE);
    }
    CHECK_CACHE(h);
    /* Past the prompt and its slots is refused; 0 is kvs_seq_begin. */
    CHECK_FAILS(kvs_seq_begin_computed(h, 2, toks, 4, NULL, 0, 0, 5, &si),
                KVS_STATUS_INVALID_ARGUMENT, "computed_tokens");
    CHECK_OK(kvs_seq_free(h, 1));
    CHECK_OK(kvs_seq_begin_computed(h, 2, toks, 4, NULL, 0, 0, 0, &si));
    CHECK_EQ(si.new_pages, 2);
    CHECK_OK(kvs_seq_free(h, 2));
    CHECK_CACHE(h);
    kvs_cache_free(h);
}

/* Sparse window retention (vLLM 0.32's default): a window of 8 tokens over pages of 4 needs the
 * 2 pages before a hit's end. Without boundaries the window group registers none of a
 * 24-token sequence's 6 full pages (the full group all 6); the boundary at the last token (23)
 * registers pages 3 and 4 at once; one at token 13 adds pages 1 and 2. A second sequence with
 * the same tokens hits 20 of them in both groups. The config reads back. */
static void sparse_retention(const kvs_group *g) {
    kvs_config c = cfg_of(g, 2);
    c.window_retention = KVS_WINDOW_RETENTION_BOUNDARIES;
    kvs_cache *h = NULL;
    CHECK_OK(kvs_cache_new(&c, &h));
    kvs_config got;
    CHECK_OK(kvs_cache_get_config(h, &got));
    CHECK_EQ(got.window_retention, KVS_WINDOW_RETENTION_BOUNDARIES);
    int32_t toks[24];
    t_iota(toks, 24, 900);
    kvs_seq_info si;
    CHECK_OK(kvs_seq_begin(h, 1, toks, 24, NULL, 0, 0, &si));
    CHECK_EQ(t_group_stats(h, 0).pages_registered, 0);
    CHECK_EQ(t_group_stats(h, 1).pages_registered, 6);
    size_t last = 23;
    CHECK_OK(kvs_seq_set_retention(h, 1, &last, 1));
    CHECK_EQ(t_group_stats(h, 0).pages_registered, 2);
    size_t both[2] = {23, 13};
    CHECK_OK(kvs_seq_set_retention(h, 1, both, 2));
    CHECK_EQ(t_group_stats(h, 0).pages_registered, 4);
    uint32_t pages[6];
    CHECK_EQ(t_pages(h, 0, 1, pages, 6), 6);
    for (size_t j = 0; j < 6; j++) {
        kvs_page_info pi;
        CHECK_OK(kvs_page_get_info(h, KVS_TIER_DEVICE, 0, pages[j], &pi));
        CHECK(pi.registered == (j >= 1 && j <= 4));
    }
    CHECK_OK(kvs_seq_begin(h, 2, toks, 24, NULL, 23, 0, &si));
    CHECK_EQ(si.matched_tokens, 20);
    CHECK_OK(kvs_seq_free(h, 1));
    CHECK_OK(kvs_seq_free(h, 2));
    CHECK_CACHE(h);
    kvs_cache_free(h);
}

int main(void) {
    kvs_group g[2] = {
        {KVS_GROUP_KIND_SLIDING_WINDOW, 8, 4096, 0},
        {KVS_GROUP_KIND_FULL, 0, 4096, 0},
    };
    kvs_group many[KVS_MAX_GROUPS + 1];
    for (size_t i = 0; i < KVS_MAX_GROUPS + 1; i++) {
        many[i] = g[1];
    }
    kvs_cache *h = NULL;

    /* Config validation. */
    CHECK_FAILS(kvs_cache_new(NULL, &h), KVS_STATUS_NULL_ARGUMENT, "config");
    kvs_config c = cfg_of(g, 2);
    CHECK_FAILS(kvs_cache_new(&c, NULL), KVS_STATUS_NULL_ARGUMENT, "cache_out");
    bad_config(cfg_of(many, KVS_MAX_GROUPS + 1), KVS_STATUS_INVALID_CONFIG, "num_groups");
    bad_config(cfg_of(NULL, 2), KVS_STATUS_NULL_ARGUMENT, "config.groups");
    kvs_group bad[1];
    bad[0] = (kvs_group){7, 0, 1, 0};
    bad_config(cfg_of(bad, 1), KVS_STATUS_INVALID_CONFIG, "groups.kind");
    bad[0] = (kvs_group){KVS_GROUP_KIND_STATE, 9, 1, 0}; /* 9 is no kvs_state_mode */
    bad_config(cfg_of(bad, 1), KVS_STATUS_INVALID_CONFIG, "groups.window");
    bad[0] = (kvs_group){KVS_GROUP_KIND_SLIDING_WINDOW, 0, 1, 0};
    bad_config(cfg_of(bad, 1), KVS_STATUS_INVALID_CONFIG, "groups.window");
    bad[0] = (kvs_group){KVS_GROUP_KIND_CHUNKED_LOCAL, 0, 1, 0};
    bad_config(cfg_of(bad, 1), KVS_STATUS_INVALID_CONFIG, "groups.window");
    bad[0] = (kvs_group){KVS_GROUP_KIND_FULL, 5, 1, 0};
    bad_config(cfg_of(bad, 1), KVS_STATUS_INVALID_CONFIG, "groups.window");
    c = cfg_of(g, 2);
    c.num_device_pages = 1;
    bad_config(c, KVS_STATUS_INVALID_CONFIG, "num_device_pages");
    c = cfg_of(g, 2);
    c.page_size = 0;
    bad_config(c, KVS_STATUS_INVALID_CONFIG, "page_size");
    /* A window releases pages and shows the null page there: it needs the null page. */
    c = cfg_of(g, 2);
    c.reserve_null_page = false;
    bad_config(c, KVS_STATUS_INVALID_CONFIG, "reserve_null_page");
    c = cfg_of(g, 2);
    memset(&c.enable_events, 2, 1); /* a bool byte that is not 0 or 1 */
    bad_config(c, KVS_STATUS_INVALID_CONFIG, "enable_events");
    c = cfg_of(g, 2);
    memset(&c.vllm_free_order, 2, 1);
    bad_config(c, KVS_STATUS_INVALID_CONFIG, "vllm_free_order");
    c = cfg_of(g, 2);
    c.eviction_policy = 3; /* no kvs_eviction_policy */
    bad_config(c, KVS_STATUS_INVALID_CONFIG, "eviction_policy");
    /* vLLM's block pool order is LRU: another policy with it is refused, naming both. */
    c = cfg_of(g, 2);
    c.eviction_policy = KVS_EVICTION_POLICY_S3_FIFO;
    bad_config(c, KVS_STATUS_INVALID_CONFIG, "eviction_policy");
    CHECK(strstr(kvs_last_error_message(), "vllm_free_order") != NULL);
    /* vLLM 0.32's order (uncached pages first) is a variant of vLLM's order: refused without it,
     * kept with it. */
    c = cfg_of(g, 2);
    c.vllm_free_order = false;
    c.vllm_uncached_first = true;
    bad_config(c, KVS_STATUS_INVALID_CONFIG, "vllm_uncached_first");
    c = cfg_of(g, 2);
    c.vllm_uncached_first = true;
    CHECK_OK(kvs_cache_new(&c, &h));
    kvs_config got_order;
    CHECK_OK(kvs_cache_get_config(h, &got_order));
    CHECK(got_order.vllm_free_order && got_order.vllm_uncached_first);
    kvs_cache_free(h);
    c = cfg_of(g, 2);
    c.vllm_free_order = false;
    c.eviction_policy = KVS_EVICTION_POLICY_LFU;
    CHECK_OK(kvs_cache_new(&c, &h));
    kvs_config got_policy;
    CHECK_OK(kvs_cache_get_config(h, &got_policy));
    CHECK_EQ(got_policy.eviction_policy, KVS_EVICTION_POLICY_LFU);
    kvs_cache_free(h);

    /* No groups (an array of none, too) is one full-attention group of the geometry's bytes. */
    c = cfg_of(g, 0);
    CHECK_OK(kvs_cache_new(&c, &h));
    kvs_group_info gi;
    CHECK_OK(kvs_cache_group_info(h, 0, &gi));
    CHECK_EQ(gi.kind, KVS_GROUP_KIND_FULL);
    CHECK_EQ(gi.window, 0);
    CHECK_EQ(gi.page_bytes, 2u * PS * 128u * 2u); /* K and V, 1 layer, 1 head of 128, f16 */
    CHECK_EQ(gi.num_groups, 1);
    kvs_config got;
    CHECK_OK(kvs_cache_get_config(h, &got));
    CHECK(got.groups == NULL);
    CHECK_EQ(got.num_groups, 1);
    CHECK(got.vllm_free_order);
    kvs_cache_free(h);

    c = cfg_of(g, 2);
    CHECK_OK(kvs_cache_new(&c, &h));
    CHECK_CACHE(h);
    CHECK_OK(kvs_cache_get_config(h, &got));
    CHECK(got.groups == NULL);
    CHECK_EQ(got.num_groups, 2);

    CHECK_OK(kvs_cache_group_info(h, 0, &gi));
    CHECK_EQ(gi.kind, KVS_GROUP_KIND_SLIDING_WINDOW);
    CHECK_EQ(gi.window, 8);
    CHECK_EQ(gi.page_bytes, 4096);
    CHECK_EQ(gi.pool, 0);
    CHECK_EQ(gi.num_pools, 1);
    CHECK_EQ(gi.num_groups, 2);
    gi.window = SENT;
    CHECK_FAILS(kvs_cache_group_info(h, 2, &gi), KVS_STATUS_INVALID_ARGUMENT, "group");
    CHECK_EQ(gi.window, SENT);

    /* 20 tokens: 5 pages per group. */
    int32_t toks[21];
    for (int i = 0; i < 21; i++) {
        toks[i] = 1000 + i;
    }
    kvs_seq_info bi;
    CHECK_OK(kvs_seq_begin(h, 1, toks, 20, NULL, SIZE_MAX, 0, &bi));
    CHECK_EQ(bi.matched_tokens, 0);
    CHECK_EQ(bi.num_pages, 5);
    CHECK_EQ(bi.new_pages, 10);
    CHECK_FAILS(kvs_seq_begin(h, 1, toks, 20, NULL, SIZE_MAX, 0, &bi), KVS_STATUS_SEQ_EXISTS,
                "1");

    /* 20 computed with window 8: (20 - 8 + 1) / 4 = 3 pages of group 0 released. */
    size_t released = SENT;
    CHECK_OK(kvs_seq_release_skipped(h, 1, 20, &released));
    CHECK_EQ(released, 3);
    uint32_t pages[8];
    size_t np = 0;
    CHECK_OK(kvs_seq_pages(h, 0, 1, pages, 8, &np));
    CHECK_EQ(np, 5);
    CHECK_EQ(pages[0], KVS_NULL_PAGE);
    CHECK_EQ(pages[2], KVS_NULL_PAGE);
    CHECK(pages[3] != KVS_NULL_PAGE);
    np = SENT;
    CHECK_FAILS(kvs_seq_pages(h, 0, 1, pages, 4, &np), KVS_STATUS_BUFFER_TOO_SMALL, "pages_out");
    CHECK_FAILS(kvs_seq_pages(h, 2, 1, pages, 8, &np), KVS_STATUS_INVALID_ARGUMENT, "group");
    CHECK_EQ(np, SENT);
    CHECK_EQ(t_append(h, 1, toks + 20, 1), 0);
    CHECK_CACHE(h);

    /* A second request with the same 20 tokens plus one: hit 20 (window pages 3, 4 cached). */
    uint32_t mp[2 * 5];
    size_t matched = 0;
    int32_t other[21];
    memcpy(other, toks, sizeof other);
    other[20] = 7;
    CHECK_OK(kvs_prefix_find(h, other, 21, NULL, 20, mp, 10, 5, &matched));
    CHECK_EQ(matched, 20);
    CHECK_EQ(mp[0], KVS_NULL_PAGE);
    CHECK_EQ(mp[3], pages[3]);
    CHECK(mp[5] != KVS_NULL_PAGE);
    matched = SENT;
    CHECK_FAILS(kvs_prefix_find(h, other, 21, NULL, 20, mp, 9, 5, &matched),
                KVS_STATUS_BUFFER_TOO_SMALL, "pages_out");
    CHECK_FAILS(kvs_prefix_find(h, other, 21, NULL, 20, mp, 10, 4, &matched),
                KVS_STATUS_BUFFER_TOO_SMALL, "pages_out");
    CHECK_EQ(matched, SENT);
    CHECK_OK(kvs_prefix_find(h, other, 21, NULL, 20, NULL, 0, 0, &matched));
    CHECK_EQ(matched, 20);
    /* Group 1 (full attention) alone has the same 5 pages. */
    uint32_t full[5];
    size_t nfull = 0;
    CHECK_OK(kvs_prefix_match(h, 1, other, 21, NULL, 20, false, full, 5, &nfull, NULL));
    CHECK_EQ(nfull, 5);
    CHECK(memcmp(full, mp + 5, sizeof full) == 0);
    CHECK_OK(kvs_seq_begin(h, 2, other, 21, NULL, 20, 0, &bi));
    CHECK_EQ(bi.matched_tokens, 20);
    CHECK_EQ(bi.new_pages, 2);

    /* Per-group views. */
    uint64_t ids[2] = {1, 2};
    int32_t table[2 * 8];
    int32_t lens[2];
    CHECK_OK(kvs_cache_block_tables(h, 0, ids, 2, 8, -1, table, 16, lens, 2));
    CHECK_EQ(table[8 + 0], KVS_NULL_PAGE);
    CHECK_EQ(lens[1], 21);
    CHECK_FAILS(kvs_cache_block_tables(h, 0, ids, 2, 5, -1, table, 16, lens, 2),
                KVS_STATUS_INVALID_ARGUMENT, "max_pages_per_seq");
    CHECK_FAILS(kvs_cache_block_tables(h, 2, ids, 2, 8, -1, table, 16, lens, 2),
                KVS_STATUS_INVALID_ARGUMENT, "group");
    uint32_t q[2] = {1, 1};
    int64_t slots[3];
    size_t ns = 0;
    CHECK_OK(kvs_cache_slot_mapping(h, 1, ids, q, 2, slots, 3, &ns));
    CHECK_EQ(ns, 2);
    CHECK_EQ(slots[2], (uint64_t)-1);
    CHECK_FAILS(kvs_cache_slot_mapping(h, 1, ids, q, 2, slots, 1, &ns),
                KVS_STATUS_BUFFER_TOO_SMALL, "slots_out");
    CHECK_FAILS(kvs_cache_slot_mapping(h, SIZE_MAX, ids, q, 2, slots, 3, &ns),
                KVS_STATUS_INVALID_ARGUMENT, "group");

    kvs_group_stats st = t_group_stats(h, 0);
    CHECK_EQ(st.pages_released, 3);
    CHECK_EQ(st.pool_pages_total, 32);
    CHECK_EQ(st.page_bytes, 4096);
    kvs_stats all = t_stats(h);
    CHECK_EQ(all.num_seqs, 2);
    CHECK_EQ(all.prefix_hit_tokens, 20);
    st.pool = SENT;
    CHECK_FAILS(kvs_cache_group_stats(h, 9, &st), KVS_STATUS_INVALID_ARGUMENT, "group");
    CHECK_EQ(st.pool, SENT);

    kvs_event ev[64];
    size_t ne = 0;
    CHECK_OK(kvs_cache_take_events(h, ev, 64, &ne));
    CHECK(ne >= 10);
    size_t sw = 0;
    for (size_t i = 0; i < ne; i++) {
        CHECK_EQ(ev[i].kind, KVS_EVENT_KIND_STORED);
        CHECK(ev[i].group < 2);
        CHECK_OK(kvs_cache_group_info(h, ev[i].group, &gi));
        if (ev[i].group == 0) {
            CHECK_EQ(gi.kind, KVS_GROUP_KIND_SLIDING_WINDOW);
            CHECK_EQ(gi.window, 8);
            sw++;
        } else {
            CHECK_EQ(gi.kind, KVS_GROUP_KIND_FULL);
        }
    }
    CHECK(sw >= 5);

    /* Bad input at the sequence calls. */
    size_t need = SENT;
    CHECK_FAILS(kvs_seq_append_need(h, 9, 1, 0, &need, NULL), KVS_STATUS_SEQ_NOT_FOUND, "9");
    CHECK_EQ(need, SENT);
    CHECK_FAILS(kvs_seq_append_need(h, 1, 1, 0, NULL, NULL), KVS_STATUS_NULL_ARGUMENT,
                "pages_needed_out");
    CHECK_OK(kvs_seq_append_need(h, 1, 4, 0, &need, NULL));
    CHECK_EQ(need, 2);
    kvs_copy cp[4];
    size_t nc = SENT;
    CHECK_FAILS(kvs_seq_append(h, 1, NULL, 1, 0, cp, 4, &nc), KVS_STATUS_NULL_ARGUMENT, "tokens");
    CHECK_FAILS(kvs_seq_append(h, 1, toks, 1, SIZE_MAX, cp, 4, &nc),
                KVS_STATUS_INVALID_ARGUMENT, "lookahead_slots");
    CHECK_FAILS(kvs_seq_append(h, 1, toks, 1000, 0, cp, 4, &nc), KVS_STATUS_NO_SPACE, NULL);
    CHECK_EQ(nc, SENT);
    CHECK_FAILS(kvs_seq_release_skipped(h, 9, 1, NULL), KVS_STATUS_SEQ_NOT_FOUND, "9");
    CHECK_FAILS(kvs_seq_free(h, 9), KVS_STATUS_SEQ_NOT_FOUND, "9");
    CHECK_FAILS(kvs_seq_free(NULL, 1), KVS_STATUS_NULL_ARGUMENT, "cache");
    kvs_seq_info si;
    si.num_tokens = SENT;
    CHECK_FAILS(kvs_seq_get_info(h, 9, &si), KVS_STATUS_SEQ_NOT_FOUND, "9");
    CHECK_EQ(si.num_tokens, SENT);
    CHECK_CACHE(h);

    CHECK_OK(kvs_seq_free(h, 1));
    CHECK_OK(kvs_seq_free(h, 2));
    st = t_group_stats(h, 1);
    CHECK_EQ(st.pool_pages_in_use, 0);
    CHECK_EQ(st.pool_pages_free, 31);
    CHECK_CACHE(h);
    kvs_cache_free(h);
    kvs_cache_free(NULL);
    external_tokens(g);
    sparse_retention(g);
    printf("groups: ok\n");
    return 0;
}
