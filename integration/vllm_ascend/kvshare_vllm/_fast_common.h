/* Argument parsing of the vLLM adapter's native module (``_fast.c``: the module and
 * ``pack_i32``; ``_fast_groups.c``: ``Groups``, the manager's calls):
 * token ids packed from Python ints to int32, with the checks ``kvshare.pack_i32`` makes, count
 * arguments read as non-negative Py_ssize_t, and the extra-keys address read as a pointer; and
 * the one call between the two sources (``kvshare_fast_groups_ready``). */
#ifndef KVSHARE_VLLM_FAST_COMMON_H
#define KVSHARE_VLLM_FAST_COMMON_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "kvshare.h"

/* The value of an exact int that fits one digit (every token id), read in place: 1 and
 * ``*v`` set, else 0 (the caller takes the general path). */
static inline int compact_long(PyObject *o, long *v) {
    if (!PyLong_CheckExact(o))
        return 0;
#if PY_VERSION_HEX >= 0x030C0000
    if (!PyUnstable_Long_IsCompact((PyLongObject *)o))
        return 0;
    *v = (long)PyUnstable_Long_CompactValue((PyLongObject *)o);
#else
    Py_ssize_t size = Py_SIZE(o);
    if (size < -1 || size > 1)
        return 0;
    *v = (long)size * (long)((PyLongObject *)o)->ob_digit[0];
#endif
    return 1;
}

/* Items read ahead of the conversion: a prompt's int objects lie scattered in memory and are
 * usually cold when the scheduler runs (the model step in between evicted them), so their
 * loads are started this far ahead to overlap instead of following one another. */
#define PREFETCH_AHEAD 64
#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(p) __builtin_prefetch(p)
#else
#define PREFETCH(p) ((void)(p))
#endif

/* Converts items ``start..start+n`` of the list or tuple ``ids`` to int32 (OverflowError /
 * TypeError as ``kvshare.pack_i32`` raises them); 0 on success.  An item that is not an int
 * goes through ``__index__``, which may run Python code: the item is held and the size
 * re-checked, so a list changed meanwhile is an error, never a stale read. */
static inline int to_i32(PyObject *ids, Py_ssize_t start, Py_ssize_t n, int32_t *out) {
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t size = PySequence_Fast_GET_SIZE(ids);
        if (start + i >= size) {
            PyErr_SetString(PyExc_RuntimeError, "token id list changed size while packed");
            return -1;
        }
        if (i + PREFETCH_AHEAD < n && start + i + PREFETCH_AHEAD < size)
            PREFETCH(PySequence_Fast_GET_ITEM(ids, start + i + PREFETCH_AHEAD));
        PyObject *item = PySequence_Fast_GET_ITEM(ids, start + i);
        long v;
        if (compact_long(item, &v)) {
            /* in range of long; int32 checked below */
        } else if (PyLong_Check(item)) {
            v = PyLong_AsLong(item);
        } else {
            Py_INCREF(item);
            PyObject *idx = PyNumber_Index(item);
            Py_DECREF(item);
            if (!idx)
                return -1;
            v = PyLong_AsLong(idx);
            Py_DECREF(idx);
        }
        if (v == -1 && PyErr_Occurred())
            return -1;
        if (v < INT32_MIN || v > INT32_MAX) {
            PyErr_Format(PyExc_OverflowError, "token id %ld does not fit in int32", v);
            return -1;
        }
        out[i] = (int32_t)v;
    }
    return 0;
}

/* ``args[0..n]`` as non-negative Py_ssize_t counts into ``out`` (-1 with an exception set: an
 * OverflowError, or ValueError "<what>: negative count"). */
static inline int counts(PyObject *const *args, int n, Py_ssize_t *out, const char *what) {
    for (int i = 0; i < n; i++) {
        out[i] = PyLong_AsSsize_t(args[i]);
        if (out[i] == -1 && PyErr_Occurred())
            return -1;
        if (out[i] < 0) {
            PyErr_Format(PyExc_ValueError, "%s: negative count", what);
            return -1;
        }
    }
    return 0;
}

/* ``extra_addr`` (an int: a ``kvs_extra_keys *``, 0 for none) as a pointer; -1 with an
 * exception set (OverflowError for a negative or too large int, TypeError for a non-int). */
static inline int extra_ptr(PyObject *addr, const kvs_extra_keys **out) {
    unsigned long long v = PyLong_AsUnsignedLongLong(addr);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    *out = (const kvs_extra_keys *)(uintptr_t)v;
    return 0;
}

/* _fast_groups.c: readies the ``Groups`` type and the constants its methods use; the type, or
 * NULL with an exception set (called once, by ``PyInit__fast``). */
PyTypeObject *kvshare_fast_groups_ready(void);

#endif
