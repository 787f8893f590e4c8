/* _native: the launch calls (stof_mha_run, stof_layer_run) from Python
 * without ctypes' argument conversion, for the per-call host time of a
 * cached plan (issue 21). It knows nothing of stof.h: _lib hands it the
 * functions' addresses from the loaded library, and every argument is a
 * pointer given as an int (or None for NULL). The package works without it
 * (ctypes then makes the same calls).
 *
 *   call(fn, a0, ..., a5[, a6]) -> int: fn(a0, ..., a5[, a6]), a stof_status
 *
 * Built against the stable ABI (one binary for CPython 3.8 and later). */
#define Py_LIMITED_API 0x03080000
#include <Python.h>

typedef int (*call6_fn)(void *, void *, void *, void *, void *, void *);
typedef int (*call7_fn)(void *, void *, void *, void *, void *, void *, void *);

static PyObject *call(PyObject *self, PyObject *args)
{
    (void)self;
    const Py_ssize_t n = PyTuple_Size(args);
    if (n != 7 && n != 8) {
        PyErr_SetString(PyExc_TypeError, "call(fn, six or seven pointer arguments)");
        return NULL;
    }
    void *p[8];
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = PyTuple_GetItem(args, i);
        p[i] = o == Py_None ? NULL : PyLong_AsVoidPtr(o);
        if (PyErr_Occurred())
            return NULL;
    }
    if (!p[0]) {
        PyErr_SetString(PyExc_ValueError, "call: fn is NULL");
        return NULL;
    }
    int st;
    /* Launches wait for nothing, but a context's first launch may load a
     * module: other Python threads run meanwhile. */
    Py_BEGIN_ALLOW_THREADS
    if (n == 7)
        st = ((call6_fn)p[0])(p[1], p[2], p[3], p[4], p[5], p[6]);
    else
        st = ((call7_fn)p[0])(p[1], p[2], p[3], p[4], p[5], p[6], p[7]);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(st);
}

static PyMethodDef methods[] = {
    {"call", call, METH_VARARGS, "call(fn, a0, ..., a5[, a6]) -> fn's int result"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "stof._native", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__native(void)
{
    return PyModule_Create(&module);
}
