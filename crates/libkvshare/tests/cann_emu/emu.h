/*
 * Emulated CANN runtime for kvshare's Ascend backend tests (see README.md in this directory).
 *
 * Built by tests/support/cann_emu.rs into shared libraries with the real names (libascendcl.so,
 * libnnopbase.so, libopapi.so, libopapi_transformer.so, libcust_opapi.so), from these sources
 * only: it shares no code with kvshare. "Device" memory is host memory handed out by
 * aclrtMalloc and tracked, so that tensors over anything else are refused. Work enqueued on a
 * stream runs only at aclrtSynchronizeStream, like on a device.
 *
 * All state lives in libascendcl.so (emu_state()); the other libraries find the
 * libascendcl.so of their own directory, so several emulator builds can be loaded in one
 * process without sharing anything. Not thread-safe: tests serialise their calls.
 */
#ifndef KVS_CANN_EMU_H
#define KVS_CANN_EMU_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EMU_API __attribute__((visibility("default")))

typedef int aclError;
typedef void *aclrtStream;

/* Codes (acl_base.h / aclnn docs; runtime codes the docs do not list are the emulator's). */
#define ACL_SUCCESS 0
#define ACL_ERROR_INVALID_PARAM 100000
#define ACL_ERROR_UNINITIALIZE 100001
#define ACL_ERROR_REPEAT_INITIALIZE 100002
#define ACL_ERROR_RT_CONTEXT_NULL 107002
#define ACL_ERROR_RT_MEMORY_ALLOCATION 207001
#define ACLNN_ERR_PARAM_NULLPTR 161001
#define ACLNN_ERR_PARAM_INVALID 161002
#define ACLNN_ERR_RUNTIME_ERROR 361001

enum { DT_FLOAT = 0, DT_FLOAT16 = 1, DT_INT8 = 2, DT_INT32 = 3, DT_UINT8 = 4, DT_INT64 = 9, DT_BOOL = 12, DT_BF16 = 27 };
enum { FORMAT_ND = 2 };
enum { MEMCPY_H2H = 0, MEMCPY_H2D = 1, MEMCPY_D2H = 2, MEMCPY_D2D = 3 };

#define EMU_MAX_DIMS 8
#define EMU_MAX_OBJS 65536

typedef struct aclTensor {
    uint32_t magic;
    int alive;   /* 0 after destroy */
    int in_list; /* owned by a tensor list */
    int ndim;
    int64_t dims[EMU_MAX_DIMS];
    int64_t strides[EMU_MAX_DIMS];
    int64_t offset;
    int64_t storage_numel;
    int dtype;
    int format;
    char *data;
} aclTensor;

typedef struct aclIntArray {
    uint32_t magic;
    int alive;
    uint64_t size;
    int64_t *values;
} aclIntArray;

typedef struct aclTensorList {
    uint32_t magic;
    int alive;
    uint64_t size;
    aclTensor **items;
} aclTensorList;

enum { TASK_MEMCPY = 1, TASK_FIA = 2, TASK_SCATTER = 3 };

/* A copy of a tensor descriptor taken when an op is planned (tensors may be destroyed after
 * the launch returns; the data they point at is read when the stream runs). */
typedef struct {
    int ndim;
    int64_t dims[EMU_MAX_DIMS];
    int64_t strides[EMU_MAX_DIMS];
    int64_t offset;
    int dtype;
    char *data;
} emu_view;

typedef struct {
    /* FIA */
    emu_view q, k, v, out, bt, mask;
    int has_mask;
    int mask_kind;       /* 1: compressed 2048x2048 (sparse 3/4); 2: decode (B, .., KV_S) */
    int64_t pre, next;   /* band of sparse 4 (right-down reference) */
    int layout; /* 0 BSND, 1 BNSD, 2 TND */
    int kv4d;   /* 1: [nb, kvh, bs, D] */
    int64_t B, N, KVH, D, bs, nb;
    int64_t *q_start, *q_len, *kv_len; /* per batch */
    int sparse;
    double scale;
    /* int8 K/V: per-channel antiquant (KV-separated parameters, modes 0): value of a code c of
     * kv head g, channel d = scale[g*D+d] * (c + offset[g*D+d]); offsets optional. */
    int antiquant;
    emu_view kas, kao, vas, vao;
    int has_offset;
    /* SCATTER */
    emu_view key, value, kc, vc, slots;
} emu_op;

typedef struct aclOpExecutor {
    uint32_t magic;
    int alive;
    int kind; /* TASK_FIA / TASK_SCATTER */
    uint64_t ws_required;
    const char *exec_name;
    const aclTensor *refs[16]; /* must still be alive at execute */
    const aclTensorList *list_refs[2];
    int nrefs, nlist_refs;
    emu_op op;
} aclOpExecutor;

typedef struct {
    int kind;
    /* memcpy */
    char *dst;
    const char *src;
    size_t count;
    /* ops */
    emu_op op;
    char *ws;
    uint64_t ws_size;
    const char *name;
} emu_task;

typedef struct emu_stream {
    uint32_t magic;
    int alive;
    int device;
    emu_task *tasks;
    size_t ntasks, cap;
} emu_stream;

typedef struct {
    char *base;
    size_t size;
    int host; /* 1: aclrtMallocHost (page-locked host memory) */
    int alive;
} emu_alloc;

typedef struct {
    const char *name;
    long count;
} emu_counter_t;

typedef struct emu_state {
    int inited;
    int device_count;
    /* live objects */
    long live_tensors, live_int_arrays, live_lists, live_executors;
    long faults;
    char last_fault[512];
    /* allocations */
    emu_alloc *allocs;
    size_t nallocs, cap_allocs;
    /* streams */
    emu_stream default_stream;
    emu_stream *streams[256];
    int nstreams;
    /* call counters */
    emu_counter_t calls[128];
    int ncalls;
    /* failure injection */
    char fail_name[128];
    long fail_countdown; /* fail when it reaches 1 */
    int fail_code;
    /* workspace size the ops ask for (bytes per batch row) */
    uint64_t ws_per_row;
} emu_state;

/* Shared helpers, exported by libascendcl.so. */
EMU_API emu_state *emu_state_get(void);
EMU_API void emu_set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
EMU_API void emu_fault(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
EMU_API int emu_enter(const char *fn); /* counts the call; returns an injected code or 0 */
EMU_API int emu_thread_device(void);  /* -1 when this thread has no device */
EMU_API emu_alloc *emu_find_alloc(const void *p, size_t len);
EMU_API int emu_stream_ok(aclrtStream s);
EMU_API void emu_enqueue(aclrtStream s, const emu_task *t);
EMU_API int emu_pending_uses(const void *base, size_t size);

#ifdef EMU_IN_ASCENDCL
#define S() emu_state_get()
#else
/* The other libraries call the helpers of the libascendcl.so in their own directory (found with
 * dladdr + dlopen(RTLD_NOLOAD)), never whichever libascendcl.so the global scope offers first:
 * several emulator builds may be loaded in one process. */
typedef struct {
    emu_state *(*state)(void);
    void (*set_error)(const char *fmt, ...);
    void (*fault)(const char *fmt, ...);
    int (*enter)(const char *fn);
    int (*thread_device)(void);
    emu_alloc *(*find_alloc)(const void *p, size_t len);
    int (*stream_ok)(aclrtStream s);
    void (*enqueue)(aclrtStream s, const emu_task *t);
} emu_api_t;

static const emu_api_t *emu_api(void) {
    static emu_api_t api;
    static int ready;
    if (__atomic_load_n(&ready, __ATOMIC_ACQUIRE)) return &api;
    Dl_info info;
    if (!dladdr((void *)&emu_api, &info) || !info.dli_fname) {
        fprintf(stderr, "cann_emu: dladdr failed\n");
        abort();
    }
    char path[4096];
    snprintf(path, sizeof path, "%s", info.dli_fname);
    char *slash = strrchr(path, '/');
    size_t at = slash ? (size_t)(slash + 1 - path) : 0;
    snprintf(path + at, sizeof path - at, "libascendcl.so");
    void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (!h) {
        fprintf(stderr, "cann_emu: %s is not loaded (load it before %s)\n", path, info.dli_fname);
        abort();
    }
#define EMU_SYM(field, name)                                                                  \
    do {                                                                                      \
        void *p_ = dlsym(h, name);                                                            \
        if (!p_) abort();                                                                     \
        memcpy(&api.field, &p_, sizeof p_);                                                   \
    } while (0)
    EMU_SYM(state, "emu_state_get");
    EMU_SYM(set_error, "emu_set_error");
    EMU_SYM(fault, "emu_fault");
    EMU_SYM(enter, "emu_enter");
    EMU_SYM(thread_device, "emu_thread_device");
    EMU_SYM(find_alloc, "emu_find_alloc");
    EMU_SYM(stream_ok, "emu_stream_ok");
    EMU_SYM(enqueue, "emu_enqueue");
#undef EMU_SYM
    __atomic_store_n(&ready, 1, __ATOMIC_RELEASE);
    return &api;
}
#define S() (emu_api()->state())
#define emu_set_error (emu_api()->set_error)
#define emu_fault (emu_api()->fault)
#define emu_enter (emu_api()->enter)
#define emu_thread_device (emu_api()->thread_device)
#define emu_find_alloc (emu_api()->find_alloc)
#define emu_stream_ok (emu_api()->stream_ok)
#define emu_enqueue (emu_api()->enqueue)
#endif

/* Elements -> bytes. */
static inline size_t emu_dtype_size(int dt) {
    switch (dt) {
    case DT_FLOAT: case DT_INT32: return 4;
    case DT_FLOAT16: case DT_BF16: return 2;
    case DT_INT8: case DT_UINT8: case DT_BOOL: return 1;
    case DT_INT64: return 8;
    default: return 0;
    }
}

/* Own conversions (no shared code with kvshare). */
static inline double emu_half_to_double(uint16_t h) {
    int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    double v;
    if (exp == 0) v = man * (1.0 / 16777216.0); /* 2^-24 */
    else if (exp == 31) v = man ? 0.0 / 0.0 : 1.0 / 0.0;
    else {
        v = 1.0 + man / 1024.0;
        int e = exp - 15;
        while (e > 0) { v *= 2; e--; }
        while (e < 0) { v /= 2; e++; }
    }
    return sign ? -v : v;
}
static inline uint16_t emu_float_to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    int32_t exp = (int32_t)((x >> 23) & 0xff) - 127 + 15;
    uint32_t man = x & 0x7fffff;
    if (((x >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
    if (exp >= 31) return (uint16_t)(sign | 0x7c00);
    if (exp <= 0) {
        if (exp < -10) return (uint16_t)sign;
        man |= 0x800000;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t h = sign | ((uint32_t)exp << 10) | (man >> 13);
    uint32_t rem = man & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return (uint16_t)h;
}
static inline double emu_bf16_to_double(uint16_t b) {
    uint32_t x = (uint32_t)b << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}
static inline uint16_t emu_float_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40);
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}
static inline double emu_load(const char *p, int dt) {
    uint16_t h;
    switch (dt) {
    case DT_FLOAT16: memcpy(&h, p, 2); return emu_half_to_double(h);
    case DT_BF16: memcpy(&h, p, 2); return emu_bf16_to_double(h);
    case DT_FLOAT: { float f; memcpy(&f, p, 4); return f; }
    default: return 0;
    }
}
static inline void emu_store(char *p, int dt, double v) {
    uint16_t h;
    switch (dt) {
    case DT_FLOAT16: h = emu_float_to_half((float)v); memcpy(p, &h, 2); break;
    case DT_BF16: h = emu_float_to_bf16((float)v); memcpy(p, &h, 2); break;
    case DT_FLOAT: { float f = (float)v; memcpy(p, &f, 4); break; }
    default: break;
    }
}
/* Address of element idx[] of a view. */
static inline char *emu_at(const emu_view *v, const int64_t *idx) {
    int64_t e = v->offset;
    for (int i = 0; i < v->ndim; i++) e += idx[i] * v->strides[i];
    return v->data + e * (int64_t)emu_dtype_size(v->dtype);
}

#endif
