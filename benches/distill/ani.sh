#!/usr/bin/env bash
# Issue 46's ANI-2x student on one GPU host: `mlff distill` from
# examples/distill/ani2x-organic.json with the ANI-2x weights in MODEL_DIR (a folder like
# ani-model-zoo's resources/: ani-2x_8x.info and ani-2x_8x/), started or resumed in OUT/run;
# then the student on the held-out frames, the 300 ps batch at 500 K (Fu et al.), and one
# call against the ANI-2x ensemble on the same GPU (benches/distill/ani_speed.py, one structure
# per call and batched, float32 and float64) beside `mlff bench` of the student.
#
#   bash benches/distill/ani.sh MLFF OUT MODEL_DIR [STEPS]
#
# python3 needs ase, torch and torchani 2.2.4 (with setuptools<81); DEVICE (default cuda);
# DISTILL_FLAGS: more `mlff distill` flags (e.g. "--max-iterations 4" to resume a finished run
# for more iterations).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
mlff=$1 out=$2 model_dir=$(realpath "$3") steps=${4:-600000}
device=${DEVICE:-cuda}
run=$out/run
mkdir -p "$out"
config=$out/ani2x-organic.json
# The example's model_dir is read from where the run starts; this one names MODEL_DIR, and its
# seed files are the example's (relative to the examples folder).
python3 - examples/distill/ani2x-organic.json "$config" "$model_dir" <<'PY'
import json, os, sys
src, dst, model_dir = sys.argv[1:]
cfg = json.load(open(src))
cfg["teacher"]["options"]["model_dir"] = model_dir
for s in cfg["seeds"]:
    s["file"] = os.path.abspath(os.path.join(os.path.dirname(src), s["file"]))
json.dump(cfg, open(dst, "w"), indent=1)
PY
CONFIG=$config bash benches/distill/loop.sh "$mlff" "$run" --device "$device"
student=$run/student.safetensors
echo "== held-out frames"
"$mlff" eval "$student" "$run/data/test.extxyz" --device "$device" | grep '^|' | head -14
bash benches/distill/stability_and_speed.sh "$mlff" "$run" "$out" "$steps"
echo "== the ANI-2x ensemble per structure, and the student"
for dtype in float32 float64; do
  python3 benches/distill/ani_speed.py "$run/data/test.extxyz" --model-dir "$model_dir" \
    --device "$device" --dtype "$dtype" --json "$out/ani-speed-$dtype.json"
done
