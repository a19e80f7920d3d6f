//! Index checks the launcher makes before a kernel reads them: element and edge indices in
//! range on the CPU (where an out-of-range one would index past a slice).

use candle_core::{bail, Result, Tensor};

/// Checks per-atom element indices (u32 [N]) against `count` elements, naming the first atom out
/// of range: on the CPU (an index past the table would index past a slice); CUDA tensors are
/// trusted, as in [`check_edges`] (the calculator builds them from checked elements).
pub fn check_elements(species: &Tensor, count: usize, op: &str) -> Result<()> {
    if !species.device().is_cpu() {
        return Ok(());
    }
    let idx = species.to_vec1::<u32>()?;
    if let Some((atom, &e)) = idx.iter().enumerate().find(|(_, &e)| e as usize >= count) {
        bail!("{op}: atom {atom} has element index {e}, there are {count} elements")
    }
    Ok(())
}

/// Checks an edge list i ← j (u32 `centers`, `neighbors`, both \[E\]) against `n_atoms`, naming
/// the first bad edge. On the CPU every index is checked (an out-of-range one would index past
/// a slice); CUDA tensors are trusted, as reading them back would stall every call, and the
/// calculator and MD build them from checked neighbour lists.
pub fn check_edges(centers: &Tensor, neighbors: &Tensor, n_atoms: usize, op: &str) -> Result<()> {
    let e = centers.dim(0)?;
    if centers.dims() != [e] || neighbors.dims() != [e] {
        bail!(
            "{op}: centers {:?} and neighbors {:?} must both be [E]",
            centers.dims(),
            neighbors.dims()
        )
    }
    if !centers.device().is_cpu() {
        return Ok(());
    }
    for (what, t) in [("centers", centers), ("neighbors", neighbors)] {
        let idx = t.to_vec1::<u32>()?;
        if let Some(k) = idx.iter().position(|&a| a as usize >= n_atoms) {
            bail!(
                "{op}: {what}[{k}] = {} is out of range for {n_atoms} atoms",
                idx[k]
            )
        }
    }
    Ok(())
}
