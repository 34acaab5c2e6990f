/* The SOW key of a publish, computed from the body's text: part of server/_publish.c (its only
 * includer), kept apart because it is a JSON walker of its own. server/sow/keys.py owns the
 * key's format; tests/server/test_publish_scan.py holds this to it, byte for byte.
 */
#ifndef TICKERTAPE_SOWKEY_H
#define TICKERTAPE_SOWKEY_H

/* ---- SOW keys (server/sow/keys.py) --------------------------------------------------------
 * A frame to a SOW topic (its `known` value a tuple (topic, paths, maker); paths: per <Key>
 * path its member names as bytes) gets the record key k = base64url, unpadded, of the JSON
 * array of the values at those paths, the header fragment `,"k":"<k>"` (flag 2). Taken only
 * when the text makes the same key as the Python path (msgspec decode, re-encode): the body is
 * strict JSON (validated whole: UTF-8, escapes, numbers) of at most MAX_DEPTH levels, and each
 * key value is a string without `\`, an integer without fraction, exponent or "-0", true or
 * false, found once. Anything else (a missing key, null, an escaped member name, a duplicate
 * member on a key path, ...) stops the run there: the ordinary path keys or refuses it. */

#define MAX_PATHS 8
#define MAX_STEPS 8
#define MAX_DEPTH 32
#define MAX_NUMBER 32 /* longer numbers (and exponents) go to the ordinary path: range errors */

typedef struct {
    int n;
    int len[MAX_PATHS];
    const char *step[MAX_PATHS][MAX_STEPS];
    Py_ssize_t slen[MAX_PATHS][MAX_STEPS];
    const unsigned char *val[MAX_PATHS]; /* the value's text, once found */
    Py_ssize_t vlen[MAX_PATHS];
} KeyPaths;

/* paths from a tuple of tuples of bytes; 0 when they do not fit (the topic is then not fast) */
static int key_paths(PyObject *paths, KeyPaths *kp) {
    if (!PyTuple_Check(paths) || PyTuple_GET_SIZE(paths) < 1 || PyTuple_GET_SIZE(paths) > MAX_PATHS)
        return 0;
    kp->n = (int)PyTuple_GET_SIZE(paths);
    for (int i = 0; i < kp->n; i++) {
        PyObject *steps = PyTuple_GET_ITEM(paths, i);
        if (!PyTuple_Check(steps) || PyTuple_GET_SIZE(steps) < 1 || PyTuple_GET_SIZE(steps) > MAX_STEPS)
            return 0;
        kp->len[i] = (int)PyTuple_GET_SIZE(steps);
        for (int j = 0; j < kp->len[i]; j++) {
            PyObject *s = PyTuple_GET_ITEM(steps, j);
            if (!PyBytes_Check(s))
                return 0;
            kp->step[i][j] = PyBytes_AS_STRING(s);
            kp->slen[i][j] = PyBytes_GET_SIZE(s);
        }
    }
    return 1;
}

static inline const unsigned char *skip_ws(const unsigned char *p, const unsigned char *end) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    return p;
}

static inline int hexval(unsigned char c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Whether the 8 bytes at p are all plain ASCII text of a string (0x20..0x7F, not '"' nor '\\'),
   which the loop below would only step over: bodies are mostly such runs. The word tests may
   say no for a plain run (a borrow across bytes), never yes for one that is not. */
static inline int plain8(const unsigned char *p) {
    const uint64_t ones = 0x0101010101010101ULL, high = 0x8080808080808080ULL;
    uint64_t v, q, b;
    memcpy(&v, p, 8);
    q = v ^ (ones * '"');
    b = v ^ (ones * '\\');
    return ((v | ((v - ones * 0x20) & ~v) | ((q - ones) & ~q) | ((b - ones) & ~b)) & high) == 0;
}

/* A JSON string at p (its opening quote); the end (after the closing quote) or NULL. *esc:
   whether it had a backslash. Valid UTF-8 only; \u escapes of surrogates are refused. */
static const unsigned char *json_string(const unsigned char *p, const unsigned char *end, int *esc) {
    p++;
    *esc = 0;
    while (p < end) {
        if (end - p >= 8 && plain8(p)) {
            p += 8;
            continue;
        }
        unsigned char c = *p;
        if (c == '"')
            return p + 1;
        if (c < 0x20)
            return NULL;
        if (c == '\\') {
            *esc = 1;
            if (++p >= end)
                return NULL;
            c = *p;
            if (c == 'u') {
                if (end - p < 5)
                    return NULL;
                int v = 0;
                for (int i = 1; i <= 4; i++) {
                    int h = hexval(p[i]);
                    if (h < 0)
                        return NULL;
                    v = v * 16 + h;
                }
                if (v >= 0xD800 && v <= 0xDFFF)
                    return NULL;
                p += 5;
            } else if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' ||
                       c == 'r' || c == 't') {
                p++;
            } else {
                return NULL;
            }
        } else if (c < 0x80) {
            p++;
        } else {
            int n;
            uint32_t cp;
            if (c >= 0xC2 && c <= 0xDF) {
                n = 1;
                cp = c & 0x1F;
            } else if (c >= 0xE0 && c <= 0xEF) {
                n = 2;
                cp = c & 0x0F;
            } else if (c >= 0xF0 && c <= 0xF4) {
                n = 3;
                cp = c & 0x07;
            } else {
                return NULL;
            }
            if (end - p <= n)
                return NULL;
            for (int i = 1; i <= n; i++) {
                if ((p[i] & 0xC0) != 0x80)
                    return NULL;
                cp = (cp << 6) | (p[i] & 0x3F);
            }
            if ((n == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
                (n == 3 && (cp < 0x10000 || cp > 0x10FFFF)))
                return NULL;
            p += n + 1;
        }
    }
    return NULL;
}

/* A JSON number at p; its end or NULL. *integer: no fraction, no exponent, not "-0". */
static const unsigned char *json_number(const unsigned char *p, const unsigned char *end, int *integer) {
    const unsigned char *s = p;
    *integer = 1;
    if (p < end && *p == '-')
        p++;
    if (p >= end)
        return NULL;
    if (*p == '0') {
        p++;
        if (p - s == 2)
            *integer = 0; /* -0: decoded as 0, re-encoded as "0" */
    } else if (*p >= '1' && *p <= '9') {
        while (p < end && *p >= '0' && *p <= '9')
            p++;
    } else {
        return NULL;
    }
    if (p < end && *p == '.') {
        *integer = 0;
        p++;
        if (p >= end || *p < '0' || *p > '9')
            return NULL;
        while (p < end && *p >= '0' && *p <= '9')
            p++;
    }
    if (p < end && (*p == 'e' || *p == 'E'))
        return NULL; /* exponents: range errors are the ordinary path's to report */
    if (p - s > MAX_NUMBER)
        return NULL;
    return p;
}

/* One JSON value at p (no leading white space); its end or NULL. `mask`: the paths whose first
   `depth` steps name the containers around it; a value whose path is complete is noted in kp
   (a key value must be a plain scalar, found once). */
static const unsigned char *json_value(const unsigned char *p, const unsigned char *end, int depth,
                                       unsigned mask, KeyPaths *kp) {
    if (p >= end || depth > MAX_DEPTH)
        return NULL;
    unsigned char c = *p;
    if (c == '{') {
        unsigned seen = 0; /* paths whose step at this depth a member here already named */
        p = skip_ws(p + 1, end);
        if (p < end && *p == '}')
            return p + 1;
        for (;;) {
            if (p >= end || *p != '"')
                return NULL;
            int esc;
            const unsigned char *name = p + 1, *q = json_string(p, end, &esc);
            if (q == NULL)
                return NULL;
            Py_ssize_t nlen = q - 1 - name;
            unsigned sub = 0;
            if (mask) {
                if (esc)
                    return NULL; /* an escaped name may decode to a key path's step */
                for (int i = 0; i < kp->n; i++) {
                    if ((mask >> i & 1u) && kp->len[i] > depth && kp->slen[i][depth] == nlen &&
                        memcmp(kp->step[i][depth], name, (size_t)nlen) == 0)
                        sub |= 1u << i;
                }
                if (sub & seen)
                    return NULL; /* a duplicate member: the decoder keeps the last one */
                seen |= sub;
            }
            p = skip_ws(q, end);
            if (p >= end || *p != ':')
                return NULL;
            p = skip_ws(p + 1, end);
            const unsigned char *v = p;
            p = json_value(p, end, depth + 1, sub, kp);
            if (p == NULL)
                return NULL;
            for (int i = 0; sub && i < kp->n; i++) {
                if ((sub >> i & 1u) && kp->len[i] == depth + 1) {
                    int ok = 0, integer;
                    if (*v == '"') {
                        int e2;
                        ok = json_string(v, end, &e2) == p && !e2;
                    } else if (*v == '-' || (*v >= '0' && *v <= '9')) {
                        ok = json_number(v, end, &integer) == p && integer;
                    } else {
                        ok = (p - v == 4 && memcmp(v, "true", 4) == 0) ||
                             (p - v == 5 && memcmp(v, "false", 5) == 0);
                    }
                    if (!ok)
                        return NULL; /* null, an object, an array, a float: ordinary path */
                    kp->val[i] = v;
                    kp->vlen[i] = p - v;
                }
            }
            p = skip_ws(p, end);
            if (p < end && *p == ',') {
                p = skip_ws(p + 1, end);
                continue;
            }
            if (p < end && *p == '}')
                return p + 1;
            return NULL;
        }
    }
    if (c == '[') {
        p = skip_ws(p + 1, end);
        if (p < end && *p == ']')
            return p + 1;
        for (;;) {
            p = json_value(p, end, depth + 1, 0, kp);
            if (p == NULL)
                return NULL;
            p = skip_ws(p, end);
            if (p < end && *p == ',') {
                p = skip_ws(p + 1, end);
                continue;
            }
            if (p < end && *p == ']')
                return p + 1;
            return NULL;
        }
    }
    if (c == '"') {
        int esc;
        return json_string(p, end, &esc);
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        int integer;
        return json_number(p, end, &integer);
    }
    if (end - p >= 4 && (memcmp(p, "true", 4) == 0 || memcmp(p, "null", 4) == 0))
        return p + 4;
    if (end - p >= 5 && memcmp(p, "false", 5) == 0)
        return p + 5;
    return NULL;
}

static const char B64URL[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/* The header fragment `,"k":"<key>"` of `body` into *buf (grown as needed); its length, or -1
   when the body is not one the fast path keys (or on a memory error, with the error set). */
static Py_ssize_t key_fragment(const unsigned char *body, Py_ssize_t blen, KeyPaths *kp,
                               unsigned char **buf, Py_ssize_t *cap) {
    for (int i = 0; i < kp->n; i++)
        kp->val[i] = NULL;
    const unsigned char *end = body + blen;
    const unsigned char *p = skip_ws(body, end);
    if (p >= end || *p != '{')
        return -1;
    p = json_value(p, end, 0, (1u << kp->n) - 1, kp);
    if (p == NULL || skip_ws(p, end) != end)
        return -1;
    Py_ssize_t jlen = 1 + kp->n; /* [ , ... ] */
    for (int i = 0; i < kp->n; i++) {
        if (kp->val[i] == NULL)
            return -1; /* no value at a key path */
        jlen += kp->vlen[i];
    }
    Py_ssize_t need = jlen + 7 + (jlen + 2) / 3 * 4 + 1;
    if (need > 0xFFFF)
        return -1; /* longer than a header fragment holds: the ordinary path says so */
    if (need > *cap) {
        unsigned char *nb = PyMem_Realloc(*buf, (size_t)need * 2);
        if (nb == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        *buf = nb;
        *cap = need * 2;
    }
    /* the JSON text at the end of buf, its base64 at the start (no overlap: need has both) */
    unsigned char *json = *buf + need - jlen, *j = json;
    *j++ = '[';
    for (int i = 0; i < kp->n; i++) {
        if (i)
            *j++ = ',';
        memcpy(j, kp->val[i], (size_t)kp->vlen[i]);
        j += kp->vlen[i];
    }
    *j++ = ']';
    unsigned char *o = *buf;
    memcpy(o, ",\"k\":\"", 6);
    o += 6;
    Py_ssize_t i = 0;
    for (; i + 3 <= jlen; i += 3) {
        uint32_t v = ((uint32_t)json[i] << 16) | ((uint32_t)json[i + 1] << 8) | json[i + 2];
        *o++ = (unsigned char)B64URL[v >> 18];
        *o++ = (unsigned char)B64URL[(v >> 12) & 63];
        *o++ = (unsigned char)B64URL[(v >> 6) & 63];
        *o++ = (unsigned char)B64URL[v & 63];
    }
    if (jlen - i == 1) {
        uint32_t v = (uint32_t)json[i] << 16;
        *o++ = (unsigned char)B64URL[v >> 18];
        *o++ = (unsigned char)B64URL[(v >> 12) & 63];
    } else if (jlen - i == 2) {
        uint32_t v = ((uint32_t)json[i] << 16) | ((uint32_t)json[i + 1] << 8);
        *o++ = (unsigned char)B64URL[v >> 18];
        *o++ = (unsigned char)B64URL[(v >> 12) & 63];
        *o++ = (unsigned char)B64URL[(v >> 6) & 63];
    }
    *o++ = '"';
    return o - *buf;
}

#endif
