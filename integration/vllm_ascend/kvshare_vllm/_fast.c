/* kvshare_vllm._fast: the adapter's native calls compiled with the Python work around them, for
 * the scheduler's hot path.  The plugin requires this module (startup.py refuses to run without
 * it).
 *
 * ``Groups``: the manager's page hand-over for a cache of one or many KV-cache groups
 * (manager.py), in ``_fast_groups.c``, compiled into this module.  ``pack_i32``: token ids
 * packed for the binding.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvshare.h"
#include "_fast_common.h"

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
    PyTypeObject *groups = kvshare_fast_groups_ready();
    if (!groups)
        return NULL;
    PyObject *m = PyModule_Create(&fastmodule);
    if (!m)
        return NULL;
    Py_INCREF(groups);
    if (PyModule_AddObject(m, "Groups", (PyObject *)groups) < 0) {
        Py_DECREF(groups);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
