#!/usr/bin/env bash
# The README's five headline rows on one GPU, beside PyTorch of the same model and weights in
# the same command: an aspirin energy+forces call, 64 aspirins, a 10,000-atom water box (eager
# and replayed as a CUDA graph), aspirin NVE MD steps/s, and the 4,998-atom water box's NVE MD
# steps/s; PyTorch eager, as a CUDA graph and through torch.compile then a CUDA graph
# (benches/reference/painn_torch.py), and its graphed MD (benches/reference/md_torch.py).
# From the repository root on the GPU host, after benches/gpu/build.sh made PACK:
#   bash benches/gpu/headline.sh PACK.tar.xz [BASELINE_PACK.tar.xz]
# With a baseline pack (an older build), the two builds' cases alternate, twice, so that
# drifts of the machine show as the spread within each. Results: $OUT (default
# /tmp/mlff-headline): bench-*.json and .md, md-*.txt, torch.json/.md, torch-md-*.json.
# The water box is WATER_BOX (an extended-XYZ file), else the pack's md_water_box writes it
# (systems::water_box(1666, 0), the box `mlff bench` calls water-5000). PARTS picks "ours"
# and/or "torch" (default both), ROUNDS the alternations (default 2), to fit device limits.
set -uo pipefail
out=${OUT:-/tmp/mlff-headline}; mkdir -p "$out"
work=/tmp/mlff-headline-work; rm -rf "$work"; mkdir -p "$work"
model=${MODEL:-models/painn-gfn2.safetensors}
declare -A bins
bins[new]=$(bash benches/gpu/run.sh "$1" unpack)
[ -n "${2:-}" ] && bins[base]=$(bash benches/gpu/run.sh "$2" unpack)
for who in "${!bins[@]}"; do echo "$who: $(cat "${bins[$who]}/../commit")"; done > "$out/builds.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/gpu.txt"
box=${WATER_BOX:-}
if [ -z "$box" ]; then
  timeout 120 "${bins[new]}/md_water_box" "$work/box" 1666 0 nve > /dev/null 2>&1
  box=$work/water_box.extxyz; head -n 5000 "$work/box/traj.extxyz" > "$box"
fi
date -u +%F >> "$out/gpu.txt"
parts=" ${PARTS:-ours torch} "
for round in $(seq "${ROUNDS:-2}"); do
  [[ "$parts" == *" ours "* ]] || break
  for who in base new; do
    b=${bins[$who]:-}; [ -z "$b" ] && continue
    timeout 240 "$b/mlff" bench --model "$model" --device cuda --ops fused \
      --systems aspirin,aspirin-x64,water-10000 --warmup 10 --repeats 100 --max-seconds 4 \
      --json "$out/bench-$who-$round.json" > "$out/bench-$who-$round.md" 2> "$work/bench-$who.err"
    {
      echo -n "aspirin NVE 5,000 steps: "
      timeout 60 "$b/mlff" md --model "$model" --structure data/gfn2/start/aspirin.extxyz \
        --device cuda --steps 5000 2>&1 | grep -E "speed|rror"
      echo -n "water box 4,998 atoms NVE 300 steps: "
      timeout 120 "$b/mlff" md --model "$model" --structure "$box" --device cuda --steps 300 \
        2>&1 | grep -E "speed|rror"
    } > "$out/md-$who-$round.txt"
  done
done
# PyTorch: the same systems, exported by the new build with its energies and forces.
[[ "$parts" == *" torch "* ]] || { cat "$out"/builds.txt "$out"/bench-*.md "$out"/md-*.txt; exit 0; }
timeout 240 "${bins[new]}/mlff" bench --model "$model" --device cuda --ops fused --graphs off \
  --systems aspirin,aspirin-x64,water-10000,water-5000 --warmup 1 --repeats 3 \
  --export "$work/systems" > /dev/null 2> "$work/export.err"
timeout 420 python3 benches/reference/painn_torch.py "$model" "$work/systems" \
  --compile-systems aspirin,aspirin-x64,water-10000 --compile-budget 0 --compile-energy-rel 1e-3 \
  --json "$out/torch.json" > "$out/torch.md" 2> "$out/torch.err"
for s in aspirin water-5000; do
  steps=5000; [ "$s" = water-5000 ] && steps=300
  for form in graph compile; do
    flag=""; [ "$form" = compile ] && flag=--compile
    timeout 200 python3 benches/reference/md_torch.py "$model" "$work/systems/$s.safetensors" \
      --steps "$steps" $flag --json "$out/torch-md-$s-$form.json" \
      >> "$out/torch-md.md" 2>> "$out/torch.err"
  done
done
cat "$out"/builds.txt "$out"/bench-*.md "$out"/md-*.txt "$out"/torch.md "$out"/torch-md.md
