/*
 * Regression: a state group in mode align (page size 2) after two valid appends without
 * kvs_seq_release_skipped between them held three pages ([0 1 2 3]), and kvs_cache_check
 * reported an invariant violation; the page of two steps ago was forgotten (the group
 * remembers only the previous step's), so no later release could find it. The header requires
 * no release between appends, and vLLM's allocate_slots releases that page at its start
 * (remove_skipped_blocks) before it allocates, so kvs_seq_append releases it too, counting it
 * as available for its own new page, and only when it succeeds.
 *
 * Checked: the running state at the table's end and the previous step's page kept, nothing
 * else; the same tables with and without the releases; a pool whose only page for the new state
 * is the one released; a refused append that changes nothing.
 */
#include "kvs_test.h"

#define PS 2u

static kvs_cache *make(uint32_t num_pages, bool with_full, uint64_t full_bytes) {
    const kvs_group g[2] = {
        {KVS_GROUP_KIND_STATE, KVS_STATE_MODE_ALIGN, 4096, 0},
        {KVS_GROUP_KIND_FULL, 0, full_bytes, 0},
    };
    kvs_config c = t_groups_config(PS, num_pages, g, with_full ? 2 : 1);
    kvs_cache *h = NULL;
    CHECK_OK(kvs_cache_new(&c, &h));
    return h;
}

/* Group 0's table of sequence 1; returns its length. */
static size_t table(kvs_cache *h, uint32_t *out) {
    return t_pages(h, 0, 1, out, 16);
}

static uint64_t in_use(kvs_cache *h) {
    return t_group_stats(h, 0).pool_pages_in_use;
}

/* Six appends of 2 tokens after a 4-token begin, releasing before each append or not. */
static void appends(bool release, bool with_full, uint32_t tables[7][16]) {
    kvs_cache *h = make(32, with_full, 8192);
    int32_t t[16];
    for (int i = 0; i < 16; i++) {
        t[i] = 10 + i;
    }
    CHECK_OK(kvs_seq_begin(h, 1, t, 4, NULL, 0, 0, NULL));
    CHECK_EQ(table(h, tables[0]), 2);
    for (size_t step = 1; step <= 6; step++) {
        size_t n = 4 + 2 * step; /* tokens after this append */
        if (release) {
            CHECK_OK(kvs_seq_release_skipped(h, 1, n - 2, NULL));
        }
        t_append(h, 1, t + n - 2, 2);
        CHECK_CACHE(h);
        uint32_t *p = tables[step];
        CHECK_EQ(table(h, p), n / PS);
        /* The running state last, the previous step's page before it, nothing else. */
        CHECK(p[n / PS - 1] != KVS_NULL_PAGE);
        CHECK(p[n / PS - 2] != KVS_NULL_PAGE);
        for (size_t j = 0; j + 2 < n / PS; j++) {
            CHECK_EQ(p[j], KVS_NULL_PAGE);
        }
        if (!with_full) {
            CHECK_EQ(in_use(h), 2);
        }
    }
    CHECK_OK(kvs_seq_free(h, 1));
    CHECK_EQ(in_use(h), 0);
    CHECK_CACHE(h);
    kvs_cache_free(h);
}

int main(void) {
    for (int with_full = 0; with_full < 2; with_full++) {
        uint32_t with[7][16], without[7][16];
        appends(true, with_full, with);
        appends(false, with_full, without);
        for (size_t s = 0; s < 7; s++) {
            CHECK(memcmp(with[s], without[s], (2 + s) * sizeof(uint32_t)) == 0);
        }
    }

    /* Two usable pages: the third state page is the one the append releases. */
    kvs_cache *h = make(3, false, 4096);
    int32_t t[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    uint32_t p[16];
    CHECK_OK(kvs_seq_begin(h, 1, t, 4, NULL, 0, 0, NULL));
    t_append(h, 1, t + 4, 2);
    CHECK_EQ(in_use(h), 2);
    CHECK_EQ(table(h, p), 3);
    uint32_t two_ago = p[1];
    /* The need counts the page the append releases: none beyond it, with none available. */
    size_t need = SIZE_MAX, avail = SIZE_MAX;
    CHECK_OK(kvs_seq_append_need(h, 1, 2, 0, &need, NULL));
    CHECK_OK(kvs_cache_available(h, KVS_TIER_DEVICE, 0, &avail));
    CHECK_EQ(need, 0);
    CHECK_EQ(avail, 0);
    t_append(h, 1, t + 6, 2);
    CHECK_CACHE(h);
    CHECK_EQ(table(h, p), 4);
    CHECK_EQ(p[1], KVS_NULL_PAGE);
    CHECK_EQ(p[3], two_ago);
    CHECK_EQ(in_use(h), 2);
    kvs_cache_free(h);

    /* Full attention in the same pool: the append needs two pages and its release gives one
     * back, one short with no page free: refused, and nothing is released. */
    h = make(6, true, 4096);
    CHECK_OK(kvs_seq_begin(h, 1, t, 4, NULL, 0, 0, NULL));
    t_append(h, 1, t + 4, 2);
    CHECK_EQ(in_use(h), 5);
    uint32_t before[16];
    size_t n_before = table(h, before);
    CHECK_EQ(n_before, 3);
    kvs_group_stats st_before = t_group_stats(h, 0);
    kvs_copy cp[4];
    size_t nc = 0;
    CHECK_STATUS(kvs_seq_append(h, 1, t + 6, 2, 0, cp, 4, &nc), KVS_STATUS_NO_SPACE);
    kvs_group_stats st_after = t_group_stats(h, 0);
    CHECK(memcmp(&st_before, &st_after, sizeof st_after) == 0);
    CHECK_EQ(table(h, p), n_before);
    CHECK(memcmp(p, before, n_before * sizeof(uint32_t)) == 0);
    CHECK_CACHE(h);
    /* kvs_seq_release_skipped releases it regardless, as vLLM does before its admission check;
     * one page is still short. */
    size_t released = 0;
    CHECK_OK(kvs_seq_release_skipped(h, 1, 6, &released));
    CHECK_EQ(released, 1);
    CHECK_STATUS(kvs_seq_append(h, 1, t + 6, 2, 0, cp, 4, &nc), KVS_STATUS_NO_SPACE);
    CHECK_OK(kvs_seq_free(h, 1));
    CHECK_CACHE(h);
    kvs_cache_free(h);
    printf("bug_groups_align_append_without_release: ok\n");
    return 0;
}
