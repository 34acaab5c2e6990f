/* Delivery frames spliced straight from journal bytes: the C twin of server/splice.py.
 *
 * Both functions write, per message, the delivery frame of docs/protocol.md §1 (protocol/framing.py's
 * layout)
 *
 *     u32 BE length | head | fragment | ,"bm":"<pub>|<seq>|" | tail | } | body
 *
 * where head is the subscription's header up to and including the topic member, fragment the
 * record's stored header fragment, tail empty for replay and the lease end for queues. The
 * output is sized before the walk: every input byte is copied at most once, plus a bounded
 * header per record, so positions given to splice_at must ascend.
 *
 * splice_frames(buf, base, start, end, topic, head) walks the whole records at the start of
 * `buf` (journal/record.py's layout: u32 LE length, u32 crc, u8 kind, u8 flags, u16 LE topic
 * length, u64 LE publisher id, u64 LE sequence, u64 LE time, [u32 expiration if flags & 1],
 * [u16 LE H + H bytes header fragment if flags & 2], [origin block if flags & 4: u64 time,
 * u8 N + N bytes, u8 G + G bytes; skipped: a replicated message is delivered exactly like the
 * original], topic, body) and, for every message
 * (kind 1) on exactly `topic` at a position in [start, end), writes its delivery frame (no
 * tail). It stops at the first record at or past `end` and at a partial record. It returns
 *
 *     (frames: bytes, sent, stop_offset, last_pub, last_seq, at_end)
 *
 * stop_offset is the offset in `buf` of the first record not gone through; last_pub/last_seq
 * name the last record gone through (delivered or not; None when there was none); at_end says
 * the walk stopped at `end`. The pure-Python version is the reference: the tests hold both to
 * the same bytes. Why C: the replay loop otherwise costs a tuple, two slices and a %-format per
 * record, which is most of the server's CPU in a replay.
 *
 * sow_frames (below, with its own comment) makes a SOW query's `sow` frames from store values
 * the same way; server/sow/answer.py is its reference.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>
#include "../journal/_record.h"

static inline char *put_u64(char *o, uint64_t v) {
    char tmp[20];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n)
        *o++ = tmp[--n];
    return o;
}

static const char BM_OPEN[] = ",\"bm\":\"";  /* ,"bm":" */
#define BM_OPEN_LEN 7
#define BM_MAX (BM_OPEN_LEN + 20 + 1 + 20 + 3) /* ...<pub>|<seq>|"} */

/* One delivery frame at o: u32 BE length | head | fragment | ,"bm":"<pub>|<seq>|" | tail | } |
   body. Returns the end of what it wrote. */
/* The publisher's digits are kept from the record before: runs of one publisher are the
   common case, and its 20-digit id costs more to format than the rest of the frame. */
typedef struct {
    uint64_t pub;
    int valid;
    Py_ssize_t len;
    char text[21]; /* "<pub>|" */
} PubText;

static inline Py_ssize_t format_bm(char *dst, PubText *pt, uint64_t pub, uint64_t seq)
{
    if (!pt->valid || pt->pub != pub) {
        char *e = put_u64(pt->text, pub);
        *e++ = '|';
        pt->len = e - pt->text;
        pt->pub = pub;
        pt->valid = 1;
    }
    memcpy(dst, pt->text, (size_t)pt->len);
    char *o = put_u64(dst + pt->len, seq);
    *o++ = '|';
    return o - dst;
}

static inline char *emit_frame(char *o, const char *head, Py_ssize_t hlen, const unsigned char *frag,
                               Py_ssize_t flen, const char *bm, Py_ssize_t bmlen, const char *tail,
                               Py_ssize_t tlen, const unsigned char *body, Py_ssize_t blen)
{
    char *lenp = o;
    o += 4;
    memcpy(o, head, (size_t)hlen);
    o += hlen;
    if (flen) {
        memcpy(o, frag, (size_t)flen);
        o += flen;
    }
    memcpy(o, BM_OPEN, BM_OPEN_LEN);
    o += BM_OPEN_LEN;
    memcpy(o, bm, (size_t)bmlen);
    o += bmlen;
    *o++ = '"';
    if (tlen) {
        memcpy(o, tail, (size_t)tlen);
        o += tlen;
    }
    *o++ = '}';
    memcpy(o, body, (size_t)blen);
    o += blen;
    uint32_t total = (uint32_t)(o - lenp - 4);
    lenp[0] = (char)(total >> 24);
    lenp[1] = (char)(total >> 16);
    lenp[2] = (char)(total >> 8);
    lenp[3] = (char)total;
    return o;
}

static PyObject *
splice_frames(PyObject *self, PyObject *args)
{
    Py_buffer buf, topic, head;
    (void)self;
    long long base, start, end;
    if (!PyArg_ParseTuple(args, "y*LLLy*y*", &buf, &base, &start, &end, &topic, &head))
        return NULL;
    const unsigned char *in = (const unsigned char *)buf.buf;
    Py_ssize_t n = buf.len;
    Py_ssize_t per = 4 + head.len + BM_MAX;
    Py_ssize_t bound = n + (n / RECORD_HEADER + 1) * per;
    PyObject *out = PyBytes_FromStringAndSize(NULL, bound);
    PyObject *result = NULL;
    if (out == NULL)
        goto done;
    char *o0 = PyBytes_AS_STRING(out);
    char *o = o0;
    Py_ssize_t sent = 0;
    BlockWalk w = {0};
    RecordFields f;
    PubText pt = {0};
    Py_BEGIN_ALLOW_THREADS
    while (walk_next(&w, in, n, base, end, &f)) {
        Py_ssize_t off = w.off, t = off + f.topic, nxt = off + f.total;
        if (f.kind == KIND_MESSAGE && f.tlen == topic.len && base + off >= start &&
            memcmp(in + t, topic.buf, (size_t)f.tlen) == 0) {
            char bm[42];
            Py_ssize_t bml = format_bm(bm, &pt, f.pub, f.seq);
            o = emit_frame(o, head.buf, head.len, in + off + f.hdr, f.hlen, bm, bml, NULL, 0,
                           in + t + f.tlen, nxt - (t + f.tlen));
            sent++;
        }
        w.off = nxt;
    }
    Py_END_ALLOW_THREADS
    if (w.bad) {
        PyErr_Format(PyExc_ValueError,
                     "bad record at offset %zd: its fields run past its length", w.off);
        Py_CLEAR(out);
        goto done;
    }
    if (_PyBytes_Resize(&out, o - o0) < 0)
        goto done;
    if (w.have_last)
        result = Py_BuildValue("(NnnKKO)", out, sent, w.off, (unsigned long long)w.last_pub,
                               (unsigned long long)w.last_seq, w.at_end ? Py_True : Py_False);
    else
        result = Py_BuildValue("(NnnOOO)", out, sent, w.off, Py_None, Py_None,
                               w.at_end ? Py_True : Py_False);
    out = NULL; /* owned by the tuple (N), or freed by Py_BuildValue on failure */
done:
    Py_XDECREF(out);
    PyBuffer_Release(&buf);
    PyBuffer_Release(&topic);
    PyBuffer_Release(&head);
    return result;
}


/* splice_at(buf, base, positions, head, tail) -> (frames, bookmarks, count): the delivery frames
   of the messages at `positions` (array('Q'), ascending, each the position of a record in buf,
   which holds the journal from position `base`), with `tail` before the closing brace, and each
   message's bookmark as a str "pub|seq|". Stops at the first position whose record is not whole
   in buf (count says how many were done); a position that holds no message record, or one
   inside the record before it, raises ValueError. */
static PyObject *
splice_at(PyObject *self, PyObject *args)
{
    Py_buffer buf, pos, head, tail;
    long long base;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*Ly*y*y*", &buf, &base, &pos, &head, &tail))
        return NULL;
    PyObject *out = NULL, *bms = NULL, *result = NULL;
    const unsigned char *in = (const unsigned char *)buf.buf;
    Py_ssize_t n = buf.len;
    Py_ssize_t count = pos.len / 8;
    Py_ssize_t per = 4 + head.len + tail.len + BM_MAX;
    /* each record is at least RECORD_HEADER bytes, and only as many as fit are done */
    Py_ssize_t most = n / RECORD_HEADER + 1;
    if (count > most)
        count = most;
    out = PyBytes_FromStringAndSize(NULL, n + count * per);
    bms = PyList_New(0);
    if (out == NULL || bms == NULL)
        goto done;
    char *o0 = PyBytes_AS_STRING(out), *o = o0;
    Py_ssize_t done_n = 0;
    PubText pt = {0};
    long long min_off = LLONG_MIN; /* the end of the record before: positions must ascend */
    for (Py_ssize_t i = 0; i < count; i++) {
        uint64_t p;
        memcpy(&p, (const char *)pos.buf + 8 * i, 8);
        long long off = (long long)p - base;
        if (off < min_off && off + RECORD_HEADER <= n) {
            PyErr_Format(PyExc_ValueError,
                         "position %llu is inside the record before it: positions must ascend",
                         (unsigned long long)p);
            goto done;
        }
        if (off < 0 || off + RECORD_HEADER > n)
            break;
        const unsigned char *r = in + off;
        RecordFields f;
        int got = record_next(r, n - (Py_ssize_t)off, &f);
        if (got == RECORD_SHORT)
            break;
        if (got == RECORD_BAD || f.kind != KIND_MESSAGE) {
            PyErr_Format(PyExc_ValueError, "no message record at position %llu",
                         (unsigned long long)p);
            goto done;
        }
        Py_ssize_t t = (Py_ssize_t)off + f.topic, nxt = (Py_ssize_t)off + f.total;
        min_off = nxt;
        char bm[42];
        Py_ssize_t bml = format_bm(bm, &pt, f.pub, f.seq);
        o = emit_frame(o, head.buf, head.len, r + f.hdr, f.hlen, bm, bml, tail.buf, tail.len,
                       in + t + f.tlen, nxt - (t + f.tlen));
        PyObject *s = PyUnicode_FromStringAndSize(bm, bml);
        if (s == NULL || PyList_Append(bms, s) < 0) {
            Py_XDECREF(s);
            goto done;
        }
        Py_DECREF(s);
        done_n++;
    }
    if (_PyBytes_Resize(&out, o - o0) < 0)
        goto done;
    result = Py_BuildValue("(NNn)", out, bms, done_n);
    out = bms = NULL;
done:
    Py_XDECREF(out);
    Py_XDECREF(bms);
    PyBuffer_Release(&buf);
    PyBuffer_Release(&pos);
    PyBuffer_Release(&head);
    PyBuffer_Release(&tail);
    return result;
}

/* sow_frames(items, prefix, head, extra, no_sowkey) -> (frames, taken): the `sow` frames of a
   SOW query's answer (docs/protocol.md §14; server/frames.py's sow_record) for `items`, a list
   of (record key, value) pairs read from the store in key order (server/sow/store.py's value
   layout: u64 BE position, publisher, sequence, time, u16 BE H, H bytes fragment, body):

       u32 BE length | head | ,"bm":"<pub>|<seq>|" | fragment | extra | } | body

   head is `{"c":"sow"` and the topic member; with no_sowkey the fragment is cut at its last
   `,"k":` (the key is its last member). It stops at the first item whose key does not start
   with `prefix` (the next topic's records): taken says how many items it made frames of. A
   value too short for its fields raises ValueError. Why C: per record, the Python answer costs
   a tuple, two slices, a %-format and a bytes join, most of a query's server CPU. */
static PyObject *
sow_frames(PyObject *self, PyObject *args)
{
    PyObject *items;
    Py_buffer prefix, head, extra;
    int no_sowkey;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!y*y*y*p", &PyList_Type, &items, &prefix, &head, &extra,
                          &no_sowkey))
        return NULL;
    PyObject *out = NULL, *result = NULL;
    Py_ssize_t count = PyList_GET_SIZE(items), taken = 0, size = 0;
    Py_ssize_t per = 4 + head.len + extra.len + BM_MAX;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *it = PyList_GET_ITEM(items, i);
        if (!PyTuple_Check(it) || PyTuple_GET_SIZE(it) != 2 ||
            !PyBytes_Check(PyTuple_GET_ITEM(it, 0)) || !PyBytes_Check(PyTuple_GET_ITEM(it, 1))) {
            PyErr_SetString(PyExc_TypeError, "sow_frames: items must be (bytes, bytes) pairs");
            goto done;
        }
        size += per + PyBytes_GET_SIZE(PyTuple_GET_ITEM(it, 1));
    }
    out = PyBytes_FromStringAndSize(NULL, size);
    if (out == NULL)
        goto done;
    char *o0 = PyBytes_AS_STRING(out), *o = o0;
    PubText pt = {0};
    for (; taken < count; taken++) {
        PyObject *it = PyList_GET_ITEM(items, taken);
        PyObject *key = PyTuple_GET_ITEM(it, 0), *value = PyTuple_GET_ITEM(it, 1);
        if (PyBytes_GET_SIZE(key) < prefix.len ||
            memcmp(PyBytes_AS_STRING(key), prefix.buf, (size_t)prefix.len) != 0)
            break;
        const unsigned char *v = (const unsigned char *)PyBytes_AS_STRING(value);
        Py_ssize_t vlen = PyBytes_GET_SIZE(value);
        if (vlen < 34 || 34 + (((Py_ssize_t)v[32] << 8) | v[33]) > vlen) {
            PyErr_Format(PyExc_ValueError,
                         "SOW store value of %zd bytes is too short for its fields", vlen);
            goto done;
        }
        uint64_t pub = 0, seq = 0;
        for (int j = 8; j < 16; j++)
            pub = (pub << 8) | v[j];
        for (int j = 16; j < 24; j++)
            seq = (seq << 8) | v[j];
        Py_ssize_t flen = ((Py_ssize_t)v[32] << 8) | v[33];
        const unsigned char *frag = v + 34;
        if (no_sowkey) {
            for (Py_ssize_t j = flen - 5; j >= 0; j--)
                if (memcmp(frag + j, ",\"k\":", 5) == 0) {
                    flen = j;
                    break;
                }
        }
        char *lenp = o;
        o += 4;
        memcpy(o, head.buf, (size_t)head.len);
        o += head.len;
        memcpy(o, BM_OPEN, BM_OPEN_LEN);
        o += BM_OPEN_LEN;
        o += format_bm(o, &pt, pub, seq);
        *o++ = '"';
        memcpy(o, frag, (size_t)flen);
        o += flen;
        memcpy(o, extra.buf, (size_t)extra.len);
        o += extra.len;
        *o++ = '}';
        Py_ssize_t at = 34 + (((Py_ssize_t)v[32] << 8) | v[33]);
        memcpy(o, v + at, (size_t)(vlen - at));
        o += vlen - at;
        uint32_t total = (uint32_t)(o - lenp - 4);
        lenp[0] = (char)(total >> 24);
        lenp[1] = (char)(total >> 16);
        lenp[2] = (char)(total >> 8);
        lenp[3] = (char)total;
    }
    if (_PyBytes_Resize(&out, o - o0) < 0)
        goto done;
    result = Py_BuildValue("(Nn)", out, taken);
    out = NULL;
done:
    Py_XDECREF(out);
    PyBuffer_Release(&prefix);
    PyBuffer_Release(&head);
    PyBuffer_Release(&extra);
    return result;
}

/* put_leases(leased, by_bm, positions, bms, lease_type, holder, gen): a run of queue deliveries
   leased in one go (server/queue_types.py's `put_leases_py` is the reference): for each position
   p (an array('Q')) and its bookmark bm, leased[p] = lease_type((holder, gen, bm, None)) and
   by_bm[bm] = p. lease_type is the Lease NamedTuple (a tuple subtype), made here as
   tuple.__new__ makes it, without the call through tuple.__new__'s wrapper per lease: that call
   built two argument tuples and a copy per message, three to four times a plain tuple: at
   backlog 100 (bench_queue) that was a measurable part of a delivery's server CPU. A length
   mismatch raises ValueError. */
static PyObject *
put_leases(PyObject *self, PyObject *args)
{
    PyObject *leased, *by_bm, *bms, *lease_type, *holder, *gen;
    Py_buffer pos;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!O!y*O!O!OO", &PyDict_Type, &leased, &PyDict_Type, &by_bm,
                          &pos, &PyList_Type, &bms, &PyType_Type, &lease_type, &holder, &gen))
        return NULL;
    PyTypeObject *lt = (PyTypeObject *)lease_type;
    Py_ssize_t n = pos.len / 8;
    PyObject *result = NULL;
    if (!PyType_IsSubtype(lt, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "lease_type must be a tuple type (the Lease NamedTuple)");
        goto done;
    }
    if (pos.len % 8 != 0 || PyList_GET_SIZE(bms) != n) {
        PyErr_Format(PyExc_ValueError, "%zd bookmarks for %zd bytes of positions (8 bytes each)",
                     PyList_GET_SIZE(bms), pos.len);
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t p;
        memcpy(&p, (const char *)pos.buf + 8 * i, 8);
        PyObject *bm = PyList_GET_ITEM(bms, i);
        PyObject *key = PyLong_FromUnsignedLongLong(p);
        PyObject *lease = key ? lt->tp_alloc(lt, 4) : NULL;
        if (lease == NULL) {
            Py_XDECREF(key);
            goto done;
        }
        Py_INCREF(holder);
        PyTuple_SET_ITEM(lease, 0, holder);
        Py_INCREF(gen);
        PyTuple_SET_ITEM(lease, 1, gen);
        Py_INCREF(bm);
        PyTuple_SET_ITEM(lease, 2, bm);
        Py_INCREF(Py_None);
        PyTuple_SET_ITEM(lease, 3, Py_None);
        int bad = PyDict_SetItem(leased, key, lease) < 0 || PyDict_SetItem(by_bm, bm, key) < 0;
        Py_DECREF(lease);
        Py_DECREF(key);
        if (bad)
            goto done;
    }
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&pos);
    return result;
}

static PyMethodDef methods[] = {
    {"splice_frames", splice_frames, METH_VARARGS,
     "splice_frames(buf, base, start, end, topic, head) -> (frames, sent, stop_offset, "
     "last_pub, last_seq, at_end); see server/splice.py"},
    {"splice_at", splice_at, METH_VARARGS,
     "splice_at(buf, base, positions, head, tail) -> (frames, bookmarks, count); see "
     "server/splice.py"},
    {"sow_frames", sow_frames, METH_VARARGS,
     "sow_frames(items, prefix, head, extra, no_sowkey) -> (frames, taken): a SOW answer's "
     "frames; see server/sow/answer.py"},
    {"put_leases", put_leases, METH_VARARGS,
     "put_leases(leased, by_bm, positions, bms, lease_type, holder, gen) -> None: a run's leases; "
     "see server/queue_types.py"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "server._splice", "Replay frames spliced from journal bytes (C).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__splice(void)
{
    return PyModule_Create(&module);
}
