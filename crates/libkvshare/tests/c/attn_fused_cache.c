/*
 * K and V caches interleaved in one buffer, as vLLM 0.32's CPU engine allocates them:
 * [num_blocks, num_kv_heads, 2 * block_size, head_dim], each block and head's K rows followed by
 * its V rows. The two views have the same strides, V starting block_size * head_dim elements
 * after K: kvs_kv_write accepts them (they share no element) and stores each token where the
 * layout says; a V view one row earlier, which would share K's last row, is refused and
 * nothing is written.
 */
#include "kvs_test.h"

enum { BLOCKS = 3, HEADS = 2, BS = 4, DIM = 8, TOKENS = 5 };

static size_t at(size_t block, size_t head, size_t row, size_t x) {
    return ((block * HEADS + head) * 2 * BS + row) * DIM + x;
}

int main(void) {
    static float cache[BLOCKS * HEADS * 2 * BS * DIM];
    float newk[TOKENS * HEADS * DIM], newv[TOKENS * HEADS * DIM];
    for (size_t i = 0; i < TOKENS * HEADS * DIM; i++) {
        newk[i] = (float)i + 0.25f;
        newv[i] = -(float)i - 0.5f;
    }
    const int64_t slots[TOKENS] = {5, 0, 11, -1, 7};

    kvs_backend_options opts;
    memset(&opts, 0, sizeof opts);
    opts.num_threads = 1;
    kvs_backend *be = NULL;
    CHECK_OK(kvs_backend_new(KVS_BACKEND_KIND_CPU, &opts, &be));

    kvs_kv_layout layout = kvs_kv_layout_dense(KVS_DTYPE_F32, BLOCKS, BS, HEADS, DIM);
    layout.page_stride = HEADS * 2 * BS * DIM;
    layout.slot_stride = DIM;
    layout.head_stride = 2 * BS * DIM;
    kvs_kv_write_args w;
    memset(&w, 0, sizeof w);
    w.num_tokens = TOKENS;
    w.key = newk;
    w.value = newv;
    w.src_dtype = KVS_DTYPE_F32;
    w.key_cache = cache;
    w.value_cache = cache + BS * DIM - DIM; /* one row early: shares K's last row */
    w.cache = layout;
    w.slot_mapping = slots;
    w.slot_mapping_type = KVS_INDEX_TYPE_INT64;
    CHECK_STATUS(kvs_kv_write(be, &w, NULL), KVS_STATUS_ATTN_INVALID_ARGUMENT);
    CHECK(strstr(kvs_last_error_message(), "value_cache") != NULL);
    for (size_t i = 0; i < sizeof cache / sizeof cache[0]; i++) CHECK(cache[i] == 0.0f);

    w.value_cache = cache + BS * DIM;
    CHECK_OK(kvs_kv_write(be, &w, NULL));
    size_t written = 0;
    for (size_t t = 0; t < TOKENS; t++) {
        if (slots[t] < 0) continue;
        size_t block = (size_t)slots[t] / BS, row = (size_t)slots[t] % BS;
        for (size_t h = 0; h < HEADS; h++)
            for (size_t x = 0; x < DIM; x++) {
                CHECK(cache[at(block, h, row, x)] == newk[(t * HEADS + h) * DIM + x]);
                CHECK(cache[at(block, h, BS + row, x)] == newv[(t * HEADS + h) * DIM + x]);
                written += 2;
            }
    }
    /* Nothing else was touched. */
    size_t nonzero = 0;
    for (size_t i = 0; i < sizeof cache / sizeof cache[0]; i++) nonzero += cache[i] != 0.0f;
    CHECK(nonzero == written);

    kvs_backend_free(be);
    printf("attn_fused_cache: ok\n");
    return 0;
}
