/*
 * The article's scenario, driven through the C ABI the way a serving engine would:
 *  - requests sharing a system prompt store its pages once (stats: pages in use / shared,
 *    logical vs physical tokens); refcounts go up and down; a page is freed only after its
 *    last user: then cached and reusable by a later prompt, and free after kvs_prefix_clear;
 *  - multi-turn chat: turn 2 repeats turn 1's prompt + output and hits all its full pages;
 *    a fully cached prompt with max_match_tokens = n - 1 (skip_cached_writes on and off);
 *  - copy-on-write after fork reports the right (src, dst, num_tokens);
 *  - swap out / swap in pairs, with and without device prefix hits;
 *  - defer_commit mode with kvs_cache_commit;
 *  - the page-level API: alloc / acquire / release, register / match with and without
 *    acquire, eviction, and salt / LoRA / multimodal extra keys isolating pages.
 * kvs_cache_check is OK after every step.
 */
#include "kvs_test.h"

#define PS 4u
#define MAXP 64

static kvs_cache *make(uint32_t dev, uint32_t host, bool defer, bool skip_cached_writes) {
    kvs_config cfg = kvs_config_default();
    cfg.page_size = PS;
    cfg.num_device_pages = dev;
    cfg.num_host_pages = host;
    cfg.defer_commit = defer;
    cfg.skip_cached_writes = skip_cached_writes;
    kvs_cache *c = NULL;
    CHECK_OK(kvs_cache_new(&cfg, &c));
    CHECK_CACHE(c);
    return c;
}

static kvs_seq_info begin(kvs_cache *c, uint64_t id, const int32_t *t, size_t n,
                          const kvs_extra_keys *x, size_t max_match) {
    kvs_seq_info i;
    memset(&i, 0xEE, sizeof i);
    CHECK_OK(kvs_seq_begin(c, id, t, n, x, max_match, 0, &i));
    CHECK_EQ(i.num_tokens, n);
    CHECK_EQ(i.num_pages, (n + PS - 1) / PS);
    CHECK_EQ(i.tier, T_TIER_DEVICE);
    CHECK_CACHE(c);
    return i;
}

static size_t pages_of(const kvs_cache *c, uint64_t id, uint32_t *out) {
    size_t n = 0;
    CHECK_OK(kvs_seq_pages(c, 0, id, out, MAXP, &n));
    return n;
}

static void append(kvs_cache *c, uint64_t id, const int32_t *t, size_t n, size_t *ncopies,
                   kvs_copy *copies) {
    kvs_copy local[4];
    size_t nc = 99;
    CHECK_OK(kvs_seq_append(c, id, t, n, 0, copies ? copies : local, 4, &nc));
    if (ncopies) {
        *ncopies = nc;
    } else {
        CHECK_EQ(nc, 0);
    }
    CHECK_CACHE(c);
}

static void shared_system_prompt(void) {
    kvs_cache *c = make(32, 0, false, true);
    int32_t sys[8];
    t_iota(sys, 8, 1000); /* two full pages of system prompt */
    int32_t a[11], b[14], q[9];
    memcpy(a, sys, sizeof sys);
    memcpy(b, sys, sizeof sys);
    memcpy(q, sys, sizeof sys);
    t_iota(a + 8, 3, 100);
    t_iota(b + 8, 6, 200);
    t_iota(q + 8, 1, 300);

    kvs_seq_info ia = begin(c, 1, a, 11, NULL, SIZE_MAX);
    CHECK_EQ(ia.matched_tokens, 0);
    CHECK_EQ(ia.new_pages, 3);
    kvs_seq_info ib = begin(c, 2, b, 14, NULL, SIZE_MAX);
    CHECK_EQ(ib.matched_tokens, 8);
    CHECK_EQ(ib.new_pages, 2);
    kvs_seq_info iq = begin(c, 3, q, 9, NULL, SIZE_MAX);
    CHECK_EQ(iq.matched_tokens, 8);
    CHECK_EQ(iq.new_pages, 1);

    uint32_t pa[MAXP], pb[MAXP], pq[MAXP];
    CHECK_EQ(pages_of(c, 1, pa), 3);
    CHECK_EQ(pages_of(c, 2, pb), 4);
    CHECK_EQ(pages_of(c, 3, pq), 3);
    for (int j = 0; j < 2; j++) {
        CHECK_EQ(pb[j], pa[j]);
        CHECK_EQ(pq[j], pa[j]);
        kvs_page_info pi = t_page(c, T_TIER_DEVICE, pa[j]);
        CHECK_EQ(pi.refcount, 3);
        CHECK_EQ(pi.state, T_PAGE_IN_USE);
        CHECK(pi.registered);
    }
    kvs_stats s = t_stats(c);
    CHECK_EQ(s.device_pages_in_use, 3 + 2 + 1); /* the system prompt is stored once */
    CHECK_EQ(s.device_pages_shared, 2);
    CHECK_EQ(s.logical_tokens, 11 + 14 + 9);
    CHECK_EQ(s.physical_tokens, 6 * PS);
    CHECK(s.physical_tokens < s.logical_tokens);
    CHECK_EQ(s.index_pages, 3); /* 2 system pages + b's third page (tokens 8..11) */
    CHECK(t_page(c, T_TIER_DEVICE, pb[2]).registered);
    CHECK_EQ(s.prefix_queries, 3);
    CHECK_EQ(s.prefix_query_tokens, 11 + 14 + 9);
    CHECK_EQ(s.prefix_hit_tokens, 16);

    /* Refcounts go down one user at a time; partial pages are freed at once. */
    CHECK_OK(kvs_seq_free(c, 1));
    CHECK_CACHE(c);
    CHECK_EQ(t_page(c, T_TIER_DEVICE, pa[0]).refcount, 2);
    CHECK_EQ(t_page(c, T_TIER_DEVICE, pa[2]).state, T_PAGE_FREE);
    CHECK_OK(kvs_seq_free(c, 2));
    CHECK_CACHE(c);
    CHECK_EQ(t_page(c, T_TIER_DEVICE, pa[1]).refcount, 1);
    CHECK_EQ(t_page(c, T_TIER_DEVICE, pb[2]).state, T_PAGE_CACHED); /* full, registered */
    CHECK_EQ(t_page(c, T_TIER_DEVICE, pb[3]).state, T_PAGE_FREE);
    CHECK_EQ(t_stats(c).device_pages_shared, 0);
    CHECK_OK(kvs_seq_free(c, 3));
    CHECK_CACHE(c);
    for (int j = 0; j < 2; j++) {
        kvs_page_info pi = t_page(c, T_TIER_DEVICE, pa[j]);
        CHECK_EQ(pi.refcount, 0);
        CHECK_EQ(pi.state, T_PAGE_CACHED); /* freed by its last user: kept for prefix hits */
        CHECK(pi.registered);
    }
    s = t_stats(c);
    CHECK_EQ(s.device_pages_in_use, 0);
    CHECK_EQ(s.device_pages_cached, 3);
    CHECK_EQ(s.device_pages_free, 32 - 3);
    CHECK_EQ(s.logical_tokens, 0);

    /* A later prompt reuses the cached pages (system prompt + b's third page). */
    int32_t d[14];
    memcpy(d, b, 12 * sizeof(int32_t));
    t_iota(d + 12, 2, 400);
    kvs_seq_info id = begin(c, 4, d, 14, NULL, SIZE_MAX);
    CHECK_EQ(id.matched_tokens, 12);
    CHECK_EQ(id.new_pages, 1);
    uint32_t pd[MAXP];
    CHECK_EQ(pages_of(c, 4, pd), 4);
    CHECK_EQ(pd[0], pa[0]);
    CHECK_EQ(pd[1], pa[1]);
    CHECK_EQ(pd[2], pb[2]);
    CHECK_EQ(t_page(c, T_TIER_DEVICE, pd[0]).refcount, 1);
    CHECK_EQ(t_stats(c).device_pages_cached, 0);
    CHECK_OK(kvs_seq_free(c, 4));
    CHECK_CACHE(c);

    /* After kvs_prefix_clear the cached pages are free and nothing matches. */
    CHECK_OK(kvs_prefix_clear(c));
    CHECK_CACHE(c);
    s = t_stats(c);
    CHECK_EQ(s.index_pages, 0);
    CHECK_EQ(s.device_pages_cached, 0);
    CHECK_EQ(s.device_pages_free, 32);
    CHECK_EQ(s.index_clears, 1);
    CHECK_EQ(t_page(c, T_TIER_DEVICE, pa[0]).state, T_PAGE_FREE);
    CHECK(!t_page(c, T_TIER_DEVICE, pa[0]).registered);
    CHECK_EQ(begin(c, 5, a, 11, NULL, SIZE_MAX).matched_tokens, 0);
    /* Clearing while pages are in use: holders keep them, but they are no longer matchable. */
    uint32_t p5[MAXP];
    CHECK_EQ(pages_of(c, 5, p5), 3);
    CHECK(t_page(c, T_TIER_DEVICE, p5[0]).registered);
    CHECK_OK(kvs_prefix_clear(c));
    CHECK_CACHE(c);
    CHECK_EQ(t_page(c, T_TIER_DEVICE, p5[0]).refcount, 1);
    CHECK(!t_page(c, T_TIER_DEVICE, p5[0]).registered);
    CHECK_EQ(begin(c, 6, a, 11, NULL, SIZE_MAX).matched_tokens, 0);
    CHECK_OK(kvs_seq_free(c, 5));
    CHECK_OK(kvs_seq_free(c, 6));
    /* Sequence 5's pages lost their entries; sequence 6 registered its own full pages. */
    CHECK_EQ(t_stats(c).device_pages_cached, 2);
    CHECK_EQ(t_stats(c).device_pages_free, 30);
    CHECK_CACHE(c);
    kvs_cache_free(c);
}

static void multi_turn(bool skip_cached_writes) {
    kvs_cache *c = make(32, 0, false, skip_cached_writes);
    /* Turn 1: a 10-token prompt, then 7 tokens decoded one at a time. */
    int32_t conv[32];
    t_iota(conv, 10, 1);
    begin(c, 1, conv, 10, NULL, 9);
    for (int i = 0; i < 7; i++) {
        conv[10 + i] = 500 + i;
        append(c, 1, &conv[10 + i], 1, NULL, NULL);
    }
    uint32_t p1[MAXP];
    CHECK_EQ(pages_of(c, 1, p1), 5); /* 17 tokens */
    CHECK_OK(kvs_seq_free(c, 1));
    CHECK_CACHE(c);
    CHECK_EQ(t_stats(c).device_pages_cached, 4); /* the 4 full pages */

    /* Turn 2 repeats prompt + output (17 tokens) and adds 5: every full page of turn 1 hits. */
    t_iota(conv + 17, 5, 900);
    kvs_seq_info i2 = begin(c, 2, conv, 22, NULL, 21);
    CHECK_EQ(i2.matched_tokens, 16);
    CHECK_EQ(i2.new_pages, 2);
    uint32_t p2[MAXP];
    CHECK_EQ(pages_of(c, 2, p2), 6);
    for (int j = 0; j < 4; j++) {
        CHECK_EQ(p2[j], p1[j]);
    }
    /* The engine computes the 6 uncached tokens: their slots are the sequence's own pages. */
    const uint64_t ids[1] = {2};
    const uint32_t ql[1] = {6};
    int64_t slots[6];
    size_t ns = 0;
    CHECK_OK(kvs_cache_slot_mapping(c, 0, ids, ql, 1, slots, 6, &ns));
    CHECK_EQ(ns, 6);
    for (uint32_t k = 0; k < 6; k++) {
        uint32_t pos = 16 + k;
        CHECK_EQ(slots[k], (int64_t)p2[pos / PS] * PS + pos % PS);
    }
    CHECK_OK(kvs_seq_free(c, 2));

    /* A prompt that is entirely cached (16 tokens = 4 full pages), matched with
     * max_match_tokens = 15 so the engine recomputes the last token for its logits. */
    kvs_seq_info i3 = begin(c, 3, conv, 16, NULL, 15);
    uint32_t p3[MAXP];
    CHECK_EQ(pages_of(c, 3, p3), 4);
    const uint64_t id3[1] = {3};
    const uint32_t q1[1] = {1};
    int64_t slot = 0;
    CHECK_OK(kvs_cache_slot_mapping(c, 0, id3, q1, 1, &slot, 1, &ns));
    CHECK_EQ(ns, 1);
    CHECK(i3.matched_tokens <= 15);
    if (skip_cached_writes) {
        /* Every cached page is shared; the last token's slot is hidden (-1) so recomputing it
         * never writes into the shared page. */
        CHECK_EQ(i3.new_pages, 0);
        CHECK_EQ(p3[3], p1[3]);
        CHECK_EQ(slot, (uint64_t)(int64_t)-1);
        CHECK_EQ(i3.matched_tokens, 15);
    } else {
        /* Only whole pages within the limit are shared; the last page is allocated fresh. */
        CHECK_EQ(i3.matched_tokens, 12);
        CHECK_EQ(i3.new_pages, 1);
        CHECK(p3[3] != p1[3]);
        CHECK_EQ(slot, (int64_t)p3[3] * PS + 3);
    }
    for (int j = 0; j < 3; j++) {
        CHECK_EQ(p3[j], p1[j]);
    }
    CHECK_OK(kvs_seq_free(c, 3));
    CHECK_CACHE(c);
    kvs_cache_free(c);
}

static void copy_on_write(void) {
    kvs_cache *c = make(32, 0, false, true);
    int32_t t[6];
    t_iota(t, 6, 10); /* 1 full page + 2 tokens in the second */
    begin(c, 1, t, 6, NULL, SIZE_MAX);
    CHECK_OK(kvs_seq_fork(c, 1, 2));
    CHECK_CACHE(c);
    uint32_t p1[MAXP], p2[MAXP];
    CHECK_EQ(pages_of(c, 1, p1), 2);
    CHECK_EQ(pages_of(c, 2, p2), 2);
    CHECK_EQ(p2[0], p1[0]);
    CHECK_EQ(p2[1], p1[1]);
    CHECK_EQ(t_stats(c).device_pages_shared, 2);
    CHECK_EQ(t_stats(c).logical_tokens, 12);
    CHECK_EQ(t_stats(c).physical_tokens, 2 * PS);

    /* The parent writes token 6 into the shared partial page: it moves to a private copy of
     * the page's first 2 slots. The child keeps the original. */
    kvs_copy cp[4];
    size_t nc = 0;
    int32_t x = 77;
    append(c, 1, &x, 1, &nc, cp);
    CHECK_EQ(nc, 1);
    uint32_t q1[MAXP];
    CHECK_EQ(pages_of(c, 1, q1), 2);
    CHECK_EQ(q1[0], p1[0]);
    CHECK(q1[1] != p1[1]);
    CHECK_EQ(cp[0].src_page, p1[1]);
    CHECK_EQ(cp[0].dst_page, q1[1]);
    CHECK_EQ(cp[0].num_tokens, 2);
    CHECK_EQ(cp[0].kind, T_COPY_D2D);
    CHECK_EQ(t_page(c, T_TIER_DEVICE, p1[1]).refcount, 1);
    CHECK_EQ(t_page(c, T_TIER_DEVICE, q1[1]).refcount, 1);
    CHECK_EQ(t_page(c, T_TIER_DEVICE, p1[0]).refcount, 2);
    CHECK_EQ(t_stats(c).cow_copies, 1);
    /* The child now owns its page alone: no copy. */
    int32_t y = 88;
    append(c, 2, &y, 1, &nc, cp);
    CHECK_EQ(nc, 0);
    CHECK_EQ(pages_of(c, 2, p2), 2);
    CHECK_EQ(p2[1], p1[1]);

    /* Fork at a page boundary: the next token opens a new page, nothing is copied. */
    int32_t u[8];
    t_iota(u, 8, 40);
    begin(c, 3, u, 8, NULL, SIZE_MAX);
    CHECK_OK(kvs_seq_fork(c, 3, 4));
    int32_t z = 99;
    append(c, 4, &z, 1, &nc, cp);
    CHECK_EQ(nc, 0);
    CHECK_EQ(t_stats(c).cow_copies, 1);

    /* A batch step over two forks of a partial page: the first copies, the second then owns
     * the original alone. */
    int32_t v[5];
    t_iota(v, 5, 60);
    begin(c, 5, v, 5, NULL, SIZE_MAX);
    CHECK_OK(kvs_seq_fork(c, 5, 6));
    uint32_t p5[MAXP];
    CHECK_EQ(pages_of(c, 5, p5), 2);
    const uint64_t ids[2] = {5, 6};
    const int32_t step[2] = {1, 2};
    nc = 0;
    CHECK_OK(kvs_seq_append_batch(c, ids, 2, step, 2, cp, 2, &nc));
    CHECK_CACHE(c);
    CHECK_EQ(nc, 1);
    CHECK_EQ(cp[0].src_page, p5[1]);
    CHECK_EQ(cp[0].num_tokens, 1);
    CHECK_EQ(cp[0].kind, T_COPY_D2D);
    uint32_t r5[MAXP], r6[MAXP];
    CHECK_EQ(pages_of(c, 5, r5), 2);
    CHECK_EQ(pages_of(c, 6, r6), 2);
    CHECK(r5[1] != r6[1]);
    CHECK(cp[0].dst_page == r5[1] || cp[0].dst_page == r6[1]);
    CHECK(r5[1] == p5[1] || r6[1] == p5[1]);

    for (uint64_t id = 1; id <= 6; id++) {
        CHECK_OK(kvs_seq_free(c, id));
        CHECK_CACHE(c);
    }
    CHECK_EQ(t_stats(c).device_pages_in_use, 0);
    kvs_cache_free(c);
}

static void swap(void) {
    kvs_cache *c = make(16, 8, false, true);
    int32_t t[10];
    t_iota(t, 10, 700); /* 2 full pages + 2 tokens */
    begin(c, 1, t, 10, NULL, SIZE_MAX);
    uint32_t dev[MAXP];
    CHECK_EQ(pages_of(c, 1, dev), 3);

    kvs_copy cp[8];
    size_t nc = 0;
    CHECK_OK(kvs_seq_swap_out(c, 1, cp, 8, &nc));
    CHECK_CACHE(c);
    CHECK_EQ(nc, 3);
    uint32_t host[MAXP];
    CHECK_EQ(pages_of(c, 1, host), 3); /* now the host block table */
    const uint32_t held[3] = {4, 4, 2};
    for (size_t j = 0; j < 3; j++) {
        CHECK_EQ(cp[j].kind, T_COPY_D2H);
        CHECK_EQ(cp[j].src_page, dev[j]);
        CHECK_EQ(cp[j].dst_page, host[j]);
        CHECK_EQ(cp[j].num_tokens, held[j]);
        CHECK(host[j] < 8);
        CHECK_EQ(t_page(c, T_TIER_HOST, host[j]).refcount, 1);
    }
    kvs_seq_info si;
    CHECK_OK(kvs_seq_info_fn(c, 1, &si));
    CHECK_EQ(si.tier, T_TIER_HOST);
    kvs_stats s = t_stats(c);
    CHECK_EQ(s.host_pages_in_use, 3);
    CHECK_EQ(s.host_pages_free, 5);
    CHECK_EQ(s.num_seqs_swapped, 1);
    CHECK_EQ(s.swap_out_pages, 3);
    CHECK_EQ(s.device_pages_in_use, 0);
    CHECK_EQ(s.device_pages_cached, 2); /* its full registered pages stay cached */
    CHECK_EQ(s.logical_tokens, 0);      /* not on the device any more */

    /* Swap in: the 2 full pages are still cached on the device (shared, no copy); the partial
     * page comes back by one host -> device copy. */
    nc = 0;
    CHECK_OK(kvs_seq_swap_in(c, 1, cp, 8, &nc));
    CHECK_CACHE(c);
    CHECK_EQ(nc, 1);
    uint32_t back[MAXP];
    CHECK_EQ(pages_of(c, 1, back), 3);
    CHECK_EQ(back[0], dev[0]);
    CHECK_EQ(back[1], dev[1]);
    CHECK_EQ(cp[0].kind, T_COPY_H2D);
    CHECK_EQ(cp[0].src_page, host[2]);
    CHECK_EQ(cp[0].dst_page, back[2]);
    CHECK_EQ(cp[0].num_tokens, 2);
    s = t_stats(c);
    CHECK_EQ(s.host_pages_in_use, 0);
    CHECK_EQ(s.num_seqs_swapped, 0);
    CHECK_EQ(s.swap_in_pages, 1);
    CHECK_EQ(s.logical_tokens, 10);

    /* Again, with the prefix index cleared while out: every page is copied back. Going out,
     * the 2 full pages are still indexed on the host (the first swap-out's copies, cached there
     * since the swap-in), so they are shared: only the partial page is copied. */
    uint32_t first_host[MAXP];
    memcpy(first_host, host, sizeof host);
    CHECK_OK(kvs_seq_swap_out(c, 1, cp, 8, &nc));
    CHECK_EQ(nc, 1);
    CHECK_EQ(pages_of(c, 1, host), 3);
    CHECK_EQ(host[0], first_host[0]);
    CHECK_EQ(host[1], first_host[1]);
    CHECK_EQ(cp[0].num_tokens, 2);
    CHECK_EQ(cp[0].dst_page, host[2]);
    CHECK_OK(kvs_prefix_clear(c));
    CHECK_CACHE(c);
    CHECK_OK(kvs_seq_swap_in(c, 1, cp, 8, &nc));
    CHECK_CACHE(c);
    CHECK_EQ(nc, 3);
    CHECK_EQ(pages_of(c, 1, back), 3);
    for (size_t j = 0; j < 3; j++) {
        CHECK_EQ(cp[j].kind, T_COPY_H2D);
        CHECK_EQ(cp[j].src_page, host[j]);
        CHECK_EQ(cp[j].dst_page, back[j]);
        CHECK_EQ(cp[j].num_tokens, held[j]);
    }
    CHECK_EQ(t_stats(c).swap_in_pages, 4);
    /* The sequence is usable again. */
    int32_t x = 1;
    append(c, 1, &x, 1, NULL, NULL);

    /* Swapping out a sequence that shares pages with a live one: the other keeps them. */
    CHECK_OK(kvs_seq_fork(c, 1, 2));
    CHECK_OK(kvs_seq_swap_out(c, 2, cp, 8, &nc));
    CHECK_CACHE(c);
    CHECK_EQ(nc, 3);
    CHECK_EQ(pages_of(c, 1, back), 3);
    for (size_t j = 0; j < 3; j++) {
        CHECK_EQ(cp[j].src_page, back[j]);
        CHECK_EQ(t_page(c, T_TIER_DEVICE, back[j]).refcount, 1);
    }
    /* A swapped-out sequence is freed from the host tier. */
    CHECK_OK(kvs_seq_free(c, 2));
    CHECK_OK(kvs_seq_free(c, 1));
    CHECK_CACHE(c);
    s = t_stats(c);
    CHECK_EQ(s.host_pages_in_use, 0);
    CHECK_EQ(s.device_pages_in_use, 0);
    CHECK_EQ(s.num_seqs, 0);
    kvs_cache_free(c);
}

static void deferred_commit(void) {
    kvs_cache *c = make(32, 0, true, true);
    int32_t t[8];
    t_iota(t, 8, 1);
    begin(c, 1, t, 8, NULL, SIZE_MAX);
    uint32_t p[MAXP];
    CHECK_EQ(pages_of(c, 1, p), 2);
    /* Full, but not matchable before the commit. */
    CHECK(!t_page(c, T_TIER_DEVICE, p[0]).registered);
    CHECK_EQ(t_stats(c).index_pages, 0);
    CHECK_EQ(begin(c, 2, t, 8, NULL, SIZE_MAX).matched_tokens, 0);
    CHECK_OK(kvs_seq_free(c, 2));
    CHECK_OK(kvs_cache_commit(c));
    CHECK_CACHE(c);
    CHECK(t_page(c, T_TIER_DEVICE, p[0]).registered);
    CHECK(t_page(c, T_TIER_DEVICE, p[1]).registered);
    CHECK_EQ(t_stats(c).index_pages, 2);
    kvs_seq_info i3 = begin(c, 3, t, 8, NULL, SIZE_MAX);
    CHECK_EQ(i3.matched_tokens, 8);
    CHECK_EQ(i3.new_pages, 0);

    /* A page filled by decoding also waits for the commit. */
    int32_t more[4] = {50, 51, 52, 53};
    append(c, 1, more, 4, NULL, NULL);
    CHECK_EQ(pages_of(c, 1, p), 3);
    CHECK(!t_page(c, T_TIER_DEVICE, p[2]).registered);
    CHECK_OK(kvs_cache_commit(c));
    CHECK_CACHE(c);
    CHECK(t_page(c, T_TIER_DEVICE, p[2]).registered);
    /* A second commit with nothing pending is a no-op. */
    kvs_stats before = t_stats(c);
    CHECK_OK(kvs_cache_commit(c));
    kvs_stats after = t_stats(c);
    CHECK(memcmp(&before, &after, sizeof before) == 0);

    CHECK_OK(kvs_seq_free(c, 1));
    CHECK_OK(kvs_seq_free(c, 3));
    CHECK_CACHE(c);
    CHECK_EQ(t_stats(c).device_pages_cached, 3);
    kvs_cache_free(c);

    /* Without defer_commit, kvs_cache_commit is a no-op. */
    kvs_cache *d = make(8, 0, false, true);
    kvs_stats s0 = t_stats(d);
    CHECK_OK(kvs_cache_commit(d));
    kvs_stats s1 = t_stats(d);
    CHECK(memcmp(&s0, &s1, sizeof s0) == 0);
    kvs_cache_free(d);
}

/* kvs_prefix_match into `out`; returns the page count and checks matched == count * PS. */
static size_t match(kvs_cache *c, const int32_t *t, size_t n, const kvs_extra_keys *x,
                    size_t max, bool acquire, uint32_t *out) {
    size_t np = 99, mt = 99;
    CHECK_OK(kvs_prefix_match(c, 0, t, n, x, max, acquire, out, MAXP, &np, &mt));
    CHECK_EQ(mt, np * PS);
    CHECK_CACHE(c);
    return np;
}

static void page_api(void) {
    kvs_cache *c = make(12, 0, false, true);
    uint32_t pg[MAXP];
    memset(pg, 0xFF, sizeof pg);
    CHECK_OK(kvs_pages_alloc(c, 0, 3, pg, 3));
    CHECK_CACHE(c);
    for (int j = 0; j < 3; j++) {
        kvs_page_info pi = t_page(c, T_TIER_DEVICE, pg[j]);
        CHECK_EQ(pi.refcount, 1);
        CHECK_EQ(pi.state, T_PAGE_IN_USE);
        CHECK(!pi.registered);
        for (int k = 0; k < j; k++) {
            CHECK(pg[k] != pg[j]);
        }
    }
    CHECK_EQ(t_stats(c).device_pages_in_use, 3);

    /* Register 3 full pages (13 tokens: the partial 4th page is not registered). */
    int32_t t[13];
    t_iota(t, 13, 3000);
    size_t reg = 99;
    CHECK_OK(kvs_prefix_register(c, 0, t, 13, pg, 3, NULL, &reg));
    CHECK_CACHE(c);
    CHECK_EQ(reg, 3);
    CHECK_EQ(t_stats(c).pages_registered, 3);
    CHECK_EQ(t_stats(c).index_pages, 3);
    /* Registering again adds nothing (registered_out is optional). */
    CHECK_OK(kvs_prefix_register(c, 0, t, 13, pg, 3, NULL, &reg));
    CHECK_EQ(reg, 0);
    CHECK_OK(kvs_prefix_register(c, 0, t, 13, pg, 3, NULL, NULL));

    /* Match without acquire: no refcount change, not counted in the hit-rate stats. */
    uint32_t m[MAXP];
    kvs_stats s0 = t_stats(c);
    CHECK_EQ(match(c, t, 13, NULL, SIZE_MAX, false, m), 3);
    for (int j = 0; j < 3; j++) {
        CHECK_EQ(m[j], pg[j]);
        CHECK_EQ(t_page(c, T_TIER_DEVICE, pg[j]).refcount, 1);
    }
    kvs_stats s1 = t_stats(c);
    CHECK_EQ(s1.prefix_queries, s0.prefix_queries);
    /* max_tokens limits the match to whole pages. */
    CHECK_EQ(match(c, t, 13, NULL, 5, false, m), 1);
    CHECK_EQ(match(c, t, 13, NULL, 12, false, m), 3);
    CHECK_EQ(match(c, t, 13, NULL, 11, false, m), 2);
    CHECK_EQ(match(c, t, 3, NULL, SIZE_MAX, false, m), 0);
    CHECK_EQ(match(c, NULL, 0, NULL, SIZE_MAX, false, m), 0);
    /* A different first page misses everything after it (chained digests). */
    int32_t t2[12];
    memcpy(t2, t, sizeof t2);
    t2[1] = 1;
    CHECK_EQ(match(c, t2, 12, NULL, SIZE_MAX, false, m), 0);
    t2[1] = t[1];
    t2[5] = 1;
    CHECK_EQ(match(c, t2, 12, NULL, SIZE_MAX, false, m), 1);

    /* Match with acquire: one caller reference per page, counted in the stats. */
    CHECK_EQ(match(c, t, 13, NULL, SIZE_MAX, true, m), 3);
    kvs_stats s2 = t_stats(c);
    CHECK_EQ(s2.prefix_queries, s0.prefix_queries + 1);
    CHECK_EQ(s2.prefix_query_tokens, s0.prefix_query_tokens + 13);
    CHECK_EQ(s2.prefix_hit_tokens, s0.prefix_hit_tokens + 12);
    CHECK_EQ(s2.device_pages_shared, 3);
    for (int j = 0; j < 3; j++) {
        CHECK_EQ(t_page(c, T_TIER_DEVICE, pg[j]).refcount, 2);
    }
    /* Release the matched references (last first), then the allocation: registered pages
     * become cached, not free. */
    const uint32_t rev[3] = {m[2], m[1], m[0]};
    CHECK_OK(kvs_pages_release(c, 0, rev, 3));
    CHECK_CACHE(c);
    CHECK_EQ(t_page(c, T_TIER_DEVICE, pg[0]).refcount, 1);
    CHECK_OK(kvs_pages_release(c, 0, rev, 3));
    CHECK_CACHE(c);
    for (int j = 0; j < 3; j++) {
        kvs_page_info pi = t_page(c, T_TIER_DEVICE, pg[j]);
        CHECK_EQ(pi.refcount, 0);
        CHECK_EQ(pi.state, T_PAGE_CACHED);
    }
    kvs_stats s3 = t_stats(c);
    CHECK_EQ(s3.device_pages_in_use, 0);
    CHECK_EQ(s3.device_pages_cached, 3);

    /* A cached page can be acquired directly (and then is not evictable), and a match with
     * acquire revives cached pages. */
    CHECK_OK(kvs_pages_acquire(c, 0, &pg[0], 1));
    CHECK_EQ(t_page(c, T_TIER_DEVICE, pg[0]).state, T_PAGE_IN_USE);
    CHECK_EQ(t_stats(c).device_pages_cached, 2);
    const uint32_t twice[2] = {pg[0], pg[0]};
    CHECK_OK(kvs_pages_acquire(c, 0, twice, 2)); /* a page may appear several times */
    CHECK_EQ(t_page(c, T_TIER_DEVICE, pg[0]).refcount, 3);
    CHECK_OK(kvs_pages_release(c, 0, twice, 2));
    CHECK_OK(kvs_pages_release(c, 0, &pg[0], 1));
    CHECK_EQ(t_page(c, T_TIER_DEVICE, pg[0]).state, T_PAGE_CACHED);
    CHECK_EQ(match(c, t, 13, NULL, SIZE_MAX, true, m), 3);
    CHECK_EQ(t_stats(c).device_pages_cached, 0);
    const uint32_t rev2[3] = {m[2], m[1], m[0]};
    CHECK_OK(kvs_pages_release(c, 0, rev2, 3));
    CHECK_CACHE(c);

    /* Eviction: 12 pages, 3 cached; allocating all 12 evicts them (the LRU first), and an
     * evicted page no longer matches. */
    uint32_t all[12];
    CHECK_OK(kvs_pages_alloc(c, 0, 10, all, 12));
    CHECK_CACHE(c);
    kvs_stats s4 = t_stats(c);
    CHECK_EQ(s4.evictions, 1);
    CHECK_EQ(s4.device_pages_cached, 2);
    CHECK_EQ(s4.index_pages, 2);
    /* Released last-first, the deepest page (pg[2]) was at the LRU head: the match keeps 2. */
    CHECK_EQ(match(c, t, 13, NULL, SIZE_MAX, false, m), 2);
    CHECK_OK(kvs_pages_alloc(c, 0, 2, all + 10, 2));
    CHECK_EQ(t_stats(c).evictions, 3);
    CHECK_EQ(t_stats(c).device_pages_free, 0);
    CHECK_EQ(match(c, t, 13, NULL, SIZE_MAX, false, m), 0);
    CHECK_STATUS(kvs_pages_alloc(c, 0, 1, m, 1), KVS_STATUS_NO_SPACE);
    CHECK_OK(kvs_pages_release(c, 0, all, 12));
    CHECK_CACHE(c);
    CHECK_EQ(t_stats(c).device_pages_free, 12);
    kvs_cache_free(c);
}

static void extra_keys(void) {
    kvs_cache *c = make(32, 0, false, true);
    int32_t t[8];
    t_iota(t, 8, 5000);
    uint32_t pg[2], m[MAXP];
    size_t reg = 0;

    /* Salt: tenant A's pages are invisible to no salt and to tenant B. */
    const uint8_t salt_a[] = {'t', 'e', 'n', 'a', 'n', 't', '-', 'a'};
    const uint8_t salt_b[] = {'t', 'e', 'n', 'a', 'n', 't', '-', 'b'};
    kvs_extra_keys xa = {0, salt_a, sizeof salt_a, NULL, 0};
    kvs_extra_keys xb = {0, salt_b, sizeof salt_b, NULL, 0};
    CHECK_OK(kvs_pages_alloc(c, 0, 2, pg, 2));
    CHECK_OK(kvs_prefix_register(c, 0, t, 8, pg, 2, &xa, &reg));
    CHECK_EQ(reg, 2);
    CHECK_EQ(match(c, t, 8, NULL, SIZE_MAX, false, m), 0);
    CHECK_EQ(match(c, t, 8, &xb, SIZE_MAX, false, m), 0);
    CHECK_EQ(match(c, t, 8, &xa, SIZE_MAX, false, m), 2);
    CHECK_EQ(m[0], pg[0]);
    /* An all-zero extra is the same as NULL ("none"). */
    kvs_extra_keys none = {0, NULL, 0, NULL, 0};
    CHECK_EQ(match(c, t, 8, &none, SIZE_MAX, false, m), 0);
    /* The same tokens without salt register separately (a different page). */
    uint32_t pn[2];
    CHECK_OK(kvs_pages_alloc(c, 0, 2, pn, 2));
    CHECK_OK(kvs_prefix_register(c, 0, t, 8, pn, 2, NULL, &reg));
    CHECK_EQ(reg, 2);
    CHECK_EQ(match(c, t, 8, &none, SIZE_MAX, false, m), 2);
    CHECK_EQ(m[0], pn[0]);
    CHECK_EQ(match(c, t, 8, &xa, SIZE_MAX, false, m), 2);
    CHECK_EQ(m[0], pg[0]);
    /* A sequence with salt A hits tenant A's pages. */
    kvs_seq_info si = begin(c, 1, t, 8, &xa, SIZE_MAX);
    CHECK_EQ(si.matched_tokens, 8);
    uint32_t sp[MAXP];
    CHECK_EQ(pages_of(c, 1, sp), 2);
    CHECK_EQ(sp[0], pg[0]);
    CHECK_EQ(begin(c, 2, t, 8, &xb, SIZE_MAX).matched_tokens, 0);

    /* LoRA: adapter 7's pages are invisible to the base model and to adapter 8. */
    int32_t u[8];
    t_iota(u, 8, 6000);
    kvs_extra_keys l7 = {7, NULL, 0, NULL, 0};
    kvs_extra_keys l8 = {8, NULL, 0, NULL, 0};
    begin(c, 3, u, 8, &l7, SIZE_MAX);
    CHECK_EQ(match(c, u, 8, NULL, SIZE_MAX, false, m), 0);
    CHECK_EQ(match(c, u, 8, &l8, SIZE_MAX, false, m), 0);
    CHECK_EQ(match(c, u, 8, &l7, SIZE_MAX, false, m), 2);
    CHECK_EQ(begin(c, 4, u, 8, &l7, SIZE_MAX).matched_tokens, 8);
    CHECK_EQ(begin(c, 5, u, 8, &l8, SIZE_MAX).matched_tokens, 0);

    /* Multimodal: an image over positions 4..7 (page 1). Page 0 holds only text before the
     * image and is shared with any prompt; page 1 matches only the same image hash. */
    int32_t v[8];
    t_iota(v, 8, 7000);
    kvs_mm_item img1 = {0x1111, 0xAAAA, 4, 4};
    kvs_mm_item img2 = {0x2222, 0xAAAA, 4, 4};
    kvs_mm_item img1_moved = {0x1111, 0xAAAA, 5, 3};
    kvs_extra_keys x1 = {0, NULL, 0, &img1, 1};
    kvs_extra_keys x2 = {0, NULL, 0, &img2, 1};
    kvs_extra_keys x1m = {0, NULL, 0, &img1_moved, 1};
    begin(c, 6, v, 8, &x1, SIZE_MAX);
    CHECK_EQ(match(c, v, 8, &x1, SIZE_MAX, false, m), 2);
    CHECK_EQ(match(c, v, 8, &x2, SIZE_MAX, false, m), 1);
    CHECK_EQ(match(c, v, 8, &x1m, SIZE_MAX, false, m), 1);
    CHECK_EQ(match(c, v, 8, NULL, SIZE_MAX, false, m), 1);
    CHECK_EQ(begin(c, 7, v, 8, &x2, SIZE_MAX).matched_tokens, 4);
    CHECK_EQ(begin(c, 8, v, 8, &x1, SIZE_MAX).matched_tokens, 8);

    for (uint64_t id = 1; id <= 8; id++) {
        CHECK_OK(kvs_seq_free(c, id));
        CHECK_CACHE(c);
    }
    CHECK_OK(kvs_pages_release(c, 0, pg, 2));
    CHECK_OK(kvs_pages_release(c, 0, pn, 2));
    CHECK_CACHE(c);
    CHECK_EQ(t_stats(c).device_pages_in_use, 0);
    kvs_cache_free(c);
}

int main(void) {
    shared_system_prompt();
    multi_turn(true);
    multi_turn(false);
    copy_on_write();
    swap();
    deferred_commit();
    page_api();
    extra_keys();
    printf("seed_scenario: ok\n");
    return 0;
}
