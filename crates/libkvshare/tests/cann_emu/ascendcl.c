/*
 * Emulated libascendcl.so: aclInit, devices (per thread), memory (tracked), streams (queues run
 * at aclrtSynchronizeStream), memcpy, aclGetRecentErrMsg; plus the emulator's state and its
 * emu_* control functions (failure injection, counters, faults).
 */
#define EMU_IN_ASCENDCL
#include <stdarg.h>

#include "emu.h"

static emu_state g_state = {.device_count = 2, .ws_per_row = 256};
static __thread int t_device = -1;
static __thread char t_errmsg[1024];

EMU_API emu_state *emu_state_get(void) { return &g_state; }

/* ---- helpers shared with the other libraries ---- */

EMU_API void emu_set_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t_errmsg, sizeof t_errmsg, fmt, ap);
    va_end(ap);
}

EMU_API void emu_fault(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_state.last_fault, sizeof g_state.last_fault, fmt, ap);
    va_end(ap);
    g_state.faults++;
    if (getenv("KVS_EMU_VERBOSE")) fprintf(stderr, "cann_emu fault: %s\n", g_state.last_fault);
}

EMU_API int emu_enter(const char *fn) {
    emu_state *s = &g_state;
    int i;
    for (i = 0; i < s->ncalls; i++)
        if (strcmp(s->calls[i].name, fn) == 0) break;
    if (i == s->ncalls && s->ncalls < 128) s->calls[s->ncalls++].name = fn;
    if (i < 128) s->calls[i].count++;
    if (s->fail_countdown > 0 && strcmp(s->fail_name, fn) == 0) {
        if (--s->fail_countdown == 0) {
            emu_set_error("EZ9999: emu: injected failure of %s (code %d)", fn, s->fail_code);
            return s->fail_code;
        }
    }
    return 0;
}

EMU_API int emu_thread_device(void) { return t_device; }

EMU_API emu_alloc *emu_find_alloc(const void *p, size_t len) {
    const char *c = (const char *)p;
    for (size_t i = 0; i < g_state.nallocs; i++) {
        emu_alloc *a = &g_state.allocs[i];
        if (a->alive && c >= a->base && c + len <= a->base + a->size && c + len >= c) return a;
    }
    return NULL;
}

static emu_stream *stream_of(aclrtStream s) {
    if (s == NULL) return &g_state.default_stream;
    for (int i = 0; i < g_state.nstreams; i++)
        if ((void *)g_state.streams[i] == s && g_state.streams[i]->alive) return g_state.streams[i];
    return NULL;
}

EMU_API int emu_stream_ok(aclrtStream s) { return stream_of(s) != NULL; }

EMU_API void emu_enqueue(aclrtStream s, const emu_task *t) {
    emu_stream *st = stream_of(s);
    if (st->ntasks == st->cap) {
        st->cap = st->cap ? st->cap * 2 : 16;
        st->tasks = realloc(st->tasks, st->cap * sizeof *st->tasks);
    }
    st->tasks[st->ntasks++] = *t;
}

static int task_uses(const emu_task *t, const char *b, size_t n) {
#define IN(p) ((const char *)(p) >= b && (const char *)(p) < b + n)
    if (t->kind == TASK_MEMCPY) return IN(t->dst) || IN(t->src);
    if (t->ws && IN(t->ws)) return 1;
    const emu_op *o = &t->op;
    if (t->kind == TASK_FIA)
        return IN(o->q.data) || IN(o->k.data) || IN(o->v.data) || IN(o->out.data) ||
               IN(o->bt.data) || (o->has_mask && IN(o->mask.data));
    return IN(o->key.data) || IN(o->value.data) || IN(o->kc.data) || IN(o->vc.data) ||
           IN(o->slots.data);
#undef IN
}

EMU_API int emu_pending_uses(const void *base, size_t size) {
    emu_stream *all[257];
    int n = 0;
    all[n++] = &g_state.default_stream;
    for (int i = 0; i < g_state.nstreams; i++)
        if (g_state.streams[i]->alive) all[n++] = g_state.streams[i];
    for (int i = 0; i < n; i++)
        for (size_t j = 0; j < all[i]->ntasks; j++)
            if (task_uses(&all[i]->tasks[j], base, size)) return 1;
    return 0;
}

/* Implemented in opapi.c's twin here: the kernels run when a stream is synchronised. They are
 * compiled into this library so the queue can run them whatever op library enqueued them. */
void emu_run_fia(const emu_op *o);
void emu_run_scatter(const emu_op *o);

static void run_stream(emu_stream *st) {
    for (size_t i = 0; i < st->ntasks; i++) {
        emu_task *t = &st->tasks[i];
        if (t->ws_size && !emu_find_alloc(t->ws, t->ws_size))
            emu_fault("%s: its workspace %p was freed before the stream ran it", t->name,
                      (void *)t->ws);
        switch (t->kind) {
        case TASK_MEMCPY:
            if (!emu_find_alloc(t->dst, t->count) && t->count)
                emu_fault("aclrtMemcpyAsync: destination freed before the stream ran it");
            else
                memmove(t->dst, t->src, t->count);
            break;
        case TASK_FIA:
            emu_run_fia(&t->op);
            free(t->op.q_start);
            free(t->op.q_len);
            free(t->op.kv_len);
            break;
        case TASK_SCATTER:
            emu_run_scatter(&t->op);
            break;
        }
    }
    st->ntasks = 0;
}

/* ---- control functions for tests ---- */

/* The nth next call (1 = the next one) of `fn` fails with `code` (0: ACLNN_ERR_RUNTIME_ERROR;
 * functions that return an object return NULL). fn NULL clears. */
EMU_API void emu_fail(const char *fn, long nth, int code) {
    if (!fn) {
        g_state.fail_countdown = 0;
        return;
    }
    snprintf(g_state.fail_name, sizeof g_state.fail_name, "%s", fn);
    g_state.fail_countdown = nth;
    g_state.fail_code = code ? code : ACLNN_ERR_RUNTIME_ERROR;
}

/* Named counters: live_tensors, live_int_arrays, live_tensor_lists, live_executors,
 * live_device_allocs, faults, pending_tasks, inited, or "calls:<function>". */
EMU_API long emu_counter(const char *name) {
    emu_state *s = &g_state;
    if (strncmp(name, "calls:", 6) == 0) {
        for (int i = 0; i < s->ncalls; i++)
            if (strcmp(s->calls[i].name, name + 6) == 0) return s->calls[i].count;
        return 0;
    }
    if (!strcmp(name, "live_tensors")) return s->live_tensors;
    if (!strcmp(name, "live_int_arrays")) return s->live_int_arrays;
    if (!strcmp(name, "live_tensor_lists")) return s->live_lists;
    if (!strcmp(name, "live_executors")) return s->live_executors;
    if (!strcmp(name, "faults")) return s->faults;
    if (!strcmp(name, "inited")) return s->inited;
    if (!strcmp(name, "live_device_allocs")) {
        long n = 0;
        for (size_t i = 0; i < s->nallocs; i++) n += s->allocs[i].alive && !s->allocs[i].host;
        return n;
    }
    if (!strcmp(name, "pending_tasks")) {
        long n = (long)s->default_stream.ntasks;
        for (int i = 0; i < s->nstreams; i++) n += (long)s->streams[i]->ntasks;
        return n;
    }
    return -1;
}

EMU_API const char *emu_last_fault(void) { return g_state.last_fault; }
EMU_API void emu_clear_faults(void) {
    g_state.faults = 0;
    g_state.last_fault[0] = 0;
}
EMU_API void emu_set_device_count(int n) { g_state.device_count = n; }
/* Workspace the ops ask for, in bytes per batch row (0: none). */
EMU_API void emu_set_workspace_per_row(uint64_t n) { g_state.ws_per_row = n; }
/* Forgets this thread's device (as a fresh thread). */
EMU_API void emu_unset_thread_device(void) { t_device = -1; }

/* ---- acl / aclrt ---- */

#define ENTER(fn)                                                                          \
    do {                                                                                   \
        int inj_ = emu_enter(fn);                                                          \
        if (inj_) return inj_;                                                             \
    } while (0)
#define NEED_DEVICE(fn)                                                                    \
    do {                                                                                   \
        if (t_device < 0) {                                                                \
            emu_set_error("EE1001: %s: no device is set on this thread (aclrtSetDevice)", fn); \
            return ACL_ERROR_RT_CONTEXT_NULL;                                              \
        }                                                                                  \
    } while (0)

EMU_API aclError aclInit(const char *configPath) {
    (void)configPath;
    ENTER("aclInit");
    if (g_state.inited) {
        emu_set_error("EE1001: aclInit: repeated initialisation");
        return ACL_ERROR_REPEAT_INITIALIZE;
    }
    g_state.inited = 1;
    return ACL_SUCCESS;
}

EMU_API aclError aclFinalize(void) {
    ENTER("aclFinalize");
    g_state.inited = 0;
    return ACL_SUCCESS;
}

EMU_API aclError aclrtSetDevice(int32_t deviceId) {
    ENTER("aclrtSetDevice");
    if (!g_state.inited) {
        emu_set_error("EE1001: aclrtSetDevice: aclInit has not been called");
        return ACL_ERROR_UNINITIALIZE;
    }
    if (deviceId < 0 || deviceId >= g_state.device_count) {
        emu_set_error("EE1001: aclrtSetDevice: device id %d is not in [0, %d)", deviceId,
                      g_state.device_count);
        return ACL_ERROR_INVALID_PARAM;
    }
    t_device = deviceId;
    return ACL_SUCCESS;
}

EMU_API aclError aclrtResetDevice(int32_t deviceId) {
    ENTER("aclrtResetDevice");
    if (t_device == deviceId) t_device = -1;
    return ACL_SUCCESS;
}

EMU_API aclError aclrtGetDevice(int32_t *deviceId) {
    ENTER("aclrtGetDevice");
    if (!deviceId) return ACL_ERROR_INVALID_PARAM;
    if (t_device < 0) {
        emu_set_error("EE1001: aclrtGetDevice: no device is set on this thread");
        return ACL_ERROR_RT_CONTEXT_NULL;
    }
    *deviceId = t_device;
    return ACL_SUCCESS;
}

static aclError alloc(void **p, size_t size, int host, const char *fn) {
    if (!p || size == 0) {
        emu_set_error("EE1001: %s: NULL out-pointer or size 0", fn);
        return ACL_ERROR_INVALID_PARAM;
    }
    void *m = NULL;
    if (posix_memalign(&m, 512, size)) return ACL_ERROR_RT_MEMORY_ALLOCATION;
    memset(m, 0xA5, size); /* device memory is not zeroed */
    if (g_state.nallocs == g_state.cap_allocs) {
        g_state.cap_allocs = g_state.cap_allocs ? g_state.cap_allocs * 2 : 64;
        g_state.allocs = realloc(g_state.allocs, g_state.cap_allocs * sizeof(emu_alloc));
    }
    g_state.allocs[g_state.nallocs++] = (emu_alloc){m, size, host, 1};
    *p = m;
    return ACL_SUCCESS;
}

EMU_API aclError aclrtMalloc(void **devPtr, size_t size, int policy) {
    ENTER("aclrtMalloc");
    NEED_DEVICE("aclrtMalloc");
    if (policy < 0 || policy > 2) return ACL_ERROR_INVALID_PARAM;
    return alloc(devPtr, size, 0, "aclrtMalloc");
}

EMU_API aclError aclrtMallocHost(void **hostPtr, size_t size) {
    ENTER("aclrtMallocHost");
    return alloc(hostPtr, size, 1, "aclrtMallocHost");
}

static aclError release(void *p, int host, const char *fn) {
    for (size_t i = 0; i < g_state.nallocs; i++) {
        emu_alloc *a = &g_state.allocs[i];
        if (a->alive && a->base == p) {
            if (a->host != host) {
                emu_set_error("EE1001: %s: %p was not allocated by %s", fn, p,
                              host ? "aclrtMallocHost" : "aclrtMalloc");
                return ACL_ERROR_INVALID_PARAM;
            }
            if (emu_pending_uses(a->base, a->size))
                emu_fault("%s(%p) while work queued on a stream still uses it", fn, p);
            a->alive = 0;
            free(a->base);
            return ACL_SUCCESS;
        }
    }
    emu_set_error("EE1001: %s: %p is not an allocation", fn, p);
    emu_fault("%s(%p): not a live allocation", fn, p);
    return ACL_ERROR_INVALID_PARAM;
}

EMU_API aclError aclrtFree(void *devPtr) {
    ENTER("aclrtFree");
    return release(devPtr, 0, "aclrtFree");
}

EMU_API aclError aclrtFreeHost(void *hostPtr) {
    ENTER("aclrtFreeHost");
    return release(hostPtr, 1, "aclrtFreeHost");
}

EMU_API aclError aclrtCreateStream(aclrtStream *stream) {
    ENTER("aclrtCreateStream");
    NEED_DEVICE("aclrtCreateStream");
    if (!stream || g_state.nstreams == 256) return ACL_ERROR_INVALID_PARAM;
    emu_stream *s = calloc(1, sizeof *s);
    s->magic = 0x57AE;
    s->alive = 1;
    s->device = t_device;
    g_state.streams[g_state.nstreams++] = s;
    *stream = s;
    return ACL_SUCCESS;
}

EMU_API aclError aclrtSynchronizeStream(aclrtStream stream) {
    ENTER("aclrtSynchronizeStream");
    emu_stream *s = stream_of(stream);
    if (!s) {
        emu_set_error("EE1001: aclrtSynchronizeStream: %p is not a stream", stream);
        return ACL_ERROR_INVALID_PARAM;
    }
    run_stream(s);
    return ACL_SUCCESS;
}

EMU_API aclError aclrtDestroyStream(aclrtStream stream) {
    ENTER("aclrtDestroyStream");
    emu_stream *s = stream_of(stream);
    if (!s || stream == NULL) return ACL_ERROR_INVALID_PARAM;
    run_stream(s);
    s->alive = 0;
    return ACL_SUCCESS;
}

/* Kinds: which side must be device memory (aclrtMalloc) and, for async copies, which side must
 * be page-locked host memory (aclrtMallocHost). */
static aclError check_copy(void *dst, size_t destMax, const void *src, size_t count, int kind,
                           int async, const char *fn) {
    if (!dst || !src) {
        emu_set_error("EE1001: %s: NULL pointer", fn);
        return ACL_ERROR_INVALID_PARAM;
    }
    if (count > destMax) {
        emu_set_error("EE1001: %s: count %zu > destMax %zu", fn, count, destMax);
        return ACL_ERROR_INVALID_PARAM;
    }
    if (kind < MEMCPY_H2H || kind > MEMCPY_D2D) {
        emu_set_error("EE1001: %s: kind %d", fn, kind);
        return ACL_ERROR_INVALID_PARAM;
    }
    int src_dev = kind == MEMCPY_D2H || kind == MEMCPY_D2D;
    int dst_dev = kind == MEMCPY_H2D || kind == MEMCPY_D2D;
    const void *side[2] = {src, dst};
    int dev[2] = {src_dev, dst_dev};
    size_t len[2] = {count, destMax};
    for (int i = 0; i < 2; i++) {
        emu_alloc *a = emu_find_alloc(side[i], len[i]);
        if (dev[i] && (!a || a->host)) {
            emu_set_error("EE1001: %s: %s %p (+%zu bytes) is not device memory from aclrtMalloc "
                          "(kind %d)", fn, i ? "dst" : "src", side[i], len[i], kind);
            return ACL_ERROR_INVALID_PARAM;
        }
        if (!dev[i] && async && (!a || !a->host)) {
            emu_set_error("EE1001: %s: %s %p (+%zu bytes) is not page-locked host memory from "
                          "aclrtMallocHost (kind %d)", fn, i ? "dst" : "src", side[i], len[i],
                          kind);
            return ACL_ERROR_INVALID_PARAM;
        }
    }
    return ACL_SUCCESS;
}

EMU_API aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count, int kind) {
    ENTER("aclrtMemcpy");
    NEED_DEVICE("aclrtMemcpy");
    aclError e = check_copy(dst, destMax, src, count, kind, 0, "aclrtMemcpy");
    if (e) return e;
    memmove(dst, src, count);
    return ACL_SUCCESS;
}

EMU_API aclError aclrtMemcpyAsync(void *dst, size_t destMax, const void *src, size_t count,
                                  int kind, aclrtStream stream) {
    ENTER("aclrtMemcpyAsync");
    NEED_DEVICE("aclrtMemcpyAsync");
    if (!emu_stream_ok(stream)) {
        emu_set_error("EE1001: aclrtMemcpyAsync: %p is not a stream", stream);
        return ACL_ERROR_INVALID_PARAM;
    }
    aclError e = check_copy(dst, destMax, src, count, kind, 1, "aclrtMemcpyAsync");
    if (e) return e;
    emu_task t = {.kind = TASK_MEMCPY, .dst = dst, .src = src, .count = count,
                  .name = "aclrtMemcpyAsync"};
    emu_enqueue(stream, &t);
    return ACL_SUCCESS;
}

EMU_API const char *aclGetRecentErrMsg(void) { return t_errmsg[0] ? t_errmsg : NULL; }
