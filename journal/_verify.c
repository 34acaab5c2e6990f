/* Record checks on read: the C twin of verified_prefix_py / resync_py in journal/record.py.
 *
 * verified_prefix(buf) -> (stop, bad)
 *     Walks the whole records at the start of buf (journal/record.py's layout) and checks each:
 *     a length that holds its own header, topic and optional fields, a known kind, and the
 *     crc32 (zlib's) of every byte after the crc field. stop is the offset after the last good
 *     record; bad is stop when the record there is damaged, -1 when the walk ended at the end
 *     of buf or at a record that runs past it (a caller reads more, or it is a damaged length).
 *
 * resync(buf, start) -> offset or -1
 *     The first offset at or after start where a whole, good record lies in buf (the scan that
 *     finds the next record after damage).
 *
 * Why C: every replayed and delivered record is checked; a Python loop per record would cost
 * replay most of its speed; the crc32 of a short record is the cost (see record_crc).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#define RECORD_CRC
#include "_record.h"

/* 1: good record of `total` bytes at p; 0: damaged; -1: runs past `avail` (need more bytes).
   A length too short for its own topic, a kind or a flag this format does not have is damage
   even when the record runs past `avail` (a damaged length reads as a long record). */
static int check(const unsigned char *p, Py_ssize_t avail, Py_ssize_t *total) {
    if (avail < RECORD_HEADER)
        return -1;
    uint32_t length = rd32(p);
    unsigned kind = p[8], flags = p[9];
    if (length < RECORD_HEADER - 4 + (uint32_t)rd16(p + 10) || (kind < 1 || kind > 3) ||
        (flags & ~KNOWN_FLAGS))
        return 0;
    RecordFields r;
    int got = record_next(p, avail, &r);
    if (got != RECORD_WHOLE)
        return got == RECORD_SHORT ? -1 : 0;
    if (record_crc(p + 8, r.total - 8) != rd32(p + 4))
        return 0;
    *total = r.total;
    return 1;
}

static PyObject *verified_prefix(PyObject *self, PyObject *args) {
    Py_buffer buf;
    if (!PyArg_ParseTuple(args, "y*", &buf))
        return NULL;
    const unsigned char *b = buf.buf;
    Py_ssize_t n = buf.len, pos = 0, bad = -1, total = 0;
    Py_BEGIN_ALLOW_THREADS
    while (pos < n) {
        int r = check(b + pos, n - pos, &total);
        if (r == 1) {
            pos += total;
            continue;
        }
        if (r == 0)
            bad = pos;
        break;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    return Py_BuildValue("(nn)", pos, bad);
}

static PyObject *resync(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "y*n", &buf, &start))
        return NULL;
    const unsigned char *b = buf.buf;
    Py_ssize_t n = buf.len, found = -1, total = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t pos = start < 0 ? 0 : start; pos + RECORD_HEADER <= n; pos++) {
        if (check(b + pos, n - pos, &total) == 1) {
            found = pos;
            break;
        }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    return PyLong_FromSsize_t(found);
}

static PyMethodDef methods[] = {
    {"verified_prefix", verified_prefix, METH_VARARGS,
     "verified_prefix(buf) -> (stop, bad); see journal/record.py"},
    {"resync", resync, METH_VARARGS, "resync(buf, start) -> offset or -1; see journal/record.py"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "journal._verify", "Journal record checks on read (C).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__verify(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddStringConstant(m, "CRC", CRC_IMPL) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
