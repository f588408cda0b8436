/*
 * Regression test for a library bug the C harness found (now fixed).
 *
 * kvs_seq_append computes `old + num_tokens + lookahead_slots` unchecked
 * (State::append_need and State::append_unchecked in src/core/seq.rs). A huge
 * lookahead_slots (SIZE_MAX, e.g. a caller passing (size_t)-1 for "none") overflows: in debug
 * builds the call panics, returns KVS_STATUS_PANIC and poisons the cache (every later call is
 * KVS_STATUS_POISONED); in release builds (overflow-checks off) the sum wraps and the call
 * silently reserves fewer slots than asked. Expected: KVS_STATUS_NO_SPACE (or
 * INVALID_ARGUMENT naming lookahead_slots), nothing changed, the cache still usable.
 */
#include "kvs_test.h"

int main(void) {
    kvs_config cfg = kvs_config_default();
    cfg.page_size = 4;
    cfg.num_device_pages = 16;
    kvs_cache *c = NULL;
    CHECK_OK(kvs_cache_new(&cfg, &c));
    int32_t t[6];
    t_iota(t, 6, 1);
    CHECK_OK(kvs_seq_begin(c, 1, t, 6, NULL, SIZE_MAX, 0, NULL));
    kvs_stats before = t_stats(c);
    const size_t huge[] = {SIZE_MAX, SIZE_MAX - 1, SIZE_MAX / 2 + 1};
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
        kvs_copy cp[1];
        size_t n = 0;
        uint32_t st = (uint32_t)kvs_seq_append(c, 1, t, 1, huge[i], cp, 1, &n);
        if (st != KVS_STATUS_NO_SPACE && st != KVS_STATUS_INVALID_ARGUMENT) {
            T_FAIL("append with lookahead_slots %zu returned %s: \"%s\"", huge[i],
                   kvs_status_str(st), kvs_last_error_message());
        }
        CHECK_CACHE(c);
    }
    kvs_stats after = t_stats(c);
    CHECK(memcmp(&before, &after, sizeof before) == 0);
    CHECK_OK(kvs_seq_free(c, 1));
    kvs_cache_free(c);
    printf("bug_append_lookahead_overflow: fixed\n");
    return 0;
}
