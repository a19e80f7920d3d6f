#!/usr/bin/env bash
# One GPU session's checks and timings, on the GPU machine, from the repository root, after
# `GPU_TESTS="gpu gpu_second_order" ../shared/gpu/bundle.sh` here (see ../shared/gpu/README.md):
#   CUDA-vs-CPU tests, mlff check, predict on CUDA, mlff bench (our ops vs candle's stock ops)
#   and the PyTorch reference of the same model and weights, all in one device command.
# Results go to $OUT (the device tool brings them back).
set -uo pipefail
out=${OUT:-/tmp/mlff-gpu-suite}; mkdir -p "$out"
model=models/painn-gfn2.safetensors
systems=/tmp/mlff-systems; rm -rf "$systems"
mlff="bash .gpu/run.sh exec mlff"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  git log -1 --format='commit %H' 2>/dev/null || true
  timeout 300 bash .gpu/run.sh test
  echo "tests exit code: $?"
} 2>&1 | tee "$out/tests.log"
$mlff check --json "$out/check.json" --device cuda
timeout 60 $mlff predict "$model" data/aspirin_rmd17_10frames.extxyz --device cuda -o "$out/predict_cuda.extxyz"
{
  timeout 120 $mlff bench --model "$model" --device cuda --systems aspirin,aspirin-x64,water-1000 \
    --ops custom,stock --warmup 10 --repeats 50 --export "$systems" --json "$out/bench_small.json"
  timeout 180 $mlff bench --model "$model" --device cuda --systems water-10000 \
    --ops custom,stock --warmup 2 --repeats 5 --export "$systems" --json "$out/bench_large.json"
  timeout 120 python3 benches/reference/painn_torch.py "$model" "$systems" --json "$out/torch.json"
} 2>&1 | tee "$out/bench.md"
