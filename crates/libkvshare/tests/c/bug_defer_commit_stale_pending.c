/*
 * Regression test for a library bug the C harness found (now fixed).
 *
 * With defer_commit, kvs_seq_free does not remove the sequence from the commit queue
 * (State::pending in src/core/state.rs; State::free in src/core/seq.rs leaves it). If the id is
 * reused before the next kvs_cache_commit by a sequence with no full page to commit (a short
 * prompt, or a fork of a fully committed parent), the queue holds an id whose sequence is not
 * flagged pending, and kvs_cache_check reports INVARIANT_VIOLATION ("sequence 1 queued for
 * commit but not flagged pending") although nothing is wrong with the pages. Engines that
 * recycle integer request ids (slot indices) hit this on every reuse within a step.
 */
#include "kvs_test.h"

int main(void) {
    kvs_config cfg = kvs_config_default();
    cfg.page_size = 4;
    cfg.num_device_pages = 16;
    cfg.defer_commit = true;
    kvs_cache *c = NULL;
    CHECK_OK(kvs_cache_new(&cfg, &c));
    int32_t t[8];
    t_iota(t, 8, 1);

    /* Short prompt reusing the id. */
    CHECK_OK(kvs_seq_begin(c, 1, t, 8, NULL, SIZE_MAX, 0, NULL)); /* 2 full pages: queued */
    CHECK_OK(kvs_seq_free(c, 1));                              /* freed before the commit */
    CHECK_OK(kvs_seq_begin(c, 1, t, 3, NULL, SIZE_MAX, 0, NULL)); /* same id, no full page */
    CHECK_CACHE(c);
    CHECK_OK(kvs_cache_commit(c));
    CHECK_OK(kvs_seq_free(c, 1));

    /* Fork of a committed parent into a recycled id. */
    CHECK_OK(kvs_seq_begin(c, 2, t, 8, NULL, SIZE_MAX, 0, NULL));
    CHECK_OK(kvs_cache_commit(c));
    int32_t u[8];
    t_iota(u, 8, 100);
    CHECK_OK(kvs_seq_begin(c, 3, u, 8, NULL, SIZE_MAX, 0, NULL)); /* uncached: queued */
    CHECK_OK(kvs_seq_free(c, 3));
    CHECK_OK(kvs_seq_fork(c, 2, 3));
    CHECK_CACHE(c);
    CHECK_OK(kvs_seq_free(c, 2));
    CHECK_OK(kvs_seq_free(c, 3));
    CHECK_CACHE(c);
    kvs_cache_free(c);
    printf("bug_defer_commit_stale_pending: fixed\n");
    return 0;
}
