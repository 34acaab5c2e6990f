/* A FoldTable read in record key order (FoldOrder, made by FoldTable.sort(); the module comment
 * is at the top of server/_sowfold.c): sort, seek, merge, rest, get.
 */
#include "_sowfold.h"

/* sort()'s array: a copy of each entry, with its topic's rank (the answer reads the table in
   key order, and the entries sit in hash order, a cache miss each; this array is read in
   order). */
typedef struct {
    Entry e;
    uint16_t rank; /* the order of its target's prefix among the targets' */
} Sorted;

typedef struct {
    PyObject_HEAD
    FoldTable *table;     /* owned: its targets, and the blocks its entries point into */
    Sorted *order;        /* every entry in record key order */
    Py_ssize_t norder;
    Py_ssize_t cur, stop; /* seek(): the entries of one target left to merge, [cur, stop) */
    PyObject *cur_prefix; /* that target's prefix (borrowed from its tuple) */
} FoldOrder;

static int
sorted_cmp(const void *a, const void *b)
{
    const Sorted *x = a, *y = b;
    if (x->rank != y->rank)
        return x->rank < y->rank ? -1 : 1;
    return entry_key_cmp(&x->e, y->e.kb, y->e.key, y->e.klen);
}

/* The first 8 key bytes as a number (kb is zero past the key): the radix sort's digits. */
static inline uint64_t
key8(const Entry *e)
{
    uint64_t v;
    memcpy(&v, e->kb, 8);
    return __builtin_bswap64(v);
}

/* What the radix passes move: 16 bytes, not the 64 of a Sorted (the passes are memory bound). */
typedef struct {
    uint64_t k8;   /* key8_of the key */
    uint32_t slot; /* the entry's slot in the table */
    uint16_t rank;
} Ix;

static inline unsigned
ix_digit(const Ix *x, int which)
{
    return which < 8 ? (unsigned)(x->k8 >> (8 * which)) & 0xFF
                     : (unsigned)(x->rank >> (8 * (which - 8))) & 0xFF;
}

/* Sort by (rank, key): LSD radix passes over the first 8 key bytes and the rank (stable, so
   their order is (rank, key8); every digit counted in one read, a digit the same in every
   element skipped), then each run equal there sorted by sorted_cmp. A qsort of 100,000
   entries was most of a historical query's wait before its answer. */
static int
radix_sort(Ix *a, Py_ssize_t n)
{
    Ix *tmp = PyMem_Malloc(sizeof(Ix) * (size_t)(n ? n : 1));
    Py_ssize_t(*count)[256] = PyMem_Calloc(10, sizeof(*count));
    if (tmp == NULL || count == NULL) {
        PyMem_Free(tmp);
        PyMem_Free(count);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        for (int w = 0; w < 10; w++)
            count[w][ix_digit(&a[i], w)]++;
    Ix *from = a, *to = tmp;
    for (int w = 0; w < 10; w++) {
        Py_ssize_t at = 0, *c = count[w];
        if (c[ix_digit(&a[0], w)] == n)
            continue; /* the same in every element (n > 0: a[0] is one) */
        for (int d = 0; d < 256; d++) {
            Py_ssize_t k = c[d];
            c[d] = at;
            at += k;
        }
        for (Py_ssize_t i = 0; i < n; i++)
            to[c[ix_digit(&from[i], w)]++] = from[i];
        Ix *x = from;
        from = to;
        to = x;
    }
    if (from != a)
        memcpy(a, from, sizeof(Ix) * (size_t)n);
    PyMem_Free(tmp);
    PyMem_Free(count);
    return 0;
}

PyObject *
fold_order_new(FoldTable *t)
{
    /* a target's rank: its prefix's place among the prefixes (a topic and 0x00: one prefix is
       never the start of another, so prefix order, then key order, is record key order) */
    if (t->ntargets > 0xFFFF) {
        PyErr_SetString(PyExc_ValueError, "FoldTable.sort: more than 65,535 topics");
        return NULL;
    }
    uint32_t *rank = PyMem_Calloc((size_t)(t->ntargets ? t->ntargets : 1), sizeof(uint32_t));
    Sorted *all = PyMem_Malloc(sizeof(Sorted) * (size_t)(t->n ? t->n : 1));
    if (all == NULL || rank == NULL) {
        PyMem_Free(all);
        PyMem_Free(rank);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < t->ntargets; i++)
        for (Py_ssize_t j = 0; j < t->ntargets; j++) {
            PyObject *x = PyTuple_GET_ITEM(t->targets[i], 0), *y = PyTuple_GET_ITEM(t->targets[j], 0);
            int c = PyObject_RichCompareBool(y, x, Py_LT);
            if (c < 0) {
                PyMem_Free(all);
                PyMem_Free(rank);
                return NULL;
            }
            rank[i] += (uint32_t)c;
        }
    Ix *ix = PyMem_Malloc(sizeof(Ix) * (size_t)(t->n ? t->n : 1));
    if (ix == NULL) {
        PyMem_Free(all);
        PyMem_Free(rank);
        return PyErr_NoMemory();
    }
    Py_ssize_t m = 0;
    for (Py_ssize_t i = 0; i < t->cap; i++) {
        const Entry *e = &t->slots[i];
        if (e->rec == NULL)
            continue;
        ix[m].k8 = key8(e);
        ix[m].slot = (uint32_t)i;
        ix[m++].rank = (uint16_t)rank[e->target];
    }
    PyMem_Free(rank);
    if (m && radix_sort(ix, m) < 0) {
        PyMem_Free(all);
        PyMem_Free(ix);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < m; i++) { /* the entries copied in that order */
        if (i + 8 < m)
            __builtin_prefetch(&t->slots[ix[i + 8].slot]);
        all[i].e = t->slots[ix[i].slot];
        all[i].rank = ix[i].rank;
    }
    for (Py_ssize_t i = 0; i < m;) { /* the runs equal over (rank, key8), by the whole key */
        Py_ssize_t j = i + 1;
        while (j < m && ix[j].rank == ix[i].rank && ix[j].k8 == ix[i].k8)
            j++;
        if (j - i > 1)
            qsort(all + i, (size_t)(j - i), sizeof(Sorted), sorted_cmp);
        i = j;
    }
    PyMem_Free(ix);
    FoldOrder *o = PyObject_New(FoldOrder, &FoldOrderType);
    if (o == NULL) {
        PyMem_Free(all);
        return NULL;
    }
    Py_INCREF(t);
    o->table = t;
    o->order = all;
    o->norder = m;
    o->cur = o->stop = 0;
    o->cur_prefix = NULL;
    t->sorted = 1;
    return (PyObject *)o;
}

static void
FoldOrder_dealloc(FoldOrder *o)
{
    PyMem_Free(o->order);
    Py_DECREF(o->table);
    PyObject_Free(o);
}

/* The target whose prefix starts `key` (-1: none), and the key's length past it. */
static Py_ssize_t
target_of(FoldTable *t, const char *key, Py_ssize_t n, Py_ssize_t *pl)
{
    for (Py_ssize_t i = 0; i < t->ntargets; i++) {
        PyObject *prefix = PyTuple_GET_ITEM(t->targets[i], 0);
        *pl = PyBytes_GET_SIZE(prefix);
        if (*pl <= n && memcmp(PyBytes_AS_STRING(prefix), key, (size_t)*pl) == 0)
            return i;
    }
    return -1;
}

static PyObject *
FoldOrder_seek(FoldOrder *o, PyObject *arg)
{
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "FoldOrder.seek(prefix: bytes)");
        return NULL;
    }
    FoldTable *t = o->table;
    Py_ssize_t pl, ti = target_of(t, PyBytes_AS_STRING(arg), PyBytes_GET_SIZE(arg), &pl);
    o->cur = o->stop = 0;
    o->cur_prefix = NULL;
    if (ti < 0 || pl != PyBytes_GET_SIZE(arg))
        Py_RETURN_NONE; /* nothing folded on that topic */
    Py_ssize_t i = 0;
    while (i < o->norder && o->order[i].e.target != (uint32_t)ti)
        i++;
    o->cur = i;
    while (i < o->norder && o->order[i].e.target == (uint32_t)ti)
        i++;
    o->stop = i;
    o->cur_prefix = PyTuple_GET_ITEM(t->targets[ti], 0);
    Py_RETURN_NONE;
}

/* A sorted entry's key against `k` (a record key's bytes past the prefix). */
static inline int
entry_cmp(const Sorted *o, const char *k, Py_ssize_t kl)
{
    return entry_key_cmp(&o->e, (const unsigned char *)k, (const unsigned char *)k, kl);
}

/* Entries are taken in key order, their records spread over the blocks: ask for those a few
   places ahead before they are needed. */
static inline void
prefetch_ahead(const FoldOrder *o, Py_ssize_t i)
{
    if (i + 8 < o->stop) { /* a record is a few cache lines: its header, fragment and body */
        const unsigned char *r = o->order[i + 8].e.rec;
        __builtin_prefetch(r);
        __builtin_prefetch(r + 64);
        __builtin_prefetch(r + 128);
    }
}

/* The (record key, value) pair of an entry; `key`: the chunk's equal key object, or NULL. */
static PyObject *
entry_pair(FoldTable *t, const Entry *e, PyObject *key)
{
    PyObject *k, *v;
    if (entry_objects(t, e, &k, &v) < 0)
        return NULL;
    PyObject *pair = PyTuple_Pack(2, key != NULL ? key : k, v);
    Py_DECREF(k);
    Py_DECREF(v);
    return pair;
}

/* The record key of a chunk's item c: the item itself (a keys-only chunk) or its pair's key. */
static inline PyObject *
item_key(PyObject *chunk, Py_ssize_t c, int keys_only)
{
    if (!keys_only)
        return pair_key(chunk, c);
    PyObject *k = PyList_GET_ITEM(chunk, c);
    if (!PyBytes_Check(k)) {
        PyErr_SetString(PyExc_TypeError, "FoldOrder.merge_keys: keys must be bytes");
        return NULL;
    }
    return k;
}

/* merge() and merge_keys(): the chunk's items and the entries up to its last key, in key order,
   an entry replacing the item of its key. A keys-only chunk's items that no entry replaced are
   left in `out` as their keys (bytes), counted in *kept; *taken counts the entries taken. */
static PyObject *
merge_chunk(FoldOrder *t, PyObject *chunk, int keys_only, Py_ssize_t *taken, Py_ssize_t *kept)
{
    Py_ssize_t nc = PyList_GET_SIZE(chunk), pl = PyBytes_GET_SIZE(t->cur_prefix);
    PyObject *lastk = item_key(chunk, nc - 1, keys_only);
    if (lastk == NULL)
        return NULL;
    const char *last = PyBytes_AS_STRING(lastk) + pl;
    Py_ssize_t lastn = PyBytes_GET_SIZE(lastk) - pl;
    *taken = *kept = 0;
    if (!keys_only && (lastn < 0 || entry_cmp(&t->order[t->cur], last, lastn) > 0)) {
        Py_INCREF(chunk); /* nothing folded in this chunk's range */
        return chunk;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    Py_ssize_t c = 0;
    while (c < nc) {
        PyObject *item = PyList_GET_ITEM(chunk, c), *ck = item_key(chunk, c, keys_only), *pair;
        if (ck == NULL || PyBytes_GET_SIZE(ck) < pl)
            goto fail_type;
        const Sorted *o = t->cur < t->stop ? &t->order[t->cur] : NULL;
        int cmp = o == NULL ? 1
                            : entry_cmp(o, PyBytes_AS_STRING(ck) + pl, PyBytes_GET_SIZE(ck) - pl);
        if (cmp > 0) {
            c++;
            *kept += keys_only;
            Py_INCREF(item);
            pair = item;
        } else {
            prefetch_ahead(t, t->cur++);
            (*taken)++;
            if (cmp == 0)
                c++; /* replaced */
            pair = entry_pair(t->table, &o->e, cmp == 0 ? ck : NULL);
            if (pair == NULL)
                goto fail;
        }
        int rc = PyList_Append(out, pair);
        Py_DECREF(pair);
        if (rc < 0)
            goto fail;
    }
    return out;
fail_type:
    if (!PyErr_Occurred())
        PyErr_SetString(PyExc_ValueError, "FoldOrder.merge: a chunk key outside the topic sought");
fail:
    Py_DECREF(out);
    return NULL;
}

static PyObject *
FoldOrder_merge(FoldOrder *t, PyObject *chunk)
{
    if (!PyList_Check(chunk)) {
        PyErr_SetString(PyExc_TypeError, "FoldOrder.merge(chunk: list)");
        return NULL;
    }
    Py_ssize_t taken, kept;
    if (PyList_GET_SIZE(chunk) == 0 || t->cur >= t->stop) {
        Py_INCREF(chunk);
        return chunk;
    }
    return merge_chunk(t, chunk, 0, &taken, &kept);
}

/* merge_keys(keys, fetch) -> (list, taken): merge() of a chunk read as its keys only (the
   checkpoint's values of the keys the fold replaced are never read): fetch(list of the keys
   left) is called once, when any is, and must return their (key, value) pairs in that order. */
static PyObject *
FoldOrder_merge_keys(FoldOrder *t, PyObject *args)
{
    PyObject *keys, *fetch;
    if (!PyArg_ParseTuple(args, "O!O", &PyList_Type, &keys, &fetch))
        return NULL;
    Py_ssize_t taken = 0, kept = PyList_GET_SIZE(keys), n = kept;
    PyObject *out;
    if (n == 0 || t->cur >= t->stop)
        out = PyList_GetSlice(keys, 0, n); /* nothing folded here: every value fetched */
    else
        out = merge_chunk(t, keys, 1, &taken, &kept);
    if (out == NULL)
        return NULL;
    PyObject *need = kept ? PyList_New(kept) : NULL;
    if (kept && need == NULL)
        goto fail;
    n = PyList_GET_SIZE(out);
    for (Py_ssize_t i = 0, j = 0; kept && i < n; i++) {
        PyObject *k = PyList_GET_ITEM(out, i);
        if (PyBytes_Check(k)) {
            Py_INCREF(k);
            PyList_SET_ITEM(need, j++, k);
        }
    }
    if (kept) {
        PyObject *got = PyObject_CallOneArg(fetch, need);
        Py_DECREF(need);
        if (got == NULL)
            goto fail;
        if (!PyList_Check(got) || PyList_GET_SIZE(got) != kept) {
            Py_DECREF(got);
            PyErr_SetString(PyExc_ValueError,
                            "FoldOrder.merge_keys: fetch must return a pair per key");
            goto fail;
        }
        for (Py_ssize_t i = 0, j = 0; i < n; i++) {
            PyObject *k = PyList_GET_ITEM(out, i);
            if (!PyBytes_Check(k))
                continue;
            PyObject *pair = PyList_GET_ITEM(got, j++), *gk = pair_key(got, j - 1);
            if (gk == NULL || key_cmp(gk, k) != 0) {
                Py_DECREF(got);
                if (gk != NULL)
                    PyErr_SetString(PyExc_ValueError,
                                    "FoldOrder.merge_keys: fetch returned another key");
                goto fail;
            }
            Py_INCREF(pair);
            PyList_SET_ITEM(out, i, pair); /* steals; k's reference goes */
            Py_DECREF(k);
        }
        Py_DECREF(got);
    }
    return Py_BuildValue("(Nn)", out, taken);
fail:
    Py_DECREF(out);
    return NULL;
}

/* The entries of the topic sought not merged yet. */
static PyObject *
FoldOrder_left(FoldOrder *t, PyObject *noargs)
{
    (void)noargs;
    return PyLong_FromSsize_t(t->stop - t->cur);
}

static PyObject *
FoldOrder_rest(FoldOrder *t, PyObject *arg)
{
    Py_ssize_t size = PyLong_AsSsize_t(arg);
    if (size == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t n = t->stop - t->cur;
    if (n > size)
        n = size;
    if (n < 0)
        n = 0;
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        prefetch_ahead(t, t->cur);
        PyObject *pair = entry_pair(t->table, &t->order[t->cur++].e, NULL);
        if (pair == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, pair);
    }
    return out;
}

static PyObject *
FoldOrder_get(FoldOrder *o, PyObject *arg)
{
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "FoldOrder.get(record key: bytes)");
        return NULL;
    }
    FoldTable *t = o->table;
    const char *key = PyBytes_AS_STRING(arg);
    Py_ssize_t n = PyBytes_GET_SIZE(arg), pl, ti = target_of(t, key, n, &pl);
    if (ti < 0 || t->cap == 0)
        Py_RETURN_NONE;
    const unsigned char *k = (const unsigned char *)key + pl;
    Py_ssize_t kl = n - pl;
    uint64_t h = key_hash(k, kl, (uint32_t)ti);
    for (Py_ssize_t j = (Py_ssize_t)(h & (uint64_t)(t->cap - 1));; j = (j + 1) & (t->cap - 1)) {
        const Entry *e = &t->slots[j];
        if (e->rec == NULL)
            Py_RETURN_NONE;
        if (e->target == (uint32_t)ti && e->klen == (uint32_t)kl &&
            entry_key_cmp(e, k, k, kl) == 0) {
            PyObject *kk, *v;
            if (entry_objects(t, e, &kk, &v) < 0)
                return NULL;
            Py_DECREF(kk);
            return v;
        }
    }
}


static PyMethodDef FoldOrder_methods[] = {
    {"seek", (PyCFunction)FoldOrder_seek, METH_O, "seek(prefix): merge and rest read that topic"},
    {"merge", (PyCFunction)FoldOrder_merge, METH_O,
     "merge(chunk) -> list: a checkpoint chunk with the entries up to its last key"},
    {"merge_keys", (PyCFunction)FoldOrder_merge_keys, METH_VARARGS,
     "merge_keys(keys, fetch) -> (list, taken): merge() of a chunk read as keys only"},
    {"left", (PyCFunction)FoldOrder_left, METH_NOARGS, "left() -> the topic's entries not merged"},
    {"rest", (PyCFunction)FoldOrder_rest, METH_O, "rest(size) -> list: the entries left, size at most"},
    {"get", (PyCFunction)FoldOrder_get, METH_O, "get(record key) -> store value or None"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject FoldOrderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "server._sowfold.FoldOrder",
    .tp_basicsize = sizeof(FoldOrder),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A FoldTable in record key order (FoldTable.sort(); see server/_sowfold.c)",
    .tp_dealloc = (destructor)FoldOrder_dealloc,
    .tp_methods = FoldOrder_methods,
};
