/*
 * Hits finer than a page through the C ABI (`kvs_config.match_unit`): kvs_prefix_find announces
 * the whole pages and the units a kvs_seq_begin then takes, the begin shares the pages and
 * queues one partial copy into the sequence's first new page, and the copy holds its source
 * until kvs_cache_take_copies hands it out. What an engine's scheduler does: look up, then
 * allocate, then run the step's copies before its KV writes. Then kvs_prefix_unregister drops
 * a page an engine found wrong.
 */
#include "kvs_test.h"

#define PS 8
#define UNIT 2
#define SENT 0xA5A5A5A5u

int main(void) {
    kvs_config cfg = kvs_config_default();
    cfg.page_size = PS;
    cfg.num_device_pages = 16;
    cfg.match_unit = UNIT;
    kvs_cache *c = NULL;
    CHECK_OK(kvs_cache_new(&cfg, &c));

    /* a: pages 0 and 1 full, 3 tokens on page 2; when it ends they all stay matchable (the
     * last page's one whole unit as a partial entry). */
    int32_t a[19];
    t_iota(a, 16, 0);
    t_iota(a + 16, 3, 1000);
    CHECK_OK(kvs_seq_begin(c, 1, a, 19, NULL, SIZE_MAX, 0, NULL));
    uint32_t pa[4];
    CHECK_EQ(t_pages(c, 0, 1, pa, 4), 3);
    CHECK_OK(kvs_seq_free(c, 1));

    /* b shares 13 tokens with a: page 0, then 5 tokens of page 1, so 2 whole units. */
    int32_t b[20];
    t_iota(b, 13, 0);
    t_iota(b + 13, 7, 50);
    size_t hit = 0;
    uint32_t found[4] = {SENT, SENT, SENT, SENT};
    CHECK_OK(kvs_prefix_find(c, b, 20, NULL, SIZE_MAX, found, 4, 4, &hit));
    CHECK_EQ(hit, PS + 2 * UNIT);
    CHECK_EQ(found[0], pa[0]); /* the whole page only: the units are copied, not shared */
    CHECK_EQ(found[1], SENT);
    CHECK_OK(kvs_prefix_find(c, b, 20, NULL, PS + 2 * UNIT - 1, NULL, 0, 0, &hit));
    CHECK_EQ(hit, PS + UNIT); /* a limit inside a unit drops it */
    CHECK_OK(kvs_prefix_find(c, b, 20, NULL, PS - 1, NULL, 0, 0, &hit));
    CHECK_EQ(hit, 3 * UNIT); /* no whole page: units of page 0 */
    kvs_stats before = t_stats(c);
    CHECK_OK(kvs_prefix_find(c, b, 20, NULL, SIZE_MAX, NULL, 0, 0, &hit));
    kvs_stats after = t_stats(c);
    CHECK(memcmp(&before, &after, sizeof before) == 0); /* read-only: nothing counted */

    /* The begin takes what the lookup announced. */
    kvs_seq_info bi;
    CHECK_OK(kvs_seq_begin(c, 2, b, 20, NULL, 19, 0, &bi));
    CHECK_EQ(bi.matched_tokens, PS + 2 * UNIT);
    uint32_t pb[4];
    CHECK_EQ(t_pages(c, 0, 2, pb, 4), 3);
    CHECK_EQ(pb[0], pa[0]);
    CHECK(pb[1] != pa[1]);
    kvs_stats s = t_stats(c);
    CHECK_EQ(s.unit_hits, 1);
    CHECK_EQ(s.unit_hit_tokens, 2 * UNIT);
    /* The source is held until the copy is handed out, then cached again. */
    kvs_page_info pi;
    CHECK_OK(kvs_page_get_info(c, KVS_TIER_DEVICE, 0, pa[1], &pi));
    CHECK_EQ(pi.refcount, 1);
    kvs_copy cp[4];
    size_t n = 0;
    CHECK_OK(kvs_cache_take_copies(c, cp, 4, &n));
    CHECK_EQ(n, 1);
    CHECK_EQ(cp[0].src_page, pa[1]);
    CHECK_EQ(cp[0].dst_page, pb[1]);
    CHECK_EQ(cp[0].num_tokens, 2 * UNIT);
    CHECK_EQ(cp[0].kind, KVS_COPY_KIND_DEVICE_TO_DEVICE);
    CHECK_OK(kvs_page_get_info(c, KVS_TIER_DEVICE, 0, pa[1], &pi));
    CHECK_EQ(pi.refcount, 0);
    CHECK_EQ(pi.state, KVS_PAGE_STATE_CACHED);
    CHECK_CACHE(c);

    /* A third prompt finds a's page 1 again: cached once its copy was taken. */
    int32_t d[16];
    t_iota(d, 12, 0);
    t_iota(d + 12, 4, 70);
    CHECK_OK(kvs_prefix_find(c, d, 16, NULL, SIZE_MAX, NULL, 0, 0, &hit));
    CHECK_EQ(hit, PS + 2 * UNIT);
    CHECK_OK(kvs_seq_free(c, 2));
    CHECK_CACHE(c);

    /* A page whose KV a failed load left wrong: its entry (and its units) dropped, the page
     * freed; nothing after it is reachable without it. */
    size_t removed = 0;
    CHECK_OK(kvs_prefix_unregister(c, 0, &pa[0], 1, &removed));
    CHECK_EQ(removed, 1);
    CHECK_OK(kvs_page_get_info(c, KVS_TIER_DEVICE, 0, pa[0], &pi));
    CHECK_EQ(pi.state, KVS_PAGE_STATE_FREE);
    CHECK(!pi.registered);
    CHECK_OK(kvs_prefix_find(c, d, 16, NULL, SIZE_MAX, NULL, 0, 0, &hit));
    CHECK_EQ(hit, 0);
    CHECK_OK(kvs_prefix_unregister(c, 0, &pa[0], 1, &removed));
    CHECK_EQ(removed, 0);
    CHECK_CACHE(c);
    kvs_cache_free(c);
    return 0;
}
