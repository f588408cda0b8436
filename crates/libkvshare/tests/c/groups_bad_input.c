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
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS under -std=c11 */
#include <stddef.h>
#include <sys/mman.h>

#include "kvs_test.h"

#define PS 4u
#define NG 3u
#define NPAGES 32u

static kvs_cache *h; /* the fixture every EXPECT compares stats on */

static const kvs_group GROUPS[NG] = {
    {KVS_GROUP_KIND_SLIDING_WINDOW, 8, 4096},
    {KVS_GROUP_KIND_FULL, 0, 4096},
    {KVS_GROUP_KIND_STATE, KVS_STATE_MODE_ALL, 2048},
};

/* Copies an append may report (kvs_seq_append's out-params). */
static kvs_copy CP[8];
static size_t NC;

/* The cache's stats and every group's. */
typedef struct {
    kvs_stats cache;
    kvs_group_stats group[NG];
} all_stats_t;

static void all_stats(all_stats_t *s) {
    memset(s, 0, sizeof *s);
    CHECK_OK(kvs_cache_stats(h, &s->cache));
    for (size_t g = 0; g < NG; g++) {
        CHECK_OK(kvs_cache_group_stats(h, g, &s->group[g]));
    }
}

/* After a failing call: its status, message, and unchanged, consistent stats. */
static void expect_after(const all_stats_t *before, uint32_t got, uint32_t want,
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

static int all_bytes(const void *p, size_t n, unsigned char b) {
    const unsigned char *q = p;
    for (size_t i = 0; i < n; i++) {
        if (q[i] != b) {
            return 0;
        }
    }
    return 1;
}
#define SENTINEL(x) memset(&(x), 0xA5, sizeof(x))
#define UNTOUCHED(x) CHECK(all_bytes(&(x), sizeof(x), 0xA5))

/* Misaligned pointers of every type: one byte into a sentinel-filled buffer. */
static _Alignas(16) unsigned char raw[1024];
#define MIS(type) ((type *)(void *)(raw + 1))

static char dummy_object;
#define BOGUS ((kvs_cache *)(void *)&dummy_object)

static kvs_config config_of(const kvs_group *g, size_t n) {
    kvs_config c = t_groups_config(PS, NPAGES, g, n);
    c.enable_events = true;
    return c;
}

static void bad_config(kvs_config c, uint32_t status, const char *field) {
    kvs_cache *out = BOGUS;
    CHECK_FAILS(kvs_cache_new(&c, &out), status, field);
    CHECK(out == BOGUS);
}

static void bad_group(kvs_group g, bool caching, const char *field) {
    kvs_group two[2] = {GROUPS[1], g};
    kvs_config c = config_of(two, 2);
    c.enable_prefix_caching = caching;
    bad_config(c, KVS_STATUS_INVALID_CONFIG, field);
}

static void configs(void) {
    kvs_config c = config_of(GROUPS, NG);
    kvs_cache *out = BOGUS;
    CHECK_FAILS(kvs_cache_new(NULL, &out), KVS_STATUS_NULL_ARGUMENT, "config");
    CHECK(out == BOGUS);
    CHECK_FAILS(kvs_cache_new(&c, NULL), KVS_STATUS_NULL_ARGUMENT, "cache_out");
    CHECK_FAILS(kvs_cache_new(&c, MIS(kvs_cache *)), KVS_STATUS_INVALID_ARGUMENT, "cache_out");
    memcpy(raw + 1, &c, sizeof c);
    CHECK_FAILS(kvs_cache_new(MIS(kvs_config), &out), KVS_STATUS_INVALID_ARGUMENT, "config");
    CHECK(out == BOGUS);
    memset(raw, 0xA5, sizeof raw);

    /* The groups array. */
    c = config_of(NULL, 2);
    bad_config(c, KVS_STATUS_NULL_ARGUMENT, "config.groups");
    memcpy(raw + 1, GROUPS, sizeof GROUPS);
    c = config_of(MIS(kvs_group), NG);
    bad_config(c, KVS_STATUS_INVALID_ARGUMENT, "config.groups");
    memset(raw, 0xA5, sizeof raw);
    kvs_group many[KVS_MAX_GROUPS + 1];
    for (size_t i = 0; i < KVS_MAX_GROUPS + 1; i++) {
        many[i] = GROUPS[1];
    }
    bad_config(config_of(many, KVS_MAX_GROUPS + 1), KVS_STATUS_INVALID_CONFIG, "num_groups");
    bad_config(config_of(GROUPS, SIZE_MAX), KVS_STATUS_INVALID_CONFIG, "num_groups");
    /* A count past the limit is refused before the array is read (NULL here). */
    bad_config(config_of(NULL, KVS_MAX_GROUPS + 1), KVS_STATUS_INVALID_CONFIG, "num_groups");

    /* Geometry. */
    const uint32_t bad_ps[] = {0, KVS_MAX_PAGE_SIZE + 1, UINT32_MAX};
    for (size_t i = 0; i < 3; i++) {
        c = config_of(GROUPS, NG);
        c.page_size = bad_ps[i];
        bad_config(c, KVS_STATUS_INVALID_CONFIG, "page_size");
    }
    const uint32_t bad_np[] = {0, 1, (1u << 30) + 1, UINT32_MAX};
    for (size_t i = 0; i < 4; i++) {
        c = config_of(GROUPS, NG);
        c.num_device_pages = bad_np[i];
        bad_config(c, KVS_STATUS_INVALID_CONFIG, "num_device_pages");
    }

    /* Bool bytes other than 0 and 1, every bool field. */
    const struct {
        size_t offset;
        const char *field;
    } bools[] = {
        {offsetof(kvs_config, enable_prefix_caching), "enable_prefix_caching"},
        {offsetof(kvs_config, reserve_null_page), "reserve_null_page"},
        {offsetof(kvs_config, defer_commit), "defer_commit"},
        {offsetof(kvs_config, skip_cached_writes), "skip_cached_writes"},
        {offsetof(kvs_config, demote_to_host), "demote_to_host"},
        {offsetof(kvs_config, enable_events), "enable_events"},
        {offsetof(kvs_config, vllm_free_order), "vllm_free_order"},
    };
    for (size_t i = 0; i < sizeof bools / sizeof bools[0]; i++) {
        const unsigned char bytes[] = {2, 0xff};
        for (size_t j = 0; j < 2; j++) {
            c = config_of(GROUPS, NG);
            memcpy((unsigned char *)&c + bools[i].offset, &bytes[j], 1);
            bad_config(c, KVS_STATUS_INVALID_CONFIG, bools[i].field);
        }
    }

    /* Groups. */
    bad_group((kvs_group){4, 0, 1}, true, "groups.kind");
    bad_group((kvs_group){UINT32_MAX, 0, 1}, true, "groups.kind");
    bad_group((kvs_group){KVS_GROUP_KIND_FULL, 1, 1}, true, "groups.window");
    bad_group((kvs_group){KVS_GROUP_KIND_SLIDING_WINDOW, 0, 1}, true, "groups.window");
    bad_group((kvs_group){KVS_GROUP_KIND_CHUNKED_LOCAL, 0, 1}, true, "groups.window");
    bad_group((kvs_group){KVS_GROUP_KIND_CHUNKED_LOCAL, PS + 2, 1}, true, "groups.window");
    bad_group((kvs_group){KVS_GROUP_KIND_CHUNKED_LOCAL, UINT32_MAX, 1}, true, "groups.window");
    bad_group((kvs_group){KVS_GROUP_KIND_STATE, 3, 1}, true, "groups.window");
    bad_group((kvs_group){KVS_GROUP_KIND_STATE, UINT32_MAX, 1}, true, "groups.window");
    bad_group((kvs_group){KVS_GROUP_KIND_STATE, KVS_STATE_MODE_NONE, 1}, true, "groups.window");
    bad_group((kvs_group){KVS_GROUP_KIND_STATE, KVS_STATE_MODE_ALL, 1}, false, "groups.window");
    bad_group((kvs_group){KVS_GROUP_KIND_STATE, KVS_STATE_MODE_ALIGN, 1}, false,
              "groups.window");
    /* Combinations: every kind but full attention needs the null page; a state group keeps
     * page-aligned checkpoints only; deferred commits need prefix caching. */
    c = config_of(GROUPS, NG);
    c.reserve_null_page = false;
    bad_config(c, KVS_STATUS_INVALID_CONFIG, "reserve_null_page");
    c = config_of(GROUPS, NG);
    c.match_unit = 1;
    bad_config(c, KVS_STATUS_INVALID_CONFIG, "match_unit");
    c = config_of(GROUPS, 2); /* no state group: finer units are fine */
    c.match_unit = 1;
    CHECK_OK(kvs_cache_new(&c, &out));
    kvs_cache_free(out);
    c = config_of(GROUPS, 2);
    c.enable_prefix_caching = false;
    c.defer_commit = true;
    bad_config(c, KVS_STATUS_INVALID_CONFIG, "defer_commit");

    /* The boundaries are valid; page bytes 0 are the geometry's. */
    c = config_of(many, KVS_MAX_GROUPS);
    c.page_size = KVS_MAX_PAGE_SIZE;
    c.num_device_pages = 2;
    CHECK_OK(kvs_cache_new(&c, &out));
    CHECK_OK(kvs_cache_check(out));
    kvs_cache_free(out);
    kvs_group wide[3] = {{KVS_GROUP_KIND_SLIDING_WINDOW, UINT32_MAX, UINT64_MAX},
                         {KVS_GROUP_KIND_CHUNKED_LOCAL, PS * 1000, 1},
                         {KVS_GROUP_KIND_FULL, 0, 0}};
    c = config_of(wide, 3);
    CHECK_OK(kvs_cache_new(&c, &out));
    kvs_group_info gi;
    CHECK_OK(kvs_cache_group_info(out, 2, &gi));
    CHECK_EQ(gi.page_bytes, 2u * PS * 128u * 2u);
    CHECK_EQ(gi.num_pools, 3);
    kvs_cache_free(out);
    c = config_of(GROUPS, 0); /* no groups: one full-attention group */
    CHECK_OK(kvs_cache_new(&c, &out));
    CHECK_OK(kvs_cache_group_info(out, 0, &gi));
    CHECK_EQ(gi.kind, KVS_GROUP_KIND_FULL);
    CHECK_EQ(gi.num_groups, 1);
    kvs_cache_free(out);
    kvs_cache_free(NULL);
}

/* Fixture: sequence 1 (10 tokens), sequence 2 (no tokens yet), sequence 3 begun and freed;
 * events drained, a step started. */
static int32_t t1[10];

static void fixture(void) {
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

/* Every call with a NULL handle, and every required out-param NULL. */
static void nulls(void) {
    int32_t tok[4] = {1, 2, 3, 4};
    uint64_t ids[1] = {1};
    uint32_t q[1] = {1};
    kvs_group_info gi;
    kvs_seq_info bi;
    kvs_seq_info si;
    kvs_group_stats st;
    kvs_page_info pi;
    kvs_event ev[4];
    uint32_t pages[16];
    int32_t table[16];
    int32_t lens[2];
    int64_t slots[4];
    size_t n1, n2;
    uint32_t page;
    SENTINEL(gi);
    SENTINEL(pi);
    SENTINEL(bi);
    SENTINEL(si);
    SENTINEL(st);
    SENTINEL(ev);
    SENTINEL(pages);
    SENTINEL(table);
    SENTINEL(lens);
    SENTINEL(slots);
    SENTINEL(n1);
    SENTINEL(n2);
    SENTINEL(page);
    EXPECT(kvs_cache_check(NULL), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_cache_group_info(NULL, 0, &gi), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_prefix_find(NULL, tok, 4, NULL, 3, pages, 16, 4, &n1),
           KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_seq_begin(NULL, 50, tok, 4, NULL, 3, 0, &bi), KVS_STATUS_NULL_ARGUMENT,
           "cache");
    EXPECT(kvs_seq_release_skipped(NULL, 1, 4, &n1), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_seq_append(NULL, 1, tok, 1, 0, CP, 8, &NC), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_seq_append_need(NULL, 1, 1, 0, &n1, NULL), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_seq_free(NULL, 1), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_seq_get_info(NULL, 1, &si), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_seq_pages(NULL, 0, 1, pages, 16, &n1), KVS_STATUS_NULL_ARGUMENT,
           "cache");
    EXPECT(kvs_cache_block_tables(NULL, 0, ids, 1, 8, -1, table, 16, lens, 2),
           KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_cache_slot_mapping(NULL, 0, ids, q, 1, slots, 4, &n1),
           KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_cache_group_stats(NULL, 0, &st), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_cache_take_events(NULL, ev, 4, &n1), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_cache_new_step(NULL), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_seq_state_page(NULL, 1, 2, &page), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_pages_alloc(NULL, 2, 1, pages, 16), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_pages_acquire(NULL, 2, pages, 0), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_pages_release(NULL, 2, pages, 0), KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_page_get_info(NULL, KVS_TIER_DEVICE, 2, 1, &pi), KVS_STATUS_NULL_ARGUMENT,
           "cache");
    EXPECT(kvs_prefix_register(NULL, 2, tok, 4, NULL, 0, NULL, &n1), KVS_STATUS_NULL_ARGUMENT,
           "cache");
    EXPECT(kvs_prefix_match(NULL, 2, tok, 4, NULL, 3, false, pages, 16, &n1, &n2),
           KVS_STATUS_NULL_ARGUMENT, "cache");
    EXPECT(kvs_cache_available(NULL, KVS_TIER_DEVICE, 2, &n1), KVS_STATUS_NULL_ARGUMENT,
           "cache");
    /* Required out-params. */
    EXPECT(kvs_cache_group_info(h, 0, NULL), KVS_STATUS_NULL_ARGUMENT, "info_out");
    EXPECT(kvs_prefix_find(h, tok, 4, NULL, 3, pages, 16, 4, NULL), KVS_STATUS_NULL_ARGUMENT,
           "matched_tokens_out");
    EXPECT(kvs_seq_append_need(h, 1, 1, 0, NULL, NULL), KVS_STATUS_NULL_ARGUMENT,
           "pages_needed_out");
    EXPECT(kvs_seq_get_info(h, 1, NULL), KVS_STATUS_NULL_ARGUMENT, "info_out");
    EXPECT(kvs_seq_pages(h, 0, 1, pages, 16, NULL), KVS_STATUS_NULL_ARGUMENT,
           "num_pages_out");
    EXPECT(kvs_cache_group_stats(h, 0, NULL), KVS_STATUS_NULL_ARGUMENT, "stats_out");
    EXPECT(kvs_cache_take_events(h, ev, 4, NULL), KVS_STATUS_NULL_ARGUMENT, "num_events_out");
    EXPECT(kvs_seq_state_page(h, 1, 2, NULL), KVS_STATUS_NULL_ARGUMENT, "page_out");
    EXPECT(kvs_page_get_info(h, KVS_TIER_DEVICE, 2, 1, NULL), KVS_STATUS_NULL_ARGUMENT,
           "info_out");
    EXPECT(kvs_cache_available(h, KVS_TIER_DEVICE, 2, NULL), KVS_STATUS_NULL_ARGUMENT,
           "pages_out");
    UNTOUCHED(pi);
    UNTOUCHED(gi);
    UNTOUCHED(bi);
    UNTOUCHED(si);
    UNTOUCHED(st);
    UNTOUCHED(ev);
    UNTOUCHED(pages);
    UNTOUCHED(table);
    UNTOUCHED(lens);
    UNTOUCHED(slots);
    UNTOUCHED(n1);
    UNTOUCHED(n2);
    UNTOUCHED(page);
}

/* Every pointer argument misaligned in turn. */
static void misaligned(void) {
    int32_t tok[4] = {1, 2, 3, 4};
    uint64_t ids[1] = {1};
    uint32_t q[1] = {1};
    uint32_t pages[16];
    int32_t table[16];
    int64_t slots[4];
    size_t n;
    SENTINEL(n);
    EXPECT(kvs_cache_group_info(h, 0, MIS(kvs_group_info)), KVS_STATUS_INVALID_ARGUMENT,
           "info_out");
    EXPECT(kvs_prefix_find(h, MIS(int32_t), 4, NULL, 3, pages, 16, 4, &n),
           KVS_STATUS_INVALID_ARGUMENT, "tokens");
    EXPECT(kvs_prefix_find(h, tok, 4, MIS(kvs_extra_keys), 3, pages, 16, 4, &n),
           KVS_STATUS_INVALID_ARGUMENT, "extra");
    EXPECT(kvs_prefix_find(h, tok, 4, NULL, 3, MIS(uint32_t), 16, 4, &n),
           KVS_STATUS_INVALID_ARGUMENT, "pages_out");
    EXPECT(kvs_prefix_find(h, tok, 4, NULL, 3, pages, 16, 4, MIS(size_t)),
           KVS_STATUS_INVALID_ARGUMENT, "matched_tokens_out");
    EXPECT(kvs_seq_begin(h, 50, MIS(int32_t), 4, NULL, 3, 0, NULL),
           KVS_STATUS_INVALID_ARGUMENT, "tokens");
    EXPECT(kvs_seq_begin(h, 50, tok, 4, MIS(kvs_extra_keys), 3, 0, NULL),
           KVS_STATUS_INVALID_ARGUMENT, "extra");
    EXPECT(kvs_seq_begin(h, 50, tok, 4, NULL, 3, 0, MIS(kvs_seq_info)),
           KVS_STATUS_INVALID_ARGUMENT, "info_out");
    EXPECT(kvs_seq_release_skipped(h, 1, 10, MIS(size_t)), KVS_STATUS_INVALID_ARGUMENT,
           "num_released_out");
    EXPECT(kvs_seq_append(h, 1, MIS(int32_t), 1, 0, CP, 8, &NC), KVS_STATUS_INVALID_ARGUMENT,
           "tokens");
    EXPECT(kvs_seq_append_need(h, 1, 1, 0, MIS(size_t), NULL), KVS_STATUS_INVALID_ARGUMENT,
           "pages_needed_out");
    EXPECT(kvs_seq_append_need(h, 1, 1, 0, &n, MIS(size_t)), KVS_STATUS_INVALID_ARGUMENT,
           "num_copies_out");
    EXPECT(kvs_seq_append(h, 1, tok, 1, 0, MIS(kvs_copy), 8, &NC), KVS_STATUS_INVALID_ARGUMENT,
           "copies_out");
    EXPECT(kvs_seq_append(h, 1, tok, 1, 0, CP, 8, MIS(size_t)), KVS_STATUS_INVALID_ARGUMENT,
           "num_copies_out");
    EXPECT(kvs_cache_available(h, KVS_TIER_DEVICE, 2, MIS(size_t)),
           KVS_STATUS_INVALID_ARGUMENT, "pages_out");
    EXPECT(kvs_page_get_info(h, KVS_TIER_DEVICE, 2, 1, MIS(kvs_page_info)),
           KVS_STATUS_INVALID_ARGUMENT, "info_out");
    EXPECT(kvs_pages_alloc(h, 2, 1, MIS(uint32_t), 1), KVS_STATUS_INVALID_ARGUMENT,
           "pages_out");
    EXPECT(kvs_pages_acquire(h, 2, MIS(uint32_t), 1), KVS_STATUS_INVALID_ARGUMENT, "pages");
    EXPECT(kvs_pages_release(h, 2, MIS(uint32_t), 1), KVS_STATUS_INVALID_ARGUMENT, "pages");
    EXPECT(kvs_seq_get_info(h, 1, MIS(kvs_seq_info)),
           KVS_STATUS_INVALID_ARGUMENT, "info_out");
    EXPECT(kvs_seq_pages(h, 0, 1, MIS(uint32_t), 16, &n), KVS_STATUS_INVALID_ARGUMENT,
           "pages_out");
    EXPECT(kvs_seq_pages(h, 0, 1, pages, 16, MIS(size_t)), KVS_STATUS_INVALID_ARGUMENT,
           "num_pages_out");
    EXPECT(kvs_cache_block_tables(h, 0, MIS(uint64_t), 1, 8, -1, table, 16, NULL, 0),
           KVS_STATUS_INVALID_ARGUMENT, "seq_ids");
    EXPECT(kvs_cache_block_tables(h, 0, ids, 1, 8, -1, MIS(int32_t), 16, NULL, 0),
           KVS_STATUS_INVALID_ARGUMENT, "table_out");
    EXPECT(kvs_cache_block_tables(h, 0, ids, 1, 8, -1, table, 16, MIS(int32_t), 1),
           KVS_STATUS_INVALID_ARGUMENT, "context_lens_out");
    EXPECT(kvs_cache_slot_mapping(h, 0, MIS(uint64_t), q, 1, slots, 4, &n),
           KVS_STATUS_INVALID_ARGUMENT, "seq_ids");
    EXPECT(kvs_cache_slot_mapping(h, 0, ids, MIS(uint32_t), 1, slots, 4, &n),
           KVS_STATUS_INVALID_ARGUMENT, "query_lens");
    EXPECT(kvs_cache_slot_mapping(h, 0, ids, q, 1, MIS(int64_t), 4, &n),
           KVS_STATUS_INVALID_ARGUMENT, "slots_out");
    EXPECT(kvs_cache_slot_mapping(h, 0, ids, q, 1, slots, 4, MIS(size_t)),
           KVS_STATUS_INVALID_ARGUMENT, "num_slots_out");
    EXPECT(kvs_cache_group_stats(h, 0, MIS(kvs_group_stats)), KVS_STATUS_INVALID_ARGUMENT,
           "stats_out");
    EXPECT(kvs_cache_take_events(h, MIS(kvs_event), 4, &n), KVS_STATUS_INVALID_ARGUMENT,
           "events_out");
    EXPECT(kvs_cache_take_events(h, NULL, 0, MIS(size_t)), KVS_STATUS_INVALID_ARGUMENT,
           "num_events_out");
    EXPECT(kvs_seq_state_page(h, 1, 2, MIS(uint32_t)), KVS_STATUS_INVALID_ARGUMENT,
           "page_out");
    UNTOUCHED(n);
    CHECK(all_bytes(raw, sizeof raw, 0xA5));
}

static void group_calls(void) {
    kvs_group_info gi;
    kvs_group_stats st;
    uint32_t pages[16];
    int32_t table[16];
    int64_t slots[4];
    uint64_t ids[1] = {1};
    uint32_t q[1] = {1};
    size_t n;
    uint32_t page;
    SENTINEL(gi);
    SENTINEL(st);
    SENTINEL(pages);
    SENTINEL(table);
    SENTINEL(slots);
    SENTINEL(n);
    SENTINEL(page);
    int32_t tok[8];
    t_iota(tok, 8, 100); /* sequence 1's first tokens */
    kvs_page_info pi;
    size_t n2;
    SENTINEL(pi);
    SENTINEL(n2);
    const size_t bad[] = {NG, 99, SIZE_MAX};
    for (size_t i = 0; i < 3; i++) {
        size_t g = bad[i];
        /* Every call taking a group. */
        EXPECT(kvs_cache_available(h, KVS_TIER_DEVICE, g, &n), KVS_STATUS_INVALID_ARGUMENT,
               "group");
        EXPECT(kvs_page_get_info(h, KVS_TIER_DEVICE, g, 1, &pi), KVS_STATUS_INVALID_ARGUMENT,
               "group");
        EXPECT(kvs_pages_alloc(h, g, 1, pages, 16), KVS_STATUS_INVALID_ARGUMENT, "group");
        EXPECT(kvs_pages_acquire(h, g, pages, 0), KVS_STATUS_INVALID_ARGUMENT, "group");
        EXPECT(kvs_pages_release(h, g, pages, 0), KVS_STATUS_INVALID_ARGUMENT, "group");
        EXPECT(kvs_prefix_register(h, g, tok, 8, NULL, 0, NULL, &n),
               KVS_STATUS_INVALID_ARGUMENT, "group");
        EXPECT(kvs_prefix_match(h, g, tok, 8, NULL, 8, true, pages, 16, &n, &n2),
               KVS_STATUS_INVALID_ARGUMENT, "group");
        EXPECT(kvs_cache_group_info(h, g, &gi), KVS_STATUS_INVALID_ARGUMENT, "group");
        EXPECT(kvs_cache_group_stats(h, g, &st), KVS_STATUS_INVALID_ARGUMENT, "group");
        EXPECT(kvs_seq_pages(h, g, 1, pages, 16, &n), KVS_STATUS_INVALID_ARGUMENT,
               "group");
        EXPECT(kvs_cache_block_tables(h, g, ids, 1, 8, -1, table, 16, NULL, 0),
               KVS_STATUS_INVALID_ARGUMENT, "group");
        EXPECT(kvs_cache_slot_mapping(h, g, ids, q, 1, slots, 4, &n),
               KVS_STATUS_INVALID_ARGUMENT, "group");
        EXPECT(kvs_seq_state_page(h, 1, g, &page), KVS_STATUS_INVALID_ARGUMENT,
               "group");
    }
    /* Not a state group. */
    EXPECT(kvs_seq_state_page(h, 1, 0, &page), KVS_STATUS_INVALID_ARGUMENT, "group");
    EXPECT(kvs_seq_state_page(h, 1, 1, &page), KVS_STATUS_INVALID_ARGUMENT, "group");
    /* A sequence without tokens has no state page yet. */
    EXPECT(kvs_seq_state_page(h, 2, 2, &page), KVS_STATUS_INVALID_ARGUMENT, "seq_id");
    /* Page ids are per pool: a page sequence 1 holds in the full group's pool is another page
     * in the state group's pool (free there), and a sequence's reference is not the caller's. */
    uint32_t held[4];
    CHECK_EQ(t_pages(h, 1, 1, held, 4), 3);
    size_t other = 3;
    for (size_t j = 0; j < 3 && other == 3; j++) {
        kvs_page_info there;
        CHECK_OK(kvs_page_get_info(h, KVS_TIER_DEVICE, 2, held[j], &there));
        if (there.state == T_PAGE_FREE) {
            other = j;
        }
    }
    CHECK(other < 3);
    EXPECT(kvs_pages_acquire(h, 2, &held[other], 1), KVS_STATUS_PAGE_NOT_ALLOCATED, NULL);
    EXPECT(kvs_pages_release(h, 1, held, 1), KVS_STATUS_REFCOUNT_UNDERFLOW, NULL);
    UNTOUCHED(pi);
    UNTOUCHED(n2);
    UNTOUCHED(gi);
    UNTOUCHED(st);
    UNTOUCHED(pages);
    UNTOUCHED(table);
    UNTOUCHED(slots);
    UNTOUCHED(n);
    UNTOUCHED(page);
}

/* Unknown (never begun, freed, doubly freed, extreme) sequence ids at every sequence call. */
static void unknown_ids(void) {
    int32_t tok[4] = {1, 2, 3, 4};
    kvs_seq_info si;
    uint32_t pages[16];
    int32_t table[16];
    int32_t lens[2];
    int64_t slots[8];
    size_t n, n2;
    uint32_t page;
    SENTINEL(si);
    SENTINEL(pages);
    SENTINEL(table);
    SENTINEL(lens);
    SENTINEL(slots);
    SENTINEL(n);
    SENTINEL(n2);
    SENTINEL(page);
    const uint64_t unknown[] = {50, 3 /* freed */, 0, UINT64_MAX};
    const char *names[] = {"50", "3", "0", "18446744073709551615"};
    for (size_t i = 0; i < 4; i++) {
        uint64_t id = unknown[i];
        const char *name = names[i];
        EXPECT(kvs_seq_release_skipped(h, id, 4, &n), KVS_STATUS_SEQ_NOT_FOUND, name);
        EXPECT(kvs_seq_append(h, id, tok, 1, 0, CP, 8, &NC), KVS_STATUS_SEQ_NOT_FOUND, name);
        EXPECT(kvs_seq_append_need(h, id, 1, 0, &n, NULL), KVS_STATUS_SEQ_NOT_FOUND, name);
        EXPECT(kvs_seq_free(h, id), KVS_STATUS_SEQ_NOT_FOUND, name);
        EXPECT(kvs_seq_get_info(h, id, &si), KVS_STATUS_SEQ_NOT_FOUND, name);
        EXPECT(kvs_seq_pages(h, 0, id, pages, 16, &n), KVS_STATUS_SEQ_NOT_FOUND, name);
        EXPECT(kvs_seq_state_page(h, id, 2, &page), KVS_STATUS_SEQ_NOT_FOUND, name);
        EXPECT(kvs_seq_fork(h, id, 70), KVS_STATUS_SEQ_NOT_FOUND, name);
        EXPECT(kvs_seq_swap_out(h, id, CP, 8, &NC), KVS_STATUS_SEQ_NOT_FOUND, name);
        EXPECT(kvs_seq_swap_in(h, id, CP, 8, &NC), KVS_STATUS_SEQ_NOT_FOUND, name);
        EXPECT(kvs_seq_set_priority(h, id, 1), KVS_STATUS_SEQ_NOT_FOUND, name);
        const uint64_t pair[2] = {1, id};
        const uint32_t q[2] = {1, 1};
        EXPECT(kvs_cache_block_tables(h, 1, pair, 2, 8, -1, table, 16, lens, 2),
               KVS_STATUS_SEQ_NOT_FOUND, name);
        EXPECT(kvs_cache_slot_mapping(h, 1, pair, q, 2, slots, 8, &n2),
               KVS_STATUS_SEQ_NOT_FOUND, name);
    }
    UNTOUCHED(si);
    UNTOUCHED(pages);
    UNTOUCHED(table);
    UNTOUCHED(lens);
    UNTOUCHED(slots);
    UNTOUCHED(n);
    UNTOUCHED(n2);
    UNTOUCHED(page);
    /* A double free: the second is refused, nothing else changes. */
    int32_t t[5] = {7, 8, 9, 10, 11};
    CHECK_OK(kvs_seq_begin(h, 60, t, 5, NULL, 0, 0, NULL));
    CHECK_OK(kvs_seq_free(h, 60));
    kvs_event ev[8];
    size_t ne = 0;
    CHECK_OK(kvs_cache_take_events(h, ev, 8, &ne));
    CHECK_EQ(ne, NG); /* its one full page, in each group */
    EXPECT(kvs_seq_free(h, 60), KVS_STATUS_SEQ_NOT_FOUND, "60");
    EXPECT(kvs_seq_append(h, 60, t, 1, 0, CP, 8, &NC), KVS_STATUS_SEQ_NOT_FOUND, "60");
    /* Begin of an id that exists. */
    kvs_seq_info bi;
    SENTINEL(bi);
    EXPECT(kvs_seq_begin(h, 1, t, 5, NULL, 4, 0, &bi), KVS_STATUS_SEQ_EXISTS, "1");
    EXPECT(kvs_seq_begin(h, 2, NULL, 0, NULL, 0, 0, &bi), KVS_STATUS_SEQ_EXISTS, "2");
    UNTOUCHED(bi);
}

/* Pointers NULL with a length, lengths that overflow, short buffers. */
static void lengths(void) {
    int32_t tok[64];
    t_iota(tok, 64, 100); /* sequence 1's tokens first */
    kvs_seq_info bi;
    uint32_t pages[3 * 8];
    int32_t table[2 * 8];
    int32_t lens[2];
    int64_t slots[16];
    kvs_event ev[4];
    size_t n, n2;
    SENTINEL(bi);
    SENTINEL(pages);
    SENTINEL(table);
    SENTINEL(lens);
    SENTINEL(slots);
    SENTINEL(ev);
    SENTINEL(n);
    SENTINEL(n2);
    const uint8_t salt[2] = {1, 2};
    kvs_extra_keys null_salt = {0, NULL, 2, NULL, 0};
    kvs_extra_keys null_mm = {0, salt, 2, NULL, 1};
    kvs_extra_keys huge_salt = {0, salt, SIZE_MAX, NULL, 0};

    /* match: sequence 1's 8 first tokens are cached (2 pages per group). */
    EXPECT(kvs_prefix_find(h, NULL, 4, NULL, 3, pages, 24, 8, &n), KVS_STATUS_NULL_ARGUMENT,
           "tokens");
    EXPECT(kvs_prefix_find(h, tok, SIZE_MAX, NULL, 3, pages, 24, 8, &n),
           KVS_STATUS_INVALID_ARGUMENT, "tokens");
    EXPECT(kvs_prefix_find(h, tok, 10, &null_salt, 9, pages, 24, 8, &n),
           KVS_STATUS_NULL_ARGUMENT, "salt");
    EXPECT(kvs_prefix_find(h, tok, 10, &null_mm, 9, pages, 24, 8, &n),
           KVS_STATUS_NULL_ARGUMENT, "mm_items");
    EXPECT(kvs_prefix_find(h, tok, 10, &huge_salt, 9, pages, 24, 8, &n),
           KVS_STATUS_INVALID_ARGUMENT, "salt");
    EXPECT(kvs_prefix_find(h, tok, 10, NULL, 9, NULL, 24, 8, &n), KVS_STATUS_NULL_ARGUMENT,
           "pages_out");
    EXPECT(kvs_prefix_find(h, tok, 10, NULL, 9, pages, SIZE_MAX, 8, &n),
           KVS_STATUS_INVALID_ARGUMENT, "pages_out");
    EXPECT(kvs_prefix_find(h, tok, 10, NULL, 9, pages, 23, 8, &n),
           KVS_STATUS_BUFFER_TOO_SMALL, "pages_out");
    EXPECT(kvs_prefix_find(h, tok, 10, NULL, 9, pages, 24, SIZE_MAX, &n),
           KVS_STATUS_INVALID_ARGUMENT, "max_pages_per_group");
    EXPECT(kvs_prefix_find(h, tok, 10, NULL, 9, pages, 3, 1, &n), KVS_STATUS_BUFFER_TOO_SMALL,
           "pages_out");
    UNTOUCHED(pages);
    UNTOUCHED(n);
    /* Without a pages buffer no room is needed; an empty prompt matches nothing. */
    CHECK_OK(kvs_prefix_find(h, tok, 10, NULL, 9, NULL, 0, 0, &n));
    CHECK_EQ(n, 8);
    CHECK_OK(kvs_prefix_find(h, tok, 10, NULL, 9, NULL, 0, 1, &n));
    CHECK_EQ(n, 8);
    CHECK_OK(kvs_prefix_find(h, NULL, 0, NULL, SIZE_MAX, NULL, 0, 0, &n));
    CHECK_EQ(n, 0);
    SENTINEL(n);

    /* begin */
    EXPECT(kvs_seq_begin(h, 50, NULL, 4, NULL, 3, 0, &bi), KVS_STATUS_NULL_ARGUMENT,
           "tokens");
    EXPECT(kvs_seq_begin(h, 50, tok, SIZE_MAX, NULL, 3, 0, &bi),
           KVS_STATUS_INVALID_ARGUMENT, "tokens");
    EXPECT(kvs_seq_begin(h, 50, tok, 4, &null_salt, 3, 0, &bi), KVS_STATUS_NULL_ARGUMENT,
           "salt");
    EXPECT(kvs_seq_begin(h, 50, tok, 4, &huge_salt, 3, 0, &bi),
           KVS_STATUS_INVALID_ARGUMENT, "salt");
    EXPECT(kvs_seq_begin(h, 50, tok, 4, NULL, 3, SIZE_MAX, &bi),
           KVS_STATUS_INVALID_ARGUMENT, "lookahead_slots");
    EXPECT(kvs_seq_begin(h, 50, tok, 4, NULL, 3, SIZE_MAX - 2, &bi),
           KVS_STATUS_INVALID_ARGUMENT, "lookahead_slots");
    EXPECT(kvs_seq_begin(h, 50, tok, 64, NULL, 0, 0, &bi), KVS_STATUS_NO_SPACE, NULL);
    EXPECT(kvs_seq_begin(h, 50, tok, 4, NULL, 3, 1000, &bi), KVS_STATUS_NO_SPACE, NULL);
    UNTOUCHED(bi);

    /* release */
    EXPECT(kvs_seq_release_skipped(h, 50, SIZE_MAX, &n), KVS_STATUS_SEQ_NOT_FOUND, "50");
    UNTOUCHED(n);

    /* append and its need */
    EXPECT(kvs_seq_append(h, 1, NULL, 1, 0, CP, 8, &NC), KVS_STATUS_NULL_ARGUMENT, "tokens");
    EXPECT(kvs_seq_append(h, 1, tok, SIZE_MAX, 0, CP, 8, &NC), KVS_STATUS_INVALID_ARGUMENT, "tokens");
    EXPECT(kvs_seq_append(h, 1, tok, 1, SIZE_MAX, CP, 8, &NC), KVS_STATUS_INVALID_ARGUMENT,
           "lookahead_slots");
    EXPECT(kvs_seq_append(h, 1, tok, 1, SIZE_MAX - 10, CP, 8, &NC), KVS_STATUS_INVALID_ARGUMENT,
           "lookahead_slots");
    EXPECT(kvs_seq_append(h, 1, tok, 64, 0, CP, 8, &NC), KVS_STATUS_NO_SPACE, NULL);
    EXPECT(kvs_seq_append(h, 1, tok, 1, 1000, CP, 8, &NC), KVS_STATUS_NO_SPACE, NULL);
    EXPECT(kvs_seq_append_need(h, 1, SIZE_MAX, 0, &n, NULL), KVS_STATUS_INVALID_ARGUMENT,
           "num_tokens");
    EXPECT(kvs_seq_append_need(h, 1, SIZE_MAX - 5, 0, &n, NULL), KVS_STATUS_INVALID_ARGUMENT,
           "num_tokens");
    EXPECT(kvs_seq_append_need(h, 1, 1, SIZE_MAX, &n, NULL), KVS_STATUS_INVALID_ARGUMENT,
           "lookahead_slots");
    UNTOUCHED(n);
    /* A need too large for the pools is an answer, not an error. */
    CHECK_OK(kvs_seq_append_need(h, 1, 1000, 0, &n, NULL));
    CHECK(n > NPAGES);
    SENTINEL(n);

    /* seq_pages: sequence 1 has 3 pages per group. */
    EXPECT(kvs_seq_pages(h, 0, 1, NULL, 16, &n), KVS_STATUS_NULL_ARGUMENT, "pages_out");
    EXPECT(kvs_seq_pages(h, 0, 1, pages, SIZE_MAX, &n), KVS_STATUS_INVALID_ARGUMENT,
           "pages_out");
    EXPECT(kvs_seq_pages(h, 0, 1, pages, 2, &n), KVS_STATUS_BUFFER_TOO_SMALL,
           "pages_out");
    EXPECT(kvs_seq_pages(h, 0, 1, NULL, 0, &n), KVS_STATUS_BUFFER_TOO_SMALL,
           "pages_out");
    UNTOUCHED(pages);
    UNTOUCHED(n);
    /* An empty table fits in no buffer. */
    CHECK_OK(kvs_seq_pages(h, 0, 2, NULL, 0, &n));
    CHECK_EQ(n, 0);
    SENTINEL(n);

    /* block tables */
    const uint64_t one[1] = {1};
    const uint64_t two[2] = {1, 2};
    EXPECT(kvs_cache_block_tables(h, 0, NULL, 1, 8, -1, table, 16, lens, 2),
           KVS_STATUS_NULL_ARGUMENT, "seq_ids");
    EXPECT(kvs_cache_block_tables(h, 0, one, 1, 8, -1, NULL, 16, lens, 2),
           KVS_STATUS_NULL_ARGUMENT, "table_out");
    EXPECT(kvs_cache_block_tables(h, 0, one, 1, 8, -1, table, 16, NULL, 2),
           KVS_STATUS_NULL_ARGUMENT, "context_lens_out");
    EXPECT(kvs_cache_block_tables(h, 0, two, 2, 8, -1, table, 15, lens, 2),
           KVS_STATUS_BUFFER_TOO_SMALL, "table_out");
    EXPECT(kvs_cache_block_tables(h, 0, two, 2, 8, -1, table, 16, lens, 1),
           KVS_STATUS_BUFFER_TOO_SMALL, "context_lens_out");
    EXPECT(kvs_cache_block_tables(h, 0, one, 1, 2, -1, table, 16, lens, 2),
           KVS_STATUS_INVALID_ARGUMENT, "max_pages_per_seq");
    EXPECT(kvs_cache_block_tables(h, 0, two, 2, SIZE_MAX, -1, table, 16, lens, 2),
           KVS_STATUS_INVALID_ARGUMENT, "max_pages_per_seq");
    EXPECT(kvs_cache_block_tables(h, 0, one, 1, SIZE_MAX, -1, table, 16, lens, 2),
           KVS_STATUS_BUFFER_TOO_SMALL, "table_out");
    EXPECT(kvs_cache_block_tables(h, 0, one, SIZE_MAX, 8, -1, table, 16, lens, 2),
           KVS_STATUS_INVALID_ARGUMENT, "seq_ids");
    EXPECT(kvs_cache_block_tables(h, 0, one, 1, 8, -1, table, SIZE_MAX, lens, 2),
           KVS_STATUS_INVALID_ARGUMENT, "table_out");
    EXPECT(kvs_cache_block_tables(h, 0, one, 1, 8, -1, table, 16, lens, SIZE_MAX),
           KVS_STATUS_INVALID_ARGUMENT, "context_lens_out");
    UNTOUCHED(table);
    UNTOUCHED(lens);
    CHECK_OK(kvs_cache_block_tables(h, 0, NULL, 0, SIZE_MAX, -1, NULL, 0, NULL, 0));

    /* slot mapping: sequence 1 has 10 tokens */
    const uint32_t q1[2] = {1, 0};
    const uint32_t q11[1] = {11};
    const uint32_t qmax[1] = {UINT32_MAX};
    const uint32_t q10[1] = {10};
    EXPECT(kvs_cache_slot_mapping(h, 0, NULL, q1, 1, slots, 16, &n), KVS_STATUS_NULL_ARGUMENT,
           "seq_ids");
    EXPECT(kvs_cache_slot_mapping(h, 0, one, NULL, 1, slots, 16, &n),
           KVS_STATUS_NULL_ARGUMENT, "query_lens");
    EXPECT(kvs_cache_slot_mapping(h, 0, one, q1, 1, NULL, 16, &n), KVS_STATUS_NULL_ARGUMENT,
           "slots_out");
    EXPECT(kvs_cache_slot_mapping(h, 0, one, q11, 1, slots, 16, &n),
           KVS_STATUS_INVALID_ARGUMENT, "query_lens");
    EXPECT(kvs_cache_slot_mapping(h, 0, one, qmax, 1, slots, 16, &n),
           KVS_STATUS_INVALID_ARGUMENT, "query_lens");
    EXPECT(kvs_cache_slot_mapping(h, 0, one, q10, 1, slots, 9, &n),
           KVS_STATUS_BUFFER_TOO_SMALL, "slots_out");
    EXPECT(kvs_cache_slot_mapping(h, 0, one, q1, SIZE_MAX, slots, 16, &n),
           KVS_STATUS_INVALID_ARGUMENT, "seq_ids");
    EXPECT(kvs_cache_slot_mapping(h, 0, one, q1, 1, slots, SIZE_MAX, &n),
           KVS_STATUS_INVALID_ARGUMENT, "slots_out");
    UNTOUCHED(slots);
    UNTOUCHED(n);
    CHECK_OK(kvs_cache_slot_mapping(h, 0, NULL, NULL, 0, NULL, 0, NULL));

    /* take_events: new events wait; failing calls take none of them. */
    kvs_event all[16];
    CHECK_OK(kvs_cache_take_events(h, all, 16, &n));
    CHECK_EQ(n, 0); /* no failing call queued an event */
    int32_t t[8] = {900, 901, 902, 903, 904, 905, 906, 907};
    CHECK_OK(kvs_seq_begin(h, 70, t, 8, NULL, 0, 0, NULL));
    SENTINEL(n);
    EXPECT(kvs_cache_take_events(h, NULL, 4, &n), KVS_STATUS_NULL_ARGUMENT, "events_out");
    EXPECT(kvs_cache_take_events(h, ev, SIZE_MAX, &n), KVS_STATUS_INVALID_ARGUMENT,
           "events_out");
    EXPECT(kvs_cache_take_events(h, ev, 4, NULL), KVS_STATUS_NULL_ARGUMENT, "num_events_out");
    UNTOUCHED(ev);
    UNTOUCHED(n);
    CHECK_OK(kvs_cache_take_events(h, all, 16, &n));
    CHECK_EQ(n, 2 * NG); /* two full pages stored in each group */
    CHECK_OK(kvs_cache_take_events(h, NULL, 0, &n));
    CHECK_EQ(n, 0);
    CHECK_OK(kvs_seq_free(h, 70));
    SENTINEL(n);
}

/* kvs_cpu_huge_pages: every bad argument, the report untouched. */
static void huge_pages(void) {
    /* 16 MiB mapped, and the page after it unmapped. */
    size_t len = 8 * ((size_t)2 << 20);
    unsigned char *map =
        mmap(NULL, len + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(map != MAP_FAILED);
    CHECK(munmap(map + len, 4096) == 0);
    kvs_huge_pages_report r;
    SENTINEL(r);
    CHECK_FAILS(kvs_cpu_huge_pages(NULL, len, KVS_HUGE_PAGES_MODE_ADVISE, &r),
                KVS_STATUS_NULL_ARGUMENT, "base");
    CHECK_FAILS(kvs_cpu_huge_pages(map, 0, KVS_HUGE_PAGES_MODE_ADVISE, &r),
                KVS_STATUS_INVALID_ARGUMENT, "bytes");
    CHECK_FAILS(kvs_cpu_huge_pages(map, SIZE_MAX, KVS_HUGE_PAGES_MODE_ADVISE, &r),
                KVS_STATUS_INVALID_ARGUMENT, "bytes");
    CHECK_FAILS(kvs_cpu_huge_pages(map, len, 2, &r), KVS_STATUS_INVALID_ARGUMENT, "mode");
    CHECK_FAILS(kvs_cpu_huge_pages(map, len, UINT32_MAX, &r), KVS_STATUS_INVALID_ARGUMENT,
                "mode");
    CHECK_FAILS(kvs_cpu_huge_pages(map, len + 4096, KVS_HUGE_PAGES_MODE_ADVISE, &r),
                KVS_STATUS_INVALID_ARGUMENT, "base");
    CHECK_FAILS(kvs_cpu_huge_pages((const void *)(uintptr_t)0x1000, 4096,
                                   KVS_HUGE_PAGES_MODE_COLLAPSE, &r),
                KVS_STATUS_INVALID_ARGUMENT, "base");
    UNTOUCHED(r);
    /* A misaligned report is refused before the range is advised. */
    CHECK_FAILS(kvs_cpu_huge_pages(map, len, KVS_HUGE_PAGES_MODE_ADVISE,
                                   MIS(kvs_huge_pages_report)),
                KVS_STATUS_INVALID_ARGUMENT, "report_out");
    CHECK(all_bytes(raw, sizeof raw, 0xA5));
    FILE *f = fopen("/proc/self/smaps", "r");
    CHECK(f != NULL);
    char line[512];
    int inside = 0, advised = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        unsigned long lo, hi;
        char dash;
        if (sscanf(line, "%lx%c%lx ", &lo, &dash, &hi) == 3 && dash == '-') {
            uintptr_t mid = (uintptr_t)(map + len / 2); /* inside the whole huge pages */
            inside = mid >= lo && mid < hi;
        } else if (inside && strncmp(line, "VmFlags:", 8) == 0) {
            advised = strstr(line, " hg") != NULL;
        }
    }
    fclose(f);
    CHECK(!advised);
    CHECK(munmap(map, len) == 0);
}

int main(void) {
    memset(raw, 0xA5, sizeof raw);
    configs();
    fixture();
    nulls();
    misaligned();
    group_calls();
    unknown_ids();
    lengths();
    huge_pages();
    /* The fixture survives all of it intact. */
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
    printf("groups_bad_input: ok\n");
    return 0;
}
