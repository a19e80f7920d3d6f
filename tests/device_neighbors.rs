//! The device neighbour list (`DeviceListBuilder`: padded slots, an overflow flag) through its
//! CPU twin, against the host cell list: molecules, cubic and triclinic boxes, a slab, atoms
//! outside the cell; padding, overflow, refusals. tests/gpu/ runs the same checks on CUDA.

mod common;

use candle_core::{DType, Device, Tensor};
use common::device_list::{check_against_host, check_binned, scattered};
use common::{random_box, random_molecule};
use mlff_distiller::neighbors::DeviceListBuilder;
use mlff_distiller::systems::{aspirin, water_box};

#[test]
fn molecules_match_the_host_list() {
    let cpu = Device::Cpu;
    for (s, cutoff) in [
        (aspirin(), 5.0),
        (aspirin(), 6.0),
        (random_molecule(40, 3), 4.5),
    ] {
        let (_, st) = check_against_host(&s, cutoff, 4096, &cpu);
        assert!(st.edges > 0 && !st.overflowed);
    }
}

#[test]
fn boxes_match_the_host_list_wrapped() {
    let cpu = Device::Cpu;
    let mut slab = random_box(120, 0.25, 5);
    slab.pbc = [true, true, false];
    for (s, cutoff) in [
        (water_box(64, 1), 6.0),
        (scattered(&water_box(64, 2)), 5.0),
        (random_box(150, 0.3, 4), 4.0),
        (scattered(&random_box(150, 0.3, 6)), 4.0),
        (scattered(&slab), 4.0),
    ] {
        let (_, st) = check_against_host(&s, cutoff, 20_000, &cpu);
        assert!(
            st.edges > 10 * s.len(),
            "{} edges for {} atoms",
            st.edges,
            s.len()
        );
    }
}

#[test]
fn exact_fit_padding_and_overflow() {
    let cpu = Device::Cpu;
    let s = water_box(27, 3);
    let (_, st) = check_against_host(&s, 4.0, 1, &cpu);
    assert!(st.overflowed && st.edges > 1);
    let (_, exact) = check_against_host(&s, 4.0, st.edges, &cpu);
    assert!(!exact.overflowed);
    let (_, padded) = check_against_host(&s, 4.0, st.edges + 101, &cpu);
    assert_eq!(padded.edges, st.edges);
    let (_, none) = check_against_host(&s, 4.0, st.edges - 1, &cpu);
    assert!(none.overflowed);
}

#[test]
fn f32_offsets_are_the_f64_ones_rounded() {
    let cpu = Device::Cpu;
    let s = scattered(&water_box(64, 7));
    let b = DeviceListBuilder::new(5.0, s.cell.as_ref(), s.pbc, &cpu).unwrap();
    let flat: Vec<f64> = s.positions.iter().flatten().copied().collect();
    let x = b
        .wrap(&Tensor::from_vec(flat, (s.len(), 3), &cpu).unwrap())
        .unwrap();
    let a = b.build(&x, 30_000, DType::F64).unwrap();
    let f = b.build(&x, 30_000, DType::F32).unwrap();
    assert_eq!(f.offsets.dtype(), DType::F32);
    let want: Vec<f32> = a
        .offsets
        .flatten_all()
        .unwrap()
        .to_vec1::<f64>()
        .unwrap()
        .iter()
        .map(|&v| v as f32)
        .collect();
    assert_eq!(
        f.offsets.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        want
    );
    assert_eq!(
        f.centers.to_vec1::<u32>().unwrap(),
        a.centers.to_vec1::<u32>().unwrap()
    );
}

#[test]
fn refusals_name_the_cause() {
    let cpu = Device::Cpu;
    let s = water_box(64, 1);
    let side = s.cell.unwrap()[0][0];
    let err = DeviceListBuilder::new(0.5 * side, s.cell.as_ref(), s.pbc, &cpu).unwrap_err();
    assert!(err.to_string().contains("twice the cutoff"), "{err}");
    // Only periodic axes count: the same cell as a molecule's is fine.
    assert!(DeviceListBuilder::new(0.5 * side, s.cell.as_ref(), [false; 3], &cpu).is_ok());
    let err = DeviceListBuilder::new(f64::NAN, None, [false; 3], &cpu).unwrap_err();
    assert!(err.to_string().contains("cutoff"), "{err}");
    let b = DeviceListBuilder::new(5.0, None, [false; 3], &cpu).unwrap();
    let f32_positions = Tensor::zeros((3, 3), DType::F32, &cpu).unwrap();
    let err = b.build(&f32_positions, 10, DType::F32).unwrap_err();
    assert!(err.to_string().contains("[N, 3] f64"), "{err}");
    let x = Tensor::zeros((3, 3), DType::F64, &cpu).unwrap();
    let err = b.build(&x, 10, DType::U32).unwrap_err();
    assert!(err.to_string().contains("f32 or f64"), "{err}");
}

#[test]
fn zero_atoms_and_zero_capacity() {
    let cpu = Device::Cpu;
    let b = DeviceListBuilder::new(5.0, None, [false; 3], &cpu).unwrap();
    let empty = b
        .build(
            &Tensor::zeros((0, 3), DType::F64, &cpu).unwrap(),
            8,
            DType::F32,
        )
        .unwrap();
    assert_eq!(empty.capacity(), 8);
    assert_eq!(empty.status().unwrap().edges, 0);
    let (_, st) = check_against_host(&aspirin(), 5.0, 0, &cpu);
    assert!(st.overflowed);
}

/// Pruning a list built with cutoff + skin, after the atoms moved (less than half the skin),
/// leaves the pairs within the cutoff (1 + margin): the host list of the moved positions.
#[test]
fn pruning_keeps_the_pairs_within_the_cutoff() {
    use mlff_distiller::neighbors::{image_offset, neighbor_list, PRUNE_MARGIN};
    use rand::{Rng, SeedableRng};
    let cpu = Device::Cpu;
    let (cutoff, skin) = (4.0, 1.0);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    for s in [
        water_box(64, 4),
        scattered(&random_box(150, 0.3, 6)),
        random_molecule(40, 2),
    ] {
        let b = DeviceListBuilder::new(cutoff + skin, s.cell.as_ref(), s.pbc, &cpu).unwrap();
        let flat: Vec<f64> = s.positions.iter().flatten().copied().collect();
        let x = b
            .wrap(&Tensor::from_vec(flat, (s.len(), 3), &cpu).unwrap())
            .unwrap();
        let list = b.build(&x, 40_000, DType::F64).unwrap();
        let edges = list.status().unwrap().edges;
        let moved: Vec<[f64; 3]> = (x.to_vec2::<f64>().unwrap().iter())
            .map(|p| std::array::from_fn(|d| p[d] + rng.random_range(-0.28..0.28)))
            .collect();
        let flat: Vec<f64> = moved.iter().flatten().copied().collect();
        let xm = Tensor::from_vec(flat, (s.len(), 3), &cpu).unwrap();
        let (c, n, o) = b.prune(&xm, &list, edges, cutoff).unwrap();
        let margin = cutoff * (1.0 + PRUNE_MARGIN);
        let want = neighbor_list(&moved, s.cell.as_ref(), s.pbc, margin).unwrap();
        assert!(want.len() < edges, "{} of {edges}", want.len());
        assert_eq!(c.to_vec1::<u32>().unwrap(), want.centers);
        assert_eq!(n.to_vec1::<u32>().unwrap(), want.neighbors);
        let offsets: Vec<Vec<f64>> = o.to_vec2().unwrap();
        for (k, &sh) in want.shifts.iter().enumerate() {
            let img = image_offset(sh, s.cell.as_ref());
            assert_eq!(offsets[k].as_slice(), img.as_slice(), "offset {k}");
        }
    }
}

#[test]
fn a_batch_of_overlapping_systems_pairs_atoms_only_within_each() {
    let systems = [
        aspirin(),
        random_molecule(30, 8),
        aspirin(),
        random_molecule(12, 9),
    ];
    let edges = common::device_list::check_systems_against_host(&systems, 5.0, &Device::Cpu);
    assert!(edges > 0);
}

/// Binned builds (atoms sorted into bins one cutoff wide, candidates from the adjacent bins)
/// list exactly what testing all pairs lists: periodic boxes of two bins an axis (where the
/// bins either side are one) and of several, triclinic, a slab and molecules (bins over the
/// atoms' range), atoms outside the cell, a sparse box whose bins are capped, overflow.
#[test]
fn binned_builds_list_what_all_pairs_list() {
    let cpu = Device::Cpu;
    let mut slab = random_box(200, 0.25, 5);
    slab.pbc = [true, true, false];
    let mut sparse = random_molecule(30, 7);
    for (i, x) in sparse
        .positions
        .iter_mut()
        .enumerate()
        .filter(|(i, _)| i % 5 == 0)
    {
        x[i % 3] += 40.0 * i as f64;
    }
    let mut bare = water_box(125, 3);
    bare.cell = None;
    bare.pbc = [false; 3];
    let cases = [
        (water_box(64, 1), 6.0, [2, 2, 2]),
        (scattered(&water_box(343, 2)), 5.0, [4, 4, 4]),
        (scattered(&random_box(300, 0.3, 6)), 4.0, [3, 3, 3]),
        (scattered(&slab), 4.0, [3, 3, 3]),
        (aspirin(), 3.0, [2, 2, 1]),
        (bare, 5.0, [2, 2, 2]),
        // Bins over ~1,100 Å along each axis, capped at 2 n in all.
        (sparse, 5.0, [4, 4, 3]),
    ];
    for (s, cutoff, want) in &cases {
        let (shape, edges) = check_binned(s, *cutoff, 30_000, &cpu);
        let bins: usize = shape.iter().product();
        assert!(bins <= 2 * s.len(), "{shape:?} bins for {} atoms", s.len());
        assert_eq!(&shape, want, "{} atoms", s.len());
        assert!(edges > 0);
        check_binned(s, *cutoff, edges - 1, &cpu);
    }
}

/// `binned_from` bins the builds of a periodic cell from the given atom count, and the list is
/// the host cell list's.
#[test]
fn builders_bin_periodic_cells_from_a_size() {
    let cpu = Device::Cpu;
    let s = water_box(343, 4);
    let b = DeviceListBuilder::new(6.0, s.cell.as_ref(), s.pbc, &cpu).unwrap();
    let flat: Vec<f64> = s.positions.iter().flatten().copied().collect();
    let x = b
        .wrap(&Tensor::from_vec(flat, (s.len(), 3), &cpu).unwrap())
        .unwrap();
    let pairs = b.build(&x, 80_000, DType::F64).unwrap();
    let binned = b.clone().binned_from(s.len(), s.len()).unwrap();
    let list = binned.build(&x, 80_000, DType::F64).unwrap();
    assert_eq!(
        list.neighbors.to_vec1::<u32>().unwrap(),
        pairs.neighbors.to_vec1::<u32>().unwrap()
    );
    assert_eq!(list.status().unwrap(), pairs.status().unwrap());
    // A molecule is never binned this way: it has no cell to take the bins from.
    let m = aspirin();
    let b = DeviceListBuilder::new(5.0, None, [false; 3], &cpu).unwrap();
    assert!(b.binned_from(m.len(), 1).is_ok());
}
