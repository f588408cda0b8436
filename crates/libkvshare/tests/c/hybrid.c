/*
 * kvs_hybrid_* from C: config validation (every bad field named, out-param untouched), a
 * sliding-window + full-attention flow (hit, null pages after the window moved, per-group block
 * tables and slot mappings, stats, events with group_idx/kind/window), and bad input at every
 * entry point (NULL pointers, unknown group and sequence, short buffers) leaving out-params
 * untouched and the cache consistent.
 */
#include "kvs_test.h"

#define PS 4u
#define SENT 0xA5A5A5A5u

static kvs_hybrid_config cfg_of(kvs_group *g, size_t n) {
    kvs_hybrid_config c;
    memset(&c, 0, sizeof c);
    c.page_size = PS;
    c.num_pages = 32;
    c.enable_prefix_caching = true;
    c.enable_events = true;
    c.groups = g;
    c.num_groups = n;
    return c;
}

static void bad_config(kvs_hybrid_config c, const char *field) {
    kvs_hybrid *h = (kvs_hybrid *)(uintptr_t)0x1;
    CHECK_FAILS(kvs_hybrid_new(&c, &h), KVS_STATUS_INVALID_CONFIG, field);
    CHECK(h == (kvs_hybrid *)(uintptr_t)0x1);
}

int main(void) {
    kvs_group g[2] = {
        {KVS_GROUP_KIND_SLIDING_WINDOW, 8, 4096},
        {KVS_GROUP_KIND_FULL, 0, 4096},
    };
    kvs_group many[KVS_MAX_GROUPS + 1];
    for (size_t i = 0; i < KVS_MAX_GROUPS + 1; i++) {
        many[i] = g[1];
    }
    kvs_hybrid *h = NULL;

    /* Config validation. */
    CHECK_FAILS(kvs_hybrid_new(NULL, &h), KVS_STATUS_NULL_ARGUMENT, "config");
    kvs_hybrid_config c = cfg_of(g, 2);
    CHECK_FAILS(kvs_hybrid_new(&c, NULL), KVS_STATUS_NULL_ARGUMENT, "hybrid_out");
    bad_config(cfg_of(g, 0), "num_groups");
    bad_config(cfg_of(many, KVS_MAX_GROUPS + 1), "num_groups");
    c = cfg_of(NULL, 2);
    CHECK_FAILS(kvs_hybrid_new(&c, &h), KVS_STATUS_NULL_ARGUMENT, "config.groups");
    kvs_group bad[1];
    bad[0] = (kvs_group){7, 0, 1};
    bad_config(cfg_of(bad, 1), "groups.kind");
    bad[0] = (kvs_group){KVS_GROUP_KIND_STATE, 9, 1}; /* 9 is no kvs_state_mode */
    bad_config(cfg_of(bad, 1), "groups.window");
    bad[0] = (kvs_group){KVS_GROUP_KIND_SLIDING_WINDOW, 0, 1};
    bad_config(cfg_of(bad, 1), "groups.window");
    bad[0] = (kvs_group){KVS_GROUP_KIND_CHUNKED_LOCAL, 0, 1};
    bad_config(cfg_of(bad, 1), "groups.window");
    bad[0] = (kvs_group){KVS_GROUP_KIND_FULL, 5, 1};
    bad_config(cfg_of(bad, 1), "groups.window");
    bad[0] = (kvs_group){KVS_GROUP_KIND_FULL, 0, 0};
    bad_config(cfg_of(bad, 1), "groups.page_bytes");
    c = cfg_of(g, 2);
    c.num_pages = 1;
    bad_config(c, "num_pages");
    c = cfg_of(g, 2);
    c.page_size = 0;
    bad_config(c, "page_size");
    c = cfg_of(g, 2);
    memset(&c.enable_events, 2, 1); /* a bool byte that is not 0 or 1 */
    bad_config(c, "enable_events");

    c = cfg_of(g, 2);
    CHECK_OK(kvs_hybrid_new(&c, &h));
    CHECK_OK(kvs_hybrid_check(h));

    kvs_group_info gi;
    CHECK_OK(kvs_hybrid_group_info(h, 0, &gi));
    CHECK_EQ(gi.kind, KVS_GROUP_KIND_SLIDING_WINDOW);
    CHECK_EQ(gi.window, 8);
    CHECK_EQ(gi.pool, 0);
    CHECK_EQ(gi.num_pools, 1);
    gi.window = SENT;
    CHECK_FAILS(kvs_hybrid_group_info(h, 2, &gi), KVS_STATUS_INVALID_ARGUMENT, "group");
    CHECK_EQ(gi.window, SENT);

    /* 20 tokens: 5 pages per group. */
    int32_t toks[21];
    for (int i = 0; i < 21; i++) {
        toks[i] = 1000 + i;
    }
    kvs_hybrid_begin_info bi;
    CHECK_OK(kvs_hybrid_seq_begin(h, 1, toks, 20, NULL, SIZE_MAX, 0, &bi));
    CHECK_EQ(bi.matched_tokens, 0);
    CHECK_EQ(bi.num_pages, 5);
    CHECK_EQ(bi.new_pages, 10);
    CHECK_FAILS(kvs_hybrid_seq_begin(h, 1, toks, 20, NULL, SIZE_MAX, 0, &bi),
                KVS_STATUS_SEQ_EXISTS, "1");

    /* 20 computed with window 8: (20 - 8 + 1) / 4 = 3 pages of group 0 released. */
    size_t released = SENT;
    CHECK_OK(kvs_hybrid_seq_release_skipped(h, 1, 20, &released));
    CHECK_EQ(released, 3);
    uint32_t pages[8];
    size_t np = 0;
    CHECK_OK(kvs_hybrid_seq_pages(h, 1, 0, pages, 8, &np));
    CHECK_EQ(np, 5);
    CHECK_EQ(pages[0], KVS_NULL_PAGE);
    CHECK_EQ(pages[2], KVS_NULL_PAGE);
    CHECK(pages[3] != KVS_NULL_PAGE);
    np = SENT;
    CHECK_FAILS(kvs_hybrid_seq_pages(h, 1, 0, pages, 4, &np), KVS_STATUS_BUFFER_TOO_SMALL,
                "pages_out");
    CHECK_EQ(np, SENT);
    CHECK_OK(kvs_hybrid_seq_append(h, 1, toks + 20, 1, 0));
    CHECK_OK(kvs_hybrid_check(h));

    /* A second request with the same 20 tokens plus one: hit 20 (window pages 3, 4 cached). */
    uint32_t mp[2 * 5];
    size_t matched = 0;
    int32_t other[21];
    memcpy(other, toks, sizeof other);
    other[20] = 7;
    CHECK_OK(kvs_hybrid_match(h, other, 21, NULL, 20, mp, 10, 5, &matched));
    CHECK_EQ(matched, 20);
    CHECK_EQ(mp[0], KVS_NULL_PAGE);
    CHECK(mp[5] != KVS_NULL_PAGE);
    matched = SENT;
    CHECK_FAILS(kvs_hybrid_match(h, other, 21, NULL, 20, mp, 9, 5, &matched),
                KVS_STATUS_BUFFER_TOO_SMALL, "pages_out");
    CHECK_FAILS(kvs_hybrid_match(h, other, 21, NULL, 20, mp, 10, 4, &matched),
                KVS_STATUS_BUFFER_TOO_SMALL, "pages_out");
    CHECK_EQ(matched, SENT);
    CHECK_OK(kvs_hybrid_match(h, other, 21, NULL, 20, NULL, 0, 0, &matched));
    CHECK_EQ(matched, 20);
    CHECK_OK(kvs_hybrid_seq_begin(h, 2, other, 21, NULL, 20, 0, &bi));
    CHECK_EQ(bi.matched_tokens, 20);
    CHECK_EQ(bi.new_pages, 2);

    /* Per-group views. */
    uint64_t ids[2] = {1, 2};
    int32_t table[2 * 8];
    int32_t lens[2];
    CHECK_OK(kvs_hybrid_block_tables(h, 0, ids, 2, 8, -1, table, 16, lens, 2));
    CHECK_EQ(table[8 + 0], KVS_NULL_PAGE);
    CHECK_EQ(lens[1], 21);
    CHECK_FAILS(kvs_hybrid_block_tables(h, 0, ids, 2, 5, -1, table, 16, lens, 2),
                KVS_STATUS_INVALID_ARGUMENT, "max_pages_per_seq");
    CHECK_FAILS(kvs_hybrid_block_tables(h, 2, ids, 2, 8, -1, table, 16, lens, 2),
                KVS_STATUS_INVALID_ARGUMENT, "group");
    uint32_t q[2] = {1, 1};
    int64_t slots[3];
    size_t ns = 0;
    CHECK_OK(kvs_hybrid_slot_mapping(h, 1, ids, q, 2, slots, 3, &ns));
    CHECK_EQ(ns, 2);
    CHECK_EQ(slots[2], (uint64_t)-1);
    CHECK_FAILS(kvs_hybrid_slot_mapping(h, 1, ids, q, 2, slots, 1, &ns),
                KVS_STATUS_BUFFER_TOO_SMALL, "slots_out");

    kvs_group_stats st;
    CHECK_OK(kvs_hybrid_stats(h, 0, &st));
    CHECK_EQ(st.pages_released, 3);
    CHECK_EQ(st.num_seqs, 2);
    CHECK_EQ(st.pool_pages_total, 32);
    CHECK_EQ(st.prefix_hit_tokens, 20);
    st.pool = SENT;
    CHECK_FAILS(kvs_hybrid_stats(h, 9, &st), KVS_STATUS_INVALID_ARGUMENT, "group");
    CHECK_EQ(st.pool, SENT);

    kvs_group_event ev[64];
    size_t ne = 0;
    CHECK_OK(kvs_hybrid_take_events(h, ev, 64, &ne));
    CHECK(ne >= 10);
    size_t sw = 0;
    for (size_t i = 0; i < ne; i++) {
        CHECK_EQ(ev[i].kind, KVS_EVENT_KIND_STORED);
        if (ev[i].group_idx == 0) {
            CHECK_EQ(ev[i].group_kind, KVS_GROUP_KIND_SLIDING_WINDOW);
            CHECK_EQ(ev[i].window, 8);
            sw++;
        } else {
            CHECK_EQ(ev[i].group_kind, KVS_GROUP_KIND_FULL);
            CHECK_EQ(ev[i].window, 0);
        }
    }
    CHECK(sw >= 5);

    /* Bad input at the sequence calls. */
    size_t need = SENT;
    CHECK_FAILS(kvs_hybrid_seq_append_need(h, 9, 1, 0, &need), KVS_STATUS_SEQ_NOT_FOUND, "9");
    CHECK_EQ(need, SENT);
    CHECK_FAILS(kvs_hybrid_seq_append_need(h, 1, 1, 0, NULL), KVS_STATUS_NULL_ARGUMENT,
                "pages_out");
    CHECK_OK(kvs_hybrid_seq_append_need(h, 1, 4, 0, &need));
    CHECK_EQ(need, 2);
    CHECK_FAILS(kvs_hybrid_seq_append(h, 1, NULL, 1, 0), KVS_STATUS_NULL_ARGUMENT, "tokens");
    CHECK_FAILS(kvs_hybrid_seq_append(h, 1, toks, 1, SIZE_MAX), KVS_STATUS_INVALID_ARGUMENT,
                "lookahead_slots");
    CHECK_FAILS(kvs_hybrid_seq_append(h, 1, toks, 1000, 0), KVS_STATUS_NO_SPACE, NULL);
    CHECK_FAILS(kvs_hybrid_seq_release_skipped(h, 9, 1, NULL), KVS_STATUS_SEQ_NOT_FOUND, "9");
    CHECK_FAILS(kvs_hybrid_seq_free(h, 9), KVS_STATUS_SEQ_NOT_FOUND, "9");
    CHECK_FAILS(kvs_hybrid_seq_free(NULL, 1), KVS_STATUS_NULL_ARGUMENT, "hybrid");
    kvs_hybrid_seq_info si;
    si.num_tokens = SENT;
    CHECK_FAILS(kvs_hybrid_seq_get_info(h, 9, &si), KVS_STATUS_SEQ_NOT_FOUND, "9");
    CHECK_EQ(si.num_tokens, SENT);
    CHECK_OK(kvs_hybrid_check(h));

    CHECK_OK(kvs_hybrid_seq_free(h, 1));
    CHECK_OK(kvs_hybrid_seq_free(h, 2));
    CHECK_OK(kvs_hybrid_stats(h, 1, &st));
    CHECK_EQ(st.pool_pages_in_use, 0);
    CHECK_EQ(st.pool_pages_free, 31);
    CHECK_OK(kvs_hybrid_check(h));
    kvs_hybrid_free(h);
    kvs_hybrid_free(NULL);
    printf("hybrid: ok\n");
    return 0;
}
