/* The batch row built in C: server/batch_row.py's BatchRow, a NamedTuple defined once in
 * Python. server/_publish.c and server/_replicate.c get the type from their configure() (called
 * by server/publish_scan.py and server/replicate_scan.py at import) and make its instances the
 * way tuple.__new__ does, without a Python call per row.
 *
 * The fields are named here too, and configure() refuses a type whose _fields differ: a field
 * added to BatchRow without teaching the C to fill it stops the import, rather than rows that
 * come out one field short.
 */
#ifndef TICKERTAPE_BATCH_ROW_H
#define TICKERTAPE_BATCH_ROW_H

#include <Python.h>
#include <string.h>

#define BATCH_ROW_FIELDS 8
static const char *const BATCH_ROW_NAMES[BATCH_ROW_FIELDS] = {
    "topic", "pub", "seq", "ts", "body", "offset", "hdr", "exp",
};

/* `type` (a new reference) when it is a tuple subclass whose _fields are BATCH_ROW_NAMES, in
   order; else NULL with ValueError saying what to change (`who`: the C file). */
static PyTypeObject *batch_row_type(PyObject *type, const char *who) {
    if (!PyType_Check(type) || !PyType_IsSubtype((PyTypeObject *)type, &PyTuple_Type)) {
        PyErr_Format(PyExc_TypeError, "%s: the batch row type must be a NamedTuple", who);
        return NULL;
    }
    PyObject *fields = PyObject_GetAttrString(type, "_fields");
    if (fields == NULL)
        return NULL;
    int same = PyTuple_Check(fields) && PyTuple_GET_SIZE(fields) == BATCH_ROW_FIELDS;
    for (Py_ssize_t i = 0; same && i < BATCH_ROW_FIELDS; i++) {
        PyObject *name = PyTuple_GET_ITEM(fields, i);
        same = PyUnicode_Check(name) && PyUnicode_CompareWithASCIIString(name, BATCH_ROW_NAMES[i]) == 0;
    }
    if (!same) {
        PyErr_Format(PyExc_ValueError,
                     "%s fills the batch row fields (topic, pub, seq, ts, body, offset, hdr, exp); "
                     "server/batch_row.py's BatchRow has %R: teach the C the new fields",
                     who, fields);
        Py_DECREF(fields);
        return NULL;
    }
    Py_DECREF(fields);
    Py_INCREF(type);
    return (PyTypeObject *)type;
}

/* A new row of type t (from batch_row_type) holding new references to the eight values; NULL
   with an exception when t is NULL (not configured) or memory runs out. */
static inline PyObject *batch_row(PyTypeObject *t, PyObject *const v[BATCH_ROW_FIELDS]) {
    if (t == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "configure() was not called with the batch row type");
        return NULL;
    }
    PyObject *row = t->tp_alloc(t, BATCH_ROW_FIELDS);
    if (row == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < BATCH_ROW_FIELDS; i++) {
        Py_INCREF(v[i]);
        PyTuple_SET_ITEM(row, i, v[i]);
    }
    return row;
}

#endif
