/*
 * Tiny assertion helpers shared by the C harness programs in tests/c.
 *
 * Every failed check prints file:line, the expression, and for status checks the status name
 * (kvs_status_str) and the library's last error message, then exits with status 1.
 */
#ifndef KVS_TEST_H
#define KVS_TEST_H

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvshare.h"

/* Short names used by the programs, bound to the header's own names. */
#define kvs_page_info_fn kvs_page_get_info
#define kvs_seq_info_fn kvs_seq_get_info
enum {
    T_TIER_DEVICE = KVS_TIER_DEVICE,
    T_TIER_HOST = KVS_TIER_HOST,
};
enum {
    T_DTYPE_F32 = KVS_DTYPE_F32,
    T_DTYPE_F16 = KVS_DTYPE_F16,
    T_DTYPE_BF16 = KVS_DTYPE_BF16,
};
enum {
    T_PAGE_FREE = KVS_PAGE_STATE_FREE,
    T_PAGE_CACHED = KVS_PAGE_STATE_CACHED,
    T_PAGE_IN_USE = KVS_PAGE_STATE_IN_USE,
    T_PAGE_PADDING = KVS_PAGE_STATE_PADDING,
};
enum {
    T_COPY_D2D = KVS_COPY_KIND_DEVICE_TO_DEVICE,
    T_COPY_D2H = KVS_COPY_KIND_DEVICE_TO_HOST,
    T_COPY_H2D = KVS_COPY_KIND_HOST_TO_DEVICE,
};

/* Failure reporting lives in functions so that each check expands to very little code (the
 * sanitizer builds of a program with hundreds of checks stay quick to compile). */
#if defined(__GNUC__)
#define T_NORETURN __attribute__((noreturn, noinline, cold, unused))
#define T_UNUSED __attribute__((unused))
#else
#define T_NORETURN
#define T_UNUSED
#endif

static T_NORETURN void t_fail_cond(const char *file, int line, const char *cond) {
    fprintf(stderr, "%s:%d: CHECK failed: %s (last kvs error: \"%s\")\n", file, line, cond,
            kvs_last_error_message());
    fflush(stderr);
    exit(1);
}

static T_NORETURN void t_fail_status(const char *file, int line, const char *call, uint32_t got,
                                     uint32_t want) {
    fprintf(stderr, "%s:%d: %s returned %s (%u), want %s (%u): \"%s\"\n", file, line, call,
            kvs_status_str(got), got, kvs_status_str(want), want, kvs_last_error_message());
    fflush(stderr);
    exit(1);
}

static T_NORETURN void t_fail_eq(const char *file, int line, const char *a, uint64_t av,
                                 const char *b, uint64_t bv) {
    fprintf(stderr, "%s:%d: CHECK_EQ failed: %s == %" PRIu64 " (%" PRId64 "), %s == %" PRIu64
            " (%" PRId64 ")\n",
            file, line, a, av, (int64_t)av, b, bv, (int64_t)bv);
    fflush(stderr);
    exit(1);
}

static T_UNUSED void t_check_msg(const char *file, int line, const char *needle) {
    const char *m = kvs_last_error_message();
    if (m == NULL || m[0] == '\0' || (needle != NULL && strstr(m, needle) == NULL)) {
        fprintf(stderr, "%s:%d: last error message \"%s\" does not mention \"%s\"\n", file,
                line, m ? m : "(null)", needle ? needle : "(anything)");
        fflush(stderr);
        exit(1);
    }
}

/* printf-style failure (with the library's last error message). */
#define T_FAIL(...)                                                                    \
    do {                                                                               \
        fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);                                \
        fprintf(stderr, __VA_ARGS__);                                                  \
        fprintf(stderr, " (last kvs error: \"%s\")\n", kvs_last_error_message());      \
        fflush(stderr);                                                                \
        exit(1);                                                                       \
    } while (0)

/* A boolean condition. */
#define CHECK(cond)                                                                    \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            t_fail_cond(__FILE__, __LINE__, #cond);                                    \
        }                                                                              \
    } while (0)

/* A call returning kvs_status must return `want`. */
#define CHECK_STATUS(call, want)                                                       \
    do {                                                                               \
        uint32_t got_ = (uint32_t)(call);                                              \
        if (got_ != (uint32_t)(want)) {                                                \
            t_fail_status(__FILE__, __LINE__, #call, got_, (uint32_t)(want));          \
        }                                                                              \
    } while (0)

#define CHECK_OK(call) CHECK_STATUS(call, KVS_STATUS_OK)

/* Two integers (any width up to 64 bits; compared as uint64_t) must be equal. */
#define CHECK_EQ(a, b)                                                                 \
    do {                                                                               \
        uint64_t a_ = (uint64_t)(a);                                                   \
        uint64_t b_ = (uint64_t)(b);                                                   \
        if (a_ != b_) {                                                                \
            t_fail_eq(__FILE__, __LINE__, #a, a_, #b, b_);                             \
        }                                                                              \
    } while (0)

/* The last error message on this thread must contain `needle`. */
#define CHECK_MSG(needle) t_check_msg(__FILE__, __LINE__, (needle))

/* A call must fail with `want`, leaving a last error message that mentions `needle`. */
#define CHECK_FAILS(call, want, needle)                                                \
    do {                                                                               \
        CHECK_STATUS(call, want);                                                      \
        CHECK_MSG(needle);                                                             \
    } while (0)

/* kvs_cache_check must be OK. */
#define CHECK_CACHE(c) CHECK_OK(kvs_cache_check(c))

/* Bytes of `p` are all `b`. */
static T_UNUSED int all_bytes(const void *p, size_t n, unsigned char b) {
    const unsigned char *q = p;
    for (size_t i = 0; i < n; i++) {
        if (q[i] != b) {
            return 0;
        }
    }
    return 1;
}
/* An out-parameter filled with 0xA5 before a call that must leave it untouched. */
#define SENTINEL(x) memset(&(x), 0xA5, sizeof(x))
#define UNTOUCHED(x) CHECK(all_bytes(&(x), sizeof(x), 0xA5))

static T_UNUSED kvs_stats t_stats(const kvs_cache *c) {
    kvs_stats s;
    memset(&s, 0, sizeof s);
    CHECK_OK(kvs_cache_stats(c, &s));
    return s;
}

static T_UNUSED kvs_page_info t_page(const kvs_cache *c, uint32_t tier, uint32_t page) {
    kvs_page_info i;
    memset(&i, 0, sizeof i);
    CHECK_OK(kvs_page_info_fn(c, tier, 0, page, &i));
    return i;
}

/* A config of the groups `g[0..n)` (page size `ps`, `pages` device pages per pool, the null
 * page reserved) that keeps pages as vLLM's manager does: vLLM's reuse order, cached pages
 * recomputed rather than shared past the match limit or deduplicated. */
static T_UNUSED kvs_config t_groups_config(uint32_t ps, uint32_t pages, const kvs_group *g,
                                          size_t n) {
    kvs_config c = kvs_config_default();
    c.page_size = ps;
    c.num_device_pages = pages;
    c.reserve_null_page = true;
    c.skip_cached_writes = false;
    c.vllm_free_order = true;
    c.groups = g;
    c.num_groups = n;
    return c;
}

/* kvs_seq_append of `n` tokens without lookahead slots, which must succeed; returns the number
 * of copy-on-write copies it reported. */
static T_UNUSED size_t t_append(kvs_cache *c, uint64_t id, const int32_t *t, size_t n) {
    kvs_copy cp[8];
    size_t nc = 0;
    CHECK_OK(kvs_seq_append(c, id, t, n, 0, cp, 8, &nc));
    return nc;
}

static T_UNUSED kvs_group_stats t_group_stats(const kvs_cache *c, size_t group) {
    kvs_group_stats s;
    memset(&s, 0, sizeof s);
    CHECK_OK(kvs_cache_group_stats(c, group, &s));
    return s;
}

/* Group `group`'s block table of sequence `id` into `out` (capacity `cap`); returns its length. */
static T_UNUSED size_t t_pages(const kvs_cache *c, size_t group, uint64_t id, uint32_t *out,
                               size_t cap) {
    size_t n = (size_t)-1;
    CHECK_OK(kvs_seq_pages(c, group, id, out, cap, &n));
    CHECK(n <= cap);
    return n;
}

/* Fills `n` tokens with base, base+1, ... */
static T_UNUSED void t_iota(int32_t *t, size_t n, int32_t base) {
    for (size_t i = 0; i < n; i++) {
        t[i] = base + (int32_t)i;
    }
}

#endif /* KVS_TEST_H */
