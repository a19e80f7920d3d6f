//! Neighbour lists: the cell list against the brute-force oracle on random molecules and
//! (partly) periodic orthorhombic / triclinic cells, tiny cells with many images, atoms outside
//! the cell; the oracle against hand-checkable cases and ASE; batches; Verlet skin logic.

use std::collections::HashSet;

use mlff_distiller::neighbors::{
    batch_neighbor_list, brute_force_neighbor_list, neighbor_list, structure_neighbor_list,
    NeighborList, VerletList,
};
use mlff_distiller::structure::Lattice;
use mlff_distiller::{Batch, Error, Structure};
use proptest::prelude::*;

type Edge = (u32, u32, [i32; 3]);

fn edges(nl: &NeighborList) -> Vec<Edge> {
    assert_eq!(nl.centers.len(), nl.neighbors.len());
    assert_eq!(nl.centers.len(), nl.shifts.len());
    (0..nl.len())
        .map(|e| (nl.centers[e], nl.neighbors[e], nl.shifts[e]))
        .collect()
}

fn from_edges(mut e: Vec<Edge>) -> NeighborList {
    e.sort_unstable();
    NeighborList {
        centers: e.iter().map(|x| x.0).collect(),
        neighbors: e.iter().map(|x| x.1).collect(),
        shifts: e.iter().map(|x| x.2).collect(),
    }
}

fn cross(a: [f64; 3], b: [f64; 3]) -> [f64; 3] {
    [
        a[1] * b[2] - a[2] * b[1],
        a[2] * b[0] - a[0] * b[2],
        a[0] * b[1] - a[1] * b[0],
    ]
}

fn dot(a: [f64; 3], b: [f64; 3]) -> f64 {
    a[0] * b[0] + a[1] * b[1] + a[2] * b[2]
}

/// Perpendicular widths of a full (non-degenerate) cell: V / |b × c| etc.
fn widths(c: &Lattice) -> [f64; 3] {
    let v = dot(c[0], cross(c[1], c[2])).abs();
    [0, 1, 2].map(|k| {
        v / dot(
            cross(c[(k + 1) % 3], c[(k + 2) % 3]),
            cross(c[(k + 1) % 3], c[(k + 2) % 3]),
        )
        .sqrt()
    })
}

/// Fractional coordinates of x in a full cell (Cramer's rule).
fn frac(c: &Lattice, x: [f64; 3]) -> [f64; 3] {
    let v = dot(c[0], cross(c[1], c[2]));
    [0, 1, 2].map(|k| dot(x, cross(c[(k + 1) % 3], c[(k + 2) % 3])) / v)
}

fn to_cart(c: &Lattice, s: [f64; 3]) -> [f64; 3] {
    [0, 1, 2].map(|d| s[0] * c[0][d] + s[1] * c[1][d] + s[2] * c[2][d])
}

/// x_j - x_i + S·cell, written out the same way as the library's canonical vector (cell rows
/// with a zero shift untouched), so that `< cutoff` decisions agree to the last bit.
fn vec_ij(xi: [f64; 3], xj: [f64; 3], s: [i32; 3], c: Option<&Lattice>) -> [f64; 3] {
    let mut v = [xj[0] - xi[0], xj[1] - xi[1], xj[2] - xi[2]];
    for k in 0..3 {
        if s[k] != 0 {
            let c = c.expect("shift without a cell");
            for d in 0..3 {
                v[d] += s[k] as f64 * c[k][d];
            }
        }
    }
    v
}

fn len2(v: [f64; 3]) -> f64 {
    dot(v, v)
}

/// A second, independent oracle written in the test: image box from the test's own widths of
/// the full cell, two cells wider than needed.
fn naive(pos: &[[f64; 3]], cell: Option<&Lattice>, pbc: [bool; 3], cutoff: f64) -> NeighborList {
    let mut r = [0i32; 3];
    if let Some(c) = cell {
        let w = widths(c);
        for k in 0..3 {
            if pbc[k] {
                let s: Vec<f64> = pos.iter().map(|&x| frac(c, x)[k]).collect();
                let spread = s.iter().cloned().fold(f64::MIN, f64::max)
                    - s.iter().cloned().fold(f64::MAX, f64::min);
                r[k] = (cutoff / w[k] + spread).ceil() as i32 + 2;
            }
        }
    }
    let mut e = Vec::new();
    for i in 0..pos.len() {
        for j in 0..pos.len() {
            for a in -r[0]..=r[0] {
                for b in -r[1]..=r[1] {
                    for c2 in -r[2]..=r[2] {
                        let s = [a, b, c2];
                        if (i != j || s != [0, 0, 0])
                            && len2(vec_ij(pos[i], pos[j], s, cell)) < cutoff * cutoff
                        {
                            e.push((i as u32, j as u32, s));
                        }
                    }
                }
            }
        }
    }
    from_edges(e)
}

/// Everything a correct list must satisfy, with the cell list compared to the oracle.
fn check(pos: &[[f64; 3]], cell: Option<&Lattice>, pbc: [bool; 3], cutoff: f64) -> NeighborList {
    let nl = neighbor_list(pos, cell, pbc, cutoff).unwrap();
    let bf = brute_force_neighbor_list(pos, cell, pbc, cutoff).unwrap();
    assert_eq!(nl, bf, "cell list differs from brute force");
    let e = edges(&nl);
    assert!(
        e.windows(2).all(|w| w[0] < w[1]),
        "not sorted or duplicate edges"
    );
    let periodic = if cell.is_some() { pbc } else { [false; 3] };
    for (&(i, j, s), v) in e.iter().zip(nl.vectors(pos, cell)) {
        assert!((i as usize) < pos.len() && (j as usize) < pos.len());
        assert!(i != j || s != [0, 0, 0], "self edge without shift");
        assert!(len2(v) < cutoff * cutoff, "edge {i}->{j} {s:?} too long");
        for k in 0..3 {
            assert!(
                periodic[k] || s[k] == 0,
                "shift {s:?} along non-periodic axis {k}"
            );
        }
    }
    let set: HashSet<Edge> = e.iter().copied().collect();
    for &(i, j, s) in &e {
        assert!(
            set.contains(&(j, i, [-s[0], -s[1], -s[2]])),
            "missing reverse of {i}->{j} {s:?}"
        );
    }
    nl
}

// ---------------------------------------------------------------------------------------------
// Strategies

/// A random cell D·(I + T): row k has length ~len_k along e_k plus off-diagonal parts up to
/// 0.4·len_k, so it is diagonally dominant (condition number below ~10) and triclinic.
fn lattice(triclinic: bool) -> impl Strategy<Value = Lattice> {
    (
        prop::array::uniform3(0.8f64..8.0),
        prop::array::uniform3(prop::array::uniform3(-0.4f64..0.4)),
    )
        .prop_map(move |(len, t)| {
            let mut c = [[0.0; 3]; 3];
            for k in 0..3 {
                for d in 0..3 {
                    let off = if triclinic && d != k { t[k][d] } else { 0.0 };
                    c[k][d] = len[k] * (if d == k { 1.0 } else { off });
                }
            }
            c
        })
}

#[derive(Clone, Debug)]
struct System {
    pos: Vec<[f64; 3]>,
    cell: Option<Lattice>,
    pbc: [bool; 3],
    cutoff: f64,
}

fn molecule() -> impl Strategy<Value = System> {
    (1usize..=60, 0.5f64..8.0)
        .prop_flat_map(|(n, l)| {
            (
                prop::collection::vec(prop::array::uniform3(-l..l), n),
                0.3f64..5.0,
            )
        })
        .prop_map(|(pos, cutoff)| System {
            pos,
            cell: None,
            pbc: [false; 3],
            cutoff,
        })
}

/// Atoms at fractional coordinates in [-1, 2) (many outside the cell), cutoff a multiple of the
/// smallest perpendicular width: up to 3.5 for a few atoms (many images of every atom, self
/// images included), up to 1.3 for up to 30 atoms.
fn periodic(triclinic: bool) -> impl Strategy<Value = System> {
    prop_oneof![(1usize..=4, Just(3.5)), (5usize..=30, Just(1.3))]
        .prop_flat_map(move |(n, fmax)| {
            (
                lattice(triclinic),
                prop::array::uniform3(any::<bool>()),
                prop::collection::vec(prop::array::uniform3(-1.0f64..2.0), n),
                0.2f64..fmax,
            )
        })
        .prop_map(|(cell, pbc, fr, f)| {
            let w = widths(&cell);
            System {
                pos: fr.iter().map(|&s| to_cart(&cell, s)).collect(),
                cell: Some(cell),
                pbc,
                cutoff: f * w[0].min(w[1]).min(w[2]),
            }
        })
}

fn any_system() -> impl Strategy<Value = System> {
    prop_oneof![molecule(), periodic(false), periodic(true)]
}

// ---------------------------------------------------------------------------------------------
// Properties

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn molecules_match_oracles(s in molecule()) {
        let nl = check(&s.pos, None, [false; 3], s.cutoff);
        prop_assert_eq!(&nl, &naive(&s.pos, None, [false; 3], s.cutoff));
        // A cell with pbc all false, or pbc without a cell, is still a molecule.
        let box_ = [[5.0, 0.0, 0.0], [1.0, 4.0, 0.0], [0.0, 2.0, 3.0]];
        prop_assert_eq!(&nl, &neighbor_list(&s.pos, Some(&box_), [false; 3], s.cutoff).unwrap());
        prop_assert_eq!(&nl, &neighbor_list(&s.pos, None, [true; 3], s.cutoff).unwrap());
    }

    #[test]
    fn orthorhombic_cells_match_oracles(s in periodic(false)) {
        let nl = check(&s.pos, s.cell.as_ref(), s.pbc, s.cutoff);
        prop_assert_eq!(&nl, &naive(&s.pos, s.cell.as_ref(), s.pbc, s.cutoff));
    }

    #[test]
    fn triclinic_cells_match_oracles(s in periodic(true)) {
        let nl = check(&s.pos, s.cell.as_ref(), s.pbc, s.cutoff);
        prop_assert_eq!(&nl, &naive(&s.pos, s.cell.as_ref(), s.pbc, s.cutoff));
    }

    /// Moving atom p by whole cell vectors T (periodic axes) changes only the shifts, and
    /// exactly as S -> S + T on edges leaving p and S -> S - T on edges entering p.
    #[test]
    fn shifts_follow_the_positions_as_given(
        s in periodic(true),
        pick in any::<prop::sample::Index>(),
        t in prop::array::uniform3(-3i32..=3),
    ) {
        let cell = s.cell.unwrap();
        let t = [0, 1, 2].map(|k| if s.pbc[k] { t[k] } else { 0 });
        let p = pick.index(s.pos.len()) as u32;
        let mut moved = s.pos.clone();
        let dx = to_cart(&cell, t.map(|x| x as f64));
        for d in 0..3 {
            moved[p as usize][d] += dx[d];
        }
        let before = neighbor_list(&s.pos, Some(&cell), s.pbc, s.cutoff).unwrap();
        let after = neighbor_list(&moved, Some(&cell), s.pbc, s.cutoff).unwrap();
        let expected: Vec<Edge> = edges(&before)
            .into_iter()
            .map(|(i, j, sh)| {
                let sign = (j == p) as i32 - (i == p) as i32;
                (i, j, [0, 1, 2].map(|k| sh[k] - sign * t[k]))
            })
            .collect();
        // (Rounding of the moved position could only flip a pair at |r| == cutoff to ~1e-15.)
        prop_assert_eq!(from_edges(expected), after);
    }

    #[test]
    fn batch_is_per_structure_lists_with_offsets(
        systems in prop::collection::vec(any_system(), 1..5),
        cutoff in 0.5f64..3.0,
    ) {
        let structures: Vec<Structure> = systems
            .iter()
            .map(|s| Structure {
                numbers: vec![1; s.pos.len()],
                positions: s.pos.clone(),
                cell: s.cell,
                pbc: if s.cell.is_some() { s.pbc } else { [false; 3] },
                ..Default::default()
            })
            .collect();
        let batch = Batch::new(structures).unwrap();
        let all = batch_neighbor_list(&batch, cutoff).unwrap();
        let mut expected = NeighborList::default();
        let mut owner = Vec::new();
        let mut vectors = Vec::new();
        for (k, st) in batch.structures.iter().enumerate() {
            let nl = structure_neighbor_list(st, cutoff).unwrap();
            let off = batch.offsets[k] as u32;
            expected.centers.extend(nl.centers.iter().map(|&c| c + off));
            expected.neighbors.extend(nl.neighbors.iter().map(|&c| c + off));
            expected.shifts.extend(&nl.shifts);
            owner.extend(std::iter::repeat_n(k as u32, nl.len()));
            vectors.extend(nl.vectors(&st.positions, st.cell.as_ref()));
        }
        prop_assert_eq!(&all, &expected);
        prop_assert_eq!(all.edge_structures(&batch.offsets), owner);
        prop_assert_eq!(all.batch_vectors(&batch), vectors);
    }

    /// After moves below skin/2 the list built with cutoff + skin holds every pair within the
    /// cutoff, so filtering it gives exactly the fresh list.
    #[test]
    fn verlet_list_covers_sub_threshold_moves(
        s in any_system(),
        skin in 0.1f64..1.0,
        moves in prop::collection::vec((prop::array::uniform3(-1.0f64..1.0), 0.0f64..0.999), 60),
    ) {
        let mut v = VerletList::new(s.cutoff, skin);
        prop_assert!(v.update(&s.pos, s.cell.as_ref(), s.pbc).unwrap());
        prop_assert_eq!(v.list(), &neighbor_list(&s.pos, s.cell.as_ref(), s.pbc, s.cutoff + skin).unwrap());
        let moved: Vec<[f64; 3]> = s
            .pos
            .iter()
            .zip(&moves)
            .map(|(x, (dir, f))| {
                let n = len2(*dir).sqrt().max(1e-12);
                [0, 1, 2].map(|d| x[d] + dir[d] / n * f * 0.5 * skin)
            })
            .collect();
        prop_assert!(!v.needs_rebuild(&moved));
        prop_assert!(!v.update(&moved, s.cell.as_ref(), s.pbc).unwrap());
        prop_assert_eq!(v.rebuilds(), 1);
        let fresh = neighbor_list(&moved, s.cell.as_ref(), s.pbc, s.cutoff).unwrap();
        prop_assert_eq!(v.within_cutoff(&moved, s.cell.as_ref()), fresh);
    }
}

// ---------------------------------------------------------------------------------------------
// Hand-checkable cases

const CUBIC3: Lattice = [[3.0, 0.0, 0.0], [0.0, 3.0, 0.0], [0.0, 0.0, 3.0]];

fn unit_shifts(nl: &NeighborList) -> Vec<[i32; 3]> {
    let mut s = nl.shifts.clone();
    s.sort_unstable();
    s
}

#[test]
fn simple_cubic_one_atom() {
    let pos = [[0.3, -0.2, 1.1]];
    for list in [neighbor_list, brute_force_neighbor_list] {
        // Exactly the 6 faces at 3.0.
        let nl = list(&pos, Some(&CUBIC3), [true; 3], 3.5).unwrap();
        assert_eq!(nl.len(), 6);
        assert!(nl.centers.iter().chain(&nl.neighbors).all(|&i| i == 0));
        let mut want = vec![];
        for k in 0..3 {
            for sign in [-1, 1] {
                let mut s = [0; 3];
                s[k] = sign;
                want.push(s);
            }
        }
        want.sort_unstable();
        assert_eq!(unit_shifts(&nl), want);
        for d in nl.distances(&pos, Some(&CUBIC3)) {
            assert!((d - 3.0).abs() < 1e-12);
        }
        // + 12 edges at 3·√2 = 4.243; then + 8 corners at 3·√3 = 5.196; strict at 3.0.
        assert_eq!(list(&pos, Some(&CUBIC3), [true; 3], 4.3).unwrap().len(), 18);
        assert_eq!(list(&pos, Some(&CUBIC3), [true; 3], 5.5).unwrap().len(), 26);
        assert_eq!(list(&pos, Some(&CUBIC3), [true; 3], 3.0).unwrap().len(), 0);
        assert_eq!(list(&pos, Some(&CUBIC3), [true; 3], 2.9).unwrap().len(), 0);
        // Only the two a-images along a periodic a; a cutoff of 6.5 (> 2 widths) gives 4.
        assert_eq!(
            list(&pos, Some(&CUBIC3), [true, false, false], 3.5)
                .unwrap()
                .len(),
            2
        );
        let chain = list(&pos, Some(&CUBIC3), [true, false, false], 6.5).unwrap();
        assert_eq!(
            unit_shifts(&chain),
            vec![[-2, 0, 0], [-1, 0, 0], [1, 0, 0], [2, 0, 0]]
        );
    }
}

#[test]
fn dimer_molecule() {
    let pos = [[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]];
    for list in [neighbor_list, brute_force_neighbor_list] {
        let nl = list(&pos, None, [false; 3], 1.5).unwrap();
        assert_eq!(edges(&nl), vec![(0, 1, [0; 3]), (1, 0, [0; 3])]);
        assert_eq!(
            nl.vectors(&pos, None),
            vec![[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0]]
        );
        assert!(
            list(&pos, None, [false; 3], 1.0).unwrap().is_empty(),
            "cutoff is strict"
        );
        assert!(list(&pos, None, [false; 3], 0.9).unwrap().is_empty());
        assert!(list(&[], None, [false; 3], 0.9).unwrap().is_empty());
        assert!(list(&[], Some(&CUBIC3), [true; 3], 0.9).unwrap().is_empty());
    }
}

#[test]
fn shifts_refer_to_positions_outside_the_cell() {
    let cell = [[10.0, 0.0, 0.0], [0.0, 10.0, 0.0], [0.0, 0.0, 10.0]];
    for (x1, s) in [(9.5, -1), (19.5, -2), (-0.5, 0), (-10.5, 1)] {
        let pos = [[0.5, 0.0, 0.0], [x1, 0.0, 0.0]];
        let nl = check(&pos, Some(&cell), [true; 3], 1.5);
        assert_eq!(
            edges(&nl),
            vec![(0, 1, [s, 0, 0]), (1, 0, [-s, 0, 0])],
            "x1 = {x1}"
        );
        let v = nl.vectors(&pos, Some(&cell));
        assert!((v[0][0] + 1.0).abs() < 1e-12 && (v[1][0] - 1.0).abs() < 1e-12);
    }
}

/// Atoms 10^5 cells away: shifts need more than 32 bits of packed sort key (wide-key path).
#[test]
fn atoms_very_far_outside_the_cell() {
    let cell = [[3.0, 0.0, 0.0], [0.4, 2.9, 0.0], [0.0, 0.3, 3.2]];
    let pbc = [true, true, false];
    let pos = [[0.1, 0.2, 0.3], [1.7, 1.1, 0.9], [2.2, 2.5, 2.9]];
    let t = [100_000, -70_000, 0];
    let mut far = pos;
    let dx = to_cart(&cell, t.map(|x| x as f64));
    for d in 0..3 {
        far[1][d] += dx[d];
    }
    let near = check(&pos, Some(&cell), pbc, 4.0);
    let got = neighbor_list(&far, Some(&cell), pbc, 4.0).unwrap();
    let want: Vec<Edge> = edges(&near)
        .into_iter()
        .map(|(i, j, s)| {
            let sign = (j == 1) as i32 - (i == 1) as i32;
            (i, j, [0, 1, 2].map(|k| s[k] - sign * t[k]))
        })
        .collect();
    assert_eq!(got, from_edges(want));
    let m = message(neighbor_list(&[[1e7, 0.0, 0.0]], Some(&cell), pbc, 4.0));
    assert!(
        m.contains("atom 0") && m.contains("outside the cell"),
        "{m}"
    );
}

#[test]
fn slab_with_zero_c_vector() {
    // pbc T T F with c = 0 (as some files write slabs): the c row is not needed.
    let cell = [
        [2.5, 0.0, 0.0],
        [1.25, 2.1650635094610964, 0.0],
        [0.0, 0.0, 0.0],
    ];
    let pos = [
        [0.0, 0.0, 0.0],
        [1.25, 0.7216878364870322, 2.04],
        [0.3, -4.0, 7.0],
    ];
    let nl = check(&pos, Some(&cell), [true, true, false], 3.1);
    assert_eq!(nl, naive(&pos, Some(&cell), [true, true, false], 3.1));
    // Atom 0 has 6 in-plane neighbours at 2.5 and 3 of atom 1 at sqrt(1.443^2 + 2.04^2) = 2.5.
    assert_eq!(nl.centers.iter().filter(|&&c| c == 0).count(), 9);
    // Wire: only a periodic, b and c zero.
    let wire = [[2.5, 0.0, 0.0], [0.0; 3], [0.0; 3]];
    let nl = check(&pos, Some(&wire), [true, false, false], 2.6);
    assert_eq!(nl, naive(&pos, Some(&wire), [true, false, false], 2.6));
}

const CELL: Lattice = [[3.1, 0.2, -0.3], [0.7, 2.8, 0.1], [-0.4, 0.5, 3.3]];
const POS: [[f64; 3]; 3] = [[0.1, 0.2, 0.3], [2.9, -0.8, 1.7], [4.5, 3.9, -1.2]];
/// ase.neighborlist.primitive_neighbor_list('ijS', (True, True, True), CELL, POS, 3.6, self_interaction=False), 64 edges.
const ASE_TTT_3_6: &str = "\
    0 0 -1 0 0;0 0 -1 1 0;0 0 0 -1 0;0 0 0 0 -1;0 0 0 0 1;0 0 0 1 0;0 0 1 -1 0;0 0 1 0 0;0 1 \
    -2 1 -1;0 1 -1 0 -1;0 1 -1 0 0;0 1 -1 1 -1;0 1 -1 1 0;0 1 0 0 0;0 2 -2 -1 0;0 2 -1 -2 \
    0;0 2 -1 -2 1;0 2 -1 -1 0;0 2 -1 -1 1;0 2 0 -2 1;1 0 0 0 0;1 0 1 -1 0;1 0 1 -1 1;1 0 1 0 \
    0;1 0 1 0 1;1 0 2 -1 1;1 1 -1 0 0;1 1 -1 1 0;1 1 0 -1 0;1 1 0 0 -1;1 1 0 0 1;1 1 0 1 0;1 \
    1 1 -1 0;1 1 1 0 0;1 2 -1 -2 1;1 2 -1 -1 1;1 2 0 -3 1;1 2 0 -2 0;1 2 0 -2 1;1 2 0 -2 2;1 \
    2 0 -1 1;1 2 1 -2 1;2 0 0 2 -1;2 0 1 1 -1;2 0 1 1 0;2 0 1 2 -1;2 0 1 2 0;2 0 2 1 0;2 1 \
    -1 2 -1;2 1 0 1 -1;2 1 0 2 -2;2 1 0 2 -1;2 1 0 2 0;2 1 0 3 -1;2 1 1 1 -1;2 1 1 2 -1;2 2 \
    -1 0 0;2 2 -1 1 0;2 2 0 -1 0;2 2 0 0 -1;2 2 0 0 1;2 2 0 1 0;2 2 1 -1 0;2 2 1 0 0 \
";
/// ase.neighborlist.primitive_neighbor_list('ijS', (True, True, False), CELL, POS, 4.0, self_interaction=False), 44 edges.
const ASE_TTF_4_0: &str = "\
    0 0 -1 0 0;0 0 -1 1 0;0 0 0 -1 0;0 0 0 1 0;0 0 1 -1 0;0 0 1 0 0;0 1 -2 1 0;0 1 -1 0 0;0 \
    1 -1 1 0;0 1 0 0 0;0 2 -2 -1 0;0 2 -2 0 0;0 2 -1 -2 0;0 2 -1 -1 0;0 2 -1 0 0;0 2 0 -2 \
    0;1 0 0 0 0;1 0 1 -1 0;1 0 1 0 0;1 0 2 -1 0;1 1 -1 0 0;1 1 -1 1 0;1 1 0 -1 0;1 1 0 1 0;1 \
    1 1 -1 0;1 1 1 0 0;1 2 -1 -1 0;1 2 0 -2 0;1 2 0 -1 0;2 0 0 2 0;2 0 1 0 0;2 0 1 1 0;2 0 1 \
    2 0;2 0 2 0 0;2 0 2 1 0;2 1 0 1 0;2 1 0 2 0;2 1 1 1 0;2 2 -1 0 0;2 2 -1 1 0;2 2 0 -1 0;2 \
    2 0 1 0;2 2 1 -1 0;2 2 1 0 0 \
";
/// ase.neighborlist.primitive_neighbor_list('ijS', (True, False, True), CELL, POS, 7.5, self_interaction=False), 126 edges.
const ASE_TFT_7_5: &str = "\
    0 0 -2 0 -1;0 0 -2 0 0;0 0 -1 0 -2;0 0 -1 0 -1;0 0 -1 0 0;0 0 -1 0 1;0 0 0 0 -2;0 0 0 0 \
    -1;0 0 0 0 1;0 0 0 0 2;0 0 1 0 -1;0 0 1 0 0;0 0 1 0 1;0 0 1 0 2;0 0 2 0 0;0 0 2 0 1;0 1 \
    -3 0 -1;0 1 -3 0 0;0 1 -2 0 -2;0 1 -2 0 -1;0 1 -2 0 0;0 1 -2 0 1;0 1 -1 0 -2;0 1 -1 0 \
    -1;0 1 -1 0 0;0 1 -1 0 1;0 1 0 0 -2;0 1 0 0 -1;0 1 0 0 0;0 1 0 0 1;0 1 1 0 -1;0 1 1 0 \
    0;0 1 1 0 1;0 2 -3 0 -1;0 2 -3 0 0;0 2 -3 0 1;0 2 -2 0 -1;0 2 -2 0 0;0 2 -2 0 1;0 2 -1 0 \
    -1;0 2 -1 0 0;0 2 -1 0 1;0 2 -1 0 2;0 2 0 0 0;0 2 0 0 1;1 0 -1 0 -1;1 0 -1 0 0;1 0 -1 0 \
    1;1 0 0 0 -1;1 0 0 0 0;1 0 0 0 1;1 0 0 0 2;1 0 1 0 -1;1 0 1 0 0;1 0 1 0 1;1 0 1 0 2;1 0 \
    2 0 -1;1 0 2 0 0;1 0 2 0 1;1 0 2 0 2;1 0 3 0 0;1 0 3 0 1;1 1 -2 0 -1;1 1 -2 0 0;1 1 -1 0 \
    -2;1 1 -1 0 -1;1 1 -1 0 0;1 1 -1 0 1;1 1 0 0 -2;1 1 0 0 -1;1 1 0 0 1;1 1 0 0 2;1 1 1 0 \
    -1;1 1 1 0 0;1 1 1 0 1;1 1 1 0 2;1 1 2 0 0;1 1 2 0 1;1 2 -2 0 0;1 2 -2 0 1;1 2 -1 0 -1;1 \
    2 -1 0 0;1 2 -1 0 1;1 2 -1 0 2;1 2 0 0 0;1 2 0 0 1;1 2 0 0 2;1 2 1 0 1;2 0 0 0 -1;2 0 0 \
    0 0;2 0 1 0 -2;2 0 1 0 -1;2 0 1 0 0;2 0 1 0 1;2 0 2 0 -1;2 0 2 0 0;2 0 2 0 1;2 0 3 0 \
    -1;2 0 3 0 0;2 0 3 0 1;2 1 -1 0 -1;2 1 0 0 -2;2 1 0 0 -1;2 1 0 0 0;2 1 1 0 -2;2 1 1 0 \
    -1;2 1 1 0 0;2 1 1 0 1;2 1 2 0 -1;2 1 2 0 0;2 2 -2 0 -1;2 2 -2 0 0;2 2 -1 0 -2;2 2 -1 0 \
    -1;2 2 -1 0 0;2 2 -1 0 1;2 2 0 0 -2;2 2 0 0 -1;2 2 0 0 1;2 2 0 0 2;2 2 1 0 -1;2 2 1 0 \
    0;2 2 1 0 1;2 2 1 0 2;2 2 2 0 0;2 2 2 0 1 \
";

fn parse(s: &str) -> Vec<Edge> {
    s.split(';')
        .map(|e| {
            let v: Vec<i64> = e.split_whitespace().map(|x| x.parse().unwrap()).collect();
            (
                v[0] as u32,
                v[1] as u32,
                [v[2] as i32, v[3] as i32, v[4] as i32],
            )
        })
        .collect()
}

/// Triclinic cell, atoms outside it, cutoffs beyond the cell width: the same edges as ASE 3.x.
#[test]
fn triclinic_matches_ase() {
    for (pbc, cutoff, want) in [
        ([true, true, true], 3.6, ASE_TTT_3_6),
        ([true, true, false], 4.0, ASE_TTF_4_0),
        ([true, false, true], 7.5, ASE_TFT_7_5),
    ] {
        let nl = check(&POS, Some(&CELL), pbc, cutoff);
        assert_eq!(edges(&nl), parse(want), "pbc {pbc:?} cutoff {cutoff}");
    }
}

// ---------------------------------------------------------------------------------------------
// Errors

fn message(r: mlff_distiller::Result<NeighborList>) -> String {
    match r {
        Err(Error::NeighborList(m)) => m,
        other => panic!("expected a neighbour-list error, got {other:?}"),
    }
}

#[test]
fn errors_name_the_cause() {
    let pos = [[0.0; 3], [1.0, 0.0, 0.0], [f64::NAN, 0.0, 0.0]];
    for list in [neighbor_list, brute_force_neighbor_list] {
        for c in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(message(list(&pos[..2], None, [false; 3], c)).contains("cutoff"));
        }
        assert!(message(list(&pos, None, [false; 3], 2.0)).contains("atom 2"));
        let flat = [[3.0, 0.0, 0.0], [0.0, 3.0, 0.0], [3.0, 3.0, 0.0]];
        assert!(message(list(&pos[..2], Some(&flat), [true; 3], 2.0)).contains("degenerate"));
        let zero_b = [[3.0, 0.0, 0.0], [0.0; 3], [0.0, 0.0, 3.0]];
        assert!(
            message(list(&pos[..2], Some(&zero_b), [true, true, false], 2.0))
                .contains("degenerate")
        );
        // ...but the same cell is fine when b is not periodic.
        assert!(list(&pos[..2], Some(&zero_b), [true, false, true], 2.0).is_ok());
        let tiny = [[0.01, 0.0, 0.0], [0.0, 3.0, 0.0], [0.0, 0.0, 3.0]];
        let m = message(list(&pos[..2], Some(&tiny), [true; 3], 5.0));
        assert!(
            m.contains("too many periodic images") && m.contains("axis 0"),
            "{m}"
        );
        assert!(list(&pos[..2], Some(&tiny), [false, true, true], 5.0).is_ok());
        let inf = [[f64::INFINITY, 0.0, 0.0], [0.0, 3.0, 0.0], [0.0, 0.0, 3.0]];
        assert!(message(list(&pos[..2], Some(&inf), [true; 3], 2.0)).contains("not finite"));
    }
    let mut bad = Structure::molecule(vec![1, 1], vec![[0.0; 3], [1.0, 0.0, 0.0]]);
    let batch = Batch::new(vec![bad.clone(), bad.clone()]).unwrap();
    bad.positions[1][0] = f64::NAN;
    let m = message(structure_neighbor_list(&bad, 2.0));
    assert!(m.contains("atom 1"), "{m}");
    let m = message(batch_neighbor_list(&batch, -2.0));
    assert!(m.contains("structure 0") && m.contains("cutoff"), "{m}");
}

// ---------------------------------------------------------------------------------------------
// Verlet list

fn gas(n: usize, side: f64, seed: u64) -> Vec<[f64; 3]> {
    // Small LCG: deterministic without pulling rand into the test.
    let mut x = seed;
    let mut next = move || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 11) as f64 / (1u64 << 53) as f64
    };
    (0..n)
        .map(|_| [next() * side, next() * side, next() * side])
        .collect()
}

#[test]
fn verlet_rebuild_logic() {
    let side = 12.0;
    let cell = [[side, 0.0, 0.0], [0.0, side, 0.0], [0.0, 0.0, side]];
    let pos = gas(150, side, 7);
    let (cutoff, skin) = (3.0, 1.0);
    let mut v = VerletList::new(cutoff, skin);
    assert!(v.needs_rebuild(&pos));
    assert!(v.update(&pos, Some(&cell), [true; 3]).unwrap());
    assert_eq!(v.rebuilds(), 1);
    assert!(!v.update(&pos, Some(&cell), [true; 3]).unwrap());

    // Every atom moves 0.45 < skin/2 (some across the cell boundary, unwrapped): no rebuild, and
    // the list still holds every pair within the cutoff.
    let dirs = gas(150, 2.0, 11);
    let moved: Vec<[f64; 3]> = pos
        .iter()
        .zip(&dirs)
        .map(|(x, d)| {
            let d = [d[0] - 1.0, d[1] - 1.0, d[2] - 1.0];
            let n = len2(d).sqrt();
            [0, 1, 2].map(|k| x[k] + 0.45 * d[k] / n)
        })
        .collect();
    assert!(!v.needs_rebuild(&moved));
    assert!(!v.update(&moved, Some(&cell), [true; 3]).unwrap());
    assert_eq!(v.rebuilds(), 1);
    let fresh = neighbor_list(&moved, Some(&cell), [true; 3], cutoff).unwrap();
    assert_eq!(v.within_cutoff(&moved, Some(&cell)), fresh);
    assert!(v.list().len() > fresh.len());

    // One atom 0.6 > skin/2 away from where it was at the build: rebuild.
    let mut far = moved.clone();
    far[17] = [pos[17][0] + 0.6, pos[17][1], pos[17][2]];
    assert!(v.needs_rebuild(&far));
    assert!(v.update(&far, Some(&cell), [true; 3]).unwrap());
    assert_eq!(v.rebuilds(), 2);
    assert_eq!(
        v.list(),
        &neighbor_list(&far, Some(&cell), [true; 3], cutoff + skin).unwrap()
    );

    // A new cell, pbc, atom count, or invalidate() rebuilds too.
    let bigger = [[side + 0.1, 0.0, 0.0], [0.0, side, 0.0], [0.0, 0.0, side]];
    assert!(v.update(&far, Some(&bigger), [true; 3]).unwrap());
    assert!(v.update(&far, Some(&bigger), [true, true, false]).unwrap());
    assert!(v
        .update(&far[1..], Some(&bigger), [true, true, false])
        .unwrap());
    v.invalidate();
    assert!(v
        .update(&far[1..], Some(&bigger), [true, true, false])
        .unwrap());
    assert_eq!(v.rebuilds(), 6);
    assert!(!v
        .update(&far[1..], Some(&bigger), [true, true, false])
        .unwrap());

    let mut bad = VerletList::new(cutoff, -1.0);
    assert!(message(
        bad.update(&pos, None, [false; 3])
            .map(|_| NeighborList::default())
    )
    .contains("skin"));
}

/// Timing of the 10k-atom water-density box; run with
/// `cargo test --release --test neighbors -- --ignored --nocapture`.
#[test]
#[ignore]
fn timing_10k_atoms() {
    let n = 10_000;
    let side = (10.0 * n as f64).cbrt();
    let cell = [[side, 0.0, 0.0], [0.0, side, 0.0], [0.0, 0.0, side]];
    let pos = gas(n, side, 3);
    let mut best = f64::INFINITY;
    let mut edges = 0;
    for _ in 0..10 {
        let t = std::time::Instant::now();
        let nl = neighbor_list(&pos, Some(&cell), [true; 3], 5.0).unwrap();
        best = best.min(t.elapsed().as_secs_f64());
        edges = nl.len();
    }
    println!(
        "10k atoms, cutoff 5: {edges} edges, best of 10: {:.2} ms",
        best * 1e3
    );
}
