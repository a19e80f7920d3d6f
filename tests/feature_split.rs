//! The feature split (`ops::feature_split`): its CPU twin — the oracle the
//! CUDA kernel is checked against on the GPU machine (tests/gpu/) — gives the fused path's
//! energies and forces, and bad inputs are refused with their cause.

mod common;

use candle_core::{DType, Device, Tensor};
use common::fused::{feature_split_call, feature_split_systems as systems};
use common::*;
use mlff_distiller::model::Backend;
use mlff_distiller::ops::{feature_split, FeatureSplitPlan, ModelShape};
use mlff_distiller::systems::aspirin;
use mlff_distiller::{Batch, PainnCalculator};

/// The one-kernel twin's and the fused path's energies and forces for `batch`.
fn both(calc: &PainnCalculator, batch: &Batch) -> [(Tensor, Tensor); 2] {
    let (inputs, _) = calc.prepare(batch).unwrap();
    let fused = calc.fused().unwrap();
    let pass = fused.forward(&inputs).unwrap();
    [
        (pass.atom_energies.clone(), pass.forces().unwrap()),
        feature_split_call(calc, &inputs),
    ]
}

#[test]
fn feature_split_twin_matches_fused_path() {
    let shipped = |dtype| {
        PainnCalculator::from_checkpoint(
            &root().join("models/painn-gfn2.safetensors"),
            &Device::Cpu,
            dtype,
        )
        .unwrap()
        .with_backend(Backend::Fused)
    };
    let cases = [
        (
            "small model",
            calculator(DType::F64, &Device::Cpu),
            systems(),
            1e-11,
        ),
        (
            "shipped, aspirin",
            shipped(DType::F64),
            Batch::new(vec![aspirin()]).unwrap(),
            1e-11,
        ),
        (
            "shipped f32",
            shipped(DType::F32),
            Batch::new(vec![aspirin()]).unwrap(),
            2e-5,
        ),
    ];
    for (what, calc, batch, tol) in cases {
        let [(e_ref, f_ref), (e, f)] = both(&calc, &batch);
        let (de, df) = (max_abs_diff(&e, &e_ref), max_abs_diff(&f, &f_ref));
        let scale = max_abs_tensor(&f_ref).max(1.0);
        assert!(
            de <= tol * max_abs_tensor(&e_ref).max(1.0),
            "{what}: ΔE {de}"
        );
        assert!(df <= tol * scale, "{what}: ΔF {df} of {scale}");
        assert!(
            max_abs_tensor(&f_ref) > 1e-3,
            "{what}: forces should not vanish"
        );
    }
}

/// The lone atom and the far atom feel no force, and the plan is refused where it cannot run.
#[test]
fn feature_split_edge_cases_and_refusals() {
    let calc = calculator(DType::F64, &Device::Cpu);
    let batch = systems();
    let (inputs, _) = calc.prepare(&batch).unwrap();
    let (_, f) = feature_split_call(&calc, &inputs);
    let f = f.to_vec2::<f64>().unwrap();
    assert_eq!(f[6], [0.0; 3], "far atom");
    assert_eq!(f[7], [0.0; 3], "lone atom");

    let model = ModelShape {
        hidden: 24,
        n_rbf: 8,
        blocks: 2,
        elements: 4,
        cutoff: 4.0,
    };
    let why = FeatureSplitPlan::new(model, 10, 20).unwrap_err();
    assert!(why.contains("24 features"), "{why}");
    let fused = calc.fused().unwrap();
    let plan = FeatureSplitPlan::new(fused.shape().unwrap(), 3, 0).unwrap();
    let why = plan.fit(&Device::Cpu, DType::F32).unwrap_err();
    assert!(why.contains("CUDA"), "{why}");
    let why = plan.fit_widest(&Device::Cpu, DType::F32, 64).unwrap_err();
    assert!(why.contains("CUDA"), "{why}");
    // Splits of the features over the blocks: a power of two of at most 32 features each.
    let hidden = fused.shape().unwrap().hidden;
    for groups in [0, 3, hidden * 2] {
        let why = plan.with_groups(groups).unwrap_err();
        assert!(why.contains("do not split"), "{groups} blocks: {why}");
    }
    assert!(plan.with_groups(hidden).is_ok());
    // The CPU path never takes the one kernel.
    assert_eq!(fused.plan(&inputs).unwrap().name(), "layers");

    // Wrong shapes and species are named.
    let n = inputs.positions.dim(0).unwrap();
    let e = inputs.centers.dim(0).unwrap();
    let plan = FeatureSplitPlan::new(fused.shape().unwrap(), n, e).unwrap();
    let w = fused.packed_weights().unwrap();
    let pos = inputs.positions.detach();
    let short = w.narrow(0, 0, w.dim(0).unwrap() - 1).unwrap();
    let err = feature_split(
        &plan,
        &short,
        &pos,
        &inputs.offsets,
        &inputs.species,
        &inputs.centers,
        &inputs.neighbors,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("packed weights"), "{err}");
    let species = Tensor::new(vec![9u32; n], &Device::Cpu).unwrap();
    let err = feature_split(
        &plan,
        w,
        &pos,
        &inputs.offsets,
        &species,
        &inputs.centers,
        &inputs.neighbors,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("species[0] = 9"), "{err}");
}

/// The MD step's CPU twin (`ops::feature_split_step`, what the single-launch CUDA step is
/// checked against) is the integrator's step op by op around the one kernel's twin, bit for
/// bit, NVE and Langevin; state tensors of the wrong shape are named.
#[test]
fn md_step_twin_is_the_integrators_step() {
    use mlff_distiller::md::{Ensemble, Integrator};
    use mlff_distiller::ops::{feature_split_step, md_displacement2, MdStepInputs};
    let calc = calculator(DType::F64, &Device::Cpu);
    let (inputs, _) = calc
        .prepare(&Batch::new(vec![random_molecule(12, 3)]).unwrap())
        .unwrap();
    let fused = calc.fused().unwrap();
    let (n, e) = (
        inputs.positions.dim(0).unwrap(),
        inputs.centers.dim(0).unwrap(),
    );
    let plan = FeatureSplitPlan::new(fused.shape().unwrap(), n, e).unwrap();
    let w = fused.packed_weights().unwrap();
    let index = [&inputs.species, &inputs.centers, &inputs.neighbors];
    let wave = |seed: f64, size: f64| {
        let v: Vec<f64> = (0..3 * n)
            .map(|k| size * ((k as f64 + seed) * 0.37).sin())
            .collect();
        Tensor::from_vec(v, (n, 3), &Device::Cpu).unwrap()
    };
    let x = inputs.positions.detach();
    let (v, f, xi) = (wave(1.0, 0.05), wave(2.0, 1.0), wave(3.0, 1.0));
    let reference = (&x + wave(4.0, 0.05)).unwrap();
    let masses: Vec<f64> = (0..n).map(|a| 1.0 + a as f64).collect();
    for ensemble in [
        Ensemble::Nve,
        Ensemble::Nvt {
            temperature: 300.0,
            friction: 10.0,
        },
    ] {
        let integrator = Integrator::new(ensemble, 0.5, &masses, &Device::Cpu).unwrap();
        let noise = integrator.langevin(Some(&xi)).unwrap();
        let langevin = noise.is_some();
        let md = MdStepInputs {
            positions: &x,
            velocities: &v,
            forces: &f,
            half_kick: integrator.half_kick(),
            dt: integrator.dt(),
            noise,
            reference: &reference,
        };
        let out = feature_split_step(&plan, w, &inputs.offsets, index, &md).unwrap();
        let (x1, v1) = integrator
            .advance(&x, &v, &f, langevin.then_some(&xi))
            .unwrap();
        let (energies, f1) =
            feature_split(&plan, w, &x1, &inputs.offsets, index[0], index[1], index[2]).unwrap();
        let v2 = integrator.kick(&v1, &f1).unwrap();
        let host = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f64>().unwrap();
        let what = ensemble.name();
        assert_eq!(host(&out.positions), host(&x1), "{what}: positions");
        assert_eq!(host(&out.velocities), host(&v2), "{what}: velocities");
        assert_eq!(host(&out.forces), host(&f1), "{what}: forces");
        assert_eq!(
            out.energy.to_scalar::<f64>().unwrap(),
            energies.sum_all().unwrap().to_scalar::<f64>().unwrap(),
            "{what}: energy"
        );
        let d2 = md_displacement2(&x1, &reference).unwrap();
        assert_eq!(host(&out.displacement2), host(&d2), "{what}: displacement");
        assert!(host(&out.positions) != host(&x), "{what}: the atoms moved");

        let short = v.narrow(0, 0, n - 1).unwrap();
        let bad = MdStepInputs {
            velocities: &short,
            ..md
        };
        let err = feature_split_step(&plan, w, &inputs.offsets, index, &bad)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("velocities"), "{err}");
    }
}
