/*
 * Regression: a kvs_hybrid made of chunked-local groups only hits past the pages its prompt
 * hashes (the pages before the chunk of the first token to compute are never looked up, so a
 * placeholder token early in the prompt does not stop the hit). kvs_hybrid_seq_begin then
 * panicked in the same-step gate of state groups, which read the digest of the hit's last page
 * before asking whether the cache has a state group at all, and every later call returned
 * KVS_STATUS_POISONED. The begin must take the hit kvs_hybrid_match reports and leave the cache
 * consistent and usable.
 */
#include "kvs_test.h"

#define PS 2u
#define CHUNK 10u

static kvs_hybrid *make(const kvs_group *g, size_t n) {
    kvs_hybrid_config c;
    memset(&c, 0, sizeof c);
    c.page_size = PS;
    c.num_pages = 64;
    c.enable_prefix_caching = true;
    c.groups = g;
    c.num_groups = n;
    kvs_hybrid *h = NULL;
    CHECK_OK(kvs_hybrid_new(&c, &h));
    return h;
}

/* The scenario on `h`, whose groups are all chunked local (chunk CHUNK). */
static void scenario(kvs_hybrid *h, size_t num_groups) {
    int32_t t[30];
    for (int i = 0; i < 30; i++) {
        t[i] = 100 + i;
    }
    t[2] = -1; /* a placeholder: hashing stops at page 1 */
    kvs_hybrid_begin_info bi;
    /* Computed whole (max_match_tokens 0): 15 pages per group. */
    CHECK_OK(kvs_hybrid_seq_begin(h, 1, t, 30, NULL, 0, 0, &bi));
    CHECK_EQ(bi.new_pages, 15 * num_groups);
    CHECK_OK(kvs_hybrid_check(h));

    /* Max 22: the first token to compute is 20 at most, whose chunk starts at 20; tokens 0..19
     * are read by no layer, so they count as hit without a lookup. */
    size_t matched = 0;
    CHECK_OK(kvs_hybrid_match(h, t, 30, NULL, 22, NULL, 0, 0, &matched));
    CHECK_EQ(matched, 20);
    CHECK_OK(kvs_hybrid_seq_begin(h, 2, t, 30, NULL, 22, 0, &bi));
    CHECK_EQ(bi.matched_tokens, 20);
    CHECK_EQ(bi.num_pages, 15);
    CHECK_OK(kvs_hybrid_check(h));
    /* Every group's table: nulls before the chunk of token 20, then the sequence's own pages. */
    for (size_t g = 0; g < num_groups; g++) {
        uint32_t pages[15];
        size_t np = 0;
        CHECK_OK(kvs_hybrid_seq_pages(h, 2, g, pages, 15, &np));
        CHECK_EQ(np, 15);
        for (size_t j = 0; j < 10; j++) {
            CHECK_EQ(pages[j], KVS_NULL_PAGE);
        }
        for (size_t j = 10; j < 15; j++) {
            CHECK(pages[j] != KVS_NULL_PAGE);
        }
    }
    /* The cache is not poisoned: later calls work. */
    CHECK_OK(kvs_hybrid_seq_append(h, 2, t, 2, 0));
    CHECK_OK(kvs_hybrid_seq_release_skipped(h, 2, 32, NULL));
    CHECK_OK(kvs_hybrid_new_step(h));
    CHECK_OK(kvs_hybrid_seq_free(h, 1));
    CHECK_OK(kvs_hybrid_seq_free(h, 2));
    CHECK_OK(kvs_hybrid_check(h));
    kvs_group_stats st;
    CHECK_OK(kvs_hybrid_stats(h, 0, &st));
    CHECK_EQ(st.pool_pages_in_use, 0);
    CHECK_EQ(st.prefix_hit_tokens, 20);
}

int main(void) {
    const kvs_group one[1] = {{KVS_GROUP_KIND_CHUNKED_LOCAL, CHUNK, 4096}};
    kvs_hybrid *h = make(one, 1);
    scenario(h, 1);
    kvs_hybrid_free(h);
    /* Two chunked groups of different page bytes (two pools, one lookup set each). */
    const kvs_group two[2] = {
        {KVS_GROUP_KIND_CHUNKED_LOCAL, CHUNK, 4096},
        {KVS_GROUP_KIND_CHUNKED_LOCAL, CHUNK, 2048},
    };
    h = make(two, 2);
    scenario(h, 2);
    kvs_hybrid_free(h);
    printf("bug_hybrid_chunked_only_hit: ok\n");
    return 0;
}
