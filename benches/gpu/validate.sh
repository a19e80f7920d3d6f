#!/usr/bin/env bash
# `mlff validate-md` of the five shipped systems on a 4-GPU machine, one process per GPU (one
# process with several CUDA streams was measured slower per stream:
# docs/bench-log/06-bench-suite-baseline.md), with
# the CUDA tests and the GPU suite (benches/gpu/suite.sh) on GPUs that finish early. From the
# repository root after benches/gpu/build.sh made the pack PACK.
# Results: $OUT/validate.tar.gz (reports, plots, logs, trajectories) and summaries.
set -uo pipefail
: "${PACK:?set PACK to the tarball benches/gpu/build.sh made}"
out=${OUT:-/tmp/mlff-validate-out}; mkdir -p "$out"
work=/tmp/mlff-validate; rm -rf "$work"; mkdir -p "$work"
bin=$(bash benches/gpu/run.sh "$PACK" unpack)
export LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
validate() {  # GPU SYSTEM
  CUDA_VISIBLE_DEVICES=$1 timeout 500 "$bin/mlff" validate-md --device cuda --systems "$2" \
    --out "$work/$2" > "$work/$2.md" 2> "$work/$2.err"
}
gpu_tests() {
  timeout 600 bash benches/gpu/run.sh "$PACK" test
}
( validate 0 water8; validate 0 ethanol ) &
( validate 1 benzene; CUDA_VISIBLE_DEVICES=1 gpu_tests > "$work/tests.log" 2>&1 ) &
( validate 2 alanine_dipeptide; CUDA_VISIBLE_DEVICES=2 RUN_TESTS=0 OUT="$work/suite" timeout 250 bash benches/gpu/suite.sh ) &
( validate 3 trialanine ) &
wait
nvidia-smi --query-gpu=index,name,driver_version --format=csv > "$work/gpus.txt"
grep -E "^(===|test result)|FAILED|panicked" "$work/tests.log" > "$out/tests.log"
cat "$work"/{water8,ethanol,benzene,alanine_dipeptide,trialanine}.md > "$out/validate.md" 2>/dev/null
cp "$work/suite/bench.md" "$work/suite/torch.md" "$work/suite/profile.md" "$out/" 2>/dev/null
tar -C "$work" -czf "$out/validate.tar.gz" .
