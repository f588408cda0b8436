/*
 * EAGLE / MTP groups from C (KVS_GROUP_EAGLE): what a config may combine them with (every bad
 * field named, the out-param untouched), the flags read back, and the hit of a sliding-window
 * + full-attention cache with both groups EAGLE's, the window only or full attention only:
 * kvs_prefix_find's hit ends a page earlier than without EAGLE, kvs_seq_begin capped at that
 * hit takes exactly it, and a begin with the lookup's limit takes the hit without the drop.
 */
#include "kvs_test.h"

#define PS 4u

static void bad_config(kvs_config c, const char *field) {
    kvs_cache *h = (kvs_cache *)(uintptr_t)0x1;
    CHECK_FAILS(kvs_cache_new(&c, &h), KVS_STATUS_INVALID_CONFIG, field);
    CHECK(h == (kvs_cache *)(uintptr_t)0x1);
}

/* The cross-group hit of `toks` (at most 23 tokens) in a cache whose first sequence computed
 * them: window 8 (2 pages before a hit's end, 3 with EAGLE) over full attention. */
static size_t hit_after_one_sequence(kvs_group *g, uint32_t window_flags, uint32_t full_flags) {
    g[0].flags = window_flags;
    g[1].flags = full_flags;
    kvs_config c = t_groups_config(PS, 32, g, 2);
    kvs_cache *h = NULL;
    CHECK_OK(kvs_cache_new(&c, &h));
    for (size_t i = 0; i < 2; i++) {
        kvs_group_info gi;
        CHECK_OK(kvs_cache_group_info(h, i, &gi));
        CHECK_EQ(gi.flags, g[i].flags);
    }
    int32_t toks[24];
    t_iota(toks, 24, 700);
    kvs_seq_info si;
    CHECK_OK(kvs_seq_begin(h, 1, toks, 24, NULL, 23, 0, &si));
    CHECK_EQ(si.matched_tokens, 0);
    CHECK_OK(kvs_seq_free(h, 1));
    size_t hit = (size_t)-1;
    uint32_t pages[2 * 6];
    CHECK_OK(kvs_prefix_find(h, toks, 24, NULL, 23, pages, 12, 6, &hit));
    /* A begin capped at the lookup's hit takes it, the same pages in every group. */
    CHECK_OK(kvs_seq_begin(h, 2, toks, 24, NULL, hit, 0, &si));
    CHECK_EQ(si.matched_tokens, hit);
    for (size_t gi = 0; gi < 2; gi++) {
        uint32_t table[6];
        CHECK_EQ(t_pages(h, gi, 2, table, 6), 6);
        for (size_t j = 0; j < hit / PS; j++) {
            CHECK(table[j] == pages[gi * 6 + j] || pages[gi * 6 + j] == KVS_NULL_PAGE);
        }
    }
    CHECK_OK(kvs_seq_free(h, 2));
    /* With the lookup's limit a begin takes the hit without the drop: 20 tokens. */
    CHECK_OK(kvs_seq_begin(h, 3, toks, 24, NULL, 23, 0, &si));
    CHECK_EQ(si.matched_tokens, 20);
    CHECK_OK(kvs_seq_free(h, 3));
    CHECK_CACHE(h);
    kvs_cache_free(h);
    return hit;
}

int main(void) {
    kvs_group g[2] = {
        {KVS_GROUP_KIND_SLIDING_WINDOW, 8, 4096, 0},
        {KVS_GROUP_KIND_FULL, 0, 4096, 0},
    };
    kvs_group bad[2] = {g[0], g[1]};

    /* Unknown flag bits; kinds that cannot drop a page; whole-page hits only. */
    bad[1].flags = 2;
    bad_config(t_groups_config(PS, 32, bad, 2), "groups.flags");
    bad[1].flags = KVS_GROUP_EAGLE;
    bad[0] = (kvs_group){KVS_GROUP_KIND_CHUNKED_LOCAL, 8, 4096, KVS_GROUP_EAGLE};
    bad_config(t_groups_config(PS, 32, bad, 2), "groups.flags");
    bad[0] = (kvs_group){KVS_GROUP_KIND_STATE, KVS_STATE_MODE_ALL, 4096, KVS_GROUP_EAGLE};
    bad_config(t_groups_config(PS, 32, bad, 2), "groups.flags");
    bad[0] = g[0];
    kvs_config c = t_groups_config(PS, 32, bad, 2);
    c.match_unit = 2;
    bad_config(c, "match_unit");

    /* 24 tokens, limit 23: 5 whole pages. Without EAGLE the hit is 20 tokens. */
    CHECK_EQ(hit_after_one_sequence(g, 0, 0), 20);
    /* Both EAGLE's: full attention drops page 4; the window's run of 3 pages ending at page 5
     * drops its last: 16. */
    CHECK_EQ(hit_after_one_sequence(g, KVS_GROUP_EAGLE, KVS_GROUP_EAGLE), 16);
    /* The window only: full attention finds 20, the window looks one page further (limit 23:
     * still page 4) and drops it: 16, which full attention then trims to. */
    CHECK_EQ(hit_after_one_sequence(g, KVS_GROUP_EAGLE, 0), 16);
    /* Full attention only: 16, the window agrees. */
    CHECK_EQ(hit_after_one_sequence(g, 0, KVS_GROUP_EAGLE), 16);
    return 0;
}
