#!/usr/bin/env bash
# Issue 46's SevenNet-0 student of a periodic material on one GPU host: `mlff distill` from
# examples/distill/sevennet-silicon.json (64-atom diamond-silicon cells at three lattice
# constants, 300 and 900 K, stress in the loss; SevenNet-0 on the GPU), started or resumed in
# OUT/run; the student on the held-out frames (with stress); NPT at 1 bar and 300 K of a
# 512-atom cell (NPT_STEPS of 1 fs) from the middle lattice constant (its summary gives the
# mean density); then the checks every distilled student gets.
#
#   bash benches/distill/silicon.sh MLFF OUT [NPT_STEPS] [STEPS]
#
# python3 needs ase and sevenn 0.13.0 (its deps: torch, e3nn, torch-geometric, ...); DEVICE
# (default cuda); DISTILL_FLAGS: more `mlff distill` flags.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
mlff=$1 out=$2 npt_steps=${3:-20000} steps=${4:-600000}
device=${DEVICE:-cuda}
run=$out/run
mkdir -p "$out"
CONFIG=examples/distill/sevennet-silicon.json bash benches/distill/loop.sh "$mlff" "$run" \
  --device "$device"
student=$run/student.safetensors
echo "== held-out frames"
"$mlff" eval "$student" "$run/data/test.extxyz" --device "$device" | grep -E '^\||stress'
echo "== NPT, 1 bar, 300 K, 512 atoms, $npt_steps steps of 1 fs"
python3 - "$out/si512.extxyz" <<'PY'
import sys
import ase.io
from ase.build import bulk
ase.io.write(sys.argv[1], bulk("Si", "diamond", a=5.43, cubic=True).repeat(4), format="extxyz")
PY
"$mlff" md --model "$student" --structure "$out/si512.extxyz" --ensemble npt --pressure 1 \
  --temperature 300 --dt 1.0 --steps "$npt_steps" --seed 3 --device "$device" --bond-limit 1.0 \
  --log "$out/npt.jsonl" --log-every 1000 --summary-json "$out/npt.json" --overwrite \
  > "$out/npt.txt" 2>&1 || echo "md exit $? (4: unstable)"
tail -6 "$out/npt.txt"
DEVICE=$device BOND_LIMIT=1.0 bash benches/distill/stability_and_speed.sh "$mlff" "$run" "$out" "$steps"
