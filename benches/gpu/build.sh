#!/usr/bin/env bash
# Builds mlff for an NVIDIA GPU and packs what a GPU host needs into target/gpu-pack.tar.xz:
# the `mlff` binary, the md_water_box example, the train_step_times harness and the GPU test
# binaries (gpu, gpu_graphs, gpu_second_order, the library's unit tests), built with
# `--features cuda`. The build
# machine needs no GPU: Rust, nvcc (CUDA 12.x or 13.x, on PATH or under $CUDA_ROOT) and the
# CUDA libraries to link against (cuBLAS, cuRAND, NVRTC, the driver API's libcuda).
#
#   CUDA_COMPUTE_CAP=90 bash benches/gpu/build.sh   # 90: H100/H200; 80: A100; 89: L40/RTX 40xx
#
# GPU_FEATURES replaces `cuda` (e.g. `nccl`: several-GPU training, links libnccl, see
# Cargo.toml). GPU_TESTS, GPU_BINS and GPU_BENCHES name other targets (space-separated; empty: none;
# GPU_LIB=0 leaves the library's unit tests out), PACK another
# name for the tarball (each bundled binary holds candle's kernels: ~13 MB packed). Then copy
# the tarball and the repository to the GPU host and use benches/gpu/run.sh there
# (benches/gpu/README.md).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
: "${CUDA_COMPUTE_CAP:?set CUDA_COMPUTE_CAP to the compute capability of the GPU, e.g. 90}"
tests=${GPU_TESTS-gpu gpu_graphs gpu_second_order}
bins=${GPU_BINS-mlff md_water_box}
benches=${GPU_BENCHES-train_step_times}
features=${GPU_FEATURES:-cuda}
pack=${PACK:-target/gpu-pack.tar.xz}
name=$(basename "$pack" .tar.xz)
stage=target/$name
rm -rf "$stage" && mkdir -p "$stage/bin" "$stage/tests"
json=target/$name.json
: > "$json"
targets=()
for b in $bins; do
  if [ -f "examples/$b.rs" ]; then targets+=(--example "$b"); else targets+=(--bin "$b"); fi
done
if [ ${#targets[@]} -gt 0 ]; then
  cargo build --release --features "$features" "${targets[@]}" --message-format=json-render-diagnostics >> "$json"
fi
if [ -n "$tests" ]; then
  test_targets=()
  [ "${GPU_LIB:-1}" = 1 ] && test_targets+=(--lib)
  for t in $tests; do test_targets+=(--test "$t"); done
  cargo test --release --features "$features" --no-run "${test_targets[@]}" \
    --message-format=json-render-diagnostics >> "$json"
fi
for b in $benches; do
  cargo bench --features "$features" --bench "$b" --no-run --message-format=json-render-diagnostics >> "$json"
done
python3 - "$json" "$stage" <<'PY'
import json, shutil, sys
for line in open(sys.argv[1]):
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable"): continue
    t = m["target"]
    if "bench" in t["kind"]:
        shutil.copy2(m["executable"], f"{sys.argv[2]}/bin/{t['name']}")
    elif m["profile"]["test"]:
        name = "lib" if "lib" in t["kind"] else t["name"]
        shutil.copy2(m["executable"], f"{sys.argv[2]}/tests/{name}")
    elif "bin" in t["kind"] or "example" in t["kind"]:
        shutil.copy2(m["executable"], f"{sys.argv[2]}/bin/{t['name']}")
PY
strip "$stage"/bin/* "$stage"/tests/* 2>/dev/null || true
# Tests read files relative to the build's checkout: run.sh links this path to the copy there.
pwd > "$stage/build-root"
git rev-parse --short HEAD > "$stage/commit" 2>/dev/null || echo unknown > "$stage/commit"
# One window over all binaries: they share candle's kernels, so each after the first packs to
# little (three binaries: 16 MB instead of 38).
tar -C target -cf - "$name" | xz -T1 --lzma2=preset=2,dict=256MiB > "$pack"
ls "$stage/bin" "$stage/tests" | sed 's/^/  /'
echo "packed $pack ($(du -h "$pack" | cut -f1))"
