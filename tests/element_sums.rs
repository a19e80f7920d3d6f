//! The first interaction block by sums per sending element (`ops::element_sums`): the CPU
//! twins against the same sums in candle ops and candle's backprop, the refusals, and the
//! fused model with and without them.

mod common;

use candle_core::{DType, Device, Tensor};
use common::element_sums::SumsCase;
use common::max_abs_diff;

/// (atoms, edges, elements, radial functions, sorted by receiver, an isolated atom).
const CASES: [(usize, usize, usize, usize, bool, bool); 5] = [
    (9, 60, 3, 5, true, false),
    (13, 200, 4, 20, false, true),
    (4, 0, 2, 20, true, true),
    (40, 300, 32, 3, true, false),
    (1, 5, 1, 28, false, false),
];

fn scale(t: &Tensor) -> f64 {
    common::max_abs_tensor(t).max(1.0)
}

#[test]
fn element_sums_match_candle_ops_and_backprop() {
    for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 2e-6)] {
        for (k, &(n, e, z, r, sorted, isolated)) in CASES.iter().enumerate() {
            let c = SumsCase::new(n, e, z, r, sorted, isolated, dtype, 70 + k as u64);
            let what = format!("{dtype:?} case {k}");
            let want = c.reference_sums(&c.basis).unwrap();
            let got = c.sums().unwrap();
            assert_eq!(got.dims(), [4 * n, z * (r + 2)], "{what}");
            let d = max_abs_diff(&got, &want);
            assert!(d <= tol * scale(&want), "{what}: sums off by {d}");
            if isolated {
                // The lone atom's rows hold its own element and nothing else.
                let lone = got.narrow(0, n - 1, 1).unwrap().sum_all().unwrap();
                assert_eq!(
                    lone.to_dtype(DType::F64)
                        .unwrap()
                        .to_scalar::<f64>()
                        .unwrap(),
                    1.0
                );
            }
            for with_prev in [false, true] {
                let want = c.reference_adjoint(with_prev).unwrap();
                let got = c.adjoint(with_prev).unwrap();
                let d = max_abs_diff(&got, &want);
                assert!(
                    d <= tol * scale(&want),
                    "{what} (prev {with_prev}): adjoint off by {d}"
                );
                assert_eq!(got.dims(), [n, 3]);
            }
        }
    }
}

#[test]
fn element_sums_name_bad_inputs() {
    let c = SumsCase::new(6, 20, 3, 4, true, false, DType::F64, 5);
    let err = |r: candle_core::Result<Tensor>| r.unwrap_err().to_string();
    let bad_species = Tensor::new(&[0u32, 1, 2, 3, 0, 1], &Device::Cpu).unwrap();
    let e = err(mlff_distiller::ops::element_sums(
        &c.basis,
        &c.centers,
        &c.neighbors,
        &bad_species,
        3,
        4,
    ));
    assert!(e.contains("atom 3") && e.contains("element index 3"), "{e}");
    let e = err(mlff_distiller::ops::element_sums(
        &c.basis,
        &c.centers,
        &c.neighbors,
        &c.species,
        33,
        4,
    ));
    assert!(e.contains("33 elements"), "{e}");
    let e = err(mlff_distiller::ops::element_sums(
        &c.basis,
        &c.centers,
        &c.neighbors,
        &c.species,
        3,
        5,
    ));
    assert!(e.contains("basis [20, 8]"), "{e}");
    let short = c.g_sums.narrow(0, 0, 5).unwrap();
    let adjoint_on = |g_plain: &Tensor, later: Option<&Tensor>, neighbors: &Tensor| {
        err(mlff_distiller::ops::element_sums_position_adjoint(
            &c.positions,
            &c.offsets,
            later,
            g_plain,
            &c.g_sums.narrow(0, 6, 18).unwrap(),
            (&c.centers, neighbors),
            &c.species,
            3,
            (4, common::element_sums::CUTOFF),
        ))
    };
    let adjoint =
        |g_plain: &Tensor, later: Option<&Tensor>| adjoint_on(g_plain, later, &c.neighbors);
    // An edge to an atom that is not there is named under the adjoint's own name.
    let mut far = c.neighbors.to_vec1::<u32>().unwrap();
    far[7] = 6;
    let far = Tensor::new(far, &Device::Cpu).unwrap();
    let e = adjoint_on(&c.g_sums.narrow(0, 0, 6).unwrap(), None, &far);
    assert!(
        e.contains("element sums position adjoint: neighbors[7] = 6 is out of range for 6 atoms"),
        "{e}"
    );
    let e = adjoint(&short, None);
    assert!(e.contains("dL/dS [5, 15] must be [6, 15]"), "{e}");
    let e = adjoint(
        &c.g_sums.narrow(0, 0, 6).unwrap(),
        Some(&c.basis.narrow(0, 0, 19).unwrap()),
    );
    assert!(e.contains("dL/d(basis) [19, 8] must be [20, 8]"), "{e}");
}

/// A model of more elements than the sums take (33) runs its first block per edge, with the
/// same energies and forces as candle's backprop; one of 32 runs it as sums.
#[test]
fn models_beyond_the_sums_element_limit_run_the_first_block_per_edge() {
    use mlff_distiller::calculator::forces_from;
    use mlff_distiller::model::Backend;
    use mlff_distiller::ops::ELEMENT_SUMS_MAX_ELEMENTS;
    use mlff_distiller::{Batch, PainnCalculator};
    for elements in [ELEMENT_SUMS_MAX_ELEMENTS, ELEMENT_SUMS_MAX_ELEMENTS + 1] {
        let cfg = mlff_distiller::model::PainnConfig {
            elements: (1..=elements as u8).collect(),
            ..common::small_config()
        };
        let model = common::model(&cfg, 3, DType::F64, &Device::Cpu);
        let calc =
            PainnCalculator::new(model, Device::Cpu, DType::F64).with_backend(Backend::Fused);
        let batch = Batch::new(vec![common::random_molecule(9, 4)]).unwrap();
        let (inputs, positions) = calc.prepare(&batch).unwrap();
        let pass = calc.fused().unwrap().forward(&inputs).unwrap();
        let energies = calc.model().atom_energies(&inputs).unwrap();
        let forces = forces_from(&energies.sum_all().unwrap(), &positions).unwrap();
        let what = format!("{elements} elements");
        assert!(
            max_abs_diff(&pass.atom_energies, &energies) < 1e-10,
            "{what}: energies"
        );
        assert!(
            max_abs_diff(&pass.forces().unwrap(), &forces) < 1e-10,
            "{what}: forces"
        );
    }
}
