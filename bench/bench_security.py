"""The cost of security: publish and fan-out over TLS against plaintext, and publish checked
against 100 entitlement rules against none, in the same run (Tickertape only).

    ./run bench bench_security [--count 50000] [--fan-count 20000] [--subs 4] [--rules 100]
                               [--reps 3]

Rows (each repetition on a freshly started server; repetitions interleaved, so that a noisy
spell on the shared machine hits every row alike):
  publish plain        one publisher, persisted acks, plain TCP (as bench_publish)
  publish tls          the same over a tcps transport (TLS 1.3, P-256 certificate)
  publish anonymous    <Authentication><AllowAnonymous>true</AllowAnonymous> and no
                       <Entitlement>: logons go through the authenticator, nothing is checked
  publish 100 rules    the same with an <Entitlement> of `--rules` roles for the user, each with
                       a <Publish> regex; only the last one matches the topic (every publish is
                       checked; the decision is cached per user and topic)
  fan-out plain / tls  one publisher and `--subs` subscribers receiving every message
Figures: msgs/s (fan-out rows: deliveries/s), server CPU µs per message (per delivery), client
CPU % (near 100 %: the load generator sets the pace, and the figure is a floor).
Targets (issue "Security"): TLS at least 60 % of plaintext throughput, publish and fan-out; 100
rules within run-to-run noise of none (here: at least 95 % of the anonymous row).
"""

from __future__ import annotations

import os
import ssl
import subprocess
from functools import partial

import benchlib
import peers
from benchlib import Metric, Variant

TOPIC = "bench.sec"

METRICS = [
    Metric("rate", "msgs/s (fan-out: deliveries/s)", spread=True),
    Metric("cpu_us", "srv CPU µs/msg", "{:.2f}", "lower", ratio=False),
    Metric("client_pct", "client CPU %", "{:.0f}", "lower", ratio=False),
]


def certificates() -> tuple[str, str, str]:
    """(CA, server certificate, key) for localhost, made once with openssl under bench/.data."""
    d = os.path.join(peers.HERE, ".data", "tls")
    ca, cert, key = (os.path.join(d, n) for n in ("ca.pem", "server.pem", "server.key"))
    if all(os.path.exists(p) for p in (ca, cert, key)):
        return ca, cert, key
    os.makedirs(d, exist_ok=True)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "3650",
            "-subj", "/CN=bench CA", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost")
    with open(os.path.join(d, "server.ext"), "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "3650", "-extfile", "server.ext", "-out", "server.pem")  # fmt: skip
    return ca, cert, key


def rules_xml(n: int) -> str:
    """n roles for `anonymous`, each a <Publish> regex; only the last matches TOPIC."""
    roles = [
        f"<Role><Name>r{i}</Name><Users>anonymous</Users>"
        f"<Publish>other\\.{i}\\..*</Publish><Subscribe>other\\.{i}\\..*</Subscribe></Role>"
        for i in range(n - 1)
    ]
    roles.append(
        "<Role><Name>bench</Name><Users>anonymous</Users><Publish>bench\\..*</Publish>"
        "<Subscribe>bench\\..*</Subscribe></Role>"
    )
    return "<Entitlement>" + "".join(roles) + "</Entitlement>"


ANONYMOUS = "<Authentication><AllowAnonymous>true</AllowAnonymous></Authentication>"


def variants(args) -> list[Variant]:
    _ca, cert, key = certificates()
    tls_xml = f"<Type>tcps</Type><Certificate>{cert}</Certificate><PrivateKey>{key}</PrivateKey>"
    tls = {"transport_xml": tls_xml}
    return [
        Variant("publish plain", "tickertape", {"kind": "publish"}),
        Variant("publish tls", "tickertape", {"kind": "publish", "tls": True, "peer_extra": tls}),
        Variant(
            "publish anonymous",
            "tickertape",
            {"kind": "publish", "peer_extra": {"config_xml": ANONYMOUS}},
        ),
        Variant(
            f"publish {args.rules} rules",
            "tickertape",
            {"kind": "publish", "peer_extra": {"config_xml": ANONYMOUS + rules_xml(args.rules)}},
        ),
        Variant("fan-out plain", "tickertape", {"kind": "fanout"}),
        Variant("fan-out tls", "tickertape", {"kind": "fanout", "tls": True, "peer_extra": tls}),
    ]


def one_rep(args, client_tls: ssl.SSLContext, peer, v, rep) -> dict:
    fan = v.opts["kind"] == "fanout"
    n = args.fan_count if fan else args.count
    tls = client_tls if v.opts.get("tls") else None
    return benchlib.judged(*benchlib.publish_or_fanout(args, peer, TOPIC, n, fan, f"s{rep}", tls))


def main() -> None:
    p = benchlib.parser(__doc__)
    p.add_argument("--count", type=int, default=50_000, help="messages per publish repetition")
    p.add_argument("--fan-count", type=int, default=20_000, help="messages per fan-out repetition")
    p.add_argument("--subs", type=int, default=4, help="fan-out subscribers")
    p.add_argument("--rules", type=int, default=100, help="entitlement roles for the rules row")
    benchlib.common_args(p)
    args = p.parse_args()
    if args.quick:
        args.count, args.fan_count, args.reps = 5_000, 2_000, 1
    benchlib.tickertape_only()
    ca, _cert, _key = certificates()
    client_tls = ssl.create_default_context(cafile=ca)
    vs = variants(args)
    print(
        f"security: publish {args.count} msgs, fan-out {args.fan_count} msgs x {args.subs} subs, "
        f"{args.rules} rules, {args.reps} reps (interleaved)"
    )
    run = benchlib.run_rows(vs, args.reps, partial(one_rep, args, client_tls), METRICS)
    ratio = run.ratio

    targets = benchlib.targets_table(
        [
            ("publish: TLS ÷ plain ≥ 0.60", "×", ratio("publish tls", "publish plain"), 0.6, "min"),
            ("fan-out: TLS ÷ plain ≥ 0.60", "×", ratio("fan-out tls", "fan-out plain"), 0.6, "min"),
            (
                f"publish: {args.rules} rules ÷ none (anonymous) ≥ 0.95",
                "×",
                ratio(f"publish {args.rules} rules", "publish anonymous"),
                0.95,
                "min",
            ),
        ]
    )
    notes = [
        (
            f"publish rows: 1 publisher, {args.count} messages of {args.size} B, persisted acks, "
            f"window {args.window}; fan-out rows: {args.fan_count} messages to {args.subs} "
            f"subscribers; median of {args.reps} repetitions, interleaved, fresh server each"
        ),
        (
            "tls: a tcps transport, TLS 1.3 with a P-256 certificate, OpenSSL's default ciphers; "
            "the load generator (uvloop) speaks TLS too, so its CPU grows with the server's"
        ),
        (
            f"rules: <Authentication><AllowAnonymous>true</AllowAnonymous> and {args.rules} roles "
            "for the user, each a <Publish> regex, the last one matching; compared with the same "
            "authentication and no <Entitlement>"
        ),
    ]
    benchlib.report(
        "bench_security",
        "Security: TLS and entitlements (bench_security)",
        run,
        METRICS,
        notes,
        args.no_results,
        targets,
        ratios=False,
    )


if __name__ == "__main__":
    main()
