/* A historical SOW query's fold of the journal (server/sow/history.py), in C.
 *
 * FoldTable(hint=0) folds the journal's stored bytes (journal/record.py's layout, read by
 * Journal.read_block) into a table of its own (sized for `hint` keys, so that it need not
 * grow): per record key, the newest message, kept as a
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
 *   sort() -> FoldOrder: the entries in record key order (bytes order, as LMDB's), once the
 *       fold is done (server/_sowfold_order.c; the table then takes no more folds). The answer
 *       is read from it without a Python object per entry until it is sent:
 *     seek(prefix): the entries of one topic (its record key prefix) are the ones merged next;
 *     merge(chunk) -> list: a chunk of the checkpoint (a list of (record key, value) of that
 *       topic, key order) merged with the entries whose key is at most the chunk's last: an
 *       entry replaces the chunk's pair of its key (the chunk itself when none falls in it);
 *     merge_keys(keys, fetch) -> (list, taken): merge() of a chunk read as its record keys
 *       only; fetch(list of the keys no entry replaced) is called once, when there are any,
 *       and must return their (key, value) pairs in that order (else ValueError); taken: the
 *       entries merged;
 *     left() -> the entries of the topic sought not merged yet;
 *     rest(size) -> list: at most `size` of the entries not merged yet, as (record key, value);
 *     get(record key) -> the store value of its entry, or None when the fold left none.
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
#include "_sowfold.h"
#include <sys/mman.h>

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

/* Zeroed slots. A table past 2 MiB is mapped on its own and, up to HUGE_MAX, asks for huge
   pages: its probes land anywhere in it, and with 4 KiB pages nearly each one also missed the
   TLB (the fold's time went to the prefetches' page walks; 100,000 keys: 85-100 -> 60 ms of a
   fold of 35 MB). Not past HUGE_MAX: the kernel compacts memory to find each huge page, and
   400 MB of them took 11 s where 4 KiB pages took 1.2. */
#define HUGE_PAGE ((size_t)2 << 20)
#define HUGE_MAX ((size_t)64 << 20)

/* The slots of the last table freed (one, of at most HUGE_MAX; the GIL guards it), kept for
   the next table of the same size (a query's table is the size of the one before it: its
   hint is the checkpoint's record count), which clears it instead of having the kernel
   fault in and zero fresh pages (as history.py keeps the journal blocks a fold read). */
static Entry *spare;
static Py_ssize_t spare_cap;

static Entry *
slots_alloc(Py_ssize_t cap)
{
    size_t size = sizeof(Entry) * (size_t)cap;
    if (size < HUGE_PAGE)
        return PyMem_Calloc((size_t)cap, sizeof(Entry));
    if (spare != NULL && spare_cap == cap) {
        Entry *p = spare;
        spare = NULL;
        memset(p, 0, size);
        return p;
    }
    size = (size + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
#ifdef MADV_HUGEPAGE
    if (size <= HUGE_MAX)
        (void)madvise(p, size, MADV_HUGEPAGE); /* a hint: without it the table works as before */
#endif
    return p;
}

static void
slots_unmap(Entry *slots, Py_ssize_t cap)
{
    munmap(slots, (sizeof(Entry) * (size_t)cap + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1));
}

static void
slots_free(Entry *slots, Py_ssize_t cap)
{
    size_t size = sizeof(Entry) * (size_t)cap;
    if (slots == NULL)
        return;
    if (size < HUGE_PAGE) {
        PyMem_Free(slots);
    } else if (size <= HUGE_MAX) {
        if (spare != NULL)
            slots_unmap(spare, spare_cap);
        spare = slots;
        spare_cap = cap;
    } else {
        slots_unmap(slots, cap);
    }
}

static int
table_grow(FoldTable *t)
{
    Py_ssize_t cap = t->cap ? t->cap * 2 : 1 << 12;
    Entry *slots = slots_alloc(cap);
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < t->cap; i++) {
        Entry *e = &t->slots[i];
        if (e->rec == NULL)
            continue;
        /* the hash again, from the key in its block: a table sized by its hint never grows */
        uint64_t h = key_hash(e->key, e->klen, e->target);
        Py_ssize_t j = (Py_ssize_t)(h & (uint64_t)(cap - 1));
        while (slots[j].rec != NULL)
            j = (j + 1) & (cap - 1);
        slots[j] = *e;
    }
    slots_free(t->slots, t->cap);
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

/* A message read, its slot asked for (the table is larger than the caches, a probe is a miss)
   and put AHEAD messages later. */
typedef struct {
    Entry e;
    uint64_t hash;
} Pending;

static int
table_put(FoldTable *t, const Pending *p)
{
    if ((t->n + 1) * 2 > t->cap && table_grow(t) < 0)
        return -1;
    const Entry *in = &p->e;
    Py_ssize_t j = (Py_ssize_t)(p->hash & (uint64_t)(t->cap - 1));
    for (;;) {
        Entry *e = &t->slots[j];
        if (e->rec == NULL) {
            *e = *in;
            t->n++;
            return 0;
        }
        if (e->target == in->target && e->klen == in->klen &&
            entry_key_cmp(e, in->kb, in->key, in->klen) == 0) {
            e->key = in->key; /* the newest message of the key: its own block holds its key */
            e->rec = in->rec;
            e->pos = in->pos;
            return 0;
        }
        j = (j + 1) & (t->cap - 1);
    }
}

#define AHEAD 8 /* messages between asking for a slot and putting into it */

/* The table's first size: room for `hint` keys at under half full, so that a fold of the
   expected number of keys never re-hashes (each growth moves every entry, a cache miss each). */
#define HINT_MAX ((1 << 19) - 1) /* 2^20 slots, 48 MiB: a hint too high costs that at most */

static PyObject *
FoldTable_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"hint", NULL};
    Py_ssize_t hint = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|n", kwlist, &hint))
        return NULL;
    FoldTable *t = (FoldTable *)type->tp_alloc(type, 0); /* every field zero */
    if (t == NULL || hint <= 0)
        return (PyObject *)t;
    if (hint > HINT_MAX)
        hint = HINT_MAX;
    Py_ssize_t cap = 1 << 12;
    while (cap < 2 * hint + 2)
        cap *= 2;
    t->slots = slots_alloc(cap);
    if (t->slots == NULL) {
        Py_DECREF(t);
        return PyErr_NoMemory();
    }
    t->cap = cap;
    return (PyObject *)t;
}

static void
FoldTable_dealloc(FoldTable *t)
{
    table_clear(t);
    slots_free(t->slots, t->cap);
    PyMem_Free(t->blocks);
    for (Py_ssize_t i = 0; i < t->ntargets; i++)
        Py_DECREF(t->targets[i]);
    PyMem_Free(t->targets);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

/* Room for one more held buffer in t->blocks (grown by doubling); -1 with MemoryError set. */
static int
blocks_room(FoldTable *t)
{
    if (t->nblocks < t->blocks_cap)
        return 0;
    Py_ssize_t cap = t->blocks_cap ? t->blocks_cap * 2 : 16;
    Py_buffer *grown = PyMem_Realloc(t->blocks, sizeof(Py_buffer) * (size_t)cap);
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    t->blocks = grown;
    t->blocks_cap = cap;
    return 0;
}

static PyObject *
FoldTable_fold(FoldTable *t, PyObject *args)
{
    PyObject *targets, *learn;
    long long base, end;
    if (t->sorted) {
        PyErr_SetString(PyExc_RuntimeError, "FoldTable.fold after sort()");
        return NULL;
    }
    if (blocks_room(t) < 0)
        return NULL;
    Py_buffer *buf = &t->blocks[t->nblocks]; /* held when an entry points into it */
    if (!PyArg_ParseTuple(args, "y*LLO!O", buf, &base, &end, &PyDict_Type, &targets, &learn))
        return NULL;
    const unsigned char *in = (const unsigned char *)buf->buf;
    Py_ssize_t n = buf->len, off = 0, put = 0;
    int at_end = 0, stopped = 0, failed = 0;
    PyObject *last_topic = NULL, *last_target = NULL; /* the previous message's lookup */
    Py_ssize_t last_index = -1;
    Pending pending[AHEAD]; /* the messages read last, put in the order read */
    int np = 0, head = 0;
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
        if (np == AHEAD) { /* the oldest pending put, its place taken by this one */
            if (table_put(t, &pending[head]) < 0) {
                np = 0;
                failed = 1;
                break;
            }
            head = (head + 1) % AHEAD;
            np--;
        }
        Pending *p = &pending[(head + np++) % AHEAD];
        p->hash = key_hash(h + 6, hl - 7, (uint32_t)last_index);
        p->e.key = h + 6;
        p->e.klen = (uint32_t)(hl - 7);
        key_kb(p->e.kb, h + 6, hl - 7);
        p->e.target = (uint32_t)last_index;
        p->e.rec = r;
        p->e.pos = base + off;
        if (t->cap)
            __builtin_prefetch(&t->slots[p->hash & (uint64_t)(t->cap - 1)]);
        put++;
        off += f.total;
    }
    for (; np > 0 && !failed; np--, head = (head + 1) % AHEAD)
        if (table_put(t, &pending[head]) < 0)
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

static PyObject *
FoldTable_compact(FoldTable *t, PyObject *noargs)
{
    (void)noargs;
    if (t->sorted) {
        PyErr_SetString(PyExc_RuntimeError, "FoldTable.compact after sort()");
        return NULL;
    }
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < t->cap; i++) {
        const Entry *e = &t->slots[i];
        if (e->rec != NULL)
            total += (Py_ssize_t)rd32(e->rec) + 4;
    }
    if (blocks_room(t) < 0) /* room for the arena's buffer */
        return NULL;
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
    if (t->sorted) {
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

static PyObject *
FoldTable_sort(FoldTable *t, PyObject *noargs)
{
    (void)noargs;
    return fold_order_new(t);
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
     "sort() -> FoldOrder: the entries in record key order (no fold after it)"},
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
    if (PyType_Ready(&FoldTableType) < 0 || PyType_Ready(&FoldOrderType) < 0)
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
