#!/usr/bin/env bash
# make-bundle.sh: the offline runtime bundle for the GPU machine.
#
# The device image has the CUDA toolkit and driver but not every library our
# binaries link (jansson, xxhash, ...), and it cannot reach a package
# registry.  This downloads the Debian runtime packages those binaries need
# into .bundle/ (git-ignored); scripts/device-check.sh unpacks them with
# `dpkg -x` into /tmp/bundle and puts them on LD_LIBRARY_PATH.  Carry it with
# the device tool's `carry: [".bundle", ...]`.
#
#   scripts/make-bundle.sh            download the default package set
#   scripts/make-bundle.sh PKG...     download these packages instead
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUNDLE="$ROOT/.bundle"

# Runtime packages of duet-check-ops and the other duet binaries (sonames:
# libjansson.so.4, libxxhash.so.0), and of duet-prefill, duet-decode and
# duet-driver (scripts/device-pd.sh): UCX, NNG (with mbedtls), protobuf-c,
# libsystemd and what those link.  The device scripts put on the library path
# only the sonames the image lacks.  CUDA's own libraries (cudart is linked
# statically; cuBLAS/cuBLASLt 13) come from the device image.
PACKAGES=(libjansson4 libxxhash0
          libucx0 libnuma1 libnng1 libmbedtls14 libmbedx509-1 libmbedcrypto7 libprotobuf-c1
          libsystemd0 libcap2 libgcrypt20 libgpg-error0 liblz4-1 liblzma5 libzstd1)
[ $# -gt 0 ] && PACKAGES=("$@")

command -v apt-get >/dev/null || { echo "make-bundle: apt-get is missing (Debian/Ubuntu only)" >&2; exit 1; }
mkdir -p "$BUNDLE"
cd "$BUNDLE"
if ! apt-get download "${PACKAGES[@]}" 2>/dev/null; then
  echo "make-bundle: apt-get download failed; refreshing the package lists" >&2
  apt-get update -q >/dev/null
  apt-get download "${PACKAGES[@]}"
fi
echo "make-bundle: $(ls "$BUNDLE"/*.deb | wc -l) packages in $BUNDLE ($(du -sh "$BUNDLE" | cut -f1))"
