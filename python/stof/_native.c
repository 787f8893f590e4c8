/* _native: the launch calls (stof_mha_run, stof_layer_run) from Python
 * without ctypes' argument conversion, for the per-call host time of a
 * cached plan (issue 21). It knows nothing of stof.h: _lib hands it the
 * functions' addresses from the loaded library, and every argument is a
 * pointer given as an int (or None for NULL). The package works without it
 * (ctypes then makes the same calls).
 *
 *   call(fn, a0, ..., a5[, a6]) -> int: fn(a0, ..., a5[, a6]), a stof_status
 *   decode_run(fn, p0, ..., p5, i0, i1, p6) -> int: stof_decode_run's form
 *     (six pointers, two ints, a pointer)
 *   varlen_run(fn, p0, ..., p6, i0, l0, l1, p7) -> int: stof_mha_run_varlen's
 *     (seven pointers, an int, two long longs, a pointer)
 *
 * Built against the stable ABI (one binary for CPython 3.8 and later). */
#define Py_LIMITED_API 0x03080000
#include <Python.h>

typedef int (*call6_fn)(void *, void *, void *, void *, void *, void *);
typedef int (*call7_fn)(void *, void *, void *, void *, void *, void *, void *);

/* Argument i of args as a pointer (None: NULL), an int or a long long:
 * 0 with a Python error set where it is none of them. */
static int arg_ptr(PyObject *args, Py_ssize_t i, void **out)
{
    PyObject *o = PyTuple_GetItem(args, i);
    *out = o == Py_None ? NULL : PyLong_AsVoidPtr(o);
    return !PyErr_Occurred();
}

static int arg_ll(PyObject *args, Py_ssize_t i, long long *out)
{
    *out = PyLong_AsLongLong(PyTuple_GetItem(args, i));
    return !PyErr_Occurred();
}

static int arg_int(PyObject *args, Py_ssize_t i, int *out)
{
    long long x;
    if (!arg_ll(args, i, &x))
        return 0;
    if (x < -2147483647LL - 1 || x > 2147483647LL) {
        PyErr_SetString(PyExc_OverflowError, "an int argument is out of int's range");
        return 0;
    }
    *out = (int)x;
    return 1;
}

static PyObject *call(PyObject *self, PyObject *args)
{
    (void)self;
    const Py_ssize_t n = PyTuple_Size(args);
    if (n != 7 && n != 8) {
        PyErr_SetString(PyExc_TypeError, "call(fn, six or seven pointer arguments)");
        return NULL;
    }
    void *p[8];
    for (Py_ssize_t i = 0; i < n; i++)
        if (!arg_ptr(args, i, &p[i]))
            return NULL;
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

/* fn and the pointer arguments at the positions of `ptrs` (a count of
 * them), for the typed forms below; 0 with an error set. */
static int fn_and_ptrs(PyObject *args, Py_ssize_t want, const char *form, void **p,
                       const int *ptrs, int nptrs)
{
    if (PyTuple_Size(args) != want) {
        PyErr_SetString(PyExc_TypeError, form);
        return 0;
    }
    for (int i = 0; i < nptrs; i++)
        if (!arg_ptr(args, ptrs[i], &p[i]))
            return 0;
    if (!p[0]) {
        PyErr_SetString(PyExc_ValueError, "fn is NULL");
        return 0;
    }
    return 1;
}

typedef int (*decode_fn)(void *, void *, void *, void *, void *, void *, int, int, void *);

static PyObject *decode_run(PyObject *self, PyObject *args)
{
    (void)self;
    static const int at[] = {0, 1, 2, 3, 4, 5, 6, 9};
    void *p[8];
    int batch, cap;
    if (!fn_and_ptrs(args, 10, "decode_run(fn, six pointers, two ints, a pointer)", p, at, 8) ||
        !arg_int(args, 7, &batch) || !arg_int(args, 8, &cap))
        return NULL;
    int st;
    Py_BEGIN_ALLOW_THREADS
    st = ((decode_fn)p[0])(p[1], p[2], p[3], p[4], p[5], p[6], batch, cap, p[7]);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(st);
}

typedef int (*varlen_fn)(void *, void *, void *, void *, void *, void *, void *, int, long long,
                         long long, void *);

static PyObject *varlen_run(PyObject *self, PyObject *args)
{
    (void)self;
    static const int at[] = {0, 1, 2, 3, 4, 5, 6, 7, 11};
    void *p[9];
    int n;
    long long tq, tk;
    if (!fn_and_ptrs(args, 12, "varlen_run(fn, seven pointers, an int, two long longs, a "
                               "pointer)", p, at, 9) ||
        !arg_int(args, 8, &n) || !arg_ll(args, 9, &tq) || !arg_ll(args, 10, &tk))
        return NULL;
    int st;
    Py_BEGIN_ALLOW_THREADS
    st = ((varlen_fn)p[0])(p[1], p[2], p[3], p[4], p[5], p[6], p[7], n, tq, tk, p[8]);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(st);
}

static PyMethodDef methods[] = {
    {"call", call, METH_VARARGS, "call(fn, a0, ..., a5[, a6]) -> fn's int result"},
    {"decode_run", decode_run, METH_VARARGS,
     "decode_run(fn, p0, ..., p5, i0, i1, p6) -> fn's int result"},
    {"varlen_run", varlen_run, METH_VARARGS,
     "varlen_run(fn, p0, ..., p6, i0, l0, l1, p7) -> fn's int result"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "stof._native", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__native(void)
{
    return PyModule_Create(&module);
}
