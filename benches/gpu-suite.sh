#!/usr/bin/env bash
# One GPU session's checks and timings, on the GPU machine, from the repository root, after
# `GPU_TESTS="gpu gpu_second_order" GPU_BINS="mlff fused_kernel_times" ../shared/gpu/bundle.sh`
# here (see ../shared/gpu/README.md): CUDA-vs-CPU tests, mlff check, mlff bench (every system
# size and batch; our ops, the fused kernels and candle's stock ops) and the PyTorch reference of
# the same model, weights and inputs, per-kernel times of the fused path, then mlff profile of an
# aspirin MD run with our ops and with the fused kernels — all in one device command.
# PARTS picks a subset (default "tests bench torch kernels profile"), to split the work over two
# device calls that each stay under the 10-minute limit.
# Results: $OUT/suite.tar.gz (everything) plus the markdown summaries beside it.
# RUN_TESTS=0 skips the tests (when another process runs them); the bundle must then already be
# unpacked (any earlier `bash .gpu/run.sh ...` does that).
set -uo pipefail
out=${OUT:-/tmp/mlff-gpu-suite}; mkdir -p "$out"
work=/tmp/mlff-suite; rm -rf "$work"; mkdir -p "$work"
model=models/painn-gfn2.safetensors
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$work/gpu.txt"
parts=" ${PARTS:-tests bench torch kernels profile} "
has() { [[ "$parts" == *" $1 "* ]]; }
if has tests && [ "${RUN_TESTS:-1}" != 0 ]; then
  { timeout 240 bash .gpu/run.sh test; echo "tests exit code: $?"; } > "$work/tests.log" 2>&1
  grep -E "^(===|test result)|FAILED|panicked|exit code" "$work/tests.log" > "$out/tests.log"
fi
[ -d /tmp/gpu-bundle/bin ] || bash .gpu/run.sh exec mlff --version > /dev/null
bin=/tmp/gpu-bundle/bin   # unpacked by run.sh
export LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
"$bin/mlff" check --json "$work/check.json" --device cuda > "$work/check.txt" 2>&1
if has bench; then
  timeout 330 "$bin/mlff" bench --model "$model" --device cuda --ops "${OPS:-custom,fused,stock}" \
    --warmup 5 --repeats 30 --max-seconds 3 --export "$work/systems" --out "$work/bench" \
    > "$out/bench.md" 2> "$work/bench.err"
fi
if has torch; then
  timeout 180 python3 benches/reference/painn_torch.py "$model" "$work/systems" \
    --json "$work/torch.json" > "$out/torch.md" 2> "$work/torch.err"
fi
rm -rf "$work/systems"
if has kernels; then
  timeout 120 "$bin/fused_kernel_times" cuda aspirin,water-1000,water-10000 \
    > "$out/kernels.md" 2> "$work/kernels.err"
fi
if has profile; then
  for ops in custom fused; do
    timeout 120 "$bin/mlff" profile "$model" data/gfn2/start/aspirin.extxyz --device cuda \
      --ops "$ops" --steps 1000 --out "$work/profile-$ops" \
      --trace "$work/profile-$ops/trace.json" > "$out/profile-$ops.md" 2> "$work/profile-$ops.err"
  done
fi
tar -C "$work" -czf "$out/suite.tar.gz" .
