/* A historical SOW query's fold of the journal (server/sow/history.py), in C.
 *
 * FoldTable() folds the journal's stored bytes (journal/record.py's layout, read by
 * Journal.read_block) into a table of its own: per record key, the newest message, kept as a
 * pointer into the block it was read from (the block is held while an entry points into it).
 * No Python object is made per message: a message that a later one of the same key replaces
 * costs a hash and a probe. Objects are made once per key that is left, as the answer that
 * needs it is made (so most of that work runs while the client reads the answer):
 *
 *   fold(buf, base, end, targets, learn) -> (stop_offset, at_end, stopped)
 *       the whole records at the start of `buf` (the journal from position `base`), up to the
 *       first record at or past `end`. `targets` maps a topic (bytes) to (record key prefix,
 *       overlay dict) or None (not a SOW topic); a topic not in it yet is asked of
 *       learn(topic) and the answer kept there. Every message on a target topic whose header
 *       fragment is exactly `,"k":"<key>"` (a key without `"` or `\`) goes into the table as
 *       prefix + key -> that message, the newest winning; messages of other topics and
 *       records of other kinds are passed. It stops (stopped true, stop_offset at that record)
 *       at a SOW delete record (kind 3) and at a message on a target topic it cannot take
 *       (another fragment, or none): the caller flushes the table, folds that record itself
 *       and calls again after it. at_end: it stopped at `end`; otherwise stop_offset is where
 *       the whole records in buf end.
 *   held() -> bytes of the blocks the table holds (the caller compacts past its bound)
 *   compact() -> bytes: each entry's message copied into one new buffer, every block read
 *       let go: a long fold holds the messages that are still the newest of their key (at
 *       most one per record), not the journal it read
 *   flush() -> n: every entry put into its target's dict as record key -> store value
 *       (server/sow/store.py: u64 BE position, publisher, sequence, time, u16 BE H, fragment,
 *       body), replacing what the dict had; the table is emptied and its blocks let go.
 *   sort() -> n: the entries put in record key order (bytes order, as LMDB's), once the fold is
 *       done. The answer is then read without a Python object per entry until it is sent:
 *   seek(prefix): the entries of one topic (its record key prefix) are the ones merged next;
 *   merge(chunk) -> list: a chunk of the checkpoint (a list of (record key, value) of that
 *       topic, key order) merged with the entries whose key is at most the chunk's last: an
 *       entry replaces the chunk's pair of its key (the chunk itself when none falls in it);
 *   rest(size) -> list: at most `size` of the entries not merged yet, as (record key, value);
 *   get(record key) -> the store value of its entry, or None when the fold left none.
 *   The table holds puts only: a fold with a delete, or with a record it cannot take, is
 *   flushed into the overlay dict and read from there (history.py).
 *
 * merge_rows(chunk, rows, i) -> (merged, j) merges a chunk of the checkpoint (a list of
 * (record key, value) in key order) with the overlay's rows (key order; a value of None is a
 * record deleted since) from index i, taking the rows whose key is at most the chunk's last:
 * the chunk's pairs and those rows in key order, a row replacing the chunk's pair of its key,
 * the deleted left out; j is the first row not taken. Its Python twin, `merge_rows_py` in
 * server/sow/history.py, is the reference.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "../journal/_record.h"

#define KIND_SOW_DELETE 3

typedef struct {
    uint64_t hash;
    const unsigned char *key; /* the key's bytes inside the fragment, in a held block */
    const unsigned char *rec; /* the record, in a held block */
    long long pos;            /* its journal position */
    uint32_t klen;
    uint32_t target;          /* index into the table's targets */
} Entry;

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
    Entry *slots;       /* open addressing, linear probing; rec == NULL: empty */
    Py_ssize_t cap, n;  /* cap a power of two, n < cap / 2 */
    PyObject **targets; /* (prefix, dict) tuples, owned */
    Py_ssize_t ntargets;
    Py_buffer *blocks;  /* held blocks */
    Py_ssize_t nblocks, blocks_cap, held;
    Sorted *order;      /* sort(): every entry in record key order; no fold after it */
    Py_ssize_t norder;
    Py_ssize_t cur, stop; /* seek(): the entries of one target left to merge, [cur, stop) */
    PyObject *cur_prefix; /* that target's prefix (borrowed from its tuple) */
} FoldTable;

static uint64_t
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

static void
table_clear(FoldTable *t)
{
    if (t->slots != NULL)
        memset(t->slots, 0, sizeof(Entry) * (size_t)t->cap);
    t->n = 0;
    for (Py_ssize_t i = 0; i < t->nblocks; i++)
        PyBuffer_Release(&t->blocks[i]);
    t->nblocks = 0;
    t->held = 0;
}

static int
table_grow(FoldTable *t)
{
    Py_ssize_t cap = t->cap ? t->cap * 2 : 1 << 12;
    Entry *slots = PyMem_Calloc((size_t)cap, sizeof(Entry));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < t->cap; i++) {
        Entry *e = &t->slots[i];
        if (e->rec == NULL)
            continue;
        Py_ssize_t j = (Py_ssize_t)(e->hash & (uint64_t)(cap - 1));
        while (slots[j].rec != NULL)
            j = (j + 1) & (cap - 1);
        slots[j] = *e;
    }
    PyMem_Free(t->slots);
    t->slots = slots;
    t->cap = cap;
    return 0;
}

/* The index of `target` among the table's targets, added (and owned) when new. */
static Py_ssize_t
target_index(FoldTable *t, PyObject *target)
{
    for (Py_ssize_t i = 0; i < t->ntargets; i++)
        if (t->targets[i] == target)
            return i;
    PyObject **grown = PyMem_Realloc(t->targets, sizeof(PyObject *) * (size_t)(t->ntargets + 1));
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    t->targets = grown;
    Py_INCREF(target);
    t->targets[t->ntargets] = target;
    return t->ntargets++;
}

static int
table_put(FoldTable *t, uint64_t h, uint32_t target, const unsigned char *key, Py_ssize_t klen,
          const unsigned char *rec, long long pos)
{
    if ((t->n + 1) * 2 > t->cap && table_grow(t) < 0)
        return -1;
    Py_ssize_t j = (Py_ssize_t)(h & (uint64_t)(t->cap - 1));
    for (;;) {
        Entry *e = &t->slots[j];
        if (e->rec == NULL) {
            e->hash = h;
            e->key = key;
            e->klen = (uint32_t)klen;
            e->target = target;
            e->rec = rec;
            e->pos = pos;
            t->n++;
            return 0;
        }
        if (e->hash == h && e->target == target && e->klen == (uint32_t)klen &&
            memcmp(e->key, key, (size_t)klen) == 0) {
            e->key = key; /* the newest message of the key: its own block holds its key too */
            e->rec = rec;
            e->pos = pos;
            return 0;
        }
        j = (j + 1) & (t->cap - 1);
    }
}

static int
key_cmp(PyObject *x, PyObject *y)
{
    Py_ssize_t nx = PyBytes_GET_SIZE(x), ny = PyBytes_GET_SIZE(y);
    int c = memcmp(PyBytes_AS_STRING(x), PyBytes_AS_STRING(y), (size_t)(nx < ny ? nx : ny));
    return c ? c : (nx > ny) - (nx < ny);
}

/* The (bytes key, value) pair at index i of a list, checked. */
static PyObject *
pair_key(PyObject *list, Py_ssize_t i)
{
    PyObject *p = PyList_GET_ITEM(list, i);
    if (!PyTuple_Check(p) || PyTuple_GET_SIZE(p) != 2 || !PyBytes_Check(PyTuple_GET_ITEM(p, 0))) {
        PyErr_SetString(PyExc_TypeError, "merge_rows: items must be (bytes, value) pairs");
        return NULL;
    }
    return PyTuple_GET_ITEM(p, 0);
}

static PyObject *
FoldTable_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    (void)args;
    (void)kwds;
    FoldTable *t = (FoldTable *)type->tp_alloc(type, 0);
    return (PyObject *)t; /* every field zero */
}

static void
FoldTable_dealloc(FoldTable *t)
{
    table_clear(t);
    PyMem_Free(t->slots);
    PyMem_Free(t->blocks);
    PyMem_Free(t->order);
    for (Py_ssize_t i = 0; i < t->ntargets; i++)
        Py_DECREF(t->targets[i]);
    PyMem_Free(t->targets);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static PyObject *
FoldTable_fold(FoldTable *t, PyObject *args)
{
    PyObject *targets, *learn;
    long long base, end;
    if (t->order != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "FoldTable.fold after sort()");
        return NULL;
    }
    if (t->nblocks == t->blocks_cap) {
        Py_ssize_t cap = t->blocks_cap ? t->blocks_cap * 2 : 16;
        Py_buffer *grown = PyMem_Realloc(t->blocks, sizeof(Py_buffer) * (size_t)cap);
        if (grown == NULL)
            return PyErr_NoMemory();
        t->blocks = grown;
        t->blocks_cap = cap;
    }
    Py_buffer *buf = &t->blocks[t->nblocks]; /* held when an entry points into it */
    if (!PyArg_ParseTuple(args, "y*LLO!O", buf, &base, &end, &PyDict_Type, &targets, &learn))
        return NULL;
    const unsigned char *in = (const unsigned char *)buf->buf;
    Py_ssize_t n = buf->len, off = 0, put = 0;
    int at_end = 0, stopped = 0, failed = 0;
    PyObject *last_topic = NULL, *last_target = NULL; /* the previous message's lookup */
    Py_ssize_t last_index = -1;
    Entry pending = {0}; /* the message read last, put when the next one is read */
    while (n - off >= RECORD_HEADER) {
        const unsigned char *r = in + off;
        RecordFields f;
        int got = record_next(r, n - off, &f);
        if (got == RECORD_SHORT)
            break;
        if (base + off >= end) {
            at_end = 1;
            break;
        }
        if (got == RECORD_BAD) {
            PyErr_Format(PyExc_ValueError,
                         "bad record at offset %zd: its fields run past its length", off);
            failed = 1;
            break;
        }
        if (f.kind == KIND_SOW_DELETE) { /* the caller's */
            stopped = 1;
            break;
        }
        if (f.kind != KIND_MESSAGE) {
            off += f.total;
            continue;
        }
        const unsigned char *tp = r + f.topic;
        PyObject *target;
        if (last_topic != NULL && PyBytes_GET_SIZE(last_topic) == f.tlen &&
            memcmp(PyBytes_AS_STRING(last_topic), tp, (size_t)f.tlen) == 0) {
            target = last_target;
        } else {
            PyObject *tb = PyBytes_FromStringAndSize((const char *)tp, f.tlen);
            if (tb == NULL) {
                failed = 1;
                break;
            }
            target = PyDict_GetItemWithError(targets, tb);
            if (target == NULL && !PyErr_Occurred()) {
                PyObject *learnt = PyObject_CallOneArg(learn, tb);
                if (learnt != NULL && PyDict_SetItem(targets, tb, learnt) < 0)
                    Py_CLEAR(learnt);
                Py_XDECREF(learnt); /* targets holds it */
                target = learnt != NULL ? PyDict_GetItemWithError(targets, tb) : NULL;
            }
            if (PyErr_Occurred()) {
                Py_DECREF(tb);
                failed = 1;
                break;
            }
            if (target == Py_None)
                target = NULL;
            if (target != NULL &&
                (!PyTuple_Check(target) || PyTuple_GET_SIZE(target) != 2 ||
                 !PyBytes_Check(PyTuple_GET_ITEM(target, 0)) ||
                 !PyDict_Check(PyTuple_GET_ITEM(target, 1)))) {
                Py_DECREF(tb);
                PyErr_SetString(PyExc_TypeError, "FoldTable.fold: targets must map to (bytes, dict)");
                failed = 1;
                break;
            }
            last_index = target != NULL ? target_index(t, target) : -1;
            if (target != NULL && last_index < 0) {
                Py_DECREF(tb);
                failed = 1;
                break;
            }
            Py_XSETREF(last_topic, tb);
            last_target = target; /* borrowed from targets; the table owns a reference too */
        }
        if (target == NULL) {
            off += f.total;
            continue;
        }
        const unsigned char *h = r + f.hdr;
        Py_ssize_t hl = f.hlen;
        int plain = hl >= 8 && hl <= 0xFFFF && memcmp(h, ",\"k\":\"", 6) == 0 && h[hl - 1] == '"';
        for (Py_ssize_t j = 6; plain && j < hl - 1; j++)
            if (h[j] == '"' || h[j] == '\\')
                plain = 0;
        if (!plain) {
            stopped = 1;
            break;
        }
        /* put the message before this one, whose slot was asked for a record ago, and ask
           for this one's: the table is larger than the caches, a probe is a miss */
        if (pending.rec != NULL && table_put(t, pending.hash, pending.target, pending.key,
                                             pending.klen, pending.rec, pending.pos) < 0) {
            pending.rec = NULL;
            failed = 1;
            break;
        }
        pending.hash = key_hash(h + 6, hl - 7, (uint32_t)last_index);
        pending.key = h + 6;
        pending.klen = (uint32_t)(hl - 7);
        pending.target = (uint32_t)last_index;
        pending.rec = r;
        pending.pos = base + off;
        if (t->cap)
            __builtin_prefetch(&t->slots[pending.hash & (uint64_t)(t->cap - 1)]);
        put++;
        off += f.total;
    }
    if (pending.rec != NULL && table_put(t, pending.hash, pending.target, pending.key,
                                         pending.klen, pending.rec, pending.pos) < 0)
        failed = 1;
    Py_XDECREF(last_topic);
    if (put) { /* entries point into it: held until the flush */
        t->held += buf->len;
        t->nblocks++;
    } else {
        PyBuffer_Release(buf);
    }
    if (failed)
        return NULL;
    return Py_BuildValue("(nOO)", off, at_end ? Py_True : Py_False, stopped ? Py_True : Py_False);
}

static PyObject *
FoldTable_held(FoldTable *t, PyObject *noargs)
{
    (void)noargs;
    return PyLong_FromSsize_t(t->held);
}

/* The record key (prefix + key) and store value of an entry. */
static int
entry_objects(FoldTable *t, const Entry *e, PyObject **key, PyObject **value)
{
    PyObject *prefix = PyTuple_GET_ITEM(t->targets[e->target], 0);
    Py_ssize_t pl = PyBytes_GET_SIZE(prefix);
    RecordFields f;
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

static PyObject *
FoldTable_compact(FoldTable *t, PyObject *noargs)
{
    (void)noargs;
    if (t->order != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "FoldTable.compact after sort()");
        return NULL;
    }
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < t->cap; i++) {
        const Entry *e = &t->slots[i];
        if (e->rec != NULL)
            total += (Py_ssize_t)rd32(e->rec) + 4;
    }
    if (t->nblocks == t->blocks_cap) { /* room for the arena's buffer */
        Py_ssize_t cap = t->blocks_cap ? t->blocks_cap * 2 : 16;
        Py_buffer *grown = PyMem_Realloc(t->blocks, sizeof(Py_buffer) * (size_t)cap);
        if (grown == NULL)
            return PyErr_NoMemory();
        t->blocks = grown;
        t->blocks_cap = cap;
    }
    PyObject *arena = PyBytes_FromStringAndSize(NULL, total);
    if (arena == NULL)
        return NULL;
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(arena);
    for (Py_ssize_t i = 0; i < t->cap; i++) {
        Entry *e = &t->slots[i];
        if (e->rec == NULL)
            continue;
        Py_ssize_t size = (Py_ssize_t)rd32(e->rec) + 4, at = e->key - e->rec;
        memcpy(o, e->rec, (size_t)size);
        e->rec = o;
        e->key = o + at;
        o += size;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(arena, &view, PyBUF_SIMPLE) < 0) { /* cannot fail for bytes */
        Py_DECREF(arena);
        return NULL;
    }
    Py_DECREF(arena); /* the buffer holds it */
    for (Py_ssize_t i = 0; i < t->nblocks; i++)
        PyBuffer_Release(&t->blocks[i]);
    t->blocks[0] = view;
    t->nblocks = 1;
    t->held = total;
    return PyLong_FromSsize_t(total);
}

static PyObject *
FoldTable_flush(FoldTable *t, PyObject *noargs)
{
    (void)noargs;
    Py_ssize_t done = 0;
    if (t->order != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "FoldTable.flush after sort()");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < t->cap; i++) {
        const Entry *e = &t->slots[i];
        if (e->rec == NULL)
            continue;
        PyObject *key, *value;
        if (entry_objects(t, e, &key, &value) < 0)
            return NULL;
        int rc = PyDict_SetItem(PyTuple_GET_ITEM(t->targets[e->target], 1), key, value);
        Py_DECREF(key);
        Py_DECREF(value);
        if (rc < 0)
            return NULL;
        done++;
    }
    table_clear(t);
    return PyLong_FromSsize_t(done);
}

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

static PyObject *
FoldTable_sort(FoldTable *t, PyObject *noargs)
{
    (void)noargs;
    if (t->order != NULL)
        return PyLong_FromSsize_t(t->norder);
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
    t->order = all;
    t->norder = m;
    t->cur = t->stop = 0;
    return PyLong_FromSsize_t(m);
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
FoldTable_seek(FoldTable *t, PyObject *arg)
{
    if (t->order == NULL || !PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "FoldTable.seek(prefix: bytes) after sort()");
        return NULL;
    }
    Py_ssize_t pl, ti = target_of(t, PyBytes_AS_STRING(arg), PyBytes_GET_SIZE(arg), &pl);
    t->cur = t->stop = 0;
    t->cur_prefix = NULL;
    if (ti < 0 || pl != PyBytes_GET_SIZE(arg))
        Py_RETURN_NONE; /* nothing folded on that topic */
    Py_ssize_t i = 0;
    while (i < t->norder && t->order[i].e.target != (uint32_t)ti)
        i++;
    t->cur = i;
    while (i < t->norder && t->order[i].e.target == (uint32_t)ti)
        i++;
    t->stop = i;
    t->cur_prefix = PyTuple_GET_ITEM(t->targets[ti], 0);
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
prefetch_ahead(const FoldTable *t, Py_ssize_t i)
{
    if (i + 8 < t->stop)
        __builtin_prefetch(t->order[i + 8].e.rec);
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
FoldTable_merge(FoldTable *t, PyObject *chunk)
{
    if (!PyList_Check(chunk)) {
        PyErr_SetString(PyExc_TypeError, "FoldTable.merge(chunk: list)");
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
            pair = entry_pair(t, &o->e, cmp == 0 ? ck : NULL);
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
        PyErr_SetString(PyExc_ValueError, "FoldTable.merge: a chunk key outside the topic sought");
fail:
    Py_DECREF(out);
    return NULL;
}

static PyObject *
FoldTable_rest(FoldTable *t, PyObject *arg)
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
        PyObject *pair = entry_pair(t, &t->order[t->cur++].e, NULL);
        if (pair == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, pair);
    }
    return out;
}

static PyObject *
FoldTable_get(FoldTable *t, PyObject *arg)
{
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "FoldTable.get(record key: bytes)");
        return NULL;
    }
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

static PyMethodDef FoldTable_methods[] = {
    {"fold", (PyCFunction)FoldTable_fold, METH_VARARGS,
     "fold(buf, base, end, targets, learn) -> (stop_offset, at_end, stopped)"},
    {"held", (PyCFunction)FoldTable_held, METH_NOARGS, "held() -> bytes of blocks held"},
    {"compact", (PyCFunction)FoldTable_compact, METH_NOARGS,
     "compact() -> bytes: the newest messages copied together, the blocks let go"},
    {"flush", (PyCFunction)FoldTable_flush, METH_NOARGS,
     "flush() -> n: every entry into its target's dict; the table emptied"},
    {"sort", (PyCFunction)FoldTable_sort, METH_NOARGS,
     "sort() -> n: the entries put in record key order (no fold after it)"},
    {"seek", (PyCFunction)FoldTable_seek, METH_O, "seek(prefix): merge and rest read that topic"},
    {"merge", (PyCFunction)FoldTable_merge, METH_O,
     "merge(chunk) -> list: a checkpoint chunk with the entries up to its last key"},
    {"rest", (PyCFunction)FoldTable_rest, METH_O, "rest(size) -> list: the entries left, size at most"},
    {"get", (PyCFunction)FoldTable_get, METH_O, "get(record key) -> store value or None"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject FoldTableType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "server._sowfold.FoldTable",
    .tp_basicsize = sizeof(FoldTable),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A historical SOW fold's table: record key -> newest message (see the module)",
    .tp_new = FoldTable_new,
    .tp_dealloc = (destructor)FoldTable_dealloc,
    .tp_methods = FoldTable_methods,
};

static PyObject *
merge_rows(PyObject *self, PyObject *args)
{
    PyObject *chunk, *rows;
    Py_ssize_t i;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!O!n", &PyList_Type, &chunk, &PyList_Type, &rows, &i))
        return NULL;
    Py_ssize_t nc = PyList_GET_SIZE(chunk), nr = PyList_GET_SIZE(rows);
    if (i < 0)
        i = 0;
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    PyObject *last = nc ? pair_key(chunk, nc - 1) : NULL;
    if (nc && last == NULL)
        goto fail;
    Py_ssize_t c = 0;
    while (c < nc || (i < nr && last != NULL)) {
        PyObject *ck = c < nc ? pair_key(chunk, c) : NULL;
        if (c < nc && ck == NULL)
            goto fail;
        PyObject *rk = NULL;
        if (i < nr && last != NULL) {
            rk = pair_key(rows, i);
            if (rk == NULL)
                goto fail;
            if (key_cmp(rk, last) > 0)
                rk = NULL; /* past this chunk: the next one's */
        }
        PyObject *take;
        if (rk == NULL) {
            if (ck == NULL)
                break;
            take = PyList_GET_ITEM(chunk, c++);
        } else {
            int cmp = ck == NULL ? 1 : key_cmp(rk, ck);
            if (cmp > 0) {
                take = PyList_GET_ITEM(chunk, c++);
            } else {
                if (cmp == 0)
                    c++; /* replaced */
                take = PyList_GET_ITEM(rows, i++);
                if (PyTuple_GET_ITEM(take, 1) == Py_None)
                    continue; /* deleted since */
            }
        }
        if (PyList_Append(out, take) < 0)
            goto fail;
    }
    return Py_BuildValue("(Nn)", out, i);
fail:
    Py_DECREF(out);
    return NULL;
}

static PyMethodDef methods[] = {
    {"merge_rows", merge_rows, METH_VARARGS,
     "merge_rows(chunk, rows, i) -> (merged, j): a checkpoint chunk merged with the overlay's "
     "rows; see server/sow/history.py"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "server._sowfold",
    "A historical SOW query's fold of journal bytes and its merge with a checkpoint (C).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__sowfold(void)
{
    if (PyType_Ready(&FoldTableType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&FoldTableType);
    if (PyModule_AddObject(m, "FoldTable", (PyObject *)&FoldTableType) < 0) {
        Py_DECREF(&FoldTableType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
