#!/usr/bin/env bash
# Issue 46's timed loops: `mlff distill` from CONFIG (default examples/distill/ethanol.json,
# ethanol with the GFN2-xTB teacher; examples/distill/gfn2-organic.json is the shipped organic
# student), started or, where OUT holds the run, resumed; the wall time of this invocation is
# appended to OUT/wall.log. The teacher runs from this checkout's bridge (PYTHONPATH=python),
# so only ase and tblite need to be installed for python3.
#
#   [CONFIG=FILE] bash benches/distill/loop.sh MLFF OUT [mlff distill flags, e.g. --device cuda]
#
# DISTILL_FLAGS adds more flags (e.g. "--max-iterations 4" to take a finished run further), also
# where this script is called by organic.sh, ani.sh or silicon.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
mlff=$1 out=$2
shift 2
# Word-split on purpose: several flags in one variable.
# shellcheck disable=SC2206
set -- "$@" ${DISTILL_FLAGS:-}
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
start=$(date +%s.%N)
status=0
if [ -f "$out/distill.json" ]; then
  "$mlff" distill --resume --out "$out" "$@" || status=$?
else
  "$mlff" distill --config "${CONFIG:-examples/distill/ethanol.json}" --out "$out" "$@" || status=$?
fi
mkdir -p "$out"
echo "$(date -u +%FT%TZ) status $status wall_s $(awk "BEGIN {print $(date +%s.%N) - $start}")" >> "$out/wall.log"
exit $status
