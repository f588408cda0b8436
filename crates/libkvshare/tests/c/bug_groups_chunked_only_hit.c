/*
 * Regression: a cache made of chunked-local groups only hits past the pages its prompt hashes
 * (the pages before the chunk of the first token to compute are never looked up, so a
 * placeholder token early in the prompt does not stop the hit). The begin once panicked in the
 * same-step gate of state groups, which read the digest of the hit's last page before asking
 * whether the cache has a state group at all, and every later call returned
 * KVS_STATUS_POISONED. The begin must take the hit kvs_prefix_find reports and leave the cache
 * consistent and usable.
 */
#include "kvs_test.h"

#define PS 2u
#define CHUNK 10u

static kvs_cache *make(const kvs_group *g, size_t n) {
    kvs_config c = t_groups_config(PS, 64, g, n);
    kvs_cache *h = NULL;
    CHECK_OK(kvs_cache_new(&c, &h));
    return h;
}

/* The scenario on `h`, whose groups are all chunked local (chunk CHUNK). */
static void scenario(kvs_cache *h, size_t num_groups) {
    int32_t t[30];
    for (int i = 0; i < 30; i++) {
        t[i] = 100 + i;
    }
    t[2] = -1; /* a placeholder: hashing stops at page 1 */
    kvs_seq_info bi;
    /* Computed whole (max_match_tokens 0): 15 pages per group. */
    CHECK_OK(kvs_seq_begin(h, 1, t, 30, NULL, 0, 0, &bi));
    CHECK_EQ(bi.new_pages, 15 * num_groups);
    CHECK_CACHE(h);

    /* Max 22: the first token to compute is 20 at most, whose chunk starts at 20; tokens 0..19
     * are read by no layer, so they count as hit without a lookup. */
    size_t matched = 0;
    CHECK_OK(kvs_prefix_find(h, t, 30, NULL, 22, NULL, 0, 0, &matched));
    CHECK_EQ(matched, 20);
    CHECK_OK(kvs_seq_begin(h, 2, t, 30, NULL, 22, 0, &bi));
    CHECK_EQ(bi.matched_tokens, 20);
    CHECK_EQ(bi.num_pages, 15);
    CHECK_CACHE(h);
    /* Every group's table: nulls before the chunk of token 20, then the sequence's own pages. */
    for (size_t g = 0; g < num_groups; g++) {
        uint32_t pages[15];
        CHECK_EQ(t_pages(h, g, 2, pages, 15), 15);
        for (size_t j = 0; j < 10; j++) {
            CHECK_EQ(pages[j], KVS_NULL_PAGE);
        }
        for (size_t j = 10; j < 15; j++) {
            CHECK(pages[j] != KVS_NULL_PAGE);
        }
    }
    /* The cache is not poisoned: later calls work. */
    t_append(h, 2, t, 2);
    CHECK_OK(kvs_seq_release_skipped(h, 2, 32, NULL));
    CHECK_OK(kvs_cache_new_step(h));
    CHECK_OK(kvs_seq_free(h, 1));
    CHECK_OK(kvs_seq_free(h, 2));
    CHECK_CACHE(h);
    CHECK_EQ(t_group_stats(h, 0).pool_pages_in_use, 0);
    CHECK_EQ(t_stats(h).prefix_hit_tokens, 20);
}

int main(void) {
    const kvs_group one[1] = {{KVS_GROUP_KIND_CHUNKED_LOCAL, CHUNK, 4096, 0}};
    kvs_cache *h = make(one, 1);
    scenario(h, 1);
    kvs_cache_free(h);
    /* Two chunked groups of different page bytes (two pools, one lookup set each). */
    const kvs_group two[2] = {
        {KVS_GROUP_KIND_CHUNKED_LOCAL, CHUNK, 4096, 0},
        {KVS_GROUP_KIND_CHUNKED_LOCAL, CHUNK, 2048, 0},
    };
    h = make(two, 2);
    scenario(h, 2);
    kvs_cache_free(h);
    printf("bug_groups_chunked_only_hit: ok\n");
    return 0;
}
