#!/usr/bin/env bash
# On the GPU host, from the repository root: unpacks a pack that benches/gpu/build.sh made and
# runs its tests or one of its programs.
#   bash benches/gpu/run.sh PACK.tar.xz test [FILTER]     every packed test binary
#   bash benches/gpu/run.sh PACK.tar.xz exec NAME [ARGS]  one packed program
#   bash benches/gpu/run.sh PACK.tar.xz unpack            only unpack (prints the bin folder)
# The CUDA libraries (libcublas.so.12 or .13 and the driver's libcuda) must be findable; the
# script adds the usual CUDA folders to LD_LIBRARY_PATH.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
pack=${1:?usage: run.sh PACK.tar.xz test|exec|unpack ...}; shift
name=$(basename "$pack" .tar.xz)
dest=/tmp/mlff-$name
# Unpacked once per pack content (the marker holds its checksum); a failed unpack leaves none.
# Runs started side by side (one per GPU) take turns here: one unpacks, the others wait.
sum=$(cksum < "$pack")
{
  flock 9
  if [ "$(cat "$dest/.unpacked" 2>/dev/null)" != "$sum" ]; then
    rm -rf "$dest" && mkdir -p "$dest"
    tar -xJf "$pack" -C "$dest" --strip-components=1 || { echo "cannot unpack $pack" >&2; exit 1; }
    echo "$sum" > "$dest/.unpacked"
  fi
} 9> "$dest.lock"
for lib in /usr/local/cuda/lib64 /usr/local/cuda-13.0/targets/x86_64-linux/lib \
           /usr/local/cuda-12/lib64 /usr/local/nvidia/lib64; do
  [ -d "$lib" ] && export LD_LIBRARY_PATH="$lib:${LD_LIBRARY_PATH:-}"
done
# libnccl for builds with the `nccl` feature: the wheel PyTorch installs.
nccl=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null)
[ -n "$nccl" ] && [ -d "$nccl" ] && export LD_LIBRARY_PATH="$nccl:${LD_LIBRARY_PATH:-}"
root=$(cat "$dest/build-root")
if [ "$root" != "$PWD" ] && [ ! -e "$root" ]; then
  mkdir -p "$(dirname "$root")" && ln -s "$PWD" "$root"
fi
cmd=${1:-test}; shift || true
case "$cmd" in
  test)
    rc=0
    for t in "$dest"/tests/*; do
      echo "=== $(basename "$t")"
      "$t" "$@" || rc=1
    done
    exit $rc ;;
  exec) prog=$1; shift; exec "$dest/bin/$prog" "$@" ;;
  unpack) echo "$dest/bin" ;;
  *) echo "usage: run.sh PACK.tar.xz test [FILTER] | exec NAME [ARGS] | unpack" >&2; exit 2 ;;
esac
