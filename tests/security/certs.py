"""Test certificates made with the `openssl` command: a CA, a second CA nobody trusts, server and
client certificates, expired ones, all with P-256 keys (fast to generate).

    pki = make_pki(directory)
    pki.ca, pki.server_cert, pki.server_key, pki.client_cert("alice"), ...

The server certificate names `localhost` and `127.0.0.1`. Expired certificates are issued with
`openssl ca -startdate/-enddate` (OpenSSL 3.0's `x509 -req` cannot back-date).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Pki", "make_pki"]

_CA_CONFIG = """\
[ ca ]
default_ca = ca_default
[ ca_default ]
dir = {dir}
database = {dir}/index.txt
new_certs_dir = {dir}/issued
serial = {dir}/serial
default_md = sha256
policy = policy_any
copy_extensions = copy
unique_subject = no
[ policy_any ]
commonName = supplied
emailAddress = optional
"""


def _run(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed:\n{done.stderr}")


def _key_and_csr(d: Path, name: str, subject: str, san: str | None) -> tuple[Path, Path]:
    key, csr = d / f"{name}.key", d / f"{name}.csr"
    args = [
        "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", str(key), "-out", str(csr), "-subj", subject,
    ]  # fmt: skip
    if san:
        args += ["-addext", f"subjectAltName={san}"]
    _run(*args, cwd=d)
    return key, csr


@dataclass
class Pki:
    dir: Path
    ca: Path
    ca_key: Path
    other_ca: Path
    other_ca_key: Path

    @property
    def server_cert(self) -> Path:
        return self.dir / "server.pem"

    @property
    def server_key(self) -> Path:
        return self.dir / "server.key"

    def _ca(self, name: str) -> Path:
        ca_dir = self.dir / f"{name}-db"
        if not ca_dir.exists():
            (ca_dir / "issued").mkdir(parents=True)
            (ca_dir / "index.txt").write_text("")
            (ca_dir / "serial").write_text("1000\n")
            (ca_dir / "ca.cnf").write_text(_CA_CONFIG.format(dir=ca_dir))
        return ca_dir

    def issue(
        self,
        name: str,
        subject: str,
        san: str | None = None,
        usage: str = "serverAuth",
        signer: str = "ca",
        expired: bool = False,
    ) -> tuple[Path, Path]:
        """A certificate and its key, signed by `signer` ("ca" or "other_ca")."""
        key, csr = _key_and_csr(self.dir, name, subject, san)
        cert = self.dir / f"{name}.pem"
        ca_dir = self._ca(signer)
        ca_cert = self.ca if signer == "ca" else self.other_ca
        ca_key = self.ca_key if signer == "ca" else self.other_ca_key
        ext = self.dir / f"{name}.ext"
        ext.write_text(f"extendedKeyUsage={usage}\nbasicConstraints=CA:FALSE\n")
        dates = (
            ["-startdate", "20200101000000Z", "-enddate", "20200102000000Z"]
            if expired
            else ["-days", "30"]
        )
        _run(
            "ca", "-batch", "-notext", "-config", str(ca_dir / "ca.cnf"),
            "-cert", str(ca_cert), "-keyfile", str(ca_key), "-in", str(csr), "-out", str(cert),
            "-extfile", str(ext), *dates,
            cwd=self.dir,
        )  # fmt: skip
        return cert, key

    def client_cert(self, cn: str, **kw: object) -> tuple[Path, Path]:
        return self.issue(f"client-{cn}", f"/CN={cn}", usage="clientAuth", **kw)  # type: ignore[arg-type]


def _make_ca(d: Path, name: str, cn: str) -> tuple[Path, Path]:
    cert, key = d / f"{name}.pem", d / f"{name}.key"
    _run(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", str(key), "-out", str(cert), "-days", "30", "-subj", f"/CN={cn}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=d,
    )  # fmt: skip
    return cert, key


def make_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_key = _make_ca(directory, "ca", "Tickertape Test CA")
    other, other_key = _make_ca(directory, "other-ca", "Nobody Trusts This CA")
    pki = Pki(directory, ca, ca_key, other, other_key)
    pki.issue("server", "/CN=localhost", san="DNS:localhost,IP:127.0.0.1")
    return pki
