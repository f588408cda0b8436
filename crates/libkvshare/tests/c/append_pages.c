/*
 * kvs_seq_append_pages: an append that returns the block table's tail in the same call (what
 * an engine keeping its own block table reads after each step). It must equal
 * kvs_seq_append followed by kvs_seq_pages, including copy-on-write and lookahead, and refuse
 * bad arguments before changing anything.
 */
#include "kvs_test.h"

static size_t table(kvs_cache *c, uint64_t seq, uint32_t *out, size_t len) {
    size_t n = 0;
    CHECK_OK(kvs_seq_pages(c, 0, seq, out, len, &n));
    return n;
}

int main(void) {
    kvs_config cfg = kvs_config_default();
    cfg.page_size = 4;
    cfg.num_device_pages = 12;
    kvs_cache *c = NULL;
    CHECK_OK(kvs_cache_new(&cfg, &c));
    int32_t t[32];
    t_iota(t, 32, 1);
    uint32_t before[16], after[16], tail[16];
    kvs_copy cp[1];
    size_t ncp = 99, ntail = 99;

    /* 5 tokens: 2 pages. Appending 4 more crosses into a third page: the tail from index 2 is
     * exactly the new page. */
    CHECK_OK(kvs_seq_begin(c, 1, t, 5, NULL, SIZE_MAX, 0, NULL));
    size_t nb = table(c, 1, before, 16);
    CHECK_EQ(nb, 2);
    CHECK_OK(kvs_seq_append_pages(c, 1, t + 5, 4, 0, cp, 1, &ncp, nb, tail, 16, &ntail));
    CHECK_EQ(ncp, 0);
    size_t na = table(c, 1, after, 16);
    CHECK_EQ(na, 3);
    CHECK_EQ(ntail, 1);
    CHECK_EQ(tail[0], after[2]);
    CHECK_EQ(after[0], before[0]);
    CHECK_EQ(after[1], before[1]);

    /* No page added: an empty tail. From index 0: the whole table. */
    CHECK_OK(kvs_seq_append_pages(c, 1, t + 9, 1, 0, cp, 1, &ncp, na, tail, 16, &ntail));
    CHECK_EQ(ntail, 0);
    CHECK_OK(kvs_seq_append_pages(c, 1, NULL, 0, 0, cp, 1, &ncp, 0, tail, 16, &ntail));
    CHECK_EQ(ntail, 3);
    for (size_t i = 0; i < 3; i++) CHECK_EQ(tail[i], after[i]);

    /* Lookahead slots allocate pages too (10 tokens + 7 slots = 5 pages). */
    CHECK_OK(kvs_seq_append_pages(c, 1, NULL, 0, 7, cp, 1, &ncp, 3, tail, 16, &ntail));
    CHECK_EQ(ntail, 2);
    na = table(c, 1, after, 16);
    CHECK_EQ(na, 5);
    CHECK_EQ(tail[0], after[3]);
    CHECK_EQ(tail[1], after[4]);

    /* Copy-on-write: a fork writing into the shared partial page gets a private copy, which is
     * reported and appears in the tail read from that page's index. */
    CHECK_OK(kvs_seq_begin(c, 2, t, 6, NULL, SIZE_MAX, 0, NULL));
    CHECK_OK(kvs_seq_fork(c, 2, 3));
    nb = table(c, 3, before, 16);
    CHECK_OK(kvs_seq_append_pages(c, 3, t + 6, 1, 0, cp, 1, &ncp, 1, tail, 16, &ntail));
    CHECK_EQ(ncp, 1);
    CHECK_EQ(ntail, 1);
    CHECK_EQ(cp[0].src_page, before[1]);
    CHECK_EQ(cp[0].dst_page, tail[0]);
    CHECK(tail[0] != before[1]);

    /* Bad arguments: nothing changes, outputs untouched. */
    kvs_stats s0 = t_stats(c);
    uint32_t guard[2] = {777, 777};
    ncp = ntail = 55;
    na = table(c, 1, after, 16);
    CHECK_FAILS(kvs_seq_append_pages(NULL, 1, t, 1, 0, cp, 1, &ncp, na, guard, 2, &ntail),
           KVS_STATUS_NULL_ARGUMENT, "cache");
    CHECK_FAILS(kvs_seq_append_pages(c, 1, t, 1, 0, cp, 1, &ncp, na, NULL, 2, &ntail),
           KVS_STATUS_NULL_ARGUMENT, "pages_out");
    CHECK_FAILS(kvs_seq_append_pages(c, 1, t, 1, 0, cp, 1, &ncp, na, guard, 2, NULL),
           KVS_STATUS_NULL_ARGUMENT, "num_pages_out");
    CHECK_FAILS(kvs_seq_append_pages(c, 1, t, 1, 0, cp, 1, NULL, na, guard, 2, &ntail),
           KVS_STATUS_NULL_ARGUMENT, "num_copies_out");
    CHECK_FAILS(kvs_seq_append_pages(c, 1, NULL, 1, 0, cp, 1, &ncp, na, guard, 2, &ntail),
           KVS_STATUS_NULL_ARGUMENT, "tokens");
    CHECK_FAILS(kvs_seq_append_pages(c, 9, t, 1, 0, cp, 1, &ncp, 0, guard, 2, &ntail),
           KVS_STATUS_SEQ_NOT_FOUND, "9");
    /* Past the table the append would leave (5 pages; 10 tokens + 1 fit in them). */
    CHECK_FAILS(kvs_seq_append_pages(c, 1, t, 1, 0, cp, 1, &ncp, na + 1, guard, 2, &ntail),
           KVS_STATUS_INVALID_ARGUMENT, "first_page");
    /* The whole table (5) does not fit in 2. */
    CHECK_FAILS(kvs_seq_append_pages(c, 1, t, 1, 0, cp, 1, &ncp, 0, guard, 2, &ntail),
           KVS_STATUS_BUFFER_TOO_SMALL, "pages_out");
    /* Room for the tail is checked against what the append adds: 20 more tokens (30 slots)
     * need 3 more pages, before the free pages are counted. */
    CHECK_FAILS(kvs_seq_append_pages(c, 1, t, 20, 0, cp, 1, &ncp, na, guard, 2, &ntail),
           KVS_STATUS_BUFFER_TOO_SMALL, "pages_out");
    /* 11 tokens + 40 slots: 8 more pages, 4 are free. */
    CHECK_FAILS(kvs_seq_append_pages(c, 1, t, 1, 40, cp, 1, &ncp, na, tail, 16, &ntail),
           KVS_STATUS_NO_SPACE, "");
    CHECK_FAILS(kvs_seq_append_pages(c, 1, t, SIZE_MAX, 0, cp, 1, &ncp, na, guard, 2, &ntail),
           KVS_STATUS_INVALID_ARGUMENT, "tokens");
    CHECK_EQ(ncp, 55);
    CHECK_EQ(ntail, 55);
    CHECK_EQ(guard[0], 777);
    CHECK_EQ(guard[1], 777);
    kvs_stats s1 = t_stats(c);
    CHECK(memcmp(&s0, &s1, sizeof s0) == 0);
    kvs_seq_info si;
    CHECK_OK(kvs_seq_get_info(c, 1, &si));
    CHECK_EQ(si.num_tokens, 10);
    CHECK_EQ(si.num_pages, 5);

    CHECK_OK(kvs_cache_check(c));
    kvs_cache_free(c);
    printf("append_pages: ok\n");
    return 0;
}
