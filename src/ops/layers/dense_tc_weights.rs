//! Weights as the tensor-core dense kernels read them (kernels/layers/dense_tc.cu): padded
//! output-major rows, on CUDA scaled by powers of two and split into f16 hi and lo parts
//! (kernels/include/f16_split.cuh), made once per model.

use super::dense_tc::{dense_tc_fits, CHUNK};
use candle_core::{DType, Result, Tensor};
use half::f16;

/// A weight matrix [J, K] (output-major) as the kernels read it. On the CPU (the twins), and
/// for shapes the kernels do not take: the matrix padded with zero rows to Jp, a multiple of
/// 128, in its own dtype. On CUDA: u32 [Jp K + Jp], each padded row scaled by a power of two
/// and split into f16 hi and lo parts (kernels/f16_split.cuh), per quad of values one 16-byte
/// group {hi (4q, 4q + 1), hi (4q + 2, 4q + 3), lo (..), lo (..)} (an mma B fragment), then
/// each row's inverse scale as f32 bits. Made once per model by [`tc_weights`].
#[derive(Clone, Debug)]
pub struct TcWeights {
    pub(crate) matrix: Tensor,
    pub(crate) outputs: usize,
    pub(crate) inputs: usize,
}

impl TcWeights {
    /// The number of outputs J.
    pub fn outputs(&self) -> usize {
        self.outputs
    }

    /// The reduction width K.
    pub fn inputs(&self) -> usize {
        self.inputs
    }

    /// Whether the matrix is packed for the CUDA kernels (a u32 input) rather than a float one.
    fn packed(&self) -> bool {
        self.matrix.dtype() == DType::U32
    }
}

/// The exponent field of the power of two that takes a row whose largest magnitude has the f32
/// bits `max_bits` (sign cleared) into [2^14, 2^15), within [2^-126, 2^126]: as
/// kernels/f16_split.cuh's split_scale_field, which stages the inputs the same way.
fn split_scale_field(max_bits: u32) -> u32 {
    (268 - (max_bits >> 23) as i32).clamp(1, 253) as u32
}

/// Rows of `k` values (as many as `w` holds, then zero rows up to `padded`), each scaled and
/// split into f16 hi and lo parts, packed as [`TcWeights`] holds them on CUDA.
fn pack_split_rows(w: &[f32], k: usize, padded: usize) -> Vec<u32> {
    let pair = |a: f16, b: f16| a.to_bits() as u32 | (b.to_bits() as u32) << 16;
    let mut out = Vec::with_capacity(padded * (k + 1));
    let mut unscale = Vec::with_capacity(padded);
    for row in 0..padded {
        let values = w.get(row * k..(row + 1) * k);
        let max_bits = values.map_or(0, |v| {
            v.iter()
                .map(|x| x.to_bits() & 0x7fff_ffff)
                .max()
                .unwrap_or(0)
        });
        let field = split_scale_field(max_bits);
        let scale = f32::from_bits(field << 23);
        unscale.push(f32::from_bits((254 - field) << 23).to_bits());
        for q in 0..k / 4 {
            let (mut hi, mut lo) = ([f16::ZERO; 4], [f16::ZERO; 4]);
            for i in 0..4 {
                let v = values.map_or(0.0, |v| v[4 * q + i]) * scale;
                hi[i] = f16::from_f32(v);
                lo[i] = f16::from_f32(v - hi[i].to_f32());
            }
            out.extend([pair(hi[0], hi[1]), pair(hi[2], hi[3])]);
            out.extend([pair(lo[0], lo[1]), pair(lo[2], lo[3])]);
        }
    }
    out.extend(unscale);
    out
}

/// Weights [J, K] as the kernels read them ([`TcWeights`]), on their device.
pub fn tc_weights(w: &Tensor) -> Result<TcWeights> {
    let (j, k) = w.dims2()?;
    let padded = j.div_ceil(CHUNK) * CHUNK;
    // (A width the kernels do not take stays a float matrix: the launches refuse its shape.)
    let matrix = if w.device().is_cuda() && dense_tc_fits(k, j) {
        let values = w.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        let packed = pack_split_rows(&values, k, padded);
        Tensor::from_vec(packed, padded * (k + 1), w.device())?
    } else {
        let pad = Tensor::zeros((padded - j, k), w.dtype(), w.device())?;
        Tensor::cat(&[w, &pad], 0)?.contiguous()?
    };
    Ok(TcWeights {
        matrix,
        outputs: j,
        inputs: k,
    })
}

/// A launch's float inputs and index inputs: `floats`, then the weights (float inputs after
/// `floats` on the CPU; on CUDA u32 inputs before `index`, as the kernels take them).
pub(crate) fn arranged<'a>(
    floats: &[&'a Tensor],
    weights: &[&'a TcWeights],
    index: &[&'a Tensor],
) -> (Vec<&'a Tensor>, Vec<&'a Tensor>) {
    let (mut f, mut i) = (floats.to_vec(), Vec::new());
    for w in weights {
        match w.packed() {
            true => i.push(&w.matrix),
            false => f.push(&w.matrix),
        }
    }
    i.extend_from_slice(index);
    (f, i)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Value `i` of quad `q` of packed row `row` ([`pack_split_rows`]): its scaled hi and lo
    /// parts and the row's inverse scale.
    fn parts(p: &[u32], k: usize, padded: usize, row: usize, q: usize, i: usize) -> [f64; 3] {
        let half = |word: u32, upper: bool| f16::from_bits((word >> (16 * upper as u32)) as u16);
        let group = &p[row * k + 4 * q..row * k + 4 * q + 4];
        let (hi, lo) = (
            half(group[i / 2], i % 2 == 1),
            half(group[2 + i / 2], i % 2 == 1),
        );
        let unscale = f32::from_bits(p[padded * k + row]) as f64;
        [hi.to_f64(), lo.to_f64(), unscale]
    }

    /// The same value unpacked and unscaled.
    fn unpacked(p: &[u32], k: usize, padded: usize, row: usize, q: usize, i: usize) -> f64 {
        let [hi, lo, unscale] = parts(p, k, padded, row, q, i);
        (hi + lo) * unscale
    }

    /// What the kernels compute from two packed rows: lo·hi + hi·lo + hi·hi over the scaled
    /// parts (lo·lo dropped), unscaled by both rows' inverse scales: within 2^-20 of Σ|x||w| of
    /// the exact products, for rows of magnitudes 1e-12 to 1e12 against weight rows of 1e-6 to
    /// 1e6, and some values of a row far below its largest.
    #[test]
    fn split_products_hold_a_dot_product() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(17);
        let k = 64;
        let mut row = |scale: f64| -> Vec<f32> {
            (0..k)
                .map(|c| {
                    let tiny = if c % 7 == 0 { 1e-9 } else { 1.0 };
                    (scale * tiny * rng.random_range(-1.0..1.0)) as f32
                })
                .collect()
        };
        let xs: Vec<Vec<f32>> = (-12..=12).step_by(3).map(|e| row(10f64.powi(e))).collect();
        let ws: Vec<Vec<f32>> = (-6..=6).step_by(2).map(|e| row(10f64.powi(e))).collect();
        let (px, pw) = (
            pack_split_rows(&xs.concat(), k, CHUNK),
            pack_split_rows(&ws.concat(), k, CHUNK),
        );
        for (r, x) in xs.iter().enumerate() {
            for (j, w) in ws.iter().enumerate() {
                let (mut got, mut exact, mut scale) = (0.0, 0.0, 0.0);
                for c in 0..k {
                    let [xh, xl, xu] = parts(&px, k, CHUNK, r, c / 4, c % 4);
                    let [wh, wl, wu] = parts(&pw, k, CHUNK, j, c / 4, c % 4);
                    got += (xl * wh + xh * wl + xh * wh) * xu * wu;
                    exact += x[c] as f64 * w[c] as f64;
                    scale += (x[c] as f64 * w[c] as f64).abs();
                }
                let err = (got - exact).abs() / scale;
                assert!(err <= 2f64.powi(-20), "row {r} weight row {j}: {err:e}");
            }
        }
    }

    /// Rows of magnitudes from 1e-30 to 1e30 (one of zeros, one with tiny values beside a large
    /// one) packed and unpacked: each value back to 2^-21 of itself, or to 2^-36 of its row's
    /// largest where f16 holds it below its normal range; padding rows zero.
    #[test]
    fn split_rows_hold_each_value() {
        let k = 8;
        let rows: Vec<Vec<f32>> = vec![
            vec![1.0, -0.3, 0.123_456_7, 2.5e-3, -7.77, 0.0, 1e-6, 3.0],
            vec![1e-30, -3.3e-31, 7.1e-32, 1e-30, 0.0, 4e-33, -2e-30, 5e-31],
            vec![1e30, -3.3e29, 7.1e28, 1e30, 0.0, 4e27, -2e30, 5e29],
            vec![0.0; 8],
            vec![65_504.0, 1e-3, -1e-5, 1e-7, 1e-9, 3.3e-12, 1.0, -70_000.0],
        ];
        let flat: Vec<f32> = rows.concat();
        let padded = 8;
        let p = pack_split_rows(&flat, k, padded);
        assert_eq!(p.len(), padded * (k + 1));
        for (row, values) in rows.iter().enumerate() {
            let largest = values.iter().fold(0f64, |m, v| m.max(v.abs() as f64));
            for (c, &v) in values.iter().enumerate() {
                let back = unpacked(&p, k, padded, row, c / 4, c % 4);
                let err = (back - v as f64).abs();
                let bound = (v.abs() as f64 * 2f64.powi(-21)).max(largest * 2f64.powi(-36));
                assert!(err <= bound, "row {row} value {c}: {v} came back {back}");
            }
        }
        for row in rows.len()..padded {
            for c in 0..k {
                assert_eq!(unpacked(&p, k, padded, row, c / 4, c % 4), 0.0);
            }
        }
    }

    /// The scale takes a row's largest magnitude into [2^14, 2^15), for magnitudes from the
    /// smallest normal f32 to the largest.
    #[test]
    fn split_scale_takes_the_largest_into_range() {
        for e in -126..=127 {
            for m in [1.0f32, 1.5, 1.999] {
                let largest = m * 2f32.powi(e);
                if !largest.is_finite() {
                    continue;
                }
                let field = split_scale_field(largest.to_bits());
                let scaled = largest as f64 * 2f64.powi(field as i32 - 127);
                let inverse = f32::from_bits((254 - field) << 23) as f64;
                assert_eq!(scaled * inverse, largest as f64);
                if (-112..=112).contains(&e) {
                    assert!(
                        (16_384.0..32_768.0).contains(&scaled),
                        "2^{e} x {m}: {scaled}"
                    );
                }
            }
        }
    }
}
