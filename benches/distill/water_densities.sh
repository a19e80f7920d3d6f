#!/usr/bin/env bash
# Issue 46's bulk-water student for NPT: GFN2-xTB labels below the first labels' 0.95-1.05
# g/cm³, where the stress-trained student read ~3 kbar over the teacher (bench-log 67).
#
#   bash benches/distill/water_densities.sh MLFF OUT [MINUTES] [MD_STEPS]
#
# 1. Two 32-water boxes at each of DENSITIES (default 0.70 0.75 0.80 0.85 0.90 g/cm³), sampled
#    by MODEL (default models/painn-gfn2-water.safetensors) in Langevin NVT at 300 and 400 K
#    (STEPS of 0.5 fs, default 3000; a frame every EVERY = 200 after the first 1,000).
# 2. Every frame labelled by GFN2-xTB (teachers/label.py, WORKERS one-thread processes, default
#    the core count); the first box of each density trains, the second is held out.
# 3. A student trained with stress (weight 1000) on data/gfn2-water's frames and these, warm
#    from the shipped water student, within MINUTES (default 10); scored on both test sets.
# 4. A 4,998-atom box at 1.0 g/cm³ and 300 K (MD_STEPS of 0.5 fs each, default 200,000 = 100
#    ps): NVT, with the O-O g(r) after its first 10 ps; then NPT at PRESSURE bar (default
#    10,000, GFN2-xTB's own pressure near 1 g/cm³: at 1 bar its liquid has no density between
#    0.70 and 1.03 g/cm³ and a faithful student's box expands, bench-log 69). Both restartable:
#    run the script again to continue.
#
# Each step is skipped when its output exists, so a cut run resumes (a cut training continues
# from its saved state). DEVICE (default cuda);
# python3 needs numpy, ase and tblite. LABELS=committed skips steps 1 and 2 with the labels
# data/gfn2-water/densities-* holds (bench-log 69's), so that steps 3 and 4 need no teacher.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
mlff=$1 out=$2 minutes=${3:-10} md_steps=${4:-200000} pressure=${PRESSURE:-10000}
device=${DEVICE:-cuda} model=${MODEL:-models/painn-gfn2-water.safetensors}
densities=${DENSITIES:-0.70 0.75 0.80 0.85 0.90}
steps=${STEPS:-3000} every=${EVERY:-200} workers=${WORKERS:-$(nproc)}
tools=benches/distill/water_tools.py
mkdir -p "$out"
if [ "${LABELS:-}" = committed ] && [ ! -s "$out/labelled.extxyz" ]; then
  xz -dc data/gfn2-water/densities-train.extxyz.xz > "$out/train.extxyz"
  cp data/gfn2-water/densities-test.extxyz "$out/test.extxyz"
  cat "$out/train.extxyz" "$out/test.extxyz" > "$out/labelled.tmp.extxyz"
  mv "$out/labelled.tmp.extxyz" "$out/labelled.extxyz"
fi
if [ ! -s "$out/labelled.extxyz" ]; then
  echo "== boxes and student MD"
  rm -f "$out/boxes.extxyz"
  seed=100
  for d in $densities; do
    for _ in 1 2; do
      python3 "$tools" box 32 "$d" "$seed" "$out/box.tmp.extxyz"
      cat "$out/box.tmp.extxyz" >> "$out/boxes.extxyz"
      seed=$((seed + 1))
    done
  done
  rm -f "$out/box.tmp.extxyz"
  for t in 300 400; do
    "$mlff" md --model "$model" --structure "$out/boxes.extxyz" --all-frames --ensemble nvt \
      --temperature "$t" --seed "$t" --dt 0.5 --steps "$steps" --device "$device" \
      --traj "$out/md-$t.extxyz" --traj-every "$every" --summary-json "$out/md-$t.json" \
      --overwrite > "$out/md-$t.txt" 2>&1 || { tail -3 "$out/md-$t.txt" >&2; exit 1; }
  done
  python3 - "$out" "$workers" <<'PY'
import sys, ase.io
out, workers = sys.argv[1], int(sys.argv[2])
frames = []
for t in (300, 400):
    for a in ase.io.read(f"{out}/md-{t}.extxyz", ":"):
        if int(a.info["step"]) >= 1000:
            a.calc = None
            a.info["temperature_K"] = float(t)
            frames.append(a)
for w in range(workers):
    ase.io.write(f"{out}/todo-{w}.extxyz", frames[w::workers], format="extxyz")
print(f"{len(frames)} frames to label in {workers} processes")
PY
  echo "== GFN2-xTB labels"
  pids=()
  for ((w = 0; w < workers; w++)); do
    [ -s "$out/todo-$w.extxyz" ] || continue
    OMP_NUM_THREADS=1 python3 teachers/label.py "$out/todo-$w.extxyz" -o "$out/done-$w.extxyz" \
      --teacher gfn2 --skip-failed --drop-old-labels --quiet --overwrite &
    pids+=($!)
  done
  for p in "${pids[@]}"; do
    wait "$p" || { echo "a labelling process failed: its todo file stays in $out" >&2; exit 1; }
  done
  cat "$out"/done-*.extxyz > "$out/labelled.tmp.extxyz"
  mv "$out/labelled.tmp.extxyz" "$out/labelled.extxyz"
  rm -f "$out"/todo-*.extxyz "$out"/done-*.extxyz
fi
if [ ! -s "$out/test.extxyz" ]; then
  python3 - "$out" <<'PY'
import sys, ase.io
out = sys.argv[1]
frames = ase.io.read(f"{out}/labelled.extxyz", ":")
# Boxes come in pairs per density: even systems train, odd ones are held out.
split = {0: [], 1: []}
for a in frames:
    split[int(a.info["system"]) % 2].append(a)
ase.io.write(f"{out}/train.extxyz", split[0], format="extxyz")
ase.io.write(f"{out}/test.extxyz", split[1], format="extxyz")
print(f"{len(split[0])} training and {len(split[1])} held-out frames")
PY
fi
first=$out/gfn2-water-train.extxyz
[ -s "$first" ] || { xz -dc data/gfn2-water/train.extxyz.xz > "$first.tmp" && mv "$first.tmp" "$first"; }
student=$out/train/last.safetensors
train_args=(--train "$first" "$out/train.extxyz" --val data/gfn2-water/val.extxyz
  --init models/painn-gfn2-water.safetensors --train-config models/recipes/gfn2-water-bulk.json
  --stress-weight 1000 --device "$device")
# A training cut short (a signal saves its state) resumes to the epochs its probe planned,
# rather than leaving a half-trained student to the next steps.
planned=$(sed -n 's/^probe: training \([0-9]*\) epochs.*/\1/p' "$out/train.log" 2>/dev/null || true)
if [ ! -f "$out/train.done" ] && [ -n "$planned" ] && [ -s "$out/train/state.safetensors" ]; then
  echo "== train (resumed to the $planned epochs planned)"
  "$mlff" train "${train_args[@]}" --out "$out/train" --epochs "$planned" --resume \
    2>> "$out/train.log" || { tail -5 "$out/train.log" >&2; exit 1; }
  touch "$out/train.done"
elif [ ! -f "$out/train.done" ]; then
  echo "== train ($minutes min)"
  # A run cut before its probe planned the epochs starts again; its folder is kept aside.
  [ -e "$out/train" ] && mv "$out/train" "$out/train.cut-$(date +%s)"
  MLFF=$mlff models/train_timed.sh "$minutes" "$out/train" "${train_args[@]}" \
    2> "$out/train.log" || { tail -5 "$out/train.log" >&2; exit 1; }
  touch "$out/train.done"
fi
echo "== held-out frames"
for test in data/gfn2-water/test.extxyz "$out/test.extxyz"; do
  "$mlff" eval "$student" "$test" --device "$device" | grep -E '^\| all|stress'
done
box=$out/box5k.extxyz
[ -s "$box" ] || python3 "$tools" box 1666 1.0 0 "$box"
# An MD run that continues from its restart file when one exists (a cut run resumes).
run_md() {  # name, then `mlff md` arguments for a fresh start
  local name=$1; shift
  if [ -s "$out/$name.restart.json" ]; then
    "$mlff" md --resume "$out/$name.restart.json" --summary-json "$out/$name.json" --overwrite \
      > "$out/$name.txt" 2>&1 || true
  else
    "$mlff" md --model "$student" --structure "$box" --temperature 300 --dt 0.5 \
      --steps "$md_steps" --device "$device" --log "$out/$name.jsonl" --log-every 1000 \
      --restart-every 10000 --restart-file "$out/$name.restart.json" \
      --summary-json "$out/$name.json" "$@" > "$out/$name.txt" 2>&1 || true
  fi
  tail -6 "$out/$name.txt"
}
echo "== NVT, 1.0 g/cm³, 300 K, 4,998 atoms, $md_steps steps; O-O g(r) after 10 ps"
run_md nvt --ensemble nvt --seed 3 --traj "$out/nvt.extxyz" --traj-every 2000
python3 "$tools" rdf "$out/rdf-nvt.json" "$out/nvt.extxyz" 10 || echo "no g(r): too few frames"
echo "== NPT, $pressure bar, 300 K, 4,998 atoms, $md_steps steps"
run_md npt --ensemble npt --pressure "$pressure" --seed 5
