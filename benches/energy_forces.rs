//! CPU hot paths: neighbour list, energy, energy+forces (`cargo bench`).

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

criterion_group! {
    name = cpu;
    config = Criterion::default().sample_size(10);
    targets = benches
}
criterion_main!(cpu);
