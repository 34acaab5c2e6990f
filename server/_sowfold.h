/* The historical SOW fold's shared layout (server/_sowfold.c builds the table, _sowfold_order.c
 * reads it in key order; their module comment is at the top of _sowfold.c).
 */
#ifndef TICKERTAPE_SOWFOLD_H
#define TICKERTAPE_SOWFOLD_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "../journal/_record.h"

#define KIND_SOW_DELETE 3

/* An entry keeps its key's first KB bytes (zero past the key) beside the pointers: the probes,
   the sort and the merge compare those without reading the blocks (a cache miss each, the
   keys lie spread over the journal read); only keys equal over them are compared there. */
#define KB 16

typedef struct {
    const unsigned char *key; /* the key's bytes inside the fragment, in a held block */
    const unsigned char *rec; /* the record, in a held block */
    long long pos;            /* its journal position */
    unsigned char kb[KB];     /* the key's first bytes, zero past its end */
    uint32_t klen;
    uint32_t target;          /* index into the table's targets */
} Entry;

typedef struct {
    PyObject_HEAD
    Entry *slots;       /* open addressing, linear probing; rec == NULL: empty */
    Py_ssize_t cap, n;  /* cap a power of two, n < cap / 2 */
    PyObject **targets; /* (prefix, dict) tuples, owned */
    Py_ssize_t ntargets;
    Py_buffer *blocks;  /* held blocks */
    Py_ssize_t nblocks, blocks_cap, held;
    int sorted;         /* sort() made a FoldOrder of it: its entries and blocks stay as they are */
} FoldTable;

/* sort(): a FoldOrder of the table (it keeps the table); raises when there are more than
   65,535 topics. */
PyObject *fold_order_new(FoldTable *t);
extern PyTypeObject FoldOrderType;

static inline uint64_t
key_hash(const unsigned char *p, Py_ssize_t n, uint32_t target)
{
    uint64_t h = 1469598103934665603ULL ^ target; /* FNV-1a, then a final mix */
    for (Py_ssize_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 1099511628211ULL;
    }
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 32;
    return h;
}

/* An entry's key against the key `k` of kl bytes, in bytes order; `kb`: k's first KB bytes
   (zero past it; or k itself: only the bytes of both keys are compared). */
static inline int
entry_key_cmp(const Entry *e, const unsigned char *kb, const unsigned char *k, Py_ssize_t kl)
{
    Py_ssize_t el = (Py_ssize_t)e->klen, n = el < kl ? el : kl;
    int c = memcmp(e->kb, kb, (size_t)(n < KB ? n : KB));
    if (c || n <= KB)
        return c ? c : (el > kl) - (el < kl);
    c = memcmp(e->key + KB, k + KB, (size_t)(n - KB));
    return c ? c : (el > kl) - (el < kl);
}

/* A key's first KB bytes, zero past its end. */
static inline void
key_kb(unsigned char *kb, const unsigned char *k, Py_ssize_t kl)
{
    memset(kb, 0, KB);
    memcpy(kb, k, (size_t)(kl < KB ? kl : KB));
}

static inline int
key_cmp(PyObject *x, PyObject *y)
{
    Py_ssize_t nx = PyBytes_GET_SIZE(x), ny = PyBytes_GET_SIZE(y);
    int c = memcmp(PyBytes_AS_STRING(x), PyBytes_AS_STRING(y), (size_t)(nx < ny ? nx : ny));
    return c ? c : (nx > ny) - (nx < ny);
}

/* The (bytes key, value) pair at index i of a list, checked. */
static inline PyObject *
pair_key(PyObject *list, Py_ssize_t i)
{
    PyObject *p = PyList_GET_ITEM(list, i);
    if (!PyTuple_Check(p) || PyTuple_GET_SIZE(p) != 2 || !PyBytes_Check(PyTuple_GET_ITEM(p, 0))) {
        PyErr_SetString(PyExc_TypeError, "merge_rows: items must be (bytes, value) pairs");
        return NULL;
    }
    return PyTuple_GET_ITEM(p, 0);
}

/* The record key (prefix + key) and store value of an entry. */
static inline int
entry_objects(FoldTable *t, const Entry *e, PyObject **key, PyObject **value)
{
    PyObject *prefix = PyTuple_GET_ITEM(t->targets[e->target], 0);
    Py_ssize_t pl = PyBytes_GET_SIZE(prefix);
    RecordFields f = {0};
    /* whole and good: fold walked it in a block the table holds */
    record_next(e->rec, PY_SSIZE_T_MAX, &f);
    Py_ssize_t hl = f.hlen, bl = f.total - (f.topic + f.tlen);
    *key = PyBytes_FromStringAndSize(NULL, pl + (Py_ssize_t)e->klen);
    *value = PyBytes_FromStringAndSize(NULL, 34 + hl + bl);
    if (*key == NULL || *value == NULL) {
        Py_CLEAR(*key);
        Py_CLEAR(*value);
        return -1;
    }
    memcpy(PyBytes_AS_STRING(*key), PyBytes_AS_STRING(prefix), (size_t)pl);
    memcpy(PyBytes_AS_STRING(*key) + pl, e->key, e->klen);
    unsigned char *v = (unsigned char *)PyBytes_AS_STRING(*value);
    uint64_t fields[4] = {(uint64_t)e->pos, f.pub, f.seq, f.ts};
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 8; j++)
            v[8 * i + j] = (unsigned char)(fields[i] >> (56 - 8 * j));
    v[32] = (unsigned char)(hl >> 8);
    v[33] = (unsigned char)hl;
    memcpy(v + 34, e->rec + f.hdr, (size_t)hl);
    memcpy(v + 34 + hl, e->rec + f.topic + f.tlen, (size_t)bl);
    return 0;
}

#endif
