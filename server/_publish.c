/* Plain publish frames turned into journal records in one pass: the C twin of
 * server/publish_scan.py (the reference; the tests hold both to the same results).
 *
 * publish_span(buf, pos, max_size) -> end
 *     The end of the run of whole frames from `pos` (protocol/framing.py's layout: u32 BE
 *     length | header | body) whose header starts with {"c":"publish" and whose length is
 *     1..max_size; `pos` when the frame there is not one.
 *
 * publish_records(raw, pos, pub, ts, highest, known, base)
 *     -> (records, entries, msgs, stop, highest, asked, unknown)
 *     Walks the frames of `raw` from `pos` while each is a plain publish: a header of exactly
 *     the members c ("publish"), t, s and optionally a ("persisted") and cid, each once, in any
 *     order, no white space; strings of printable ASCII without `"` or `\`; t of 1..max_topic
 *     bytes, cid of at most max_cid; s a decimal integer 1..max_seq without leading zeros and above
 *     the sequence before it (`highest` for the first); the topic a key of `known` (bytes ->
 *     topic str). For each it appends the journal record (journal/record.py: kind 1, flags 0,
 *     u32 LE length, crc32, topic, body) to `records`, (pub, seq, ts, base + offset) to
 *     `entries` and (topic, pub, seq, ts, body, base + offset, b"", None) to `msgs`
 *     (server/batch_row.py's BatchRow as a tuple; configure() checks its fields).
 *     stop: where it stopped (len(raw), or the first frame it did not take; anything unusual
 *     there is for the Python path); highest: the last sequence taken (`highest` if none);
 *     asked: whether a taken frame had a="persisted"; unknown: the topic at `stop` when it
 *     stopped only because that topic is not in `known`, else None.
 *     A SOW topic's value in `known` is (topic, key paths, maker): its frames are also keyed
 *     here (key_fragment, in server/_sowkey.h) and their records and rows carry the header
 *     fragment `,"k":"<key>"` (flag 2).
 *
 * store_rows(msgs, base, targets) -> rows put, or -1
 *     Committed rows of SOW topics to the SOW store's record keys and values (the C twin of
 *     server/sow/store.py's store_rows_py, which owns that format).
 *
 * Why C: per message the Python path builds a Header, a (header, body) tuple, runs the field
 * checks, packs and crc's the record and concatenates it: most of the server's CPU under a
 * stream of publishes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#define RECORD_CRC
#include "../journal/_record.h"
#include "_batch_row.h"

/* The limits and the ack type come from protocol/headers.py through configure(), which
   server/publish_scan.py calls at import: they are typed once, there. Until then no frame is
   taken (a topic of at most 0 bytes). */
static Py_ssize_t max_topic = 0, max_cid = 0;
static uint64_t max_seq = 0;
static int max_seq_digits = 0; /* the digits of max_seq (at most 19: the value fits in 64 bits) */
static char fast_ack[32];
static Py_ssize_t fast_ack_len = -1;
/* the members parse_header reads, sorted: protocol/headers.py's "fast" publish fields */
static const char *const MEMBERS[] = {"a", "c", "cid", "s", "t"};
#define N_MEMBERS 5

static const char PUBLISH_PREFIX[] = "{\"c\":\"publish\"";
#define PUBLISH_PREFIX_LEN 14

static inline uint32_t rd32be(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static PyObject *
publish_span(PyObject *self, PyObject *args)
{
    Py_buffer buf;
    Py_ssize_t pos, max_size;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*nn", &buf, &pos, &max_size))
        return NULL;
    const unsigned char *in = (const unsigned char *)buf.buf;
    Py_ssize_t n = buf.len;
    if (pos < 0)
        pos = n;
    while (n - pos >= 4 + PUBLISH_PREFIX_LEN) {
        Py_ssize_t length = (Py_ssize_t)rd32be(in + pos);
        if (length < PUBLISH_PREFIX_LEN || length > max_size || pos + 4 + length > n)
            break;
        if (memcmp(in + pos + 4, PUBLISH_PREFIX, PUBLISH_PREFIX_LEN) != 0)
            break;
        pos += 4 + length;
    }
    PyBuffer_Release(&buf);
    return PyLong_FromSsize_t(pos);
}

typedef struct {
    const unsigned char *topic, *cid;
    Py_ssize_t tlen, clen;
    uint64_t seq;
    int has_c, has_t, has_s, has_a, has_cid;
} Fields;

/* A string at p (after its opening quote) of printable ASCII without `"` or `\`, ending
   before `end`; returns its length (the closing quote at p + length) or -1. */
static inline Py_ssize_t plain_string(const unsigned char *p, const unsigned char *end) {
    const unsigned char *q = p;
    while (q < end) {
        unsigned char ch = *q;
        if (ch == '"')
            return q - p;
        if (ch < 0x20 || ch > 0x7E || ch == '\\')
            return -1;
        q++;
    }
    return -1;
}

/* The header of a plain publish at h (at most n bytes: the frame); returns its length (up to
   and including the closing brace), or 0 when it is not one. */
static Py_ssize_t parse_header(const unsigned char *h, Py_ssize_t n, Fields *f) {
    const unsigned char *p = h, *end = h + n;
    memset(f, 0, sizeof(*f));
    if (p >= end || *p++ != '{')
        return 0;
    for (;;) {
        if (p >= end || *p++ != '"')
            return 0;
        Py_ssize_t klen = plain_string(p, end);
        if (klen < 0)
            return 0;
        const unsigned char *key = p;
        p += klen + 1;
        if (p >= end || *p++ != ':')
            return 0;
        if (klen == 1 && key[0] == 's') {
            if (f->has_s || p >= end || *p < '1' || *p > '9')
                return 0;
            uint64_t v = 0;
            int digits = 0;
            while (p < end && *p >= '0' && *p <= '9') {
                if (++digits > max_seq_digits)
                    return 0;
                v = v * 10 + (uint64_t)(*p - '0');
                p++;
            }
            if (v > max_seq)
                return 0;
            f->seq = v;
            f->has_s = 1;
        } else {
            if (p >= end || *p++ != '"')
                return 0;
            Py_ssize_t vlen = plain_string(p, end);
            if (vlen < 0)
                return 0;
            const unsigned char *val = p;
            p += vlen + 1;
            if (klen == 1 && key[0] == 'c') {
                if (f->has_c || vlen != 7 || memcmp(val, "publish", 7) != 0)
                    return 0;
                f->has_c = 1;
            } else if (klen == 1 && key[0] == 't') {
                if (f->has_t || vlen < 1 || vlen > max_topic)
                    return 0;
                f->topic = val;
                f->tlen = vlen;
                f->has_t = 1;
            } else if (klen == 1 && key[0] == 'a') {
                if (f->has_a || vlen != fast_ack_len || memcmp(val, fast_ack, (size_t)vlen) != 0)
                    return 0;
                f->has_a = 1;
            } else if (klen == 3 && memcmp(key, "cid", 3) == 0) {
                if (f->has_cid || vlen > max_cid)
                    return 0;
                f->cid = val;
                f->clen = vlen;
                f->has_cid = 1;
            } else {
                return 0;
            }
        }
        if (p >= end)
            return 0;
        if (*p == '}')
            break;
        if (*p++ != ',')
            return 0;
    }
    if (!(f->has_c && f->has_t && f->has_s))
        return 0;
    return p + 1 - h;
}

#include "_sowkey.h" /* key_paths, key_fragment: the SOW key of a body */

static PyObject *
publish_records(PyObject *self, PyObject *args)
{
    Py_buffer raw;
    Py_ssize_t pos, base;
    unsigned long long pub, ts, highest;
    PyObject *known;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*nKKKO!n", &raw, &pos, &pub, &ts, &highest, &PyDict_Type,
                          &known, &base))
        return NULL;
    const unsigned char *in = (const unsigned char *)raw.buf;
    Py_ssize_t n = raw.len;
    PyObject *records = NULL, *entries = NULL, *msgs = NULL, *pub_o = NULL, *ts_o = NULL;
    PyObject *empty = NULL, *topic_str = NULL, *unknown = NULL, *result = NULL;
    const unsigned char *last_topic = NULL;
    Py_ssize_t last_tlen = 0;
    int asked = 0;
    int keyed = 0; /* the current topic is a SOW topic: kp holds its key paths */
    KeyPaths kp;
    unsigned char *kbuf = NULL;
    Py_ssize_t kcap = 0;
    if (pos < 0 || pos > n) {
        PyErr_SetString(PyExc_ValueError, "pos is outside raw");
        goto done;
    }
    /* records are never longer than the frames they come from plus 36 - 4 - 14 bytes each
       (frames of at least 4 + 14 bytes make at most (n - pos) / 18 records), but for the key
       fragments of SOW topics: the buffer grows when one does not fit */
    Py_ssize_t cap = (n - pos) + ((n - pos) / (4 + PUBLISH_PREFIX_LEN) + 1) * RECORD_HEADER;
    records = PyBytes_FromStringAndSize(NULL, cap);
    entries = PyList_New(0);
    msgs = PyList_New(0);
    pub_o = PyLong_FromUnsignedLongLong(pub);
    ts_o = PyLong_FromUnsignedLongLong(ts);
    empty = PyBytes_FromStringAndSize(NULL, 0);
    if (!records || !entries || !msgs || !pub_o || !ts_o || !empty)
        goto done;
    unsigned char *o0 = (unsigned char *)PyBytes_AS_STRING(records);
    unsigned char *o = o0;
    while (n - pos >= 4) {
        Py_ssize_t length = (Py_ssize_t)rd32be(in + pos);
        if (pos + 4 + length > n)
            break;
        const unsigned char *frame = in + pos + 4;
        Fields f;
        Py_ssize_t hlen = parse_header(frame, length, &f);
        if (hlen == 0 || f.seq <= highest)
            break;
        if (last_topic == NULL || f.tlen != last_tlen || memcmp(f.topic, last_topic, (size_t)f.tlen) != 0) {
            PyObject *key = PyBytes_FromStringAndSize((const char *)f.topic, f.tlen);
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
            keyed = PyTuple_Check(got);
            if (keyed) { /* a SOW topic: (topic, key paths, maker) */
                if (PyTuple_GET_SIZE(got) < 2 || !key_paths(PyTuple_GET_ITEM(got, 1), &kp)) {
                    Py_DECREF(key);
                    break; /* paths this scanner does not read: the ordinary path */
                }
                got = PyTuple_GET_ITEM(got, 0);
            }
            Py_DECREF(key);
            Py_INCREF(got);
            Py_XSETREF(topic_str, got);
            last_topic = f.topic;
            last_tlen = f.tlen;
        }
        const unsigned char *body = frame + hlen;
        Py_ssize_t blen = length - hlen;
        Py_ssize_t flen = 0;
        if (keyed) {
            flen = key_fragment(body, blen, &kp, &kbuf, &kcap);
            if (flen < 0) {
                if (PyErr_Occurred())
                    goto done;
                break; /* no key the fast path can make: the ordinary path keys or refuses it */
            }
        }
        Py_ssize_t extra = keyed ? 2 + flen : 0;
        Py_ssize_t total = RECORD_HEADER + extra + f.tlen + blen;
        if ((o - o0) + total > cap) {
            Py_ssize_t used = o - o0;
            cap = (used + total) * 2;
            if (_PyBytes_Resize(&records, cap) < 0)
                goto done;
            o0 = (unsigned char *)PyBytes_AS_STRING(records);
            o = o0 + used;
        }
        Py_ssize_t off = base + (o - o0);
        wr32(o, (uint32_t)(total - 4));
        o[8] = 1; /* kind: message */
        o[9] = keyed ? FLAG_HEADER : 0;
        o[10] = (unsigned char)f.tlen;
        o[11] = (unsigned char)(f.tlen >> 8);
        wr64(o + 12, pub);
        wr64(o + 20, f.seq);
        wr64(o + 28, ts);
        unsigned char *q = o + RECORD_HEADER;
        if (keyed) {
            q[0] = (unsigned char)flen;
            q[1] = (unsigned char)(flen >> 8);
            memcpy(q + 2, kbuf, (size_t)flen);
            q += extra;
        }
        memcpy(q, f.topic, (size_t)f.tlen);
        memcpy(q + f.tlen, body, (size_t)blen);
        wr32(o + 4, record_crc(o + 8, total - 8));
        o += total;
        PyObject *seq_o = PyLong_FromUnsignedLongLong(f.seq);
        PyObject *off_o = PyLong_FromSsize_t(off);
        PyObject *body_o = PyBytes_FromStringAndSize((const char *)body, blen);
        PyObject *hdr_o = keyed ? PyBytes_FromStringAndSize((const char *)kbuf, flen) : empty;
        if (!keyed)
            Py_INCREF(empty);
        PyObject *entry = NULL, *msg = NULL;
        if (seq_o && off_o && body_o && hdr_o) {
            entry = PyTuple_Pack(4, pub_o, seq_o, ts_o, off_o);
            PyObject *const row[BATCH_ROW_FIELDS] = {topic_str, pub_o, seq_o, ts_o,
                                                     body_o,    off_o, hdr_o, Py_None};
            msg = batch_row(row);
        }
        Py_XDECREF(seq_o);
        Py_XDECREF(off_o);
        Py_XDECREF(body_o);
        Py_XDECREF(hdr_o);
        int bad = entry == NULL || msg == NULL || PyList_Append(entries, entry) < 0 ||
                  PyList_Append(msgs, msg) < 0;
        Py_XDECREF(entry);
        Py_XDECREF(msg);
        if (bad)
            goto done;
        highest = f.seq;
        asked |= f.has_a;
        pos += 4 + length;
    }
    if (_PyBytes_Resize(&records, o - o0) < 0)
        goto done;
    result = Py_BuildValue("(OOOnKNO)", records, entries, msgs, pos, highest,
                           PyBool_FromLong(asked), unknown ? unknown : Py_None);
done:
    Py_XDECREF(records);
    Py_XDECREF(entries);
    Py_XDECREF(msgs);
    Py_XDECREF(pub_o);
    Py_XDECREF(ts_o);
    Py_XDECREF(empty);
    Py_XDECREF(topic_str);
    Py_XDECREF(unknown);
    PyMem_Free(kbuf);
    PyBuffer_Release(&raw);
    return result;
}

/* An unsigned 64-bit integer object's value ((unsigned long long)-1 and an error when it is
 * not one): where `unsigned long` is 64 bits, PyLong_AsUnsignedLong (a loop over the digits)
 * and not PyLong_AsUnsignedLongLong, which goes through a byte array past 2**30 -- receive
 * times and publisher ids always are. */
static inline unsigned long long as_u64(PyObject *o)
{
#if ULONG_MAX >= 0xFFFFFFFFFFFFFFFFULL
    return PyLong_AsUnsignedLong(o);
#else
    return PyLong_AsUnsignedLongLong(o);
#endif
}

/* store_rows(msgs, base, targets) -> rows written, or -1
 *     The SOW store's rows (server/sow/store.py: record key topic | 0x00 | key, value u64 BE
 *     position, publisher, sequence, receive time, u16 BE header fragment length, fragment,
 *     body) of committed batch rows `msgs` (topic, pub, seq, ts, body, offset, header fragment,
 *     expiration) whose data starts at journal position `base`, put into the dict of their
 *     topic: targets[topic] = (record key prefix, dict record key -> value); the latest row of
 *     a key wins. A row of a topic not in `targets` is skipped. -1 at the first row whose
 *     fragment is not exactly `,"k":"<key>"` with a key of plain text (no `\`): the rows before
 *     it are in (the caller applies the whole batch again, in order, the Python way). */
static PyObject *
store_rows(PyObject *self, PyObject *args)
{
    PyObject *msgs, *targets;
    Py_ssize_t base;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!nO!", &PyList_Type, &msgs, &base, &PyDict_Type, &targets))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(msgs), done = 0;
    PyObject *last_topic = NULL, *prefix = NULL, *into = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *m = PyList_GET_ITEM(msgs, i);
        /* a row with its own expiration (8th field) is applied the Python way: its record
         * keeps `e` and gets a timer (server/sow/manager.py) */
        if (!PyTuple_Check(m) || PyTuple_GET_SIZE(m) < 7 ||
            (PyTuple_GET_SIZE(m) > 7 && PyTuple_GET_ITEM(m, 7) != Py_None))
            return PyLong_FromLong(-1);
        PyObject *topic = PyTuple_GET_ITEM(m, 0);
        if (topic != last_topic) {
            PyObject *t = PyDict_GetItemWithError(targets, topic);
            if (t == NULL && PyErr_Occurred())
                return NULL;
            last_topic = topic;
            prefix = into = NULL;
            if (t != NULL) {
                if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 2 ||
                    !PyBytes_Check(PyTuple_GET_ITEM(t, 0)) || !PyDict_Check(PyTuple_GET_ITEM(t, 1))) {
                    PyErr_SetString(PyExc_TypeError, "targets: topic -> (bytes, dict)");
                    return NULL;
                }
                prefix = PyTuple_GET_ITEM(t, 0);
                into = PyTuple_GET_ITEM(t, 1);
            }
        }
        if (into == NULL)
            continue;
        PyObject *body = PyTuple_GET_ITEM(m, 4), *hdr = PyTuple_GET_ITEM(m, 6);
        if (!PyBytes_Check(body) || !PyBytes_Check(hdr))
            return PyLong_FromLong(-1);
        const char *h = PyBytes_AS_STRING(hdr);
        Py_ssize_t hlen = PyBytes_GET_SIZE(hdr);
        if (hlen < 8 || hlen > 0xFFFF || memcmp(h, ",\"k\":\"", 6) != 0 || h[hlen - 1] != '"' ||
            memchr(h + 6, '\\', (size_t)(hlen - 7)) != NULL ||
            memchr(h + 6, '"', (size_t)(hlen - 7)) != NULL)
            return PyLong_FromLong(-1);
        unsigned long long v[4]; /* position, publisher, sequence, receive time */
        Py_ssize_t off = PyLong_AsSsize_t(PyTuple_GET_ITEM(m, 5));
        if (off == -1 && PyErr_Occurred())
            return NULL;
        v[0] = (unsigned long long)(base + off);
        for (int j = 1; j < 4; j++) {
            v[j] = as_u64(PyTuple_GET_ITEM(m, j));
            if (v[j] == (unsigned long long)-1 && PyErr_Occurred())
                return NULL;
        }
        Py_ssize_t plen = PyBytes_GET_SIZE(prefix), klen = hlen - 7, blen = PyBytes_GET_SIZE(body);
        PyObject *key = PyBytes_FromStringAndSize(NULL, plen + klen);
        PyObject *val = PyBytes_FromStringAndSize(NULL, 34 + hlen + blen);
        if (key == NULL || val == NULL) {
            Py_XDECREF(key);
            Py_XDECREF(val);
            return NULL;
        }
        char *k = PyBytes_AS_STRING(key);
        memcpy(k, PyBytes_AS_STRING(prefix), (size_t)plen);
        memcpy(k + plen, h + 6, (size_t)klen);
        unsigned char *o = (unsigned char *)PyBytes_AS_STRING(val);
        for (int j = 0; j < 4; j++)
            for (int b = 0; b < 8; b++)
                o[j * 8 + b] = (unsigned char)(v[j] >> (56 - 8 * b));
        o[32] = (unsigned char)(hlen >> 8);
        o[33] = (unsigned char)hlen;
        memcpy(o + 34, h, (size_t)hlen);
        memcpy(o + 34 + hlen, PyBytes_AS_STRING(body), (size_t)blen);
        int bad = PyDict_SetItem(into, key, val);
        Py_DECREF(key);
        Py_DECREF(val);
        if (bad < 0)
            return NULL;
        done++;
    }
    return PyLong_FromSsize_t(done);
}

static PyObject *
configure(PyObject *self, PyObject *args)
{
    Py_ssize_t topic, cid;
    unsigned long long seq;
    const char *ack;
    Py_ssize_t ack_len;
    PyObject *fields, *row;
    (void)self;
    if (!PyArg_ParseTuple(args, "nnKy#O!O", &topic, &cid, &seq, &ack, &ack_len, &PyTuple_Type,
                          &fields, &row))
        return NULL;
    if (batch_row_check(row, "server/_publish.c") < 0)
        return NULL;
    if (ack_len < 0 || (size_t)ack_len > sizeof(fast_ack)) {
        PyErr_SetString(PyExc_ValueError, "the fast publish ack type is too long");
        return NULL;
    }
    int same = PyTuple_GET_SIZE(fields) == N_MEMBERS;
    for (Py_ssize_t i = 0; same && i < N_MEMBERS; i++) {
        PyObject *name = PyTuple_GET_ITEM(fields, i);
        same = PyBytes_Check(name) && strcmp(PyBytes_AS_STRING(name), MEMBERS[i]) == 0;
    }
    if (!same) {
        PyErr_SetString(PyExc_ValueError,
                        "server/_publish.c reads the members a, c, cid, s, t; protocol/headers.py "
                        "classifies other publish fields as fast: teach parse_header the new ones");
        return NULL;
    }
    max_topic = topic;
    max_cid = cid;
    if (seq > 9999999999999999999ULL) {
        PyErr_SetString(PyExc_ValueError, "max_seq must have at most 19 digits");
        return NULL;
    }
    max_seq = (uint64_t)seq;
    max_seq_digits = 0;
    for (uint64_t v = max_seq; v > 0; v /= 10)
        max_seq_digits++;
    memcpy(fast_ack, ack, (size_t)ack_len);
    fast_ack_len = ack_len;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(max_topic, max_cid, max_seq, ack, fields, row_type): the limits, the ack type, "
     "the sorted member names of protocol/headers.py's fast publish and the batch row type "
     "(server/batch_row.py's BatchRow, whose fields it checks); see server/publish_scan.py"},
    {"publish_span", publish_span, METH_VARARGS,
     "publish_span(buf, pos, max_size) -> end; see server/publish_scan.py"},
    {"publish_records", publish_records, METH_VARARGS,
     "publish_records(raw, pos, pub, ts, highest, known, base) -> (records, entries, msgs, "
     "stop, highest, asked, unknown); see server/publish_scan.py"},
    {"store_rows", store_rows, METH_VARARGS,
     "store_rows(msgs, base, targets) -> rows, or -1; see server/sow/store.py (rows)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "server._publish", "Plain publish frames to journal records (C).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__publish(void)
{
    return PyModule_Create(&module);
}
