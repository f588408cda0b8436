/*
 * The basic lifecycle, as an engine drives it: default config, create, begin / append / fork /
 * free sequences, block tables and slot mapping for a batch (checked against the block tables
 * by hand), stats, check, free; kvs_cache_free(NULL); kvs_status_str of every status.
 */
#include "kvs_test.h"

#define PS 4u
#define NPAGES 16u

static void status_strings(void) {
    static const struct {
        uint32_t code;
        const char *name;
    } all[] = {
        {KVS_STATUS_OK, "KVS_STATUS_OK"},
        {KVS_STATUS_PANIC, "KVS_STATUS_PANIC"},
        {KVS_STATUS_NULL_ARGUMENT, "KVS_STATUS_NULL_ARGUMENT"},
        {KVS_STATUS_INVALID_ARGUMENT, "KVS_STATUS_INVALID_ARGUMENT"},
        {KVS_STATUS_BUFFER_TOO_SMALL, "KVS_STATUS_BUFFER_TOO_SMALL"},
        {KVS_STATUS_POISONED, "KVS_STATUS_POISONED"},
        {KVS_STATUS_UNSUPPORTED, "KVS_STATUS_UNSUPPORTED"},
        {KVS_STATUS_OUT_OF_MEMORY, "KVS_STATUS_OUT_OF_MEMORY"},
        {KVS_STATUS_INVALID_CONFIG, "KVS_STATUS_INVALID_CONFIG"},
        {KVS_STATUS_NO_SPACE, "KVS_STATUS_NO_SPACE"},
        {KVS_STATUS_PAGE_OUT_OF_RANGE, "KVS_STATUS_PAGE_OUT_OF_RANGE"},
        {KVS_STATUS_PAGE_NOT_ALLOCATED, "KVS_STATUS_PAGE_NOT_ALLOCATED"},
        {KVS_STATUS_REFCOUNT_UNDERFLOW, "KVS_STATUS_REFCOUNT_UNDERFLOW"},
        {KVS_STATUS_PADDING_PAGE, "KVS_STATUS_PADDING_PAGE"},
        {KVS_STATUS_REFCOUNT_OVERFLOW, "KVS_STATUS_REFCOUNT_OVERFLOW"},
        {KVS_STATUS_SEQ_NOT_FOUND, "KVS_STATUS_SEQ_NOT_FOUND"},
        {KVS_STATUS_SEQ_EXISTS, "KVS_STATUS_SEQ_EXISTS"},
        {KVS_STATUS_SEQ_WRONG_TIER, "KVS_STATUS_SEQ_WRONG_TIER"},
        {KVS_STATUS_INVARIANT_VIOLATION, "KVS_STATUS_INVARIANT_VIOLATION"},
        {KVS_STATUS_BACKEND_UNAVAILABLE, "KVS_STATUS_BACKEND_UNAVAILABLE"},
        {KVS_STATUS_ATTN_INVALID_ARGUMENT, "KVS_STATUS_ATTN_INVALID_ARGUMENT"},
        {KVS_STATUS_BACKEND_FAILURE, "KVS_STATUS_BACKEND_FAILURE"},
    };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        const char *s = kvs_status_str(all[i].code);
        CHECK(s != NULL);
        if (strcmp(s, all[i].name) != 0) {
            T_FAIL("kvs_status_str(%u) = \"%s\", want \"%s\"", all[i].code, s, all[i].name);
        }
        /* Every number names a distinct status. */
        for (size_t j = 0; j < i; j++) {
            CHECK(all[j].code != all[i].code);
        }
    }
    /* Numbers between the ranges and at the extremes are not statuses. */
    const uint32_t unknown[] = {8, 99, 101, 199, 206, 299, 303, 401, 499, 503, 9999, UINT32_MAX};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        const char *s = kvs_status_str(unknown[i]);
        CHECK(s != NULL);
        if (strcmp(s, "KVS_STATUS_UNKNOWN") != 0) {
            T_FAIL("kvs_status_str(%u) = \"%s\", want KVS_STATUS_UNKNOWN", unknown[i], s);
        }
    }
}

static void default_config(void) {
    kvs_config d = kvs_config_default();
    CHECK_EQ(d.page_size, 16);
    CHECK_EQ(d.num_device_pages, 1024);
    CHECK_EQ(d.num_host_pages, 0);
    CHECK_EQ(d.num_layers, 1);
    CHECK_EQ(d.num_kv_heads, 1);
    CHECK_EQ(d.head_dim, 128);
    CHECK_EQ(d.dtype, T_DTYPE_F16);
    CHECK(d.enable_prefix_caching);
    CHECK(!d.reserve_null_page);
    CHECK(!d.defer_commit);

    /* The default config is valid as it is, and round-trips through get_config. */
    kvs_cache *c = NULL;
    CHECK_OK(kvs_cache_new(&d, &c));
    CHECK(c != NULL);
    kvs_config got;
    memset(&got, 0xAB, sizeof got);
    CHECK_OK(kvs_cache_get_config(c, &got));
    CHECK_EQ(got.page_size, d.page_size);
    CHECK_EQ(got.num_device_pages, d.num_device_pages);
    CHECK_EQ(got.num_host_pages, d.num_host_pages);
    CHECK_EQ(got.dtype, d.dtype);
    CHECK(got.enable_prefix_caching == d.enable_prefix_caching);
    kvs_stats s = t_stats(c);
    CHECK_EQ(s.device_pages_total, 1024);
    CHECK_EQ(s.device_pages_free, 1024);
    /* 2 (K and V) * 1 layer * 16 tokens * 1 head * 128 * 2 bytes. */
    CHECK_EQ(s.page_bytes, 2u * 16u * 128u * 2u);
    CHECK_CACHE(c);
    kvs_cache_free(c);
}

/* Writes the block table of `id` to `pages` (capacity `cap`), returns its length. */
static size_t seq_pages(const kvs_cache *c, uint64_t id, uint32_t *pages, size_t cap) {
    size_t n = (size_t)-1;
    CHECK_OK(kvs_seq_pages(c, 0, id, pages, cap, &n));
    CHECK(n <= cap);
    return n;
}

static kvs_seq_info seq_info(const kvs_cache *c, uint64_t id) {
    kvs_seq_info i;
    memset(&i, 0xCD, sizeof i);
    CHECK_OK(kvs_seq_info_fn(c, id, &i));
    return i;
}

/* Counts the distinct page ids over several block tables. */
static uint64_t distinct_pages(uint32_t tables[][8], const size_t *lens, size_t n) {
    int seen[NPAGES] = {0};
    uint64_t count = 0;
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < lens[i]; j++) {
            CHECK(tables[i][j] < NPAGES);
            if (!seen[tables[i][j]]) {
                seen[tables[i][j]] = 1;
                count++;
            }
        }
    }
    return count;
}

static void lifecycle(void) {
    kvs_config cfg = kvs_config_default();
    cfg.page_size = PS;
    cfg.num_device_pages = NPAGES;
    cfg.reserve_null_page = true;
    cfg.num_layers = 2;
    cfg.num_kv_heads = 2;
    cfg.head_dim = 8;
    cfg.dtype = T_DTYPE_F32;

    kvs_cache *c = NULL;
    CHECK_OK(kvs_cache_new(&cfg, &c));
    CHECK(c != NULL);

    kvs_stats s = t_stats(c);
    CHECK_EQ(s.device_pages_total, NPAGES);
    CHECK_EQ(s.device_pages_free, NPAGES - 1); /* page 0 is the padding page */
    CHECK_EQ(s.device_pages_cached, 0);
    CHECK_EQ(s.device_pages_in_use, 0);
    CHECK_EQ(s.host_pages_total, 0);
    CHECK_EQ(s.num_seqs, 0);
    CHECK_EQ(s.page_bytes, 2u * 2u * PS * 2u * 8u * 4u);
    CHECK_EQ(t_page(c, T_TIER_DEVICE, 0).state, T_PAGE_PADDING);
    CHECK_CACHE(c);

    /* Sequence 1: 6 prompt tokens -> 2 pages; sequence 2: 3 tokens -> 1 page. */
    int32_t p1[6], p2[3];
    t_iota(p1, 6, 100);
    t_iota(p2, 3, 200);
    kvs_seq_info bi;
    memset(&bi, 0xEE, sizeof bi);
    CHECK_OK(kvs_seq_begin(c, 1, p1, 6, NULL, SIZE_MAX, 0, &bi));
    CHECK_EQ(bi.num_tokens, 6);
    CHECK_EQ(bi.num_pages, 2);
    CHECK_EQ(bi.matched_tokens, 0);
    CHECK_EQ(bi.new_pages, 2);
    CHECK_EQ(bi.tier, T_TIER_DEVICE);
    CHECK_OK(kvs_seq_begin(c, 2, p2, 3, NULL, SIZE_MAX, 0, NULL)); /* info_out is optional */
    CHECK_CACHE(c);

    uint32_t t[3][8];
    size_t n[3];
    n[0] = seq_pages(c, 1, t[0], 8);
    n[1] = seq_pages(c, 2, t[1], 8);
    CHECK_EQ(n[0], 2);
    CHECK_EQ(n[1], 1);
    for (int i = 0; i < 2; i++) {
        for (size_t j = 0; j < n[i]; j++) {
            CHECK(t[i][j] != 0 && t[i][j] < NPAGES);
            kvs_page_info pi = t_page(c, T_TIER_DEVICE, t[i][j]);
            CHECK_EQ(pi.refcount, 1);
            CHECK_EQ(pi.state, T_PAGE_IN_USE);
        }
    }
    CHECK_EQ(distinct_pages(t, n, 2), 3);
    /* Sequence 1's first page is full: registered in the prefix index. Partial pages are not. */
    CHECK(t_page(c, T_TIER_DEVICE, t[0][0]).registered);
    CHECK(!t_page(c, T_TIER_DEVICE, t[0][1]).registered);
    CHECK(!t_page(c, T_TIER_DEVICE, t[1][0]).registered);

    /* Append 3 tokens to sequence 1: 9 tokens, 3 pages, no copy. */
    int32_t a1[3];
    t_iota(a1, 3, 106);
    kvs_copy cp[4];
    size_t ncp = 99;
    CHECK_OK(kvs_seq_append(c, 1, a1, 3, 0, cp, 4, &ncp));
    CHECK_EQ(ncp, 0);
    kvs_seq_info si = seq_info(c, 1);
    CHECK_EQ(si.num_tokens, 9);
    CHECK_EQ(si.num_pages, 3);
    CHECK_EQ(si.matched_tokens, 0);
    CHECK_EQ(si.new_pages, 0);
    CHECK_EQ(si.tier, T_TIER_DEVICE);
    /* Sequence 2: one decode token plus 4 lookahead slots: 4 tokens, ceil(8/4) = 2 pages. */
    int32_t a2 = 203;
    CHECK_OK(kvs_seq_append(c, 2, &a2, 1, 4, NULL, 0, &ncp));
    CHECK_EQ(ncp, 0);
    si = seq_info(c, 2);
    CHECK_EQ(si.num_tokens, 4);
    CHECK_EQ(si.num_pages, 2);
    CHECK_CACHE(c);

    /* Fork sequence 1 into 3: every page shared. */
    CHECK_OK(kvs_seq_fork(c, 1, 3));
    n[0] = seq_pages(c, 1, t[0], 8);
    n[2] = seq_pages(c, 3, t[2], 8);
    CHECK_EQ(n[0], 3);
    CHECK_EQ(n[2], 3);
    for (size_t j = 0; j < 3; j++) {
        CHECK_EQ(t[2][j], t[0][j]);
        CHECK_EQ(t_page(c, T_TIER_DEVICE, t[0][j]).refcount, 2);
    }
    s = t_stats(c);
    CHECK_EQ(s.device_pages_shared, 3);
    CHECK_EQ(s.num_seqs, 3);
    CHECK_CACHE(c);

    /* Sequence 3 writes token 9 into its shared third page (holding token 8): copy-on-write. */
    uint32_t shared_last = t[0][2];
    int32_t a3 = 300;
    ncp = 99;
    CHECK_OK(kvs_seq_append(c, 3, &a3, 1, 0, cp, 4, &ncp));
    CHECK_EQ(ncp, 1);
    n[2] = seq_pages(c, 3, t[2], 8);
    CHECK_EQ(n[2], 3);
    CHECK_EQ(t[2][0], t[0][0]);
    CHECK_EQ(t[2][1], t[0][1]);
    CHECK(t[2][2] != shared_last);
    CHECK_EQ(cp[0].src_page, shared_last);
    CHECK_EQ(cp[0].dst_page, t[2][2]);
    CHECK_EQ(cp[0].num_tokens, 1);
    CHECK_EQ(cp[0].kind, T_COPY_D2D);
    CHECK_EQ(t_page(c, T_TIER_DEVICE, shared_last).refcount, 1);
    CHECK_EQ(t_page(c, T_TIER_DEVICE, t[2][2]).refcount, 1);
    CHECK_EQ(t_stats(c).cow_copies, 1);
    CHECK_CACHE(c);

    /* The batch: sequences 1 (9 tokens), 2 (4 tokens + lookahead), 3 (10 tokens). */
    n[0] = seq_pages(c, 1, t[0], 8);
    n[1] = seq_pages(c, 2, t[1], 8);
    n[2] = seq_pages(c, 3, t[2], 8);
    const uint64_t ids[3] = {1, 2, 3};
    int32_t table[3 * 4];
    int32_t lens[3];
    memset(table, 0x7F, sizeof table);
    CHECK_OK(kvs_cache_block_tables(c, 0, ids, 3, 4, -1, table, 12, lens, 3));
    const int32_t want_lens[3] = {9, 4, 10};
    for (size_t i = 0; i < 3; i++) {
        CHECK_EQ(lens[i], want_lens[i]);
        for (size_t j = 0; j < 4; j++) {
            int32_t want = j < n[i] ? (int32_t)t[i][j] : -1;
            if (table[i * 4 + j] != want) {
                T_FAIL("block table[%zu][%zu] = %d, want %d", i, j, table[i * 4 + j], want);
            }
        }
    }
    /* Without context lengths (NULL, 0), and with padding page 0. */
    CHECK_OK(kvs_cache_block_tables(c, 0, ids, 3, 4, 0, table, 12, NULL, 0));
    CHECK_EQ(table[1 * 4 + 2], 0);
    CHECK_EQ(table[1 * 4 + 3], 0);
    CHECK_EQ(table[0], t[0][0]);

    /* Slot mapping: 1 decode token for seq 1 (position 8), a 4-token chunk for seq 2
     * (positions 0..3), 2 tokens for seq 3 (positions 8, 9); 10 slots: 7 real + 3 padding. */
    const uint32_t q[3] = {1, 4, 2};
    int64_t slots[10];
    size_t nslots = 0;
    memset(slots, 0x55, sizeof slots);
    CHECK_OK(kvs_cache_slot_mapping(c, 0, ids, q, 3, slots, 10, &nslots));
    CHECK_EQ(nslots, 7);
    const int64_t want_slots[10] = {
        (int64_t)t[0][2] * PS + 0,
        (int64_t)t[1][0] * PS + 0,
        (int64_t)t[1][0] * PS + 1,
        (int64_t)t[1][0] * PS + 2,
        (int64_t)t[1][0] * PS + 3,
        (int64_t)t[2][2] * PS + 0,
        (int64_t)t[2][2] * PS + 1,
        -1,
        -1,
        -1,
    };
    for (size_t i = 0; i < 10; i++) {
        if (slots[i] != want_slots[i]) {
            T_FAIL("slot %zu = %" PRId64 ", want %" PRId64, i, slots[i], want_slots[i]);
        }
    }
    /* num_slots_out is optional; an exact-size buffer has no padding. */
    CHECK_OK(kvs_cache_slot_mapping(c, 0, ids, q, 3, slots, 7, NULL));
    CHECK_EQ(slots[6], (uint64_t)want_slots[6]);

    /* One decode step for the whole batch: no shared partial page any more, so no copies. */
    const int32_t step[3] = {110, 204, 301};
    ncp = 99;
    CHECK_OK(kvs_seq_append_batch(c, ids, 3, step, 3, cp, 3, &ncp));
    CHECK_EQ(ncp, 0);
    CHECK_EQ(seq_info(c, 1).num_tokens, 10);
    CHECK_EQ(seq_info(c, 2).num_tokens, 5);
    CHECK_EQ(seq_info(c, 2).num_pages, 2); /* the lookahead page absorbed token 4 */
    CHECK_EQ(seq_info(c, 3).num_tokens, 11);
    CHECK_CACHE(c);

    /* Stats: logical tokens per sequence vs physical slots of distinct pages. */
    n[0] = seq_pages(c, 1, t[0], 8);
    n[1] = seq_pages(c, 2, t[1], 8);
    n[2] = seq_pages(c, 3, t[2], 8);
    uint64_t in_use = distinct_pages(t, n, 3);
    s = t_stats(c);
    CHECK_EQ(s.num_seqs, 3);
    CHECK_EQ(s.num_seqs_swapped, 0);
    CHECK_EQ(s.logical_tokens, 10 + 5 + 11);
    CHECK_EQ(s.device_pages_in_use, in_use);
    CHECK_EQ(s.physical_tokens, in_use * PS);
    CHECK_EQ(s.device_pages_shared, 2); /* seq 1 and 3 still share their first two pages */
    CHECK_EQ(s.device_pages_free + s.device_pages_cached + s.device_pages_in_use, NPAGES - 1);

    /* Free everything; a second free of the same id is SEQ_NOT_FOUND. */
    for (uint64_t id = 1; id <= 3; id++) {
        CHECK_OK(kvs_seq_free(c, id));
        CHECK_CACHE(c);
    }
    CHECK_STATUS(kvs_seq_free(c, 2), KVS_STATUS_SEQ_NOT_FOUND);
    CHECK_MSG("2");
    s = t_stats(c);
    CHECK_EQ(s.num_seqs, 0);
    CHECK_EQ(s.device_pages_in_use, 0);
    CHECK_EQ(s.device_pages_shared, 0);
    CHECK_EQ(s.logical_tokens, 0);
    CHECK_EQ(s.physical_tokens, 0);
    /* Registered full pages stay cached; everything else is free. */
    CHECK_EQ(s.device_pages_cached, s.index_pages);
    CHECK_EQ(s.device_pages_free + s.device_pages_cached, NPAGES - 1);
    CHECK_CACHE(c);
    kvs_cache_free(c);
}

int main(void) {
    kvs_cache_free(NULL); /* a no-op */
    CHECK(kvs_last_error_message() != NULL);
    CHECK_EQ(strlen(kvs_last_error_message()), 0); /* nothing failed yet on this thread */
    status_strings();
    default_config();
    lifecycle();
    printf("lifecycle: ok\n");
    return 0;
}
