"""Server addresses as users write them: `host:port`, `tcp://host:port/`, `[::1]:9007`, `host`."""

from __future__ import annotations

__all__ = ["DEFAULT_ADDRESS", "DEFAULT_PORT", "parse_address"]

DEFAULT_PORT = 9007
DEFAULT_ADDRESS = f"127.0.0.1:{DEFAULT_PORT}"


def parse_address(text: str) -> tuple[str, int]:
    """`(host, port)` from an address; the port defaults to 9007, the host to 127.0.0.1.

    Raises ValueError naming the accepted forms for anything else (another scheme, a bad port).
    """
    forms = "expected host:port, tcp://host:port/ or [ipv6]:port"
    s = text.strip()
    if "://" in s:
        scheme, _, s = s.partition("://")
        if scheme.lower() != "tcp":
            raise ValueError(f"address {text!r}: scheme {scheme!r} is not supported; {forms}")
        # tcp://host:port/ : anything after the first '/' (AMPS puts the message type there)
        s = s.split("/", 1)[0]
    if s.startswith("["):
        end = s.find("]")
        if end < 0:
            raise ValueError(f"address {text!r}: unclosed '['; {forms}")
        host, rest = s[1:end], s[end + 1 :]
        if rest and not rest.startswith(":"):
            raise ValueError(f"address {text!r}: unexpected {rest!r} after ']'; {forms}")
        port_text = rest[1:]
    elif s.count(":") > 1:
        raise ValueError(f"address {text!r}: write an IPv6 host in brackets, [::1]:9007; {forms}")
    else:
        host, _, port_text = s.partition(":")
    host = host or "127.0.0.1"
    if not port_text:
        return host, DEFAULT_PORT
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"address {text!r}: port {port_text!r} is not 1..65535; {forms}")
    return host, int(port_text)
