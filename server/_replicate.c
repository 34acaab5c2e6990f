/* Replication's per-record work in one pass: the C twin of server/replicate_scan.py (the
 * reference; the tests hold both to the same results).
 *
 * replicate_records(body, pos, highest, known, name, group, ts, base, first_msg, origins)
 *     -> (records, entries, msgs, stop, dups, unknown, pubs)
 *     The destination's intake of a batch of the source's journal records (already verified:
 *     journal/record.py's verified_prefix). From `pos`, while each whole record of `body` is a
 *     message whose topic (bytes) is a key of `known` (-> the topic str; the caller puts only
 *     recorded topics there): a sequence at or below the publisher's highest (`highest`, a dict
 *     pub -> seq, missing = 0) is a duplicate, counted in `dups` and left out; any other is
 *     re-encoded with an origin block and this instance's receive time `ts` (the source
 *     record's own origin block kept, else (its receive time, name, group)) into `records`,
 *     with (pub, seq, ts, base + offset) in `entries`, (topic, pub, seq, ts, body, base +
 *     offset, header fragment, expiration or None) in `msgs` (server/batch_row.py's BatchRow
 *     as a tuple; configure(BatchRow) checks its fields at import), its origin tuple in
 *     `origins[first_msg + i]`, and `highest[pub] = seq`. stop: the first record not walked
 *     (len(body), or a queue event, a topic not in `known` (then `unknown` is that topic), a
 *     record that is not whole or whose fields do not fit it): the caller's ordinary path
 *     takes it. pubs: pub -> (first seq taken, last seq taken, its offset) for this call.
 *
 * kept_span(buf, pos, topics) -> (stop, unknown, count)
 *     The source's filter, for the common run: the end of the whole records from `pos` that
 *     are messages without an origin block whose topic maps to True in `topics` (bytes ->
 *     bool, the Filter's cache). stop is the first record that is not one; unknown is its
 *     topic when the only reason is that the topic is not in `topics` yet, else None.
 *
 * Why C: per record the Python intake builds a tuple, looks up the publisher, calls
 * encode_record (packs, crc32, concatenations) and appends three rows: most of the
 * destination's CPU under a stream of sync-replicated publishes, and both instances share
 * the same cores.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#define RECORD_CRC
#include "../journal/_record.h"
#include "_batch_row.h"


#define MAX_NAME 255

/* The record at p (at most `left` bytes there): 1 when it is whole, its optional fields and
   topic fit in it and its flags are known, else 0. */
static int parse(const unsigned char *p, Py_ssize_t left, RecordFields *r) {
    return record_next(p, left, r) == RECORD_WHOLE && !(r->flags & ~KNOWN_FLAGS);
}

/* The running state of one publisher between switches (the dicts are written at a switch). */
typedef struct {
    PyObject *pub_o;  /* NULL: none yet */
    uint64_t pub, high, first, last;
    Py_ssize_t last_off;
    int taken; /* a record of it was taken in this call (then first/last/last_off hold) */
    int dirty; /* one was taken since the switch: the dicts need writing */
} Cur;

/* Write the current publisher's highest and (first, last, offset) back to the dicts. */
static int put_back(Cur *c, PyObject *highest, PyObject *pubs) {
    if (c->pub_o == NULL)
        return 0;
    if (!c->dirty) {
        Py_CLEAR(c->pub_o);
        return 0;
    }
    PyObject *h = PyLong_FromUnsignedLongLong(c->high);
    if (h == NULL || PyDict_SetItem(highest, c->pub_o, h) < 0) {
        Py_XDECREF(h);
        return -1;
    }
    Py_DECREF(h);
    PyObject *t = Py_BuildValue("(KKn)", c->first, c->last, c->last_off);
    if (t == NULL || PyDict_SetItem(pubs, c->pub_o, t) < 0) {
        Py_XDECREF(t);
        return -1;
    }
    Py_DECREF(t);
    Py_CLEAR(c->pub_o);
    return 0;
}

/* Make `pub` the current publisher: its highest from `highest`, its first from `pubs`. */
static int switch_to(Cur *c, uint64_t pub, PyObject *highest, PyObject *pubs) {
    if (put_back(c, highest, pubs) < 0)
        return -1;
    PyObject *k = PyLong_FromUnsignedLongLong(pub);
    if (k == NULL)
        return -1;
    PyObject *h = PyDict_GetItemWithError(highest, k);
    uint64_t high = 0;
    if (h != NULL) {
        high = PyLong_AsUnsignedLongLong(h);
        if (high == (uint64_t)-1 && PyErr_Occurred()) {
            Py_DECREF(k);
            return -1;
        }
    } else if (PyErr_Occurred()) {
        Py_DECREF(k);
        return -1;
    }
    c->taken = c->dirty = 0;
    PyObject *seen = PyDict_GetItemWithError(pubs, k);
    if (seen != NULL) {
        if (!PyArg_ParseTuple(seen, "KKn", &c->first, &c->last, &c->last_off)) {
            Py_DECREF(k);
            return -1;
        }
        c->taken = 1;
    } else if (PyErr_Occurred()) {
        Py_DECREF(k);
        return -1;
    }
    c->pub_o = k;
    c->pub = pub;
    c->high = high;
    return 0;
}

static PyObject *
replicate_records(PyObject *self, PyObject *args)
{
    Py_buffer in, name, group;
    Py_ssize_t pos, base, first_msg;
    unsigned long long ts;
    PyObject *highest, *known, *origins;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*nO!O!y*y*KnnO!", &in, &pos, &PyDict_Type, &highest,
                          &PyDict_Type, &known, &name, &group, &ts, &base, &first_msg,
                          &PyDict_Type, &origins))
        return NULL;
    const unsigned char *buf = (const unsigned char *)in.buf;
    Py_ssize_t n = in.len;
    PyObject *records = NULL, *entries = NULL, *msgs = NULL, *pubs = NULL, *ts_o = NULL;
    PyObject *empty = NULL, *name_o = NULL, *group_o = NULL, *unknown = NULL, *result = NULL;
    PyObject *topic_str = NULL, *own_origin = NULL;
    uint64_t own_ts = 0;
    const unsigned char *last_topic = NULL;
    Py_ssize_t last_tlen = 0, dups = 0;
    Cur cur = {0};
    if (pos < 0 || pos > n) {
        PyErr_SetString(PyExc_ValueError, "pos is outside body");
        goto done;
    }
    if (name.len > MAX_NAME || group.len > MAX_NAME) {
        PyErr_SetString(PyExc_ValueError, "name and group must each be at most 255 bytes");
        goto done;
    }
    /* each record grows by at most its new origin block; records are at least 36 bytes */
    Py_ssize_t grow = 10 + name.len + group.len;
    Py_ssize_t bound = (n - pos) + ((n - pos) / RECORD_HEADER + 1) * grow;
    records = PyBytes_FromStringAndSize(NULL, bound);
    entries = PyList_New(0);
    msgs = PyList_New(0);
    pubs = PyDict_New();
    ts_o = PyLong_FromUnsignedLongLong(ts);
    empty = PyBytes_FromStringAndSize(NULL, 0);
    name_o = PyBytes_FromStringAndSize((const char *)name.buf, name.len);
    group_o = PyBytes_FromStringAndSize((const char *)group.buf, group.len);
    if (!records || !entries || !msgs || !pubs || !ts_o || !empty || !name_o || !group_o)
        goto done;
    unsigned char *o0 = (unsigned char *)PyBytes_AS_STRING(records);
    unsigned char *o = o0;
    while (pos < n) {
        const unsigned char *p = buf + pos;
        RecordFields r;
        if (!parse(p, n - pos, &r) || r.kind != KIND_MESSAGE)
            break;
        if (cur.pub_o == NULL || r.pub != cur.pub) {
            if (switch_to(&cur, r.pub, highest, pubs) < 0)
                goto done;
        }
        if (r.seq <= cur.high) {
            dups++;
            pos += r.total;
            continue;
        }
        if (last_topic == NULL || r.tlen != last_tlen ||
            memcmp(p + r.topic, last_topic, (size_t)r.tlen) != 0) {
            PyObject *key = PyBytes_FromStringAndSize((const char *)p + r.topic, r.tlen);
            if (key == NULL)
                goto done;
            PyObject *got = PyDict_GetItemWithError(known, key);
            if (got == NULL) {
                if (PyErr_Occurred()) {
                    Py_DECREF(key);
                    goto done;
                }
                unknown = key;
                break;
            }
            Py_DECREF(key);
            Py_INCREF(got);
            Py_XSETREF(topic_str, got);
            last_topic = p + r.topic;
            last_tlen = r.tlen;
        }
        /* the new record: the source's header with flags | origin and this receive time, its
           optional fields as they are (+ an origin block when it had none), topic, body */
        Py_ssize_t opt = r.topic - RECORD_HEADER;
        Py_ssize_t add = (r.flags & FLAG_ORIGIN) ? 0 : grow;
        Py_ssize_t rest = r.total - r.topic; /* topic + body */
        Py_ssize_t total = RECORD_HEADER + opt + add + rest;
        if (total - 4 > (Py_ssize_t)0xFFFFFFFF)
            break; /* cannot happen for a record that came in a batch; the ordinary path says */
        Py_ssize_t off = base + (o - o0);
        wr32(o, (uint32_t)(total - 4));
        o[8] = KIND_MESSAGE;
        o[9] = (unsigned char)(r.flags | FLAG_ORIGIN);
        memcpy(o + 10, p + 10, 18); /* topic length, publisher, sequence */
        wr64(o + 28, ts);
        unsigned char *q = o + RECORD_HEADER;
        memcpy(q, p + RECORD_HEADER, (size_t)opt);
        q += opt;
        if (add) {
            wr64(q, r.ts);
            q[8] = (unsigned char)name.len;
            memcpy(q + 9, name.buf, (size_t)name.len);
            q[9 + name.len] = (unsigned char)group.len;
            memcpy(q + 10 + name.len, group.buf, (size_t)group.len);
            q += add;
        }
        memcpy(q, p + r.topic, (size_t)rest);
        wr32(o + 4, record_crc(o + 8, total - 8));
        o += total;

        PyObject *seq_o = PyLong_FromUnsignedLongLong(r.seq);
        PyObject *off_o = PyLong_FromSsize_t(off);
        PyObject *body_o = PyBytes_FromStringAndSize((const char *)p + r.topic + r.tlen,
                                                     r.total - r.topic - r.tlen);
        PyObject *hdr_o = (r.flags & FLAG_HEADER)
                              ? PyBytes_FromStringAndSize((const char *)p + r.hdr, r.hlen)
                              : (Py_INCREF(empty), empty);
        PyObject *exp_o = (r.flags & FLAG_EXPIRATION) ? PyLong_FromUnsignedLong(r.exp)
                                                      : (Py_INCREF(Py_None), Py_None);
        PyObject *origin = NULL, *entry = NULL, *msg = NULL, *idx = NULL;
        if (r.flags & FLAG_ORIGIN) {
            const unsigned char *b = p + r.origin;
            Py_ssize_t nl = b[8];
            origin = Py_BuildValue("(Ky#y#)", (unsigned long long)rd64(b), b + 9, nl,
                                   b + 10 + nl, (Py_ssize_t)b[9 + nl]);
        } else {
            /* the records of one source commit share their receive time: one tuple for them */
            if (own_origin == NULL || r.ts != own_ts) {
                PyObject *t = PyLong_FromUnsignedLongLong(r.ts);
                Py_CLEAR(own_origin);
                if (t != NULL) {
                    own_origin = PyTuple_Pack(3, t, name_o, group_o);
                    own_ts = r.ts;
                    Py_DECREF(t);
                }
            }
            Py_XINCREF(own_origin);
            origin = own_origin;
        }
        if (seq_o && off_o && body_o && hdr_o && exp_o && origin) {
            entry = PyTuple_Pack(4, cur.pub_o, seq_o, ts_o, off_o);
            PyObject *const row[BATCH_ROW_FIELDS] = {topic_str, cur.pub_o, seq_o, ts_o,
                                                     body_o,    off_o,     hdr_o, exp_o};
            msg = batch_row(row);
            idx = PyLong_FromSsize_t(first_msg + PyList_GET_SIZE(msgs));
        }
        int bad = entry == NULL || msg == NULL || idx == NULL ||
                  PyList_Append(entries, entry) < 0 || PyList_Append(msgs, msg) < 0 ||
                  PyDict_SetItem(origins, idx, origin) < 0;
        Py_XDECREF(seq_o);
        Py_XDECREF(off_o);
        Py_XDECREF(body_o);
        Py_XDECREF(hdr_o);
        Py_XDECREF(exp_o);
        Py_XDECREF(origin);
        Py_XDECREF(entry);
        Py_XDECREF(msg);
        Py_XDECREF(idx);
        if (bad)
            goto done;
        if (!cur.taken) {
            cur.first = r.seq;
            cur.taken = 1;
        }
        cur.high = cur.last = r.seq;
        cur.last_off = off;
        cur.dirty = 1;
        pos += r.total;
    }
    if (put_back(&cur, highest, pubs) < 0)
        goto done;
    if (_PyBytes_Resize(&records, o - o0) < 0)
        goto done;
    result = Py_BuildValue("(OOOnnOO)", records, entries, msgs, pos, dups,
                           unknown ? unknown : Py_None, pubs);
done:
    Py_XDECREF(cur.pub_o);
    Py_XDECREF(records);
    Py_XDECREF(entries);
    Py_XDECREF(msgs);
    Py_XDECREF(pubs);
    Py_XDECREF(ts_o);
    Py_XDECREF(empty);
    Py_XDECREF(name_o);
    Py_XDECREF(group_o);
    Py_XDECREF(topic_str);
    Py_XDECREF(own_origin);
    Py_XDECREF(unknown);
    PyBuffer_Release(&in);
    PyBuffer_Release(&name);
    PyBuffer_Release(&group);
    return result;
}

static PyObject *
kept_span(PyObject *self, PyObject *args)
{
    Py_buffer in;
    Py_ssize_t pos;
    PyObject *topics, *unknown = NULL;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*nO!", &in, &pos, &PyDict_Type, &topics))
        return NULL;
    const unsigned char *buf = (const unsigned char *)in.buf;
    Py_ssize_t n = in.len;
    const unsigned char *last_topic = NULL;
    Py_ssize_t last_tlen = 0, count = 0;
    if (pos < 0 || pos > n) {
        PyBuffer_Release(&in);
        PyErr_SetString(PyExc_ValueError, "pos is outside buf");
        return NULL;
    }
    while (pos < n) {
        const unsigned char *p = buf + pos;
        RecordFields r;
        if (!parse(p, n - pos, &r) || r.kind != KIND_MESSAGE || (r.flags & FLAG_ORIGIN))
            break;
        if (last_topic == NULL || r.tlen != last_tlen ||
            memcmp(p + r.topic, last_topic, (size_t)r.tlen) != 0) {
            PyObject *key = PyBytes_FromStringAndSize((const char *)p + r.topic, r.tlen);
            if (key == NULL)
                goto fail;
            PyObject *ok = PyDict_GetItemWithError(topics, key);
            if (ok == NULL) {
                if (PyErr_Occurred()) {
                    Py_DECREF(key);
                    goto fail;
                }
                unknown = key;
                break;
            }
            Py_DECREF(key);
            int yes = PyObject_IsTrue(ok);
            if (yes < 0)
                goto fail;
            if (!yes)
                break;
            last_topic = p + r.topic;
            last_tlen = r.tlen;
        }
        pos += r.total;
        count++;
    }
    PyBuffer_Release(&in);
    return Py_BuildValue("(nNn)", pos, unknown ? unknown : (Py_INCREF(Py_None), Py_None), count);
fail:
    PyBuffer_Release(&in);
    return NULL;
}

static PyObject *
configure(PyObject *self, PyObject *type)
{
    (void)self;
    if (batch_row_check(type, "server/_replicate.c") < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_O,
     "configure(row_type): checks server/batch_row.py's BatchRow against the fields it fills"},
    {"replicate_records", replicate_records, METH_VARARGS,
     "replicate_records(body, pos, highest, known, name, group, ts, base, first_msg, origins) "
     "-> (records, entries, msgs, stop, dups, unknown, pubs); see server/replicate_scan.py"},
    {"kept_span", kept_span, METH_VARARGS,
     "kept_span(buf, pos, topics) -> (stop, unknown, count); see server/replicate_scan.py"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "server._replicate",
    "Replication's per-record work: the destination's intake, the source's filter (C).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__replicate(void)
{
    return PyModule_Create(&module);
}
