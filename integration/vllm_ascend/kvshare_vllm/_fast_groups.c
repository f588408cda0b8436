/* kvshare_vllm._fast's Groups: the manager's (``manager.py``, one or many KV-cache groups) native
 * calls, one C call per manager method, compiled into the module with ``_fast.c`` (the module and
 * ``pack_i32``; its ``PyInit__fast`` readies the type through ``kvshare_fast_groups_ready``).
 *
 * ``Groups(hybrid_addr, fns, block_size, num_pages, kinds, refs, blocks)`` holds a
 * ``kvs_cache *`` and the addresses of the ``kvs_*`` calls it makes (all taken from
 * the cffi binding, so this module links against nothing): ``fns`` is the tuple (seq_append,
 * seq_get_info, seq_pages, seq_release_skipped, seq_free, seq_begin_computed, prefix_find).
 * ``kinds`` gives
 * each group's (kind, window): 0 full attention, 1 sliding window W, 2 chunked local C (any
 * other kind is refused: manager.py then makes its calls through the binding).  ``refs`` is the
 * manager's page refcount mirror (a writable buffer of uint32, one per page: how many live block tables hold
 * the page), held for the object's life; ``blocks`` the block object of each page id.
 *
 * A request's state ``st`` (manager.py's ``_HReq``) is read and written through its attributes
 * ``seq``, ``n`` (tokens handed to kvshare) and ``tables`` (one list of page ids per group, 0
 * at the null page).  ``avail`` is the manager's kept free count (vLLM's free blocks: pages no
 * live table holds) or None when unknown; every call returns it updated as the mirror moves
 * (a page going from no holder to one leaves it, and back).
 *
 * Methods (each the Python code of manager.py it replaces, with the same results):
 *   running(st, ids, release_at, need_slot, known, avail) -> (room, rc, appended, added, avail)
 *       ``allocate_slots`` of a running request: ``remove_skipped_blocks(release_at)``, vLLM's
 *       room check (``room`` False: no room, nothing appended), then the append of
 *       ``ids[st.n:known]`` with slots up to ``need_slot`` when a page is added or fills.
 *   append(st, ids, known, lookahead, avail) -> (rc, added, avail)     (``cache_blocks``)
 *   release(st, num_computed, avail) -> (released, avail)     (``remove_skipped_blocks``)
 *   begin(st, ids, known, extra_addr, max_match, lookahead, first, computed, avail)
 *       -> (rc, matched, rows, avail)     (``_begin``, ``kvs_seq_begin_computed``; rows: per
 *       group the block objects of the table from position ``first`` on, None on a failure)
 *   free(st, avail) -> (rc, avail)
 *   match(ids, extra_addr, max_tokens) -> (rc, hit tokens, [block objects] per group)
 * ``added``: None when the tables did not grow, else one list of block objects per group (the
 * positions past each table's old length).  ``rc`` is kvshare's status: on a failure nothing
 * changed (kvshare refuses before it changes anything, and st follows only on success).
 */
#include <stdlib.h>
#include <string.h>

#include "_fast_common.h" /* Python.h and kvshare.h */

typedef kvs_status (*append_fn)(kvs_cache *, uint64_t, const int32_t *, size_t, size_t,
                                kvs_copy *, size_t, size_t *);
typedef kvs_status (*info_fn)(const kvs_cache *, uint64_t, kvs_seq_info *);
typedef kvs_status (*pages_fn)(const kvs_cache *, size_t, uint64_t, uint32_t *, size_t, size_t *);
typedef kvs_status (*release_fn)(kvs_cache *, uint64_t, size_t, size_t *);
typedef kvs_status (*free_fn)(kvs_cache *, uint64_t);
typedef kvs_status (*begin_fn)(kvs_cache *, uint64_t, const int32_t *, size_t,
                               const kvs_extra_keys *, size_t, size_t, size_t, kvs_seq_info *);
typedef kvs_status (*match_fn)(const kvs_cache *, const int32_t *, size_t,
                               const kvs_extra_keys *, size_t, uint32_t *, size_t, size_t,
                               size_t *);

enum { KIND_FULL = 0, KIND_SLIDING = 1, KIND_CHUNKED = 2 };

typedef struct {
    PyObject_HEAD
    kvs_cache *h;
    append_fn append;
    info_fn info;
    pages_fn pages;
    release_fn release;
    free_fn free_seq;
    begin_fn begin;
    match_fn match;
    Py_ssize_t bs, ng;
    int kind[KVS_MAX_GROUPS];
    Py_ssize_t window[KVS_MAX_GROUPS];
    size_t max_pages; /* pages of a table, at most (the pool's size) */
    uint32_t *buf;    /* ng * max_pages: tables and match rows read back */
    int32_t *tokens;
    size_t tok_cap;
    Py_buffer refs; /* uint32 per page; held while refs_held */
    int refs_held;
    PyObject *blocks;
    int busy;
} Groups;

static PyObject *s_n, *s_seq, *s_tables, *zero; /* set by kvshare_fast_groups_ready */

static int Groups_traverse(Groups *self, visitproc visit, void *arg) {
    Py_VISIT(self->blocks);
    return 0;
}

static int Groups_clear(Groups *self) {
    Py_CLEAR(self->blocks);
    return 0;
}

static void Groups_dealloc(Groups *self) {
    PyObject_GC_UnTrack(self);
    Py_CLEAR(self->blocks);
    if (self->refs_held)
        PyBuffer_Release(&self->refs);
    free(self->buf);
    free(self->tokens);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Groups_init(Groups *self, PyObject *args, PyObject *kwds) {
    unsigned long long h;
    PyObject *fns, *kinds, *refs, *blocks;
    Py_ssize_t bs, num_pages;
    static char *kw[] = {"hybrid_addr", "fns", "block_size", "num_pages", "kinds", "refs",
                         "blocks", NULL};
    if (self->refs_held || self->buf) {
        PyErr_SetString(PyExc_RuntimeError, "Groups: already initialised");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "KO!nnO!OO!", kw, &h, &PyTuple_Type, &fns, &bs,
                                     &num_pages, &PyTuple_Type, &kinds, &refs, &PyList_Type,
                                     &blocks))
        return -1;
    if (!h || PyTuple_GET_SIZE(fns) != 7 || bs <= 0 || bs > KVS_MAX_PAGE_SIZE || num_pages < 2) {
        PyErr_SetString(PyExc_ValueError, "Groups: null handle, 7 call addresses, a block size "
                                          "in 1..KVS_MAX_PAGE_SIZE and 2 pages or more needed");
        return -1;
    }
    Py_ssize_t ng = PyTuple_GET_SIZE(kinds);
    if (ng < 1 || ng > KVS_MAX_GROUPS) {
        PyErr_SetString(PyExc_ValueError, "Groups: 1..KVS_MAX_GROUPS groups");
        return -1;
    }
    if ((size_t)num_pages > (SIZE_MAX / sizeof(uint32_t)) / (size_t)ng ||
        PyList_GET_SIZE(blocks) < num_pages) {
        PyErr_SetString(PyExc_ValueError, "Groups: too many pages, or fewer block objects");
        return -1;
    }
    void *fn[7];
    for (int i = 0; i < 7; i++) {
        unsigned long long a = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(fns, i));
        if (a == (unsigned long long)-1 && PyErr_Occurred())
            return -1;
        if (!a) {
            PyErr_SetString(PyExc_ValueError, "Groups: null call address");
            return -1;
        }
        fn[i] = (void *)(uintptr_t)a;
    }
    for (Py_ssize_t g = 0; g < ng; g++) {
        long k, w;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(kinds, g), "ll", &k, &w))
            return -1;
        if (k < KIND_FULL || k > KIND_CHUNKED || (k != KIND_FULL && w <= 0)) {
            PyErr_Format(PyExc_ValueError, "Groups: group %zd: kind %ld window %ld not handled",
                         g, k, w);
            return -1;
        }
        self->kind[g] = (int)k;
        self->window[g] = w;
    }
    if (PyObject_GetBuffer(refs, &self->refs, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    self->refs_held = 1;
    if (self->refs.itemsize != 4 || self->refs.len / 4 < num_pages) {
        PyErr_SetString(PyExc_ValueError, "Groups: refs must hold a uint32 per page");
        return -1;
    }
    self->buf = malloc((size_t)num_pages * (size_t)ng * sizeof(uint32_t));
    if (!self->buf) {
        PyErr_NoMemory();
        return -1;
    }
    self->h = (kvs_cache *)(uintptr_t)h;
    self->append = (append_fn)fn[0];
    self->info = (info_fn)fn[1];
    self->pages = (pages_fn)fn[2];
    self->release = (release_fn)fn[3];
    self->free_seq = (free_fn)fn[4];
    self->begin = (begin_fn)fn[5];
    self->match = (match_fn)fn[6];
    self->bs = bs;
    self->ng = ng;
    self->max_pages = (size_t)num_pages;
    Py_INCREF(blocks);
    self->blocks = blocks;
    return 0;
}

/* ---------------------------------------------------------------- request state */

typedef struct {
    uint64_t seq;
    Py_ssize_t n;
    PyObject *tables; /* new reference: a list of ng lists */
} State;

static int state_read(Groups *self, PyObject *st, State *s) {
    s->tables = NULL;
    PyObject *v = PyObject_GetAttr(st, s_seq);
    if (!v)
        return -1;
    s->seq = PyLong_AsUnsignedLongLong(v);
    Py_DECREF(v);
    if (s->seq == (uint64_t)-1 && PyErr_Occurred())
        return -1;
    v = PyObject_GetAttr(st, s_n);
    if (!v)
        return -1;
    s->n = PyLong_AsSsize_t(v);
    Py_DECREF(v);
    if (s->n < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "Groups: negative st.n");
        return -1;
    }
    s->tables = PyObject_GetAttr(st, s_tables);
    if (!s->tables)
        return -1;
    int ok = PyList_Check(s->tables) && PyList_GET_SIZE(s->tables) == self->ng;
    for (Py_ssize_t g = 0; ok && g < self->ng; g++)
        ok = PyList_Check(PyList_GET_ITEM(s->tables, g));
    if (!ok) {
        Py_CLEAR(s->tables);
        PyErr_SetString(PyExc_TypeError, "Groups: st.tables must be a list of a list per group");
        return -1;
    }
    return 0;
}

static int set_n(PyObject *st, Py_ssize_t n) {
    PyObject *v = PyLong_FromSsize_t(n);
    if (!v)
        return -1;
    int r = PyObject_SetAttr(st, s_n, v);
    Py_DECREF(v);
    return r;
}

/* ``avail`` in: None (unknown, -1) or a non-negative int. */
static int avail_in(PyObject *o, Py_ssize_t *out) {
    if (o == Py_None) {
        *out = -1;
        return 0;
    }
    *out = PyLong_AsSsize_t(o);
    if (*out < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "Groups: negative avail");
        return -1;
    }
    return 0;
}

static PyObject *avail_out(Py_ssize_t a) {
    if (a < 0)
        Py_RETURN_NONE;
    return PyLong_FromSsize_t(a);
}

/* Adds ``d`` (+1 / -1) holders to page ``p`` in the mirror; the kept free count follows. */
static int ref_add(Groups *self, uint32_t p, int d, Py_ssize_t *avail) {
    if (!p)
        return 0;
    if ((size_t)p >= self->max_pages) {
        PyErr_Format(PyExc_AssertionError, "kvshare_vllm: page %u past the pool", p);
        return -1;
    }
    uint32_t *r = (uint32_t *)self->refs.buf + p;
    if (d > 0) {
        if (*r == UINT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "kvshare_vllm: page refcount mirror overflow");
            return -1;
        }
        if ((*r)++ == 0 && *avail >= 0)
            --*avail;
    } else {
        if (*r == 0) {
            PyErr_Format(PyExc_AssertionError, "kvshare_vllm: page %u released with no holder", p);
            return -1;
        }
        if (--*r == 0 && *avail >= 0)
            ++*avail;
    }
    return 0;
}

/* The page id at ``t[i]`` (a list of ints). */
static int page_at(PyObject *t, Py_ssize_t i, uint32_t *p) {
    unsigned long v = PyLong_AsUnsignedLong(PyList_GET_ITEM(t, i));
    if (v == (unsigned long)-1 && PyErr_Occurred())
        return -1;
    if (v > UINT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "Groups: page id past uint32");
        return -1;
    }
    *p = (uint32_t)v;
    return 0;
}

/* group_tables.py's ``_refresh``: reads every group's table back from kvshare into ``s->tables``
 * (positions that changed and the ones past the old length), the mirror following.  With
 * ``added_out``: None when no table grew, else per group the block objects of the positions
 * past its old length. */
static int refresh(Groups *self, State *s, Py_ssize_t *avail, PyObject **added_out) {
    kvs_seq_info info;
    kvs_status rc = self->info(self->h, s->seq, &info);
    if (rc != KVS_STATUS_OK) {
        PyErr_Format(PyExc_RuntimeError, "kvs_seq_get_info: status %d", (int)rc);
        return -1;
    }
    size_t np = (size_t)info.num_pages;
    if (np > self->max_pages) {
        PyErr_SetString(PyExc_AssertionError, "kvshare_vllm: a table longer than the pool");
        return -1;
    }
    if (added_out)
        *added_out = NULL;
    int grew = 0;
    for (Py_ssize_t g = 0; g < self->ng; g++)
        grew |= (size_t)PyList_GET_SIZE(PyList_GET_ITEM(s->tables, g)) != np;
    if (!grew && added_out) {
        *added_out = Py_NewRef(Py_None);
        return 0;
    }
    PyObject *added = added_out ? PyList_New(self->ng) : NULL;
    if (added_out && !added)
        return -1;
    for (Py_ssize_t g = 0; g < self->ng; g++) {
        uint32_t *row = self->buf + (size_t)g * self->max_pages;
        size_t k = 0;
        rc = self->pages(self->h, (size_t)g, s->seq, row, self->max_pages, &k);
        if (rc != KVS_STATUS_OK || k != np) {
            PyErr_Format(PyExc_RuntimeError, "kvs_seq_pages: status %d", (int)rc);
            goto fail;
        }
        PyObject *t = PyList_GET_ITEM(s->tables, g);
        Py_ssize_t old = PyList_GET_SIZE(t);
        for (Py_ssize_t i = 0; i < old && (size_t)i < k; i++) {
            uint32_t p;
            if (page_at(t, i, &p) < 0)
                goto fail;
            if (p != row[i]) {
                PyObject *v = PyLong_FromUnsignedLong(row[i]);
                if (!v || PyList_SetItem(t, i, v) < 0 || ref_add(self, p, -1, avail) < 0 ||
                    ref_add(self, row[i], +1, avail) < 0)
                    goto fail;
            }
        }
        if ((size_t)old > k) { /* tables never shrink; a disagreement is a bug */
            PyErr_SetString(PyExc_AssertionError, "kvshare_vllm: a block table shrank");
            goto fail;
        }
        PyObject *objs = added ? PyList_New((Py_ssize_t)k - old) : NULL;
        if (added && !objs)
            goto fail;
        if (added)
            PyList_SET_ITEM(added, g, objs);
        for (size_t i = (size_t)old; i < k; i++) {
            uint32_t p = row[i];
            if ((Py_ssize_t)p >= PyList_GET_SIZE(self->blocks)) {
                PyErr_Format(PyExc_IndexError, "page %u has no block object", p);
                goto fail;
            }
            PyObject *v = PyLong_FromUnsignedLong(p);
            if (!v)
                goto fail;
            int r = PyList_Append(t, v);
            Py_DECREF(v);
            if (r < 0 || ref_add(self, p, +1, avail) < 0)
                goto fail;
            if (objs) {
                PyObject *b = PyList_GET_ITEM(self->blocks, (Py_ssize_t)p);
                PyList_SET_ITEM(objs, (Py_ssize_t)i - old, Py_NewRef(b));
            }
        }
    }
    if (added_out)
        *added_out = added;
    return 0;
fail:
    Py_XDECREF(added);
    return -1;
}

/* Packs ``ids[lo:hi]`` into ``self->tokens``. */
static int pack(Groups *self, PyObject *ids, Py_ssize_t lo, Py_ssize_t hi) {
    if (hi <= lo)
        return 0;
    if (!PyList_Check(ids) && !PyTuple_Check(ids)) {
        PyErr_SetString(PyExc_TypeError, "Groups: token ids must be a list or tuple");
        return -1;
    }
    if (PySequence_Fast_GET_SIZE(ids) < hi) {
        PyErr_SetString(PyExc_ValueError, "Groups: fewer token ids than known");
        return -1;
    }
    size_t add = (size_t)(hi - lo);
    if (add > self->tok_cap) {
        int32_t *t = realloc(self->tokens, add * sizeof(int32_t));
        if (!t) {
            PyErr_NoMemory();
            return -1;
        }
        self->tokens = t;
        self->tok_cap = add;
    }
    return to_i32(ids, lo, hi - lo, self->tokens);
}

static Py_ssize_t skipped(Groups *self, Py_ssize_t g, Py_ssize_t c) {
    Py_ssize_t w = self->window[g];
    switch (self->kind[g]) {
    case KIND_SLIDING:
        return c - w + 1 > 0 ? c - w + 1 : 0;
    case KIND_CHUNKED:
        return c / w * w;
    default:
        return 0;
    }
}

/* group_tables.py's ``_release``: the positions out of every window become null (kvshare's
 * ``kvs_seq_release_skipped``, the mirror by the same rule), only when one is still
 * held.  Writes the pages released to ``*released``. */
static int release_core(Groups *self, State *s, Py_ssize_t c, Py_ssize_t *avail,
                        Py_ssize_t *released) {
    *released = 0;
    int todo = 0;
    for (Py_ssize_t g = 0; g < self->ng && !todo; g++) {
        if (self->kind[g] == KIND_FULL)
            continue;
        PyObject *t = PyList_GET_ITEM(s->tables, g);
        Py_ssize_t k = skipped(self, g, c) / self->bs;
        if (k > PyList_GET_SIZE(t))
            k = PyList_GET_SIZE(t);
        uint32_t p;
        if (k && page_at(t, k - 1, &p) < 0)
            return -1;
        todo = k && p;
    }
    if (!todo)
        return 0;
    size_t done = 0;
    kvs_status rc = self->release(self->h, s->seq, (size_t)c, &done);
    if (rc != KVS_STATUS_OK) {
        PyErr_Format(PyExc_RuntimeError, "kvs_seq_release_skipped: status %d", (int)rc);
        return -1;
    }
    Py_ssize_t n = 0;
    for (Py_ssize_t g = 0; g < self->ng; g++) {
        if (self->kind[g] == KIND_FULL)
            continue;
        PyObject *t = PyList_GET_ITEM(s->tables, g);
        Py_ssize_t i = skipped(self, g, c) / self->bs;
        if (i > PyList_GET_SIZE(t))
            i = PyList_GET_SIZE(t);
        for (i--; i >= 0; i--) {
            uint32_t p;
            if (page_at(t, i, &p) < 0)
                return -1;
            if (!p)
                break;
            if (ref_add(self, p, -1, avail) < 0)
                return -1;
            if (PyList_SetItem(t, i, Py_NewRef(zero)) < 0)
                return -1;
            n++;
        }
    }
    if ((size_t)n != done) {
        PyErr_Format(PyExc_AssertionError, "kvshare_vllm: kvshare released %zu pages, the "
                     "mirror %zd", done, n);
        return -1;
    }
    *released = n;
    return 0;
}

/* The append of ``ids[s->n:known]`` with ``lookahead`` slots past them; on success st.n follows
 * and the tables are read back when they grew (``*added``: see refresh). */
static int groups_append_core(Groups *self, PyObject *st, State *s, PyObject *ids, Py_ssize_t known,
                       Py_ssize_t lookahead, Py_ssize_t *avail, kvs_status *rc,
                       PyObject **added) {
    *added = NULL;
    Py_ssize_t add = known > s->n ? known - s->n : 0;
    if (pack(self, ids, s->n, s->n + add) < 0)
        return -1;
    /* No sequence here is forked: an append copies nothing (a copy would be refused whole,
     * as BUFFER_TOO_SMALL, with nothing changed). */
    kvs_copy copies[1];
    size_t num_copies = 0;
    *rc = self->append(self->h, s->seq, add ? self->tokens : NULL, (size_t)add,
                       (size_t)lookahead, copies, 0, &num_copies);
    if (*rc != KVS_STATUS_OK)
        return 0;
    s->n += add;
    if (add && set_n(st, s->n) < 0)
        return -1;
    return refresh(self, s, avail, added);
}

/* ---------------------------------------------------------------- methods */

static PyObject *groups_running_impl(Groups *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError,
                        "running(st, ids, release_at, need_slot, known, avail) takes 6 arguments");
        return NULL;
    }
    Py_ssize_t v[3], avail;
    if (counts(args + 2, 3, v, "running") < 0 || avail_in(args[5], &avail) < 0)
        return NULL;
    if (avail < 0) {
        PyErr_SetString(PyExc_ValueError, "running: avail must be known");
        return NULL;
    }
    Py_ssize_t release_at = v[0], need_slot = v[1], known = v[2], released;
    State s;
    if (state_read(self, args[0], &s) < 0)
        return NULL;
    PyObject *out = NULL, *added = NULL;
    if (release_core(self, &s, release_at, &avail, &released) < 0)
        goto done;
    Py_ssize_t want = (need_slot + self->bs - 1) / self->bs, need = 0;
    for (Py_ssize_t g = 0; g < self->ng; g++) {
        Py_ssize_t held = PyList_GET_SIZE(PyList_GET_ITEM(s.tables, g));
        need += want > held ? want - held : 0;
    }
    if (need && need > avail) {
        out = Py_BuildValue("(OiOOn)", Py_False, 0, Py_False, Py_None, avail);
        goto done;
    }
    int grows = want > PyList_GET_SIZE(PyList_GET_ITEM(s.tables, 0));
    if (!grows && known / self->bs <= s.n / self->bs) {
        out = Py_BuildValue("(OiOOn)", Py_True, 0, Py_False, Py_None, avail);
        goto done;
    }
    Py_ssize_t n_after = known > s.n ? known : s.n;
    kvs_status rc;
    if (groups_append_core(self, args[0], &s, args[1], known,
                    need_slot > n_after ? need_slot - n_after : 0, &avail, &rc, &added) < 0)
        goto done;
    out = Py_BuildValue("(OiOOn)", Py_True, (int)rc, rc == KVS_STATUS_OK ? Py_True : Py_False,
                        added ? added : Py_None, avail);
done:
    Py_XDECREF(added);
    Py_DECREF(s.tables);
    return out;
}

static PyObject *groups_append_impl(Groups *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "append(st, ids, known, lookahead, avail) takes 5 "
                                         "arguments");
        return NULL;
    }
    Py_ssize_t v[2], avail;
    if (counts(args + 2, 2, v, "append") < 0 || avail_in(args[4], &avail) < 0)
        return NULL;
    State s;
    if (state_read(self, args[0], &s) < 0)
        return NULL;
    PyObject *out = NULL, *added = NULL;
    kvs_status rc;
    if (groups_append_core(self, args[0], &s, args[1], v[0], v[1], &avail, &rc, &added) == 0)
        out = Py_BuildValue("(iON)", (int)rc, added ? added : Py_None, avail_out(avail));
    Py_XDECREF(added);
    Py_DECREF(s.tables);
    return out;
}

static PyObject *groups_release_impl(Groups *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "release(st, num_computed, avail) takes 3 arguments");
        return NULL;
    }
    Py_ssize_t c, avail, released;
    if (counts(args + 1, 1, &c, "release") < 0 || avail_in(args[2], &avail) < 0)
        return NULL;
    State s;
    if (state_read(self, args[0], &s) < 0)
        return NULL;
    PyObject *out = NULL;
    if (release_core(self, &s, c, &avail, &released) == 0)
        out = Py_BuildValue("(nN)", released, avail_out(avail));
    Py_DECREF(s.tables);
    return out;
}

static PyObject *groups_begin_impl(Groups *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "begin(st, ids, known, extra_addr, max_match, "
                                         "lookahead, first, computed, avail) takes 9 arguments");
        return NULL;
    }
    Py_ssize_t known, v[4], avail;
    if (counts(args + 2, 1, &known, "begin") < 0 || counts(args + 4, 4, v, "begin") < 0 ||
        avail_in(args[8], &avail) < 0)
        return NULL;
    const kvs_extra_keys *extra;
    if (extra_ptr(args[3], &extra) < 0)
        return NULL;
    State s;
    if (state_read(self, args[0], &s) < 0)
        return NULL;
    PyObject *out = NULL;
    int empty = s.n == 0;
    for (Py_ssize_t g = 0; empty && g < self->ng; g++)
        empty = PyList_GET_SIZE(PyList_GET_ITEM(s.tables, g)) == 0;
    if (!empty) {
        PyErr_SetString(PyExc_ValueError, "begin: st already holds tokens or pages");
        goto done;
    }
    if (pack(self, args[1], 0, known) < 0)
        goto done;
    kvs_seq_info info;
    kvs_status rc = self->begin(self->h, s.seq, known ? self->tokens : NULL, (size_t)known,
                                extra, (size_t)v[0], (size_t)v[1], (size_t)v[3], &info);
    if (rc != KVS_STATUS_OK) {
        out = Py_BuildValue("(inON)", (int)rc, (Py_ssize_t)0, Py_None, avail_out(avail));
        goto done;
    }
    if (set_n(args[0], known) < 0)
        goto done;
    s.n = known;
    if (refresh(self, &s, &avail, NULL) < 0)
        goto done;
    /* The block objects from position ``first`` on, from the rows refresh read into buf. */
    Py_ssize_t np = PyList_GET_SIZE(PyList_GET_ITEM(s.tables, 0)), first = v[2];
    if (first > np)
        first = np;
    PyObject *rows = PyTuple_New(self->ng);
    if (!rows)
        goto done;
    for (Py_ssize_t g = 0; g < self->ng; g++) {
        PyObject *row = PyList_New(np - first);
        if (!row) {
            Py_DECREF(rows);
            goto done;
        }
        PyTuple_SET_ITEM(rows, g, row);
        for (Py_ssize_t i = first; i < np; i++) {
            uint32_t p = self->buf[(size_t)g * self->max_pages + (size_t)i];
            PyList_SET_ITEM(row, i - first,
                            Py_NewRef(PyList_GET_ITEM(self->blocks, (Py_ssize_t)p)));
        }
    }
    out = Py_BuildValue("(inNN)", 0, (Py_ssize_t)info.matched_tokens, rows, avail_out(avail));
done:
    Py_DECREF(s.tables);
    return out;
}

static PyObject *groups_free_impl(Groups *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "free(st, avail) takes 2 arguments");
        return NULL;
    }
    Py_ssize_t avail;
    if (avail_in(args[1], &avail) < 0)
        return NULL;
    State s;
    if (state_read(self, args[0], &s) < 0)
        return NULL;
    PyObject *out = NULL;
    kvs_status rc = self->free_seq(self->h, s.seq);
    if (rc != KVS_STATUS_OK) {
        out = Py_BuildValue("(iN)", (int)rc, avail_out(avail));
        goto done;
    }
    for (Py_ssize_t g = 0; g < self->ng; g++) {
        PyObject *t = PyList_GET_ITEM(s.tables, g);
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(t); i++) {
            uint32_t p;
            if (page_at(t, i, &p) < 0 || ref_add(self, p, -1, &avail) < 0)
                goto done;
        }
    }
    out = Py_BuildValue("(iN)", 0, avail_out(avail));
done:
    Py_DECREF(s.tables);
    return out;
}

static PyObject *groups_match_impl(Groups *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "match(ids, extra_addr, max_tokens) takes 3 arguments");
        return NULL;
    }
    PyObject *ids = args[0];
    if (!PyList_Check(ids) && !PyTuple_Check(ids)) {
        PyErr_SetString(PyExc_TypeError, "Groups: token ids must be a list or tuple");
        return NULL;
    }
    const kvs_extra_keys *extra;
    if (extra_ptr(args[1], &extra) < 0)
        return NULL;
    Py_ssize_t max_tokens;
    if (counts(args + 2, 1, &max_tokens, "match") < 0)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(ids);
    if (pack(self, ids, 0, n) < 0)
        return NULL;
    size_t per = (size_t)n / (size_t)self->bs, matched = 0;
    if (per > self->max_pages)
        per = self->max_pages;
    kvs_status rc = self->match(self->h, n ? self->tokens : NULL, (size_t)n,
                                extra, (size_t)max_tokens,
                                self->buf, per * (size_t)self->ng, per, &matched);
    if (rc != KVS_STATUS_OK)
        return Py_BuildValue("(inO)", (int)rc, (Py_ssize_t)0, Py_None);
    Py_ssize_t k = (Py_ssize_t)(matched / (size_t)self->bs);
    PyObject *rows = PyTuple_New(self->ng);
    if (!rows)
        return NULL;
    for (Py_ssize_t g = 0; g < self->ng; g++) {
        PyObject *row = PyList_New(k);
        if (!row) {
            Py_DECREF(rows);
            return NULL;
        }
        PyTuple_SET_ITEM(rows, g, row);
        for (Py_ssize_t i = 0; i < k; i++) {
            uint32_t p = self->buf[(size_t)g * per + (size_t)i];
            if ((Py_ssize_t)p >= PyList_GET_SIZE(self->blocks)) {
                Py_DECREF(rows);
                return PyErr_Format(PyExc_IndexError, "page %u has no block object", p);
            }
            PyList_SET_ITEM(row, i, Py_NewRef(PyList_GET_ITEM(self->blocks, (Py_ssize_t)p)));
        }
    }
    return Py_BuildValue("(inN)", 0, (Py_ssize_t)matched, rows);
}

/* Every method with the buffers held: Python code one runs (``__index__``, attribute hooks)
 * cannot re-enter this object. */
static PyObject *groups_guarded(Groups *self, PyObject *const *args, Py_ssize_t nargs,
                         PyObject *(*impl)(Groups *, PyObject *const *, Py_ssize_t)) {
    if (!self->buf || !self->refs_held || !self->blocks) {
        PyErr_SetString(PyExc_RuntimeError, "Groups: not initialised");
        return NULL;
    }
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "Groups: call re-entered");
        return NULL;
    }
    self->busy = 1;
    PyObject *r = impl(self, args, nargs);
    self->busy = 0;
    return r;
}

#define METHOD(name)                                                                       \
    static PyObject *Groups_##name(Groups *self, PyObject *const *args, Py_ssize_t nargs) { \
        return groups_guarded(self, args, nargs, groups_##name##_impl);                    \
    }
METHOD(running)
METHOD(append)
METHOD(release)
METHOD(begin)
METHOD(free)
METHOD(match)

static PyMethodDef Groups_methods[] = {
    {"running", (PyCFunction)(void (*)(void))Groups_running, METH_FASTCALL,
     "running(st, ids, release_at, need_slot, known, avail) -> (room, rc, appended, added, "
     "avail)"},
    {"append", (PyCFunction)(void (*)(void))Groups_append, METH_FASTCALL,
     "append(st, ids, known, lookahead, avail) -> (rc, added, avail)"},
    {"release", (PyCFunction)(void (*)(void))Groups_release, METH_FASTCALL,
     "release(st, num_computed, avail) -> (released, avail)"},
    {"begin", (PyCFunction)(void (*)(void))Groups_begin, METH_FASTCALL,
     "begin(st, ids, known, extra_addr, max_match, lookahead, first, computed, avail) -> (rc, "
     "matched, rows, avail)"},
    {"free", (PyCFunction)(void (*)(void))Groups_free, METH_FASTCALL,
     "free(st, avail) -> (rc, avail)"},
    {"match", (PyCFunction)(void (*)(void))Groups_match, METH_FASTCALL,
     "match(ids, extra_addr, max_tokens) -> (rc, hit tokens, block objects per group)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject GroupsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvshare_vllm._fast.Groups",
    .tp_basicsize = sizeof(Groups),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)Groups_traverse,
    .tp_clear = (inquiry)Groups_clear,
    .tp_doc = "the manager's native calls with their request-state and mirror updates",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Groups_init,
    .tp_dealloc = (destructor)Groups_dealloc,
    .tp_methods = Groups_methods,
};

PyTypeObject *kvshare_fast_groups_ready(void) {
    if (PyType_Ready(&GroupsType) < 0)
        return NULL;
    s_n = PyUnicode_InternFromString("n");
    s_seq = PyUnicode_InternFromString("seq");
    s_tables = PyUnicode_InternFromString("tables");
    zero = PyLong_FromLong(0);
    if (!s_n || !s_seq || !s_tables || !zero)
        return NULL;
    return &GroupsType;
}
