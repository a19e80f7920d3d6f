//! The custom gather/scatter-add ops against candle's index_select/index_add, their gradients
//! and second-order gradients (what training on forces needs).

mod common;

use candle_core::{DType, Device, Tensor, Var};
use mlff_distiller::model::Backend;
use mlff_distiller::ops::{gather, scatter_add};

fn idx(v: &[u32]) -> Tensor {
    Tensor::new(v, &Device::Cpu).unwrap()
}

fn assert_close(a: &Tensor, b: &Tensor, tol: f64) {
    let d = common::max_abs_diff(a, b);
    assert!(d <= tol, "max difference {d} > {tol}");
}

#[test]
fn gather_and_scatter_match_candle() {
    let dev = Device::Cpu;
    for dtype in [DType::F32, DType::F64] {
        let x = Tensor::randn(0f32, 1.0, (7, 3, 5), &dev)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let i = idx(&[6, 0, 0, 3, 2, 6, 6, 1, 4, 4, 5]);
        assert_close(
            &gather(&x, &i).unwrap(),
            &x.index_select(&i, 0).unwrap(),
            0.0,
        );
        let src = gather(&x, &i).unwrap();
        let targets = idx(&[0, 1, 1, 1, 3, 3, 0, 2, 2, 2, 2]);
        let ours = scatter_add(&src, &targets, 5).unwrap();
        let stock = Backend::Stock.scatter_add(&src, &targets, 5).unwrap();
        assert_close(&ours, &stock, 1e-6);
        assert_eq!(ours.dims(), &[5, 3, 5]);
    }
}

#[test]
fn empty_inputs() {
    let x = Tensor::zeros((4, 2), DType::F32, &Device::Cpu).unwrap();
    let empty = Tensor::zeros(0, DType::U32, &Device::Cpu).unwrap();
    assert_eq!(gather(&x, &empty).unwrap().dims(), &[0, 2]);
    let src = Tensor::zeros((0, 2), DType::F32, &Device::Cpu).unwrap();
    let out = scatter_add(&src, &empty, 3).unwrap();
    assert_eq!(out.to_vec2::<f32>().unwrap(), vec![vec![0.0; 2]; 3]);
}

#[test]
fn out_of_range_index_is_an_error() {
    let x = Tensor::zeros((4, 2), DType::F32, &Device::Cpu).unwrap();
    let err = gather(&x, &idx(&[0, 4])).unwrap_err().to_string();
    assert!(
        err.contains("index[1] = 4") && err.contains("4 rows"),
        "{err}"
    );
    let err = scatter_add(&x, &idx(&[0, 1, 2, 9]), 3)
        .unwrap_err()
        .to_string();
    assert!(err.contains("index[3] = 9"), "{err}");
    let err = scatter_add(&x, &idx(&[0, 1]), 3).unwrap_err().to_string();
    assert!(err.contains("does not match"), "{err}");
}

/// L = Σ_e w_e x[g_e]³ summed into rows s_e, then L2 = Σ c ⊙ ∂L/∂x. Checks the first and the
/// second derivative against the closed forms, for our ops and for candle's.
#[test]
fn first_and_second_order_gradients() {
    // Must be set before the first backward on this thread (candle detaches otherwise).
    std::env::set_var("CANDLE_GRAD_DO_NOT_DETACH", "1");
    let dev = Device::Cpu;
    let xs = [0.3f64, -1.2, 0.7, 2.0];
    let g = [3u32, 0, 0, 2, 1, 3];
    let s = [0u32, 1, 1, 0, 2, 2];
    let w = [0.5f64, -1.0, 2.0, 1.5, -0.7, 0.25];
    let c = [1.0f64, -2.0, 0.5, 3.0];
    for ops in [Backend::Autograd, Backend::Stock] {
        let x = Var::new(&xs, &dev).unwrap();
        let gathered = ops.gather(x.as_tensor(), &idx(&g)).unwrap();
        let terms = (gathered.powf(3.0).unwrap() * Tensor::new(&w, &dev).unwrap()).unwrap();
        let loss = ops
            .scatter_add(&terms, &idx(&s), 3)
            .unwrap()
            .sum_all()
            .unwrap();
        let grad = loss.backward().unwrap().get(x.as_tensor()).unwrap().clone();
        let loss2 = (&grad * Tensor::new(&c, &dev).unwrap())
            .unwrap()
            .sum_all()
            .unwrap();
        let hess_c = loss2
            .backward()
            .unwrap()
            .get(x.as_tensor())
            .unwrap()
            .clone();
        let mut want1 = [0.0; 4];
        let mut want2 = [0.0; 4];
        for e in 0..g.len() {
            let j = g[e] as usize;
            want1[j] += 3.0 * w[e] * xs[j] * xs[j];
            want2[j] += 6.0 * w[e] * xs[j] * c[j];
        }
        assert_close(&grad, &Tensor::new(&want1, &dev).unwrap(), 1e-12);
        assert_close(&hess_c, &Tensor::new(&want2, &dev).unwrap(), 1e-12);
    }
}
