#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# Builds the minivmm guest kernel (vmlinux and bzImage) from Debian's
# linux-source-6.1 package: apply the patches beside this script (*.patch, in
# name order; each says why it exists), `make tinyconfig`, merge
# minivmm-x86_64.config, `make olddefconfig`, check that every wanted option
# survived, build.
#
# Results are cached outside the checkout in
#   $MINIVMM_CACHE/kernel-<key>/{vmlinux,bzImage,config}
# where <key> hashes the config fragment, the patches, this script and the
# linux-source package version; a second run with the same inputs does no work.
#
# Prints two lines on stdout: the absolute paths of vmlinux and bzImage.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LOG_PREFIX=kernel/build.sh
# shellcheck source-path=SCRIPTDIR/.. source=common.sh
. "$HERE/../common.sh"

FRAGMENT=$HERE/minivmm-x86_64.config
SRC_PKG=linux-source-6.1
TARBALL=/usr/src/$SRC_PKG.tar.xz

shopt -s nullglob
PATCHES=("$HERE"/*.patch)
shopt -u nullglob

ensure_packages "$SRC_PKG" gcc make bc flex bison libelf-dev libssl-dev xz-utils lz4 patch

SRC_VERSION=$(dpkg-query -W -f='${Version}' "$SRC_PKG")
# Comment lines of this script do not change the build, so they stay out of
# the key; the fragment counts whole (its "is not set" lines are settings),
# and so does every patch (name and content, so a rename reorders them).
PATCH_KEY=$(for p in "${PATCHES[@]}"; do basename "$p"; cat "$p"; done | sha256sum | cut -c1-16)
KEY=$( { cat "$FRAGMENT"; grep -v '^[[:space:]]*#' "$HERE/build.sh"; echo "$SRC_PKG $SRC_VERSION";
    echo "patches $PATCH_KEY"; } | sha256sum | cut -c1-16)
OUT=$MINIVMM_CACHE/kernel-$KEY

reuse_cached() {
    if [ -s "$OUT/vmlinux" ] && [ -s "$OUT/bzImage" ]; then
        log "reusing cached kernel $OUT"
        echo "$OUT/vmlinux"
        echo "$OUT/bzImage"
        exit 0
    fi
}

# A finished kernel appears by rename, whole or not at all, so a cached one
# is taken without the lock: a run that needs no build never waits behind
# another checkout's build of a different kernel.
reuse_cached
mkdir -p "$MINIVMM_CACHE"
# Two builds racing on the same cache would trample each other's tree.
exec 9>"$MINIVMM_CACHE/.kernel.lock"
flock 9
# The build this run waited for may have been this very kernel.
reuse_cached

# Extract (and patch) the source once per package version and patch set, in
# a directory of its own: other checkouts may build from the same cache with
# other patches. The rename makes a half-done extraction invisible.
SRC=$MINIVMM_CACHE/$SRC_PKG-$SRC_VERSION
[ ${#PATCHES[@]} -eq 0 ] || SRC=$SRC-patched-$PATCH_KEY
if [ ! -f "$SRC/Makefile" ]; then
    log "extracting $TARBALL"
    rm -rf "$SRC.tmp"
    mkdir -p "$SRC.tmp"
    tar -xJf "$TARBALL" -C "$SRC.tmp" --strip-components=1
    for p in "${PATCHES[@]}"; do
        log "applying $(basename "$p")"
        patch -d "$SRC.tmp" -p1 --quiet --forward <"$p" >&2 || die "$(basename "$p") does not apply to $SRC_PKG $SRC_VERSION"
    done
    rm -rf "$SRC"
    mv "$SRC.tmp" "$SRC"
fi

OBJ=$MINIVMM_CACHE/kernel-build-$KEY
rm -rf "$OBJ"
mkdir -p "$OBJ"
KMAKE=(make -C "$SRC" O="$OBJ" ARCH=x86_64
    KBUILD_BUILD_USER=minivmm KBUILD_BUILD_HOST=minivmm)

start=$(date +%s)
log "configuring in $OBJ"
"${KMAKE[@]}" tinyconfig >&2
"$SRC/scripts/kconfig/merge_config.sh" -m -O "$OBJ" "$OBJ/.config" "$FRAGMENT" >&2
"${KMAKE[@]}" olddefconfig >&2

# olddefconfig silently drops options whose dependencies are unmet: check
# every line of the fragment against the final .config.
missing=()
while IFS= read -r line; do
    if [[ $line =~ ^(CONFIG_[A-Za-z0-9_]+)=(.*)$ ]]; then
        grep -qxF "$line" "$OBJ/.config" || missing+=("$line (got: $(grep -E "^(# )?${BASH_REMATCH[1]}[= ]" "$OBJ/.config" || echo absent))")
    elif [[ $line =~ ^#\ (CONFIG_[A-Za-z0-9_]+)\ is\ not\ set$ ]]; then
        if grep -qE "^${BASH_REMATCH[1]}=" "$OBJ/.config"; then
            missing+=("$line (got: $(grep -E "^${BASH_REMATCH[1]}=" "$OBJ/.config"))")
        fi
    fi
done <"$FRAGMENT"
if [ ${#missing[@]} -ne 0 ]; then
    for m in "${missing[@]}"; do log "option did not stick: $m"; done
    die "${#missing[@]} option(s) of $FRAGMENT were dropped by olddefconfig"
fi

log "building vmlinux and bzImage with $(nproc) jobs"
"${KMAKE[@]}" -j"$(nproc)" vmlinux bzImage >&2
log "kernel built in $(( $(date +%s) - start )) s"

rm -rf "$OUT.tmp"
mkdir -p "$OUT.tmp"
cp "$OBJ/vmlinux" "$OUT.tmp/vmlinux"
cp "$OBJ/arch/x86/boot/bzImage" "$OUT.tmp/bzImage"
cp "$OBJ/.config" "$OUT.tmp/config"
rm -rf "$OUT"
mv "$OUT.tmp" "$OUT"
rm -rf "$OBJ"

echo "$OUT/vmlinux"
echo "$OUT/bzImage"
