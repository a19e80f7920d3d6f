//! Seeded, reproducible initialisation of a fresh model (candle's own CPU init is unseeded).

use super::{Painn, PainnConfig};
use candle_core::{DType, Device, Result, Tensor, Var};
use candle_nn::{VarBuilder, VarMap};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use rand_distr_lite::standard_normal;

/// Creates every parameter of a model with `cfg` in a VarMap and fills it from a seeded
/// ChaCha20 stream, in sorted name order: Xavier-uniform weights, small uniform biases,
/// N(0, 1) embeddings; reference energies 0, scale 1, shift 0.
///
/// The values are made on the host and then moved to `dev`: the same seed gives the same
/// weights on every device, and a CUDA device never runs candle's cuRAND init, whose launches
/// fail while another thread captures a CUDA graph on the same GPU.
pub fn init_varmap(cfg: &PainnConfig, seed: u64, dtype: DType, dev: &Device) -> Result<VarMap> {
    let host = host_varmap(cfg, seed, dtype)?;
    if dev.is_cpu() {
        return Ok(host);
    }
    let varmap = VarMap::new();
    {
        let from = host.data().lock().expect("varmap lock");
        let mut to = varmap.data().lock().expect("varmap lock");
        for (name, var) in from.iter() {
            to.insert(name.clone(), Var::from_tensor(&var.to_device(dev)?)?);
        }
    }
    Ok(varmap)
}

fn host_varmap(cfg: &PainnConfig, seed: u64, dtype: DType) -> Result<VarMap> {
    let dev = &Device::Cpu;
    let varmap = VarMap::new();
    Painn::new(cfg, VarBuilder::from_varmap(&varmap, dtype, dev))?;
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let data = varmap.data().lock().expect("varmap lock");
    let mut names: Vec<&String> = data.keys().collect();
    names.sort();
    for name in names {
        let var = &data[name];
        let dims = var.dims().to_vec();
        let n: usize = dims.iter().product();
        let values: Vec<f64> = if name.ends_with("embedding.weight") {
            (0..n).map(|_| standard_normal(&mut rng)).collect()
        } else if name.ends_with(".weight") {
            let bound = (6.0 / (dims[0] + dims[1]) as f64).sqrt();
            (0..n).map(|_| rng.random_range(-bound..bound)).collect()
        } else if name.ends_with(".bias") {
            (0..n).map(|_| rng.random_range(-0.1..0.1)).collect()
        } else {
            continue; // atom_ref, scale, shift keep their constant init
        };
        var.set(&Tensor::from_vec(values, dims, dev)?.to_dtype(dtype)?)?;
    }
    drop(data);
    Ok(varmap)
}

mod rand_distr_lite {
    use rand::Rng;
    /// Box-Muller standard normal sample (avoids a dependency for one distribution).
    pub fn standard_normal<R: Rng>(rng: &mut R) -> f64 {
        let u1: f64 = rng.random_range(f64::EPSILON..1.0);
        let u2: f64 = rng.random();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}
