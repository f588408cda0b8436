/*
 * Regression: a kvs_config bool field holding a byte other than 0 or 1 (memset, a uint8_t
 * view, a ctypes field of the wrong width) was accepted, and the new cache then failed
 * kvs_cache_check. It must be refused with KVS_STATUS_INVALID_CONFIG naming the field,
 * and the cache handle left untouched. Also: an empty prompt is a valid sequence (documented on
 * kvs_seq_begin) that later appends fill.
 */
#include <stddef.h>

#include "kvs_test.h"

static void refuse_byte(size_t offset, const char *field, unsigned char byte) {
    kvs_config cfg = kvs_config_default();
    memcpy((unsigned char *)&cfg + offset, &byte, 1);
    kvs_cache *c = (kvs_cache *)(uintptr_t)0x1; /* must stay untouched */
    CHECK_FAILS(kvs_cache_new(&cfg, &c), KVS_STATUS_INVALID_CONFIG, field);
    CHECK(c == (kvs_cache *)(uintptr_t)0x1);
}

static void empty_prompt(void) {
    kvs_config cfg = kvs_config_default();
    cfg.page_size = 4;
    cfg.num_device_pages = 8;
    kvs_cache *c = NULL;
    CHECK_OK(kvs_cache_new(&cfg, &c));
    kvs_seq_info info;
    CHECK_OK(kvs_seq_begin(c, 1, NULL, 0, NULL, SIZE_MAX, 0, &info));
    CHECK_EQ(info.num_tokens, 0);
    CHECK_EQ(info.num_pages, 0);
    CHECK_CACHE(c);
    const int32_t toks[5] = {1, 2, 3, 4, 5};
    size_t ncopies = 7;
    CHECK_OK(kvs_seq_append(c, 1, toks, 5, 0, NULL, 0, &ncopies));
    CHECK_EQ(ncopies, 0);
    CHECK_OK(kvs_seq_get_info(c, 1, &info));
    CHECK_EQ(info.num_tokens, 5);
    CHECK_EQ(info.num_pages, 2);
    CHECK_CACHE(c);
    CHECK_OK(kvs_seq_free(c, 1));
    CHECK_CACHE(c);
    kvs_cache_free(c);
}

int main(void) {
    static const struct {
        size_t offset;
        const char *field;
    } bools[] = {
        {offsetof(kvs_config, enable_prefix_caching), "enable_prefix_caching"},
        {offsetof(kvs_config, reserve_null_page), "reserve_null_page"},
        {offsetof(kvs_config, defer_commit), "defer_commit"},
        {offsetof(kvs_config, skip_cached_writes), "skip_cached_writes"},
        {offsetof(kvs_config, demote_to_host), "demote_to_host"},
        {offsetof(kvs_config, enable_events), "enable_events"},
        {offsetof(kvs_config, vllm_free_order), "vllm_free_order"},
        {offsetof(kvs_config, vllm_uncached_first), "vllm_uncached_first"},
    };
    for (size_t i = 0; i < sizeof bools / sizeof bools[0]; i++) {
        refuse_byte(bools[i].offset, bools[i].field, 2);
        refuse_byte(bools[i].offset, bools[i].field, 0xff);
    }
    /* 0 and 1 still work, field by field. */
    kvs_config cfg = kvs_config_default();
    memset(&cfg.enable_prefix_caching, 1, 1);
    kvs_cache *c = NULL;
    CHECK_OK(kvs_cache_new(&cfg, &c));
    CHECK_CACHE(c);
    kvs_cache_free(c);
    empty_prompt();
    printf("bug_config_bool_byte: ok\n");
    return 0;
}
