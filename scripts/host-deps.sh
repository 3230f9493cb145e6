#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs the host packages minivmm's tests and demo use (Debian), only those
# missing, so a warm machine does no network work.
set -euo pipefail
want=(iproute2 iputils-ping iperf3 qemu-system-x86 procps util-linux)
missing=()
for p in "${want[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
    if [ "$(id -u)" -ne 0 ]; then
        echo "host-deps: missing ${missing[*]}; run as root or install them" >&2
        exit 1
    fi
    echo "host-deps: installing ${missing[*]}" >&2
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
fi
