/*
 * The smallest kvshare program: checks the library's ABI against the header, then shows a
 * prompt's second arrival sharing the pages its first arrival left in the prefix index.
 * Valid C11 and C++11; README.md's install sections build it with pkg-config (C) and CMake (C++).
 */
#include <stdio.h>
#include <kvshare.h>

int main(void) {
    if (kvs_abi_version() != KVS_ABI_VERSION) {
        fprintf(stderr, "libkvshare has ABI %u, kvshare.h declares %u\n", kvs_abi_version(),
                (unsigned)KVS_ABI_VERSION);
        return 1;
    }
    kvs_config cfg = kvs_config_default();
    cfg.page_size = 4;
    cfg.num_device_pages = 64;
    kvs_cache *cache = NULL;
    if (kvs_cache_new(&cfg, &cache) != KVS_STATUS_OK) {
        fprintf(stderr, "kvshare: %s\n", kvs_last_error_message());
        return 1;
    }
    const int32_t prompt[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    kvs_seq_info info;
    /* First arrival: nothing cached. At most 8 tokens may match (the last is recomputed); no
       lookahead slots are reserved. */
    kvs_status st = kvs_seq_begin(cache, 1, prompt, 9, NULL, 8, 0, &info);
    if (st == KVS_STATUS_OK) {
        st = kvs_seq_free(cache, 1); /* its two full pages stay cached */
    }
    if (st == KVS_STATUS_OK) {
        st = kvs_seq_begin(cache, 2, prompt, 9, NULL, 8, 0, &info);
    }
    if (st != KVS_STATUS_OK) {
        fprintf(stderr, "kvshare: %s: %s\n", kvs_status_str(st), kvs_last_error_message());
        kvs_cache_free(cache);
        return 1;
    }
    printf("kvshare %s (ABI %u): %llu of 9 prompt tokens found cached\n", kvs_version(),
           kvs_abi_version(), (unsigned long long)info.matched_tokens);
    kvs_cache_free(cache);
    return info.matched_tokens == 8 ? 0 : 1;
}
