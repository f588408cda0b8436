/*
 * Bad input at every entry point of a cache of KV-cache groups: invalid configs, NULL and
 * misaligned pointers, bad group indices; groups_bad_input.h says what every call is held to.
 */
#include "groups_bad_input.h"

static char dummy_object;
#define BOGUS ((kvs_cache *)(void *)&dummy_object)

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
        {offsetof(kvs_config, vllm_uncached_first), "vllm_uncached_first"},
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
    bad_group((kvs_group){4, 0, 1, 0}, true, "groups.kind");
    bad_group((kvs_group){UINT32_MAX, 0, 1, 0}, true, "groups.kind");
    bad_group((kvs_group){KVS_GROUP_KIND_FULL, 1, 1, 0}, true, "groups.window");
    bad_group((kvs_group){KVS_GROUP_KIND_SLIDING_WINDOW, 0, 1, 0}, true, "groups.window");
    bad_group((kvs_group){KVS_GROUP_KIND_CHUNKED_LOCAL, 0, 1, 0}, true, "groups.window");
    bad_group((kvs_group){KVS_GROUP_KIND_CHUNKED_LOCAL, PS + 2, 1, 0}, true, "groups.window");
    bad_group((kvs_group){KVS_GROUP_KIND_CHUNKED_LOCAL, UINT32_MAX, 1, 0}, true, "groups.window");
    bad_group((kvs_group){KVS_GROUP_KIND_STATE, 3, 1, 0}, true, "groups.window");
    bad_group((kvs_group){KVS_GROUP_KIND_STATE, UINT32_MAX, 1, 0}, true, "groups.window");
    bad_group((kvs_group){KVS_GROUP_KIND_STATE, KVS_STATE_MODE_NONE, 1, 0}, true, "groups.window");
    bad_group((kvs_group){KVS_GROUP_KIND_STATE, KVS_STATE_MODE_ALL, 1, 0}, false, "groups.window");
    bad_group((kvs_group){KVS_GROUP_KIND_STATE, KVS_STATE_MODE_ALIGN, 1, 0}, false,
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
    kvs_group wide[3] = {{KVS_GROUP_KIND_SLIDING_WINDOW, UINT32_MAX, UINT64_MAX, 0},
                         {KVS_GROUP_KIND_CHUNKED_LOCAL, PS * 1000, 1, 0},
                         {KVS_GROUP_KIND_FULL, 0, 0, 0}};
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
    EXPECT(kvs_seq_begin_computed(NULL, 50, tok, 4, NULL, 3, 0, 0, &bi),
           KVS_STATUS_NULL_ARGUMENT, "cache");
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
    EXPECT(kvs_seq_begin_computed(h, 50, MIS(int32_t), 4, NULL, 3, 0, 0, NULL),
           KVS_STATUS_INVALID_ARGUMENT, "tokens");
    EXPECT(kvs_seq_begin_computed(h, 50, tok, 4, MIS(kvs_extra_keys), 3, 0, 0, NULL),
           KVS_STATUS_INVALID_ARGUMENT, "extra");
    EXPECT(kvs_seq_begin_computed(h, 50, tok, 4, NULL, 3, 0, 0, MIS(kvs_seq_info)),
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
    /* Computed tokens past the prompt and its slots; any with a state group (this cache). */
    kvs_seq_info bi;
    SENTINEL(bi);
    EXPECT(kvs_seq_begin_computed(h, 50, tok, 8, NULL, 0, 2, 11, &bi),
           KVS_STATUS_INVALID_ARGUMENT, "computed_tokens");
    EXPECT(kvs_seq_begin_computed(h, 50, tok, 8, NULL, 0, 2, SIZE_MAX, &bi),
           KVS_STATUS_INVALID_ARGUMENT, "computed_tokens");
    EXPECT(kvs_seq_begin_computed(h, 50, tok, 8, NULL, 0, 0, 4, &bi),
           KVS_STATUS_INVALID_ARGUMENT, "computed_tokens");
    UNTOUCHED(bi);
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

/* kvs_seq_set_retention: refused on the fixture (dense window retention) and for a NULL cache;
 * on a cache with sparse retention, refused for an unknown sequence, too many boundaries, NULL
 * or misaligned boundaries, registering nothing. */
static void retention_calls(void) {
    size_t b[KVS_MAX_RETENTION_BOUNDARIES + 1] = {7, 11, 15, 19, 23};
    EXPECT(kvs_seq_set_retention(h, 1, b, 1), KVS_STATUS_INVALID_ARGUMENT, "window_retention");
    EXPECT(kvs_seq_set_retention(NULL, 1, b, 1), KVS_STATUS_NULL_ARGUMENT, "cache");
    kvs_group g[2] = {
        {KVS_GROUP_KIND_SLIDING_WINDOW, 8, 4096, 0},
        {KVS_GROUP_KIND_FULL, 0, 4096, 0},
    };
    kvs_config cfg = config_of(g, 2);
    cfg.window_retention = KVS_WINDOW_RETENTION_BOUNDARIES;
    kvs_cache *s = NULL;
    CHECK_OK(kvs_cache_new(&cfg, &s));
    int32_t toks[24];
    t_iota(toks, 24, 300);
    kvs_seq_info si;
    CHECK_OK(kvs_seq_begin(s, 1, toks, 24, NULL, 0, 0, &si));
    uint64_t before = t_group_stats(s, 0).pages_registered;
    CHECK_FAILS(kvs_seq_set_retention(s, 2, b, 1), KVS_STATUS_SEQ_NOT_FOUND, "2");
    CHECK_FAILS(kvs_seq_set_retention(s, 1, b, KVS_MAX_RETENTION_BOUNDARIES + 1),
                KVS_STATUS_INVALID_ARGUMENT, "num_boundaries");
    CHECK_FAILS(kvs_seq_set_retention(s, 1, NULL, 1), KVS_STATUS_NULL_ARGUMENT, "boundaries");
    CHECK_FAILS(kvs_seq_set_retention(s, 1, MIS(size_t), 1), KVS_STATUS_INVALID_ARGUMENT,
                "boundaries");
    CHECK_EQ(t_group_stats(s, 0).pages_registered, before);
    CHECK_CACHE(s);
    kvs_cache_free(s);
}

int main(void) {
    memset(raw, 0xA5, sizeof raw);
    configs();
    fixture();
    nulls();
    misaligned();
    group_calls();
    retention_calls();
    fixture_intact_then_free();
    printf("groups_bad_input: ok\n");
    return 0;
}
