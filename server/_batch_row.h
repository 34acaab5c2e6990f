/* The batch row built in C: the fields of server/batch_row.py's BatchRow, made as a plain
 * tuple (BatchTuple; the module says why not the NamedTuple itself). server/_publish.c and
 * server/_replicate.c get BatchRow from their configure() (called by server/publish_scan.py and
 * server/replicate_scan.py at import) and check its fields against the ones they fill: a field
 * added to BatchRow without teaching the C stops the import, rather than rows that come out one
 * field short. Until configure() has accepted it, no row is made.
 */
#ifndef TICKERTAPE_BATCH_ROW_H
#define TICKERTAPE_BATCH_ROW_H

#include <Python.h>

#define BATCH_ROW_FIELDS 8
static const char *const BATCH_ROW_NAMES[BATCH_ROW_FIELDS] = {
    "topic", "pub", "seq", "ts", "body", "offset", "hdr", "exp",
};

static int batch_row_checked = 0; /* configure() accepted server/batch_row.py's BatchRow */

/* 0 when `type` is a tuple subclass whose _fields are BATCH_ROW_NAMES, in order; else -1 with
   an exception saying what to change (`who`: the C file). */
static int batch_row_check(PyObject *type, const char *who) {
    if (!PyType_Check(type) || !PyType_IsSubtype((PyTypeObject *)type, &PyTuple_Type)) {
        PyErr_Format(PyExc_TypeError, "%s: the batch row type must be a NamedTuple", who);
        return -1;
    }
    PyObject *fields = PyObject_GetAttrString(type, "_fields");
    if (fields == NULL)
        return -1;
    int same = PyTuple_Check(fields) && PyTuple_GET_SIZE(fields) == BATCH_ROW_FIELDS;
    for (Py_ssize_t i = 0; same && i < BATCH_ROW_FIELDS; i++) {
        PyObject *name = PyTuple_GET_ITEM(fields, i);
        same = PyUnicode_Check(name) &&
               PyUnicode_CompareWithASCIIString(name, BATCH_ROW_NAMES[i]) == 0;
    }
    if (!same) {
        PyErr_Format(PyExc_ValueError,
                     "%s fills the batch row fields (topic, pub, seq, ts, body, offset, hdr, exp); "
                     "server/batch_row.py's BatchRow has %R: teach the C the new fields",
                     who, fields);
        Py_DECREF(fields);
        return -1;
    }
    Py_DECREF(fields);
    batch_row_checked = 1;
    return 0;
}

/* A new row (a plain tuple) of the eight values, in BATCH_ROW_NAMES' order; NULL with an
   exception before configure() accepted the row type, or when memory runs out. */
static inline PyObject *batch_row(PyObject *const v[BATCH_ROW_FIELDS]) {
    if (!batch_row_checked) {
        PyErr_SetString(PyExc_RuntimeError,
                        "configure() was not given server/batch_row.py's BatchRow");
        return NULL;
    }
    PyObject *row = PyTuple_New(BATCH_ROW_FIELDS);
    if (row == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < BATCH_ROW_FIELDS; i++) {
        Py_INCREF(v[i]);
        PyTuple_SET_ITEM(row, i, v[i]);
    }
    return row;
}

#endif
