#!/usr/bin/env bash
# One GPU session's checks and timings, on the GPU machine, from the repository root, after benches/gpu/build.sh made the pack
# PACK (a path; see benches/gpu/README.md): CUDA-vs-CPU and CUDA-graph
# tests, mlff check, mlff bench (every system size and batch; our ops, the fused kernels with and
# without CUDA graphs, candle's stock ops) and the PyTorch reference of the same model, weights
# and inputs (the call, and MD: benches/reference/md_torch.py), per-kernel times of the fused
# path with their FLOP and byte floors from the hardware counters (benches/gpu/kernel-profile.sh,
# Nsight Compute), mlff profile of an aspirin MD run, MD throughput with and without graphs
# (molecules and the 4,998-atom water box that the PyTorch MD runs too) and mlff validate-md
# with graphs. PARTS picks a subset (default "tests bench torch kernels profile md validate"), to
# split the work over device calls that each stay under the 10-minute limit.
# Results: $OUT/suite.tar.gz (everything) plus the markdown summaries beside it.
# RUN_TESTS=0 skips the tests (when another process runs them); the bundle must then already be
# unpacked (any earlier `bash benches/gpu/run.sh "$PACK" ...` does that).
set -uo pipefail
: "${PACK:?set PACK to the tarball benches/gpu/build.sh made}"
out=${OUT:-/tmp/mlff-gpu-suite}; mkdir -p "$out"
work=/tmp/mlff-suite; rm -rf "$work"; mkdir -p "$work"
model=models/painn-gfn2.safetensors
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$work/gpu.txt"
parts=" ${PARTS:-tests bench torch kernels profile md validate} "
has() { [[ "$parts" == *" $1 "* ]]; }
if has tests && [ "${RUN_TESTS:-1}" != 0 ]; then
  { timeout 420 bash benches/gpu/run.sh "$PACK" test; echo "tests exit code: $?"; } > "$work/tests.log" 2>&1
  grep -E "^(===|test result)|FAILED|panicked|exit code" "$work/tests.log" > "$out/tests.log"
fi
bin=$(bash benches/gpu/run.sh "$PACK" unpack)
export LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
"$bin/mlff" check --json "$work/check.json" --device cuda > "$work/check.txt" 2>&1
if has bench; then
  timeout 330 "$bin/mlff" bench --model "$model" --device cuda --backend "${BACKENDS:-autograd,fused,stock}" \
    --systems "ethanol,benzene,aspirin,alanine_dipeptide,trialanine,water-300,water-1000,\
water-3000,water-5000,water-10000,aspirin-x4,aspirin-x16,aspirin-x64" \
    --warmup 5 --repeats 30 --max-seconds 3 --export "$work/systems" --out "$work/bench" \
    > "$out/bench.md" 2> "$work/bench.err"
fi
if has torch; then
  timeout 420 python3 benches/reference/painn_torch.py "$model" "$work/systems" \
    --compile-systems aspirin,aspirin-x64,water-10000 --compile-budget 0 \
    --json "$work/torch.json" > "$out/torch.md" 2> "$work/torch.err"
  # PyTorch's MD (NVE, each step one CUDA graph): the MD part's systems, as exported.
  for s in benzene aspirin water-5000; do
    steps=5000; [ "$s" = water-5000 ] && steps=300
    timeout 150 python3 benches/reference/md_torch.py "$model" "$work/systems/$s.safetensors" \
      --steps "$steps" --json "$work/torch-md-$s.json"
  done > "$out/torch-md.md" 2>> "$work/torch.err"
fi
rm -rf "$work/systems"
if has kernels; then
  OUT="$out" SYSTEMS="aspirin water-1000 water-10000 aspirin-x64" \
    timeout 400 bash benches/gpu/kernel-profile.sh > "$out/kernels.md" 2> "$work/kernels.err"
fi
if has profile; then
  for ops in autograd fused; do
    timeout 120 "$bin/mlff" profile "$model" data/gfn2/start/aspirin.extxyz --device cuda \
      --backend "$ops" --steps 1000 --out "$work/profile-$ops" \
      --trace "$work/profile-$ops/trace.json" > "$out/profile-$ops.md" 2> "$work/profile-$ops.err"
  done
fi
if has md; then  # MD steps/s, CUDA graphs on and off alternated
  for g in on off on off; do
    for m in ethanol benzene aspirin trialanine; do
      echo -n "$m --graphs $g: "
      timeout 60 "$bin/mlff" md --model "$model" --structure "data/gfn2/start/$m.extxyz" \
        --device cuda --steps 5000 --graphs "$g" 2>&1 | grep -E "speed|rror"
    done
  done > "$out/md.md"
  for g in on off; do  # the box of the torch part's water-5000 (1,666 waters), NVE as there
    echo -n "water box 4,998 atoms NVE --graphs $g: "
    timeout 150 "$bin/md_water_box" "$work/water-$g" 1666 300 nve "$g" 2>&1 | tail -1
  done >> "$out/md.md"
fi
if has validate; then
  timeout 400 "$bin/mlff" validate-md --model "$model" --device cuda --out "$work/validate" \
    > "$out/validate.md" 2> "$work/validate.err"
fi
tar -C "$work" -czf "$out/suite.tar.gz" .
