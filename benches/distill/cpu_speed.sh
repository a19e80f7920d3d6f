#!/usr/bin/env bash
# A distilled student against its CPU teacher (GFN2-xTB) on the same CPU core, one thread each,
# on the same held-out frames (every 5th at 300 K), with PyTorch eager of the same model and
# weights beside (issue 46: the speedup over each teacher on the same hardware class).
#
#   bash benches/distill/cpu_speed.sh MLFF MODEL TEST.extxyz OUT [CORE]
#
# TEST.extxyz: held-out frames with `molecule` and `temperature_K` (data/gfn2-organic/test.extxyz).
# Needs ase and tblite in python3 (the teacher, through teachers/label.py) and, for the peer,
# torch and safetensors in $TORCH_PYTHON (default python3; the peer is skipped without torch).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
mlff=$1 model=$2 test=$3 out=$4 core=${5:-0}
torch_python=${TORCH_PYTHON:-python3}
mkdir -p "$out"
one() { OMP_NUM_THREADS=1 RAYON_NUM_THREADS=1 taskset -c "$core" "$@"; }
python3 - "$test" "$out/frames.extxyz" <<'PY'
import sys
from ase.io import read, write
frames = [a for a in read(sys.argv[1], ":") if float(a.info["temperature_K"]) == 300.0]
by = {}
for a in frames:
    by.setdefault(a.info["molecule"], []).append(a)
write(sys.argv[2], [a for m in sorted(by) for a in by[m][::5]])
PY
echo "== GFN2-xTB on core $core, one thread"
one python3 teachers/label.py --teacher gfn2 --drop-old-labels --quiet --overwrite \
  -o "$out/labelled.extxyz" "$out/frames.extxyz"
echo "== the student on core $core, one thread"
one "$mlff" bench --model "$model" --systems none --teacher-data "$out/labelled.extxyz" \
  --backend fused --device cpu --max-seconds 3 | tee "$out/student.txt" | grep -A14 '^| molecule'
echo "== the same model, ours and PyTorch eager, on core $core, one thread"
one "$mlff" bench --model "$model" --systems ethanol,benzene,aspirin,alanine_dipeptide,trialanine,water8 \
  --backend fused --device cpu --max-seconds 3 --export "$out/export" --overwrite \
  | tee "$out/ours.txt" | grep -E '^\| (system|[a-z_0-9]+ \| 1 )'
if "$torch_python" -c "import torch, safetensors" 2>/dev/null; then
  one "$torch_python" benches/reference/painn_torch.py "$model" "$out/export" --device cpu \
    --forms eager --no-compile --json "$out/torch.json" | grep '^|'
else
  echo "no torch and safetensors in $torch_python: the PyTorch peer skipped"
fi
