# Sourced by the scripts/device-*.sh runners: what they share on the device machine.

# The directory holding cuBLAS / cuBLASLt 13: the CUDA toolkit's, else the Python wheel's
# (nvidia-cublas or the cu13 bundle); nothing when neither is there.
duet_cublas_dir() {
  local d
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
           $(python3 -c 'import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], "lib"))' 2>/dev/null) \
           $(python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))' 2>/dev/null); do
    if [ -e "$d/libcublasLt.so.13" ]; then
      echo "$d"
      return 0
    fi
  done
  return 1
}
