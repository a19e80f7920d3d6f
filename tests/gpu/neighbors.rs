//! The device neighbour list on CUDA against the host cell list and its CPU twin: building
//! and pruning.

use crate::common;
use crate::common::*;
use crate::cuda;
use candle_core::{DType, Device, Tensor};
use mlff_distiller::systems::{aspirin, water_box};

/// The device neighbour list built by kernels/neighbors.cu against the host cell list, edge
/// for edge (and its CPU twin, in f32 too): molecules, a 5,001-atom water box with MD's list
/// cutoff (model cutoff + 1 Å skin), a triclinic box and a slab with atoms outside the cell;
/// padding, an exact fit and overflow.
#[test]
fn cuda_device_list_matches_host_list() {
    use common::device_list::check_against_host;
    use mlff_distiller::neighbors::DeviceListBuilder;
    let dev = cuda();
    use common::device_list::scattered;
    let mut slab = random_box(300, 0.25, 5);
    slab.pbc = [true, true, false];
    let cases = [
        (aspirin(), 5.0, 600),
        (random_molecule(64, 2), 6.0, 4096),
        (water_box(1667, 1), 6.0, 600_000),
        (scattered(&random_box(300, 0.3, 6)), 4.0, 40_000),
        (scattered(&slab), 4.0, 40_000),
    ];
    for (s, cutoff, capacity) in &cases {
        let (list, st) = check_against_host(s, *cutoff, *capacity, &dev);
        assert!(st.edges > 0 && !st.overflowed, "{} atoms: {st:?}", s.len());
        let (_, exact) = check_against_host(s, *cutoff, st.edges, &dev);
        assert!(!exact.overflowed);
        let (_, over) = check_against_host(s, *cutoff, st.edges - 1, &dev);
        assert!(over.overflowed);
        // The CPU twin gives the same slots; f32 offsets are the f64 ones rounded.
        let (twin, _) = check_against_host(s, *cutoff, *capacity, &Device::Cpu);
        let cpu_centers: Vec<u32> = twin.centers.to_vec1().unwrap();
        assert_eq!(list.centers.to_vec1::<u32>().unwrap(), cpu_centers);
        let b = DeviceListBuilder::new(*cutoff, s.cell.as_ref(), s.pbc, &dev).unwrap();
        let flat: Vec<f64> = s.positions.iter().flatten().copied().collect();
        let x = b
            .wrap(&Tensor::from_vec(flat, (s.len(), 3), &dev).unwrap())
            .unwrap();
        let f32_list = b.build(&x, *capacity, DType::F32).unwrap();
        let want: Vec<f32> = (list
            .offsets
            .flatten_all()
            .unwrap()
            .to_vec1::<f64>()
            .unwrap())
        .iter()
        .map(|&v| v as f32)
        .collect();
        assert_eq!(
            f32_list
                .offsets
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap(),
            want
        );
    }
}

/// Pruning a device list to a smaller cutoff after the atoms moved: CUDA equals the CPU twin
/// (f32 and f64 offsets), a 5,001-atom water box and a molecule.
#[test]
fn cuda_prune_matches_cpu_twin() {
    use mlff_distiller::neighbors::DeviceListBuilder;
    let dev = cuda();
    for s in [water_box(1667, 2), random_molecule(64, 3)] {
        // Every atom moved by up to 0.2 Å along each axis.
        let shift: Vec<f64> = (0..3 * s.len())
            .map(|k| 0.4 * ((k * 7 % 11) as f64 / 11.0 - 0.5))
            .collect();
        let flat: Vec<f64> = s.positions.iter().flatten().copied().collect();
        for dtype in [DType::F32, DType::F64] {
            let pruned = |d: &Device| {
                let b = DeviceListBuilder::new(6.0, s.cell.as_ref(), s.pbc, d).unwrap();
                let x = Tensor::from_vec(flat.clone(), (s.len(), 3), d).unwrap();
                let x = b.wrap(&x).unwrap();
                let list = b.build(&x, 600_000, dtype).unwrap();
                let edges = list.status().unwrap().edges;
                let moved =
                    (&x + Tensor::from_vec(shift.clone(), (s.len(), 3), d).unwrap()).unwrap();
                let (c, n, o) = b.prune(&moved, &list, edges, 5.0).unwrap();
                let o = o.to_dtype(DType::F64).unwrap().flatten_all().unwrap();
                let c: Vec<u32> = c.to_vec1().unwrap();
                let n: Vec<u32> = n.to_vec1().unwrap();
                (c, n, o.to_vec1::<f64>().unwrap(), edges)
            };
            let (gc, gn, go, ge) = pruned(&dev);
            let (cc, cn, co, ce) = pruned(&Device::Cpu);
            assert_eq!(ge, ce);
            assert!(gc.len() < ge && !gc.is_empty(), "{} of {ge}", gc.len());
            assert_eq!((gc, gn), (cc, cn), "{} atoms {dtype:?}", s.len());
            assert_eq!(go, co);
        }
    }
}

/// Binned builds on CUDA (bins, atomic placement, the adjacent bins' candidates, each atom's
/// neighbours put in order) list exactly what all pairs list, slot for slot, and what the CPU
/// twin's binned build lists: a 30,000-atom water box (14 bins an axis), two bins an axis,
/// triclinic, a slab and a bare box (bins over the atoms' range), overflow.
#[test]
fn cuda_binned_list_matches_all_pairs_and_cpu() {
    use common::device_list::{check_binned, scattered};
    let dev = cuda();
    let mut slab = random_box(2000, 0.25, 5);
    slab.pbc = [true, true, false];
    let mut bare = water_box(1000, 3);
    bare.cell = None;
    bare.pbc = [false; 3];
    let cases = [
        (water_box(10_000, 1), 6.0, 3_000_000),
        (water_box(64, 1), 6.0, 20_000),
        (scattered(&random_box(3000, 0.3, 6)), 4.0, 200_000),
        (scattered(&slab), 4.0, 200_000),
        (bare, 5.0, 200_000),
    ];
    for (s, cutoff, capacity) in &cases {
        let (shape, edges) = check_binned(s, *cutoff, *capacity, &dev);
        assert!(edges > 0 && edges <= *capacity, "{shape:?}: {edges} edges");
        check_binned(s, *cutoff, edges - 1, &dev);
        if s.len() <= 3000 {
            assert_eq!(
                check_binned(s, *cutoff, *capacity, &Device::Cpu),
                (shape, edges)
            );
        }
    }
}
