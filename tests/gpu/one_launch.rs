//! The one-launch kernels on CUDA against their CPU twin: the feature split (features split
//! over the blocks) and the atom split (atoms split over the blocks), and the model's choice of
//! each.

use crate::common;
use crate::common::*;
use crate::{cuda, shipped_calculator};
use candle_core::{DType, Device, Tensor};
use mlff_distiller::model::Backend;
use mlff_distiller::ops::{FeatureSplitPlan, GROUPS};
use mlff_distiller::systems::aspirin;
use mlff_distiller::{Batch, PainnCalculator, Tuning};

/// The one-kernel path (`ops::feature_split`, a cooperative launch with barriers among its
/// blocks) on CUDA against its CPU twin, f32 and f64: the small test model (one feature per
/// block), the shipped model on aspirin and on 64 atoms (the largest the default takes; in f64
/// its shared memory does not fit, so the fused kernels run instead), an F = 64 model on
/// aspirin (its own entry at 64 blocks), a lone atom and a far atom, each with its features
/// split over every number of blocks that fits (1 to 128, at most 32 features each; 3 launches
/// each, which agree: the barrier counter starts from zero each time). The fused model's
/// choice of the one kernel (up to 64 atoms, wherever it fits) gives the separate kernels'
/// forces.
#[test]
fn cuda_feature_split_matches_cpu_twin() {
    use common::fused::{feature_split_blocks, feature_split_systems};
    let gpu = cuda();
    let big = Batch::new(vec![random_molecule(64, 9)]).unwrap();
    let asp = Batch::new(vec![aspirin()]).unwrap();
    // F = 64 with the shipped basis: its own entry at one feature a block (64 blocks).
    let narrow = |dtype, dev: &Device| {
        let cfg = mlff_distiller::model::PainnConfig {
            hidden: 64,
            ..Default::default()
        };
        PainnCalculator::new(model(&cfg, 11, dtype, dev), dev.clone(), dtype)
            .with_backend(Backend::Fused)
    };
    for dtype in [DType::F32, DType::F64] {
        let tol = if dtype == DType::F32 { 3e-5 } else { 1e-10 };
        let cases = [
            (
                "small model",
                calculator(dtype, &Device::Cpu),
                calculator(dtype, &gpu),
                feature_split_systems(),
            ),
            (
                "aspirin",
                shipped_calculator(&Device::Cpu, dtype, Backend::Fused),
                shipped_calculator(&gpu, dtype, Backend::Fused),
                asp.clone(),
            ),
            (
                "64 atoms",
                shipped_calculator(&Device::Cpu, dtype, Backend::Fused),
                shipped_calculator(&gpu, dtype, Backend::Fused),
                big.clone(),
            ),
            (
                "F = 64 aspirin",
                narrow(dtype, &Device::Cpu),
                narrow(dtype, &gpu),
                asp.clone(),
            ),
        ];
        for (what, cpu_calc, gpu_calc, batch) in cases {
            let (x_cpu, _) = cpu_calc.prepare(&batch).unwrap();
            let (x_gpu, _) = gpu_calc.prepare(&batch).unwrap();
            let fused = gpu_calc.fused().unwrap().clone().with_tuning(Tuning {
                feature_split_max_atoms: 64,
                ..Tuning::default()
            });
            // The kernel runs wherever its plan fits the device (64 atoms in f64 does not), and
            // the model takes it there, with the edge geometry resident or in chunks.
            let (n, e) = (
                x_gpu.positions.dim(0).unwrap(),
                x_gpu.centers.dim(0).unwrap(),
            );
            let fitted = FeatureSplitPlan::new(fused.shape().unwrap(), n, e).and_then(|p| {
                p.fit_widest(&gpu, dtype, Tuning::default().feature_split_max_blocks)
            });
            assert_eq!(
                fitted.is_ok(),
                !(what == "64 atoms" && dtype == DType::F64),
                "{what} {dtype:?}"
            );
            let one = fused
                .feature_split_plan(n, e, &gpu, dtype)
                .unwrap()
                .is_some();
            let resident = fitted.as_ref().is_ok_and(|p| p.edges_resident());
            assert_eq!(one, fitted.is_ok(), "{what} {dtype:?}");
            println!(
                "{what} {dtype:?}: {e} edges, fits {}, resident {resident}",
                fitted.is_ok()
            );
            let (e_ref, f_ref) = feature_split_blocks(&cpu_calc, &x_cpu, GROUPS).unwrap();
            let scale_f = max_abs_tensor(&f_ref).max(1.0);
            let scale_e = max_abs_tensor(&e_ref).max(1.0);
            // Every split of the features over the blocks that the model has (one feature per
            // block up to 32), each three times.
            let hidden = fused.shape().unwrap().hidden;
            let splits = (0..8)
                .map(|k| 1 << k)
                .filter(|g| hidden / g <= 32 && *g <= hidden);
            for groups in splits {
                let mut first: Option<Tensor> = None;
                for call in 0..3 {
                    let Some((e, f)) = feature_split_blocks(&gpu_calc, &x_gpu, groups) else {
                        println!("{what} {dtype:?}: {groups} blocks do not fit");
                        break;
                    };
                    let (e, f) = (
                        e.to_device(&Device::Cpu).unwrap(),
                        f.to_device(&Device::Cpu).unwrap(),
                    );
                    let (de, df) = (max_abs_diff(&e, &e_ref), max_abs_diff(&f, &f_ref));
                    println!(
                        "{what} {dtype:?} {groups} blocks, call {call}: ΔE {de:.2e} ΔF {df:.2e} \
                         of {scale_f:.2}"
                    );
                    assert!(de <= tol * scale_e, "{what} {dtype:?} {groups}: ΔE {de}");
                    assert!(df <= tol * scale_f, "{what} {dtype:?} {groups}: ΔF {df}");
                    if let Some(f0) = &first {
                        assert!(
                            max_abs_diff(&f, f0) <= tol * scale_f,
                            "{what}: launches differ"
                        );
                    }
                    first = Some(f);
                }
            }
            // The calculator's path (one kernel where it applies) = the fused kernels.
            let (e_one, f_one) = fused.energies_and_forces(&x_gpu).unwrap();
            let many = fused.clone().with_tuning(Tuning {
                feature_split_max_atoms: 0,
                ..Tuning::default()
            });
            assert!(many
                .feature_split_plan(n, e, &gpu, dtype)
                .unwrap()
                .is_none());
            let (e2, f2) = many.energies_and_forces(&x_gpu).unwrap();
            let (de, df) = (max_abs_diff(&e_one, &e2), max_abs_diff(&f_one, &f2));
            assert!(
                de <= tol * scale_e && df <= tol * scale_f,
                "{what} {dtype:?}: ΔE {de} ΔF {df}"
            );
        }
    }
}

/// The atom-split one kernel (`ops::atom_split`: atoms split over the blocks, barriers only
/// where atoms mix) on CUDA against the one-kernel CPU twin, f32 and f64: the shipped model on
/// aspirin and on 4 aspirins, and random models of 32 features with two interaction blocks and
/// with one (no barrier in the forward) on molecules, a lone atom, a far atom and a periodic
/// box, and 16 aspirins; 1 atom per block up to the kernel's most (16 with tensor cores: the
/// shipped model in f32; 2 otherwise), the dense layers on tensor cores and on CUDA cores where
/// each can run, own edges listed once per call and (512 at once) again in every pass, the tape
/// in shared memory or (where it does not fit) in the scratch; three launches each (the barrier counters start from zero each
/// time). The model's choice of it gives the separate kernels' forces.
#[test]
fn cuda_atom_split_matches_cpu_twin() {
    use common::fused::feature_split_systems;
    use mlff_distiller::ops::{atom_split, AtomSplitPlan, ATOM_SPLIT_MAX_ATOMS_PER_BLOCK};
    use mlff_distiller::plan::Plan;
    let gpu = cuda();
    let small = |blocks: usize, dtype: DType, dev: &Device| {
        let cfg = mlff_distiller::model::PainnConfig {
            hidden: 32,
            n_blocks: blocks,
            ..small_config()
        };
        PainnCalculator::new(model(&cfg, 11, dtype, dev), dev.clone(), dtype)
    };
    let aspirins = |k: usize| Batch::new(vec![aspirin(); k]).unwrap();
    for dtype in [DType::F32, DType::F64] {
        let tol = if dtype == DType::F32 { 3e-5 } else { 1e-10 };
        let cases = [
            (
                "aspirin",
                shipped_calculator(&Device::Cpu, dtype, Backend::Fused),
                shipped_calculator(&gpu, dtype, Backend::Fused),
                aspirins(1),
            ),
            (
                "4 aspirins",
                shipped_calculator(&Device::Cpu, dtype, Backend::Fused),
                shipped_calculator(&gpu, dtype, Backend::Fused),
                aspirins(4),
            ),
            (
                "16 aspirins",
                shipped_calculator(&Device::Cpu, dtype, Backend::Fused),
                shipped_calculator(&gpu, dtype, Backend::Fused),
                aspirins(16),
            ),
            (
                "F 32, 2 blocks",
                small(2, dtype, &Device::Cpu),
                small(2, dtype, &gpu),
                feature_split_systems(),
            ),
            (
                "F 32, 1 block",
                small(1, dtype, &Device::Cpu),
                small(1, dtype, &gpu),
                feature_split_systems(),
            ),
        ];
        for (what, cpu_calc, gpu_calc, batch) in cases {
            let (x_cpu, _) = cpu_calc.prepare(&batch).unwrap();
            let (x_gpu, _) = gpu_calc.prepare(&batch).unwrap();
            let fused = gpu_calc.fused().unwrap().clone();
            let cpu_fused = cpu_calc.fused().unwrap();
            let model = fused.shape().unwrap();
            let (n, e) = (
                x_gpu.positions.dim(0).unwrap(),
                x_gpu.centers.dim(0).unwrap(),
            );
            let (eb, limit) = (dtype.size_in_bytes(), 227 * 1024);
            let run = |f: &mlff_distiller::model::FusedPainn,
                       x: &mlff_distiller::model::PainnInputs,
                       plan: &AtomSplitPlan| {
                atom_split(
                    plan,
                    f.packed_weights().unwrap(),
                    f.packed_weights_out_major().unwrap(),
                    &x.positions,
                    &x.offsets,
                    &x.species,
                    &x.centers,
                    &x.neighbors,
                )
                .unwrap()
            };
            let cpu_plan = AtomSplitPlan::new(model, n, e, 1, eb, usize::MAX).unwrap();
            let (e_ref, f_ref) = run(cpu_fused, &x_cpu, &cpu_plan);
            let scale_f = max_abs_tensor(&f_ref).max(1.0);
            let scale_e = max_abs_tensor(&e_ref).max(1.0);
            // Up to the kernel's most atoms per block (a last block with fewer), within the
            // H100's shared memory; own edges listed once per call, and (fewest listed at once)
            // again in every pass.
            let per_blocks = [1, ATOM_SPLIT_MAX_ATOMS_PER_BLOCK];
            let choices = per_blocks
                .into_iter()
                .flat_map(|k| [(k, None), (k, Some(512))]);
            let mut ran = Vec::new();
            for (per_block, own_edges) in choices {
                let plan = AtomSplitPlan::new(model, n, e, per_block, eb, limit)
                    .and_then(|p| match own_edges {
                        Some(k) => p.with_own_edges(k, limit),
                        None => Ok(p),
                    })
                    .and_then(|p| p.fits_device(&gpu).map(|_| p));
                let Ok(plan) = plan else { continue };
                for call in 0..3 {
                    let (en, fo) = run(&fused, &x_gpu, &plan);
                    let (de, df) = (max_abs_diff(&en, &e_ref), max_abs_diff(&fo, &f_ref));
                    println!(
                        "{what} {dtype:?} {per_block} atoms per block, own edges {own_edges:?}, \
                         stage {} values, tape shared {}, \
                         call {call}: {e} edges, ΔE {de:.2e} ΔF {df:.2e} of {scale_f:.2}",
                        plan.stage_values(),
                        plan.tape_in_shared_memory()
                    );
                    assert!(de <= tol * scale_e, "{what} {dtype:?} {per_block}: ΔE {de}");
                    assert!(df <= tol * scale_f, "{what} {dtype:?} {per_block}: ΔF {df}");
                }
                ran.push(per_block);
            }
            // Every model and real ran at one and two atoms per block wherever the blocks fit
            // at once (132 multiprocessors on the H100 and H200 these run on).
            let expected: Vec<usize> = per_blocks
                .into_iter()
                .filter(|&k| k <= n && n.div_ceil(k) <= 132)
                .collect();
            for want in expected {
                assert!(
                    ran.contains(&want),
                    "{what} {dtype:?}: {want:?} did not run"
                );
            }
            // The model takes it where allowed and it fits (up to two atoms per
            // multiprocessor), with the separate kernels' forces.
            let atom_split_of = |f: &mlff_distiller::model::FusedPainn| {
                matches!(f.plan(&x_gpu).unwrap(), Plan::AtomSplit(_))
            };
            let chosen = fused.clone().with_tuning(Tuning {
                atom_split_min_atoms: 0,
                atom_split_max_atoms: None,
                ..Tuning::default()
            });
            let fits = atom_split_of(&chosen);
            let on_cuda_cores = n <= 2 * 132;
            assert!(
                fits == on_cuda_cores || dtype == DType::F64,
                "{what} {dtype:?}: atom split {fits}"
            );
            let (en, fo) = chosen.energies_and_forces(&x_gpu).unwrap();
            let (e_sep, f_sep) = fused.by_layers(&x_gpu).unwrap();
            let (de, df) = (max_abs_diff(&en, &e_sep), max_abs_diff(&fo, &f_sep));
            println!("{what} {dtype:?} model (atom split {fits}): ΔE {de:.2e} ΔF {df:.2e}");
            // By default it takes the systems of the tuning's atom_split_min_atoms and more.
            let by_default = atom_split_of(&fused);
            assert_eq!(
                by_default,
                fits && n >= Tuning::default().atom_split_min_atoms,
                "{what} {dtype:?}"
            );
            assert!(
                de <= tol * scale_e && df <= tol * scale_f,
                "{what} {dtype:?}"
            );
        }
    }
}
