/*
 * kvs_seq_append_need / kvs_seq_swap_in_need / kvs_seq_swap_out_need: the capacity checks an
 * engine makes before an append or a swap (MindIE's CanAppendSlot / CanSwapIn / CanSwapOut) agree with what the calls then take,
 * kvs_cache_available agrees with kvs_cache_stats after every step, and bad arguments are
 * refused with outputs untouched.
 */
#include "kvs_test.h"

/* Free plus evictable device pages, read both ways (they must agree). */
static uint64_t avail_at(kvs_cache *c, const char *file, int line) {
    kvs_stats s = t_stats(c);
    size_t dev = 0, host = 0;
    if (kvs_cache_available(c, KVS_TIER_DEVICE, 0, &dev) != KVS_STATUS_OK ||
        kvs_cache_available(c, KVS_TIER_HOST, 0, &host) != KVS_STATUS_OK ||
        dev != s.device_pages_free + s.device_pages_cached ||
        host != s.host_pages_free + s.host_pages_cached) {
        fprintf(stderr, "%s:%d: kvs_cache_available %zu/%zu, stats %llu/%llu\n", file, line,
                dev, host, (unsigned long long)(s.device_pages_free + s.device_pages_cached),
                (unsigned long long)(s.host_pages_free + s.host_pages_cached));
        exit(1);
    }
    return dev;
}
#define avail(c) avail_at((c), __FILE__, __LINE__)

int main(void) {
    kvs_config cfg = kvs_config_default();
    cfg.page_size = 4;
    cfg.num_device_pages = 8;
    cfg.num_host_pages = 8;
    kvs_cache *c = NULL;
    CHECK_OK(kvs_cache_new(&cfg, &c));
    int32_t t[6];
    t_iota(t, 6, 1);
    CHECK_EQ(avail(c), 8);
    CHECK_OK(kvs_seq_begin(c, 1, t, 6, NULL, SIZE_MAX, 0, NULL));
    CHECK_EQ(avail(c), 6);
    CHECK_OK(kvs_seq_fork(c, 1, 2));
    CHECK_EQ(avail(c), 6);

    /* A fork writing into the shared partial page: one copy-on-write page + one new page. */
    size_t pages = 99, copies = 99;
    CHECK_OK(kvs_seq_append_need(c, 2, 3, 0, &pages, &copies));
    CHECK_EQ(pages, 2);
    CHECK_EQ(copies, 1);
    uint64_t before = avail(c);
    int32_t more[3] = {50, 51, 52};
    kvs_copy cp[1];
    size_t n = 0;
    CHECK_OK(kvs_seq_append(c, 2, more, 3, 0, cp, 1, &n));
    CHECK_EQ(n, copies);
    CHECK_EQ(before - avail(c), pages);

    /* Bad arguments: outputs untouched. */
    pages = 77;
    CHECK_FAILS(kvs_seq_append_need(NULL, 2, 1, 0, &pages, NULL), KVS_STATUS_NULL_ARGUMENT, "cache");
    CHECK_FAILS(kvs_seq_append_need(c, 2, 1, 0, NULL, NULL), KVS_STATUS_NULL_ARGUMENT, "pages_needed_out");
    CHECK_FAILS(kvs_seq_append_need(c, 9, 1, 0, &pages, NULL), KVS_STATUS_SEQ_NOT_FOUND, "9");
    CHECK_FAILS(kvs_seq_append_need(c, 2, 1, SIZE_MAX, &pages, NULL), KVS_STATUS_INVALID_ARGUMENT,
           "lookahead_slots");
    CHECK_EQ(pages, 77);

    /* Swap-in need: full pages still cached on the device are shared back, not copied. */
    kvs_copy out[8];
    CHECK_OK(kvs_seq_swap_out(c, 2, out, 8, &n));
    CHECK_EQ(n, 3);
    CHECK_FAILS(kvs_seq_append_need(c, 2, 1, 0, &pages, NULL), KVS_STATUS_SEQ_WRONG_TIER, "host");
    size_t need = 0, can = 0;
    CHECK_OK(kvs_seq_swap_in_need(c, 2, &need, &can));
    CHECK_EQ(need, 1);
    CHECK(can >= need);
    CHECK_OK(kvs_seq_swap_in(c, 2, out, 8, &n));
    CHECK_EQ(n, need);
    CHECK_FAILS(kvs_seq_swap_in_need(c, 2, &need, NULL), KVS_STATUS_SEQ_WRONG_TIER, "device");
    CHECK_FAILS(kvs_seq_swap_in_need(c, 2, NULL, NULL), KVS_STATUS_NULL_ARGUMENT, "pages_needed_out");
    avail(c);

    /* Swap-out need: seq 2's swap-out left its full pages indexed on the host, so seq 1 (which
     * shares the first of them) copies only its partial page; the cached host page it shares
     * leaves the evictable count. */
    size_t host_before = 0;
    CHECK_OK(kvs_cache_available(c, KVS_TIER_HOST, 0, &host_before));
    CHECK_EQ(host_before, 8);
    CHECK_OK(kvs_seq_swap_out_need(c, 1, &need, &can));
    CHECK_EQ(need, 1);
    CHECK_EQ(can, 7);
    CHECK_OK(kvs_seq_swap_out(c, 1, out, 8, &n));
    CHECK_EQ(n, need);
    CHECK_OK(kvs_cache_available(c, KVS_TIER_HOST, 0, &host_before));
    CHECK_EQ(host_before, 6);
    need = 33;
    CHECK_FAILS(kvs_seq_swap_out_need(c, 1, &need, NULL), KVS_STATUS_SEQ_WRONG_TIER, "host");
    CHECK_FAILS(kvs_seq_swap_out_need(c, 9, &need, NULL), KVS_STATUS_SEQ_NOT_FOUND, "9");
    CHECK_FAILS(kvs_seq_swap_out_need(NULL, 2, &need, NULL), KVS_STATUS_NULL_ARGUMENT, "cache");
    CHECK_FAILS(kvs_seq_swap_out_need(c, 2, NULL, NULL), KVS_STATUS_NULL_ARGUMENT, "pages_needed_out");
    CHECK_EQ(need, 33);
    CHECK_OK(kvs_seq_swap_in(c, 1, out, 8, &n));
    avail(c);

    size_t got = 55;
    CHECK_FAILS(kvs_cache_available(NULL, KVS_TIER_DEVICE, 0, &got), KVS_STATUS_NULL_ARGUMENT, "cache");
    CHECK_FAILS(kvs_cache_available(c, 7, 0, &got), KVS_STATUS_INVALID_ARGUMENT, "tier");
    CHECK_FAILS(kvs_cache_available(c, KVS_TIER_DEVICE, 0, NULL), KVS_STATUS_NULL_ARGUMENT, "pages_out");
    CHECK_EQ(got, 55);

    CHECK_CACHE(c);
    CHECK_OK(kvs_seq_free(c, 1));
    avail(c);
    CHECK_OK(kvs_seq_free(c, 2));
    CHECK_EQ(avail(c), 8); /* every page free or cached again */
    CHECK_CACHE(c);
    kvs_cache_free(c);
    printf("capacity: ok\n");
    return 0;
}
