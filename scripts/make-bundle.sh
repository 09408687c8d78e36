#!/usr/bin/env bash
# make-bundle.sh: the offline runtime bundle for the GPU machine.
#
# The device image has the CUDA toolkit and driver but not every library our
# binaries link (jansson, xxhash, ...), and it cannot reach a package
# registry.  This downloads the Debian runtime packages those binaries need
# into .bundle/ (git-ignored); the device scripts (device-check.sh,
# device-pd.sh, device-agents.sh) unpack them with `dpkg -x` into /tmp/bundle
# and put on LD_LIBRARY_PATH what the image lacks.  Copy .bundle into
# the checkout on the GPU machine along with the binaries.
#
#   scripts/make-bundle.sh            download the default package set
#   scripts/make-bundle.sh PKG...     download these packages instead
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUNDLE="$ROOT/.bundle"

# Runtime packages of duet-check-ops and the other duet binaries (sonames:
# libjansson.so.4, libxxhash.so.0), and of duet-prefill, duet-decode and
# duet-driver (scripts/device-pd.sh): UCX, NNG (with mbedtls), protobuf-c,
# libsystemd and what those link; of duet-router and duet-bench-agents
# (scripts/device-agents.sh): libmicrohttpd, hiredis, pcre2, libcurl and what
# libcurl links (TLS, Kerberos, LDAP, HTTP/2, ...); and redis-server (Debian's
# redis-server and redis-tools, unpacked with dpkg -x and run from there) and
# the curl client the duet script polls the router with.  The device scripts
# put on the library path only the sonames the image lacks.  CUDA's own
# libraries (cudart is linked statically; cuBLAS/cuBLASLt 13) come from the
# device image.
PACKAGES=(libjansson4 libxxhash0
          libucx0 libnuma1 libnng1 libmbedtls14 libmbedx509-1 libmbedcrypto7 libprotobuf-c1
          libsystemd0 libcap2 libgcrypt20 libgpg-error0 liblz4-1 liblzma5 libzstd1
          libmicrohttpd12 libhiredis0.14 libpcre2-8-0 libcurl4 curl zlib1g
          libbrotli1 libgnutls30 libgmp10 libhogweed6 libnettle8 libidn2-0 libunistring2 libp11-kit0 libffi8
          libtasn1-6 libgssapi-krb5-2 libk5crypto3 libkrb5-3 libkrb5support0 libkeyutils1 libcom-err2
          libldap-2.5-0 libsasl2-2 libnghttp2-14 libpsl5 librtmp1 libssh2-1 libssl3
          redis-server redis-tools liblzf1 libjemalloc2 libatomic1)
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
