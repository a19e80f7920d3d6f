//! Built-in systems for tests and benchmarks: aspirin and periodic liquid-water boxes.

use crate::error::{Error, Result};
use crate::io::parse_extxyz_str;
use crate::structure::Structure;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Water molecules per Å³ at 1 g/cm³ (≈ 29.9 Å³ per molecule).
const WATER_DENSITY: f64 = 0.033_43;

/// A cubic periodic box of `n_molecules` rigid TIP3P-geometry waters (O-H 0.9572 Å,
/// H-O-H 104.52°), one per site of a simple cubic lattice at 1 g/cm³ with random orientations
/// (seeded). Not equilibrated: meant for timing and device-agreement checks, and as an MD
/// starting point.
pub fn water_box(n_molecules: usize, seed: u64) -> Structure {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let per_side = (n_molecules as f64).cbrt().ceil().max(1.0) as usize;
    let side = (n_molecules as f64 / WATER_DENSITY).cbrt();
    let spacing = side / per_side as f64;
    let (r, half) = (0.9572, 104.52f64.to_radians() / 2.0);
    let local = [
        [0.0, 0.0, 0.0],
        [r * half.sin(), r * half.cos(), 0.0],
        [-r * half.sin(), r * half.cos(), 0.0],
    ];
    let mut numbers = Vec::with_capacity(3 * n_molecules);
    let mut positions = Vec::with_capacity(3 * n_molecules);
    'fill: for i in 0..per_side {
        for j in 0..per_side {
            for k in 0..per_side {
                if numbers.len() == 3 * n_molecules {
                    break 'fill;
                }
                let site = [i, j, k].map(|c| (c as f64 + 0.5) * spacing);
                let rot = random_rotation(&mut rng);
                for (z, p) in [8u8, 1, 1].into_iter().zip(local) {
                    numbers.push(z);
                    positions.push(std::array::from_fn(|d| {
                        site[d] + (0..3).map(|c| rot[d][c] * p[c]).sum::<f64>()
                    }));
                }
            }
        }
    }
    Structure {
        cell: Some([[side, 0.0, 0.0], [0.0, side, 0.0], [0.0, 0.0, side]]),
        pbc: [true; 3],
        ..Structure::molecule(numbers, positions)
    }
}

/// Uniformly distributed random rotation matrix (rejection-sampled unit quaternion).
pub fn random_rotation(rng: &mut impl Rng) -> [[f64; 3]; 3] {
    loop {
        let q: [f64; 4] = std::array::from_fn(|_| rng.random_range(-1.0..1.0));
        let n = q.iter().map(|x| x * x).sum::<f64>();
        if n > 1e-6 && n <= 1.0 {
            let [w, x, y, z] = q.map(|x| x / n.sqrt());
            return [
                [
                    1. - 2. * (y * y + z * z),
                    2. * (x * y - z * w),
                    2. * (x * z + y * w),
                ],
                [
                    2. * (x * y + z * w),
                    1. - 2. * (x * x + z * z),
                    2. * (y * z - x * w),
                ],
                [
                    2. * (x * z - y * w),
                    2. * (y * z + x * w),
                    1. - 2. * (x * x + y * y),
                ],
            ];
        }
    }
}

/// The GFN2-xTB-relaxed starting geometries of the shipped data set (data/gfn2/start), built
/// into the binary so that `mlff validate-md` and the examples run from any folder.
pub const START_GEOMETRIES: [(&str, &str); 6] = [
    ("water8", include_str!("../data/gfn2/start/water8.extxyz")),
    ("ethanol", include_str!("../data/gfn2/start/ethanol.extxyz")),
    ("benzene", include_str!("../data/gfn2/start/benzene.extxyz")),
    ("aspirin", include_str!("../data/gfn2/start/aspirin.extxyz")),
    (
        "alanine_dipeptide",
        include_str!("../data/gfn2/start/alanine_dipeptide.extxyz"),
    ),
    (
        "trialanine",
        include_str!("../data/gfn2/start/trialanine.extxyz"),
    ),
];

/// A shipped starting geometry by name (see [`START_GEOMETRIES`]).
pub fn start_geometry(name: &str) -> Result<Structure> {
    let Some((_, text)) = START_GEOMETRIES.iter().find(|(n, _)| *n == name) else {
        let known: Vec<&str> = START_GEOMETRIES.iter().map(|(n, _)| *n).collect();
        return Err(Error::Structure(format!(
            "no shipped starting geometry `{name}` (known: {})",
            known.join(", ")
        )));
    };
    let path = format!("data/gfn2/start/{name}.extxyz");
    parse_extxyz_str(text, std::path::Path::new(&path))?
        .into_iter()
        .next()
        .ok_or_else(|| Error::Structure(format!("{path} has no frame")))
}

/// Aspirin (C9H8O4), the first validation frame of rMD17 (PBE/def2-SVP geometry, Å).
pub fn aspirin() -> Structure {
    const NUMBERS: [u8; 21] = [
        6, 6, 6, 6, 6, 6, 6, 8, 8, 8, 6, 6, 8, 1, 1, 1, 1, 1, 1, 1, 1,
    ];
    const POSITIONS: [[f64; 3]; 21] = [
        [2.28137718, -0.27140778, 0.49660168],
        [0.89520730, 1.80620919, -0.82192228],
        [2.97409421, 0.85983021, 0.01641230],
        [2.24370869, 1.85871316, -0.75902609],
        [-3.56989064, 0.98288503, -0.74030535],
        [0.91880609, -0.44699592, 0.19452617],
        [0.16054036, 0.64869904, -0.43672452],
        [-0.83689557, -2.13820910, 0.09505259],
        [-2.04327467, 0.87040077, 1.26006557],
        [1.13035598, -2.67743976, 0.87064430],
        [0.32433749, -1.81004831, 0.28195626],
        [-2.23992076, 0.71538885, 0.08669564],
        [-1.18473451, 0.39772159, -0.76233831],
        [0.60104596, -3.49585198, 0.84573061],
        [2.84697241, -1.10509410, 0.96732320],
        [0.30360518, 2.65728779, -1.27691034],
        [4.06992930, 1.04099339, 0.34181775],
        [2.85488414, 2.55986041, -1.35220109],
        [-3.55817091, 0.17577753, -1.57610434],
        [-4.40173401, 0.72988906, 0.01499479],
        [-3.65698127, 1.99848354, -1.15394922],
    ];
    Structure::molecule(NUMBERS.to_vec(), POSITIONS.to_vec())
}
