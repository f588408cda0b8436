/*
 * The state kind of kvs_hybrid (Mamba / linear attention) from C: config validation of the
 * modes, a full + state ("all") flow (checkpoint hit, the same-step gate cleared by
 * kvs_hybrid_new_step, the running state page, release of all but it), "align" (one new page
 * per step, the previous one kept until the next release), "none" (one page for the sequence),
 * and bad input at the two state calls leaving out-params untouched.
 */
#include "kvs_test.h"

#define PS 4u
#define SENT 0xA5A5A5A5u

static kvs_hybrid_config cfg_of(kvs_group *g, size_t n, bool caching) {
    kvs_hybrid_config c;
    memset(&c, 0, sizeof c);
    c.page_size = PS;
    c.num_pages = 32;
    c.enable_prefix_caching = caching;
    c.enable_events = true;
    c.groups = g;
    c.num_groups = n;
    return c;
}

static void bad_config(kvs_group g, bool caching) {
    kvs_hybrid *h = (kvs_hybrid *)(uintptr_t)0x1;
    kvs_hybrid_config c = cfg_of(&g, 1, caching);
    CHECK_FAILS(kvs_hybrid_new(&c, &h), KVS_STATUS_INVALID_CONFIG, "groups.window");
    CHECK(h == (kvs_hybrid *)(uintptr_t)0x1);
}

static kvs_hybrid *make(uint32_t mode, bool caching) {
    kvs_group g[2] = {
        {KVS_GROUP_KIND_FULL, 0, 4096},
        {KVS_GROUP_KIND_STATE, mode, 4096},
    };
    kvs_hybrid_config c = cfg_of(g, 2, caching);
    kvs_hybrid *h = NULL;
    CHECK_OK(kvs_hybrid_new(&c, &h));
    return h;
}

static size_t pages_of(kvs_hybrid *h, uint64_t seq, uint32_t *out) {
    size_t n = 0;
    CHECK_OK(kvs_hybrid_seq_pages(h, seq, 1, out, 8, &n));
    return n;
}

int main(void) {
    /* Modes: 3 is none; none needs prefix caching off, all and align need it on. */
    bad_config((kvs_group){KVS_GROUP_KIND_STATE, 3, 1}, true);
    bad_config((kvs_group){KVS_GROUP_KIND_STATE, KVS_STATE_MODE_NONE, 1}, true);
    bad_config((kvs_group){KVS_GROUP_KIND_STATE, KVS_STATE_MODE_ALL, 1}, false);
    bad_config((kvs_group){KVS_GROUP_KIND_STATE, KVS_STATE_MODE_ALIGN, 1}, false);

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
    kvs_hybrid_begin_info bi;

    /* "all": a checkpoint per page. */
    kvs_hybrid *h = make(KVS_STATE_MODE_ALL, true);
    kvs_group_info gi;
    CHECK_OK(kvs_hybrid_group_info(h, 1, &gi));
    CHECK_EQ(gi.kind, KVS_GROUP_KIND_STATE);
    CHECK_EQ(gi.window, KVS_STATE_MODE_ALL);
    CHECK_EQ(gi.num_pools, 1);
    CHECK_OK(kvs_hybrid_seq_begin(h, 1, toks, 10, NULL, SIZE_MAX, 0, &bi));
    CHECK_EQ(bi.new_pages, 6);
    CHECK_EQ(pages_of(h, 1, p), 3);
    uint32_t state = SENT;
    CHECK_OK(kvs_hybrid_seq_state_page(h, 1, 1, &state));
    CHECK_EQ(state, p[2]);
    /* The checkpoint after 8 tokens was registered in this step: not usable yet. */
    bi.matched_tokens = SENT;
    CHECK_FAILS(kvs_hybrid_seq_begin(h, 2, follow, 11, NULL, 10, 0, &bi), KVS_STATUS_NO_SPACE,
                NULL);
    CHECK_EQ(bi.matched_tokens, SENT);
    CHECK_OK(kvs_hybrid_check(h));
    CHECK_OK(kvs_hybrid_new_step(h));
    CHECK_OK(kvs_hybrid_seq_begin(h, 2, follow, 11, NULL, 10, 0, &bi));
    CHECK_EQ(bi.matched_tokens, 8);
    uint32_t q[8];
    CHECK_EQ(pages_of(h, 2, q), 3);
    CHECK_EQ(q[0], KVS_NULL_PAGE);
    CHECK_EQ(q[1], p[1]);
    size_t released = SENT;
    CHECK_OK(kvs_hybrid_seq_release_skipped(h, 1, 10, &released));
    CHECK_EQ(released, 2);
    kvs_group_stats st;
    CHECK_OK(kvs_hybrid_stats(h, 1, &st));
    CHECK_EQ(st.pages_held, 3); /* sequence 1: its state; sequence 2: hit + running */
    kvs_group_event ev[32];
    size_t ne = 0;
    CHECK_OK(kvs_hybrid_take_events(h, ev, 32, &ne));
    for (size_t i = 0; i < ne; i++) {
        if (ev[i].group_idx == 1) {
            CHECK_EQ(ev[i].group_kind, KVS_GROUP_KIND_STATE);
            CHECK_EQ(ev[i].window, 0);
        }
    }

    /* Bad input at the state calls. */
    CHECK_FAILS(kvs_hybrid_new_step(NULL), KVS_STATUS_NULL_ARGUMENT, "hybrid");
    state = SENT;
    CHECK_FAILS(kvs_hybrid_seq_state_page(NULL, 1, 1, &state), KVS_STATUS_NULL_ARGUMENT,
                "hybrid");
    CHECK_FAILS(kvs_hybrid_seq_state_page(h, 1, 1, NULL), KVS_STATUS_NULL_ARGUMENT,
                "page_out");
    CHECK_FAILS(kvs_hybrid_seq_state_page(h, 1, 0, &state), KVS_STATUS_INVALID_ARGUMENT,
                "group");
    CHECK_FAILS(kvs_hybrid_seq_state_page(h, 1, 2, &state), KVS_STATUS_INVALID_ARGUMENT,
                "group");
    CHECK_FAILS(kvs_hybrid_seq_state_page(h, 9, 1, &state), KVS_STATUS_SEQ_NOT_FOUND, "9");
    CHECK_EQ(state, SENT);
    CHECK_OK(kvs_hybrid_seq_free(h, 1));
    CHECK_OK(kvs_hybrid_seq_free(h, 2));
    CHECK_OK(kvs_hybrid_check(h));
    kvs_hybrid_free(h);

    /* "align": the running state at the end, the previous one kept until the next release. */
    h = make(KVS_STATE_MODE_ALIGN, true);
    CHECK_OK(kvs_hybrid_seq_begin(h, 1, toks, 8, NULL, SIZE_MAX, 0, &bi));
    CHECK_EQ(bi.new_pages, 3);
    CHECK_EQ(pages_of(h, 1, p), 2);
    CHECK_EQ(p[0], KVS_NULL_PAGE);
    CHECK_FAILS(kvs_hybrid_seq_append(h, 1, toks + 8, 4, 1), KVS_STATUS_INVALID_ARGUMENT,
                "lookahead_slots");
    CHECK_OK(kvs_hybrid_seq_append(h, 1, toks + 8, 4, 0));
    CHECK_EQ(pages_of(h, 1, q), 3);
    CHECK_EQ(q[1], p[1]);
    CHECK(q[2] != KVS_NULL_PAGE && q[2] != p[1]);
    CHECK_OK(kvs_hybrid_seq_release_skipped(h, 1, 12, &released));
    CHECK_EQ(released, 1);
    CHECK_EQ(pages_of(h, 1, p), 3);
    CHECK_EQ(p[1], KVS_NULL_PAGE);
    CHECK_OK(kvs_hybrid_check(h));
    kvs_hybrid_free(h);

    /* "none": one page for the whole sequence, at the end of the table. */
    h = make(KVS_STATE_MODE_NONE, false);
    CHECK_OK(kvs_hybrid_seq_begin(h, 1, toks, 6, NULL, SIZE_MAX, 0, &bi));
    CHECK_EQ(bi.new_pages, 3);
    CHECK_OK(kvs_hybrid_seq_state_page(h, 1, 1, &state));
    CHECK_OK(kvs_hybrid_seq_append(h, 1, toks + 6, 6, 0));
    CHECK_EQ(pages_of(h, 1, p), 3);
    CHECK_EQ(p[0], KVS_NULL_PAGE);
    CHECK_EQ(p[1], KVS_NULL_PAGE);
    CHECK_EQ(p[2], state);
    CHECK_OK(kvs_hybrid_new_step(h)); /* harmless without checkpoints */
    CHECK_OK(kvs_hybrid_check(h));
    kvs_hybrid_free(h);
    printf("hybrid_state: ok\n");
    return 0;
}
