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
 *
 * What bad_input.c (configs, the NULL cache, sequences, batch builders) and bad_input_pages.c
 * (pages, prefixes, the one group of a cache without groups) share: the checks and the fixture.
 */
#ifndef BAD_INPUT_H
#define BAD_INPUT_H

#include "kvs_test.h"

#define PS 4u
#define NDEV 16u
#define NHOST 4u

static kvs_cache *c; /* the cache every EXPECT compares stats on */

/* After a failing call: its status, message and unchanged, consistent stats. */
static T_UNUSED void expect_after(const kvs_stats *before, uint32_t got, uint32_t want, const char *needle,
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


static T_UNUSED kvs_config small_config(void) {
    kvs_config cfg = kvs_config_default();
    cfg.page_size = PS;
    cfg.num_device_pages = NDEV;
    cfg.num_host_pages = NHOST;
    cfg.reserve_null_page = true;
    return cfg;
}

/* Fixture: seq 1 (6 tokens, device), seq 2 (5 tokens, swapped out), page `held` allocated
 * through the page API. */
static uint32_t held;

static T_UNUSED void fixture(void) {
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

/* The fixture survives all of it intact; then it is freed and nothing is left. */
static T_UNUSED void fixture_intact_then_free(void) {
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
}

#endif /* BAD_INPUT_H */
