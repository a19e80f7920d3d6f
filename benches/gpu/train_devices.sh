#!/usr/bin/env bash
# Data-parallel training throughput (BENCHMARKS.md, "Training on several GPUs") in one command
# on a GPU host with two or more GPUs: the optimiser step (PACK's train_step_times harness,
# built with GPU_FEATURES=nccl) on one GPU at batch B and on GPUS GPUs at batch GPUS·B (the
# same batch per GPU), then `mlff train --devices` end to end, beside the PyTorch training
# loop of the same model on one GPU (benches/reference/train_torch.py).
#
#   bash benches/gpu/train_devices.sh PACK.tar.xz MODEL.safetensors TRAIN.extxyz VAL.extxyz \
#     [GPUS [B ...]]
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
pack=${1:?usage: train_devices.sh PACK.tar.xz MODEL TRAIN.extxyz VAL.extxyz [GPUS [B ...]]}
model=${2:?model}
train=${3:?training frames}
val=${4:?validation frames}
gpus=${5:-2}
shift 5 2>/dev/null || shift $#
batches=${*:-8 32}
echo "devices: $(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | xargs); $(date -u +%F)"
ours() { bash benches/gpu/run.sh "$pack" exec train_step_times "$model" "$train" "$@"; }
for b in $batches; do
  ours "$b" 200 fused auto 1 | awk 'NR == 1'
  ours $((gpus * b)) 200 fused auto "$gpus" | awk 'NR == 1'
done
# End to end: 3 epochs each, validation every epoch (its time is outside structures/s).
all=$(seq -s, 0 $((gpus - 1)) | sed 's/\([0-9]\+\)/cuda:\1/g')
for b in $batches; do
  for devices in cuda:0 "$all"; do
    n=$(echo "$devices" | tr , '\n' | wc -l)
    out=$(mktemp -d)
    bash benches/gpu/run.sh "$pack" exec mlff train --init "$model" --train "$train" \
      --val "$val" --epochs 3 --batch-size $((n * b)) --devices "$devices" \
      --out "$out" 2>&1 | grep -E "^epoch|median" | sed "s/^/[$devices, batch $((n * b))] /"
    rm -rf "$out"
  done
done
python3 benches/reference/train_torch.py "$model" "$train" --batch $batches --steps 200
