"""pair_style mlff inside LAMMPS: the same numbers as `mlff predict`, the same on 1, 2 and 4 MPI
ranks (the receptive field spanning several subdomains), and clear errors for bad input.

Run with the venv `bash lammps/build.sh` makes: target/lammps-venv/bin/python -m pytest lammps/tests
(MLFF_PROFILE picks the cargo profile of the engine and of `mlff`: dev, as CI, or release).
"""

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
PROFILE = os.environ.get("MLFF_PROFILE", "dev")
MASSES = {1: 1.008, 6: 12.011, 8: 15.999}
SYMBOLS = {1: "H", 6: "C", 8: "O"}
# eV/Å³ to bar (LAMMPS's nktv2p for units metal).
BAR = 1.6021765e6


@pytest.fixture(scope="session")
def lammps():
    """(plugin path, mpirun command with {n}) from lammps/build.sh."""
    out = subprocess.run(
        ["bash", str(ROOT / "lammps/build.sh"), "--profile", PROFILE],
        check=True, capture_output=True, text=True,
    ).stdout.splitlines()
    assert out[-2].startswith("plugin=") and out[-1].startswith("lmp="), out
    return out[-2].removeprefix("plugin="), out[-1].removeprefix("lmp=")


@pytest.fixture(scope="session")
def mlff():
    subprocess.run(["cargo", "build", "--profile", PROFILE, "--bin", "mlff"], cwd=ROOT,
                   check=True, capture_output=True)
    return ROOT / "target" / ("debug" if PROFILE == "dev" else PROFILE) / "mlff"


@pytest.fixture(scope="session")
def tiny(tmp_path_factory, mlff):
    """A random H C O model, 2 blocks of 3 Å: a 6 Å receptive field, fast on a CPU."""
    d = tmp_path_factory.mktemp("model")
    (d / "tiny.json").write_text(
        '{"hidden": 16, "n_blocks": 2, "n_rbf": 8, "cutoff": 3.0, "elements": [1, 6, 8]}')
    model = d / "tiny.safetensors"
    subprocess.run([mlff, "init-model", "--config", d / "tiny.json", "-o", model, "--seed", "3"],
                   check=True, capture_output=True)
    return model


def water_box(per_side=3, spacing=3.1, tilt=(0.0, 0.0, 0.0), seed=0):
    """per_side³ jittered waters in a (possibly triclinic) periodic box: (numbers, x, cell)."""
    rng = np.random.default_rng(seed)
    side = per_side * spacing
    xy, xz, yz = tilt
    cell = np.array([[side, 0, 0], [xy, side, 0], [xz, yz, side]])
    numbers, x = [], []
    for i in range(per_side):
        for j in range(per_side):
            for k in range(per_side):
                frac = (np.array([i, j, k]) + 0.5 + rng.normal(0, 0.03, 3)) / per_side
                o = frac @ cell
                x += [o, o + [0.96, 0, 0], o + [-0.24, 0.93, 0]]
                numbers += [8, 1, 1]
    return np.array(numbers), np.array(x), cell


def molecule():
    """A water dimer and a methanol, far from any wall: (numbers, x, None)."""
    x = [[0, 0, 0], [0.96, 0, 0], [-0.24, 0.93, 0], [2.9, 0.1, 0.2], [3.3, 0.9, 0.4],
         [3.3, -0.6, 0.5], [0.5, 3.4, 0.3], [1.9, 3.5, 0.2], [0.1, 4.4, 0.3], [0.1, 2.9, 1.2],
         [0.1, 2.9, -0.7], [2.2, 4.4, 0.2]]
    return np.array([8, 1, 1, 8, 1, 1, 6, 8, 1, 1, 1, 1]), np.array(x, float) + 20.0, None


def num(v):
    """A float as Python writes it back exactly."""
    return repr(float(v))


def write_data(path, numbers, x, cell, elements):
    """A LAMMPS data file (atom_style atomic); types in the order of `elements`."""
    types = {z: t + 1 for t, z in enumerate(elements)}
    lines = ["mlff test", "", f"{len(x)} atoms", f"{len(elements)} atom types", ""]
    if cell is None:
        lines += [f"0 40 {a}lo {a}hi" for a in "xyz"]
    else:
        lines += [f"0 {num(cell[0, 0])} xlo xhi", f"0 {num(cell[1, 1])} ylo yhi",
                  f"0 {num(cell[2, 2])} zlo zhi"]
        if np.any(cell[[1, 2, 2], [0, 0, 1]] != 0):
            lines.append(f"{num(cell[1, 0])} {num(cell[2, 0])} {num(cell[2, 1])} xy xz yz")
    lines += ["", "Masses", ""] + [f"{types[z]} {MASSES[z]}" for z in elements]
    lines += ["", "Atoms # atomic", ""]
    lines += [f"{i + 1} {types[z]} {num(p[0])} {num(p[1])} {num(p[2])}" for i, (z, p) in
              enumerate(zip(numbers, x))]
    Path(path).write_text("\n".join(lines) + "\n")


def write_extxyz(path, numbers, x, cell):
    header = 'Properties=species:S:1:pos:R:3 pbc="F F F"'
    if cell is not None:
        lattice = " ".join(num(v) for v in cell.flatten())
        header = f'Lattice="{lattice}" Properties=species:S:1:pos:R:3 pbc="T T T"'
    rows = [f"{SYMBOLS[z]} {num(p[0])} {num(p[1])} {num(p[2])}" for z, p in zip(numbers, x)]
    Path(path).write_text(f"{len(x)}\n{header}\n" + "\n".join(rows) + "\n")


def read_prediction(path):
    """energy, per-atom energies, forces and stress (or None) of `mlff predict`'s one frame."""
    lines = Path(path).read_text().splitlines()
    n = int(lines[0])
    info = dict(_pairs(lines[1]))
    spec = info["Properties"].split(":")
    cols, at = {}, 0
    for name, _, width in zip(spec[::3], spec[1::3], spec[2::3]):
        cols[name] = (at, at + int(width))
        at += int(width)
    table = [line.split() for line in lines[2:2 + n]]
    get = lambda name: np.array([[float(v) for v in r[slice(*cols[name])]] for r in table])
    stress = info.get("stress")
    stress = None if stress is None else np.array(stress.split(), float).reshape(3, 3)
    return float(info["energy"]), get("energies")[:, 0], get("forces"), stress


def _pairs(comment):
    """key=value pairs of an extended-XYZ comment line (values may be quoted)."""
    out, i = [], 0
    while i < len(comment):
        if comment[i] == " ":
            i += 1
            continue
        eq = comment.index("=", i)
        key = comment[i:eq]
        if comment[eq + 1] == '"':
            end = comment.index('"', eq + 2)
            out.append((key, comment[eq + 2:end]))
            i = end + 1
        else:
            end = comment.find(" ", eq)
            end = len(comment) if end < 0 else end
            out.append((key, comment[eq + 1:end]))
            i = end
    return out


def predict(mlff, tmp, model, numbers, x, cell, dtype):
    write_extxyz(tmp / "in.extxyz", numbers, x, cell)
    args = [mlff, "predict", model, tmp / "in.extxyz", "-o", tmp / "out.extxyz", "--device",
            "cpu", "--dtype", dtype, "--energies", "--overwrite"]
    if cell is not None:
        args.append("--stress")
    p = subprocess.run(args, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return read_prediction(tmp / "out.extxyz")


def run_lammps(lammps, tmp, ranks, body, check=True, tuning=None):
    """Runs `body` after loading the plugin on `ranks` MPI ranks in `tmp`; the process.
    `tuning` (key=value,...) goes to the engine as MLFF_TUNING."""
    plugin, lmp = lammps
    (tmp / "in.lmp").write_text(f"plugin load {plugin}\n{body}\n")
    cmd = lmp.replace("{n}", str(ranks)).split() + ["-in", "in.lmp", "-log", "log.lammps"]
    env = {k: v for k, v in os.environ.items() if k != "MLFF_TUNING"}
    if tuning:
        env["MLFF_TUNING"] = tuning
    p = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, env=env)
    if check:
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p


def setup_lines(model, elements, dtype, periodic=True, extra="", style=""):
    names = " ".join(SYMBOLS[z] for z in elements)
    return f"""units metal
atom_style atomic
boundary {"p p p" if periodic else "f f f"}
atom_modify map array
{extra}
read_data system.data
pair_style mlff dtype {dtype} {style}
pair_coeff * * {model} {names}
compute pe all pe/atom
compute w all pressure NULL virial
"""


def single_point(lammps, tmp, ranks, model, numbers, x, cell, dtype, elements=(1, 6, 8),
                 style=""):
    """LAMMPS's energy, per-atom energies, forces (by atom id) and virial W (eV) at x."""
    write_data(tmp / "system.data", numbers, x, cell, elements)
    body = setup_lines(model, elements, dtype, periodic=cell is not None, style=style) + """
dump d all custom 1 atoms.txt id fx fy fz c_pe
dump_modify d sort id format float %.17g
run 0
print "$(pe:%.17g) $(vol:%.17g) $(c_w[1]:%.17g) $(c_w[2]:%.17g) $(c_w[3]:%.17g) $(c_w[4]:%.17g) $(c_w[5]:%.17g) $(c_w[6]:%.17g)" file result.txt
"""
    run_lammps(lammps, tmp, ranks, body)
    atoms = np.loadtxt(tmp / "atoms.txt", skiprows=9)
    pe, vol, *p = np.loadtxt(tmp / "result.txt")
    xx, yy, zz, xy, xz, yz = np.array(p) * vol / BAR
    virial = np.array([[xx, xy, xz], [xy, yy, yz], [xz, yz, zz]])
    return pe, atoms[:, 4], atoms[:, 1:4], virial


SYSTEMS = {
    "water_box": lambda: water_box(),
    "triclinic_water_box": lambda: water_box(tilt=(1.1, -0.7, 0.5), seed=1),
    "molecule": molecule,
}


@pytest.mark.parametrize("dtype,tol", [("f64", 1e-9), ("f32", 1e-5)])
@pytest.mark.parametrize("system", SYSTEMS)
def test_lammps_matches_mlff_predict(lammps, mlff, tiny, tmp_path, system, dtype, tol):
    numbers, x, cell = SYSTEMS[system]()
    e, ea, f, sigma = predict(mlff, tmp_path, tiny, numbers, x, cell, dtype)
    pe, pe_atoms, forces, virial = single_point(lammps, tmp_path, 1, tiny, numbers, x, cell,
                                                dtype)
    assert abs(pe - e) <= tol * abs(e)
    assert np.abs(pe_atoms - ea).max() <= tol * np.abs(ea).max()
    assert np.abs(forces - f).max() <= tol * np.abs(f).max()
    if cell is not None:
        # W = -V σ (σ in ASE's sign); LAMMPS's virial pressure is W / V.
        w = -abs(np.linalg.det(cell)) * sigma
        assert np.abs(virial - w).max() <= tol * np.abs(w).max()


def test_the_shipped_student_in_lammps_matches_mlff_predict(lammps, mlff, tmp_path):
    model = ROOT / "models/painn-gfn2.safetensors"
    numbers, x, _ = molecule()
    e, ea, f, _ = predict(mlff, tmp_path, model, numbers, x, None, "f64")
    pe, pe_atoms, forces, _ = single_point(lammps, tmp_path, 1, model, numbers, x, None, "f64")
    assert abs(pe - e) <= 1e-9 * abs(e)
    assert np.abs(pe_atoms - ea).max() <= 1e-9 * np.abs(ea).max()
    assert np.abs(forces - f).max() <= 1e-9 * np.abs(f).max()


@pytest.mark.parametrize("system", SYSTEMS)
def test_one_two_four_and_eight_ranks_agree(lammps, tiny, tmp_path, system):
    # A 9.3 Å box cut in 2, 4 or 8 (grids 2x1x1, 2x2x1, 2x2x2): subdomains of 4.65 Å, under
    # the 6 Å receptive field. One rank takes the whole cell; 2 and 4 take ghosts along the
    # divided axes and the cell's images along the others; 8 take ghosts along all three. The
    # molecule (no periodic axis) leaves most ranks without atoms.
    numbers, x, cell = SYSTEMS[system]()
    ranks = (1, 2, 4, 8)
    runs = [single_point(lammps, tmp_path, n, tiny, numbers, x, cell, "f64") for n in ranks]
    pe, pe_atoms, forces, virial = runs[0]
    for n, (pe_n, pe_atoms_n, forces_n, virial_n) in zip(ranks[1:], runs[1:]):
        assert abs(pe_n - pe) <= 1e-12 * abs(pe), n
        assert np.abs(pe_atoms_n - pe_atoms).max() <= 1e-12 * np.abs(pe_atoms).max(), n
        assert np.abs(forces_n - forces).max() <= 1e-12 * np.abs(forces).max(), n
        assert np.abs(virial_n - virial).max() <= 1e-11 * np.abs(virial).max(), n


def md_input(tmp_path, model, fix, steps, thermo, style=""):
    """The water box with `model` in f64, then `steps` of MD under `fix` from 300 K, thermo
    columns `thermo` every 25 steps, the end state written to final.txt."""
    numbers, x, cell = water_box()
    write_data(tmp_path / "system.data", numbers, x, cell, (1, 6, 8))
    return setup_lines(model, (1, 6, 8), "f64", style=style) + f"""
velocity all create 300 4928 mom yes rot no dist gaussian
timestep 0.0005
fix md all {fix}
thermo 25
thermo_style custom step {thermo}
thermo_modify format float %.15g
run {steps}
write_dump all custom final.txt id x y z vx vy vz modify sort id format float %.17g
"""


def test_npt_trajectory_is_the_same_on_one_and_two_ranks(lammps, tiny, tmp_path):
    # The barostat reads the virial every step and moves the cell the engine is given.
    body = md_input(tmp_path, tiny, "npt temp 300 300 0.05 aniso 1.0 1.0 0.5", 100, "pe vol press")
    runs = []
    for n in (1, 2):
        p = run_lammps(lammps, tmp_path, n, body)
        assert "pair_style mlff: " in p.stdout and "receptive field 6 Å" in p.stdout
        runs.append(_thermo(tmp_path / "log.lammps"))
    np.testing.assert_allclose(runs[1], runs[0], rtol=1e-9)
    volume = runs[0][:, 2]
    assert np.ptp(volume) > 1e-3 * volume[0], "the cell did not move"


def test_nve_trajectory_is_the_same_on_one_and_two_ranks(lammps, tiny, tmp_path):
    body = md_input(tmp_path, tiny, "nve", 200, "pe ke etotal")
    x = water_box()[1]
    finals, energies = [], []
    for n in (1, 2):
        run_lammps(lammps, tmp_path, n, body)
        finals.append(np.loadtxt(tmp_path / "final.txt", skiprows=9))
        energies.append(_thermo(tmp_path / "log.lammps"))
    # Rounding differences (ghost forces summed in another order) grow along a trajectory;
    # after 200 steps they are still 1e-9 of the motion.
    for cols in (slice(1, 4), slice(4, 7)):
        a, b = finals[0][:, cols], finals[1][:, cols]
        assert np.abs(a - b).max() < 1e-9 * np.abs(a).max()
    np.testing.assert_allclose(energies[1], energies[0], rtol=1e-9)
    # And it is a real trajectory: atoms moved, and the total energy was kept.
    assert np.abs(finals[0][:, 1:4] - x).max() > 0.01
    pe, etotal = energies[0][:, 1], energies[0][:, 3]
    assert np.ptp(etotal) < 0.05 * np.ptp(pe), (np.ptp(etotal), np.ptp(pe))


@pytest.mark.parametrize("style", ["", "exchange features"])
def test_a_neighbour_list_kept_with_a_skin_changes_no_trajectory(lammps, tiny, tmp_path, style):
    # The default on the CPU rebuilds the list at every call; with a 1 Å skin it is kept
    # between builds and the skin's pairs add exact zeros. On 1 rank (the cell, or with
    # features the images as ghosts) and 2 (ghosts), with either exchange.
    body = md_input(tmp_path, tiny, "nve", 100, "pe", style=style)
    for n in (1, 2):
        finals = []
        for tuning in (None, "domain_skin=1.0"):
            run_lammps(lammps, tmp_path, n, body, tuning=tuning)
            finals.append(np.loadtxt(tmp_path / "final.txt", skiprows=9))
        scale = np.abs(finals[0]).max()
        assert np.abs(finals[1] - finals[0]).max() < 1e-10 * scale, (style, n)


@pytest.mark.parametrize("system", SYSTEMS)
def test_exchanging_features_matches_ghosts_to_the_receptive_field(lammps, tiny, tmp_path,
                                                                   system):
    # Ghosts to one cutoff (3 Å) with the blocks' features exchanged, on 1, 2, 4 and 8 ranks
    # (subdomains of 4.65 Å, a periodic image its own ghost on one rank), against the default
    # on one rank: the same energies, forces and virial (LAMMPS's sum of x (x) f here).
    numbers, x, cell = SYSTEMS[system]()
    pe, pe_atoms, forces, virial = single_point(lammps, tmp_path, 1, tiny, numbers, x, cell,
                                                "f64")
    for n in (1, 2, 4, 8):
        got = single_point(lammps, tmp_path, n, tiny, numbers, x, cell, "f64",
                           style="exchange features")
        pe_n, pe_atoms_n, forces_n, virial_n = got
        assert abs(pe_n - pe) <= 1e-12 * abs(pe), n
        assert np.abs(pe_atoms_n - pe_atoms).max() <= 1e-12 * np.abs(pe_atoms).max(), n
        assert np.abs(forces_n - forces).max() <= 1e-11 * np.abs(forces).max(), n
        assert np.abs(virial_n - virial).max() <= 1e-10 * np.abs(virial).max(), n
    log = (tmp_path / "log.lammps").read_text()
    assert "; exchange features; types" in log


def test_npt_with_exchanged_features_follows_the_default(lammps, tiny, tmp_path):
    # Two ranks exchanging features against one rank with ghosts to the receptive field: the
    # barostat reads the virial (x (x) f over atoms and ghosts) every step.
    fix = "npt temp 300 300 0.05 aniso 1.0 1.0 0.5"
    runs = []
    for n, style in ((1, ""), (2, "exchange features")):
        run_lammps(lammps, tmp_path, n, md_input(tmp_path, tiny, fix, 100, "pe vol press", style))
        runs.append(_thermo(tmp_path / "log.lammps"))
    np.testing.assert_allclose(runs[1], runs[0], rtol=1e-9)


def _thermo(log):
    """The thermo rows (step pe ke etotal) of a LAMMPS log."""
    return _thermo_rows(Path(log).read_text())


def _thermo_rows(text):
    """The rows of the last run's thermo table (its header starts with Step) in LAMMPS output."""
    rows, on = [], False
    for line in text.splitlines():
        words = line.split()
        if words[:1] == ["Step"]:
            rows, on = [], True
        elif on and words[:1] == ["Loop"]:
            on = False
        elif on and words:
            rows.append([float(w) for w in words])
    return np.array(rows)


ERRORS = {
    "a type without an element": (
        "pair_coeff * * {model} H O", "2 element(s) for 3 atom type(s)"),
    "an element the model lacks": (
        "pair_coeff * * {model} H C Fe", "element Fe (Z=26, atom type 3) is not among"),
    "not an element": ("pair_coeff * * {model} H C Qq", "`Qq` (atom type 3) is not an element"),
    "a model missing": ("pair_coeff * * {tmp}/missing.safetensors H C O", "missing.safetensors"),
    "an unknown keyword": ("pair_style mlff precision f64", "unknown keyword `precision`"),
    "an unknown exchange": ("pair_style mlff exchange atoms", "exchange `atoms` is not ghosts"),
}


@pytest.mark.parametrize("case", ERRORS)
def test_bad_input_stops_lammps_naming_the_cause(lammps, tiny, tmp_path, case):
    line, expected = ERRORS[case]
    numbers, x, cell = water_box(per_side=2)
    write_data(tmp_path / "system.data", numbers, x, cell, (1, 6, 8))
    setup = setup_lines(tiny, (1, 6, 8), "f64").splitlines()
    key = "pair_style" if line.startswith("pair_style") else "pair_coeff"
    setup = [line.format(model=tiny, tmp=tmp_path) if s.startswith(key) else s for s in setup]
    p = run_lammps(lammps, tmp_path, 1, "\n".join(setup) + "\nrun 0", check=False)
    out = p.stdout + p.stderr
    assert p.returncode != 0
    assert "ERROR" in out and expected in out, out[-2000:]


def init_model(mlff, tmp_path, name, config):
    """A random model of `config` (JSON) written to tmp_path/name.safetensors."""
    cfg = tmp_path / f"{name}.json"
    cfg.write_text(config)
    model = tmp_path / f"{name}.safetensors"
    subprocess.run([mlff, "init-model", "--config", cfg, "-o", model], check=True,
                   capture_output=True)
    return model


def test_a_receptive_field_beyond_what_the_ghosts_reach_is_refused(lammps, mlff, tmp_path):
    # 4 blocks of 3 Å (12 Å) in a 6.2 Å box: comm_style tiled cannot bring ghosts that far.
    model = init_model(mlff, tmp_path, "deep",
                       '{"hidden": 8, "n_blocks": 4, "n_rbf": 4, "cutoff": 3.0, "elements": [1, 8]}')
    numbers, x, cell = water_box(per_side=2)
    write_data(tmp_path / "system.data", numbers, x, cell, (1, 8))
    body = setup_lines(model, (1, 8), "f64", extra="comm_style tiled") + "run 0"
    p = run_lammps(lammps, tmp_path, 2, body, check=False)
    out = p.stdout + p.stderr
    assert p.returncode != 0
    assert "receptive field (4 blocks x 3 Å = 12 Å" in out, out[-2000:]
    # The same box with brick communication (the default) runs: ghosts from several images.
    body = setup_lines(model, (1, 8), "f64") + "run 0"
    run_lammps(lammps, tmp_path, 2, body)
    # Exchanging features, the ghosts reach one cutoff: 3 Å plus the 2 Å skin fit the box.
    body = setup_lines(model, (1, 8), "f64", extra="comm_style tiled",
                       style="exchange features") + "run 0"
    run_lammps(lammps, tmp_path, 2, body)
    # A 5 Å cutoff plus the skin does not, on one rank too (the engine then takes no images
    # from the cell): refused naming the cutoff.
    wide = init_model(mlff, tmp_path, "wide",
                      '{"hidden": 8, "n_blocks": 2, "n_rbf": 4, "cutoff": 5.0, "elements": [1, 8]}')
    for ranks in (1, 2):
        body = setup_lines(wide, (1, 8), "f64", extra="comm_style tiled",
                           style="exchange features") + "run 0"
        p = run_lammps(lammps, tmp_path, ranks, body, check=False)
        out = p.stdout + p.stderr
        assert p.returncode != 0, ranks
        assert "the model's cutoff (5 Å, plus the 2 Å skin) is larger" in out, out[-2000:]


@pytest.mark.parametrize("setting,expected", [
    ("newton_pair off", "needs newton_pair on"),
    ("units real", "needs units metal"),
])
def test_settings_the_style_cannot_work_with_are_refused(lammps, tiny, tmp_path, setting,
                                                         expected):
    numbers, x, cell = water_box(per_side=2)
    write_data(tmp_path / "system.data", numbers, x, cell, (1, 6, 8))
    setup = setup_lines(tiny, (1, 6, 8), "f64")
    if setting.startswith("units"):
        setup = setup.replace("units metal", setting)
    else:
        setup = setup.replace("read_data", "newton off on\nread_data")
    p = run_lammps(lammps, tmp_path, 1, setup + "run 0", check=False)
    out = p.stdout + p.stderr
    assert p.returncode != 0 and expected in out, out[-2000:]


def test_the_c_interface_compiles_as_c99_and_matches_mlff_predict(lammps, mlff, tmp_path):
    # capi/examples/energy.c: one water molecule through mlff.h from plain C.
    lib = ROOT / "target" / ("debug" if PROFILE == "dev" else PROFILE)
    exe = tmp_path / "energy"
    subprocess.run(["cc", "-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic",
                    "-I", ROOT / "capi/include", ROOT / "capi/examples/energy.c", "-L", lib,
                    "-lmlff_capi", f"-Wl,-rpath,{lib}", "-o", exe], check=True)
    model = ROOT / "models/painn-gfn2.safetensors"
    out = subprocess.run([exe, model], check=True, capture_output=True, text=True).stdout
    lines = [line.split() for line in out.splitlines()]
    energy = float(lines[0][1])
    atoms = np.array([[float(v) for v in line[3:4] + line[5:8]] for line in lines[1:]])
    numbers = np.array([8, 1, 1])
    x = np.array([[0.0, 0.0, 0.0], [0.9572, 0.0, 0.0], [-0.24, 0.9266, 0.0]])
    e, ea, f, _ = predict(mlff, tmp_path, model, numbers, x, None, "f64")
    assert abs(energy - e) <= 1e-9 * abs(e)
    assert np.abs(atoms[:, 0] - ea).max() <= 1e-9 * np.abs(ea).max()
    assert np.abs(atoms[:, 1:] - f).max() <= 1e-9 * np.abs(f).max()


def test_the_water_example_runs(lammps, tmp_path):
    example = ROOT / "lammps/examples/water"
    for name in ("in.water", "water.data"):
        (tmp_path / name).write_text((example / name).read_text())
    plugin, lmp = lammps
    cmd = lmp.replace("{n}", "1").split() + [
        "-in", "in.water", "-var", "plugin", plugin, "-var", "model",
        str(ROOT / "models/painn-gfn2-water.safetensors"), "-var", "relax", "5", "-var", "steps", "20",
        "-var", "device", "cpu"]
    p = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rows = _thermo_rows(p.stdout)
    assert len(rows) == 2 and np.isfinite(rows).all(), p.stdout[-2000:]
    assert (tmp_path / "water.lammpstrj").stat().st_size > 0
