# Sourced by the scripts/device-*.sh runners: what they share on the device machine.

# The directory holding SONAME ($1) of the CUDA libraries: the toolkit's or the system's, else
# NVIDIA's Python wheel (module nvidia.$2, or the cu13 bundle); nothing when none has it.
duet_cuda_lib_dir() {
  local d
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu \
           $(python3 -c "import nvidia.$2, os; print(os.path.join(list(nvidia.$2.__path__)[0], 'lib'))" 2>/dev/null) \
           $(python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))' 2>/dev/null); do
    if [ -e "$d/$1" ]; then
      echo "$d"
      return 0
    fi
  done
  return 1
}

# Here, before a run on the GPU machine: configure BUILD ($1; sm_90 only, no tests) if it has no
# build.ninja yet, build the targets that follow, and refresh $ROOT/.bundle.
duet_device_prepare() {
  local build="$1"
  shift
  if [ ! -f "$build/build.ninja" ]; then
    meson setup "$build" "$ROOT" -Dcuda=enabled -Dtests=false -Dgpu_archs=90 || return 1
  fi
  ninja -C "$build" "$@" && "$ROOT/scripts/make-bundle.sh"
}

# Where a runner's files go: DIR ($1, under the build directory).  When $OUT is set (the GPU
# machine's folder whose files come back, at most eight of them), at the script's exit $OUT gets
# DIR's summary.txt, the files matching the globs ($2, relative to DIR; five at most) and all of
# DIR but Nsight's binary reports as one tarball, NAME-files.tgz; a run that wrote its many logs
# into $OUT itself lost its summary to the limit.  Sets RES.
duet_device_results() {
  RES="$1"
  DUET_RESULTS_KEEP="${2:-}"
  mkdir -p "$RES"
  [ -n "${OUT:-}" ] && trap duet_device_pack_results EXIT
  return 0
}
duet_device_pack_results() {
  local n=0 pat f
  [ -f "$RES/summary.txt" ] && cp "$RES/summary.txt" "$OUT/"
  for pat in $DUET_RESULTS_KEEP; do
    for f in "$RES"/$pat; do
      if [ -f "$f" ] && [ "$n" -lt 5 ]; then
        cp "$f" "$OUT/" && n=$((n + 1))
      fi
    done
  done
  tar -czf "$OUT/$(basename "$RES")-files.tgz" --exclude='*.ncu-rep' -C "$(dirname "$RES")" "$(basename "$RES")" \
    2>/dev/null
  return 0
}

# Nsight Compute's command line: on PATH, or where the CUDA image installs it; nothing when none.
duet_ncu() { command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | tail -1; }

# cuBLAS / cuBLASLt 13; NCCL (tensor parallelism loads it at run time).
duet_cublas_dir() { duet_cuda_lib_dir libcublasLt.so.13 cublas; }
duet_nccl_dir() { duet_cuda_lib_dir libnccl.so.2 nccl; }

# The runtime of the copied binaries on the device machine, under WORK ($1): the .deb files
# of $ROOT/.bundle unpacked (dpkg -x) into WORK/bundle, and of their libraries only the sonames
# the image lacks copied into WORK/libs (first on LD_LIBRARY_PATH); cuBLAS and NCCL from the
# image; redis-server (always the bundle's: Debian's redis-server is redis-check-rdb under
# another name, which picks its mode from argv[0]) and curl (the image's if it has one) in
# WORK/bin (first on PATH).  Where the bundle holds UCX built with CUDA (scripts/make-ucx-cuda.sh)
# and DUET_DEVICE_UCX is not "debian", that UCX is used.  The executables named after WORK must
# then resolve every library; prints what it did, returns 1 when one does not.
duet_device_runtime() {
  local work="$1"
  shift
  local libs="$work/libs" progs="$work/bin" bundle="$work/bundle" f so e m missing pass d
  mkdir -p "$libs" "$progs" "$bundle"
  for f in "$ROOT"/.bundle/*.deb; do dpkg -x "$f" "$bundle" || echo "runtime: dpkg -x $f failed"; done
  if [ "${DUET_DEVICE_UCX:-cuda}" != debian ] && declare -F duet_ucx_cuda_env >/dev/null; then
    duet_ucx_cuda_env "$ROOT" || echo "runtime: UCX with CUDA: none in .bundle, Debian's UCX"
  fi
  export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PATH="$progs:$PATH"
  d="$(duet_cublas_dir)" && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
  if d="$(duet_nccl_dir)"; then
    export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
    echo "runtime: NCCL from $d"
  else
    echo "runtime: no libnccl.so.2 found: tensor parallelism will be refused"
  fi
  export NCCL_NVLS_ENABLE=0
  ln -sf "$bundle/usr/bin/redis-check-rdb" "$progs/redis-server"
  command -v curl >/dev/null 2>&1 || ln -sf "$bundle/usr/bin/curl" "$progs/curl"
  local exes="$* $bundle/usr/bin/redis-check-rdb $(readlink -f "$(command -v curl)")"
  for pass in 1 2 3 4 5; do
    missing="$(for e in $exes; do ldd "$e" 2>/dev/null | awk '/not found/ {print $1}'; done | sort -u)"
    [ -z "$missing" ] && break
    for so in $missing; do
      f="$(find "$bundle" -name "$so" | head -1)"
      if [ -n "$f" ]; then cp -L "$f" "$libs/$so"; else echo "runtime: $so is in neither the image nor the bundle"; fi
    done
  done
  echo "runtime: libraries taken from the bundle: $(ls "$libs" | tr '\n' ' ')"
  for e in $exes; do
    [ -x "$e" ] || { echo "runtime: $e is missing"; return 1; }
    m="$(ldd "$e" 2>&1 | grep 'not found' || true)"
    [ -z "$m" ] || { echo "runtime: $e: unresolved libraries: $m"; return 1; }
  done
  echo "runtime: redis-server: $(redis-server --version 2>&1 | head -1)"
}

# UCX 1.13.1 built with CUDA (scripts/make-ucx-cuda.sh), so that the data plane registers device
# memory and puts device to device (cuda_copy, cuda_ipc over NVLink) instead of staging through
# host memory.  duet_ucx_cuda_env ROOT: when ROOT/.bundle/ucx-cuda-1.13.1.tgz is there, unpacks it
# once into ROOT/.bundle/ucx-cuda (again only when the tarball changed), puts its lib/ first on
# LD_LIBRARY_PATH and prints which UCX that is; returns 1, saying nothing, when the tarball is
# absent.  Its libucp.so.0 and friends must come before any other UCX on the path; what they
# link besides comes from the image or the bundle as for Debian's UCX (libnuma.so.1), or from
# the driver (libcuda.so.1, libnvidia-ml.so.1).
duet_ucx_cuda_env() {
  local root="${1:?usage: duet_ucx_cuda_env ROOT}"
  local tgz="$root/.bundle/ucx-cuda-1.13.1.tgz" dir="$root/.bundle/ucx-cuda" stamp version
  [ -f "$tgz" ] || return 1
  stamp="$(cksum < "$tgz")"
  if [ ! -e "$dir/lib/libucp.so.0" ] || [ "$(cat "$dir/.stamp" 2>/dev/null)" != "$stamp" ]; then
    rm -rf "$dir" "$dir.part"
    mkdir -p "$dir.part"
    if ! tar xzf "$tgz" -C "$dir.part"; then
      rm -rf "$dir.part"
      echo "duet: cannot unpack $tgz" >&2
      return 1
    fi
    echo "$stamp" > "$dir.part/.stamp"
    mv "$dir.part" "$dir"
  fi
  case ":${LD_LIBRARY_PATH:-}:" in
    *":$dir/lib:"*) ;;
    *) export LD_LIBRARY_PATH="$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ;;
  esac
  case ":$PATH:" in  # its ucx_info: what ./duet asks to choose the transports
    *":$dir/bin:"*) ;;
    *) export PATH="$dir/bin:$PATH" ;;
  esac
  version="$("$dir/bin/ucx_info" -v 2>/dev/null | sed -n 's/^# Version //p')"
  echo "duet: UCX ${version:-?} with CUDA from $dir/lib"
}
