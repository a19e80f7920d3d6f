#!/usr/bin/env bash
# Training throughput (BENCHMARKS.md, "Training throughput") in one command on the GPU host:
# our optimiser step (PACK's train_step_times harness: the fused gradient with its steps replayed
# as CUDA graphs, the frames held on the device or each batch uploaded, and op by op; the
# directional gradient through candle's autograd) beside
# the PyTorch training loop of the same model, loss and optimiser
# (benches/reference/train_torch.py: eager, and the whole step as a CUDA graph).
#
#   bash benches/gpu/train.sh PACK.tar.xz MODEL.safetensors TRAIN.extxyz [BATCH ...]
#
# Needs Python with PyTorch (CUDA build), numpy and safetensors for the reference.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
pack=${1:?usage: train.sh PACK.tar.xz MODEL TRAIN.extxyz [BATCH ...]}
model=${2:?model}
train=${3:?training frames}
shift 3
batches=${*:-8 32}
echo "device: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); $(date -u +%F)"
ours() { bash benches/gpu/run.sh "$pack" exec train_step_times "$model" "$train" "$@"; }
for b in $batches; do
  ours "$b" 100 fused auto 1 device
  ours "$b" 100 fused auto 1 host
  ours "$b" 100 fused off
  ours "$b" 30 directional off
done
python3 benches/reference/train_torch.py "$model" "$train" --batch $batches --steps 200
