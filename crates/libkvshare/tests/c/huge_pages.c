/*
 * kvs_cpu_huge_pages: 2 MiB pages for a host KV cache the caller allocated.
 *
 * A fresh mapping advised before it is written, and a written one collapsed: the contents never
 * change, the report covers exactly the whole aligned 2 MiB pages inside the range, and the
 * huge bytes never exceed them. Bad input (NULL base, zero and wrapping lengths, a mode that
 * is no kvs_huge_pages_mode, an unmapped range) returns its status, names the argument and
 * leaves the report untouched.
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS under -std=c11 */
#include <sys/mman.h>

#include "kvs_test.h"

#define MIB ((size_t)1 << 20)
#define HUGE ((size_t)2 << 20)

static void fill(uint64_t *p, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i++) p[i] = (i + seed) * 0x9e3779b97f4a7c15ull;
}

static int same(const uint64_t *p, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != (i + seed) * 0x9e3779b97f4a7c15ull) return 0;
    return 1;
}

/* Whole aligned 2 MiB pages inside [p, p + n). */
static size_t whole(const void *p, size_t n) {
    uintptr_t lo = ((uintptr_t)p + HUGE - 1) / HUGE * HUGE, hi = ((uintptr_t)p + n) / HUGE * HUGE;
    return hi > lo ? hi - lo : 0;
}

int main(void) {
    /* 20 MiB mapped, used from an unaligned offset: 9 whole huge pages inside 19 MiB. */
    size_t len = 20 * MIB;
    unsigned char *map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(map != MAP_FAILED);
    unsigned char *base = map + 4096;
    size_t bytes = len - MIB;
    kvs_huge_pages_report r;
    memset(&r, 0xA5, sizeof r);
    kvs_status st = kvs_cpu_huge_pages(base, bytes, KVS_HUGE_PAGES_MODE_ADVISE, &r);
    if (st == KVS_STATUS_UNSUPPORTED) {
        printf("huge_pages: skipped: %s\n", kvs_last_error_message());
        return 0;
    }
    CHECK_OK(st);
    CHECK_EQ(r.advised_bytes, whole(base, bytes));
    CHECK(r.huge_bytes <= r.advised_bytes);
    uint64_t *words = (uint64_t *)base;
    size_t nw = bytes / 8;
    fill(words, nw, 1);
    CHECK(same(words, nw, 1));

    /* Written memory collapsed: contents kept. A NULL report is allowed. */
    CHECK_OK(kvs_cpu_huge_pages(base, bytes, KVS_HUGE_PAGES_MODE_COLLAPSE, NULL));
    memset(&r, 0xA5, sizeof r);
    CHECK_OK(kvs_cpu_huge_pages(base, bytes, KVS_HUGE_PAGES_MODE_COLLAPSE, &r));
    CHECK_EQ(r.advised_bytes, whole(base, bytes));
    CHECK(r.huge_bytes <= r.advised_bytes);
    CHECK(same(words, nw, 1));
    printf("huge_pages: advised %zu MiB, backed by huge pages %zu MiB\n", r.advised_bytes / MIB,
           r.huge_bytes / MIB);

    /* No whole huge page inside: nothing advised, OK. */
    memset(&r, 0xA5, sizeof r);
    CHECK_OK(kvs_cpu_huge_pages(base, 4096, KVS_HUGE_PAGES_MODE_ADVISE, &r));
    CHECK_EQ(r.advised_bytes, 0);
    CHECK_EQ(r.huge_bytes, 0);

    /* Bad input: status, the argument named, the report untouched. */
    memset(&r, 0xA5, sizeof r);
    kvs_huge_pages_report sentinel = r;
    CHECK_STATUS(kvs_cpu_huge_pages(NULL, bytes, KVS_HUGE_PAGES_MODE_ADVISE, &r),
                 KVS_STATUS_NULL_ARGUMENT);
    CHECK_MSG("base");
    CHECK_STATUS(kvs_cpu_huge_pages(base, 0, KVS_HUGE_PAGES_MODE_ADVISE, &r),
                 KVS_STATUS_INVALID_ARGUMENT);
    CHECK_MSG("bytes");
    CHECK_STATUS(kvs_cpu_huge_pages(base, SIZE_MAX, KVS_HUGE_PAGES_MODE_ADVISE, &r),
                 KVS_STATUS_INVALID_ARGUMENT);
    CHECK_MSG("wrap");
    CHECK_STATUS(kvs_cpu_huge_pages(base, bytes, 7, &r), KVS_STATUS_INVALID_ARGUMENT);
    CHECK_MSG("kvs_huge_pages_mode");
    CHECK(memcmp(&r, &sentinel, sizeof r) == 0);

    /* An unmapped range. */
    CHECK(munmap(map, len) == 0);
    CHECK_STATUS(kvs_cpu_huge_pages(base, bytes, KVS_HUGE_PAGES_MODE_ADVISE, &r),
                 KVS_STATUS_INVALID_ARGUMENT);
    CHECK_MSG("not mapped");
    CHECK(memcmp(&r, &sentinel, sizeof r) == 0);
    printf("huge_pages: ok\n");
    return 0;
}
