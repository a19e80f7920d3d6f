//! Shared test fixtures: small random models and random molecules/boxes.
#![allow(dead_code)]

pub mod dense;
pub mod device_list;
pub mod element_sums;
pub mod extxyz;
pub mod fused;

use candle_core::{DType, Device};
use candle_nn::VarBuilder;
use mlff_distiller::model::{init_varmap, Painn, PainnConfig};
use mlff_distiller::structure::{ExtraArray, Lattice, Structure};
use mlff_distiller::PainnCalculator;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

/// A small model (fast in debug builds) with every parameter random, including the readout
/// reference energies, scale and shift.
/// A barostat that moves a small test box visibly within tens of steps: 5,000 bar, coupled
/// in 50 fs with a compressibility that keeps each move small.
pub fn stiff_barostat(mode: mlff_distiller::md::BarostatMode) -> mlff_distiller::md::Barostat {
    mlff_distiller::md::Barostat {
        pressure_bar: 5000.0,
        mode,
        time_fs: 50.0,
        compressibility_per_bar: 2e-6,
    }
}

/// A batch run's outputs in `dir`: one trajectory per system under `traj/`, `log.jsonl` and
/// `restart.json`.
pub fn batch_outputs(dir: &std::path::Path) -> mlff_distiller::md::MdOutputs {
    mlff_distiller::md::MdOutputs {
        traj: Some(dir.join("traj")),
        log: Some(dir.join("log.jsonl")),
        restart: Some(dir.join("restart.json")),
        append: false,
        traj_split: true,
    }
}

/// Runs `run` (a batch with [`batch_outputs`] in `dir`, given a progress callback), copying
/// its restart file aside when the run reports `step`: a run killed later keeps its restart of
/// that step. Returns the copy's path.
pub fn restart_kept_at(
    dir: &std::path::Path,
    step: u64,
    run: impl FnOnce(&mut dyn FnMut(&mlff_distiller::md::BatchProgress)),
) -> std::path::PathBuf {
    let (live, kept) = (
        dir.join("restart.json"),
        dir.join(format!("restart-{step}.json")),
    );
    run(&mut |p| {
        if p.step == step {
            std::fs::copy(&live, &kept).unwrap();
        }
    });
    kept
}

pub fn small_config() -> PainnConfig {
    PainnConfig {
        hidden: 16,
        n_blocks: 2,
        n_rbf: 8,
        cutoff: 4.0,
        elements: vec![1, 6, 7, 8],
    }
}

pub fn model(cfg: &PainnConfig, seed: u64, dtype: DType, dev: &Device) -> Painn {
    let vm = init_varmap(cfg, seed, DType::F64, &Device::Cpu).unwrap();
    {
        let data = vm.data().lock().unwrap();
        let n = cfg.elements.len();
        let refs: Vec<f64> = (0..n).map(|k| -10.0 * (k as f64 + 1.0)).collect();
        data["readout.atom_ref"]
            .set(&candle_core::Tensor::new(refs, &Device::Cpu).unwrap())
            .unwrap();
        data["readout.scale"]
            .set(&candle_core::Tensor::new(&[1.7f64], &Device::Cpu).unwrap())
            .unwrap();
        data["readout.shift"]
            .set(&candle_core::Tensor::new(&[-0.3f64], &Device::Cpu).unwrap())
            .unwrap();
    }
    // Plain tensors (not Vars) so only positions are differentiated.
    let tensors = vm
        .data()
        .lock()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_tensor().copy().unwrap()))
        .collect();
    Painn::new(cfg, VarBuilder::from_tensors(tensors, dtype, dev)).unwrap()
}

/// The random "teacher" PaiNN (seed 99, f64, CPU) that labels the test frames.
pub fn teacher(cfg: &PainnConfig) -> PainnCalculator {
    PainnCalculator::new(
        model(cfg, 99, DType::F64, &Device::Cpu),
        Device::Cpu,
        DType::F64,
    )
}

/// `frames` with energies and forces from a random model of `cfg` (seed 99, f64, CPU): a
/// teacher for training tests.
pub fn labelled(cfg: &PainnConfig, mut frames: Vec<Structure>) -> Vec<Structure> {
    let teacher = teacher(cfg);
    let batch = mlff_distiller::Batch::new(frames.clone()).unwrap();
    let pred = mlff_distiller::Calculator::compute(&teacher, &batch).unwrap();
    for (s, (e, f)) in frames
        .iter_mut()
        .zip(pred.energies.into_iter().zip(pred.forces))
    {
        s.energy = Some(e);
        s.forces = Some(f);
    }
    frames
}

/// [`labelled`], and the teacher's stress of every periodic frame as its `stress` info key
/// (9 values, as `teachers/label.py` writes it).
pub fn stress_labelled(cfg: &PainnConfig, frames: Vec<Structure>) -> Vec<Structure> {
    let mut frames = labelled(cfg, frames);
    let teacher = teacher(cfg);
    let batch = mlff_distiller::Batch::new(frames.clone()).unwrap();
    let got = teacher.compute_with_stress(&batch).unwrap();
    for (s, sigma) in frames.iter_mut().zip(got.stresses) {
        if let Some(sigma) = sigma {
            let values: Vec<String> = sigma.iter().flatten().map(|x| format!("{x:e}")).collect();
            s.info.push(("stress".into(), values.join(" ")));
        }
    }
    frames
}

pub fn calculator(dtype: DType, dev: &Device) -> PainnCalculator {
    let cfg = small_config();
    PainnCalculator::new(model(&cfg, 7, dtype, dev), dev.clone(), dtype)
}

/// A random molecule of `n` H/C/N/O atoms with no pair closer than 0.9 Å, roughly compact.
pub fn random_molecule(n: usize, seed: u64) -> Structure {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let zs = [1u8, 6, 7, 8];
    let side = (n as f64 * 6.0).cbrt() + 1.0;
    let mut pos: Vec<[f64; 3]> = Vec::new();
    while pos.len() < n {
        let p = [0, 1, 2].map(|_| rng.random_range(0.0..side));
        if pos.iter().all(|q| dist(&p, q) > 0.9) {
            pos.push(p);
        }
    }
    let numbers = (0..n).map(|_| zs[rng.random_range(0..4)]).collect();
    Structure::molecule(numbers, pos)
}

/// A random periodic box (triclinic when `skew` > 0) at about liquid density.
pub fn random_box(n: usize, skew: f64, seed: u64) -> Structure {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let side = (n as f64 * 10.0).cbrt();
    let cell: Lattice = [
        [side, 0.0, 0.0],
        [skew * side, side, 0.0],
        [0.1 * skew * side, -0.2 * skew * side, side],
    ];
    let mut pos: Vec<[f64; 3]> = Vec::new();
    let mut tries = 0;
    while pos.len() < n && tries < 1_000_000 {
        tries += 1;
        let f = [0, 1, 2].map(|_| rng.random_range(0.0..1.0));
        let p = std::array::from_fn(|d| (0..3).map(|k| f[k] * cell[k][d]).sum::<f64>());
        if pos.iter().all(|q| dist(&p, q) > 0.95) {
            pos.push(p);
        }
    }
    let zs = [1u8, 8];
    let numbers = (0..pos.len()).map(|_| zs[rng.random_range(0..2)]).collect();
    Structure {
        cell: Some(cell),
        pbc: [true; 3],
        ..Structure::molecule(numbers, pos)
    }
}

pub fn dist(a: &[f64; 3], b: &[f64; 3]) -> f64 {
    ((a[0] - b[0]).powi(2) + (a[1] - b[1]).powi(2) + (a[2] - b[2]).powi(2)).sqrt()
}

/// A random proper rotation matrix.
pub fn random_rotation(seed: u64) -> [[f64; 3]; 3] {
    mlff_distiller::systems::random_rotation(&mut ChaCha8Rng::seed_from_u64(seed))
}

pub fn rotate(r: &[[f64; 3]; 3], v: &[f64; 3]) -> [f64; 3] {
    std::array::from_fn(|i| (0..3).map(|k| r[i][k] * v[k]).sum())
}

/// Largest |a - b| over all force components.
pub fn max_force_diff(a: &[[f64; 3]], b: &[[f64; 3]]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .flatten()
        .zip(b.iter().flatten())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

/// Largest |a - b| over two tensors of the same shape, on any device and dtype.
pub fn max_abs_diff(a: &candle_core::Tensor, b: &candle_core::Tensor) -> f64 {
    assert_eq!(a.dims(), b.dims());
    if a.elem_count() == 0 {
        return 0.0;
    }
    let cpu = |t: &candle_core::Tensor| t.to_device(&Device::Cpu)?.to_dtype(DType::F64);
    (cpu(a).unwrap() - cpu(b).unwrap())
        .and_then(|d| d.abs()?.flatten_all()?.max(0)?.to_scalar::<f64>())
        .unwrap()
}

/// Largest |element| of a tensor on any device and dtype, 0 for an empty one.
pub fn max_abs_tensor(t: &candle_core::Tensor) -> f64 {
    if t.elem_count() == 0 {
        return 0.0;
    }
    t.to_dtype(DType::F64)
        .and_then(|t| t.abs()?.flatten_all()?.max(0)?.to_scalar::<f64>())
        .unwrap()
}

/// Largest |component| of a set of force rows.
pub fn max_abs(a: &[[f64; 3]]) -> f64 {
    a.iter().flatten().fold(0.0f64, |m, x| m.max(x.abs()))
}

/// `n` random u32 indices below `bound` (seeded).
pub fn random_index(n: usize, bound: usize, seed: u64) -> Vec<u32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(0..bound as u32)).collect()
}

/// Runs the `mlff` binary built for these tests.
pub fn mlff(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_mlff"))
        .args(args)
        .output()
        .expect("run mlff")
}

/// A path as a command-line argument.
pub fn s(p: &std::path::Path) -> &str {
    p.to_str().unwrap()
}

/// The shipped model with one NaN weight, written into `dir`.
pub fn poisoned_model(dir: &std::path::Path) -> std::path::PathBuf {
    let ck =
        mlff_distiller::checkpoint::load(&root().join("models/painn-gfn2.safetensors")).unwrap();
    let mut tensors = ck.tensors.clone();
    let name = "readout.hidden.weight";
    let mut w = tensors[name]
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    w[0] = f32::NAN;
    let shape = tensors[name].shape().clone();
    tensors.insert(
        name.into(),
        candle_core::Tensor::from_vec(w, shape, &candle_core::Device::Cpu).unwrap(),
    );
    let poisoned = dir.join("nan.safetensors");
    mlff_distiller::checkpoint::save(&poisoned, &ck.config, &tensors, &ck.provenance).unwrap();
    poisoned
}

/// Writes a model config JSON into `dir` and returns its path.
pub fn config_file(dir: &std::path::Path, json: &str) -> std::path::PathBuf {
    let path = dir.join("config.json");
    std::fs::write(&path, json).unwrap();
    path
}

/// A tiny H C O model's config and six random boxes of 6-8 atoms, each its own trajectory,
/// labelled by [`stress_labelled`] (seeds `seed`..`seed + 5`), written into `dir`: the
/// config's path and the frames' file.
pub fn stress_boxes(dir: &std::path::Path, seed: u64) -> (std::path::PathBuf, std::path::PathBuf) {
    let cfg_json =
        r#"{"hidden": 8, "n_blocks": 2, "n_rbf": 6, "cutoff": 3.5, "elements": [1, 6, 8]}"#;
    let config = config_file(dir, cfg_json);
    let model_cfg: PainnConfig = serde_json::from_str(cfg_json).unwrap();
    let frames: Vec<_> = (0..6)
        .map(|k| {
            let mut s = random_box(6 + k % 3, 0.2, seed + k as u64);
            s.info.push(("trajectory".into(), format!("b{k}")));
            s
        })
        .collect();
    let data = dir.join("boxes.extxyz");
    mlff_distiller::io::write_extxyz(&data, &stress_labelled(&model_cfg, frames)).unwrap();
    (config, data)
}

/// The crate root (shipped models and data live under it).
pub fn root() -> &'static std::path::Path {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Whether `python3` can import ASE. CI installs it (.ci/run) and sets MLFF_REQUIRE_ASE, so
/// there a missing ASE fails instead of skipping.
/// A 7-atom carbon cluster (extended XYZ) for the toy teacher's runs.
pub const C7_XYZ: &str = "7\nProperties=species:S:1:pos:R:3\nC 0.0 0.0 0.0\nC 1.6 0.0 0.0\n\
     C 0.8 1.386 0.0\nC 0.8 0.462 1.306\nC -0.8 1.386 0.0\nC 2.4 1.386 0.0\nC 0.8 -0.924 1.306\n";

/// Whether the teacher bridge can run here (python3 with ASE), saying so where not.
pub fn bridge_available() -> bool {
    let ok = ase_available();
    if !ok {
        eprintln!("skipped: python3 cannot import ASE (the teacher bridge needs it)");
    }
    ok
}

pub fn ase_available() -> bool {
    let ok = std::process::Command::new("python3")
        .args(["-c", "import ase.io"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok || std::env::var_os("MLFF_REQUIRE_ASE").is_none(),
        "MLFF_REQUIRE_ASE is set but `python3 -c 'import ase.io'` fails"
    );
    ok
}

/// The gradient `grads` holds for weight `name`[r, c] (or [c] of a vector) and the central
/// difference of `t`'s loss on frames `idx` over it (step 1e-5; the weight is put back).
pub fn gradient_and_difference(
    t: &mlff_distiller::train::Trainer,
    idx: &[usize],
    grads: &candle_core::backprop::GradStore,
    (name, r, c): (&str, usize, usize),
) -> (f64, f64) {
    let var = (t.optimizer().vars().iter())
        .find(|(n, _)| n == name)
        .unwrap()
        .1
        .clone();
    let base = var.as_tensor().copy().unwrap();
    let vector = var.dims().len() == 1;
    let g = grads.get(var.as_tensor()).unwrap();
    let analytic = match vector {
        true => candle_core::IndexOp::i(g, c).unwrap(),
        false => candle_core::IndexOp::i(g, (r, c)).unwrap(),
    }
    .to_scalar::<f64>()
    .unwrap();
    let k = if vector { c } else { r * var.dims()[1] + c };
    let h = 1e-5;
    let at = |delta: f64| {
        let mut v = base.flatten_all().unwrap().to_vec1::<f64>().unwrap();
        v[k] += delta;
        var.set(&candle_core::Tensor::from_vec(v, var.shape(), &Device::Cpu).unwrap())
            .unwrap();
        t.loss_and_grads(idx).unwrap().0
    };
    let fd = (at(h) - at(-h)) / (2.0 * h);
    var.set(&base).unwrap();
    (analytic, fd)
}

/// Asserts that `t`'s loss gradients on frames `idx` equal central differences of the loss at
/// each probe (weight, row, column), to 1e-5 relative (absolute below 1e-3); `label` heads
/// the message.
pub fn assert_gradients_match_differences(
    t: &mlff_distiller::train::Trainer,
    idx: &[usize],
    probes: &[(&str, usize, usize)],
    label: &str,
) {
    let (_, grads) = t.loss_and_grads(idx).unwrap();
    for &(name, r, c) in probes {
        let (analytic, fd) = gradient_and_difference(t, idx, &grads, (name, r, c));
        let err = (fd - analytic).abs() / analytic.abs().max(1e-3);
        assert!(
            err < 1e-5,
            "{label} {name}[{r},{c}]: fd {fd} vs backprop {analytic}"
        );
    }
}

/// For tests that differentiate a force loss: candle reads this once per thread, before the
/// first backward, to keep the graph of a backward pass differentiable.
pub fn second_order() {
    std::env::set_var("CANDLE_GRAD_DO_NOT_DETACH", "1");
}

/// A seeded unit vector over the frame's 3N coordinates.
pub fn direction(n: usize, seed: u64) -> Vec<[f64; 3]> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut v: Vec<[f64; 3]> = (0..n)
        .map(|_| std::array::from_fn(|_| StandardNormal.sample(&mut rng)))
        .collect();
    let norm = v.iter().flatten().map(|x| x * x).sum::<f64>().sqrt();
    v.iter_mut().flatten().for_each(|x| *x /= norm);
    v
}

/// A per-atom `NAME:R:3` column.
pub fn hvp_column(name: &str, rows: &[[f64; 3]]) -> ExtraArray {
    ExtraArray {
        name: name.into(),
        kind: 'R',
        ncols: 3,
        values: rows.iter().flatten().map(|x| format!("{x:.17e}")).collect(),
    }
}

/// [`labelled`], and the teacher's Hessian-vector product (central differences, h = 1e-4)
/// along a seeded unit direction as the `hvp_direction` and `hvp` columns, as
/// `teachers/label.py --hessian-vectors` writes them.
pub fn hvp_labelled(cfg: &PainnConfig, frames: Vec<Structure>) -> Vec<Structure> {
    let mut frames = labelled(cfg, frames);
    let teacher = teacher(cfg);
    for (k, s) in frames.iter_mut().enumerate() {
        let v = direction(s.len(), 1000 + k as u64);
        let hv = mlff_distiller::train::hessian_vector_products(
            &teacher,
            std::slice::from_ref(s),
            std::slice::from_ref(&v),
            1e-4,
        )
        .unwrap()
        .remove(0);
        s.arrays.push(hvp_column("hvp_direction", &v));
        s.arrays.push(hvp_column("hvp", &hv));
    }
    frames
}

/// Forces of `inner` with those of atoms `atoms` made NaN at its call `at` (0: the starting
/// call), with or without the stress: that system's next step leaves the finite numbers.
pub struct Poisoned<F> {
    pub inner: F,
    pub atoms: std::ops::Range<usize>,
    pub calls: usize,
    pub at: usize,
}

impl<F> Poisoned<F> {
    pub fn new(inner: F, atoms: std::ops::Range<usize>, at: usize) -> Self {
        Self {
            inner,
            atoms,
            calls: 0,
            at,
        }
    }

    fn poison(
        &mut self,
        mut out: mlff_distiller::md::Evaluation,
    ) -> mlff_distiller::Result<mlff_distiller::md::Evaluation> {
        if self.calls == self.at {
            let mut f = mlff_distiller::md::host_positions(&out.forces)?;
            for row in &mut f[self.atoms.clone()] {
                *row = [f64::NAN; 3];
            }
            out.forces = mlff_distiller::md::device_positions(&f, &Device::Cpu)?;
        }
        self.calls += 1;
        Ok(out)
    }
}

impl<F: mlff_distiller::md::ForceProvider> mlff_distiller::md::ForceProvider for Poisoned<F> {
    fn device(&self) -> &Device {
        self.inner.device()
    }

    fn evaluate(
        &mut self,
        x: &mut candle_core::Tensor,
    ) -> mlff_distiller::Result<mlff_distiller::md::Evaluation> {
        let out = self.inner.evaluate(x)?;
        self.poison(out)
    }

    fn evaluate_with_stress(
        &mut self,
        x: &mut candle_core::Tensor,
    ) -> mlff_distiller::Result<(mlff_distiller::md::Evaluation, Vec<Option<Lattice>>)> {
        let (out, stresses) = self.inner.evaluate_with_stress(x)?;
        Ok((self.poison(out)?, stresses))
    }

    fn set_cells(&mut self, cells: &[Lattice]) -> mlff_distiller::Result<()> {
        self.inner.set_cells(cells)
    }

    fn list_cells(&self) -> Option<Vec<Lattice>> {
        self.inner.list_cells()
    }

    fn list_reference(&self) -> mlff_distiller::Result<Option<Vec<[f64; 3]>>> {
        self.inner.list_reference()
    }

    fn restore_list(&mut self, reference: &[[f64; 3]]) -> mlff_distiller::Result<()> {
        self.inner.restore_list(reference)
    }

    fn systems(&self) -> usize {
        self.inner.systems()
    }

    fn retain_systems(&mut self, keep: &[bool]) -> mlff_distiller::Result<()> {
        self.inner.retain_systems(keep)
    }

    fn list_builds(&self) -> usize {
        self.inner.list_builds()
    }
}

/// One layered domain's records through the whole protocol, with made-up ghost features and
/// received gradients (the same for every call): each block's outputs, the energies, the
/// gradients sent back and the forces.
pub fn layered_records(
    calc: &PainnCalculator,
    mut l: mlff_distiller::domain::LayeredDomain,
) -> Vec<Vec<f64>> {
    let (w, ghosts, blocks, n_local) =
        (l.features_per_atom(), l.n_ghost(), l.blocks(), l.n_local());
    let made_up = |n: usize, k: usize| -> Vec<f64> {
        (0..n)
            .map(|i| ((i * 7919 + k * 13) % 1000) as f64 * 1e-3 - 0.5)
            .collect()
    };
    let mut records = vec![l.forward(calc, None).unwrap()];
    for k in 1..blocks {
        records.push(l.forward(calc, Some(&made_up(ghosts * w, k))).unwrap());
    }
    records.push(l.atom_energies().unwrap());
    records.push(l.backward(calc, None).unwrap());
    for k in 1..blocks {
        records.push(l.backward(calc, Some(&made_up(n_local * w, k))).unwrap());
    }
    records.push(l.forces().unwrap().into_iter().flatten().collect());
    records
}
