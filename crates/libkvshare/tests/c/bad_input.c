/*
 * Bad input at every entry point of the header: each pointer argument NULL in turn, zero and
 * huge lengths and ids (SIZE_MAX, UINT32_MAX, UINT64_MAX), stale arguments (double release,
 * release of a free page, out-of-range pages, the padding page, freed / existing / swapped-out
 * sequences), too-small output buffers, invalid configs (the message names the field), bad
 * tier and dtype numbers.
 *
 * Each call returns its documented status; out-params are untouched on error (filled with a
 * sentinel before and compared after); stats are unchanged by every failing call; and
 * kvs_cache_check is OK afterwards.
 */
#include "kvs_test.h"

#define PS 4u
#define NDEV 16u
#define NHOST 4u

static kvs_cache *c; /* the cache every EXPECT compares stats on */

/* After a failing call: its status, message and unchanged, consistent stats. */
static void expect_after(const kvs_stats *before, uint32_t got, uint32_t want, const char *needle,
                         const char *call, const char *file, int line) {
    if (got != want) {
        t_fail_status(file, line, call, got, want);
    }
    t_check_msg(file, line, needle);
    kvs_stats after;
    uint32_t st = (uint32_t)kvs_cache_stats(c, &after);
    if (st != KVS_STATUS_OK) {
        t_fail_status(file, line, "kvs_cache_stats", st, KVS_STATUS_OK);
    }
    if (memcmp(before, &after, sizeof after) != 0) {
        fprintf(stderr, "%s:%d: failing call %s changed the stats\n", file, line, call);
        exit(1);
    }
    st = (uint32_t)kvs_cache_check(c);
    if (st != KVS_STATUS_OK) {
        t_fail_status(file, line, "kvs_cache_check", st, KVS_STATUS_OK);
    }
}

/* `call` must return `status`, name `needle` in the message (NULL: any message), and leave
 * the stats of `c` unchanged and consistent. */
#define EXPECT(call, status, needle)                                                   \
    do {                                                                               \
        kvs_stats before_ = t_stats(c);                                                \
        uint32_t got_ = (uint32_t)(call);                                              \
        expect_after(&before_, got_, (uint32_t)(status), (needle), #call, __FILE__,     \
                     __LINE__);                                                        \
    } while (0)

/* Bytes of `p` are all `b`. */
static int all_bytes(const void *p, size_t n, unsigned char b) {
    const unsigned char *q = p;
    for (size_t i = 0; i < n; i++) {
        if (q[i] != b) {
            return 0;
        }
    }
    return 1;
}
#define UNTOUCHED(x) CHECK(all_bytes(&(x), sizeof(x), 0xA5))
#define SENTINEL(x) memset(&(x), 0xA5, sizeof(x))

static char dummy_object;
#define BOGUS_CACHE ((kvs_cache *)(void *)&dummy_object)

static kvs_config small_config(void) {
    kvs_config cfg = kvs_config_default();
    cfg.page_size = PS;
    cfg.num_device_pages = NDEV;
    cfg.num_host_pages = NHOST;
    cfg.reserve_null_page = true;
    return cfg;
}

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
    b = small_config(); b.dtype = 3; bad_config(b, "dtype");
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

/* Fixture: seq 1 (6 tokens, device), seq 2 (5 tokens, swapped out), page `held` allocated
 * through the page API. */
static uint32_t held;

static void fixture(void) {
    kvs_config cfg = small_config();
    CHECK_OK(kvs_cache_new(&cfg, &c));
    int32_t t1[6], t2[5];
    t_iota(t1, 6, 10);
    t_iota(t2, 5, 20);
    CHECK_OK(kvs_seq_begin(c, 1, t1, 6, NULL, SIZE_MAX, 0, NULL));
    CHECK_OK(kvs_seq_begin(c, 2, t2, 5, NULL, SIZE_MAX, 0, NULL));
    kvs_copy cp[4];
    size_t n;
    CHECK_OK(kvs_seq_swap_out(c, 2, cp, 4, &n));
    CHECK_EQ(n, 2);
    CHECK_OK(kvs_pages_alloc(c, 0, 1, &held, 1));
    CHECK_CACHE(c);
}

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
    CHECK_OK(kvs_prefix_match(off, 0, t, 4, NULL, SIZE_MAX, true, pg, 4, &n1, &n2));
    CHECK_EQ(n1, 0);
    CHECK_OK(kvs_pages_release(off, 0, &p, 1));
    CHECK_CACHE(off);
    kvs_cache_free(off);
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
    configs();
    fixture();
    null_cache();
    pages();
    prefix();
    seqs();
    batch_builders();
    one_group();
    /* The fixture survives all of it intact. */
    kvs_seq_info si;
    CHECK_OK(kvs_seq_info_fn(c, 1, &si));
    CHECK_EQ(si.num_tokens, 6);
    CHECK_OK(kvs_seq_info_fn(c, 2, &si));
    CHECK_EQ(si.tier, T_TIER_HOST);
    CHECK_EQ(t_page(c, T_TIER_DEVICE, held).refcount, 1);
    CHECK_OK(kvs_pages_release(c, 0, &held, 1));
    CHECK_OK(kvs_seq_free(c, 1));
    CHECK_OK(kvs_seq_free(c, 2));
    kvs_stats s = t_stats(c);
    CHECK_EQ(s.device_pages_in_use, 0);
    CHECK_EQ(s.host_pages_in_use, 0);
    CHECK_EQ(s.num_seqs, 0);
    CHECK_CACHE(c);
    kvs_cache_free(c);
    printf("bad_input: ok\n");
    return 0;
}
