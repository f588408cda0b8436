/*
 * Bad input at every entry point a cache of KV-cache groups adds or changes (a `group`
 * argument, the groups of kvs_config, kvs_prefix_find, kvs_seq_release_skipped, the state
 * calls, the group views), on a cache of a sliding-window, a full-attention and a state group
 * (two pools), and at kvs_cpu_huge_pages: each pointer argument NULL in turn (where it is
 * required), misaligned pointers, zero and huge lengths (SIZE_MAX, lengths whose sums
 * overflow), unknown, freed and doubly freed sequence ids, bad group indices, short output
 * buffers, and every invalid config field (the message names it).
 *
 * Each call returns its documented status and names the argument in kvs_last_error_message;
 * out-params are untouched on error (filled with a sentinel before and compared after); the
 * cache's stats and every group's are unchanged by every failing call, which queues no event;
 * a failing kvs_cache_take_events takes nothing; a refused kvs_cpu_huge_pages leaves the
 * range's advice as it was; and kvs_cache_check is OK afterwards.
 *
 * What groups_bad_input.c (configs, NULL and misaligned pointers, group indices) and
 * groups_bad_input_lengths.c (unknown sequence ids, lengths and short buffers, kvs_cpu_huge_pages)
 * share: the checks and the fixture.
 */
#ifndef GROUPS_BAD_INPUT_H
#define GROUPS_BAD_INPUT_H

#include <stddef.h>

#include "kvs_test.h"

#define PS 4u
#define NG 3u
#define NPAGES 32u

static kvs_cache *h; /* the fixture every EXPECT compares stats on */

static const kvs_group GROUPS[NG] = {
    {KVS_GROUP_KIND_SLIDING_WINDOW, 8, 4096, 0},
    {KVS_GROUP_KIND_FULL, 0, 4096, 0},
    {KVS_GROUP_KIND_STATE, KVS_STATE_MODE_ALL, 2048, 0},
};

/* Copies an append may report (kvs_seq_append's out-params). */
static kvs_copy CP[8];
static size_t NC;

/* The cache's stats and every group's. */
typedef struct {
    kvs_stats cache;
    kvs_group_stats group[NG];
} all_stats_t;

static T_UNUSED void all_stats(all_stats_t *s) {
    memset(s, 0, sizeof *s);
    CHECK_OK(kvs_cache_stats(h, &s->cache));
    for (size_t g = 0; g < NG; g++) {
        CHECK_OK(kvs_cache_group_stats(h, g, &s->group[g]));
    }
}

/* After a failing call: its status, message, and unchanged, consistent stats. */
static T_UNUSED void expect_after(const all_stats_t *before, uint32_t got, uint32_t want,
                         const char *needle, const char *call, const char *file, int line) {
    if (got != want) {
        t_fail_status(file, line, call, got, want);
    }
    t_check_msg(file, line, needle);
    all_stats_t after;
    all_stats(&after);
    if (memcmp(before, &after, sizeof after) != 0) {
        fprintf(stderr, "%s:%d: failing call %s changed the stats\n", file, line, call);
        exit(1);
    }
    uint32_t st = (uint32_t)kvs_cache_check(h);
    if (st != KVS_STATUS_OK) {
        t_fail_status(file, line, "kvs_cache_check", st, KVS_STATUS_OK);
    }
}

/* `call` must return `status`, name `needle` in the message (NULL: any message), and leave
 * every stat unchanged and the cache consistent. */
#define EXPECT(call, status, needle)                                                   \
    do {                                                                               \
        all_stats_t before_;                                                           \
        all_stats(&before_);                                                           \
        uint32_t got_ = (uint32_t)(call);                                              \
        expect_after(&before_, got_, (uint32_t)(status), (needle), #call, __FILE__,     \
                     __LINE__);                                                        \
    } while (0)


/* Misaligned pointers of every type: one byte into a sentinel-filled buffer. */
static _Alignas(16) unsigned char raw[1024];
#define MIS(type) ((type *)(void *)(raw + 1))

static T_UNUSED kvs_config config_of(const kvs_group *g, size_t n) {
    kvs_config c = t_groups_config(PS, NPAGES, g, n);
    c.enable_events = true;
    return c;
}

/* Fixture: sequence 1 (10 tokens), sequence 2 (no tokens yet), sequence 3 begun and freed;
 * events drained, a step started. */
static int32_t t1[10];

static T_UNUSED void fixture(void) {
    kvs_config c = config_of(GROUPS, NG);
    CHECK_OK(kvs_cache_new(&c, &h));
    t_iota(t1, 10, 100);
    CHECK_OK(kvs_seq_begin(h, 1, t1, 10, NULL, 9, 0, NULL));
    CHECK_OK(kvs_seq_begin(h, 2, NULL, 0, NULL, 0, 0, NULL));
    CHECK_OK(kvs_seq_begin(h, 3, t1, 3, NULL, 0, 0, NULL));
    CHECK_OK(kvs_seq_free(h, 3));
    CHECK_OK(kvs_cache_new_step(h));
    kvs_event ev[64];
    size_t n = 0;
    do {
        CHECK_OK(kvs_cache_take_events(h, ev, 64, &n));
    } while (n == 64);
    CHECK_OK(kvs_cache_check(h));
    memset(raw, 0xA5, sizeof raw);
}

/* The fixture survives all of it intact; then it is freed and nothing is left. */
static T_UNUSED void fixture_intact_then_free(void) {
    kvs_seq_info si;
    CHECK_OK(kvs_seq_get_info(h, 1, &si));
    CHECK_EQ(si.num_tokens, 10);
    CHECK_EQ(si.num_pages, 3);
    CHECK_OK(kvs_seq_get_info(h, 2, &si));
    CHECK_EQ(si.num_tokens, 0);
    CHECK_OK(kvs_seq_free(h, 1));
    CHECK_OK(kvs_seq_free(h, 2));
    CHECK_OK(kvs_cache_check(h));
    for (size_t g = 0; g < NG; g++) {
        kvs_group_stats st;
        CHECK_OK(kvs_cache_group_stats(h, g, &st));
        CHECK_EQ(st.pool_pages_in_use, 0);
        CHECK_EQ(st.pages_held, 0);
    }
    CHECK_EQ(t_stats(h).num_seqs, 0);
    kvs_cache_free(h);
}

#endif /* GROUPS_BAD_INPUT_H */
