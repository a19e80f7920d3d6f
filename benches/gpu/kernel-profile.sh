#!/usr/bin/env bash
# Every kernel of one eager energy+forces call under Nsight Compute, with the counters that
# benches/gpu/kernel_table.py turns into a per-kernel table of time, FLOP and bytes and their floors.
# On the GPU machine, from the repository root, after benches/gpu/build.sh made the pack PACK:
#   SYSTEMS="water-10000 aspirin-x64" bash benches/gpu/kernel-profile.sh
# Writes $OUT/kernels-SYSTEM.md (the table), $OUT/kernels-SYSTEM.csv (ncu's raw page).
set -uo pipefail
: "${PACK:?set PACK to the tarball benches/gpu/build.sh made}"
out=${OUT:-/tmp/mlff-kernel-profile}; mkdir -p "$out"
work=/tmp/mlff-kernel-profile-work; rm -rf "$work"; mkdir -p "$work"
bin=$(bash benches/gpu/run.sh "$PACK" unpack)
lib=/usr/local/cuda-13.0/targets/x86_64-linux/lib
export LD_LIBRARY_PATH="$lib:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}"
model=${MODEL:-models/painn-gfn2.safetensors}
device=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$device" in *H200*) peaks=h200 ;; *) peaks=h100 ;; esac

# Counters this ncu knows on this chip (an unknown name fails the whole run).
wanted="gpu__time_duration dram__bytes_read dram__bytes_write lts__t_bytes smsp__inst_executed
smsp__sass_thread_inst_executed_op_ffma_pred_on smsp__sass_thread_inst_executed_op_fadd_pred_on
smsp__sass_thread_inst_executed_op_fmul_pred_on sm__ops_path_tensor_src_tf32_dst_fp32
sm__ops_path_tensor_op_hmma_src_fp16_dst_fp32"
known=$(ncu --query-metrics 2>/dev/null | awk '{print $1}')
metrics=""
for m in $wanted; do
  if grep -qx "$m" <<< "$known"; then metrics="$metrics,$m.sum"; else echo "ncu lacks $m" >&2; fi
done
metrics=${metrics#,}

for system in ${SYSTEMS:-water-10000 aspirin-x64}; do
  # Warm-up and three calls, eager (no graph replays: each kernel is seen as launched).
  timeout 150 ncu --cache-control none --clock-control none --metrics "$metrics" \
    --export "$work/$system" --force-overwrite \
    "$bin/mlff" bench --model "$model" --device cuda --systems "$system" --backend fused \
    --graphs off --warmup 1 --repeats 3 --max-seconds 1 > "$work/$system.log" 2>&1 ||
    { echo "$system: ncu failed"; tail -5 "$work/$system.log"; continue; }
  ncu --import "$work/$system.ncu-rep" --csv --page raw > "$out/kernels-$system.csv"
  {
    echo "$system, $device, $(date -u +%F)"
    python3 benches/gpu/kernel_table.py "$out/kernels-$system.csv" --device "$peaks"
  } > "$out/kernels-$system.md"
  cat "$out/kernels-$system.md"
done
