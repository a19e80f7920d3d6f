//! The device neighbour list against the host cell list on the same (wrapped) positions.
#![allow(dead_code)]

use candle_core::{DType, Device, Tensor};
use mlff_distiller::neighbors::{
    image_offset, neighbor_list, wrap_positions, DeviceListBuilder, ListStatus, PaddedList,
};
use mlff_distiller::Structure;

/// Builds `s`'s list on `dev` with `capacity` slots (f64 offsets) and checks it against the
/// host cell list edge for edge: centers, neighbours, offsets (exactly), then the padding.
/// Also checks the device's wrapped positions against the host's `wrap_positions`. Returns
/// the list and what its status said.
pub fn check_against_host(
    s: &Structure,
    cutoff: f64,
    capacity: usize,
    dev: &Device,
) -> (PaddedList, ListStatus) {
    let b = DeviceListBuilder::new(cutoff, s.cell.as_ref(), s.pbc, dev).unwrap();
    let flat: Vec<f64> = s.positions.iter().flatten().copied().collect();
    let x = Tensor::from_vec(flat, (s.len(), 3), dev).unwrap();
    let wrapped = b.wrap(&x).unwrap();
    let mut host = s.positions.clone();
    wrap_positions(&mut host, s.cell.as_ref(), s.pbc).unwrap();
    let got: Vec<Vec<f64>> = wrapped.to_vec2().unwrap();
    for (i, (g, h)) in got.iter().zip(&host).enumerate() {
        assert_eq!(g.as_slice(), h.as_slice(), "wrapped atom {i}");
    }
    let list = b.build(&wrapped, capacity, DType::F64).unwrap();
    let status = list.status().unwrap();
    let nl = neighbor_list(&host, s.cell.as_ref(), s.pbc, cutoff).unwrap();
    assert_eq!(status.edges, nl.len(), "edges found");
    assert_eq!(status.overflowed, nl.len() > capacity, "overflow flag");
    let centers: Vec<u32> = list.centers.to_vec1().unwrap();
    let neighbors: Vec<u32> = list.neighbors.to_vec1().unwrap();
    let offsets: Vec<Vec<f64>> = list.offsets.to_vec2().unwrap();
    assert_eq!(centers.len(), capacity);
    let listed = if status.overflowed { 0 } else { nl.len() };
    for k in 0..listed {
        assert_eq!(
            (centers[k], neighbors[k]),
            (nl.centers[k], nl.neighbors[k]),
            "edge {k}"
        );
        let o = image_offset(nl.shifts[k], s.cell.as_ref());
        assert_eq!(offsets[k].as_slice(), o.as_slice(), "offset of edge {k}");
    }
    for k in listed..capacity {
        let a = ((k - listed) % s.len()) as u32;
        assert_eq!((centers[k], neighbors[k]), (a, a), "padding slot {k}");
        assert_eq!(
            offsets[k],
            vec![b.pad_distance(), 0.0, 0.0],
            "padding offset {k}"
        );
    }
    (list, status)
}

/// `s` with every atom moved by a different whole number of cell vectors (some far outside).
pub fn scattered(s: &Structure) -> Structure {
    let c = s.cell.expect("a periodic structure");
    let mut out = s.clone();
    for (i, x) in out.positions.iter_mut().enumerate() {
        let m = [
            (i % 5) as f64 - 2.0,
            (i % 3) as f64 - 1.0,
            (i % 7) as f64 - 3.0,
        ];
        for (k, mk) in m.iter().enumerate() {
            if s.pbc[k] {
                x.iter_mut().zip(&c[k]).for_each(|(xd, cd)| *xd += mk * cd);
            }
        }
    }
    out
}

/// Builds one list for `systems` (overlapping in space, as replicas do) with each atom's
/// candidates limited to its own system, and checks it edge for edge against the host lists
/// of the systems one by one, concatenated. Returns the edge count.
pub fn check_systems_against_host(systems: &[Structure], cutoff: f64, dev: &Device) -> usize {
    let s0 = &systems[0];
    let b = DeviceListBuilder::new(cutoff, s0.cell.as_ref(), s0.pbc, dev).unwrap();
    let mut starts = vec![0];
    let mut flat = Vec::new();
    let mut spans = Vec::new();
    for s in systems {
        let (a, z) = (starts[starts.len() - 1], starts[starts.len() - 1] + s.len());
        flat.extend(s.positions.iter().flatten().copied());
        spans.extend((a..z).flat_map(|_| [a as u32, z as u32]));
        starts.push(z);
    }
    let n = starts[systems.len()];
    let x = Tensor::from_vec(flat, (n, 3), dev).unwrap();
    let spans = Tensor::from_vec(spans, (n, 2), dev).unwrap();
    let list = b
        .build_systems(&x, Some(&spans), 100_000, DType::F64)
        .unwrap();
    let status = list.status().unwrap();
    let lists: Vec<_> = systems
        .iter()
        .map(|s| neighbor_list(&s.positions, s.cell.as_ref(), s.pbc, cutoff).unwrap())
        .collect();
    let nl = mlff_distiller::neighbors::NeighborList::concat(lists.iter(), &starts);
    assert_eq!(status.edges, nl.len(), "edges found");
    let centers: Vec<u32> = list
        .centers
        .narrow(0, 0, nl.len())
        .unwrap()
        .to_vec1()
        .unwrap();
    let neighbors: Vec<u32> = list
        .neighbors
        .narrow(0, 0, nl.len())
        .unwrap()
        .to_vec1()
        .unwrap();
    assert_eq!(centers, nl.centers);
    assert_eq!(neighbors, nl.neighbors);
    nl.len()
}

/// Builds `s`'s list on `dev` binned (bins from the host positions, unwrapped) and testing all
/// pairs, and checks the two slot for slot: centers, neighbours, offsets (f64, exactly) and
/// status. Returns the bins per axis and the edge count.
pub fn check_binned(
    s: &Structure,
    cutoff: f64,
    capacity: usize,
    dev: &Device,
) -> ([usize; 3], usize) {
    let b = DeviceListBuilder::new(cutoff, s.cell.as_ref(), s.pbc, dev).unwrap();
    let flat: Vec<f64> = s.positions.iter().flatten().copied().collect();
    let x = Tensor::from_vec(flat, (s.len(), 3), dev).unwrap();
    let grid = b.bin_grid(s.len(), Some(&s.positions)).unwrap();
    let binned = b.build_binned(&x, &grid, capacity, DType::F64).unwrap();
    let pairs = b.build(&x, capacity, DType::F64).unwrap();
    let st = pairs.status().unwrap();
    assert_eq!(
        binned.status().unwrap(),
        st,
        "status, bins {:?}",
        grid.shape()
    );
    let u32s = |t: &Tensor| t.to_vec1::<u32>().unwrap();
    assert_eq!(u32s(&binned.centers), u32s(&pairs.centers), "centers");
    assert_eq!(
        u32s(&binned.neighbors),
        u32s(&pairs.neighbors),
        "neighbours"
    );
    let f64s = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f64>().unwrap();
    assert_eq!(f64s(&binned.offsets), f64s(&pairs.offsets), "offsets");
    (grid.shape(), st.edges)
}
