//! MD on the device against the CPU: the device-resident loop, the integrator's kernels, the
//! MD step as one launch and MD with single-launch steps.

use crate::common::*;
use crate::{cuda, shipped_calculator};
use candle_core::{DType, Device, Tensor};
use mlff_distiller::model::Backend;
use mlff_distiller::systems::{aspirin, water_box};
use mlff_distiller::{Batch, PainnCalculator};

/// The device-resident MD loop on CUDA follows the CPU trajectory: NVE and Langevin (same host
/// noise stream), f64, a molecule and a periodic water box (wrapping, neighbour rebuilds). On
/// CUDA the list checks are deferred (read back per run of steps), on the CPU checked per step.
#[test]
fn cuda_md_matches_cpu_md() {
    use mlff_distiller::md::{
        host_positions, Ensemble, MdSettings, PainnForces, Simulation, StopReason,
    };
    let gpu = cuda();
    let ensembles = [
        Ensemble::Nve,
        Ensemble::Nvt {
            temperature: 300.0,
            friction: 10.0,
        },
    ];
    for s in [aspirin(), water_box(27, 3)] {
        for ensemble in ensembles {
            let settings = MdSettings {
                steps: 100,
                ensemble,
                skin: 0.2,
                traj_every: 0,
                stop_when_unstable: false,
                ..Default::default()
            };
            let run = |dev: &Device| {
                let calc = calculator(DType::F64, dev);
                let f = PainnForces::new(&calc, &s, settings.skin).unwrap();
                let mut sim =
                    Simulation::new(f, &s, settings.clone(), serde_json::Value::Null).unwrap();
                let summary = sim.run(&mut |_| {}).unwrap();
                assert_eq!(summary.stop, StopReason::Completed);
                (
                    host_positions(&sim.state().positions).unwrap(),
                    sim.records().last().unwrap().e_tot,
                    summary.neighbor_list_builds,
                    summary.deferred_steps,
                )
            };
            let (x_cpu, e_cpu, builds, _) = run(&Device::Cpu);
            let (x_gpu, e_gpu, builds_gpu, deferred) = run(&gpu);
            println!("{} atoms: {builds} builds on the CPU, {builds_gpu} on CUDA, {deferred} steps deferred", s.len());
            assert!(
                deferred > 50,
                "only {deferred} of 100 steps deferred on CUDA"
            );
            let dx = max_force_diff(&x_cpu, &x_gpu);
            let what = format!("{} atoms {}", s.len(), ensemble.name());
            assert!(
                dx < 1e-8,
                "{what}: positions differ by {dx} Å after 100 steps"
            );
            assert!(
                (e_cpu - e_gpu).abs() < 1e-8,
                "{what}: E_tot {e_cpu} vs {e_gpu}"
            );
            assert!(builds > 1, "{what}: the list was never rebuilt");
        }
    }
}

/// The integrator's kernels on CUDA equal their CPU twins bit for bit (kick, NVE and Langevin
/// steps; the check's max), the check's sum to rounding, for a 5,001-atom box's worth of atoms.
#[test]
fn cuda_integrator_kernels_match_cpu() {
    use mlff_distiller::ops::{md_advance, md_displacement2, md_kick, LangevinNoise};
    let dev = cuda();
    let n = 5001;
    let on = |d: &Device, seed: f64, width: usize| {
        let v: Vec<f64> = (0..width * n)
            .map(|k| ((k as f64 + seed) * 0.37).sin() + 0.02)
            .collect();
        Tensor::from_vec(v, (n, width), d).unwrap()
    };
    let run = |d: &Device| {
        let (x, v, f, xi) = (on(d, 1.0, 3), on(d, 2.0, 3), on(d, 3.0, 3), on(d, 4.0, 3));
        let (hk, scale) = (on(d, 5.0, 1).abs().unwrap(), on(d, 6.0, 1).abs().unwrap());
        let noise = LangevinNoise {
            xi: &xi,
            scale: &scale,
            c1: 0.93,
        };
        let (x1, v1) = md_advance(&x, &v, &f, &hk, 0.049, None).unwrap();
        let (x2, v2) = md_advance(&x, &v, &f, &hk, 0.049, Some(noise)).unwrap();
        let k = md_kick(&v, &f, &hk).unwrap();
        let d2 = md_displacement2(&x2, &x).unwrap().to_vec1::<f64>().unwrap();
        let host = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f64>().unwrap();
        ([host(&x1), host(&v1), host(&x2), host(&v2), host(&k)], d2)
    };
    let (gpu, gd) = run(&dev);
    let (cpu, cd) = run(&Device::Cpu);
    for (k, (g, c)) in gpu.iter().zip(&cpu).enumerate() {
        assert_eq!(g, c, "output {k}");
    }
    assert_eq!(gd[1], cd[1], "max");
    assert!(
        (gd[0] - cd[0]).abs() <= 1e-12 * cd[0],
        "sum {} vs {}",
        gd[0],
        cd[0]
    );
}

/// The MD step as one launch (kernels/feature_split.cu with its MD slots) against its CPU twin
/// (the same step op by op: md_advance, the one kernel's CPU twin, md_kick, md_displacement2):
/// f32 and f64, NVE and Langevin, the shipped model on aspirin and the small model on a random
/// molecule. Advanced positions and the largest displacement equal bit for bit; forces,
/// energies and velocities within the one kernel's tolerance; launches interleaved with plain
/// calls (the barrier counters are shared) repeat.
#[test]
fn cuda_one_launch_step_matches_cpu_twin() {
    use mlff_distiller::ops::{feature_split, feature_split_step, LangevinNoise, MdStepInputs};
    let gpu = cuda();
    let asp = Batch::new(vec![aspirin()]).unwrap();
    let mol = Batch::new(vec![random_molecule(30, 4)]).unwrap();
    for dtype in [DType::F32, DType::F64] {
        let tol = if dtype == DType::F32 { 3e-5 } else { 1e-10 };
        let cases = [
            (
                "aspirin",
                shipped_calculator(&Device::Cpu, dtype, Backend::Fused),
                shipped_calculator(&gpu, dtype, Backend::Fused),
                asp.clone(),
            ),
            (
                "small model",
                calculator(dtype, &Device::Cpu).with_backend(Backend::Fused),
                calculator(dtype, &gpu).with_backend(Backend::Fused),
                mol.clone(),
            ),
        ];
        for (what, cpu_calc, gpu_calc, batch) in cases {
            let (x_cpu, _) = cpu_calc.prepare(&batch).unwrap();
            let (x_gpu, _) = gpu_calc.prepare(&batch).unwrap();
            let fused = gpu_calc.fused().unwrap();
            let n = x_gpu.positions.dim(0).unwrap();
            let e = x_gpu.centers.dim(0).unwrap();
            let plan = fused
                .feature_split_plan(n, e, &gpu, dtype)
                .unwrap()
                .expect("one kernel");
            let column = |seed: f64, width: usize, size: f64| -> Vec<f64> {
                (0..width * n)
                    .map(|k| size * ((k as f64 + seed) * 0.37).sin())
                    .collect()
            };
            let x0 = x_cpu.positions.to_dtype(DType::F64).unwrap();
            let x0 = x0.flatten_all().unwrap().to_vec1::<f64>().unwrap();
            let reference: Vec<f64> = (x0.iter().zip(column(7.0, 3, 0.05)))
                .map(|(x, d)| x + d)
                .collect();
            let hk: Vec<f64> = column(5.0, 1, 0.01)
                .iter()
                .map(|h| h.abs() + 0.001)
                .collect();
            let scale: Vec<f64> = column(6.0, 1, 0.02).iter().map(|s| s.abs()).collect();
            let inputs = [
                x0,
                column(1.0, 3, 0.05),
                column(2.0, 3, 1.0),
                column(3.0, 3, 1.0),
            ];
            let step = |dev: &Device,
                        calc: &PainnCalculator,
                        x: &mlff_distiller::model::PainnInputs,
                        langevin: bool| {
                let t = |v: &[f64], w: usize| Tensor::from_slice(v, (n, w), dev).unwrap();
                let [pos, vel, frc, xi] = [0, 1, 2, 3].map(|k| t(&inputs[k], 3));
                let (hk, scale, reference) = (t(&hk, 1), t(&scale, 1), t(&reference, 3));
                let md = MdStepInputs {
                    positions: &pos,
                    velocities: &vel,
                    forces: &frc,
                    half_kick: &hk,
                    dt: 0.049,
                    noise: langevin.then_some(LangevinNoise {
                        xi: &xi,
                        scale: &scale,
                        c1: 0.93,
                    }),
                    reference: &reference,
                };
                let fused = calc.fused().unwrap();
                let index = [&x.species, &x.centers, &x.neighbors];
                let w = fused.packed_weights().unwrap();
                let out = feature_split_step(&plan, w, &x.offsets, index, &md).unwrap();
                let host = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f64>().unwrap();
                [
                    host(&out.positions),
                    host(&out.velocities),
                    host(&out.forces),
                    vec![out.energy.to_scalar::<f64>().unwrap()],
                    host(&out.displacement2),
                ]
            };
            for langevin in [false, true] {
                let label = format!("{what} {dtype:?} langevin {langevin}");
                let want = step(&Device::Cpu, &cpu_calc, &x_cpu, langevin);
                let scale_f = want[2].iter().fold(1.0f64, |m, f| m.max(f.abs()));
                let max_hk = hk.iter().fold(0.0f64, |m, h| m.max(*h));
                let diff = |a: &[f64], b: &[f64]| {
                    a.iter()
                        .zip(b)
                        .fold(0.0f64, |m, (x, y)| m.max((x - y).abs()))
                };
                for call in 0..3 {
                    // A plain call between steps: both share the barrier counters.
                    let w = fused.packed_weights().unwrap();
                    let index = (&x_gpu.species, &x_gpu.centers, &x_gpu.neighbors);
                    feature_split(
                        &plan,
                        w,
                        &x_gpu.positions,
                        &x_gpu.offsets,
                        index.0,
                        index.1,
                        index.2,
                    )
                    .unwrap();
                    let got = step(&gpu, &gpu_calc, &x_gpu, langevin);
                    let (df, dv) = (diff(&got[2], &want[2]), diff(&got[1], &want[1]));
                    let de = (got[3][0] - want[3][0]).abs();
                    println!("{label} call {call}: ΔF {df:.2e} of {scale_f:.2}, Δv {dv:.2e}, ΔE {de:.2e}");
                    assert_eq!(got[0], want[0], "{label}: advanced positions");
                    assert_eq!(got[4][1], want[4][1], "{label}: largest displacement");
                    assert!(
                        (got[4][0] - want[4][0]).abs() <= 1e-12 * want[4][0],
                        "{label}: displacement sum {} vs {}",
                        got[4][0],
                        want[4][0]
                    );
                    assert!(df <= tol * scale_f, "{label}: ΔF {df}");
                    assert!(dv <= tol * scale_f * max_hk * 1.01, "{label}: Δv {dv}");
                    assert!(
                        de <= tol * n as f64 * want[3][0].abs().max(1.0),
                        "{label}: ΔE {de}"
                    );
                }
            }
        }
    }
}

/// MD with single-launch steps (the default on CUDA where the force call is one kernel)
/// follows the op-by-op trajectory: the shipped model on aspirin, NVE and Langevin, a skin
/// small enough that the list is due every ~20 steps, with deferred and with per-step list
/// checks (a step whose list no longer held is thrown away and run op by op); f64 against the
/// CPU, f32 against CUDA op by op.
#[test]
fn cuda_one_launch_md_matches_op_by_op() {
    use mlff_distiller::md::{
        host_positions, Ensemble, MdSettings, PainnForces, Simulation, StopReason,
    };
    let gpu = cuda();
    let s = aspirin();
    for ensemble in [
        Ensemble::Nve,
        Ensemble::Nvt {
            temperature: 300.0,
            friction: 10.0,
        },
    ] {
        let settings = MdSettings {
            steps: 150,
            ensemble,
            skin: 0.1,
            traj_every: 0,
            log_every: 25,
            stop_when_unstable: false,
            ..Default::default()
        };
        for dtype in [DType::F64, DType::F32] {
            let run = |dev: &Device, single: bool, defer: bool| {
                let calc = shipped_calculator(dev, dtype, Backend::Fused);
                let f = PainnForces::new(&calc, &s, settings.skin)
                    .unwrap()
                    .with_one_launch_steps(single)
                    .with_deferred_checks(defer);
                let mut sim =
                    Simulation::new(f, &s, settings.clone(), serde_json::Value::Null).unwrap();
                let summary = sim.run(&mut |_| {}).unwrap();
                assert_eq!(summary.stop, StopReason::Completed);
                let e: Vec<f64> = sim.records().iter().map(|r| r.e_tot).collect();
                (host_positions(&sim.state().positions).unwrap(), e, summary)
            };
            let label = |what: &str| format!("{} {dtype:?} {what}", ensemble.name());
            let (x_ref, e_ref, s_ref) = match dtype {
                DType::F64 => run(&Device::Cpu, false, false),
                _ => run(&gpu, false, true),
            };
            assert_eq!(s_ref.one_launch_steps, 0);
            assert!(s_ref.neighbor_list_builds > 3, "the list is rebuilt");
            let tol = if dtype == DType::F64 { 1e-8 } else { 1e-4 };
            for defer in [true, false] {
                let what = label(if defer { "deferred" } else { "checked" });
                let (x, e, summary) = run(&gpu, true, defer);
                println!(
                    "{what}: {} single-launch steps, {} deferred, {} redone, {} list builds \
                     (reference {})",
                    summary.one_launch_steps,
                    summary.deferred_steps,
                    summary.redone_steps,
                    summary.neighbor_list_builds,
                    s_ref.neighbor_list_builds
                );
                // Checking each step, every step runs as one launch but those whose list was
                // due (thrown away, run op by op with a rebuild); deferred, also those redone.
                let due = summary.neighbor_list_builds as u64 - 1;
                let single = summary.one_launch_steps;
                match defer {
                    true => assert!(single + due >= 150, "{what}: {single} single-launch steps"),
                    false => assert_eq!(single + due, 150, "{what}: {single} single-launch steps"),
                }
                if dtype == DType::F64 {
                    assert_eq!(
                        summary.neighbor_list_builds, s_ref.neighbor_list_builds,
                        "{what}"
                    );
                }
                let dx = max_force_diff(&x, &x_ref);
                assert!(dx < tol, "{what}: positions differ by {dx} Å");
                let de = e
                    .iter()
                    .zip(&e_ref)
                    .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
                assert!(
                    e.len() == e_ref.len() && de < 100.0 * tol,
                    "{what}: E_tot differs by {de}"
                );
            }
        }
    }
}
