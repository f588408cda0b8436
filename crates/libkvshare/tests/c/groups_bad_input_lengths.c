/*
 * Bad input at every entry point of a cache of KV-cache groups: unknown sequence ids, NULL
 * pointers with lengths, overflowing lengths, short buffers; and at kvs_cpu_huge_pages.
 * groups_bad_input.h says what every call is held to.
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS under -std=c11 */
#include <sys/mman.h>

#include "groups_bad_input.h"

/* Unknown (never begun, freed, doubly freed, extreme) sequence ids at every sequence call. */
static void unknown_ids(void) {
    int32_t tok[4] = {1, 2, 3, 4};
    kvs_seq_info si;
    uint32_t pages[16];
    int32_t table[16];
    int32_t lens[2];
    int64_t slots[8];
    size_t n, n2;
    uint32_t page;
    SENTINEL(si);
    SENTINEL(pages);
    SENTINEL(table);
    SENTINEL(lens);
    SENTINEL(slots);
    SENTINEL(n);
    SENTINEL(n2);
    SENTINEL(page);
    const uint64_t unknown[] = {50, 3 /* freed */, 0, UINT64_MAX};
    const char *names[] = {"50", "3", "0", "18446744073709551615"};
    for (size_t i = 0; i < 4; i++) {
        uint64_t id = unknown[i];
        const char *name = names[i];
        EXPECT(kvs_seq_release_skipped(h, id, 4, &n), KVS_STATUS_SEQ_NOT_FOUND, name);
        EXPECT(kvs_seq_append(h, id, tok, 1, 0, CP, 8, &NC), KVS_STATUS_SEQ_NOT_FOUND, name);
        EXPECT(kvs_seq_append_need(h, id, 1, 0, &n, NULL), KVS_STATUS_SEQ_NOT_FOUND, name);
        EXPECT(kvs_seq_free(h, id), KVS_STATUS_SEQ_NOT_FOUND, name);
        EXPECT(kvs_seq_get_info(h, id, &si), KVS_STATUS_SEQ_NOT_FOUND, name);
        EXPECT(kvs_seq_pages(h, 0, id, pages, 16, &n), KVS_STATUS_SEQ_NOT_FOUND, name);
        EXPECT(kvs_seq_state_page(h, id, 2, &page), KVS_STATUS_SEQ_NOT_FOUND, name);
        EXPECT(kvs_seq_fork(h, id, 70), KVS_STATUS_SEQ_NOT_FOUND, name);
        EXPECT(kvs_seq_swap_out(h, id, CP, 8, &NC), KVS_STATUS_SEQ_NOT_FOUND, name);
        EXPECT(kvs_seq_swap_in(h, id, CP, 8, &NC), KVS_STATUS_SEQ_NOT_FOUND, name);
        EXPECT(kvs_seq_set_priority(h, id, 1), KVS_STATUS_SEQ_NOT_FOUND, name);
        const uint64_t pair[2] = {1, id};
        const uint32_t q[2] = {1, 1};
        EXPECT(kvs_cache_block_tables(h, 1, pair, 2, 8, -1, table, 16, lens, 2),
               KVS_STATUS_SEQ_NOT_FOUND, name);
        EXPECT(kvs_cache_slot_mapping(h, 1, pair, q, 2, slots, 8, &n2),
               KVS_STATUS_SEQ_NOT_FOUND, name);
    }
    UNTOUCHED(si);
    UNTOUCHED(pages);
    UNTOUCHED(table);
    UNTOUCHED(lens);
    UNTOUCHED(slots);
    UNTOUCHED(n);
    UNTOUCHED(n2);
    UNTOUCHED(page);
    /* A double free: the second is refused, nothing else changes. */
    int32_t t[5] = {7, 8, 9, 10, 11};
    CHECK_OK(kvs_seq_begin(h, 60, t, 5, NULL, 0, 0, NULL));
    CHECK_OK(kvs_seq_free(h, 60));
    kvs_event ev[8];
    size_t ne = 0;
    CHECK_OK(kvs_cache_take_events(h, ev, 8, &ne));
    CHECK_EQ(ne, NG); /* its one full page, in each group */
    EXPECT(kvs_seq_free(h, 60), KVS_STATUS_SEQ_NOT_FOUND, "60");
    EXPECT(kvs_seq_append(h, 60, t, 1, 0, CP, 8, &NC), KVS_STATUS_SEQ_NOT_FOUND, "60");
    /* Begin of an id that exists. */
    kvs_seq_info bi;
    SENTINEL(bi);
    EXPECT(kvs_seq_begin(h, 1, t, 5, NULL, 4, 0, &bi), KVS_STATUS_SEQ_EXISTS, "1");
    EXPECT(kvs_seq_begin(h, 2, NULL, 0, NULL, 0, 0, &bi), KVS_STATUS_SEQ_EXISTS, "2");
    UNTOUCHED(bi);
}

/* Pointers NULL with a length, lengths that overflow, short buffers. */
static void lengths(void) {
    int32_t tok[64];
    t_iota(tok, 64, 100); /* sequence 1's tokens first */
    kvs_seq_info bi;
    uint32_t pages[3 * 8];
    int32_t table[2 * 8];
    int32_t lens[2];
    int64_t slots[16];
    kvs_event ev[4];
    size_t n, n2;
    SENTINEL(bi);
    SENTINEL(pages);
    SENTINEL(table);
    SENTINEL(lens);
    SENTINEL(slots);
    SENTINEL(ev);
    SENTINEL(n);
    SENTINEL(n2);
    const uint8_t salt[2] = {1, 2};
    kvs_extra_keys null_salt = {0, NULL, 2, NULL, 0};
    kvs_extra_keys null_mm = {0, salt, 2, NULL, 1};
    kvs_extra_keys huge_salt = {0, salt, SIZE_MAX, NULL, 0};

    /* match: sequence 1's 8 first tokens are cached (2 pages per group). */
    EXPECT(kvs_prefix_find(h, NULL, 4, NULL, 3, pages, 24, 8, &n), KVS_STATUS_NULL_ARGUMENT,
           "tokens");
    EXPECT(kvs_prefix_find(h, tok, SIZE_MAX, NULL, 3, pages, 24, 8, &n),
           KVS_STATUS_INVALID_ARGUMENT, "tokens");
    EXPECT(kvs_prefix_find(h, tok, 10, &null_salt, 9, pages, 24, 8, &n),
           KVS_STATUS_NULL_ARGUMENT, "salt");
    EXPECT(kvs_prefix_find(h, tok, 10, &null_mm, 9, pages, 24, 8, &n),
           KVS_STATUS_NULL_ARGUMENT, "mm_items");
    EXPECT(kvs_prefix_find(h, tok, 10, &huge_salt, 9, pages, 24, 8, &n),
           KVS_STATUS_INVALID_ARGUMENT, "salt");
    EXPECT(kvs_prefix_find(h, tok, 10, NULL, 9, NULL, 24, 8, &n), KVS_STATUS_NULL_ARGUMENT,
           "pages_out");
    EXPECT(kvs_prefix_find(h, tok, 10, NULL, 9, pages, SIZE_MAX, 8, &n),
           KVS_STATUS_INVALID_ARGUMENT, "pages_out");
    EXPECT(kvs_prefix_find(h, tok, 10, NULL, 9, pages, 23, 8, &n),
           KVS_STATUS_BUFFER_TOO_SMALL, "pages_out");
    EXPECT(kvs_prefix_find(h, tok, 10, NULL, 9, pages, 24, SIZE_MAX, &n),
           KVS_STATUS_INVALID_ARGUMENT, "max_pages_per_group");
    EXPECT(kvs_prefix_find(h, tok, 10, NULL, 9, pages, 3, 1, &n), KVS_STATUS_BUFFER_TOO_SMALL,
           "pages_out");
    UNTOUCHED(pages);
    UNTOUCHED(n);
    /* Without a pages buffer no room is needed; an empty prompt matches nothing. */
    CHECK_OK(kvs_prefix_find(h, tok, 10, NULL, 9, NULL, 0, 0, &n));
    CHECK_EQ(n, 8);
    CHECK_OK(kvs_prefix_find(h, tok, 10, NULL, 9, NULL, 0, 1, &n));
    CHECK_EQ(n, 8);
    CHECK_OK(kvs_prefix_find(h, NULL, 0, NULL, SIZE_MAX, NULL, 0, 0, &n));
    CHECK_EQ(n, 0);
    SENTINEL(n);

    /* begin */
    EXPECT(kvs_seq_begin(h, 50, NULL, 4, NULL, 3, 0, &bi), KVS_STATUS_NULL_ARGUMENT,
           "tokens");
    EXPECT(kvs_seq_begin(h, 50, tok, SIZE_MAX, NULL, 3, 0, &bi),
           KVS_STATUS_INVALID_ARGUMENT, "tokens");
    EXPECT(kvs_seq_begin(h, 50, tok, 4, &null_salt, 3, 0, &bi), KVS_STATUS_NULL_ARGUMENT,
           "salt");
    EXPECT(kvs_seq_begin(h, 50, tok, 4, &huge_salt, 3, 0, &bi),
           KVS_STATUS_INVALID_ARGUMENT, "salt");
    EXPECT(kvs_seq_begin(h, 50, tok, 4, NULL, 3, SIZE_MAX, &bi),
           KVS_STATUS_INVALID_ARGUMENT, "lookahead_slots");
    EXPECT(kvs_seq_begin(h, 50, tok, 4, NULL, 3, SIZE_MAX - 2, &bi),
           KVS_STATUS_INVALID_ARGUMENT, "lookahead_slots");
    EXPECT(kvs_seq_begin(h, 50, tok, 64, NULL, 0, 0, &bi), KVS_STATUS_NO_SPACE, NULL);
    EXPECT(kvs_seq_begin(h, 50, tok, 4, NULL, 3, 1000, &bi), KVS_STATUS_NO_SPACE, NULL);
    UNTOUCHED(bi);

    /* release */
    EXPECT(kvs_seq_release_skipped(h, 50, SIZE_MAX, &n), KVS_STATUS_SEQ_NOT_FOUND, "50");
    UNTOUCHED(n);

    /* append and its need */
    EXPECT(kvs_seq_append(h, 1, NULL, 1, 0, CP, 8, &NC), KVS_STATUS_NULL_ARGUMENT, "tokens");
    EXPECT(kvs_seq_append(h, 1, tok, SIZE_MAX, 0, CP, 8, &NC), KVS_STATUS_INVALID_ARGUMENT, "tokens");
    EXPECT(kvs_seq_append(h, 1, tok, 1, SIZE_MAX, CP, 8, &NC), KVS_STATUS_INVALID_ARGUMENT,
           "lookahead_slots");
    EXPECT(kvs_seq_append(h, 1, tok, 1, SIZE_MAX - 10, CP, 8, &NC), KVS_STATUS_INVALID_ARGUMENT,
           "lookahead_slots");
    EXPECT(kvs_seq_append(h, 1, tok, 64, 0, CP, 8, &NC), KVS_STATUS_NO_SPACE, NULL);
    EXPECT(kvs_seq_append(h, 1, tok, 1, 1000, CP, 8, &NC), KVS_STATUS_NO_SPACE, NULL);
    EXPECT(kvs_seq_append_need(h, 1, SIZE_MAX, 0, &n, NULL), KVS_STATUS_INVALID_ARGUMENT,
           "num_tokens");
    EXPECT(kvs_seq_append_need(h, 1, SIZE_MAX - 5, 0, &n, NULL), KVS_STATUS_INVALID_ARGUMENT,
           "num_tokens");
    EXPECT(kvs_seq_append_need(h, 1, 1, SIZE_MAX, &n, NULL), KVS_STATUS_INVALID_ARGUMENT,
           "lookahead_slots");
    UNTOUCHED(n);
    /* A need too large for the pools is an answer, not an error. */
    CHECK_OK(kvs_seq_append_need(h, 1, 1000, 0, &n, NULL));
    CHECK(n > NPAGES);
    SENTINEL(n);

    /* seq_pages: sequence 1 has 3 pages per group. */
    EXPECT(kvs_seq_pages(h, 0, 1, NULL, 16, &n), KVS_STATUS_NULL_ARGUMENT, "pages_out");
    EXPECT(kvs_seq_pages(h, 0, 1, pages, SIZE_MAX, &n), KVS_STATUS_INVALID_ARGUMENT,
           "pages_out");
    EXPECT(kvs_seq_pages(h, 0, 1, pages, 2, &n), KVS_STATUS_BUFFER_TOO_SMALL,
           "pages_out");
    EXPECT(kvs_seq_pages(h, 0, 1, NULL, 0, &n), KVS_STATUS_BUFFER_TOO_SMALL,
           "pages_out");
    UNTOUCHED(pages);
    UNTOUCHED(n);
    /* An empty table fits in no buffer. */
    CHECK_OK(kvs_seq_pages(h, 0, 2, NULL, 0, &n));
    CHECK_EQ(n, 0);
    SENTINEL(n);

    /* block tables */
    const uint64_t one[1] = {1};
    const uint64_t two[2] = {1, 2};
    EXPECT(kvs_cache_block_tables(h, 0, NULL, 1, 8, -1, table, 16, lens, 2),
           KVS_STATUS_NULL_ARGUMENT, "seq_ids");
    EXPECT(kvs_cache_block_tables(h, 0, one, 1, 8, -1, NULL, 16, lens, 2),
           KVS_STATUS_NULL_ARGUMENT, "table_out");
    EXPECT(kvs_cache_block_tables(h, 0, one, 1, 8, -1, table, 16, NULL, 2),
           KVS_STATUS_NULL_ARGUMENT, "context_lens_out");
    EXPECT(kvs_cache_block_tables(h, 0, two, 2, 8, -1, table, 15, lens, 2),
           KVS_STATUS_BUFFER_TOO_SMALL, "table_out");
    EXPECT(kvs_cache_block_tables(h, 0, two, 2, 8, -1, table, 16, lens, 1),
           KVS_STATUS_BUFFER_TOO_SMALL, "context_lens_out");
    EXPECT(kvs_cache_block_tables(h, 0, one, 1, 2, -1, table, 16, lens, 2),
           KVS_STATUS_INVALID_ARGUMENT, "max_pages_per_seq");
    EXPECT(kvs_cache_block_tables(h, 0, two, 2, SIZE_MAX, -1, table, 16, lens, 2),
           KVS_STATUS_INVALID_ARGUMENT, "max_pages_per_seq");
    EXPECT(kvs_cache_block_tables(h, 0, one, 1, SIZE_MAX, -1, table, 16, lens, 2),
           KVS_STATUS_BUFFER_TOO_SMALL, "table_out");
    EXPECT(kvs_cache_block_tables(h, 0, one, SIZE_MAX, 8, -1, table, 16, lens, 2),
           KVS_STATUS_INVALID_ARGUMENT, "seq_ids");
    EXPECT(kvs_cache_block_tables(h, 0, one, 1, 8, -1, table, SIZE_MAX, lens, 2),
           KVS_STATUS_INVALID_ARGUMENT, "table_out");
    EXPECT(kvs_cache_block_tables(h, 0, one, 1, 8, -1, table, 16, lens, SIZE_MAX),
           KVS_STATUS_INVALID_ARGUMENT, "context_lens_out");
    UNTOUCHED(table);
    UNTOUCHED(lens);
    CHECK_OK(kvs_cache_block_tables(h, 0, NULL, 0, SIZE_MAX, -1, NULL, 0, NULL, 0));

    /* slot mapping: sequence 1 has 10 tokens */
    const uint32_t q1[2] = {1, 0};
    const uint32_t q11[1] = {11};
    const uint32_t qmax[1] = {UINT32_MAX};
    const uint32_t q10[1] = {10};
    EXPECT(kvs_cache_slot_mapping(h, 0, NULL, q1, 1, slots, 16, &n), KVS_STATUS_NULL_ARGUMENT,
           "seq_ids");
    EXPECT(kvs_cache_slot_mapping(h, 0, one, NULL, 1, slots, 16, &n),
           KVS_STATUS_NULL_ARGUMENT, "query_lens");
    EXPECT(kvs_cache_slot_mapping(h, 0, one, q1, 1, NULL, 16, &n), KVS_STATUS_NULL_ARGUMENT,
           "slots_out");
    EXPECT(kvs_cache_slot_mapping(h, 0, one, q11, 1, slots, 16, &n),
           KVS_STATUS_INVALID_ARGUMENT, "query_lens");
    EXPECT(kvs_cache_slot_mapping(h, 0, one, qmax, 1, slots, 16, &n),
           KVS_STATUS_INVALID_ARGUMENT, "query_lens");
    EXPECT(kvs_cache_slot_mapping(h, 0, one, q10, 1, slots, 9, &n),
           KVS_STATUS_BUFFER_TOO_SMALL, "slots_out");
    EXPECT(kvs_cache_slot_mapping(h, 0, one, q1, SIZE_MAX, slots, 16, &n),
           KVS_STATUS_INVALID_ARGUMENT, "seq_ids");
    EXPECT(kvs_cache_slot_mapping(h, 0, one, q1, 1, slots, SIZE_MAX, &n),
           KVS_STATUS_INVALID_ARGUMENT, "slots_out");
    UNTOUCHED(slots);
    UNTOUCHED(n);
    CHECK_OK(kvs_cache_slot_mapping(h, 0, NULL, NULL, 0, NULL, 0, NULL));

    /* take_events: new events wait; failing calls take none of them. */
    kvs_event all[16];
    CHECK_OK(kvs_cache_take_events(h, all, 16, &n));
    CHECK_EQ(n, 0); /* no failing call queued an event */
    int32_t t[8] = {900, 901, 902, 903, 904, 905, 906, 907};
    CHECK_OK(kvs_seq_begin(h, 70, t, 8, NULL, 0, 0, NULL));
    SENTINEL(n);
    EXPECT(kvs_cache_take_events(h, NULL, 4, &n), KVS_STATUS_NULL_ARGUMENT, "events_out");
    EXPECT(kvs_cache_take_events(h, ev, SIZE_MAX, &n), KVS_STATUS_INVALID_ARGUMENT,
           "events_out");
    EXPECT(kvs_cache_take_events(h, ev, 4, NULL), KVS_STATUS_NULL_ARGUMENT, "num_events_out");
    UNTOUCHED(ev);
    UNTOUCHED(n);
    CHECK_OK(kvs_cache_take_events(h, all, 16, &n));
    CHECK_EQ(n, 2 * NG); /* two full pages stored in each group */
    CHECK_OK(kvs_cache_take_events(h, NULL, 0, &n));
    CHECK_EQ(n, 0);
    CHECK_OK(kvs_seq_free(h, 70));
    SENTINEL(n);
}

/* kvs_cpu_huge_pages: every bad argument, the report untouched. */
static void huge_pages(void) {
    /* 16 MiB mapped, and the page after it unmapped. */
    size_t len = 8 * ((size_t)2 << 20);
    unsigned char *map =
        mmap(NULL, len + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(map != MAP_FAILED);
    CHECK(munmap(map + len, 4096) == 0);
    kvs_huge_pages_report r;
    SENTINEL(r);
    CHECK_FAILS(kvs_cpu_huge_pages(NULL, len, KVS_HUGE_PAGES_MODE_ADVISE, &r),
                KVS_STATUS_NULL_ARGUMENT, "base");
    CHECK_FAILS(kvs_cpu_huge_pages(map, 0, KVS_HUGE_PAGES_MODE_ADVISE, &r),
                KVS_STATUS_INVALID_ARGUMENT, "bytes");
    CHECK_FAILS(kvs_cpu_huge_pages(map, SIZE_MAX, KVS_HUGE_PAGES_MODE_ADVISE, &r),
                KVS_STATUS_INVALID_ARGUMENT, "bytes");
    CHECK_FAILS(kvs_cpu_huge_pages(map, len, 2, &r), KVS_STATUS_INVALID_ARGUMENT, "mode");
    CHECK_FAILS(kvs_cpu_huge_pages(map, len, UINT32_MAX, &r), KVS_STATUS_INVALID_ARGUMENT,
                "mode");
    CHECK_FAILS(kvs_cpu_huge_pages(map, len + 4096, KVS_HUGE_PAGES_MODE_ADVISE, &r),
                KVS_STATUS_INVALID_ARGUMENT, "base");
    CHECK_FAILS(kvs_cpu_huge_pages((const void *)(uintptr_t)0x1000, 4096,
                                   KVS_HUGE_PAGES_MODE_COLLAPSE, &r),
                KVS_STATUS_INVALID_ARGUMENT, "base");
    UNTOUCHED(r);
    /* A misaligned report is refused before the range is advised. */
    CHECK_FAILS(kvs_cpu_huge_pages(map, len, KVS_HUGE_PAGES_MODE_ADVISE,
                                   MIS(kvs_huge_pages_report)),
                KVS_STATUS_INVALID_ARGUMENT, "report_out");
    CHECK(all_bytes(raw, sizeof raw, 0xA5));
    FILE *f = fopen("/proc/self/smaps", "r");
    CHECK(f != NULL);
    char line[512];
    int inside = 0, advised = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        unsigned long lo, hi;
        char dash;
        if (sscanf(line, "%lx%c%lx ", &lo, &dash, &hi) == 3 && dash == '-') {
            uintptr_t mid = (uintptr_t)(map + len / 2); /* inside the whole huge pages */
            inside = mid >= lo && mid < hi;
        } else if (inside && strncmp(line, "VmFlags:", 8) == 0) {
            advised = strstr(line, " hg") != NULL;
        }
    }
    fclose(f);
    CHECK(!advised);
    CHECK(munmap(map, len) == 0);
}

int main(void) {
    fixture();
    unknown_ids();
    lengths();
    huge_pages();
    fixture_intact_then_free();
    printf("groups_bad_input_lengths: ok\n");
    return 0;
}
