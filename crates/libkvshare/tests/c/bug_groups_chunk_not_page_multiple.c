/*
 * Regression: a chunked-local group whose chunk is not a multiple of the page size was accepted
 * and then got wrong block tables. Page size 4, full attention + chunk 6: a prompt whose chunk
 * pages 4 and 5 were evicted matched 16 tokens with the chunk group's pages all null, but token
 * 16's chunk starts at 12, so attention needed the KV of tokens 12..15 (page 3, still cached).
 * vLLM refuses such chunks too (its local-attention metadata builder asserts
 * `attn_chunk_size % block_size == 0`), so kvs_cache_new refuses them with
 * KVS_STATUS_INVALID_CONFIG naming groups.window, and leaves the handle untouched. Chunks that
 * are page multiples (the page itself included) are accepted, and the scenario then gives the
 * chunk group every page the first token to compute reads.
 */
#include "kvs_test.h"

#define PS 4u

static kvs_config cfg_of(const kvs_group *g, size_t n) {
    return t_groups_config(PS, 17, g, n);
}

static void refused(uint32_t chunk) {
    const kvs_group g[2] = {
        {KVS_GROUP_KIND_FULL, 0, 4096, 0},
        {KVS_GROUP_KIND_CHUNKED_LOCAL, chunk, 4096, 0},
    };
    kvs_config c = cfg_of(g, 2);
    kvs_cache *h = (kvs_cache *)(uintptr_t)0x1;
    CHECK_FAILS(kvs_cache_new(&c, &h), KVS_STATUS_INVALID_CONFIG, "groups.window");
    CHECK_MSG("page_size");
    CHECK(h == (kvs_cache *)(uintptr_t)0x1);
    /* Alone, too. */
    c = cfg_of(g + 1, 1);
    CHECK_FAILS(kvs_cache_new(&c, &h), KVS_STATUS_INVALID_CONFIG, "groups.window");
    CHECK(h == (kvs_cache *)(uintptr_t)0x1);
}

int main(void) {
    refused(6);
    refused(2);
    refused(5);
    refused(UINT32_MAX);

    /* Page multiples: the scenario with chunk 8. */
    const kvs_group g[2] = {
        {KVS_GROUP_KIND_FULL, 0, 4096, 0},
        {KVS_GROUP_KIND_CHUNKED_LOCAL, 8, 4096, 0},
    };
    kvs_config c = cfg_of(g, 2);
    kvs_cache *h = NULL;
    CHECK_OK(kvs_cache_new(&c, &h));
    int32_t a[24], b[12];
    for (int i = 0; i < 24; i++) {
        a[i] = 100 + i;
    }
    for (int i = 0; i < 12; i++) {
        b[i] = 900 + i;
    }
    CHECK_OK(kvs_seq_begin(h, 1, a, 24, NULL, 0, 0, NULL));
    /* All 24 computed: the chunk group reads none of them any more (released, still cached). */
    size_t released = 0;
    CHECK_OK(kvs_seq_release_skipped(h, 1, 24, &released));
    CHECK_EQ(released, 6);
    /* 4 free pages left: b's 6 pages evict the two oldest cached ones, a's chunk pages 5, 4. */
    CHECK_OK(kvs_seq_begin(h, 2, b, 12, NULL, 0, 0, NULL));
    CHECK_CACHE(h);
    uint32_t m[2 * 6];
    size_t matched = 0;
    CHECK_OK(kvs_prefix_find(h, a, 24, NULL, 20, m, 12, 6, &matched));
    /* Full hit 20; token 20's chunk (16..23) lacks page 4: hit 16, whose chunk starts at 16. */
    CHECK_EQ(matched, 16);
    CHECK_OK(kvs_seq_free(h, 2));
    /* Without the eviction of page 4: hit 20, and the chunk group holds page 4 (16..19). */
    int32_t a2[24];
    memcpy(a2, a, sizeof a2);
    CHECK_OK(kvs_seq_free(h, 1));
    CHECK_OK(kvs_seq_begin(h, 3, a2, 24, NULL, 0, 0, NULL));
    CHECK_OK(kvs_seq_free(h, 3));
    kvs_seq_info bi;
    CHECK_OK(kvs_seq_begin(h, 4, a2, 24, NULL, 20, 0, &bi));
    CHECK_EQ(bi.matched_tokens, 20);
    uint32_t chunk4[6];
    CHECK_EQ(t_pages(h, 1, 4, chunk4, 6), 6);
    for (size_t j = 0; j < 4; j++) {
        CHECK_EQ(chunk4[j], KVS_NULL_PAGE);
    }
    CHECK(chunk4[4] != KVS_NULL_PAGE);
    CHECK(chunk4[5] != KVS_NULL_PAGE);
    CHECK_OK(kvs_seq_free(h, 4));
    CHECK_CACHE(h);
    kvs_cache_free(h);
    printf("bug_groups_chunk_not_page_multiple: ok\n");
    return 0;
}
