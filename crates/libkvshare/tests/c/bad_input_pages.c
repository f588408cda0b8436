/*
 * Bad input at the page and prefix entry points, and at every `group` argument of a cache
 * configured without groups; bad_input.h says what every call is held to.
 */
#include "bad_input.h"

static void pages(void) {
    uint32_t out[NDEV + 4];
    SENTINEL(out);
    /* alloc */
    EXPECT(kvs_pages_alloc(c, 0, 1, NULL, 4), KVS_STATUS_NULL_ARGUMENT, "pages_out");
    EXPECT(kvs_pages_alloc(c, 0, 1, NULL, 0), KVS_STATUS_BUFFER_TOO_SMALL, "pages_out");
    EXPECT(kvs_pages_alloc(c, 0, 3, out, 2), KVS_STATUS_BUFFER_TOO_SMALL, "pages_out");
    EXPECT(kvs_pages_alloc(c, 0, SIZE_MAX, out, 2), KVS_STATUS_BUFFER_TOO_SMALL, "pages_out");
    EXPECT(kvs_pages_alloc(c, 0, NDEV, out, NDEV + 4), KVS_STATUS_NO_SPACE, NULL);
    EXPECT(kvs_pages_alloc(c, 0, 2, out, SIZE_MAX), KVS_STATUS_INVALID_ARGUMENT, "pages_out");
    UNTOUCHED(out);
    {
        kvs_stats b = t_stats(c);
        CHECK_OK(kvs_pages_alloc(c, 0, 0, NULL, 0)); /* nothing asked, nothing done */
        CHECK_OK(kvs_pages_alloc(c, 0, 0, out, 4));
        kvs_stats a = t_stats(c);
        CHECK(memcmp(&a, &b, sizeof a) == 0);
        UNTOUCHED(out);
    }

    /* acquire: every failure is all or nothing */
    const uint32_t oob[] = {NDEV};
    const uint32_t huge[] = {UINT32_MAX};
    const uint32_t pad[] = {0};
    uint32_t free_page = 0;
    for (uint32_t p = 1; p < NDEV; p++) {
        if (t_page(c, T_TIER_DEVICE, p).state == T_PAGE_FREE) {
            free_page = p;
            break;
        }
    }
    CHECK(free_page != 0);
    const uint32_t freep[] = {free_page};
    const uint32_t mixed[] = {held, held, free_page};
    EXPECT(kvs_pages_acquire(c, 0, NULL, 1), KVS_STATUS_NULL_ARGUMENT, "pages");
    EXPECT(kvs_pages_acquire(c, 0, oob, 1), KVS_STATUS_PAGE_OUT_OF_RANGE, "16");
    EXPECT(kvs_pages_acquire(c, 0, huge, 1), KVS_STATUS_PAGE_OUT_OF_RANGE, "4294967295");
    EXPECT(kvs_pages_acquire(c, 0, pad, 1), KVS_STATUS_PADDING_PAGE, NULL);
    EXPECT(kvs_pages_acquire(c, 0, freep, 1), KVS_STATUS_PAGE_NOT_ALLOCATED, NULL);
    EXPECT(kvs_pages_acquire(c, 0, mixed, 3), KVS_STATUS_PAGE_NOT_ALLOCATED, NULL);
    EXPECT(kvs_pages_acquire(c, 0, &held, SIZE_MAX), KVS_STATUS_INVALID_ARGUMENT,
           "pages");
    CHECK_EQ(t_page(c, T_TIER_DEVICE, held).refcount, 1);
    CHECK_OK(kvs_pages_acquire(c, 0, NULL, 0));

    /* release */
    const uint32_t twice[] = {held, held};
    uint32_t seq_page[8];
    size_t n = 0;
    CHECK_OK(kvs_seq_pages(c, 0, 1, seq_page, 8, &n));
    EXPECT(kvs_pages_release(c, 0, NULL, 1), KVS_STATUS_NULL_ARGUMENT, "pages");
    EXPECT(kvs_pages_release(c, 0, oob, 1), KVS_STATUS_PAGE_OUT_OF_RANGE, NULL);
    EXPECT(kvs_pages_release(c, 0, huge, 1), KVS_STATUS_PAGE_OUT_OF_RANGE, NULL);
    EXPECT(kvs_pages_release(c, 0, pad, 1), KVS_STATUS_PADDING_PAGE, NULL);
    EXPECT(kvs_pages_release(c, 0, freep, 1), KVS_STATUS_REFCOUNT_UNDERFLOW, NULL);
    EXPECT(kvs_pages_release(c, 0, twice, 2), KVS_STATUS_REFCOUNT_UNDERFLOW, NULL);
    /* A sequence's reference is not the caller's to release. */
    EXPECT(kvs_pages_release(c, 0, seq_page, 1), KVS_STATUS_REFCOUNT_UNDERFLOW, NULL);
    CHECK_EQ(t_page(c, T_TIER_DEVICE, held).refcount, 1);
    CHECK_EQ(t_page(c, T_TIER_DEVICE, seq_page[0]).refcount, 1);
    CHECK_OK(kvs_pages_release(c, 0, NULL, 0));
    /* Release, then the same release again: a double free. */
    uint32_t extra_page;
    CHECK_OK(kvs_pages_alloc(c, 0, 1, &extra_page, 1));
    CHECK_OK(kvs_pages_release(c, 0, &extra_page, 1));
    CHECK_EQ(t_page(c, T_TIER_DEVICE, extra_page).state, T_PAGE_FREE);
    EXPECT(kvs_pages_release(c, 0, &extra_page, 1), KVS_STATUS_REFCOUNT_UNDERFLOW, NULL);

    /* page_info */
    kvs_page_info pi;
    SENTINEL(pi);
    EXPECT(kvs_page_info_fn(c, 2, 0, 1, &pi), KVS_STATUS_INVALID_ARGUMENT, "tier");
    EXPECT(kvs_page_info_fn(c, UINT32_MAX, 0, 1, &pi), KVS_STATUS_INVALID_ARGUMENT, "tier");
    EXPECT(kvs_page_info_fn(c, T_TIER_DEVICE, 0, NDEV, &pi), KVS_STATUS_PAGE_OUT_OF_RANGE, NULL);
    EXPECT(kvs_page_info_fn(c, T_TIER_DEVICE, 0, UINT32_MAX, &pi), KVS_STATUS_PAGE_OUT_OF_RANGE,
           NULL);
    EXPECT(kvs_page_info_fn(c, T_TIER_HOST, 0, NHOST, &pi), KVS_STATUS_PAGE_OUT_OF_RANGE, NULL);
    UNTOUCHED(pi);
    /* The padding page can be inspected. */
    kvs_page_info pp = t_page(c, T_TIER_DEVICE, 0);
    CHECK_EQ(pp.state, T_PAGE_PADDING);
    CHECK_EQ(pp.refcount, 0);
    CHECK(!pp.registered);
}

static void prefix(void) {
    int32_t t[8];
    t_iota(t, 8, 10); /* seq 1's prompt starts with these */
    uint32_t pg[4];
    size_t n1, n2;
    SENTINEL(pg);
    SENTINEL(n1);
    SENTINEL(n2);
    const uint32_t hp[2] = {held, held};
    const uint32_t pad[1] = {0};
    const uint32_t oob[1] = {NDEV};
    uint32_t free_page = 0;
    for (uint32_t p = 1; p < NDEV; p++) {
        if (t_page(c, T_TIER_DEVICE, p).state == T_PAGE_FREE) {
            free_page = p;
            break;
        }
    }
    const uint8_t salt[2] = {1, 2};
    kvs_extra_keys null_salt = {0, NULL, 2, NULL, 0};
    kvs_extra_keys null_mm = {0, salt, 2, NULL, 1};
    (void)salt;

    /* register */
    EXPECT(kvs_prefix_register(c, 0, NULL, 4, &held, 1, NULL, &n1), KVS_STATUS_NULL_ARGUMENT,
           "tokens");
    EXPECT(kvs_prefix_register(c, 0, t, 4, NULL, 1, NULL, &n1), KVS_STATUS_NULL_ARGUMENT, "pages");
    EXPECT(kvs_prefix_register(c, 0, t, 7, hp, 2, NULL, &n1), KVS_STATUS_INVALID_ARGUMENT,
           "pages");
    EXPECT(kvs_prefix_register(c, 0, t, 4, pad, 1, NULL, &n1), KVS_STATUS_PADDING_PAGE, NULL);
    EXPECT(kvs_prefix_register(c, 0, t, 4, oob, 1, NULL, &n1), KVS_STATUS_PAGE_OUT_OF_RANGE,
           NULL);
    EXPECT(kvs_prefix_register(c, 0, t, 4, &free_page, 1, NULL, &n1),
           KVS_STATUS_PAGE_NOT_ALLOCATED, NULL);
    EXPECT(kvs_prefix_register(c, 0, t, 4, &held, 1, &null_salt, &n1), KVS_STATUS_NULL_ARGUMENT,
           "salt");
    EXPECT(kvs_prefix_register(c, 0, t, 4, &held, 1, &null_mm, &n1), KVS_STATUS_NULL_ARGUMENT,
           "mm_items");
    EXPECT(kvs_prefix_register(c, 0, t, SIZE_MAX, &held, 1, NULL, &n1),
           KVS_STATUS_INVALID_ARGUMENT, "tokens");
    UNTOUCHED(n1);
    CHECK(!t_page(c, T_TIER_DEVICE, held).registered);
    {
        kvs_stats b = t_stats(c);
        CHECK_OK(kvs_prefix_register(c, 0, NULL, 0, NULL, 0, NULL, &n1));
        CHECK_EQ(n1, 0);
        /* Fewer pages than full token pages is fine; a partial page alone registers nothing. */
        CHECK_OK(kvs_prefix_register(c, 0, t, 3, NULL, 0, NULL, NULL));
        kvs_stats a = t_stats(c);
        CHECK(memcmp(&a, &b, sizeof a) == 0);
        SENTINEL(n1);
    }

    /* unregister: refused as a whole (a valid page before a bad one keeps its entry). */
    {
        kvs_stats b = t_stats(c);
        uint32_t sp[8];
        size_t k = 0;
        CHECK_OK(kvs_seq_pages(c, 0, 1, sp, 8, &k));
        CHECK(k > 0);
        bool reg = t_page(c, T_TIER_DEVICE, sp[0]).registered;
        const uint32_t then_pad[2] = {sp[0], 0};
        const uint32_t then_oob[2] = {sp[0], NDEV};
        EXPECT(kvs_prefix_unregister(c, 0, NULL, 1, &n1), KVS_STATUS_NULL_ARGUMENT, "pages");
        EXPECT(kvs_prefix_unregister(c, 0, then_pad, 2, &n1), KVS_STATUS_PADDING_PAGE, NULL);
        EXPECT(kvs_prefix_unregister(c, 0, then_oob, 2, &n1), KVS_STATUS_PAGE_OUT_OF_RANGE,
               NULL);
        UNTOUCHED(n1);
        CHECK_EQ(t_page(c, T_TIER_DEVICE, sp[0]).registered, reg);
        kvs_stats a = t_stats(c);
        CHECK(memcmp(&a, &b, sizeof a) == 0);
        /* No entry: nothing to drop (a free page, a held unregistered one). */
        CHECK_OK(kvs_prefix_unregister(c, 0, &free_page, 1, &n1));
        CHECK_EQ(n1, 0);
        CHECK_OK(kvs_prefix_unregister(c, 0, &held, 1, NULL));
        CHECK_OK(kvs_prefix_unregister(c, 0, NULL, 0, &n1));
        CHECK_EQ(n1, 0);
        a = t_stats(c);
        CHECK(memcmp(&a, &b, sizeof a) == 0);
        SENTINEL(n1);
    }

    /* match */
    EXPECT(kvs_prefix_match(c, 0, NULL, 4, NULL, SIZE_MAX, true, pg, 4, &n1, &n2),
           KVS_STATUS_NULL_ARGUMENT, "tokens");
    EXPECT(kvs_prefix_match(c, 0, t, 8, NULL, SIZE_MAX, true, NULL, 4, &n1, &n2),
           KVS_STATUS_NULL_ARGUMENT, "pages_out");
    EXPECT(kvs_prefix_match(c, 0, t, 8, &null_salt, SIZE_MAX, true, pg, 4, &n1, &n2),
           KVS_STATUS_NULL_ARGUMENT, "salt");
    EXPECT(kvs_prefix_match(c, 0, t, SIZE_MAX, NULL, SIZE_MAX, true, pg, 4, &n1, &n2),
           KVS_STATUS_INVALID_ARGUMENT, "tokens");
    /* seq 1's first page (tokens 10..13) is registered: a 1-page match needs 1 entry. */
    EXPECT(kvs_prefix_match(c, 0, t, 8, NULL, SIZE_MAX, true, pg, 0, &n1, &n2),
           KVS_STATUS_BUFFER_TOO_SMALL, "pages_out");
    EXPECT(kvs_prefix_match(c, 0, t, 8, NULL, SIZE_MAX, false, NULL, 0, &n1, &n2),
           KVS_STATUS_BUFFER_TOO_SMALL, "pages_out");
    UNTOUCHED(pg);
    UNTOUCHED(n1);
    UNTOUCHED(n2);
    {
        /* A miss needs no room; the count out-params are optional. */
        int32_t other[4] = {-5, 1, 2, 3};
        CHECK_OK(kvs_prefix_match(c, 0, other, 4, NULL, SIZE_MAX, false, NULL, 0, &n1, &n2));
        CHECK_EQ(n1, 0);
        CHECK_EQ(n2, 0);
        CHECK_OK(kvs_prefix_match(c, 0, t, 8, NULL, 0, false, NULL, 0, NULL, NULL));
        CHECK_OK(kvs_prefix_match(c, 0, NULL, 0, NULL, SIZE_MAX, false, NULL, 0, NULL, NULL));
        SENTINEL(n1);
        SENTINEL(n2);
    }

    /* With prefix caching off, register is unsupported and match finds nothing. */
    kvs_config cfg = small_config();
    cfg.enable_prefix_caching = false;
    kvs_cache *off = NULL;
    CHECK_OK(kvs_cache_new(&cfg, &off));
    uint32_t p;
    CHECK_OK(kvs_pages_alloc(off, 0, 1, &p, 1));
    CHECK_STATUS(kvs_prefix_register(off, 0, t, 4, &p, 1, NULL, &n1), KVS_STATUS_UNSUPPORTED);
    UNTOUCHED(n1);
    /* Nothing is ever registered without prefix caching: nothing to drop. */
    CHECK_OK(kvs_prefix_unregister(off, 0, &p, 1, &n1));
    CHECK_EQ(n1, 0);
    SENTINEL(n1);
    CHECK_OK(kvs_prefix_match(off, 0, t, 4, NULL, SIZE_MAX, true, pg, 4, &n1, &n2));
    CHECK_EQ(n1, 0);
    CHECK_OK(kvs_pages_release(off, 0, &p, 1));
    CHECK_CACHE(off);
    kvs_cache_free(off);
}

/* A cache configured without groups is one full-attention group: group 0 everywhere, any other
 * index refused by every call taking one, no state page, nothing to release. */
static void one_group(void) {
    int32_t t[8];
    t_iota(t, 8, 10); /* seq 1's prompt starts with these */
    uint64_t one[1] = {1};
    uint32_t q[1] = {1};
    uint32_t pg[8];
    int32_t table[8];
    int64_t slots[4];
    size_t n1, n2;
    uint32_t page;
    kvs_page_info pi;
    kvs_group_info gi;
    kvs_group_stats gs;
    SENTINEL(pg);
    SENTINEL(table);
    SENTINEL(slots);
    SENTINEL(n1);
    SENTINEL(n2);
    SENTINEL(page);
    SENTINEL(pi);
    SENTINEL(gi);
    SENTINEL(gs);
    const size_t bad[] = {1, SIZE_MAX};
    for (size_t i = 0; i < 2; i++) {
        size_t g = bad[i];
        EXPECT(kvs_cache_group_info(c, g, &gi), KVS_STATUS_INVALID_ARGUMENT, "group");
        EXPECT(kvs_cache_group_stats(c, g, &gs), KVS_STATUS_INVALID_ARGUMENT, "group");
        EXPECT(kvs_cache_available(c, T_TIER_DEVICE, g, &n1), KVS_STATUS_INVALID_ARGUMENT,
               "group");
        EXPECT(kvs_page_get_info(c, T_TIER_DEVICE, g, 1, &pi), KVS_STATUS_INVALID_ARGUMENT,
               "group");
        EXPECT(kvs_pages_alloc(c, g, 1, pg, 8), KVS_STATUS_INVALID_ARGUMENT, "group");
        EXPECT(kvs_pages_acquire(c, g, &held, 1), KVS_STATUS_INVALID_ARGUMENT, "group");
        EXPECT(kvs_pages_release(c, g, &held, 1), KVS_STATUS_INVALID_ARGUMENT, "group");
        EXPECT(kvs_prefix_register(c, g, t, 4, &held, 1, NULL, &n1),
               KVS_STATUS_INVALID_ARGUMENT, "group");
        EXPECT(kvs_prefix_unregister(c, g, &held, 1, &n1), KVS_STATUS_INVALID_ARGUMENT, "group");
        EXPECT(kvs_prefix_match(c, g, t, 8, NULL, SIZE_MAX, true, pg, 8, &n1, &n2),
               KVS_STATUS_INVALID_ARGUMENT, "group");
        EXPECT(kvs_seq_pages(c, g, 1, pg, 8, &n1), KVS_STATUS_INVALID_ARGUMENT, "group");
        EXPECT(kvs_cache_block_tables(c, g, one, 1, 8, 0, table, 8, NULL, 0),
               KVS_STATUS_INVALID_ARGUMENT, "group");
        EXPECT(kvs_cache_slot_mapping(c, g, one, q, 1, slots, 4, &n1),
               KVS_STATUS_INVALID_ARGUMENT, "group");
        EXPECT(kvs_seq_state_page(c, 1, g, &page), KVS_STATUS_INVALID_ARGUMENT, "group");
    }
    /* Full attention keeps no state. */
    EXPECT(kvs_seq_state_page(c, 1, 0, &page), KVS_STATUS_INVALID_ARGUMENT, "group");
    /* kvs_prefix_find: one row; short rows and buffers, NULL pointers with lengths. */
    EXPECT(kvs_prefix_find(c, t, 8, NULL, SIZE_MAX, pg, 8, 0, &n1),
           KVS_STATUS_BUFFER_TOO_SMALL, "pages_out");
    EXPECT(kvs_prefix_find(c, t, 8, NULL, SIZE_MAX, pg, 1, 2, &n1),
           KVS_STATUS_BUFFER_TOO_SMALL, "pages_out");
    EXPECT(kvs_prefix_find(c, t, 8, NULL, SIZE_MAX, NULL, 1, 1, &n1), KVS_STATUS_NULL_ARGUMENT,
           "pages_out");
    EXPECT(kvs_prefix_find(c, NULL, 8, NULL, SIZE_MAX, pg, 8, 8, &n1), KVS_STATUS_NULL_ARGUMENT,
           "tokens");
    EXPECT(kvs_prefix_find(c, t, 8, NULL, SIZE_MAX, pg, 8, 8, NULL), KVS_STATUS_NULL_ARGUMENT,
           "matched_tokens_out");
    /* A swapped-out sequence releases nothing and has no state to show. */
    EXPECT(kvs_seq_release_skipped(c, 2, 5, &n1), KVS_STATUS_SEQ_WRONG_TIER, NULL);
    EXPECT(kvs_seq_release_skipped(c, 50, 5, &n1), KVS_STATUS_SEQ_NOT_FOUND, "50");
    /* Computed tokens: an unknown sequence, more tokens than the sequence holds. */
    EXPECT(kvs_seq_set_computed(c, 50, 0), KVS_STATUS_SEQ_NOT_FOUND, "50");
    EXPECT(kvs_seq_set_computed(c, 1, SIZE_MAX), KVS_STATUS_INVALID_ARGUMENT,
           "num_computed_tokens");
    UNTOUCHED(pg);
    UNTOUCHED(table);
    UNTOUCHED(slots);
    UNTOUCHED(n1);
    UNTOUCHED(n2);
    UNTOUCHED(page);
    UNTOUCHED(pi);
    UNTOUCHED(gi);
    UNTOUCHED(gs);
    /* What works: group 0 is the one full-attention group; no position is ever released;
     * the cross-group hit is group 0's match (seq 1's first page, read-only). */
    CHECK_OK(kvs_cache_group_info(c, 0, &gi));
    CHECK_EQ(gi.kind, KVS_GROUP_KIND_FULL);
    CHECK_EQ(gi.num_groups, 1);
    CHECK_EQ(gi.num_pools, 1);
    kvs_stats before = t_stats(c);
    CHECK_OK(kvs_seq_release_skipped(c, 1, 6, &n1));
    CHECK_EQ(n1, 0);
    CHECK_OK(kvs_prefix_find(c, t, 8, NULL, SIZE_MAX, pg, 8, 8, &n2));
    CHECK_EQ(n2, PS);
    uint32_t seq_pages[4];
    size_t n = 0;
    CHECK_OK(kvs_seq_pages(c, 0, 1, seq_pages, 4, &n));
    CHECK_EQ(pg[0], seq_pages[0]);
    CHECK_OK(kvs_cache_new_step(c));
    kvs_stats after = t_stats(c);
    CHECK(memcmp(&before, &after, sizeof after) == 0);
    CHECK_CACHE(c);
}

int main(void) {
    fixture();
    pages();
    prefix();
    one_group();
    fixture_intact_then_free();
    printf("bad_input_pages: ok\n");
    return 0;
}
