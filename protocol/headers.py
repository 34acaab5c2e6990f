"""Header fields of a frame (docs/protocol.md §2): one flat JSON object.

Every header is decoded into one `Header` struct whose attributes are the *short* keys
(`c`, `cid`, `t`, `s`, ...). Input may use the long names (`cmd`, `cmd_id`, `topic`, `seq`, ...)
and may give numeric fields as decimal strings; both are normalized here so nothing downstream
ever sees a long name or a numeric string.

Decoding has two paths, because the hot path (publish with short keys) must be one C call:

1. `_FAST` decodes straight into `Header` with unknown keys forbidden and strict types.
2. If that fails (a long name, a number given as a string, an unknown key), the header is decoded
   to a dict, long names are mapped to short ones, numbers coerced, unknown keys dropped, and the
   result converted to `Header`. Only a header that is not a JSON object, or has a value of the
   wrong kind even after coercion, is an error (`HeaderError`, protocol reason `bad frame`).

Encoding (`encode_header`) omits fields left at None and always emits short keys.
"""

from __future__ import annotations

import operator

import msgspec

__all__ = [
    "FAST_PUBLISH_ACK",
    "FAST_PUBLISH_FIELDS",
    "LONG_NAMES",
    "PUBLISH_FIELDS",
    "SLOW_PUBLISH_FIELDS",
    "FieldError",
    "Header",
    "HeaderError",
    "check_fields",
    "decode_header",
    "encode_header",
]

# Field limits of a command a client sends (check_fields). The journal record holds a topic and
# a header fragment of at most 65,535 bytes each (journal/record.py); the others keep one
# command's state small.
MAX_SEQ = (1 << 63) - 1
MAX_TOPIC_BYTES = 65_535
MAX_CORRELATION_ID_BYTES = 32 * 1024
MAX_FILTER_BYTES = 64 * 1024
MAX_CID_BYTES = 1024
MAX_SUB_ID_BYTES = 256
MAX_BOOKMARK_BYTES = 64 * 1024
MAX_OPTIONS_BYTES = 4096
MAX_NAME_BYTES = 1024
# The longest expiration `e` a publish may ask for, in seconds (10 years): queues add it to a
# receive time in microseconds, so it must stay a finite, integral-sized number.
MAX_EXPIRATION = 10 * 365 * 86_400
MAX_SOW_KEY_BYTES = 1024
MAX_SOW_KEYS_BYTES = 1024 * 1024  # a comma list of keys (sow, sow_delete)
MAX_ORDER_BY_BYTES = 4096
MAX_COUNT = (1 << 31) - 1  # top_n, bs


class HeaderError(ValueError):
    """A header that cannot be decoded; the connection is closed with reason `bad frame`."""

    reason = "bad frame"


class FieldError(HeaderError):
    """A readable header with a field of the wrong type, size or range. Only this command is
    refused (failure ack with `reason`); the connection stays open. `header` holds the fields
    that were usable (at least `c` and `cid` when given), for the ack."""

    def __init__(self, header: Header, reason: str, detail: str):
        super().__init__(detail)
        self.header = header
        self.reason = reason
        self.detail = detail


class Header(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    c: str | None = None
    cid: str | None = None
    t: str | None = None
    sub_id: str | None = None
    sids: str | None = None
    bm: str | None = None
    o: str | None = None
    f: str | None = None
    a: str | None = None
    s: int | None = None
    x: str | None = None
    e: float | None = None
    ts: str | None = None
    lp: str | None = None
    l: int | None = None
    client_name: str | None = None
    user_id: str | None = None
    pw: str | None = None
    v: str | None = None
    status: str | None = None
    reason: str | None = None
    matches: int | None = None
    records_deleted: int | None = None
    max_backlog: int | None = None
    # State of the World (docs/protocol.md §10)
    k: str | None = None
    sow_keys: str | None = None
    query_id: str | None = None
    top_n: int | None = None
    order_by: str | None = None
    bs: int | None = None
    records_returned: int | None = None
    topic_matches: int | None = None


# What a publish does with each Header field, for the publish fast path. Every field is here
# (tests/protocol/test_publish_fields.py fails until a new one is): a field cmd_publish acts on
# must be "slow" unless the fast path does the same with it.
#   fast    read by the fast path: the byte scanner (server/publish_scan.py, server/_publish.c)
#           takes a header of only these members, the run predicate (server/session.py) takes
#           decoded headers with them; a only as FAST_PUBLISH_ACK, the sizes of check_fields
#   slow    acted on by cmd_publish alone: a publish that has one goes the ordinary way
#   unused  no part of a publish: the run predicate lets them ride (cmd_publish ignores them
#           too), the byte scanner takes no member outside "fast"
PUBLISH_FIELDS: dict[str, str] = {
    "c": "fast",
    "cid": "fast",
    "t": "fast",
    "s": "fast",
    "a": "fast",
    "x": "slow",
    "e": "slow",
    "sub_id": "unused",
    "sids": "unused",
    "bm": "unused",
    "o": "unused",
    "f": "unused",
    "ts": "unused",
    "lp": "unused",
    "l": "unused",
    "client_name": "unused",
    "user_id": "unused",
    "pw": "unused",
    "v": "unused",
    "status": "unused",
    "reason": "unused",
    "matches": "unused",
    "records_deleted": "unused",
    "max_backlog": "unused",
    "k": "slow",  # a SOW record's key: the ordinary path computes and checks it (server/sow/)
    "sow_keys": "unused",
    "query_id": "unused",
    "top_n": "unused",
    "order_by": "unused",
    "bs": "unused",
    "records_returned": "unused",
    "topic_matches": "unused",
}
FAST_PUBLISH_FIELDS = frozenset(k for k, v in PUBLISH_FIELDS.items() if v == "fast")
SLOW_PUBLISH_FIELDS = frozenset(k for k, v in PUBLISH_FIELDS.items() if v == "slow")
FAST_PUBLISH_ACK = "persisted"  # the one ack type (`a`) a publish on the fast path asks for

LONG_NAMES: dict[str, str] = {
    "cmd": "c",
    "cmd_id": "cid",
    "topic": "t",
    "bookmark": "bm",
    "opts": "o",
    "options": "o",
    "filter": "f",
    "ack_type": "a",
    "seq": "s",
    "sequence": "s",
    "correlation_id": "x",
    "expiration": "e",
    "timestamp": "ts",
    "leaseperiod": "lp",
    "lease_period": "lp",
    "msg_len": "l",
    "password": "pw",
    "version": "v",
    "subscription_id": "sub_id",
    "sow_key": "k",
    "batch_size": "bs",
}

# the numeric fields, as Header types them: the lenient decoder converts these (and only these)
_INT_FIELDS = frozenset(f.name for f in msgspec.structs.fields(Header) if f.type == int | None)
_FLOAT_FIELDS = frozenset(f.name for f in msgspec.structs.fields(Header) if f.type == float | None)
_FIELDS = frozenset(Header.__struct_fields__)

_FAST = msgspec.json.Decoder(Header)
_ANY = msgspec.json.Decoder()
_ENC = msgspec.json.Encoder()


def decode_header(raw: bytes | bytearray | memoryview) -> Header:
    """Decode one header object. Raises HeaderError for anything that is not a usable header,
    FieldError (a HeaderError) for a usable one with a field of the wrong type."""
    try:
        return _FAST.decode(raw)
    except (msgspec.DecodeError, ValueError, RecursionError):
        pass
    return _decode_lenient(raw)


def _decode_lenient(raw: bytes | bytearray | memoryview) -> Header:
    try:
        obj = _ANY.decode(raw)
    except (msgspec.DecodeError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise HeaderError(
            f"header is not valid JSON: {exc}; send a flat JSON object in UTF-8"
        ) from None
    except RecursionError:
        raise HeaderError(
            "header is nested too deeply; headers are flat (strings or numbers)"
        ) from None
    if not isinstance(obj, dict):
        raise HeaderError(f"header is a JSON {type(obj).__name__}, not an object")
    out: dict[str, object] = {}
    problem = None
    for key, value in obj.items():
        short = LONG_NAMES.get(key, key)
        if short not in _FIELDS:
            continue  # unknown keys are ignored, as AMPS ignores unknown header fields
        if isinstance(value, (dict, list)):
            problem = (
                problem or f"header field {key!r} is nested; headers are flat (strings or numbers)"
            )
            continue
        if value is None:
            continue
        try:
            if short in _INT_FIELDS:
                value = _as_int(key, value)
            elif short in _FLOAT_FIELDS:
                value = _as_float(key, value)
            elif isinstance(value, bool):  # a text field given as a JSON literal: its text
                value = "true" if value else "false"
            elif isinstance(value, (int, float)):
                value = str(value)
        except HeaderError as exc:
            problem = problem or str(exc)
            continue
        # a short name given after its long name (or the reverse): the short one wins
        if short in out and key != short:
            continue
        out[short] = value
    try:
        header = msgspec.convert(out, Header)
    except msgspec.ValidationError as exc:  # pragma: no cover - coercion above covers the types
        raise HeaderError(f"bad header: {exc}") from None
    if problem is not None:
        raise FieldError(header, "bad frame", problem)
    return header


def _too_long(text: str | None, limit: int) -> bool:
    # a str of n characters takes n..4n bytes in UTF-8: encode only when it could be too long
    return (
        text is not None
        and len(text) * 4 > limit
        and len(text.encode("utf-8", "surrogatepass")) > limit
    )


def _sized(
    name: str, limit: int, reason: str, label: str = "", more: str = ""
) -> tuple[str, int, str, str]:
    return name, limit, reason, f"{label or name} is longer than {limit} bytes{more}"


_OPTIONS_LIMIT = f"options o are longer than {MAX_OPTIONS_BYTES} bytes"
_NAME_LIMIT = f"client_name and user_id are at most {MAX_NAME_BYTES} bytes"
# (field, byte limit, failure reason, what the client is told): the sized text fields
_SIZED: tuple[tuple[str, int, str, str], ...] = (
    _sized("t", MAX_TOPIC_BYTES, "invalid topic", "topic"),
    _sized("x", MAX_CORRELATION_ID_BYTES, "bad frame", "correlation id x"),
    _sized("f", MAX_FILTER_BYTES, "bad filter", "filter"),
    _sized("cid", MAX_CID_BYTES, "bad frame", "command id cid"),
    _sized("sub_id", MAX_SUB_ID_BYTES * 64, "bad frame"),  # a comma list on unsubscribe
    _sized("bm", MAX_BOOKMARK_BYTES, "invalid bookmark"),
    ("o", MAX_OPTIONS_BYTES, "invalid options", _OPTIONS_LIMIT),
    _sized("k", MAX_SOW_KEY_BYTES, "bad sow key", "sow key k"),
    _sized("sow_keys", MAX_SOW_KEYS_BYTES, "bad sow key", more="; query or delete in parts"),
    _sized("query_id", MAX_CID_BYTES, "bad frame"),
    _sized("order_by", MAX_ORDER_BY_BYTES, "bad order by"),
    ("client_name", MAX_NAME_BYTES, "bad frame", _NAME_LIMIT),
    ("user_id", MAX_NAME_BYTES, "bad frame", _NAME_LIMIT),
)
# A str of n characters is at most 4n bytes in UTF-8: fields this short are never too long. This
# runs for every command (every publish), so the common case is one comparison per field.
_SHORT = min(limit for _, limit, _, _ in _SIZED) // 4
_SIZED_TEXTS = operator.attrgetter(*(name for name, _, _, _ in _SIZED))


def check_fields(h: Header) -> FieldError | None:
    """Range and size checks on a command a client sent (the decoder checked the types).
    None when every field is usable, else the FieldError to refuse the command with."""
    s = h.s
    if s is not None and not 0 < s <= MAX_SEQ:
        return FieldError(h, "bad frame", f"sequence s={s} is out of range: use 1..{MAX_SEQ}")
    e = h.e
    if e is not None and not (0.0 < e <= MAX_EXPIRATION):
        return FieldError(
            h,
            "bad frame",
            f"expiration e={e!r} must be a number of seconds above 0 and at most "
            f"{MAX_EXPIRATION} (10 years)",
        )
    if h.f is h.sub_id is h.bm is h.o is h.client_name is h.user_id is None and (
        h.sow_keys is h.query_id is h.order_by is h.top_n is h.bs is None
    ):
        t, x, cid, k = h.t, h.x, h.cid, h.k
        if (
            (t is None or len(t) <= _SHORT)
            and (x is None or len(x) <= _SHORT)
            and (cid is None or len(cid) <= _SHORT)
            and (k is None or len(k) <= _SHORT)
        ):
            return None  # the common publish
    else:
        # every other command (each queue ack): the sized fields fetched in one C call, and
        # nothing more when none is long enough to come near its limit and the counts are in
        # range (the loop below over the 15 fields by name was some 175 of the 2,050
        # bytecodes the server runs per ack round trip of a backlog-1 consumer)
        n, b = h.top_n, h.bs
        if (n is None or 0 <= n <= MAX_COUNT) and (b is None or 0 <= b <= MAX_COUNT):
            for text in _SIZED_TEXTS(h):
                if text is not None and len(text) > _SHORT:
                    break
            else:
                return None
    for name in ("top_n", "bs"):
        n = getattr(h, name)
        if n is not None and not 0 <= n <= MAX_COUNT:
            return FieldError(h, "bad frame", f"{name}={n} is out of range: use 0..{MAX_COUNT}")
    for name, limit, reason, detail in _SIZED:
        text = getattr(h, name)
        # _too_long's first two tests inline: every command that is not a plain publish (each
        # queue ack) gets here, and most of the fields are absent or short
        if text is not None and len(text) * 4 > limit and _too_long(text, limit):
            return FieldError(h, reason, detail)
    return None


def _as_int(key: str, value: object) -> int:
    if isinstance(value, bool):
        raise HeaderError(f"header field {key!r} must be an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    raise HeaderError(f"header field {key!r} must be a decimal integer, got {value!r}")


def _as_float(key: str, value: object) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    raise HeaderError(f"header field {key!r} must be a number, got {value!r}")


def encode_header(header: Header) -> bytes:
    return _ENC.encode(header)
