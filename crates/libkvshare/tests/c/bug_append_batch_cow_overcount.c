/*
 * Regression test for a library bug the C harness found (now fixed).
 *
 * kvs_seq_append_batch checks the pages a batch needs before changing anything
 * (State::append_batch in src/core/seq.rs), summing append_need() per sequence against the
 * state before the batch. When two forks of one sequence share a partial last page, each is
 * counted as needing a copy-on-write page, but only the first one copies: after it moves to
 * its copy, the second holds the original alone. So the batch asks for one page too many and
 * fails with KVS_STATUS_NO_SPACE ("2 needed, 1 free") when exactly one page is free, although
 * appending the same tokens one sequence at a time succeeds. (It likewise demands room for 2
 * copies where 1 is reported.) A decode step of n-best / beam sequences is refused at the edge
 * of memory, and the scheduler preempts needlessly.
 */
#include "kvs_test.h"

int main(void) {
    kvs_config cfg = kvs_config_default();
    cfg.page_size = 4;
    cfg.num_device_pages = 3; /* the sequence takes 2, one is free */
    kvs_cache *c = NULL;
    CHECK_OK(kvs_cache_new(&cfg, &c));
    int32_t t[6];
    t_iota(t, 6, 1);
    CHECK_OK(kvs_seq_begin(c, 1, t, 6, NULL, SIZE_MAX, 0, NULL));
    CHECK_OK(kvs_seq_fork(c, 1, 2));
    CHECK_EQ(t_stats(c).device_pages_free, 1);

    const uint64_t ids[2] = {1, 2};
    const int32_t step[2] = {7, 8};
    kvs_copy cp[2];
    size_t n = 0;
    CHECK_OK(kvs_seq_append_batch(c, ids, 2, step, 2, cp, 2, &n));
    CHECK_EQ(n, 1);
    CHECK_CACHE(c);
    CHECK_OK(kvs_seq_free(c, 1));
    CHECK_OK(kvs_seq_free(c, 2));
    kvs_cache_free(c);
    printf("bug_append_batch_cow_overcount: fixed\n");
    return 0;
}
