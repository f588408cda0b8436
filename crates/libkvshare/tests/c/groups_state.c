/*
 * State groups (Mamba / linear attention) from C: config validation of the modes, a full +
 * state ("all") flow (checkpoint hit, the same-step gate cleared by kvs_cache_new_step, the
 * running state page, release of all but it), "align" (one new page per step, the previous one
 * kept until the next release), "none" (one page for the sequence), a forked sequence whose
 * shared running state is copied whole on its first write, and bad input at the two state calls
 * leaving out-params untouched.
 */
#include "kvs_test.h"

#define PS 4u
#define SENT 0xA5A5A5A5u

static kvs_config cfg_of(const kvs_group *g, size_t n, bool caching) {
    kvs_config c = t_groups_config(PS, 32, g, n);
    c.enable_prefix_caching = caching;
    c.enable_events = true;
    return c;
}

static void bad_config(kvs_group g, bool caching, const char *field) {
    kvs_cache *h = (kvs_cache *)(uintptr_t)0x1;
    kvs_config c = cfg_of(&g, 1, caching);
    CHECK_FAILS(kvs_cache_new(&c, &h), KVS_STATUS_INVALID_CONFIG, field);
    CHECK(h == (kvs_cache *)(uintptr_t)0x1);
}

static kvs_cache *make(uint32_t mode, bool caching) {
    kvs_group g[2] = {
        {KVS_GROUP_KIND_FULL, 0, 4096, 0},
        {KVS_GROUP_KIND_STATE, mode, 4096, 0},
    };
    kvs_config c = cfg_of(g, 2, caching);
    kvs_cache *h = NULL;
    CHECK_OK(kvs_cache_new(&c, &h));
    return h;
}

static size_t pages_of(kvs_cache *h, uint64_t seq, uint32_t *out) {
    return t_pages(h, 1, seq, out, 8);
}

int main(void) {
    /* Modes: 3 is none; none needs prefix caching off, all and align need it on. */
    bad_config((kvs_group){KVS_GROUP_KIND_STATE, 3, 1, 0}, true, "groups.window");
    bad_config((kvs_group){KVS_GROUP_KIND_STATE, KVS_STATE_MODE_NONE, 1, 0}, true, "groups.window");
    bad_config((kvs_group){KVS_GROUP_KIND_STATE, KVS_STATE_MODE_ALL, 1, 0}, false, "groups.window");
    bad_config((kvs_group){KVS_GROUP_KIND_STATE, KVS_STATE_MODE_ALIGN, 1, 0}, false,
               "groups.window");
    {
        /* Checkpoints exist at page boundaries only: no hits inside a page. */
        kvs_group g = {KVS_GROUP_KIND_STATE, KVS_STATE_MODE_ALL, 1, 0};
        kvs_config c = cfg_of(&g, 1, true);
        c.match_unit = PS / 2;
        kvs_cache *h = (kvs_cache *)(uintptr_t)0x1;
        CHECK_FAILS(kvs_cache_new(&c, &h), KVS_STATUS_INVALID_CONFIG, "match_unit");
        CHECK(h == (kvs_cache *)(uintptr_t)0x1);
    }

    int32_t toks[12];
    for (int i = 0; i < 12; i++) {
        toks[i] = 500 + i;
    }
    int32_t follow[11];
    memcpy(follow, toks, 8 * sizeof(int32_t));
    follow[8] = 1;
    follow[9] = 2;
    follow[10] = 3;
    uint32_t p[8];
    kvs_seq_info bi;

    /* "all": a checkpoint per page. */
    kvs_cache *h = make(KVS_STATE_MODE_ALL, true);
    kvs_group_info gi;
    CHECK_OK(kvs_cache_group_info(h, 1, &gi));
    CHECK_EQ(gi.kind, KVS_GROUP_KIND_STATE);
    CHECK_EQ(gi.window, KVS_STATE_MODE_ALL);
    CHECK_EQ(gi.num_pools, 1);
    CHECK_OK(kvs_seq_begin(h, 1, toks, 10, NULL, SIZE_MAX, 0, &bi));
    CHECK_EQ(bi.new_pages, 6);
    CHECK_EQ(pages_of(h, 1, p), 3);
    uint32_t state = SENT;
    CHECK_OK(kvs_seq_state_page(h, 1, 1, &state));
    CHECK_EQ(state, p[2]);
    /* The checkpoint after 8 tokens was registered in this step: not usable yet. */
    bi.matched_tokens = SENT;
    CHECK_FAILS(kvs_seq_begin(h, 2, follow, 11, NULL, 10, 0, &bi), KVS_STATUS_NO_SPACE, NULL);
    CHECK_EQ(bi.matched_tokens, SENT);
    CHECK_CACHE(h);
    /* The read-only lookup sees the hit regardless. */
    uint32_t found[2 * 2];
    size_t matched = 0;
    CHECK_OK(kvs_prefix_find(h, follow, 11, NULL, 10, found, 4, 2, &matched));
    CHECK_EQ(matched, 8);
    CHECK_EQ(found[2], KVS_NULL_PAGE);
    CHECK_EQ(found[3], p[1]);
    CHECK_OK(kvs_cache_new_step(h));
    CHECK_OK(kvs_seq_begin(h, 2, follow, 11, NULL, 10, 0, &bi));
    CHECK_EQ(bi.matched_tokens, 8);
    uint32_t q[8];
    CHECK_EQ(pages_of(h, 2, q), 3);
    CHECK_EQ(q[0], KVS_NULL_PAGE);
    CHECK_EQ(q[1], p[1]);
    size_t released = SENT;
    CHECK_OK(kvs_seq_release_skipped(h, 1, 10, &released));
    CHECK_EQ(released, 2);
    kvs_group_stats st = t_group_stats(h, 1);
    CHECK_EQ(st.pages_held, 3); /* sequence 1: its state; sequence 2: hit + running */
    kvs_event ev[32];
    size_t ne = 0;
    CHECK_OK(kvs_cache_take_events(h, ev, 32, &ne));
    size_t state_events = 0;
    for (size_t i = 0; i < ne; i++) {
        CHECK(ev[i].group < 2);
        state_events += ev[i].group == 1;
    }
    CHECK_EQ(state_events, 2); /* sequence 1's two full pages' checkpoints */

    /* Bad input at the state calls. */
    CHECK_FAILS(kvs_cache_new_step(NULL), KVS_STATUS_NULL_ARGUMENT, "cache");
    state = SENT;
    CHECK_FAILS(kvs_seq_state_page(NULL, 1, 1, &state), KVS_STATUS_NULL_ARGUMENT, "cache");
    CHECK_FAILS(kvs_seq_state_page(h, 1, 1, NULL), KVS_STATUS_NULL_ARGUMENT, "page_out");
    CHECK_FAILS(kvs_seq_state_page(h, 1, 0, &state), KVS_STATUS_INVALID_ARGUMENT, "group");
    CHECK_FAILS(kvs_seq_state_page(h, 1, 2, &state), KVS_STATUS_INVALID_ARGUMENT, "group");
    CHECK_FAILS(kvs_seq_state_page(h, 9, 1, &state), KVS_STATUS_SEQ_NOT_FOUND, "9");
    CHECK_EQ(state, SENT);
    CHECK_OK(kvs_seq_free(h, 1));
    CHECK_OK(kvs_seq_free(h, 2));
    CHECK_CACHE(h);

    /* A fork shares the running state; the child's first write copies it whole. */
    CHECK_OK(kvs_seq_begin(h, 3, toks, 6, NULL, SIZE_MAX, 0, NULL));
    CHECK_OK(kvs_seq_fork(h, 3, 4));
    uint32_t parent_state = SENT;
    CHECK_OK(kvs_seq_state_page(h, 3, 1, &parent_state));
    kvs_copy cp[4];
    size_t nc = 0;
    CHECK_OK(kvs_seq_append(h, 4, toks + 6, 1, 0, cp, 4, &nc));
    CHECK_EQ(nc, 2); /* the full group's partial page, and the state */
    size_t state_copies = 0;
    for (size_t i = 0; i < nc; i++) {
        CHECK_EQ(cp[i].kind, KVS_COPY_KIND_DEVICE_TO_DEVICE);
        if (cp[i].group == 1) {
            CHECK_EQ(cp[i].src_page, parent_state);
            CHECK_EQ(cp[i].num_tokens, PS); /* the whole state */
            CHECK_OK(kvs_seq_state_page(h, 4, 1, &state));
            CHECK_EQ(cp[i].dst_page, state);
            state_copies++;
        }
    }
    CHECK_EQ(state_copies, 1);
    CHECK_OK(kvs_seq_free(h, 3));
    CHECK_OK(kvs_seq_free(h, 4));
    CHECK_CACHE(h);
    kvs_cache_free(h);

    /* "align": the running state at the end, the previous one kept until the next release. */
    h = make(KVS_STATE_MODE_ALIGN, true);
    CHECK_OK(kvs_seq_begin(h, 1, toks, 8, NULL, SIZE_MAX, 0, &bi));
    CHECK_EQ(bi.new_pages, 3);
    CHECK_EQ(pages_of(h, 1, p), 2);
    CHECK_EQ(p[0], KVS_NULL_PAGE);
    nc = SENT;
    CHECK_FAILS(kvs_seq_append(h, 1, toks + 8, 4, 1, cp, 4, &nc), KVS_STATUS_INVALID_ARGUMENT,
                "lookahead_slots");
    CHECK_FAILS(kvs_seq_begin(h, 2, toks, 4, NULL, SIZE_MAX, 1, &bi),
                KVS_STATUS_INVALID_ARGUMENT, "lookahead_slots");
    CHECK_EQ(nc, SENT);
    CHECK_EQ(t_append(h, 1, toks + 8, 4), 0);
    CHECK_EQ(pages_of(h, 1, q), 3);
    CHECK_EQ(q[1], p[1]);
    CHECK(q[2] != KVS_NULL_PAGE && q[2] != p[1]);
    CHECK_OK(kvs_seq_release_skipped(h, 1, 12, &released));
    CHECK_EQ(released, 1);
    CHECK_EQ(pages_of(h, 1, p), 3);
    CHECK_EQ(p[1], KVS_NULL_PAGE);
    CHECK_CACHE(h);
    kvs_cache_free(h);

    /* "none": one page for the whole sequence, at the end of the table. */
    h = make(KVS_STATE_MODE_NONE, false);
    CHECK_OK(kvs_seq_begin(h, 1, toks, 6, NULL, SIZE_MAX, 0, &bi));
    CHECK_EQ(bi.new_pages, 3);
    CHECK_OK(kvs_seq_state_page(h, 1, 1, &state));
    CHECK_EQ(t_append(h, 1, toks + 6, 6), 0);
    CHECK_EQ(pages_of(h, 1, p), 3);
    CHECK_EQ(p[0], KVS_NULL_PAGE);
    CHECK_EQ(p[1], KVS_NULL_PAGE);
    CHECK_EQ(p[2], state);
    CHECK_OK(kvs_cache_new_step(h)); /* harmless without checkpoints */
    CHECK_CACHE(h);
    kvs_cache_free(h);
    printf("groups_state: ok\n");
    return 0;
}
