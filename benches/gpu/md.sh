#!/usr/bin/env bash
# MD on the GPU machine, from the repository root, after benches/gpu/build.sh made the pack
# PACK (a path; see benches/gpu/README.md): the CUDA-vs-CPU tests (MD included), the 10,000-step
# aspirin NVE run with the shipped student, and MD throughput of aspirin (our ops and candle's
# stock ops) and of a 5,001-atom periodic water box. Results go to $OUT.
set -uo pipefail
: "${PACK:?set PACK to the tarball benches/gpu/build.sh made}"
out=${OUT:-/tmp/mlff-md-gpu}; mkdir -p "$out"
model=models/painn-gfn2.safetensors
aspirin=data/gfn2/start/aspirin.extxyz
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  timeout 300 bash benches/gpu/run.sh "$PACK" test
  echo "tests exit code: $?"
} > "$out/tests.log" 2>&1
tail -5 "$out/tests.log"
bin=$(bash benches/gpu/run.sh "$PACK" unpack)
export LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
md() { timeout "$1" "$bin/mlff" md --model "$model" --device cuda "${@:2}"; }
echo "=== aspirin NVE 10,000 steps (custom ops)"
md 240 --structure "$aspirin" --steps 10000 --log "$out/aspirin_nve.jsonl" \
  --summary-json "$out/aspirin_nve_summary.json" 2>&1 | tail -6
echo "=== aspirin NVE 2,000 steps (stock ops)"
md 120 --structure "$aspirin" --steps 2000 --backend stock \
  --summary-json "$out/aspirin_stock_summary.json" 2>&1 | tail -6
echo "=== water box 5,001 atoms NVE 300 steps"
timeout 200 "$bin/md_water_box" /tmp/water5001 1667 300 nve 2>&1 | tail -3
cp /tmp/water5001/summary.json "$out/water5001_summary.json" 2>/dev/null
