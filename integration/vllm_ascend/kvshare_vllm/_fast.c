/* kvshare_vllm._fast: the adapter's native calls compiled with the Python work around them, for
 * the scheduler's hot path: ``Appender`` for a cache of one full-attention group (manager.py),
 * ``Groups`` for a cache of several KV-cache groups (hybrid.py).  The plugin requires this module
 * (startup.py refuses to run without it).
 *
 * Appender: ``KvshareKVCacheManager._append``, ``_cross``, ``_open``, ``_match``.
 *
 * ``Appender(cache_addr, fn_addr, block_size, max_pages, blocks=None, begin_addr=0,
 * match_addr=0)`` holds the cache handle and the address of ``kvs_seq_append_pages`` (both taken
 * from the cffi binding, so this module links against nothing and follows the binding's library
 * lookup), the manager's block objects (``blocks[page id]``) and the addresses of
 * ``kvs_seq_begin`` and ``kvs_prefix_match``: every native call of the adapter's hot path, with
 * one page buffer and one re-entry guard.
 *
 * ``Appender.append(st, ids, known, lookahead)`` is ``_append`` of manager.py: it hands kvshare
 * the token ids ``ids[st.n:known]``, keeps ``lookahead`` slots past them, appends the pages
 * kvshare added to ``st.pages`` (ints) and ``st.raw`` (uint32 bytes), updates ``st.n`` and
 * ``st.quiet``, and returns ``(status, new page ids)``; on a failure nothing changed
 * (``(status, ())``).  No copy buffer is passed: the adapter shares only full prefix-hit pages,
 * all below ``st.n``, so an append never writes into a shared page (a copy-on-write would be
 * refused as KVS_STATUS_BUFFER_TOO_SMALL).
 *
 * ``Appender.cross(st, ids, main, lookahead_tokens, max_model_len)`` is ``_cross``: the append a
 * running request's step needs (``main`` tokens computed after it, the known ones handed over,
 * lookahead slots up to ``max_model_len``), returning ``(status, [block objects added])``.
 *
 * ``Appender.match(ids, extra_addr, max_tokens)`` is ``_match``, the prefix lookup of
 * ``get_computed_blocks``: it packs the token ids to int32, looks up their cached prefix
 * (``extra_addr``: a ``kvs_extra_keys *`` as an int, 0 for none; nothing acquired) and returns
 * ``(status, packed ids, [block objects of the hit pages])``.
 *
 * ``Appender.begin(st, toks, extra_addr, max_match, lookahead, first)`` is ``_open``: a request's
 * ``kvs_seq_begin`` (sequence ``st.seq``; ``toks``: its known token ids packed to int32, any
 * buffer; ``extra_addr`` as for ``match``), then the append that keeps ``lookahead`` slots and
 * reads the block table into ``st``.  Returns ``(begin status, append status, matched tokens,
 * [block objects of the table from page first on])``; on a begin failure nothing changed.
 *
 * Groups: ``_fast_groups.c`` (the hybrid manager's calls), compiled into this module.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvshare.h"
#include "_fast_common.h"

typedef kvs_status (*append_pages_fn)(kvs_cache *, uint64_t, const int32_t *, size_t, size_t,
                                      kvs_copy *, size_t, size_t *, size_t, uint32_t *, size_t,
                                      size_t *);
typedef kvs_status (*seq_begin_fn)(kvs_cache *, uint64_t, const int32_t *, size_t,
                                   const kvs_extra_keys *, size_t, size_t, kvs_seq_info *);
typedef kvs_status (*prefix_match_fn)(kvs_cache *, size_t, const int32_t *, size_t,
                                      const kvs_extra_keys *, size_t, bool, uint32_t *, size_t,
                                      size_t *, size_t *);

typedef struct {
    PyObject_HEAD
    kvs_cache *cache;
    append_pages_fn fn;
    Py_ssize_t block_size;
    size_t max_pages;
    uint32_t *pages;  /* max_pages */
    int32_t *tokens;  /* tok_cap */
    size_t tok_cap;
    int busy;         /* inside a call: __index__ or attribute code re-entering is refused */
    PyObject *blocks; /* list: block object of each page id (cross, begin, match), or NULL */
    seq_begin_fn begin; /* or NULL */
    prefix_match_fn match; /* or NULL */
} Appender;

static PyObject *s_n, *s_seq, *s_pages, *s_raw, *s_quiet, *empty_tuple;

static int Appender_traverse(Appender *self, visitproc visit, void *arg) {
    Py_VISIT(self->blocks);
    return 0;
}

static int Appender_clear(Appender *self) {
    Py_CLEAR(self->blocks);
    return 0;
}

static void Appender_dealloc(Appender *self) {
    PyObject_GC_UnTrack(self);
    Py_CLEAR(self->blocks);
    free(self->pages);
    free(self->tokens);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Appender_init(Appender *self, PyObject *args, PyObject *kwds) {
    unsigned long long cache, fn;
    Py_ssize_t bs, max_pages;
    PyObject *blocks = Py_None;
    unsigned long long begin = 0, match = 0;
    static char *kw[] = {"cache_addr", "fn_addr", "block_size", "max_pages", "blocks",
                         "begin_addr", "match_addr", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "KKnn|OKK", kw, &cache, &fn, &bs, &max_pages,
                                     &blocks, &begin, &match))
        return -1;
    if (blocks != Py_None && !PyList_Check(blocks)) {
        PyErr_SetString(PyExc_TypeError, "Appender: blocks must be a list or None");
        return -1;
    }
    if (!cache || !fn || bs <= 0 || max_pages <= 0) {
        PyErr_SetString(PyExc_ValueError, "Appender: null address or non-positive size");
        return -1;
    }
    if (bs > KVS_MAX_PAGE_SIZE) { /* kvshare's largest page size; keeps pages * block_size in range */
        PyErr_Format(PyExc_ValueError, "Appender: block_size above %d", KVS_MAX_PAGE_SIZE);
        return -1;
    }
    if ((size_t)max_pages > PY_SSIZE_T_MAX / sizeof(uint32_t)) {
        PyErr_SetString(PyExc_OverflowError, "Appender: max_pages too large");
        return -1;
    }
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "Appender: __init__ during append");
        return -1;
    }
    uint32_t *pages = malloc((size_t)max_pages * sizeof(uint32_t));
    if (!pages) {
        PyErr_NoMemory();
        return -1;
    }
    free(self->pages);
    self->pages = pages;
    self->cache = (kvs_cache *)(uintptr_t)cache;
    self->fn = (append_pages_fn)(uintptr_t)fn;
    self->begin = (seq_begin_fn)(uintptr_t)begin;
    self->match = (prefix_match_fn)(uintptr_t)match;
    self->block_size = bs;
    self->max_pages = (size_t)max_pages;
    /* Last: dropping the old list may run finalizers, which then see a consistent Appender. */
    if (blocks == Py_None) {
        Py_CLEAR(self->blocks);
    } else {
        Py_INCREF(blocks);
        Py_XSETREF(self->blocks, blocks);
    }
    return 0;
}

/* An int attribute of ``st`` as Py_ssize_t (-1 with an exception set on failure). */
static Py_ssize_t get_size(PyObject *st, PyObject *name) {
    PyObject *v = PyObject_GetAttr(st, name);
    if (!v)
        return -1;
    Py_ssize_t r = PyLong_AsSsize_t(v);
    Py_DECREF(v);
    if (r < 0 && !PyErr_Occurred())
        PyErr_Format(PyExc_ValueError, "Appender: negative %U", name);
    return r;
}

static int set_size(PyObject *st, PyObject *name, Py_ssize_t value) {
    PyObject *v = PyLong_FromSsize_t(value);
    if (!v)
        return -1;
    int r = PyObject_SetAttr(st, name, v);
    Py_DECREF(v);
    return r;
}

/* ``[blocks[pages[i]] for i in range(lo, hi)]`` (IndexError for a page with no block object). */
static PyObject *block_list(PyObject *blocks, const uint32_t *pages, Py_ssize_t lo, Py_ssize_t hi) {
    PyObject *out = PyList_New(hi - lo);
    if (!out)
        return NULL;
    for (Py_ssize_t i = lo; i < hi; i++) {
        uint32_t p = pages[i];
        if ((Py_ssize_t)p >= PyList_GET_SIZE(blocks)) {
            Py_DECREF(out);
            return PyErr_Format(PyExc_IndexError, "page %u has no block object", p);
        }
        PyObject *b = PyList_GET_ITEM(blocks, (Py_ssize_t)p);
        Py_INCREF(b);
        PyList_SET_ITEM(out, i - lo, b);
    }
    return out;
}

/* The append shared by ``append``, ``cross`` and ``begin``: ``*rc`` is kvshare's status; on KVS_STATUS_OK
 * ``st`` follows kvshare and ``*new_out`` is the list of new page ids (``self->pages`` holds
 * them too).  Returns -1 with an exception set (nothing changed, unless the failure came after
 * kvshare's change: a MemoryError, or a hook on ``st`` refusing the update). */
static int append_core(Appender *self, PyObject *st, PyObject *ids, Py_ssize_t known,
                       Py_ssize_t lookahead, kvs_status *rc, PyObject **new_out) {
    *new_out = NULL;
    if (lookahead < 0) {
        PyErr_SetString(PyExc_ValueError, "append: negative lookahead");
        return -1;
    }
    Py_ssize_t old = get_size(st, s_n);
    if (old < 0)
        return -1;
    Py_ssize_t add = known > old ? known - old : 0;
    if (add) {
        if (!PyList_Check(ids) && !PyTuple_Check(ids)) {
            PyErr_SetString(PyExc_TypeError, "append: token ids must be a list or tuple");
            return -1;
        }
        if (PySequence_Fast_GET_SIZE(ids) < known) {
            PyErr_SetString(PyExc_ValueError, "append: fewer token ids than known");
            return -1;
        }
        if ((size_t)add > self->tok_cap) {
            int32_t *t = realloc(self->tokens, (size_t)add * sizeof(int32_t));
            if (!t) {
                PyErr_NoMemory();
                return -1;
            }
            self->tokens = t;
            self->tok_cap = (size_t)add;
        }
        if (to_i32(ids, old, add, self->tokens) < 0)
            return -1;
    }
    PyObject *seq_obj = PyObject_GetAttr(st, s_seq);
    if (!seq_obj)
        return -1;
    unsigned long long seq = PyLong_AsUnsignedLongLong(seq_obj);
    Py_DECREF(seq_obj);
    if (seq == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    PyObject *pages = PyObject_GetAttr(st, s_pages);
    if (!pages)
        return -1;
    if (!PyList_Check(pages)) {
        Py_DECREF(pages);
        PyErr_SetString(PyExc_TypeError, "append: st.pages must be a list");
        return -1;
    }
    PyObject *raw = PyObject_GetAttr(st, s_raw);
    if (!raw) {
        Py_DECREF(pages);
        return -1;
    }
    if (!PyBytes_Check(raw)) {
        Py_DECREF(pages);
        Py_DECREF(raw);
        PyErr_SetString(PyExc_TypeError, "append: st.raw must be bytes");
        return -1;
    }
    size_t have = (size_t)PyList_GET_SIZE(pages), ncopies = 0, k = 0;
    *rc = self->fn(self->cache, seq, add ? self->tokens : NULL, (size_t)add, (size_t)lookahead,
                   NULL, 0, &ncopies, have, self->pages, self->max_pages, &k);
    if (*rc != KVS_STATUS_OK) {
        Py_DECREF(pages);
        Py_DECREF(raw);
        return 0;
    }
    /* kvshare changed: from here on the Python state must follow, whatever it costs. */
    int ok = -1;
    PyObject *new = PyList_New((Py_ssize_t)k);
    PyObject *raw_new = NULL;
    if (!new)
        goto done;
    for (size_t i = 0; i < k; i++) {
        PyObject *p = PyLong_FromUnsignedLong(self->pages[i]);
        if (!p)
            goto done;
        PyList_SET_ITEM(new, (Py_ssize_t)i, p);
    }
    if (k) {
        if (PyList_SetSlice(pages, (Py_ssize_t)have, (Py_ssize_t)have, new) < 0)
            goto done;
        Py_ssize_t rlen = PyBytes_GET_SIZE(raw), alen = (Py_ssize_t)(k * sizeof(uint32_t));
        raw_new = PyBytes_FromStringAndSize(NULL, rlen + alen);
        if (!raw_new)
            goto done;
        memcpy(PyBytes_AS_STRING(raw_new), PyBytes_AS_STRING(raw), (size_t)rlen);
        memcpy(PyBytes_AS_STRING(raw_new) + rlen, self->pages, (size_t)alen);
        if (PyObject_SetAttr(st, s_raw, raw_new) < 0)
            goto done;
    }
    Py_ssize_t n = old + add, bs = self->block_size;
    if (set_size(st, s_n, n) < 0)
        goto done;
    Py_ssize_t fill = (n / bs + 1) * bs, slots = PyList_GET_SIZE(pages) * bs;
    if (set_size(st, s_quiet, slots < fill - 1 ? slots : fill - 1) < 0)
        goto done;
    ok = 0;
    *new_out = new;
    new = NULL;
done:
    Py_DECREF(pages);
    Py_XDECREF(new);
    Py_DECREF(raw);
    Py_XDECREF(raw_new);
    return ok;
}

static PyObject *append_impl(Appender *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "append(st, ids, known, lookahead) takes 4 arguments");
        return NULL;
    }
    Py_ssize_t known = PyLong_AsSsize_t(args[2]);
    if (known == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t lookahead = PyLong_AsSsize_t(args[3]);
    if (lookahead == -1 && PyErr_Occurred())
        return NULL;
    kvs_status rc;
    PyObject *new;
    if (append_core(self, args[0], args[1], known, lookahead, &rc, &new) < 0)
        return NULL;
    if (rc != KVS_STATUS_OK)
        return Py_BuildValue("(iO)", (int)rc, empty_tuple);
    PyObject *r = Py_BuildValue("(iO)", 0, PyList_GET_SIZE(new) ? new : empty_tuple);
    Py_DECREF(new);
    return r;
}

/* ``_cross`` of manager.py (see the top of this file). */
static PyObject *cross_impl(Appender *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError,
                        "cross(st, ids, main, lookahead_tokens, max_model_len) takes 5 arguments");
        return NULL;
    }
    if (!self->blocks) {
        PyErr_SetString(PyExc_RuntimeError, "Appender: cross needs the blocks list");
        return NULL;
    }
    PyObject *st = args[0], *ids = args[1];
    if (!PyList_Check(ids) && !PyTuple_Check(ids)) {
        PyErr_SetString(PyExc_TypeError, "cross: token ids must be a list or tuple");
        return NULL;
    }
    Py_ssize_t v[3];
    if (counts(args + 2, 3, v, "cross") < 0)
        return NULL;
    Py_ssize_t main_ = v[0], lookahead_tokens = v[1], max_model_len = v[2];
    Py_ssize_t need = main_ > max_model_len || lookahead_tokens > max_model_len - main_
                          ? max_model_len : main_ + lookahead_tokens;
    Py_ssize_t ntok = PySequence_Fast_GET_SIZE(ids);
    Py_ssize_t known = main_ < ntok ? main_ : ntok; /* drafts/placeholders are not tokens yet */
    Py_ssize_t n = get_size(st, s_n);
    if (n < 0)
        return NULL;
    Py_ssize_t have = known > n ? known : n;
    kvs_status rc;
    PyObject *new;
    if (append_core(self, st, ids, known, need > have ? need - have : 0, &rc, &new) < 0)
        return NULL;
    if (rc != KVS_STATUS_OK)
        return Py_BuildValue("(i[])", (int)rc);
    Py_ssize_t k = PyList_GET_SIZE(new);
    Py_DECREF(new);
    PyObject *out = block_list(self->blocks, self->pages, 0, k);
    return out ? Py_BuildValue("(iN)", 0, out) : NULL;
}

/* ``_open`` of manager.py (see the top of this file). */
static PyObject *begin_impl(Appender *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError,
                        "begin(st, toks, extra_addr, max_match, lookahead, first) takes 6 arguments");
        return NULL;
    }
    if (!self->blocks || !self->begin) {
        PyErr_SetString(PyExc_RuntimeError, "Appender: begin needs the blocks list and begin_addr");
        return NULL;
    }
    PyObject *st = args[0];
    const kvs_extra_keys *extra;
    if (extra_ptr(args[2], &extra) < 0)
        return NULL;
    Py_ssize_t v[3];
    if (counts(args + 3, 3, v, "begin") < 0)
        return NULL;
    Py_ssize_t max_match = v[0], lookahead = v[1], first = v[2];
    PyObject *seq_obj = PyObject_GetAttr(st, s_seq);
    if (!seq_obj)
        return NULL;
    unsigned long long seq = PyLong_AsUnsignedLongLong(seq_obj);
    Py_DECREF(seq_obj);
    if (seq == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t n0 = get_size(st, s_n);
    if (n0 < 0)
        return NULL;
    if (n0 != 0) {
        PyErr_SetString(PyExc_ValueError, "begin: st already holds tokens");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[1], &view, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    if (view.len % (Py_ssize_t)sizeof(int32_t)) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "begin: toks is not whole int32 values");
        return NULL;
    }
    Py_ssize_t known = view.len / (Py_ssize_t)sizeof(int32_t);
    kvs_seq_info info;
    memset(&info, 0, sizeof info);
    kvs_status rc = self->begin(self->cache, seq, known ? (const int32_t *)view.buf : NULL,
                                (size_t)known, extra, (size_t)max_match, 0, &info);
    PyBuffer_Release(&view);
    if (rc != KVS_STATUS_OK)
        return Py_BuildValue("(iin[])", (int)rc, 0, (Py_ssize_t)0);
    /* The sequence exists: st follows it (n), then one append reads the table and keeps the
     * lookahead slots (no tokens: all of them were given to the begin). */
    if (set_size(st, s_n, known) < 0)
        return NULL;
    kvs_status rc2;
    PyObject *new;
    if (append_core(self, st, empty_tuple, known, lookahead, &rc2, &new) < 0)
        return NULL;
    Py_ssize_t matched = (Py_ssize_t)info.matched_tokens;
    if (rc2 != KVS_STATUS_OK)
        return Py_BuildValue("(iin[])", 0, (int)rc2, matched);
    Py_ssize_t k = PyList_GET_SIZE(new);
    Py_DECREF(new);
    PyObject *out = block_list(self->blocks, self->pages, first < k ? first : k, k);
    return out ? Py_BuildValue("(iinN)", 0, 0, matched, out) : NULL;
}

/* ``_match`` of manager.py (see the top of this file). */
static PyObject *match_impl(Appender *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "match(ids, extra_addr, max_tokens) takes 3 arguments");
        return NULL;
    }
    if (!self->blocks || !self->match) {
        PyErr_SetString(PyExc_RuntimeError, "Appender: match needs the blocks list and match_addr");
        return NULL;
    }
    PyObject *ids = args[0];
    if (!PyList_Check(ids) && !PyTuple_Check(ids)) {
        PyErr_SetString(PyExc_TypeError, "match: token ids must be a list or tuple");
        return NULL;
    }
    const kvs_extra_keys *extra;
    if (extra_ptr(args[1], &extra) < 0)
        return NULL;
    Py_ssize_t max_tokens;
    if (counts(args + 2, 1, &max_tokens, "match") < 0)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(ids);
    PyObject *packed = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int32_t));
    if (!packed)
        return NULL;
    int32_t *toks = (int32_t *)PyBytes_AS_STRING(packed);
    if (to_i32(ids, 0, n, toks) < 0) {
        Py_DECREF(packed);
        return NULL;
    }
    size_t np = 0, matched = 0;
    kvs_status rc = self->match(self->cache, 0, n ? toks : NULL, (size_t)n, extra,
                                (size_t)max_tokens, false, self->pages, self->max_pages, &np,
                                &matched);
    if (rc != KVS_STATUS_OK)
        return Py_BuildValue("(iN[])", (int)rc, packed);
    PyObject *hits = block_list(self->blocks, self->pages, 0, (Py_ssize_t)np);
    if (!hits) {
        Py_DECREF(packed);
        return NULL;
    }
    return Py_BuildValue("(iNN)", 0, packed, hits);
}

/* The methods with the Appender's buffers held: Python code they run (``__index__``, attribute
 * hooks) cannot re-enter this Appender. */
static PyObject *guarded(Appender *self, PyObject *const *args, Py_ssize_t nargs,
                         PyObject *(*impl)(Appender *, PyObject *const *, Py_ssize_t)) {
    if (!self->fn || !self->pages) {
        PyErr_SetString(PyExc_RuntimeError, "Appender: not initialised");
        return NULL;
    }
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "Appender: call re-entered");
        return NULL;
    }
    self->busy = 1;
    PyObject *r = impl(self, args, nargs);
    self->busy = 0;
    return r;
}

static PyObject *Appender_append(Appender *self, PyObject *const *args, Py_ssize_t nargs) {
    return guarded(self, args, nargs, append_impl);
}

static PyObject *Appender_cross(Appender *self, PyObject *const *args, Py_ssize_t nargs) {
    return guarded(self, args, nargs, cross_impl);
}

static PyObject *Appender_begin(Appender *self, PyObject *const *args, Py_ssize_t nargs) {
    return guarded(self, args, nargs, begin_impl);
}

static PyObject *Appender_match(Appender *self, PyObject *const *args, Py_ssize_t nargs) {
    return guarded(self, args, nargs, match_impl);
}

static PyMethodDef Appender_methods[] = {
    {"append", (PyCFunction)(void (*)(void))Appender_append, METH_FASTCALL,
     "append(st, ids, known, lookahead) -> (status, new page ids)"},
    {"begin", (PyCFunction)(void (*)(void))Appender_begin, METH_FASTCALL,
     "begin(st, toks, extra_addr, max_match, lookahead, first) -> (begin status, append status, "
     "matched tokens, block objects from page first on)"},
    {"match", (PyCFunction)(void (*)(void))Appender_match, METH_FASTCALL,
     "match(ids, extra_addr, max_tokens) -> (status, packed ids, hit block objects)"},
    {"cross", (PyCFunction)(void (*)(void))Appender_cross, METH_FASTCALL,
     "cross(st, ids, main, lookahead_tokens, max_model_len) -> (status, new block objects)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject AppenderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvshare_vllm._fast.Appender",
    .tp_basicsize = sizeof(Appender),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)Appender_traverse,
    .tp_clear = (inquiry)Appender_clear,
    .tp_doc = "the vLLM adapter's native calls (append, cross, begin, match) with their "
              "request-state updates",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Appender_init,
    .tp_dealloc = (destructor)Appender_dealloc,
    .tp_methods = Appender_methods,
};

/* pack_i32(ids) -> bytes: a list or tuple of token ids as native int32 (``kvshare.pack_i32``
 * for the prompts the adapter matches and begins). */
static PyObject *pack_i32(PyObject *module, PyObject *ids) {
    (void)module;
    if (!PyList_Check(ids) && !PyTuple_Check(ids)) {
        PyErr_SetString(PyExc_TypeError, "pack_i32: token ids must be a list or tuple");
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(ids);
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int32_t));
    if (!out)
        return NULL;
    if (to_i32(ids, 0, n, (int32_t *)PyBytes_AS_STRING(out)) < 0) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

static PyMethodDef module_methods[] = {
    {"pack_i32", pack_i32, METH_O, "pack_i32(ids) -> bytes: token ids as native int32"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef fastmodule = {
    PyModuleDef_HEAD_INIT, "_fast", "Compiled hot path of the kvshare vLLM adapter.", -1,
    module_methods, NULL, NULL, NULL, NULL,
};


PyMODINIT_FUNC PyInit__fast(void) {
    if (PyType_Ready(&AppenderType) < 0)
        return NULL;
    PyTypeObject *groups = kvshare_fast_groups_ready();
    if (!groups)
        return NULL;
    s_n = PyUnicode_InternFromString("n");
    s_seq = PyUnicode_InternFromString("seq");
    s_pages = PyUnicode_InternFromString("pages");
    s_raw = PyUnicode_InternFromString("raw");
    s_quiet = PyUnicode_InternFromString("quiet");
    empty_tuple = PyTuple_New(0);
    if (!s_n || !s_seq || !s_pages || !s_raw || !s_quiet || !empty_tuple)
        return NULL;
    PyObject *m = PyModule_Create(&fastmodule);
    if (!m)
        return NULL;
    Py_INCREF(&AppenderType);
    if (PyModule_AddObject(m, "Appender", (PyObject *)&AppenderType) < 0) {
        Py_DECREF(&AppenderType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(groups);
    if (PyModule_AddObject(m, "Groups", (PyObject *)groups) < 0) {
        Py_DECREF(groups);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
