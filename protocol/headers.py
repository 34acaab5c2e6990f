"""Header fields of a frame (PROTOCOL.md §2): one flat JSON object.

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

import msgspec

__all__ = ["LONG_NAMES", "Header", "HeaderError", "decode_header", "encode_header"]


class HeaderError(ValueError):
    """A header that cannot be decoded; the connection is closed with reason `bad frame`."""

    reason = "bad frame"


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
}

_INT_FIELDS = frozenset({"s", "l", "matches", "records_deleted", "max_backlog"})
_FLOAT_FIELDS = frozenset({"e"})
_FIELDS = frozenset(Header.__struct_fields__)

_FAST = msgspec.json.Decoder(Header)
_ANY = msgspec.json.Decoder()
_ENC = msgspec.json.Encoder()


def decode_header(raw: bytes | memoryview) -> Header:
    """Decode one header object. Raises HeaderError for anything that is not a usable header."""
    try:
        return _FAST.decode(raw)
    except msgspec.DecodeError:
        pass
    return _decode_lenient(raw)


def _decode_lenient(raw: bytes | memoryview) -> Header:
    try:
        obj = _ANY.decode(raw)
    except msgspec.DecodeError as exc:
        raise HeaderError(f"header is not valid JSON: {exc}; send a flat JSON object") from None
    if not isinstance(obj, dict):
        raise HeaderError(f"header is a JSON {type(obj).__name__}, not an object")
    out: dict[str, object] = {}
    for key, value in obj.items():
        short = LONG_NAMES.get(key, key)
        if short not in _FIELDS:
            continue  # unknown keys are ignored, as AMPS ignores unknown header fields
        if isinstance(value, (dict, list)):
            raise HeaderError(f"header field {key!r} is nested; headers are flat (strings or numbers)")
        if value is None:
            continue
        if short in _INT_FIELDS:
            value = _as_int(key, value)
        elif short in _FLOAT_FIELDS:
            value = _as_float(key, value)
        elif isinstance(value, bool):
            value = "true" if value else "false"
        elif isinstance(value, (int, float)):
            value = str(value)
        # a short name given after its long name (or the reverse): the short one wins
        if short in out and key != short:
            continue
        out[short] = value
    try:
        return msgspec.convert(out, Header)
    except msgspec.ValidationError as exc:  # pragma: no cover - coercion above covers the types
        raise HeaderError(f"bad header: {exc}") from None


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
