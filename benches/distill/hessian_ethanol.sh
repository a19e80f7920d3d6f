#!/usr/bin/env bash
# Hessian-informed training against plain training at the same teacher budget (issue 46):
# ethanol GFN2-xTB frames of data/gfn2/, a 64-feature student, the exact double backward for
# every run so that the H·v term is the only difference.
#
#   hvp100:   every third training frame (100) with one Hessian-vector label each: 300 teacher calls
#   plain300: all 300 training frames: 300 teacher calls
#   plain100: the same 100 frames without the H·v label
#
#   bash benches/distill/hessian_ethanol.sh MLFF PYTHON OUT [DEVICE] [EPOCHS] [WEIGHT]
#
# PYTHON needs ase and tblite. Writes OUT/RUN/eval.json per run and prints a table of the test
# split's errors (the 600 K trajectory of seed 1, never trained on).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
mlff=$1 python=$2 out=$3 device=${4:-cpu} epochs=${5:-200} weight=${6:-1.0}
mkdir -p "$out"
"$python" - "$out/sub100.extxyz" <<'PY'
import sys
lines = open("data/gfn2/ethanol_train.extxyz").read().splitlines(keepends=True)
frames, i = [], 0
while i < len(lines):
    n = int(lines[i]); frames.append("".join(lines[i:i + n + 2])); i += n + 2
open(sys.argv[1], "w").write("".join(frames[::3]))
PY
OMP_NUM_THREADS=1 "$python" teachers/label.py "$out/sub100.extxyz" -o "$out/hvp100.extxyz" \
  --teacher gfn2 --hessian-vectors --quiet --overwrite
echo '{"hidden": 64, "n_blocks": 3, "n_rbf": 20, "cutoff": 5.0, "elements": [1, 6, 7, 8]}' > "$out/model.json"
common=(--val data/gfn2/ethanol_val.extxyz --config "$out/model.json" --epochs "$epochs"
  --batch-size 16 --lr 1e-3 --val-every 10 --force-gradient double-backward --device "$device")
run() {
  local name=$1; shift
  "$mlff" train "${common[@]}" --out "$out/$name" --overwrite "$@" 2> "$out/$name.log"
  "$mlff" eval "$out/$name/best.safetensors" data/gfn2/ethanol_test.extxyz --device "$device" \
    --json "$out/$name/eval.json" > /dev/null
}
run hvp100 --train "$out/hvp100.extxyz" --hessian-weight "$weight"
run plain300 --train data/gfn2/ethanol_train.extxyz
run plain100 --train "$out/sub100.extxyz"
"$python" - "$out" <<'PY'
import json, sys
print("| run | frames | teacher calls | test F MAE meV/Å | test E MAE meV/atom |")
print("|---|---:|---:|---:|---:|")
for name, frames in [("hvp100", 100), ("plain300", 300), ("plain100", 100)]:
    r = json.load(open(f"{sys.argv[1]}/{name}/eval.json"))["report"]["overall"]
    calls = 3 * frames if name.startswith("hvp") else frames
    print(f"| {name} | {frames} | {calls} | {r['force_mae'] * 1e3:.2f} | {r['energy_per_atom_mae'] * 1e3:.3f} |")
PY
