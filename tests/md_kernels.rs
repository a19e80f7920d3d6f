//! The MD integrator's kernels (ops::md_*): their CPU twins against the candle ops they replace,
//! and the in-place forms a replayed step writes with against the plain ones (on CUDA they run
//! in the MD tests of tests/gpu and tests/gpu_graphs, against CPU and op-by-op runs).

use candle_core::{DType, Device};
/// The integrator's kernels (their CPU twins here) give exactly what the candle ops they
/// replace gave: the kick, the NVE and Langevin steps up to the force call, the Verlet check
/// (and a NaN reaches its sum); wrong dtypes or lengths are errors naming the tensor.
#[test]
fn integrator_kernels_equal_the_candle_ops() {
    use candle_core::Tensor;
    use mlff_distiller::ops::{md_advance, md_displacement2, md_kick, LangevinNoise};
    let cpu = Device::Cpu;
    let n = 37;
    let r = |seed: f64| {
        let v: Vec<f64> = (0..3 * n)
            .map(|k| ((k as f64 + seed) * 0.37).sin())
            .collect();
        Tensor::from_vec(v, (n, 3), &cpu).unwrap()
    };
    let col = |seed: f64| {
        let v: Vec<f64> = (0..n)
            .map(|k| 0.01 + ((k as f64 + seed) * 0.11).cos().abs())
            .collect();
        Tensor::from_vec(v, (n, 1), &cpu).unwrap()
    };
    let (x, v, f, xi, hk, scale) = (r(1.0), r(2.0), r(3.0), r(4.0), col(5.0), col(6.0));
    let (dt, c1) = (0.049, 0.93);
    let same = |a: &Tensor, b: &Tensor| {
        assert_eq!(a.to_vec2::<f64>().unwrap(), b.to_vec2::<f64>().unwrap());
    };
    let kicked = (&v + f.broadcast_mul(&hk).unwrap()).unwrap();
    same(&md_kick(&v, &f, &hk).unwrap(), &kicked);
    let (x1, v1) = md_advance(&x, &v, &f, &hk, dt, None).unwrap();
    same(&x1, &(&x + (&kicked * dt).unwrap()).unwrap());
    same(&v1, &kicked);
    let noise = LangevinNoise {
        xi: &xi,
        scale: &scale,
        c1,
    };
    let (x2, v2) = md_advance(&x, &v, &f, &hk, dt, Some(noise)).unwrap();
    let half = 0.5 * dt;
    let xa = (&x + (&kicked * half).unwrap()).unwrap();
    let vo = ((&kicked * c1).unwrap() + xi.broadcast_mul(&scale).unwrap()).unwrap();
    same(&x2, &(&xa + (&vo * half).unwrap()).unwrap());
    same(&v2, &vo);
    let d2 = (&x1 - &x).unwrap().sqr().unwrap().sum(1).unwrap();
    let want = [
        d2.sum_all().unwrap().to_scalar::<f64>().unwrap(),
        d2.max(0).unwrap().to_scalar::<f64>().unwrap(),
    ];
    assert_eq!(
        md_displacement2(&x1, &x).unwrap().to_vec1::<f64>().unwrap(),
        want
    );
    let mut bad = x1.flatten_all().unwrap().to_vec1::<f64>().unwrap();
    bad[40] = f64::NAN;
    let bad = Tensor::from_vec(bad, (n, 3), &cpu).unwrap();
    assert!(md_displacement2(&bad, &x)
        .unwrap()
        .to_vec1::<f64>()
        .unwrap()[0]
        .is_nan());
    let f32_v = v.to_dtype(DType::F32).unwrap();
    let err = md_kick(&f32_v, &f, &hk).unwrap_err().to_string();
    assert!(err.contains("v must be f64"), "{err}");
    let err = md_advance(&x, &v, &f, &col(1.0).narrow(0, 0, 5).unwrap(), dt, None).unwrap_err();
    assert!(err.to_string().contains("half_kick"), "{err}");
}

/// The in-place forms a replayed MD step writes its buffers with equal the plain kernels: the
/// step up to the force call into a scratch, the check into its slot, and the closing kick
/// with positions, forces and energies packed into the next state, at an offset into a
/// larger buffer; a target of the wrong size, or one an input lives in, is refused.
#[test]
fn in_place_integrator_kernels_equal_the_plain_ones() {
    use candle_core::{Tensor, Var};
    use mlff_distiller::ops::{
        md_advance, md_advance_into, md_displacement2, md_displacement2_into, md_finish_into,
        md_kick, LangevinNoise,
    };
    let cpu = Device::Cpu;
    let n = 11;
    let r = |seed: f64, k: usize| {
        let v: Vec<f64> = (0..k).map(|j| ((j as f64 + seed) * 0.29).sin()).collect();
        Tensor::from_vec(v, k, &cpu).unwrap()
    };
    let rows = |seed: f64| r(seed, 3 * n).reshape((n, 3)).unwrap();
    let (x, v, f, xi) = (rows(1.0), rows(2.0), rows(3.0), rows(4.0));
    let hk = (r(5.0, n).abs().unwrap() + 0.01)
        .unwrap()
        .reshape((n, 1))
        .unwrap();
    let scale = r(6.0, n).abs().unwrap().reshape((n, 1)).unwrap();
    let e = r(7.0, 3);
    let noise = LangevinNoise {
        xi: &xi,
        scale: &scale,
        c1: 0.9,
    };
    let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f64>().unwrap();
    let scratch = Var::from_tensor(&Tensor::zeros(6 * n, DType::F64, &cpu).unwrap()).unwrap();
    for langevin in [None, Some(noise)] {
        md_advance_into(scratch.as_tensor(), &x, &v, &f, &hk, 0.05, langevin).unwrap();
        let (x1, v1) = md_advance(&x, &v, &f, &hk, 0.05, langevin).unwrap();
        assert_eq!(flat(scratch.as_tensor()), [flat(&x1), flat(&v1)].concat());
    }
    // The packed state at an offset of 5 into its buffer.
    let buffer =
        Var::from_tensor(&Tensor::zeros(9 * n + 3 + 5, DType::F64, &cpu).unwrap()).unwrap();
    let state = buffer.narrow(0, 5, 9 * n + 3).unwrap();
    md_finish_into(&state, &x, &v, &f, &hk, &e).unwrap();
    let kicked = md_kick(&v, &f, &hk).unwrap();
    let want = [flat(&x), flat(&kicked), flat(&f), flat(&e)].concat();
    assert_eq!(flat(&state), want);
    assert_eq!(flat(&buffer.narrow(0, 0, 5).unwrap()), [0.0; 5]);
    let slot = Var::from_tensor(&Tensor::zeros(2, DType::F64, &cpu).unwrap()).unwrap();
    md_displacement2_into(slot.as_tensor(), &v, &x).unwrap();
    assert_eq!(
        flat(slot.as_tensor()),
        flat(&md_displacement2(&v, &x).unwrap())
    );
    // Wrong sizes, and a target an input lives in.
    let err = md_finish_into(&state.narrow(0, 1, 9 * n).unwrap(), &x, &v, &f, &hk, &e);
    assert!(err.unwrap_err().to_string().contains("target"));
    let err = md_displacement2_into(&scratch.as_tensor().narrow(0, 0, 3).unwrap(), &x, &v);
    assert!(err.unwrap_err().to_string().contains("target"));
    let x_in_state = state.narrow(0, 0, 3 * n).unwrap().reshape((n, 3)).unwrap();
    let err = md_finish_into(&state, &x_in_state, &v, &f, &hk, &e).unwrap_err();
    assert!(err.to_string().contains("shares the target"), "{err}");
}
