#!/usr/bin/env bash
# Trains a student within a wall-clock budget and still completes its learning-rate schedule:
# a two-epoch probe measures this machine's throughput, then the real run gets as many epochs
# as fit in what is left. The epoch count is stored in the checkpoint's provenance
# (`mlff info`), so the run can be repeated exactly with `mlff train --epochs N`.
#
#   models/train_timed.sh MINUTES OUT_DIR [mlff train arguments, without --out and --epochs]
#
# MLFF names the mlff binary (default: mlff on PATH). OUT_DIR/probe holds the probe run.
set -euo pipefail
[ $# -ge 3 ] || { sed -n 2,9p "$0" >&2; exit 2; }
minutes=$1 out=$2
shift 2
mlff=${MLFF:-mlff}
started=$(date +%s)
mkdir -p "$out"
# Two probe epochs: the first also compiles the GPU kernels, the second is timed.
$mlff train "$@" --out "$out/probe" --epochs 2 2> "$out/probe.log" || { cat "$out/probe.log" >&2; exit 1; }
read -r epochs left_min < <(python3 - "$minutes" "$started" "$out/probe/log.jsonl" <<'PY'
import json, sys, time
minutes, started, log = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
lines = [json.loads(l) for l in open(log)]
if len(lines) > 1:
    epoch_s = lines[-1]["elapsed_s"] - lines[-2]["elapsed_s"]
else:
    # With val_every above 1 only the last epoch is logged: its training time, plus a tenth for
    # the validations in between.
    epoch_s = 1.1 * lines[-1]["epoch_train_s"]
left = 60 * minutes - (time.time() - started)
# 10% of what is left is kept for start-up and the last checkpoints.
print(max(1, int(0.9 * left / epoch_s)), left / 60)
PY
)
echo "probe: training $epochs epochs in the $left_min minutes left" >&2
exec $mlff train "$@" --out "$out" --epochs "$epochs" --max-minutes "$left_min"
