#!/usr/bin/env bash
# On the GPU host, from the repository root: installs the Python package's CUDA wheel (built
# elsewhere with `MATURIN_PEP517_ARGS="--features cuda" pip wheel ./python` or
# `maturin build --release --features cuda -m python/Cargo.toml`) and any wheels it needs from
# WHEELS (a folder; nothing is downloaded), runs the Python tests on the GPU, then
# benches/python/ase_md.py (ASE MD with our calculator, the engine's MD, a PyTorch calculator).
#   bash benches/gpu/python.sh WHEELS [OUT]
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
wheels=${1:?usage: python.sh WHEELS [OUT]}
out=${2:-${OUT:-/tmp/mlff-python-out}}
mkdir -p "$out"
site=$(mktemp -d)
python3 -m pip install -q --no-deps --no-index --target "$site" "$wheels"/*.whl || exit 1
for lib in /usr/local/cuda/lib64 /usr/local/nvidia/lib64; do
  [ -d "$lib" ] && export LD_LIBRARY_PATH="$lib:${LD_LIBRARY_PATH:-}"
done
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/device.txt"
python3 -m pytest -q -p no:cacheprovider python/tests --device cuda 2>&1 | tee "$out/pytest.txt" | tail -15
python3 benches/python/ase_md.py models/painn-gfn2.safetensors --device cuda \
  --json "$out/ase_md.json" 2>"$out/ase_md.err" | tee "$out/ase_md.md" | tail -4
