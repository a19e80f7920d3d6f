#!/usr/bin/env bash
# Issue 46: four student shapes trained from scratch on the same ANI-2x labels
# (data/ani2x-organic/student-md.extxyz.xz), scored on the held-out test.extxyz beside the
# shipped student: does a larger student close the rows the ANI-2x student misses?
# A and C on GPU 0, B and D on GPU 1 (CUDA_VISIBLE_DEVICES); bench-log 77.
#
#   bash benches/distill/ani_capacity.sh MLFF [WORK]
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
bin=$(dirname "$1")
w=${2:-/tmp/mlff-ani-capacity}; mkdir -p "$w"
xz -dc data/ani2x-organic/student-md.extxyz.xz > $w/train.extxyz
echo '{"epochs": 250, "batch_size": 32, "lr": 0.001, "lr_min": 1e-05, "patience": 30, "val_every": 10}' > $w/tc.json
cfg() { echo "{\"hidden\":$1,\"n_blocks\":$2,\"n_rbf\":$3,\"cutoff\":5.0,\"elements\":[1,6,7,8]}" > $w/$4.json; }
cfg 128 3 20 A; cfg 192 3 20 B; cfg 128 4 20 C; cfg 128 3 28 D
run() { CUDA_VISIBLE_DEVICES=$2 timeout 400 $bin/mlff train --train $w/train.extxyz --val-fraction 0.15 --seed 0 \
  --config $w/$1.json --train-config $w/tc.json --out $w/$1 --device cuda > $w/$1.log 2>&1; echo "$1 exit $?" >> $w/$1.log; }
(run A 0; run C 0) & (run B 1; run D 1) & wait
echo "== shipped"; $bin/mlff eval models/painn-ani2x-organic.safetensors data/ani2x-organic/test.extxyz --device cuda 2>&1 | grep -E "^\| (all|trialanine|water8|water12|water20|aspirin) "
for m in A B C D; do
  echo "== $m $(cat $w/$m.json)"; tail -2 $w/$m.log
  s=$w/$m/best.safetensors; [ -f $s ] || s=$w/$m/last.safetensors
  $bin/mlff eval $s data/ani2x-organic/test.extxyz --device cuda 2>&1 | grep -E "^\| (all|trialanine|water8|water12|water20|aspirin) "
done
