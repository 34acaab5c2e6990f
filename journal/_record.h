/* The journal record's layout for the C accelerators (journal/record.py owns the format and
 * documents it): header size, kinds, flags, the little-endian fields, the one walk of a record
 * (record_next), the walk of a block of records up to a position (walk_next), and the record
 * crc32.
 *
 * Included by journal/_verify.c and server/_publish.c, _replicate.c, _splice.c, _sowfold.h,
 * _filterscan.c.
 * A module that computes crcs defines RECORD_CRC before including it and links ISA-L (with
 * HAVE_ISAL) or zlib, as setup.py's _with_crc builds it.
 */
#ifndef TICKERTAPE_RECORD_H
#define TICKERTAPE_RECORD_H

#include <stdint.h>

#define RECORD_HEADER 36 /* u32 length, u32 crc, u8 kind, u8 flags, u16 topic length, 3 x u64 */
#define KIND_MESSAGE 1
#define FLAG_EXPIRATION 1
#define FLAG_HEADER 2
#define FLAG_ORIGIN 4
#define KNOWN_FLAGS 7u

static inline uint16_t rd16(const unsigned char *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t rd32(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t rd64(const unsigned char *p) {
    return (uint64_t)rd32(p) | ((uint64_t)rd32(p + 4) << 32);
}
static inline void wr32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}
static inline void wr64(unsigned char *p, uint64_t v) {
    wr32(p, (uint32_t)v);
    wr32(p + 4, (uint32_t)(v >> 32));
}

/* One record's fields, as offsets from its start (journal/record.py's layout). */
typedef struct {
    Py_ssize_t total;         /* 4 + length: where the next record starts */
    unsigned kind, flags;
    Py_ssize_t tlen, topic;   /* topic at [topic, topic + tlen); the body runs from there to total */
    Py_ssize_t hdr, hlen;     /* header fragment (flags & FLAG_HEADER), else 0, 0 */
    Py_ssize_t origin, olen;  /* origin block (u64 time, N, name, G, group; flags & FLAG_ORIGIN) */
    uint32_t exp;             /* expiration seconds (flags & FLAG_EXPIRATION), else 0 */
    uint64_t pub, seq, ts;
} RecordFields;

#define RECORD_SHORT (-1) /* the record runs past the bytes there: a caller reads more */
#define RECORD_BAD 0      /* its length cannot hold its header, or its fields run past it */
#define RECORD_WHOLE 1

/* The one walk of a record for every C accelerator: the record at p, with `avail` bytes there.
 * RECORD_WHOLE with *r filled when it is whole and its optional fields and topic fit in its
 * length. Kind and unknown flag bits are the caller's to judge (the checks on read refuse them;
 * the walks after those checks need not look again). */
static inline int record_next(const unsigned char *p, Py_ssize_t avail, RecordFields *r) {
    if (avail < RECORD_HEADER)
        return RECORD_SHORT;
    Py_ssize_t total = 4 + (Py_ssize_t)rd32(p);
    if (total > avail)
        return RECORD_SHORT;
    if (total < RECORD_HEADER)
        return RECORD_BAD;
    unsigned flags = p[9];
    Py_ssize_t at = RECORD_HEADER;
    r->total = total;
    r->kind = p[8];
    r->flags = flags;
    r->tlen = (Py_ssize_t)rd16(p + 10);
    r->pub = rd64(p + 12);
    r->seq = rd64(p + 20);
    r->ts = rd64(p + 28);
    r->exp = 0;
    r->hdr = r->hlen = r->origin = r->olen = 0;
    if (flags & FLAG_EXPIRATION) {
        if (at + 4 > total)
            return RECORD_BAD;
        r->exp = rd32(p + at);
        at += 4;
    }
    if (flags & FLAG_HEADER) {
        if (at + 2 > total)
            return RECORD_BAD;
        r->hlen = (Py_ssize_t)rd16(p + at);
        r->hdr = at + 2;
        at += 2 + r->hlen;
    }
    if (flags & FLAG_ORIGIN) {
        if (at + 9 > total)
            return RECORD_BAD;
        Py_ssize_t o = at + 9 + p[at + 8];
        if (o + 1 > total)
            return RECORD_BAD;
        o += 1 + p[o];
        r->origin = at;
        r->olen = o - at;
        at = o;
    }
    if (at + r->tlen > total)
        return RECORD_BAD;
    r->topic = at;
    return RECORD_WHOLE;
}

/* A walk over a block of the journal that starts at position `base`, up to position `end`: the
 * replay's loops (server/_splice.c splice_frames, server/_filterscan.c scan) take their records
 * from it, and read where it stopped and the last record it passed. */
typedef struct {
    Py_ssize_t off;    /* the record walk_next gave (the caller moves it on), or where it stopped */
    int at_end, bad;   /* stopped at `end`; at a record whose fields run past its length */
    int have_last;     /* last_pub, last_seq: of the last record passed (one before `end`) */
    uint64_t last_pub, last_seq;
} BlockWalk;

/* The record at w->off into *f (1), or 0 where the walk stops: the rest of the block is not a
 * whole record, the record is at or past `end` (at_end), or it is bad. A length that cannot hold
 * the header is bad even past `end`: no record ends there. */
static inline int walk_next(BlockWalk *w, const unsigned char *in, Py_ssize_t n, long long base,
                            long long end, RecordFields *f) {
    const unsigned char *r = in + w->off;
    int got = record_next(r, n - w->off, f);
    if (got == RECORD_SHORT)
        return 0;
    if (got == RECORD_BAD && (Py_ssize_t)rd32(r) + 4 < RECORD_HEADER)
        w->bad = 1;
    else if (base + w->off >= end)
        w->at_end = 1;
    else if (got == RECORD_BAD)
        w->bad = 1;
    else {
        w->last_pub = f->pub;
        w->last_seq = f->seq;
        w->have_last = 1;
        return 1;
    }
    return 0;
}

/* The crc32 (zlib's polynomial and conventions) of one record. zlib's own crc32 walks a short
 * buffer byte by byte (about 110 ns for a 140-byte record here, as much as the rest of a replay
 * costs per message); ISA-L's folds it with carry-less multiplies (about 13 ns) and gives the
 * same value. setup.py defines HAVE_ISAL when ISA-L's headers and library are there. */

#ifdef RECORD_CRC
#ifdef HAVE_ISAL
#include <isa-l/crc.h>
#define CRC_IMPL "isa-l"
static inline uint32_t record_crc(const unsigned char *q, Py_ssize_t len) {
    return crc32_gzip_refl(0, q, (uint64_t)len);
}
#else
#include <zlib.h>
#define CRC_IMPL "zlib"
static inline uint32_t record_crc(const unsigned char *q, Py_ssize_t left) {
    uLong crc = crc32(0L, Z_NULL, 0);
    while (left > 0) { /* zlib takes a uInt length */
        uInt n = left > (Py_ssize_t)0x40000000 ? 0x40000000u : (uInt)left;
        crc = crc32(crc, q, n);
        q += n;
        left -= n;
    }
    return (uint32_t)crc;
}
#endif
#endif

#endif
