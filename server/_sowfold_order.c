/* A FoldTable read in record key order (FoldOrder, made by FoldTable.sort(); the module comment
 * is at the top of server/_sowfold.c): sort, seek, merge, rest, get.
 */
#include "_sowfold.h"

/* sort()'s array: the key's first bytes are kept in the sort's own array, so that a comparison
   reads no other memory (the keys and records are spread over the blocks); only keys equal
   over those bytes are compared in the blocks. */
#define INLINE_KEY 20
typedef struct {
    Entry e;        /* a copy: the answer reads the table in key order, and the entries sit in
                       hash order, a cache miss each; this array is read in order */
    uint16_t rank;  /* the order of its target's prefix among the targets' */
    uint16_t klen;  /* min(key length, INLINE_KEY + 1) */
    unsigned char kb[INLINE_KEY];
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
    size_t nx = x->klen, ny = y->klen, n = nx < ny ? nx : ny;
    if (n > INLINE_KEY)
        n = INLINE_KEY;
    int c = memcmp(x->kb, y->kb, n);
    if (c)
        return c;
    if (nx <= INLINE_KEY || ny <= INLINE_KEY)
        return (nx > ny) - (nx < ny);
    nx = x->e.klen; /* both longer than what is inline, and equal there */
    ny = y->e.klen;
    c = memcmp(x->e.key + INLINE_KEY, y->e.key + INLINE_KEY,
               (nx < ny ? nx : ny) - INLINE_KEY);
    return c ? c : (nx > ny) - (nx < ny);
}

/* The first 8 key bytes as a number (kb is zero past the key): the radix sort's digits. */
static inline uint64_t
key8(const Sorted *o)
{
    uint64_t v;
    memcpy(&v, o->kb, 8);
    return __builtin_bswap64(v);
}

/* One stable counting pass of the radix sort: `which` < 8 is a byte of key8 (0: the lowest), 8
   and 9 the bytes of rank. A pass whose byte is the same in every element moves nothing. */
static void
radix_pass(Sorted *from, Sorted *to, Py_ssize_t n, int which, int *moved)
{
    Py_ssize_t count[256] = {0};
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned d = which < 8 ? (unsigned)(key8(&from[i]) >> (8 * which)) & 0xFF
                               : (unsigned)(from[i].rank >> (8 * (which - 8))) & 0xFF;
        count[d]++;
    }
    for (int d = 0; d < 256; d++)
        if (count[d] == n) {
            *moved = 0;
            return;
        }
    Py_ssize_t at = 0;
    for (int d = 0; d < 256; d++) {
        Py_ssize_t c = count[d];
        count[d] = at;
        at += c;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned d = which < 8 ? (unsigned)(key8(&from[i]) >> (8 * which)) & 0xFF
                               : (unsigned)(from[i].rank >> (8 * (which - 8))) & 0xFF;
        to[count[d]++] = from[i];
    }
    *moved = 1;
}

/* Sort by (rank, key): LSD radix passes over the first 8 key bytes and the rank (stable, so
   their order is (rank, key8)), then each run equal there sorted by sorted_cmp. A qsort of
   100,000 entries was most of a historical query's wait before its answer. */
static int
radix_sort(Sorted *a, Py_ssize_t n)
{
    Sorted *tmp = PyMem_Malloc(sizeof(Sorted) * (size_t)(n ? n : 1));
    if (tmp == NULL)
        return -1;
    Sorted *from = a, *to = tmp;
    for (int which = 0; which < 10; which++) {
        int moved;
        radix_pass(from, to, n, which, &moved);
        if (moved) {
            Sorted *x = from;
            from = to;
            to = x;
        }
    }
    if (from != a)
        memcpy(a, from, sizeof(Sorted) * (size_t)n);
    PyMem_Free(tmp);
    for (Py_ssize_t i = 0; i < n;) {
        Py_ssize_t j = i + 1;
        uint64_t k = key8(&a[i]);
        while (j < n && a[j].rank == a[i].rank && key8(&a[j]) == k)
            j++;
        if (j - i > 1)
            qsort(a + i, (size_t)(j - i), sizeof(Sorted), sorted_cmp);
        i = j;
    }
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
    Py_ssize_t m = 0;
    for (Py_ssize_t i = 0; i < t->cap; i++) {
        const Entry *e = &t->slots[i];
        if (e->rec == NULL)
            continue;
        Sorted *o = &all[m++];
        o->e = *e;
        o->rank = (uint16_t)rank[e->target];
        o->klen = (uint16_t)(e->klen > INLINE_KEY ? INLINE_KEY + 1 : e->klen);
        memset(o->kb, 0, INLINE_KEY);
        memcpy(o->kb, e->key, e->klen < INLINE_KEY ? e->klen : INLINE_KEY);
    }
    PyMem_Free(rank);
    if (radix_sort(all, m) < 0) {
        PyMem_Free(all);
        return PyErr_NoMemory();
    }
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

/* A sorted entry's key against `k` (a record key's bytes past the prefix): from the bytes kept
   in the sort's array, the entry's own only past them. */
static int
entry_cmp(const Sorted *o, const char *k, Py_ssize_t kl)
{
    Py_ssize_t n = o->klen < kl ? o->klen : kl;
    if (n > INLINE_KEY)
        n = INLINE_KEY;
    int c = memcmp(o->kb, k, (size_t)n);
    if (c)
        return c;
    if (o->klen <= INLINE_KEY || kl <= INLINE_KEY)
        return (o->klen > kl) - (o->klen < kl);
    const Entry *e = &o->e;
    n = ((Py_ssize_t)e->klen < kl ? (Py_ssize_t)e->klen : kl) - INLINE_KEY;
    c = memcmp(e->key + INLINE_KEY, k + INLINE_KEY, (size_t)n);
    return c ? c : ((Py_ssize_t)e->klen > kl) - ((Py_ssize_t)e->klen < kl);
}

/* Entries are taken in key order, their records spread over the blocks: ask for those a few
   places ahead before they are needed. */
static inline void
prefetch_ahead(const FoldOrder *o, Py_ssize_t i)
{
    if (i + 8 < o->stop)
        __builtin_prefetch(o->order[i + 8].e.rec);
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

static PyObject *
FoldOrder_merge(FoldOrder *t, PyObject *chunk)
{
    if (!PyList_Check(chunk)) {
        PyErr_SetString(PyExc_TypeError, "FoldOrder.merge(chunk: list)");
        return NULL;
    }
    Py_ssize_t nc = PyList_GET_SIZE(chunk);
    if (nc == 0 || t->cur >= t->stop) {
        Py_INCREF(chunk);
        return chunk;
    }
    Py_ssize_t pl = PyBytes_GET_SIZE(t->cur_prefix);
    PyObject *lastk = pair_key(chunk, nc - 1);
    if (lastk == NULL)
        return NULL;
    const char *last = PyBytes_AS_STRING(lastk) + pl;
    Py_ssize_t lastn = PyBytes_GET_SIZE(lastk) - pl;
    if (lastn < 0 || entry_cmp(&t->order[t->cur], last, lastn) > 0) {
        Py_INCREF(chunk); /* nothing folded in this chunk's range */
        return chunk;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    Py_ssize_t c = 0;
    while (c < nc) {
        PyObject *item = PyList_GET_ITEM(chunk, c), *ck = pair_key(chunk, c), *pair;
        if (ck == NULL || PyBytes_GET_SIZE(ck) < pl)
            goto fail_type;
        const Sorted *o = t->cur < t->stop ? &t->order[t->cur] : NULL;
        int cmp = o == NULL ? 1
                            : entry_cmp(o, PyBytes_AS_STRING(ck) + pl, PyBytes_GET_SIZE(ck) - pl);
        if (cmp > 0) {
            c++;
            Py_INCREF(item);
            pair = item;
        } else {
            prefetch_ahead(t, t->cur++);
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
        if (e->hash == h && e->target == (uint32_t)ti && e->klen == (uint32_t)kl &&
            memcmp(e->key, k, (size_t)kl) == 0) {
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
