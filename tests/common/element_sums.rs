//! Inputs for the first block's per-element sums (`ops::element_sums`), and those sums and
//! their adjoint written in candle ops (the oracle: `index_add` and its backprop on the CPU,
//! then the edge basis' own adjoint to the positions).

use super::fused::random;
use candle_core::{DType, Device, Result, Tensor, Var};
use mlff_distiller::ops::{basis_width, edge_basis, edge_basis_adjoint};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The cutoff of every case (Å): the atoms lie in a 6 Å box, so some edges reach past it.
pub const CUTOFF: f64 = 5.0;

pub struct SumsCase {
    pub positions: Tensor,
    pub offsets: Tensor,
    /// The edges' basis rows from the positions and offsets.
    pub basis: Tensor,
    pub centers: Tensor,
    pub neighbors: Tensor,
    pub species: Tensor,
    pub n: usize,
    pub elements: usize,
    pub n_rbf: usize,
    /// dL/d[S | U] [4N, elements (R + 1)] and the later blocks' dL/d(basis) [E, R + 4].
    pub g_sums: Tensor,
    pub prev: Tensor,
}

impl SumsCase {
    /// `n` atoms of `elements` kinds at random in a 6 Å box, `e` random edges sorted by
    /// receiver (or not) with random image offsets; atom `n - 1` has no edges where `isolated`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        n: usize,
        e: usize,
        elements: usize,
        n_rbf: usize,
        sorted: bool,
        isolated: bool,
        dtype: DType,
        seed: u64,
    ) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let bound = if isolated { n - 1 } else { n } as u32;
        let mut pairs: Vec<(u32, u32)> = (0..e)
            .map(|_| (rng.random_range(0..bound), rng.random_range(0..bound)))
            .collect();
        if sorted {
            pairs.sort_by_key(|p| p.0);
        }
        let (c, j): (Vec<u32>, Vec<u32>) = pairs.into_iter().unzip();
        let species: Vec<u32> = (0..n)
            .map(|_| rng.random_range(0..elements as u32))
            .collect();
        let k = elements * (n_rbf + 1);
        let positions = (random(&mut rng, &[n, 3], 3.0, dtype) + 3.0).unwrap();
        let offsets = random(&mut rng, &[e, 3], 2.0, dtype);
        let centers = Tensor::new(c, &Device::Cpu).unwrap();
        let neighbors = Tensor::new(j, &Device::Cpu).unwrap();
        let basis = edge_basis(&positions, &offsets, &centers, &neighbors, n_rbf, CUTOFF).unwrap();
        Self {
            positions,
            offsets,
            basis,
            centers,
            neighbors,
            species: Tensor::new(species, &Device::Cpu).unwrap(),
            n,
            elements,
            n_rbf,
            g_sums: random(&mut rng, &[4 * n, k], 1.0, dtype),
            prev: random(&mut rng, &[e, basis_width(n_rbf)], 1.0, dtype),
        }
    }

    /// The same case's tensors on `dev`.
    pub fn to(&self, dev: &Device) -> Self {
        let m = |t: &Tensor| t.to_device(dev).unwrap();
        Self {
            positions: m(&self.positions),
            offsets: m(&self.offsets),
            basis: m(&self.basis),
            centers: m(&self.centers),
            neighbors: m(&self.neighbors),
            species: m(&self.species),
            g_sums: m(&self.g_sums),
            prev: m(&self.prev),
            ..*self
        }
    }

    /// `ops::element_sums` of the case.
    pub fn sums(&self) -> Result<Tensor> {
        mlff_distiller::ops::element_sums(
            &self.basis,
            &self.centers,
            &self.neighbors,
            &self.species,
            self.elements,
            self.n_rbf,
        )
    }

    /// `ops::element_sums_position_adjoint` of the case, with `prev` as the later blocks'
    /// basis gradient where asked.
    pub fn adjoint(&self, with_prev: bool) -> Result<Tensor> {
        let n = self.n;
        mlff_distiller::ops::element_sums_position_adjoint(
            &self.positions,
            &self.offsets,
            with_prev.then_some(&self.prev),
            &self.g_sums.narrow(0, 0, n)?,
            &self.g_sums.narrow(0, n, 3 * n)?,
            (&self.centers, &self.neighbors),
            &self.species,
            self.elements,
            (self.n_rbf, CUTOFF),
        )
    }

    /// The sums in candle ops from `basis`: each edge's [b, b u_x, b u_y, b u_z] added into
    /// row (p N + i) elements + z of [4N elements, R + 1], then each atom's element one-hot in
    /// its plain row: [4N, elements (R + 2)].
    pub fn reference_sums(&self, basis: &Tensor) -> Result<Tensor> {
        let (n, nb, z) = (self.n, self.n_rbf + 1, self.elements);
        let b = basis.narrow(1, 0, nb)?;
        let mut parts = vec![b.clone()];
        for a in 0..3 {
            parts.push(b.broadcast_mul(&basis.narrow(1, nb + a, 1)?)?);
        }
        let rows = Tensor::cat(&parts, 0)?; // [4E, R + 1], part-major
        let (c, j) = (
            self.centers.to_vec1::<u32>()?,
            self.neighbors.to_vec1::<u32>()?,
        );
        let species = self.species.to_vec1::<u32>()?;
        let mut target = Vec::with_capacity(4 * c.len());
        for p in 0..4 {
            for (&i, &j) in c.iter().zip(&j) {
                target.push(((p * n + i as usize) * z + species[j as usize] as usize) as u32);
            }
        }
        let target = Tensor::new(target, &Device::Cpu)?;
        let zeros = Tensor::zeros((4 * n * z, nb), basis.dtype(), &Device::Cpu)?;
        let sums = zeros
            .index_add(&target, &rows, 0)?
            .reshape((4 * n, z * nb))?;
        let mut own = vec![0f64; 4 * n * z];
        for (i, &e) in species.iter().enumerate() {
            own[i * z + e as usize] = 1.0;
        }
        let own = Tensor::from_vec(own, (4 * n, z), &Device::Cpu)?.to_dtype(basis.dtype())?;
        Tensor::cat(&[&sums, &own], 1)
    }

    /// The position adjoint by candle's backprop of Σ sums ⊙ g_sums (the sums' columns without
    /// the one-hot) to the basis, plus `prev` where asked, then `ops::edge_basis_adjoint`.
    pub fn reference_adjoint(&self, with_prev: bool) -> Result<Tensor> {
        let basis = Var::from_tensor(&self.basis)?;
        let k = self.g_sums.dim(1)?;
        let sums = self.reference_sums(basis.as_tensor())?.narrow(1, 0, k)?;
        let loss = (sums * &self.g_sums)?.sum_all()?;
        let rows = match loss.backward()?.get(basis.as_tensor()) {
            Some(g) => g.clone(),
            None => self.basis.zeros_like()?,
        };
        let rows = if with_prev {
            (rows + &self.prev)?
        } else {
            rows
        };
        edge_basis_adjoint(
            &self.positions,
            &self.offsets,
            &rows,
            &self.centers,
            &self.neighbors,
            self.n_rbf,
            CUTOFF,
        )
    }
}
