"""The syntax of single values in a configuration file: sizes, intervals, counts, addresses, and
`${VAR}` substitution. Pure functions from text to typed values; each raises `ValueError` whose
message says what was expected (the loader adds the element path and line).

Sizes (`parse_size`, returns bytes as int)
    `<number><unit>`, unit case-insensitive, optional space between: `B`; `K`/`KB`/`KiB`;
    `M`/`MB`/`MiB`; `G`/`GB`/`GiB`; `T`/`TB`/`TiB`. Units are binary: `1KB` = 1024 bytes, so
    `16MB` is the 16 MiB of docs/protocol.md. A plain number is bytes. Fractions are allowed when they
    come to whole bytes (`1.5KB` = 1536; `0.3KB` is refused).

Intervals (`parse_interval`, returns seconds as float)
    `<number><unit>`: `ns`, `us`, `ms`, `s`, `m` (minutes), `h`, `d`, `w`; case-insensitive.
    A plain number is seconds: `30` = `30s`. `100ms` = 0.1.

Counts (`parse_count`, returns int)
    A whole number, optionally with `k` (×1,000) or `M` (×1,000,000), as AMPS counts take.

Addresses (`parse_inet_addr`, returns (host, port))
    `port`, `host:port`, or `[ipv6]:port`; port 0..65535 (0 = let the OS pick). A bare port binds
    to the default host given by the caller (127.0.0.1 for Tickertape, unlike AMPS, which binds
    every interface: write `0.0.0.0:9007` or `[::]:9007` to listen on every interface).

Environment (`substitute_env`)
    `${NAME}` is replaced by the variable's value; `${NAME:-default}` by the default when the
    variable is unset or empty (as in the shell). `$${` stands for a literal `${`. A `$` not
    followed by `{` is left alone, so regular expressions such as `orders.*$` need no escaping.
    Names are `[A-Za-z_][A-Za-z0-9_]*`; nested substitutions are not supported.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from decimal import Decimal

__all__ = [
    "parse_count",
    "parse_inet_addr",
    "parse_interval",
    "parse_size",
    "substitute_env",
]

_NUMBER_UNIT = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]*)")

_SIZE_UNITS = {"": 1, "b": 1} | {
    prefix + suffix: 1 << 10 * power
    for power, prefix in enumerate("kmgt", 1)
    for suffix in ("", "b", "ib")
}

_INTERVAL_UNITS = {
    "": Decimal(1),
    "ns": Decimal("1e-9"),
    "us": Decimal("1e-6"),
    "µs": Decimal("1e-6"),
    "ms": Decimal("1e-3"),
    "s": Decimal(1),
    "m": Decimal(60),
    "h": Decimal(3600),
    "d": Decimal(86400),
    "w": Decimal(604800),
}

_COUNT_UNITS = {"": 1, "k": 1_000, "K": 1_000, "M": 1_000_000}


def _scaled(text: str, units: Mapping[str, int | Decimal], fold: bool = True) -> Decimal:
    """The number times its unit's factor (the unit case-folded when `fold`); KeyError for
    text that is not a number with one of `units`."""
    m = _NUMBER_UNIT.fullmatch(text.strip())
    if m is None:
        raise KeyError(text)
    return Decimal(m.group(1)) * units[m.group(2).lower() if fold else m.group(2)]


def _whole(value: Decimal, what: str) -> int:
    if value != value.to_integral_value():
        raise ValueError(what)
    return int(value)


def parse_size(text: str) -> int:
    """`64MB` -> 67108864. Binary units; a plain number is bytes."""
    try:
        value = _scaled(text, _SIZE_UNITS)
    except KeyError:
        raise ValueError(
            f"invalid size {text.strip()!r}; write a number of bytes or a number with a unit, "
            "such as 500KB, 64MB or 1GB"
        ) from None
    return _whole(value, f"size {text.strip()!r} is not a whole number of bytes")


def parse_interval(text: str) -> float:
    """`100ms` -> 0.1, `5m` -> 300.0. A plain number is seconds."""
    try:
        return float(_scaled(text, _INTERVAL_UNITS))
    except KeyError:
        raise ValueError(
            f"invalid interval {text.strip()!r}; write seconds or a number with a unit "
            "(ns, us, ms, s, m, h, d, w), such as 100ms, 30s, 5m, 1h or 7d"
        ) from None


def parse_count(text: str) -> int:
    """`5` -> 5, `10k` -> 10000, `2M` -> 2000000."""
    try:
        value = _scaled(text, _COUNT_UNITS, fold=False)
    except KeyError:
        raise ValueError(
            f"invalid count {text.strip()!r}; write a whole number, optionally with k (thousand) "
            "or M (million), such as 10 or 10k"
        ) from None
    return _whole(value, f"count {text.strip()!r} is not a whole number")


_HOSTNAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?")


def _parse_port(text: str, whole: str) -> int:
    if not text.isdigit() or not text.isascii():
        raise ValueError(
            f"invalid port {text!r} in InetAddr {whole!r}; write a port, host:port or [ipv6]:port"
        )
    port = int(text)
    if port > 65535:
        raise ValueError(f"port {port} in InetAddr {whole!r} is out of range 0..65535")
    return port


def parse_inet_addr(text: str, default_host: str = "127.0.0.1") -> tuple[str, int]:
    """`9007` -> (default_host, 9007); `0.0.0.0:9007`; `[::1]:9007` -> ("::1", 9007)."""
    whole = text.strip()
    if not whole:
        raise ValueError("empty InetAddr; write a port, host:port or [ipv6]:port")
    if whole.startswith("["):
        end = whole.find("]")
        if end < 0 or whole[end + 1 : end + 2] != ":":
            raise ValueError(f"invalid InetAddr {whole!r}; write an IPv6 address as [addr]:port")
        host, port_text = whole[1:end], whole[end + 2 :]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"invalid IPv6 address {host!r} in InetAddr {whole!r}") from None
        return host, _parse_port(port_text, whole)
    if ":" not in whole:
        return default_host, _parse_port(whole, whole)
    host, _, port_text = whole.rpartition(":")
    if ":" in host:
        raise ValueError(
            f"invalid InetAddr {whole!r}; put an IPv6 address in brackets: [{host}]:{port_text}"
        )
    if not _HOSTNAME.fullmatch(host):
        raise ValueError(f"invalid host {host!r} in InetAddr {whole!r}")
    return host, _parse_port(port_text, whole)


_VAR = re.compile(r"\$(\$)?\{([^{}]*)(\})?")
_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def substitute_env(text: str, env: Mapping[str, str]) -> tuple[str, list[str]]:
    """Replace `${NAME}` and `${NAME:-default}` from `env`.

    Returns the new text and a list of problems (each a message); with problems, the text is
    only a best effort and must not be used.
    """
    if "${" not in text:
        return text, []
    out: list[str] = []
    errors: list[str] = []
    pos = 0
    for m in _VAR.finditer(text):
        out.append(text[pos : m.start()])
        pos = m.end()
        escaped, body, closed = m.group(1), m.group(2), m.group(3)
        if escaped:
            out.append("${" + body + (closed or ""))
            continue
        if not closed:
            errors.append(
                f"'${{{body}' is not closed by '}}' (nested ${{...}} are not supported); "
                "write ${NAME} or ${NAME:-default}, or $${ for a literal ${"
            )
            continue
        name, sep, default = body.partition(":-")
        if not _VAR_NAME.fullmatch(name):
            errors.append(
                f"invalid variable name {name!r} in '${{{body}}}'; write ${{NAME}} or "
                "${NAME:-default} with NAME made of letters, digits and _"
            )
            continue
        value = env.get(name)
        if sep:
            out.append(value if value else default)
        elif value is None:
            errors.append(
                f"environment variable {name} is not set; set it, or give a default "
                f"with ${{{name}:-default}}"
            )
        else:
            out.append(value)
    out.append(text[pos:])
    return "".join(out), errors
