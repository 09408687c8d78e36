#!/usr/bin/env bash
# make-ucx-cuda.sh: UCX 1.13.1 built with CUDA, for the GPU machine's data plane.
#
# The runtime bundle (scripts/make-bundle.sh) carries Debian 12's libucx0
# 1.13.1, which is built without CUDA: UCX cannot register device memory with
# it, so the data plane stages pages through host memory.  This builds the
# same UCX release from Debian's source tarball with the CUDA transports
# (cuda_copy, cuda_ipc; no gdrcopy, no verbs) and two patches: ucp_put_nbx
# between two GPUs' memory uses cuda_ipc (below; it takes UCX_PROTO_ENABLE=y at
# run time), and a failed tcp endpoint completes a zero-copy send once, not
# twice.  It keeps the sonames our binaries link (libucp.so.0, libucs.so.0,
# libuct.so.0, libucm.so.0), and packs the
# libraries, their modules (lib/ucx/), ucx_info and ucx_perftest into
# .bundle/ucx-cuda-1.13.1.tgz (git-ignored).  The tarball is relocatable:
# unpack it anywhere as D and put D/lib on LD_LIBRARY_PATH; libucs finds its
# modules in D/lib/ucx (scripts/device-lib.sh: duet_ucx_cuda_env).
#
# libcudart.so.13 travels in lib/ucx next to the CUDA modules, which look for
# it there ($ORIGIN) after LD_LIBRARY_PATH, so the device image needs no CUDA
# runtime of its own and nothing else in a process sees ours.  libcuda.so.1
# and libnvidia-ml.so.1 come from the driver.
#
#   scripts/make-ucx-cuda.sh          build .bundle/ucx-cuda-1.13.1.tgz
#
# Environment: CUDA_HOME (default /usr/local/cuda), UCX_SRC_CACHE (where the
# downloads are kept, default .bundle/src), UCX_KEEP_WORK=1 keeps the build
# tree (printed at the end).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUNDLE="$ROOT/.bundle"
CACHE="${UCX_SRC_CACHE:-$BUNDLE/src}"
CUDA="${CUDA_HOME:-/usr/local/cuda}"

VERSION=1.13.1
SRC_URL="http://deb.debian.org/debian/pool/main/u/ucx/ucx_${VERSION}.orig.tar.xz"
SRC_SHA256=1a88e09ca1b406c046a469c2ae271d2c330050b5664c0bcd9890e26c6ef09f3c
# nvml.h, when the CUDA toolkit lacks it (its cuda-nvml-dev part is often not
# installed): NVIDIA's header-only Python wheel of the same CUDA release.
NVML_WHEEL=nvidia_nvml_dev-13.0.87-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl
NVML_WHEEL_SHA256=082871368275cf6620fc900f55d8eaf2563b263a38a00a5168e9650bce963ba1
OUT="$BUNDLE/ucx-cuda-$VERSION.tgz"

say() { echo "make-ucx-cuda: $*"; }
die() { echo "make-ucx-cuda: $*" >&2; exit 1; }

WORK="$(mktemp -d "${TMPDIR:-/tmp}/ucx-cuda.XXXXXX")"
cleanup() {
  if [ "${UCX_KEEP_WORK:-0}" = 1 ]; then say "build tree kept in $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

if [ ! -x "$CUDA/bin/nvcc" ] || [ ! -e "$CUDA/include/cuda.h" ]; then
  die "no CUDA toolkit in $CUDA (set CUDA_HOME)"
fi

# Build tools, installed the way `./duet deps` installs packages: only the
# missing ones, with sudo when not root.  autoconf/automake/libtool because
# the orig tarball is the git tree without a generated configure; libnuma-dev
# because Debian's build links libnuma too; patchelf for the run paths below.
TOOLS=(autoconf automake libtool pkg-config make gcc g++ libnuma-dev patchelf patch curl xz-utils)
# pip only fetches nvml.h, when the toolkit lacks it; any pip will do.
if [ ! -e "$CUDA/include/nvml.h" ] && ! python3 -m pip --version >/dev/null 2>&1; then
  TOOLS+=(python3-pip)
fi
missing=()
for p in "${TOOLS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# fetch URL FILE SHA256: download into the cache unless a good copy is there.
fetch() {
  local url=$1 file=$2 sum=$3
  if [ -e "$CACHE/$file" ] && echo "$sum  $CACHE/$file" | sha256sum -c --status; then
    return 0
  fi
  say "downloading $url"
  curl -fsSL -o "$CACHE/$file.part" "$url"
  echo "$sum  $CACHE/$file.part" | sha256sum -c --status ||
    { rm -f "$CACHE/$file.part"; die "$file: sha256 mismatch"; }
  mv "$CACHE/$file.part" "$CACHE/$file"
}

mkdir -p "$CACHE"
fetch "$SRC_URL" "ucx_$VERSION.orig.tar.xz" "$SRC_SHA256"

# nvml.h and a link-time libnvidia-ml (the toolkit's stub when it has one).
# The stub only has to carry the soname and the symbols UCX calls; at run time
# the driver's libnvidia-ml.so.1 is loaded instead.
NVML="$WORK/nvml"
mkdir -p "$NVML/include" "$NVML/lib"
if [ -e "$CUDA/include/nvml.h" ]; then
  cp "$CUDA/include/nvml.h" "$NVML/include/"
else
  if ! { [ -e "$CACHE/$NVML_WHEEL" ] && echo "$NVML_WHEEL_SHA256  $CACHE/$NVML_WHEEL" | sha256sum -c --status; }; then
    say "downloading nvml.h (nvidia-nvml-dev 13.0.87)"
    python3 -m pip download -q --no-deps --only-binary=:all: -d "$CACHE" "nvidia-nvml-dev==13.0.87"
    echo "$NVML_WHEEL_SHA256  $CACHE/$NVML_WHEEL" | sha256sum -c --status || die "$NVML_WHEEL: sha256 mismatch"
  fi
  python3 -c 'import sys, zipfile; open(sys.argv[2], "wb").write(zipfile.ZipFile(sys.argv[1]).read("nvidia/cu13/include/nvml.h"))' \
    "$CACHE/$NVML_WHEEL" "$NVML/include/nvml.h"
fi
if [ -e "$CUDA/lib64/stubs/libnvidia-ml.so" ]; then
  cp "$CUDA/lib64/stubs/libnvidia-ml.so" "$NVML/lib/"
else
  # nvml.h maps nvmlInit and friends onto their _v2 entry points.
  for f in nvmlInit nvmlInit_v2 nvmlShutdown nvmlErrorString \
           nvmlDeviceGetHandleByIndex nvmlDeviceGetHandleByIndex_v2 nvmlDeviceGetFieldValues \
           nvmlDeviceGetNvLinkRemotePciInfo nvmlDeviceGetNvLinkRemotePciInfo_v2; do
    echo "int $f(void) { return 999; }"
  done > "$NVML/stub.c"
  gcc -shared -fPIC -Wl,-soname,libnvidia-ml.so.1 -o "$NVML/lib/libnvidia-ml.so" "$NVML/stub.c"
fi

say "unpacking UCX $VERSION"
tar xJf "$CACHE/ucx_$VERSION.orig.tar.xz" -C "$WORK"
SRC="$WORK/ucx-$VERSION"
cd "$SRC"

# Debian's orig tarball moves upstream's debian/ templates to debian.upstream/,
# but configure.ac still lists them as outputs and configure would stop on the
# missing inputs; drop those lines, as Debian's own undo-upstream.patch does.
sed -i -e '/^ *debian\/[a-z.]*:debian\/[a-z.]*$/d' -e '/^ *debian\/\(rules\|control\|changelog\)$/d' configure.ac
grep -q 'debian/' configure.ac && die "configure.ac still names debian/ files"

# Device-to-device ucp_put_nbx over cuda_ipc.  1.13.1 picks a lane for RMA on
# any memory type only among transports with put short/bcopy and get bcopy;
# cuda_ipc has put/get zero-copy only, so a put between two GPUs' memory never
# uses it and falls back to active messages through host memory (the old
# protocols even memcpy from the device pointer and crash).  For memory other
# than host, accept zero-copy transports as RMA lanes; with the new protocols
# (UCX_PROTO_ENABLE=y) a put between GPUs of one node is then a cuda_ipc
# zero-copy (NVLink).  Host memory lanes are chosen as before.  The old
# protocols (the default, UCX_PROTO_ENABLE=n) still crash on a put from device
# memory, patched or not: put device memory only with UCX_PROTO_ENABLE=y.
patch -p1 --no-backup-if-mismatch > "$WORK/patch.log" <<'EOF_PATCH' || { cat "$WORK/patch.log"; die "the RMA lane patch does not apply"; }
--- a/src/ucp/wireup/select.c
+++ b/src/ucp/wireup/select.c
@@ -974,7 +974,16 @@
 
     tl_bitmap = ucp_tl_bitmap_max;
     for (mem_type = 0; mem_type < UCS_MEMORY_TYPE_LAST; ++mem_type) {
-        status = ucp_wireup_add_memaccess_lanes(select_params, &criteria,
+        ucp_wireup_criteria_t mem_criteria = criteria;
+        if ((mem_type != UCS_MEMORY_TYPE_HOST) &&
+            !(ep_init_flags & UCP_EP_INIT_FLAG_MEM_TYPE)) {
+            mem_criteria.local_iface_flags =
+                    (criteria.local_iface_flags &
+                     UCT_IFACE_FLAG_ERRHANDLE_PEER_FAILURE) |
+                    UCT_IFACE_FLAG_PUT_ZCOPY | UCT_IFACE_FLAG_GET_ZCOPY |
+                    UCT_IFACE_FLAG_PENDING;
+        }
+        status = ucp_wireup_add_memaccess_lanes(select_params, &mem_criteria,
                                                 mem_type, tl_bitmap,
                                                 UCP_LANE_TYPE_RMA, select_ctx);
         if ((status != UCS_OK) && (mem_type == UCS_MEMORY_TYPE_HOST)) {
EOF_PATCH

# A failed tcp endpoint's zero-copy send completed twice.  When a partly written
# AM zero-copy message meets a send error, uct_tcp_ep_sendv() lets
# uct_tcp_ep_handle_send_err() fail the endpoint, whose purge completes the
# message, then completes it again.  A build with assertions (Debian's libucx0)
# aborts there ("uct_iface.h:884 Assertion comp->count > 0", ENDPOINT_TIMEOUT);
# this one, without them, takes the completion count below zero instead.
# Complete it only if the purge has not (docs/DATAPLANE.md).  duet itself sends
# active-message data over tcp by copy, which avoids the path on any UCX.
patch -p1 --no-backup-if-mismatch > "$WORK/patch-tcp.log" <<'EOF_PATCH' || { cat "$WORK/patch-tcp.log"; die "the tcp completion patch does not apply"; }
--- a/src/uct/tcp/tcp_ep.c
+++ b/src/uct/tcp/tcp_ep.c
@@ -1060,7 +1060,10 @@
         }
 
         status = uct_tcp_ep_handle_send_err(ep, status);
-        uct_tcp_ep_zcopy_completed(ep, ctx->comp, status);
+        if (ep->flags & UCT_TCP_EP_FLAG_ZCOPY_TX) {
+            /* not completed yet by the purge of a failed endpoint */
+            uct_tcp_ep_zcopy_completed(ep, ctx->comp, status);
+        }
         return status;
     }
 
EOF_PATCH

say "autogen"
./autogen.sh > "$WORK/autogen.log" 2>&1 || { tail -30 "$WORK/autogen.log"; die "autogen.sh failed (log: $WORK/autogen.log)"; }

# Release build: Debian's switches (multi-threading support, CMA, logging and
# detailed backtraces off) plus no debug, assertions or parameter checks, and
# only what the data plane uses: shared memory, TCP and CUDA.  The prefix is
# only a name (ucx_info -v prints it, libucs looks for modules there after
# lib/ucx next to itself); make install writes into the build tree (DESTDIR).
PREFIX="/opt/ucx-cuda-$VERSION"
say "configure"
./configure --prefix="$PREFIX" \
  --enable-mt --enable-cma --disable-backtrace-detail --disable-logging \
  --disable-debug --disable-assertions --disable-params-check \
  --enable-optimizations --disable-static --disable-doxygen-doc --disable-examples \
  --with-cuda="$CUDA" --without-gdrcopy --without-rocm \
  --without-verbs --without-rdmacm --without-knem --without-xpmem --without-ugni \
  --without-fuse3 --without-java --without-go --without-mpi \
  CPPFLAGS="-I$NVML/include" LDFLAGS="-L$NVML/lib" \
  > "$WORK/configure.log" 2>&1 || { tail -30 "$WORK/configure.log"; die "configure failed (log: $WORK/configure.log)"; }
grep -q '^#define HAVE_CUDA 1' config.h || die "configure did not enable CUDA (log: $WORK/configure.log)"

# Only the libraries, their modules and the two tools, in the order of the
# top-level SUBDIRS.  The rest of the tree is not built: test/apps'
# test_cuda_hook.c calls cuCtxCreate with the three arguments of CUDA < 13,
# which CUDA 13 headers map onto cuCtxCreate_v4 (four), and does not compile;
# the libraries themselves build against CUDA 13 unchanged.
say "make -j$(nproc)"
for d in src/ucm src/ucs src/uct src/ucp src/tools/info src/tools/perf; do
  { make -C "$d" -j"$(nproc)" && make -C "$d" install DESTDIR="$WORK/install"; } >> "$WORK/make.log" 2>&1 ||
    { grep -m 20 -B2 -A8 'error' "$WORK/make.log" || tail -40 "$WORK/make.log"; die "make in $d failed (log: $WORK/make.log)"; }
done

# Stage what runs: the four libraries and their modules (the .so.0 names,
# which is what libucs asks for), the two tools, and cudart for the modules.
INST="$WORK/install$PREFIX"
STAGE="$WORK/stage"
mkdir -p "$STAGE/lib/ucx" "$STAGE/bin"
cp -P "$INST"/lib/lib{ucp,ucs,uct,ucm}.so.0* "$STAGE/lib/"
cp -P "$INST"/lib/ucx/*.so.0* "$STAGE/lib/ucx/"
cp "$INST/bin/ucx_info" "$INST/bin/ucx_perftest" "$STAGE/bin/"
ls "$STAGE"/lib/ucx/libuct_cuda.so.0 "$STAGE"/lib/ucx/libucm_cuda.so.0 >/dev/null || die "the CUDA modules were not built"
cp -L "$CUDA/lib64/libcudart.so.13" "$STAGE/lib/ucx/"

# Stripped, and with run paths relative to where they lie instead of the
# build tree's: the tools find lib/, the libraries each other, the modules
# lib/ and cudart next to them.
find "$STAGE" -type f -name '*.so*' -not -name 'libcudart*' -exec strip --strip-unneeded {} +
strip --strip-unneeded "$STAGE"/bin/*
for f in "$STAGE"/bin/*; do patchelf --set-rpath '$ORIGIN/../lib' "$f"; done
find "$STAGE/lib" -maxdepth 1 -type f -name '*.so*' -exec patchelf --set-rpath '$ORIGIN' {} \;
find "$STAGE/lib/ucx" -type f -name '*.so*' -not -name 'libcudart*' -exec patchelf --set-rpath '$ORIGIN:$ORIGIN/..' {} \;

mkdir -p "$BUNDLE"
tar -C "$STAGE" -cf - --owner=0 --group=0 --numeric-owner lib bin | gzip -9 > "$OUT.part"
mv "$OUT.part" "$OUT"

# Check the packed tree from a different directory than it was built in: the
# version, CUDA configured, and the modules found (cma is one of them, and
# loads on any Linux machine; the CUDA ones need a driver to list devices).
CHECK="$WORK/check"
mkdir -p "$CHECK"
tar xzf "$OUT" -C "$CHECK"
run_info() { LD_LIBRARY_PATH="$CHECK/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$CHECK/bin/ucx_info" "$@"; }
run_info -v | grep -q "Version $VERSION$" || die "ucx_info -v does not say $VERSION"
run_info -b | grep -Eq '^#define HAVE_CUDA +1$' || die "ucx_info -b does not show HAVE_CUDA"
run_info -d | grep -q 'Transport: cma' || die "ucx_info -d does not list cma: modules not found in lib/ucx"
# The CUDA module needs the driver's libcuda.so.1 and libnvidia-ml.so.1; with
# the toolkit's stub libcuda (and the nvml stub) in their place it loads, so
# its dependencies resolve from the unpacked tree (cudart from lib/ucx), and
# registers its configuration, even though the stub finds no device.
if [ -e "$CUDA/lib64/stubs/libcuda.so" ]; then
  mkdir -p "$WORK/stubdrv"
  ln -sf "$CUDA/lib64/stubs/libcuda.so" "$WORK/stubdrv/libcuda.so.1"
  ln -sf "$NVML/lib/libnvidia-ml.so" "$WORK/stubdrv/libnvidia-ml.so.1"
  LD_LIBRARY_PATH="$WORK/stubdrv${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" run_info -c | grep -q '^UCX_CUDA_COPY_' ||
    die "the CUDA module does not load from the unpacked tree"
fi
say "modules: $(cd "$CHECK/lib/ucx" && ls -- *.so.0 | tr '\n' ' ')"
say "wrote $OUT ($(du -h "$OUT" | cut -f1))"
