//! The CPU side of CUDA graphs: the padded edge lists a captured graph runs on change no
//! energy or force, on every code path (the graphs themselves are tested in gpu_graphs.rs).

mod common;

use candle_core::{DType, Device};
use common::*;
use mlff_distiller::calculator::edge_offsets;
use mlff_distiller::graph::{edge_capacity, pad_edges, GraphCalculator, Graphs, HostEdges};
use mlff_distiller::model::Backend;
use mlff_distiller::model::PainnInputs;
use mlff_distiller::neighbors::batch_neighbor_list;
use mlff_distiller::systems::{aspirin, water_box};
use mlff_distiller::{Batch, Calculator};

#[test]
fn padded_edge_lists_change_no_energy_or_force() {
    let dev = Device::Cpu;
    let batch = Batch::new(vec![aspirin(), water_box(8, 1), random_molecule(5, 3)]).unwrap();
    for ops in [Backend::Fused, Backend::Autograd] {
        let calc = calculator(DType::F64, &dev).with_backend(ops);
        let cutoff = calc.model().config().cutoff;
        let nl = batch_neighbor_list(&batch, cutoff).unwrap();
        let (inputs, positions) = calc.prepare_with(&batch, &nl).unwrap();
        let plain = calc.compute_device(&inputs, &positions).unwrap();
        let offsets = edge_offsets(&batch, &nl);
        let edges = HostEdges {
            centers: &nl.centers,
            neighbors: &nl.neighbors,
            offsets: &offsets,
        };
        let capacity = edge_capacity(nl.len()) + 37;
        let padded = pad_edges(edges, batch.n_atoms(), capacity, cutoff).unwrap();
        assert_eq!(padded.centers.len(), capacity);
        let x = PainnInputs {
            centers: candle_core::Tensor::new(padded.centers, &dev).unwrap(),
            neighbors: candle_core::Tensor::new(padded.neighbors, &dev).unwrap(),
            offsets: candle_core::Tensor::from_vec(padded.offsets, (capacity, 3), &dev).unwrap(),
            ..inputs
        };
        let out = calc.compute_device(&x, &positions).unwrap();
        let de = max_abs_diff(&out.energies, &plain.energies);
        let df = max_abs_diff(&out.forces, &plain.forces);
        assert!(de < 1e-12 && df < 1e-12, "{ops:?}: dE {de}, dF {df}");
        assert!(
            max_abs_tensor(&plain.forces) > 1e-3,
            "{ops:?}: no forces to compare"
        );
    }
}

#[test]
fn graphs_are_refused_where_they_cannot_run() {
    let calc = calculator(DType::F32, &Device::Cpu).with_backend(Backend::Fused);
    assert!(!Graphs::Auto.wanted(&calc).unwrap());
    assert!(!Graphs::Off.wanted(&calc).unwrap());
    let msg = Graphs::On.wanted(&calc).unwrap_err().to_string();
    assert!(msg.contains("--graphs on"), "{msg}");
    assert!("sometimes".parse::<Graphs>().is_err());
}

#[test]
fn the_graph_calculator_runs_op_by_op_where_graphs_cannot_run() {
    let calc = calculator(DType::F64, &Device::Cpu).with_backend(Backend::Fused);
    let batch = Batch::new(vec![aspirin(), random_molecule(5, 3)]).unwrap();
    let graphs = GraphCalculator::new(&calc, Graphs::Auto).unwrap();
    for _ in 0..3 {
        assert_eq!(
            graphs.compute(&batch).unwrap(),
            calc.compute(&batch).unwrap()
        );
    }
    let stats = graphs.stats();
    assert_eq!((stats.eager, stats.captures, stats.replays), (3, 0, 0));
    assert!(graphs.cached_shapes().is_empty() && graphs.failure().is_none());
    let msg = GraphCalculator::new(&calc, Graphs::On)
        .err()
        .unwrap()
        .to_string();
    assert!(msg.contains("--graphs on"), "{msg}");
}
