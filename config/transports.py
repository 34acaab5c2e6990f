"""The network and logging sections: `<Transports>`, `<Admin>`, `<Logging>`.

Each function reads one section (None when the file leaves it out) and returns its part of the
`Config`, reporting problems to the `Checker`; docs/configuration.md describes every element.
"""

from __future__ import annotations

import re
from typing import Literal, cast

from .model import (
    DEFAULT_ADMIN_PORT,
    DEFAULT_HOST,
    DEFAULT_MAX_MESSAGE_SIZE,
    DEFAULT_PORT,
    Admin,
    LogLevel,
    LogProtocol,
    LogTarget,
    MessageType,
    TlsVersion,
    Transport,
    TransportType,
)
from .rules import Checker, Section, boolean, enum, message_type, positive_interval, size_between
from .schema import ADMIN, LOGGING, TARGET, TRANSPORT, TRANSPORTS
from .security import check_tls, minimum_version
from .values import parse_inet_addr
from .xmltree import Node

__all__ = [
    "LOG_LEVELS",
    "MAX_MAX_MESSAGE_SIZE",
    "MIN_MAX_MESSAGE_SIZE",
    "log_level",
    "logger_name",
    "read_admin",
    "read_logging",
    "read_transports",
]

MIN_MAX_MESSAGE_SIZE = 1 << 10
MAX_MAX_MESSAGE_SIZE = (1 << 32) - 1  # the frame length is a u32

# <Level> (lowercased) -> our level; AMPS's finer levels fold into the nearest of ours.
LOG_LEVELS = {
    "debug": "debug",
    "info": "info",
    "warning": "warning",
    "error": "error",
    "developer": "debug",
    "trace": "debug",
    "stats": "debug",
    "critical": "error",
    "emergency": "error",
}


def read_transports(checker: Checker, node: Node | None) -> tuple[list[Transport], dict[int, Node]]:
    """The transports, and the nodes that claimed each port (to check Admin against).

    Without `<Transports>`: one json-tcp transport on the default address, and no ports claimed.
    """
    if node is None:
        default = Transport(name="json-tcp", host=DEFAULT_HOST, port=DEFAULT_PORT)
        return [default], {}
    sec = Section(checker, node, TRANSPORTS)
    if not sec.many("Transport"):
        checker.report(
            node,
            "<Transports> has no <Transport>; add one, or remove <Transports> to get the "
            f"default transport on {DEFAULT_HOST}:{DEFAULT_PORT}",
        )
    found: list[Transport] = []
    names: dict[str, Node] = {}
    ports: dict[int, Node] = {}
    for tnode in sec.many("Transport"):
        t = Section(checker, tnode, TRANSPORT)
        name = t.text("Name", required=True, hint=" (for example json-tcp)")
        addr = t.value(
            "InetAddr", parse_inet_addr, None, required=True, hint=" (port or host:port)"
        )
        ttype = t.value(
            "Type",
            enum("tcp", "tcps", "replication", aliases={"amps-replication": "replication"}),
            "tcp",
        )
        mtype = t.value("MessageType", message_type, "json")
        protocol = t.value("Protocol", enum("amps", aliases={"json": "amps"}), "amps")
        max_size = t.value(
            "MaxMessageSize",
            size_between(MIN_MAX_MESSAGE_SIZE, MAX_MAX_MESSAGE_SIZE, "MaxMessageSize"),
            DEFAULT_MAX_MESSAGE_SIZE,
        )
        certificate = t.text("Certificate")
        private_key = t.text("PrivateKey")
        ca_file = t.text("CAFile")
        verify_client = t.value("VerifyClient", boolean, False)
        version = t.value("MinimumVersion", minimum_version, "TLSv1.2")
        ciphers = t.text("Ciphers")
        # A replication transport serves TLS when it has a certificate and key (no tcps twin)
        tls = ttype == "tcps" or (
            ttype == "replication" and (t.has("Certificate") or t.has("PrivateKey"))
        )
        if tls:
            why = "tcps" if ttype == "tcps" else "a replication transport with TLS"
            for element, value in (("Certificate", certificate), ("PrivateKey", private_key)):
                if value is None and not t.has(element):
                    t.missing(element, f" (a PEM file; {why} needs a certificate and key)")
            if verify_client and ca_file is None and not t.has("CAFile"):
                t.missing("CAFile", " (the CA that signs client certificates: VerifyClient)")
            elif certificate is not None and private_key is not None:
                from protocol.security.tls import ServerTls

                check_tls(
                    checker,
                    t,
                    ServerTls(certificate, private_key, ca_file, verify_client, version, ciphers),
                )
        else:
            why = (
                "needs TLS: a replication transport serves TLS when it has <Certificate> and "
                "<PrivateKey>; add them or remove it"
                if ttype == "replication"
                else "is only used by tcps transports; set <Type>tcps</Type> or remove it"
            )
            for element in _TLS_ELEMENTS:
                if t.has(element):
                    checker.report(t.at(element), f"<{element}> {why}")
        if name is not None:
            checker.unique_name(names, "transport", name, tnode)
        if addr is not None:
            host, port = addr
            addr_node = t.at("InetAddr")
            if port != 0 and port in ports:
                checker.report(
                    addr_node,
                    f"port {port} is already used by the transport at line "
                    f"{ports[port].line}; give each transport its own port",
                )
            ports.setdefault(port, addr_node)
        else:
            host, port = DEFAULT_HOST, DEFAULT_PORT
        found.append(
            Transport(
                name=name or "",
                host=host,
                port=port,
                type=cast(TransportType, ttype),
                message_type=cast(MessageType, mtype),
                protocol=cast(Literal["amps"], protocol),
                max_message_size=max_size,
                certificate=certificate,
                private_key=private_key,
                ca_file=ca_file,
                verify_client=verify_client,
                minimum_version=cast(TlsVersion, version),
                ciphers=ciphers,
            )
        )
    return found, ports


# a DNS name (labels of letters, digits and hyphens), as a Host header names it without its port
_HOST_NAME = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*\.?")
_TLS_ELEMENTS = ("Certificate", "PrivateKey", "CAFile", "VerifyClient", "MinimumVersion", "Ciphers")


def read_admin(
    checker: Checker, node: Node | None, ports: dict[int, Node], default_transport: bool = False
) -> Admin | None:
    """The admin endpoint, None without `<Admin>`; its port may not be a transport's (nor the
    default transport's, when there is no `<Transports>`)."""
    if node is None:
        return None
    sec = Section(checker, node, ADMIN)
    host, port = sec.value("InetAddr", parse_inet_addr, (DEFAULT_HOST, DEFAULT_ADMIN_PORT))
    if port != 0 and port in ports:
        checker.report(
            sec.at("InetAddr"),
            f"admin port {port} is already used by the transport at line "
            f"{ports[port].line}; give the admin endpoint its own port",
        )
    elif port == DEFAULT_PORT and default_transport:
        checker.report(
            sec.at("InetAddr"),
            f"admin port {port} is the default transport's ({DEFAULT_HOST}:{DEFAULT_PORT}, "
            "used when there is no <Transports>); give the admin endpoint its own port",
        )
    interval = sec.value("Interval", positive_interval, 10.0)
    certificate = sec.text("Certificate")
    private_key = sec.text("PrivateKey")
    for element, other in (("Certificate", "PrivateKey"), ("PrivateKey", "Certificate")):
        if sec.has(element) and not sec.has(other):
            sec.missing(other, " (HTTPS needs a certificate and its key)")
    if certificate is not None and private_key is not None:
        from protocol.security.tls import ServerTls

        check_tls(checker, sec, ServerTls(certificate, private_key))
    else:
        certificate = private_key = None
    allowed = tuple(
        name.strip().lower() for name in (sec.text("AllowedHosts") or "").split(",") if name.strip()
    )
    for name in allowed:
        if not _HOST_NAME.fullmatch(name):
            checker.report(
                sec.at("AllowedHosts"),
                f"{name!r} is not a host name; list names such as stats.example.com, "
                "separated by commas (IP addresses and localhost are always allowed)",
            )
    return Admin(
        host=host,
        port=port,
        interval=interval,
        certificate=certificate,
        private_key=private_key,
        allowed_hosts=allowed,
    )


def read_logging(checker: Checker, node: Node | None) -> tuple[LogTarget, ...]:
    """The log targets: stdout at info without `<Logging>`, none for an empty `<Logging/>`."""
    if node is None:
        return (LogTarget(protocol="stdout", level="info"),)
    sec = Section(checker, node, LOGGING)
    targets = []
    for tnode in sec.many("Target"):
        t = Section(checker, tnode, TARGET)
        protocol = t.value(
            "Protocol",
            enum("stdout", "stderr", "file"),
            "stdout",
            required=True,
            hint=" (stdout, stderr or file)",
        )
        level = t.value("Level", log_level, "info")
        file_name = t.text("FileName")
        if protocol == "file" and file_name is None and not t.has("FileName"):
            t.missing("FileName", " (the log file's path)")
        elif protocol != "file" and t.has("FileName"):
            checker.report(
                t.at("FileName"),
                f"<FileName> is only used with <Protocol>file</Protocol>, not {protocol}; "
                "remove it",
            )
            file_name = None
        targets.append(
            LogTarget(
                protocol=cast(LogProtocol, protocol),
                level=cast(LogLevel, level),
                file_name=file_name,
                logger=t.value("Logger", logger_name, None),
            )
        )
    return tuple(targets)


def logger_name(text: str) -> str:
    """A `<Logger>`: `tickertape` or a logger below it, such as `tickertape.audit`."""
    if text != "tickertape" and not text.startswith("tickertape."):
        raise ValueError(
            f"logger {text!r} is not one of the server's; write tickertape or a logger below "
            "it, such as tickertape.audit (the audit trail)"
        )
    return text


def log_level(text: str) -> str:
    """A `<Level>`, ours or AMPS's, as one of ours."""
    level = LOG_LEVELS.get(text.lower())
    if level is None:
        if text.lower() == "none":
            raise ValueError("level 'none' is not supported; remove the <Target> to log nothing")
        raise ValueError(
            f"invalid level {text!r}; use debug, info, warning or error (AMPS names developer, "
            "trace, stats, critical and emergency are accepted too)"
        )
    return level
