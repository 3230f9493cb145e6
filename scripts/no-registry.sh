#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs a command as on a machine whose package registries do not resolve: in a
# private mount namespace whose /etc/resolv.conf names a DNS server on
# 127.0.0.9 that takes every query and never answers, so each name lookup
# fails only after the resolver's time-outs (the slowest way a registry can be
# unreachable). The machine's own resolv.conf is untouched and nothing else
# uses the silent server. It shows that the README's test command needs no
# network once the set-up ran:
#   bash scripts/no-registry.sh bash scripts/test.sh
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: scripts/no-registry.sh COMMAND [ARG...]" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "no-registry.sh: needs root (a mount namespace)" >&2; exit 2; }

dir=$(mktemp -d)
server=
cleanup() {
    [ -z "$server" ] || kill "$server" 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT
printf 'nameserver 127.0.0.9\noptions timeout:5 attempts:2\n' >"$dir/resolv.conf"

# The silent server: without one the lookups would fail at once (port
# unreachable), which hides a fetch that waits on DNS.
if command -v python3 >/dev/null; then
    python3 - "$dir/queries" <<'PY' &
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.0.9", 53))
n = 0
while True:
    s.recvfrom(4096)
    n += 1
    with open(sys.argv[1], "w") as f:
        f.write(f"{n}\n")
PY
    server=$!
    sleep 0.5
    kill -0 "$server" 2>/dev/null || { echo "no-registry.sh: the silent DNS server did not start" >&2; exit 1; }
else
    echo "no-registry.sh: no python3 for a silent DNS server; lookups fail at once instead" >&2
fi

status=0
unshare --mount --propagation private -- \
    sh -c 'mount --bind "$0" /etc/resolv.conf && exec "$@"' "$dir/resolv.conf" "$@" || status=$?
echo "no-registry.sh: the command ended with status $status; the silent DNS server took $(cat "$dir/queries" 2>/dev/null || echo 0) queries" >&2
exit "$status"
