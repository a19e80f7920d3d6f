#!/usr/bin/env bash
# Many systems in one MD run on the GPU host (BENCHMARKS.md, "Batched MD"), from the repository
# root after benches/gpu/build.sh made PACK: aggregate atom-steps/s of `mlff md --replicas N`
# for N aspirins (1 to 1,024) and of the six shipped molecules (once, and 16 times), NVE and
# NVT, beside one single aspirin run and the bare energy+forces call of the same batches
# (`mlff bench`); then PyTorch's batched MD of the same model and weights
# (benches/reference/md_torch.py, one CUDA graph per step, and torch.compile then a graph).
# `singles`: one run of each of the six molecules alone; `npt`: replicas of the 96-atom water
# box (models/painn-gfn2-water.safetensors) at constant pressure beside NVT.
#   bash benches/gpu/batch_md.sh PACK.tar.xz [ours|torch|singles|npt]...
# SIZES="64 1024" limits the aspirin batches of `ours` and `torch` (default 8 64 256 1024).
# Results go to $OUT (default /tmp/mlff-batch-md): ours.md, bench.md, torch.md and the JSON
# each row came from.
set -uo pipefail
pack=${1:?usage: batch_md.sh PACK.tar.xz [ours|torch]...}; shift
parts=" ${*:-ours torch} "
out=${OUT:-/tmp/mlff-batch-md}; mkdir -p "$out"
work=/tmp/mlff-batch-md-work; mkdir -p "$work"
model=${MODEL:-models/painn-gfn2.safetensors}
bin=$(bash benches/gpu/run.sh "$pack" unpack)
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u +%F
  cat "$bin/../commit" 2>/dev/null; } > "$out/gpu.txt"
start=data/gfn2/start
sizes=${SIZES:-8 64 256 1024}
batches=$(for n in $sizes; do printf 'aspirin-x%s,' "$n"; done); batches=${batches%,}
cat $start/{water8,ethanol,benzene,aspirin,alanine_dipeptide,trialanine}.extxyz > "$work/six.extxyz"

# One `mlff md` run: LABEL STEPS ARGS...; a row of ours.md from its summary.
md() {
  local label=$1 steps=$2; shift 2
  timeout 150 "$bin/mlff" md --model "$model" --device cuda --steps "$steps" \
    --log-every "$steps" --summary-json "$out/ours-$label.json" --overwrite "$@" \
    > "$work/$label.txt" 2>&1 || { echo "| $label | failed: $(tail -1 "$work/$label.txt") |" >> "$out/ours.md"; return; }
  python3 - "$out/ours-$label.json" "$label" >> "$out/ours.md" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
systems = len(s["systems"]) if "systems" in s else 1
aps = s.get("atom_steps_per_s") or s["steps_per_s"] * s["atoms"]
print(f"| {sys.argv[2]} | {systems} | {s['atoms']} | {s['steps_per_s']:.0f} | "
      f"{aps / 1e6:.3f} | {s['neighbor_list_builds']} |")
PY
}

echo "| run | systems | atoms | steps/s | M atom-steps/s | list builds |" > "$out/ours.md"
echo "|---|---|---|---|---|---|" >> "$out/ours.md"
if [[ "$parts" == *" ours "* ]]; then
  for ens in nve nvt; do
    md "aspirin-single-$ens" 10000 --structure $start/aspirin.extxyz --ensemble $ens
    for n in $sizes; do
      steps=$(( n <= 64 ? 6000 : (n == 256 ? 3000 : 1000) ))
      md "aspirin-x$n-$ens" $steps --structure $start/aspirin.extxyz --replicas $n --ensemble $ens
    done
    md "six-$ens" 6000 --structure "$work/six.extxyz" --all-frames --ensemble $ens
    md "six-x16-$ens" 4000 --structure "$work/six.extxyz" --all-frames --replicas 16 --ensemble $ens
  done
  for n in 256 1024; do
    md "aspirin-x$n-nve-graphs-on" 600 --structure $start/aspirin.extxyz --replicas $n --graphs on
  done
  timeout 200 "$bin/mlff" bench --model "$model" --device cuda --ops fused \
    --systems "aspirin,$batches" --warmup 10 \
    --repeats 100 --max-seconds 3 --json "$out/bench.json" --overwrite > "$out/bench.md" \
    2> "$work/bench.err"
  cat "$out/ours.md" "$out/bench.md"
fi

if [[ "$parts" == *" singles "* ]]; then
  for m in water8 ethanol benzene aspirin alanine_dipeptide trialanine; do
    md "$m-single-nve" 10000 --structure $start/$m.extxyz
  done
  cat "$out/ours.md"
fi

if [[ "$parts" == *" npt "* ]]; then
  water=data/gfn2-water/teacher-md-start.extxyz
  for n in 1 8 64; do
    replicas=(); [ "$n" -gt 1 ] && replicas=(--replicas "$n")
    model=models/painn-gfn2-water.safetensors md "water96-x$n-nvt" 1000 \
      --structure $water "${replicas[@]}" --ensemble nvt
    model=models/painn-gfn2-water.safetensors md "water96-x$n-npt" 1000 \
      --structure $water "${replicas[@]}" --ensemble npt --pressure 1
  done
  cat "$out/ours.md"
fi

if [[ "$parts" == *" torch "* ]]; then
  timeout 200 "$bin/mlff" bench --model "$model" --device cuda --ops fused --graphs off \
    --systems "$batches" --warmup 1 --repeats 3 \
    --export "$work/systems" > /dev/null 2> "$work/export.err"
  : > "$out/torch.md"
  for n in $sizes; do
    steps=$(( n <= 64 ? 2000 : (n == 256 ? 1000 : 400) ))
    for form in graph compile; do
      flag=""; [ "$form" = compile ] && flag=--compile
      timeout 240 python3 benches/reference/md_torch.py "$model" \
        "$work/systems/aspirin-x$n.safetensors" --steps $steps $flag \
        --json "$out/torch-aspirin-x$n-$form.json" >> "$out/torch.md" 2>> "$out/torch.err"
    done
  done
  cat "$out/torch.md"
fi
