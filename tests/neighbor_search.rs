//! The cell list against the brute-force oracle, edge for edge, where its search takes its
//! shortcuts: rows cut to the sphere in orthogonal cells (and cells orthogonal up to rounding),
//! triclinic cells, slabs, wires, molecules, cells narrower than the cutoff, atoms outside the
//! cell, on its faces and at the cutoff exactly, and lists long enough to be searched in
//! several runs on several threads. Also the rebuild into a reused list.

use mlff_distiller::neighbors::{
    brute_force_neighbor_list, neighbor_list, neighbor_list_into, NeighborList,
};
use mlff_distiller::structure::Lattice;

/// Uniform numbers in [0, 1) from a fixed seed (xorshift).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// `n` atoms at fractional coordinates in `lo..hi` of `cell`.
fn atoms(rng: &mut Rng, cell: &Lattice, n: usize, lo: f64, hi: f64) -> Vec<[f64; 3]> {
    (0..n)
        .map(|_| {
            let s: [f64; 3] = std::array::from_fn(|_| lo + (hi - lo) * rng.next());
            std::array::from_fn(|d| (0..3).map(|k| s[k] * cell[k][d]).sum())
        })
        .collect()
}

fn check(what: &str, positions: &[[f64; 3]], cell: Option<&Lattice>, pbc: [bool; 3], cutoff: f64) {
    let fast = neighbor_list(positions, cell, pbc, cutoff).unwrap();
    let oracle = brute_force_neighbor_list(positions, cell, pbc, cutoff).unwrap();
    assert!(!oracle.is_empty(), "{what}: no edges to compare");
    assert_eq!(fast.len(), oracle.len(), "{what}: edge counts");
    assert_eq!(fast, oracle, "{what}");
}

const CUBE: Lattice = [[11.0, 0.0, 0.0], [0.0, 12.5, 0.0], [0.0, 0.0, 10.0]];
const TRICLINIC: Lattice = [[11.0, 0.0, 0.0], [3.5, 10.0, 0.0], [-2.0, 1.5, 9.0]];

#[test]
fn orthogonal_and_triclinic_cells_match_the_oracle() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    // Orthogonal up to rounding: the rows cut to the sphere must still hold every edge.
    let mut tilted = CUBE;
    tilted[1][0] = 1e-13;
    tilted[2][1] = -3e-14;
    // An orthorhombic cell whose rows are not along the Cartesian axes.
    let (c, s) = (0.6f64, 0.8f64);
    let rotated = [
        [11.0 * c, 11.0 * s, 0.0],
        [-12.5 * s, 12.5 * c, 0.0],
        [0.0, 0.0, 10.0],
    ];
    for (name, cell) in [
        ("cube", CUBE),
        ("triclinic", TRICLINIC),
        ("tilted", tilted),
        ("rotated", rotated),
    ] {
        // Inside the cell, and spread over the neighbouring images.
        for (lo, hi) in [(0.0, 1.0), (-1.5, 2.5)] {
            let x = atoms(&mut rng, &cell, 300, lo, hi);
            for cutoff in [2.5, 4.0, 5.9] {
                check(
                    &format!("{name} {lo}..{hi} {cutoff}"),
                    &x,
                    Some(&cell),
                    [true; 3],
                    cutoff,
                );
            }
        }
    }
}

#[test]
fn slabs_wires_and_molecules_match_the_oracle() {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let x = atoms(&mut rng, &TRICLINIC, 300, -0.5, 1.5);
    let y = atoms(&mut rng, &CUBE, 300, -0.5, 1.5);
    let mut slab = CUBE;
    slab[2] = [0.0; 3];
    for pbc in [
        [true, true, false],
        [false, true, false],
        [false, false, true],
        [true, false, true],
        [false; 3],
    ] {
        check(
            &format!("triclinic {pbc:?}"),
            &x,
            Some(&TRICLINIC),
            pbc,
            4.0,
        );
        check(&format!("cube {pbc:?}"), &y, Some(&CUBE), pbc, 3.5);
    }
    check("slab, zero c", &y, Some(&slab), [true, true, false], 3.5);
    check("molecule", &y, None, [false; 3], 3.5);
    // Every atom on one plane: one bin along its normal.
    let flat: Vec<[f64; 3]> = y.iter().map(|p| [p[0], p[1], 2.0]).collect();
    check("plane", &flat, None, [false; 3], 2.0);
    check(
        "plane, periodic",
        &flat,
        Some(&CUBE),
        [true, true, false],
        2.0,
    );
}

#[test]
fn cells_narrower_than_the_cutoff_match_the_oracle() {
    let mut rng = Rng(0x0123_4567_89ab_cdef);
    let small = [[3.0, 0.0, 0.0], [0.7, 2.6, 0.0], [0.3, -0.4, 4.1]];
    let x = atoms(&mut rng, &small, 12, -0.5, 1.5);
    for pbc in [[true; 3], [true, false, true]] {
        check(&format!("small {pbc:?}"), &x, Some(&small), pbc, 4.5);
    }
    let thin = [[2.0, 0.0, 0.0], [0.0, 9.0, 0.0], [0.0, 0.0, 9.0]];
    let y = atoms(&mut rng, &thin, 40, 0.0, 1.0);
    check("thin", &y, Some(&thin), [true; 3], 3.0);
}

#[test]
fn faces_duplicates_and_the_cutoff_itself_match_the_oracle() {
    let cutoff: f64 = 3.0;
    let l = CUBE[0][0];
    let mut x = vec![
        [0.0, 0.0, 0.0],
        [0.0, 0.0, 0.0],
        [cutoff, 0.0, 0.0],
        [0.0, f64::from_bits(cutoff.to_bits() - 1), 0.0],
        [l - 1e-17, 1.0, 1.0],
        [-1e-17, 1.0, 1.0],
        [l, 12.5, 10.0],
        // Across the face at x = 0: exactly the cutoff apart through the image, and just inside.
        [l - (cutoff - 0.5), 5.0, 5.0],
        [0.5, 5.0, 5.0],
        [0.5 - 1e-12, 5.0, 5.5],
    ];
    let mut rng = Rng(0x5555_aaaa_1234_8765);
    x.extend(atoms(&mut rng, &CUBE, 100, 0.0, 1.0));
    check("faces", &x, Some(&CUBE), [true; 3], cutoff);
    check("faces, molecule", &x, None, [false; 3], cutoff);
}

#[test]
fn long_lists_searched_in_runs_match_the_oracle() {
    // Liquid density (about 0.1 atoms per Å³): thousands of centers, many runs per thread.
    let mut rng = Rng(0x1357_9bdf_2468_ace0);
    let cell = [[26.0, 0.0, 0.0], [0.0, 25.0, 0.0], [0.0, 0.0, 24.0]];
    let x = atoms(&mut rng, &cell, 1600, 0.0, 1.0);
    check("liquid", &x, Some(&cell), [true; 3], 3.5);
    let y = atoms(&mut rng, &TRICLINIC, 1200, -0.2, 1.2);
    check(
        "triclinic crowd",
        &y,
        Some(&TRICLINIC),
        [true, true, false],
        2.0,
    );
}

#[test]
fn a_list_rebuilt_in_place_is_a_fresh_list() {
    let mut rng = Rng(0xdead_beef_cafe_f00d);
    let x = atoms(&mut rng, &TRICLINIC, 400, -0.3, 1.3);
    let mut reused = NeighborList {
        centers: vec![9; 50_000],
        neighbors: vec![9; 50_000],
        shifts: vec![[9; 3]; 50_000],
    };
    for (cutoff, pbc) in [
        (4.0, [true; 3]),
        (2.0, [true, false, true]),
        (5.0, [false; 3]),
    ] {
        neighbor_list_into(&x, Some(&TRICLINIC), pbc, cutoff, &mut reused).unwrap();
        assert_eq!(
            reused,
            neighbor_list(&x, Some(&TRICLINIC), pbc, cutoff).unwrap()
        );
    }
    assert!(neighbor_list_into(&x, Some(&TRICLINIC), [true; 3], -1.0, &mut reused).is_err());
    assert!(reused.is_empty(), "a failed build leaves no list");
}
