/* Content filters evaluated over a block of journal records: the C twin of server/filter_scan.py.
 *
 * scan(buf, base, start, end, topic, program) walks the whole records at the start of `buf`
 * (journal/record.py's layout, as server/_splice.c walks them) and, for every message (kind 1)
 * on exactly `topic` at a position in [start, end), evaluates `program` (a filter compiled by
 * protocol/filters/program.py) on its body. It returns
 *
 *     (matched, unsure, stop_offset, last_pub, last_seq, at_end)
 *
 * matched and unsure are native u64 arrays (bytes, array('Q') layout) of positions, ascending:
 * the records the filter is TRUE for, and those this scanner cannot decide, which the caller
 * evaluates with the Python evaluator (the reference). The rest of the tuple is splice_frames'.
 *
 * The scanner decides only clean bodies: an object of ASCII text without backslashes, with
 * numbers it can read exactly (ints of up to 18 digits, finite floats) and no array in a field
 * the filter reads. Anything else (unicode, escapes, arrays, a numeric string compared with a
 * number, malformed JSON) is "unsure", so the answers are the Python evaluator's by
 * construction; the tests hold both to the same answers on random documents and filters.
 *
 * Program (little-endian): u8 nfields, then per field u16 len + name bytes; then ops, postfix:
 *   'C' u8 field u8 op const      compare (op: 0 =, 1 !=, 2 <, 3 <=, 4 >, 5 >=)
 *   'I' u8 field u16 n const*n     IN
 *   'L' u8 field u8 mode u16 len bytes   LIKE '^lit' (mode 0) or LIKE 'lit' (mode 1)
 *   'N' u8 field u8 negated        IS [NOT] NULL
 *   '!'                            NOT
 *   '&' u16 n / '|' u16 n          AND / OR of the n values on top of the stack
 * const: 'i' i64 | 'd' f64 | 's' u32 len bytes | 't' | 'f' | 'z' (NULL).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "../journal/_record.h"

#define MAX_FIELDS 16
#define MAX_OPS 256
#define MAX_STACK 64
#define MAX_DEPTH 64

enum { V_NULL, V_INT, V_FLOAT, V_STR, V_TRUE, V_FALSE, V_OBJ };
enum { T_FALSE = 0, T_TRUE = 1, T_UNKNOWN = 2, T_UNSURE = 3 };

typedef struct {
    int t;
    int64_t i;
    double d;
    const unsigned char *s;
    Py_ssize_t n;
} Val;

typedef struct {
    char op;
    unsigned char field, arg;
    Py_ssize_t n; /* count for 'I', '&', '|'; string length for 'L' */
    const unsigned char *p; /* 'C', 'I': the first const; 'L': the literal */
} Op;

typedef struct {
    int nfields;
    const unsigned char *name[MAX_FIELDS];
    Py_ssize_t name_len[MAX_FIELDS];
    int nops;
    Op ops[MAX_OPS];
} Program;

/* ---- the program ------------------------------------------------------------------------- */

/* The size of a const of a checked program. */
static inline Py_ssize_t const_len(const unsigned char *p) {
    return p[0] == 'i' || p[0] == 'd' ? 9 : p[0] == 's' ? 5 + (Py_ssize_t)rd32(p + 1) : 1;
}

static Py_ssize_t const_size(const unsigned char *p, const unsigned char *e) {
    if (p >= e)
        return -1;
    switch (p[0]) {
    case 'i':
    case 'd':
        return e - p >= 9 ? 9 : -1;
    case 's':
        if (e - p < 5)
            return -1;
        return e - p >= 5 + (Py_ssize_t)rd32(p + 1) ? 5 + (Py_ssize_t)rd32(p + 1) : -1;
    case 't':
    case 'f':
    case 'z':
        return 1;
    }
    return -1;
}

static int load_program(Program *pg, const unsigned char *p, Py_ssize_t len) {
    const unsigned char *e = p + len;
    int depth = 0;
    if (len < 1 || p[0] > MAX_FIELDS)
        return 0;
    pg->nfields = *p++;
    for (int i = 0; i < pg->nfields; i++) {
        if (e - p < 2 || e - p - 2 < rd16(p))
            return 0;
        pg->name_len[i] = rd16(p);
        pg->name[i] = p + 2;
        p += 2 + pg->name_len[i];
    }
    pg->nops = 0;
    while (p < e) {
        if (pg->nops >= MAX_OPS)
            return 0;
        Op *op = &pg->ops[pg->nops++];
        Py_ssize_t sz;
        op->op = (char)*p++;
        switch (op->op) {
        case 'C':
            if (e - p < 2 || p[0] >= pg->nfields || p[1] > 5)
                return 0;
            op->field = p[0];
            op->arg = p[1];
            op->p = p + 2;
            if ((sz = const_size(p + 2, e)) < 0)
                return 0;
            p += 2 + sz;
            depth++;
            break;
        case 'I':
            if (e - p < 3 || p[0] >= pg->nfields)
                return 0;
            op->field = p[0];
            op->n = rd16(p + 1);
            p += 3;
            op->p = p;
            for (Py_ssize_t k = 0; k < op->n; k++) {
                if ((sz = const_size(p, e)) < 0)
                    return 0;
                p += sz;
            }
            depth++;
            break;
        case 'L':
            if (e - p < 4 || p[0] >= pg->nfields || p[1] > 1 || e - p - 4 < rd16(p + 2))
                return 0;
            op->field = p[0];
            op->arg = p[1];
            op->n = rd16(p + 2);
            op->p = p + 4;
            p += 4 + op->n;
            depth++;
            break;
        case 'N':
            if (e - p < 2 || p[0] >= pg->nfields)
                return 0;
            op->field = p[0];
            op->arg = p[1];
            p += 2;
            depth++;
            break;
        case '!':
            if (depth < 1)
                return 0;
            break;
        case '&':
        case '|':
            if (e - p < 2)
                return 0;
            op->n = rd16(p);
            p += 2;
            if (op->n < 1 || op->n > depth)
                return 0;
            depth -= (int)op->n - 1;
            break;
        default:
            return 0;
        }
        if (depth > MAX_STACK)
            return 0;
    }
    return depth == 1;
}

/* ---- the body scanner -------------------------------------------------------------------- */

static inline const unsigned char *ws(const unsigned char *p, const unsigned char *e) {
    while (p < e && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    return p;
}

/* A string at p (p[0] == '"'): the end after its closing quote, NULL when it is not clean
   (an escape, a control or non-ASCII byte, no closing quote). */
static inline const unsigned char *clean_string(const unsigned char *p, const unsigned char *e) {
    p++;
    while (p < e) {
        unsigned char c = *p;
        if (c == '"')
            return p + 1;
        if (c == '\\' || c < 0x20 || c >= 0x80)
            return NULL;
        p++;
    }
    return NULL;
}

/* A JSON number at p: its end, NULL when malformed; *is_int when it has no fraction or
   exponent. */
static const unsigned char *number_end(const unsigned char *p, const unsigned char *e, int *is_int) {
    const unsigned char *q = p;
    *is_int = 1;
    if (q < e && *q == '-')
        q++;
    if (q >= e)
        return NULL;
    if (*q == '0')
        q++;
    else if (*q >= '1' && *q <= '9')
        while (q < e && *q >= '0' && *q <= '9')
            q++;
    else
        return NULL;
    if (q < e && *q == '.') {
        *is_int = 0;
        q++;
        if (q >= e || *q < '0' || *q > '9')
            return NULL;
        while (q < e && *q >= '0' && *q <= '9')
            q++;
    }
    if (q < e && (*q == 'e' || *q == 'E')) {
        *is_int = 0;
        q++;
        if (q < e && (*q == '+' || *q == '-'))
            q++;
        if (q >= e || *q < '0' || *q > '9')
            return NULL;
        while (q < e && *q >= '0' && *q <= '9')
            q++;
    }
    return q;
}

/* After an object's '{' or ',': a key and its ':'; the end, NULL when not clean. */
static inline const unsigned char *member_key(const unsigned char *p, const unsigned char *e) {
    p = ws(p, e);
    if (p >= e || *p != '"' || (p = clean_string(p, e)) == NULL)
        return NULL;
    p = ws(p, e);
    if (p >= e || *p != ':')
        return NULL;
    return p + 1;
}

/* Skip one value at p: its end, NULL when not clean. Read values go through read_value. */
static const unsigned char *skip_value(const unsigned char *p, const unsigned char *e) {
    unsigned char open[MAX_DEPTH]; /* the containers p is in, innermost last */
    int depth = 0, is_int;
    for (;;) {
        p = ws(p, e);
        if (p >= e)
            return NULL;
        unsigned char c = *p;
        if (c == '{' || c == '[') {
            if (depth == MAX_DEPTH)
                return NULL;
            open[depth++] = c;
            p = ws(p + 1, e);
            if (p < e && *p == (c == '{' ? '}' : ']')) {
                p++;
                depth--;
            } else {
                if (c == '{' && (p = member_key(p, e)) == NULL)
                    return NULL;
                continue;
            }
        } else {
            if (c == '"')
                p = clean_string(p, e);
            else if (c == '-' || (c >= '0' && c <= '9'))
                p = number_end(p, e, &is_int);
            else if (e - p >= 4 && memcmp(p, "true", 4) == 0)
                p += 4;
            else if (e - p >= 5 && memcmp(p, "false", 5) == 0)
                p += 5;
            else if (e - p >= 4 && memcmp(p, "null", 4) == 0)
                p += 4;
            else
                return NULL;
            if (p == NULL)
                return NULL;
        }
        /* after a value: the containers it closes, then ',' and the next value (or member) */
        for (;;) {
            if (depth == 0)
                return p;
            p = ws(p, e);
            if (p >= e)
                return NULL;
            unsigned char o = open[depth - 1];
            if (*p == (o == '{' ? '}' : ']')) {
                p++;
                depth--;
                continue;
            }
            if (*p != ',')
                return NULL;
            p++;
            if (o == '{' && (p = member_key(p, e)) == NULL)
                return NULL;
            break;
        }
    }
}

/* Read the value at p into *v; the end, NULL when not clean (then the record is unsure). */
static const unsigned char *read_value(const unsigned char *p, const unsigned char *e, Val *v) {
    unsigned char c = *p;
    int is_int;
    if (c == '"') {
        const unsigned char *q = clean_string(p, e);
        if (q == NULL)
            return NULL;
        v->t = V_STR;
        v->s = p + 1;
        v->n = q - p - 2;
        return q;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        const unsigned char *q = number_end(p, e, &is_int);
        if (q == NULL)
            return NULL;
        Py_ssize_t n = q - p;
        char tmp[64];
        if (n >= (Py_ssize_t)sizeof tmp)
            return NULL;
        memcpy(tmp, p, (size_t)n);
        tmp[n] = 0;
        if (is_int) {
            if (n - (c == '-') > 18)
                return NULL;
            v->t = V_INT;
            v->i = strtoll(tmp, NULL, 10);
        } else {
            double d = strtod(tmp, NULL);
            /* out of range, or so small it rounds to zero: let Python say what it reads */
            if (!isfinite(d) || (d == 0.0 && strpbrk(tmp, "123456789") != NULL))
                return NULL;
            v->t = V_FLOAT;
            v->d = d;
        }
        return q;
    }
    if (c == '{') {
        const unsigned char *q = skip_value(p, e);
        if (q == NULL)
            return NULL;
        v->t = V_OBJ;
        return q;
    }
    if (e - p >= 4 && memcmp(p, "true", 4) == 0) {
        v->t = V_TRUE;
        return p + 4;
    }
    if (e - p >= 5 && memcmp(p, "false", 5) == 0) {
        v->t = V_FALSE;
        return p + 5;
    }
    if (e - p >= 4 && memcmp(p, "null", 4) == 0) {
        v->t = V_NULL;
        return p + 4;
    }
    return NULL; /* an array (any-element rules) or malformed */
}

/* The values of the program's fields in the body (last occurrence wins, as in a decoded
   dict); 0 when the body is not clean. */
static int scan_body(const Program *pg, const unsigned char *p, const unsigned char *e, Val *vals) {
    for (int i = 0; i < pg->nfields; i++)
        vals[i].t = V_NULL;
    p = ws(p, e);
    if (p >= e || *p != '{')
        return 0;
    p = ws(p + 1, e);
    if (p < e && *p == '}')
        return ws(p + 1, e) == e;
    for (;;) {
        if (p >= e || *p != '"')
            return 0;
        const unsigned char *k = p + 1;
        const unsigned char *q = clean_string(p, e);
        if (q == NULL)
            return 0;
        Py_ssize_t klen = q - k - 1;
        p = ws(q, e);
        if (p >= e || *p != ':')
            return 0;
        p = ws(p + 1, e);
        if (p >= e)
            return 0;
        int f = -1;
        for (int i = 0; i < pg->nfields; i++)
            if (pg->name_len[i] == klen && memcmp(pg->name[i], k, (size_t)klen) == 0) {
                f = i;
                break;
            }
        p = f >= 0 ? read_value(p, e, &vals[f]) : skip_value(p, e);
        if (p == NULL)
            return 0;
        p = ws(p, e);
        if (p < e && *p == ',') {
            p = ws(p + 1, e);
            continue;
        }
        if (p < e && *p == '}')
            return ws(p + 1, e) == e;
        return 0;
    }
}

/* ---- evaluation -------------------------------------------------------------------------- */

static inline int is_num(int t) { return t == V_INT || t == V_FLOAT; }
static inline int is_bool(int t) { return t == V_TRUE || t == V_FALSE; }

static Val load_const(const unsigned char *p) {
    Val c;
    memset(&c, 0, sizeof c);
    switch (p[0]) {
    case 'i':
        c.t = V_INT;
        c.i = (int64_t)rd64(p + 1);
        break;
    case 'd': {
        uint64_t u = rd64(p + 1);
        c.t = V_FLOAT;
        memcpy(&c.d, &u, sizeof c.d);
        break;
    }
    case 's':
        c.t = V_STR;
        c.n = rd32(p + 1);
        c.s = p + 5;
        break;
    case 't':
        c.t = V_TRUE;
        break;
    case 'f':
        c.t = V_FALSE;
        break;
    default:
        c.t = V_NULL;
    }
    return c;
}

static inline int apply(int op, int sign) {
    switch (op) {
    case 0: return sign == 0;
    case 1: return sign != 0;
    case 2: return sign < 0;
    case 3: return sign <= 0;
    case 4: return sign > 0;
    default: return sign >= 0;
    }
}

#define EXACT_DOUBLE (INT64_C(1) << 53)

/* Three-valued `v op c` by kernels.py's scalar rules; T_UNSURE where they need Python. */
static int compare(const Val *v, int op, const Val *c) {
    if (v->t == V_NULL || v->t == V_OBJ || c->t == V_NULL)
        return T_UNKNOWN;
    if (v->t == V_STR && c->t == V_STR) {
        Py_ssize_t n = v->n < c->n ? v->n : c->n;
        int r = memcmp(v->s, c->s, (size_t)n);
        int sign = r != 0 ? (r < 0 ? -1 : 1) : (v->n < c->n ? -1 : v->n > c->n);
        return apply(op, sign);
    }
    if (is_num(v->t) && is_num(c->t)) {
        int sign;
        if (v->t == V_INT && c->t == V_INT)
            sign = v->i < c->i ? -1 : v->i > c->i;
        else {
            double a = v->t == V_INT ? (double)v->i : v->d;
            double b = c->t == V_INT ? (double)c->i : c->d;
            if ((v->t == V_INT && (v->i > EXACT_DOUBLE || v->i < -EXACT_DOUBLE)) ||
                (c->t == V_INT && (c->i > EXACT_DOUBLE || c->i < -EXACT_DOUBLE)))
                return T_UNSURE; /* Python compares int and float exactly */
            sign = a < b ? -1 : a > b;
        }
        return apply(op, sign);
    }
    if (is_bool(v->t) && is_bool(c->t)) {
        if (op > 1)
            return T_UNKNOWN;
        return apply(op, v->t != c->t);
    }
    if (is_bool(v->t) || is_bool(c->t))
        return op == 0 ? T_FALSE : op == 1 ? T_TRUE : T_UNKNOWN;
    return T_UNSURE; /* a string against a number: numeric strings compare as numbers */
}

static int like(const Val *v, const Op *op) {
    if (v->t != V_STR)
        return T_UNKNOWN; /* NULL, numbers, booleans, objects: LIKE is for strings */
    if (op->arg == 0)
        return v->n >= op->n && memcmp(v->s, op->p, (size_t)op->n) == 0;
    if (op->n == 0)
        return T_TRUE;
    for (Py_ssize_t i = 0; i + op->n <= v->n; i++)
        if (v->s[i] == op->p[0] && memcmp(v->s + i, op->p, (size_t)op->n) == 0)
            return T_TRUE;
    return T_FALSE;
}

static int run(const Program *pg, const Val *vals) {
    int stack[MAX_STACK];
    int sp = 0;
    for (int k = 0; k < pg->nops; k++) {
        const Op *op = &pg->ops[k];
        switch (op->op) {
        case 'C': {
            Val c = load_const(op->p);
            stack[sp++] = compare(&vals[op->field], op->arg, &c);
            break;
        }
        case 'I': {
            const Val *v = &vals[op->field];
            int r = T_FALSE;
            if (v->t == V_NULL) {
                r = T_UNKNOWN;
            } else {
                const unsigned char *p = op->p;
                for (Py_ssize_t i = 0; i < op->n; i++) {
                    Val c = load_const(p);
                    p += const_len(p);
                    int x = compare(v, 0, &c);
                    if (x == T_TRUE) {
                        r = T_TRUE;
                        break;
                    }
                    if (x > r)
                        r = x;
                }
            }
            stack[sp++] = r;
            break;
        }
        case 'L':
            stack[sp++] = like(&vals[op->field], op);
            break;
        case 'N':
            stack[sp++] = (vals[op->field].t == V_NULL) != (op->arg != 0);
            break;
        case '!': {
            int x = stack[sp - 1];
            stack[sp - 1] = x == T_TRUE ? T_FALSE : x == T_FALSE ? T_TRUE : x;
            break;
        }
        default: { /* '&' or '|': the absorbing value wins, then unsure, unknown */
            int absorb = op->op == '&' ? T_FALSE : T_TRUE;
            int r = op->op == '&' ? T_TRUE : T_FALSE;
            for (Py_ssize_t i = 0; i < op->n; i++) {
                int x = stack[sp - 1 - i];
                if (x == absorb) {
                    r = absorb;
                    break;
                }
                if (x == T_UNSURE || (x == T_UNKNOWN && r != T_UNSURE))
                    r = x;
            }
            sp -= (int)op->n;
            stack[sp++] = r;
        }
        }
    }
    return stack[0];
}

/* ---- the block walk ---------------------------------------------------------------------- */

typedef struct {
    uint64_t *p;
    Py_ssize_t n, cap;
} Positions;

static int push(Positions *a, uint64_t v) {
    if (a->n == a->cap) {
        Py_ssize_t cap = a->cap ? a->cap * 2 : 256;
        uint64_t *p = realloc(a->p, (size_t)cap * sizeof *p);
        if (p == NULL)
            return 0;
        a->p = p;
        a->cap = cap;
    }
    a->p[a->n++] = v;
    return 1;
}

/* The program in `prog`, loaded into memory of its own (PyMem_Free it); NULL with the error
   set when there is no memory or the program is malformed. */
static Program *new_program(const Py_buffer *prog) {
    Program *pg = PyMem_Malloc(sizeof *pg);
    if (pg == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    if (!load_program(pg, prog->buf, prog->len)) {
        PyErr_SetString(PyExc_ValueError, "malformed filter program");
        PyMem_Free(pg);
        return NULL;
    }
    return pg;
}

static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer buf, topic, prog;
    long long base, start, end;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*LLLy*y*", &buf, &base, &start, &end, &topic, &prog))
        return NULL;
    PyObject *result = NULL;
    Positions hit = {0}, unsure = {0};
    Program *pg = new_program(&prog);
    if (pg == NULL)
        goto done;
    const unsigned char *in = buf.buf;
    Py_ssize_t n = buf.len;
    BlockWalk w = {0};
    RecordFields f;
    int nomem = 0;
    Val vals[MAX_FIELDS];
    Py_BEGIN_ALLOW_THREADS
    while (walk_next(&w, in, n, base, end, &f)) {
        Py_ssize_t off = w.off, tlen = f.tlen, t = off + f.topic, nxt = off + f.total;
        if (f.kind == KIND_MESSAGE && tlen == topic.len && base + off >= start &&
            memcmp(in + t, topic.buf, (size_t)tlen) == 0) {
            int x = scan_body(pg, in + t + tlen, in + nxt, vals) ? run(pg, vals) : T_UNSURE;
            if ((x == T_TRUE && !push(&hit, (uint64_t)(base + off))) ||
                (x == T_UNSURE && !push(&unsure, (uint64_t)(base + off)))) {
                nomem = 1;
                break;
            }
        }
        w.off = nxt;
    }
    Py_END_ALLOW_THREADS
    if (nomem) {
        PyErr_NoMemory();
        goto done;
    }
    if (w.bad) {
        PyErr_Format(PyExc_ValueError, "bad record at offset %zd: its fields run past its length",
                     w.off);
        goto done;
    }
    PyObject *last_p = w.have_last ? PyLong_FromUnsignedLongLong(w.last_pub) : Py_NewRef(Py_None);
    PyObject *last_s = w.have_last ? PyLong_FromUnsignedLongLong(w.last_seq) : Py_NewRef(Py_None);
    /* y# of a NULL pointer gives None: an empty array is b"" */
    result = Py_BuildValue("(y#y#nNNO)", hit.p ? (const char *)hit.p : "",
                           hit.n * (Py_ssize_t)sizeof(uint64_t),
                           unsure.p ? (const char *)unsure.p : "",
                           unsure.n * (Py_ssize_t)sizeof(uint64_t), w.off, last_p, last_s,
                           w.at_end ? Py_True : Py_False);
done:
    free(hit.p);
    free(unsure.p);
    PyMem_Free(pg);
    PyBuffer_Release(&buf);
    PyBuffer_Release(&topic);
    PyBuffer_Release(&prog);
    return result;
}

/* scan_values(items, program) -> (matched, unsure): the filter over SOW store values, for a
   query's answer (server/sow/query.py). items is a list of (record key, value) pairs
   (server/sow/store.py's value layout: 32 bytes of u64s, u16 BE H, H bytes fragment, body);
   matched and unsure are native u64 arrays (array('Q') bytes) of the indices, ascending, of the
   items whose body the filter is TRUE for and of those this scanner cannot decide (the caller
   evaluates those with the Python evaluator, as for scan). A value too short for its fields
   raises ValueError. */
static PyObject *scan_values(PyObject *self, PyObject *args) {
    PyObject *items;
    Py_buffer prog;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!y*", &PyList_Type, &items, &prog))
        return NULL;
    PyObject *result = NULL;
    Positions hit = {0}, unsure = {0};
    Program *pg = new_program(&prog);
    if (pg == NULL)
        goto done;
    Val vals[MAX_FIELDS];
    Py_ssize_t count = PyList_GET_SIZE(items);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *it = PyList_GET_ITEM(items, i);
        if (!PyTuple_Check(it) || PyTuple_GET_SIZE(it) != 2 ||
            !PyBytes_Check(PyTuple_GET_ITEM(it, 1))) {
            PyErr_SetString(PyExc_TypeError, "scan_values: items must be (bytes, bytes) pairs");
            goto done;
        }
        PyObject *value = PyTuple_GET_ITEM(it, 1);
        const unsigned char *v = (const unsigned char *)PyBytes_AS_STRING(value);
        Py_ssize_t vlen = PyBytes_GET_SIZE(value);
        Py_ssize_t at = vlen >= 34 ? 34 + (((Py_ssize_t)v[32] << 8) | v[33]) : vlen + 1;
        if (at > vlen) {
            PyErr_Format(PyExc_ValueError,
                         "SOW store value of %zd bytes is too short for its fields", vlen);
            goto done;
        }
        int x = scan_body(pg, v + at, v + vlen, vals) ? run(pg, vals) : T_UNSURE;
        if ((x == T_TRUE && !push(&hit, (uint64_t)i)) ||
            (x == T_UNSURE && !push(&unsure, (uint64_t)i))) {
            PyErr_NoMemory();
            goto done;
        }
    }
    result = Py_BuildValue("(y#y#)", hit.p ? (const char *)hit.p : "",
                           hit.n * (Py_ssize_t)sizeof(uint64_t),
                           unsure.p ? (const char *)unsure.p : "",
                           unsure.n * (Py_ssize_t)sizeof(uint64_t));
done:
    free(hit.p);
    free(unsure.p);
    PyMem_Free(pg);
    PyBuffer_Release(&prog);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS,
     "scan(buf, base, start, end, topic, program) -> (matched, unsure, stop_offset, last_pub, "
     "last_seq, at_end); see server/filter_scan.py"},
    {"scan_values", scan_values, METH_VARARGS,
     "scan_values(items, program) -> (matched, unsure): indices of SOW store values; see "
     "server/sow/answer.py"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "server._filterscan",
    "Content filters evaluated over blocks of journal records (C).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__filterscan(void) { return PyModule_Create(&module); }
