#!/usr/bin/env bash
# Issue 46's periodic bulk-water student on one GPU host, in one command: trains it on GFN2-xTB
# labels of 32-water boxes (warm start from the shipped cluster student, within MINUTES), scores
# it and the cluster student on the held-out frames, times one call against the teacher's time
# recorded in the labels, runs it NVT at 300 K in a 4,998-atom box
# (STEPS of 0.5 fs, the Fu et al. bond check, O-O g(r) after the first 10 ps), then NPT at 1 bar
# from that run's last frame (NPT_STEPS). Numpy is the only Python package it needs.
#
#   bash benches/distill/water_bulk.sh MLFF DATA OUT [MINUTES] [STEPS] [NPT_STEPS]
#
# DEVICE (default cuda) and WATERS (default 1666) change the device and the MD box.
# DATA holds train.extxyz, val.extxyz and test.extxyz (models/README.md says how they were
# sampled and labelled). OUT gets the training folder, eval-*.json, nvt-*/npt-* summaries and
# logs, rdf-nvt.json, and the trajectories.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
mlff=$1 data=$2 out=$3 minutes=${4:-4} steps=${5:-50000} npt_steps=${6:-10000}
device=${DEVICE:-cuda} waters=${WATERS:-1666}
mkdir -p "$out"
tools=benches/distill/water_tools.py
echo "== train ($minutes min)"
MLFF=$mlff models/train_timed.sh "$minutes" "$out/train" --train "$data/train.extxyz" \
  --val "$data/val.extxyz" --init models/painn-gfn2.safetensors \
  --train-config models/recipes/gfn2-water-bulk.json --device "$device" 2> "$out/train.log" || {
    tail -5 "$out/train.log" >&2; exit 1; }
tail -2 "$out/train.log"
student=$out/train/last.safetensors
echo "== held-out frames"
for m in "$student" models/painn-gfn2.safetensors; do
  name=$(basename "$m" .safetensors)
  "$mlff" eval "$m" "$data/test.extxyz" --device "$device" --json "$out/eval-$name.json" \
    > "$out/eval-$name.txt" 2>&1 || { tail -5 "$out/eval-$name.txt" >&2; exit 1; }
  echo "$name"; grep -E "all|force|stress" "$out/eval-$name.txt" | head -6
done
echo "== one call against the teacher's recorded time per frame"
"$mlff" bench --model "$student" --systems none --teacher-data "$data/test.extxyz" \
  --backend fused --device "$device" --max-seconds 3 > "$out/speed.txt" 2>&1 || tail -3 "$out/speed.txt"
grep -A3 "^| molecule" "$out/speed.txt" || true
echo "== NVT 300 K, $steps steps, $((3 * waters)) atoms"
python3 "$tools" box "$waters" 1.0 0 "$out/box.extxyz"
run_md() {  # name, then mlff md arguments
  local name=$1; shift
  "$mlff" md --model "$student" --temperature 300 --device "$device" --log-every 1000 \
    --log "$out/$name.jsonl" --summary-json "$out/$name-summary.json" "$@" \
    > "$out/$name.txt" 2>&1 || echo "$name: exit $? (see $name.txt)"
  tail -6 "$out/$name.txt"
}
run_md nvt --structure "$out/box.extxyz" --ensemble nvt --steps "$steps" \
  --traj "$out/nvt.extxyz" --traj-every 1000
python3 "$tools" rdf "$out/rdf-nvt.json" "$out/nvt.extxyz" 20 || echo "no g(r): too few frames"
echo "== NPT 1 bar, $npt_steps steps, from the NVT run's last frame"
run_md npt --structure "$out/nvt.extxyz" --frame -1 --keep-momenta --ensemble npt \
  --pressure 1 --steps "$npt_steps" --traj "$out/npt.extxyz" --traj-every 1000
