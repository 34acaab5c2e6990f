"""Server addresses as users write them: `host:port`, `tcp://host:port/`, `tcps://host:port/`
(TLS), `[::1]:9007`, `host`."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["DEFAULT_ADDRESS", "DEFAULT_PORT", "ServerAddress", "parse_server"]

DEFAULT_PORT = 9007
DEFAULT_ADDRESS = f"127.0.0.1:{DEFAULT_PORT}"
_FORMS = "expected host:port, tcp://host:port/, tcps://host:port/ (TLS) or [ipv6]:port"


class ServerAddress(NamedTuple):
    host: str
    port: int
    tls: bool  # tcps://: the connection is TLS (client/tls.py makes the context)


def parse_server(text: str) -> ServerAddress:
    """The host, port and whether to speak TLS; the port defaults to 9007, the host to
    127.0.0.1, the scheme to plain `tcp`.

    Raises ValueError naming the accepted forms for anything else (another scheme, a bad port).
    """
    s = text.strip()
    tls = False
    if "://" in s:
        scheme, _, s = s.partition("://")
        if scheme.lower() not in ("tcp", "tcps"):
            raise ValueError(f"address {text!r}: scheme {scheme!r} is not supported; {_FORMS}")
        tls = scheme.lower() == "tcps"
        # tcp://host:port/ : anything after the first '/' (AMPS puts the message type there)
        s = s.split("/", 1)[0]
    if s.startswith("["):
        end = s.find("]")
        if end < 0:
            raise ValueError(f"address {text!r}: unclosed '['; {_FORMS}")
        host, rest = s[1:end], s[end + 1 :]
        if rest and not rest.startswith(":"):
            raise ValueError(f"address {text!r}: unexpected {rest!r} after ']'; {_FORMS}")
        port_text = rest[1:]
    elif s.count(":") > 1:
        raise ValueError(f"address {text!r}: write an IPv6 host in brackets, [::1]:9007; {_FORMS}")
    else:
        host, _, port_text = s.partition(":")
    host = host or "127.0.0.1"
    if not port_text:
        return ServerAddress(host, DEFAULT_PORT, tls)
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"address {text!r}: port {port_text!r} is not 1..65535; {_FORMS}")
    return ServerAddress(host, int(port_text), tls)
