#!/usr/bin/env bash
# pair_style mlff against `mlff md` on the same periodic water boxes: NVE steps/s and
# atom-steps/s in LAMMPS on 1, 2, ... MPI ranks (one per GPU with --device cuda), beside
# `mlff md` on one device. The boxes are the example's 64 waters (lammps/examples/water)
# replicated k x k x k (192 k³ atoms); --weak also replicates along x by the rank count, so that
# every rank keeps 192 k³ atoms (weak scaling).
#
#   benches/lammps/water.sh [--device cpu|cuda] [--dtype f32|f64] [--ranks "1 2"]
#                           [--replicas "2 4"] [--steps N] [--weak] [--out DIR] [--model M]
#                           [--exchange ghosts|features] [--no-md]
#
# --model defaults to models/painn-gfn2-water.safetensors; --exchange is the pair style's
# (ghosts to the receptive field, the default, or to one cutoff with features exchanged);
# --no-md times LAMMPS alone (a host without the mlff binary; its columns read "-").
#
# Runs from the repository root after `bash lammps/build.sh` (or with PLUGIN, LMP and MLFF set:
# the plugin, the mpirun command with {n}, the mlff binary). Prints one table row per run and
# writes the logs to --out. Each of n ranks gets RAYON_NUM_THREADS = cores / n
# (set RAYON_NUM_THREADS to override); `mlff md` keeps every core.
set -euo pipefail
device=cpu dtype=f32 ranks="1 2" replicas="2" steps=50 weak=0 out=/tmp/mlff-lammps-bench model=
exchange=ghosts with_md=1
while [ $# -gt 0 ]; do
  case "$1" in
    --device) device="$2"; shift 2 ;;
    --dtype) dtype="$2"; shift 2 ;;
    --ranks) ranks="$2"; shift 2 ;;
    --replicas) replicas="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --weak) weak=1; shift ;;
    --out) out="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --exchange) exchange="$2"; shift 2 ;;
    --no-md) with_md=0; shift ;;
    *) echo "water.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
root="$(cd "$(dirname "$0")/../.." && pwd)"
if [ -z "${PLUGIN:-}" ] || [ -z "${LMP:-}" ]; then
  built=$(bash "$root/lammps/build.sh" | tail -2)
  PLUGIN=$(echo "$built" | sed -n 's/^plugin=//p')
  LMP=$(echo "$built" | sed -n 's/^lmp=//p')
fi
MLFF=${MLFF:-$root/target/release/mlff}
# The bulk-water student by default: the cluster student heats and compresses bulk water.
model=${model:-$root/models/painn-gfn2-water.safetensors}
example="$root/lammps/examples/water"
mkdir -p "$out"

# The example box replicated nx x ny x nz, as extended XYZ for `mlff md`.
tile() {
  python3 - "$example/water.data" "$1" "$2" "$3" "$4" <<'EOF'
import sys
data, nx, ny, nz, path = sys.argv[1], *map(int, sys.argv[2:5]), sys.argv[5]
lines = open(data).read().splitlines()
side = float(next(l for l in lines if l.endswith("xlo xhi")).split()[1])
atoms = [l.split() for l in lines[lines.index("Atoms # atomic") + 2:] if l.strip()]
rows = []
for i in range(nx):
    for j in range(ny):
        for k in range(nz):
            for _, t, x, y, z in atoms:
                rows.append("%s %.6f %.6f %.6f" % ("H" if t == "1" else "O",
                            float(x) + i * side, float(y) + j * side, float(z) + k * side))
cell = f"{nx * side} 0 0 0 {ny * side} 0 0 0 {nz * side}"
with open(path, "w") as f:
    f.write(f'{len(rows)}\nLattice="{cell}" Properties=species:S:1:pos:R:3 pbc="T T T"\n')
    f.write("\n".join(rows) + "\n")
EOF
}

lammps_steps_per_s() {  # ranks nx ny nz -> steps/s of the timed run
  local n=$1 log="$out/lammps-$2x$3x$4-np$1.log"
  cat > "$out/in.bench" <<EOF
units metal
atom_style atomic
boundary p p p
read_data $example/water.data
replicate $2 $3 $4
plugin load $PLUGIN
pair_style mlff device $device dtype $dtype exchange $exchange
pair_coeff * * $model H O
velocity all create 300 4928 mom yes rot yes dist gaussian
timestep 0.0005
fix md all nve
thermo 1000
run 10
run $steps
EOF
  # Each rank's engine would take every core (the model on the CPU, the host list on a GPU):
  # give each its share instead.
  local threads=${RAYON_NUM_THREADS:-$(( $(nproc) / n > 0 ? $(nproc) / n : 1 ))}
  (cd "$out" && RAYON_NUM_THREADS=$threads ${LMP//\{n\}/$n} -in in.bench -log none > "$log" 2>&1) || {
    echo "LAMMPS failed, see $log:" >&2; tail -5 "$log" >&2; return 1; }
  # The last "Loop time of T on P procs for S steps with N atoms".
  awk '/^Loop time of/ {t = $4; s = $9} END {printf "%.2f", s / t}' "$log"
}

mlff_steps_per_s() {  # structure -> steps/s
  # --keep-going: a bond check that trips (status 4) must not cut the timed run short.
  local rc=0
  "$MLFF" md --model "$model" --structure "$1" --steps "$steps" --dt 0.5 --ensemble nve \
    --temperature 300 --device "$device" --dtype "$dtype" --keep-going \
    --summary-json "$out/md-summary.json" --overwrite > "$out/md.log" 2>&1 || rc=$?
  if [ "$rc" = 4 ]; then
    echo "note: the mlff md trajectory went unstable (see $out/md.log); timed all the same" >&2
  elif [ "$rc" != 0 ]; then
    echo "mlff md failed, see $out/md.log:" >&2; tail -5 "$out/md.log" >&2; return 1
  fi
  python3 -c "import json; print('%.2f' % json.load(open('$out/md-summary.json'))['steps_per_s'])"
}

echo "| atoms | ranks | LAMMPS steps/s | LAMMPS atom-steps/s | mlff md steps/s (1 device) | LAMMPS / mlff md |"
echo "|---:|---:|---:|---:|---:|---:|"
declare -A md_of  # `mlff md` steps/s of each box shape, measured once
for k in $replicas; do
  for n in $ranks; do
    nx=$k; [ "$weak" = 1 ] && nx=$((k * n))
    atoms=$((192 * nx * k * k))
    if [ "$with_md" = 0 ]; then
      md_of[$nx]=-
    elif [ -z "${md_of[$nx]:-}" ]; then
      tile "$nx" "$k" "$k" "$out/box.extxyz"
      md_of[$nx]=$(mlff_steps_per_s "$out/box.extxyz")
    fi
    md=${md_of[$nx]}
    lmp=$(lammps_steps_per_s "$n" "$nx" "$k" "$k")
    python3 -c "md = '$md'; r = '-' if md == '-' else '%.2f' % ($lmp / float(md))
print('| %d | %d | %s | %.3g | %s | %s |' % ($atoms, $n, $lmp, $lmp * $atoms, md, r))"
  done
done
