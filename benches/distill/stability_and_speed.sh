#!/usr/bin/env bash
# The checks every distilled student of issue 46 gets, for a finished `mlff distill` run RUN:
# the Fu et al. protocol on every seed at once (NVT 500 K, 0.5 fs, STEPS = 600,000 = 300 ps,
# the 0.5 Å bond check; summary in OUT/fu.json), then one call of the student against the
# teacher's time recorded in the held-out frames (`mlff bench --teacher-data`).
#
#   bash benches/distill/stability_and_speed.sh MLFF RUN OUT [STEPS]
#
# DEVICE (default cuda); BOND_LIMIT (default 0.5 Å, Fu et al.'s for molecules; silicon.sh
# gives a crystal's).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
mlff=$1 run=$2 out=$3 steps=${4:-600000}
device=${DEVICE:-cuda} bond_limit=${BOND_LIMIT:-0.5}
student=$run/student.safetensors
echo "== Fu et al.: every seed at 500 K, $steps steps of 0.5 fs"
"$mlff" md --model "$student" --structure "$run/data/start.extxyz" --all-frames --ensemble nvt \
  --temperature 500 --dt 0.5 --steps "$steps" --seed 7 --device "$device" --bond-limit "$bond_limit" \
  --log "$out/fu.jsonl" --log-every 20000 --summary-json "$out/fu.json" --overwrite \
  > "$out/fu.txt" 2>&1 || echo "md exit $? (4: a system went unstable)"
tail -4 "$out/fu.txt"
echo "== one call against the teacher's recorded time"
"$mlff" bench --model "$student" --systems none --teacher-data "$run/data/test.extxyz" \
  --backend fused --device "$device" --max-seconds 2 | grep -A12 '^| molecule'
