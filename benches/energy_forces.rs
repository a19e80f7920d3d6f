//! CPU hot paths: neighbour list, energy, energy+forces, one MD step (`cargo bench`).

use candle_core::{DType, Device};
use candle_nn::VarBuilder;
use criterion::{criterion_group, criterion_main, Criterion};
use mlff_distiller::model::{init_varmap, Painn, PainnConfig};
use mlff_distiller::neighbors::batch_neighbor_list;
use mlff_distiller::systems::{aspirin, water_box};
use mlff_distiller::{Batch, PainnCalculator};

fn default_calculator() -> PainnCalculator {
    let cfg = PainnConfig::default();
    let vm = init_varmap(&cfg, 0, DType::F32, &Device::Cpu).unwrap();
    let model = Painn::new(&cfg, VarBuilder::from_varmap(&vm, DType::F32, &Device::Cpu)).unwrap();
    PainnCalculator::new(model, Device::Cpu, DType::F32)
}

fn benches(c: &mut Criterion) {
    let water = Batch::from_one(water_box(333, 0)).unwrap();
    c.bench_function("neighbor_list/water_999_atoms", |b| {
        b.iter(|| batch_neighbor_list(&water, 5.0).unwrap())
    });
    let calc = default_calculator();
    for (name, batch) in [
        ("aspirin", Batch::from_one(aspirin()).unwrap()),
        ("water_999_atoms", water),
    ] {
        let (inputs, positions) = calc.prepare(&batch).unwrap();
        c.bench_function(&format!("energy/{name}"), |b| {
            b.iter(|| calc.model().energies(&inputs).unwrap())
        });
        c.bench_function(&format!("energy_forces/{name}"), |b| {
            b.iter(|| calc.compute_device(&inputs, &positions).unwrap())
        });
    }
}

/// One velocity-Verlet step of aspirin: forces (Verlet list, usually no rebuild) and the update.
fn md_step(c: &mut Criterion) {
    use mlff_distiller::md::{
        device_positions, masses, Ensemble, ForceProvider, Integrator, PainnForces, State,
    };
    use rand::SeedableRng;
    let calc = default_calculator();
    let s = aspirin();
    let mut forces = PainnForces::new(&calc, &s, 1.0).unwrap();
    let mut positions = device_positions(&s.positions, &Device::Cpu).unwrap();
    let start = forces.evaluate(&mut positions).unwrap();
    let mut state = State {
        velocities: positions.zeros_like().unwrap(),
        positions,
        forces: start.forces,
        energy: start.energy,
        step: 0,
    };
    let m = masses(&s.numbers).unwrap();
    let integrator = Integrator::new(Ensemble::Nve, 0.5, &m, &Device::Cpu).unwrap();
    let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(0);
    c.bench_function("md_step/aspirin_nve", |b| {
        b.iter(|| integrator.step(&mut state, &mut forces, &mut rng).unwrap())
    });
}

criterion_group! {
    name = cpu;
    config = Criterion::default().sample_size(10);
    targets = benches, md_step
}
criterion_main!(cpu);
