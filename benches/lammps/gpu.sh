#!/usr/bin/env bash
# On the GPU host, from the repository root: issue 47's GPU runs in one command.
#   bash benches/lammps/gpu.sh LAMMPS_PACK [TEST_PACK]
# LAMMPS_PACK is benches/lammps/pack.sh's tarball of a CUDA build (lammps/build.sh --features
# cuda, cargo build --release --features cuda); TEST_PACK, benches/gpu/build.sh's, adds the
# CUDA-vs-CPU domain tests (tests/gpu/domain.rs) first. Then benches/lammps/water.sh on the
# GPUs nvidia-smi lists: one rank per GPU, ~100,000 and ~1,000,000 atoms (strong scaling,
# beside `mlff md` on one GPU), then weak scaling at ~100,000 atoms per GPU. Logs go to $OUT.
set -uo pipefail
pack=${1:?usage: gpu.sh LAMMPS_PACK [TEST_PACK]}
tests=${2:-}
out=${OUT:-/tmp/mlff-lammps-gpu}
mkdir -p "$out"
for lib in /usr/local/cuda/lib64 /usr/local/cuda-13.0/targets/x86_64-linux/lib \
           /usr/local/cuda-12/lib64 /usr/local/nvidia/lib64; do
  [ -d "$lib" ] && export LD_LIBRARY_PATH="$lib:${LD_LIBRARY_PATH:-}"
done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpus.txt"
gpus=$(nvidia-smi -L | wc -l)

if [ -n "$tests" ]; then
  timeout 150 bash benches/gpu/run.sh "$tests" test domain 2>&1 | tail -8
fi

dir=/tmp/mlff-lammps-runtime
rm -rf "$dir" && mkdir -p "$dir" && tar -xJf "$pack" -C "$dir"
# shellcheck disable=SC1091
source "$dir/mlff-lammps/env.sh"
ranks=1
for n in 2 4 8; do [ "$n" -le "$gpus" ] && ranks="$ranks $n"; done
bench() { timeout "$1" bash benches/lammps/water.sh --device cuda "${@:2}"; }
echo "=== strong scaling: 98,304 and 943,296 atoms on $ranks rank(s)"
bench 200 --ranks "$ranks" --replicas 8 --steps 300 --out "$out/strong-98k"
bench 240 --ranks "$ranks" --replicas 17 --steps 100 --out "$out/strong-943k"
if [ "$gpus" -gt 1 ]; then
  echo "=== weak scaling: 98,304 atoms per rank"
  bench 300 --ranks "$ranks" --replicas 8 --steps 100 --weak --out "$out/weak"
fi
