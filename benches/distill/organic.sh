#!/usr/bin/env bash
# Issue 46's GFN2 organic student (models/painn-gfn2-organic.safetensors) on one GPU host:
#   1. `mlff distill` from examples/distill/gfn2-organic.json (six molecules and water clusters
#      of 1-20, GFN2-xTB on the host's cores), started or resumed in OUT/run (loop.sh), with
#      its second stage (`refine`: energy weight 1000 on every labelled frame, from the loop's
#      last student; the loop's weight of 1 leaves each molecule's energy offset loose);
#   2. the loop's last student and the second stage's on the held-out frames (teacher MD of a
#      seed never trained on), per temperature;
#   3. the Fu et al. stability run: every seed at once, NVT 500 K, 0.5 fs, STEPS (600,000 =
#      300 ps), the 0.5 Å bond check;
#   4. one call against the teacher's recorded time per frame.
#
#   bash benches/distill/organic.sh MLFF OUT [STEPS]
#
# Step 1 resumes a run OUT holds; DEVICE (default cuda); DISTILL_FLAGS: more `mlff distill`
# flags (e.g. "--max-iterations 6"). ase and tblite must import in python3 (the teacher runs
# from this checkout's bridge).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
mlff=$1 out=$2 steps=${3:-600000}
device=${DEVICE:-cuda}
run=$out/run
mkdir -p "$out"
# A finished run resumed stays finished at once.
CONFIG=examples/distill/gfn2-organic.json bash benches/distill/loop.sh "$mlff" "$run" \
  --device "$device"
student=$run/student.safetensors
last=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['refined']['from_iteration'])" \
  "$run/state.json")
loop_student=$run/iter-$(printf %03d "$last")/student-0/best.safetensors
python3 - "$run/data/test.extxyz" "$out" <<'PY'
import sys
lines = open(sys.argv[1]).read().splitlines(True)
parts, i = {}, 0
while i < len(lines):
    n = int(lines[i])
    t = lines[i + 1].split("temperature_K=")[1].split()[0]
    parts.setdefault(t, []).extend(lines[i:i + 2 + n])
    i += 2 + n
for t, part in parts.items():
    open(f"{sys.argv[2]}/test-{float(t):g}K.extxyz", "w").writelines(part)
PY
for m in "$loop_student" "$student"; do
  for t in "$out"/test-*K.extxyz; do
    echo "== $m on $(basename "$t")"
    "$mlff" eval "$m" "$t" --device "$device" | grep '^|' | head -14
  done
done
bash benches/distill/stability_and_speed.sh "$mlff" "$run" "$out" "$steps"
