//! Times every kernel of the fused path (and the cuBLAS products between them) alone, on the
//! shapes of real systems, and sets each beside its FLOP and byte floors.
//!
//!     cargo bench --features cuda --bench fused_kernel_times -- [DEVICE] [SYSTEMS] [PEAK_TFLOPS PEAK_TBS]
//!
//! DEVICE is `cuda` (default) or `cpu`; SYSTEMS a comma list of `aspirin`, `aspirin-xN` (a batch
//! of N copies) and `water-N` (default `aspirin,water-10000`). Each op runs 20 times to warm
//! up, then REPEATS times back to back between two device synchronisations: the mean is the
//! op's device time where the kernel is longer than a launch, and the launch cost where it is
//! not. Floors assume f32 on CUDA cores (a model: the interaction and dense kernels run on tensor
//! cores, so their FLOP floors here are too high; benches/gpu/kernel-profile.sh measures each
//! kernel's FLOP and bytes with Nsight Compute instead) and the peak FP32 rate and memory
//! bandwidth given as PEAK_TFLOPS and PEAK_TBS (defaults: H100 SXM, 67 and 3.35); bytes count
//! each tensor read or written once (the edge basis and weights read per edge are counted once
//! per edge, assumed cached).

use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use mlff_distiller::neighbors::batch_neighbor_list;
use mlff_distiller::ops::{self, EdgeFilter, InteractionInputs, StateGrad};
use mlff_distiller::systems::{aspirin, water_box};
use mlff_distiller::Batch;
use std::time::Instant;

const REPEATS: usize = 200;
const F: usize = 128;
const R: usize = 20;
const CUTOFF: f64 = 5.0;

struct Row {
    name: String,
    micros: f64,
    flop: f64,
    bytes: f64,
}

fn time(dev: &Device, mut op: impl FnMut() -> candle_core::Result<Tensor>) -> Result<f64> {
    for _ in 0..20 {
        op()?;
    }
    dev.synchronize()?;
    let t = Instant::now();
    for _ in 0..REPEATS {
        op()?;
    }
    dev.synchronize()?;
    Ok(t.elapsed().as_secs_f64() * 1e6 / REPEATS as f64)
}

fn system(name: &str) -> Result<Batch> {
    if let Some(copies) = name.strip_prefix("aspirin-x") {
        return Ok(Batch::new(vec![aspirin(); copies.parse::<usize>()?])?);
    }
    let s = match name.strip_prefix("water-") {
        Some(n) => water_box(n.parse::<usize>()? / 3, 0),
        None if name == "aspirin" => aspirin(),
        None => anyhow::bail!("unknown system {name} (aspirin, aspirin-xN or water-N)"),
    };
    Ok(Batch::new(vec![s])?)
}

fn rows(dev: &Device, batch: &Batch) -> Result<Vec<Row>> {
    let nl = batch_neighbor_list(batch, CUTOFF)?;
    let (n, e, f) = (batch.n_atoms(), nl.len(), F);
    let (nf, ef) = ((n * f) as f64, (e * f) as f64);
    let r = |shape: &[usize]| Tensor::randn(0f32, 1.0, shape, dev);
    let pos: Vec<f32> = batch
        .positions()
        .iter()
        .flatten()
        .map(|&x| x as f32)
        .collect();
    let pos = Tensor::from_vec(pos, (n, 3), dev)?;
    let off = Tensor::zeros((e, 3), DType::F32, dev)?;
    let ci = Tensor::new(nl.centers.as_slice(), dev)?;
    let nj = Tensor::new(nl.neighbors.as_slice(), dev)?;
    let basis = ops::edge_basis(&pos, &off, &ci, &nj, R, CUTOFF)?;
    let (phi, pb, filter, state) = (
        r(&[n, 3 * f])?,
        r(&[3 * f])?,
        r(&[R + 1, 3 * f])?,
        r(&[4 * n, f])?,
    );
    let (mixed, act, g_rows, g_s) = (
        r(&[3 * n, 2 * f])?,
        r(&[n, 3 * f])?,
        r(&[3 * n, f])?,
        r(&[n, f])?,
    );
    let (g_ctx, g_basis, w) = (r(&[n, 2 * f])?, r(&[e, R + 4])?, r(&[3 * f, 3 * f])?);
    let tuning = mlff_distiller::Tuning::default();
    let x = InteractionInputs {
        phi: &phi,
        phi_bias: &pb,
        filter: EdgeFilter::Weights(&filter),
        basis: &basis,
        state: &state,
        centers: &ci,
        neighbors: &nj,
        // A neighbour list: every edge with its reverse.
        symmetric_edges: true,
        tuning: &tuning,
    };
    let x_one_way = InteractionInputs {
        symmetric_edges: false,
        ..x
    };
    let grad = StateGrad {
        gx: &g_s,
        next: Some((&state, &g_rows, &g_rows)),
    };
    let packed = ops::update_combine_adjoint(&mixed, &act, &pb, &grad)?;
    let filter_basis = r(&[R + 4, 3 * f])?;
    let filter_rows = basis.matmul(&filter_basis)?;
    let g_filter_rows = r(&[e, 3 * f])?;
    let x_rows = InteractionInputs {
        filter: EdgeFilter::Rows(&filter_rows),
        ..x
    };
    let s = state.narrow(0, 0, n)?;
    let v = state.narrow(0, n, 3 * n)?;
    let (ed, bw) = (e as f64, (R + 4) as f64);
    let filter_flop = 2.0 * 3.0 * (R + 1) as f64;
    let mut out = vec![
        Row {
            name: "edge basis".into(),
            micros: time(dev, || ops::edge_basis(&pos, &off, &ci, &nj, R, CUTOFF))?,
            flop: ed * (R as f64 * 12.0 + 30.0),
            bytes: ed * (4.0 * (9.0 + 2.0 + bw)),
        },
        Row {
            name: "edge basis adjoint".into(),
            micros: time(dev, || {
                ops::edge_basis_adjoint(&pos, &off, &g_basis, &ci, &nj, R, CUTOFF)
            })?,
            flop: ed * (R as f64 * 16.0 + 60.0),
            bytes: ed * 4.0 * (9.0 + 2.0 + bw + 6.0),
        },
        // From TILE_FROM_EDGES (src/ops/layers/interaction_tile.rs) edges on CUDA these are the tiled
        // kernels (the adjoint for a symmetric list first); the tiled adjoints leave dL/dw as
        // rows (the "filter rows adjoint" product below maps them back; not timed here).
        Row {
            name: "interaction (filter in kernel)".into(),
            micros: time(dev, || ops::interaction(&x))?,
            flop: ef * (filter_flop + 15.0),
            bytes: 4.0 * (ef * 10.0 + ed * (bw + 2.0) + nf * 8.0),
        },
        Row {
            name: "interaction adjoint".into(),
            micros: time(dev, || {
                ops::interaction_adjoint(&x, &s, &g_rows, None).map(|t| t.v)
            })?,
            flop: ef * (2.0 * filter_flop + 2.0 * (R + 4) as f64 + 30.0),
            bytes: 4.0 * (ef * 19.0 + ed * 2.0 * (bw + 1.0) + nf * 13.0),
        },
        Row {
            name: "interaction adjoint, list not said symmetric".into(),
            micros: time(dev, || {
                ops::interaction_adjoint(&x_one_way, &s, &g_rows, None).map(|t| t.v)
            })?,
            flop: ef * (2.0 * filter_flop + 2.0 * (R + 4) as f64 + 30.0),
            bytes: 4.0 * (ef * 19.0 + ed * 2.0 * (bw + 1.0) + nf * 13.0),
        },
        Row {
            name: "filter rows: matmul [E,R+4]x[R+4,3F]".into(),
            micros: time(dev, || basis.matmul(&filter_basis))?,
            flop: ef * filter_flop,
            bytes: 4.0 * (ed * bw + ef * 3.0),
        },
        Row {
            name: "interaction (filter rows)".into(),
            micros: time(dev, || ops::interaction(&x_rows))?,
            flop: ef * 15.0,
            bytes: 4.0 * (ef * 13.0 + ed * 5.0 + nf * 8.0),
        },
        Row {
            name: "interaction adjoint (filter rows)".into(),
            micros: time(dev, || {
                ops::interaction_adjoint(&x_rows, &s, &g_rows, None).map(|t| t.v)
            })?,
            flop: ef * 30.0,
            bytes: 4.0 * (ef * 22.0 + ed * 2.0 * 5.0 + nf * 13.0),
        },
        Row {
            name: "filter rows adjoint: matmul [E,3F]x[3F,R+4]".into(),
            micros: time(dev, || g_filter_rows.matmul(&filter_basis.t()?))?,
            flop: ef * filter_flop,
            bytes: 4.0 * (ef * 3.0 + ed * bw),
        },
        Row {
            name: "update context".into(),
            micros: time(dev, || ops::update_context(&state, &mixed))?,
            flop: nf * 8.0,
            bytes: 4.0 * nf * 6.0,
        },
        Row {
            name: "update combine".into(),
            micros: time(dev, || ops::update_combine(&state, &mixed, &act, &pb))?,
            flop: nf * 16.0,
            bytes: 4.0 * nf * 17.0,
        },
        Row {
            name: "update combine adjoint".into(),
            micros: time(dev, || {
                ops::update_combine_adjoint(&mixed, &act, &pb, &grad)
            })?,
            flop: nf * 30.0,
            bytes: 4.0 * nf * 33.0,
        },
        Row {
            name: "update context adjoint".into(),
            micros: time(dev, || {
                // in place: each call adds to the same packed gradient (timed, not checked)
                ops::update_context_adjoint(&mixed, &g_ctx, packed.clone()).map(|t| t.0)
            })?,
            flop: nf * 14.0,
            bytes: 4.0 * nf * 13.0,
        },
        Row {
            name: "bias + silu [N, F]".into(),
            micros: time(dev, || {
                ops::bias_silu(&s, &g_s.narrow(0, 0, 1)?.squeeze(0)?)
            })?,
            flop: nf * 6.0,
            bytes: 4.0 * nf * 2.0,
        },
        Row {
            name: "bias + silu adjoint [N, F]".into(),
            micros: time(dev, || {
                ops::bias_silu_adjoint(&s, &g_s.narrow(0, 0, 1)?.squeeze(0)?, &g_s)
            })?,
            flop: nf * 10.0,
            bytes: 4.0 * nf * 3.0,
        },
    ];
    let products: [(&'static str, &Tensor, usize); 4] = [
        ("matmul [N,F]x[F,F]", &s, f),
        ("matmul [N,F]x[F,3F]", &s, 3 * f),
        ("matmul [3N,F]x[F,2F]", &v, 2 * f),
        ("matmul [N,2F]x[2F,F]", &g_ctx, f),
    ];
    for (name, lhs, cols) in products {
        let (m, k) = lhs.dims2()?;
        let rhs = w.narrow(0, 0, k)?.narrow(1, 0, cols)?.contiguous()?;
        out.push(Row {
            name: name.into(),
            micros: time(dev, || lhs.matmul(&rhs))?,
            flop: 2.0 * (m * k * cols) as f64,
            bytes: 4.0 * (m * k + k * cols + m * cols) as f64,
        });
    }
    if dev.is_cuda() {
        out.extend(tensor_core_rows(dev, &s, &v, &g_ctx)?);
    }
    Ok(out)
}

/// The update's mixing layer and the two MLPs (F → F → 3F on s, 2F → F → 3F on the context),
/// forward and adjoint, as cuBLAS products with the bias+SiLU kernels between them and on
/// tensor cores (`ops::dense_tc`). CUDA only: the tensor-core twins on the CPU are plain loops.
fn tensor_core_rows(dev: &Device, s: &Tensor, v: &Tensor, ctx: &Tensor) -> Result<Vec<Row>> {
    let f = F;
    let r = |shape: &[usize]| Tensor::randn(0f32, 0.1, shape, dev);
    let mut out = Vec::new();
    let mix = r(&[2 * f, f])?;
    let mix_tc = ops::tc_weights(&mix)?;
    let mix_t_tc = ops::tc_weights(&mix.t()?.contiguous()?)?;
    let g_mixed = r(&[v.dim(0)?, 2 * f])?;
    let mix_flop = 2.0 * (v.dim(0)? * f * 2 * f) as f64;
    let mix_bytes = 4.0 * (v.dim(0)? * 3 * f) as f64;
    out.push(Row {
        name: "mix [3N,F]x[F,2F], tensor cores".into(),
        micros: time(dev, || ops::dense_tc(v, &mix_tc))?,
        flop: mix_flop,
        bytes: mix_bytes,
    });
    out.push(Row {
        name: "mix adjoint [3N,2F]x[2F,F], matmul".into(),
        micros: time(dev, || g_mixed.matmul(&mix))?,
        flop: mix_flop,
        bytes: mix_bytes,
    });
    out.push(Row {
        name: "mix adjoint [3N,2F]x[2F,F], tensor cores".into(),
        micros: time(dev, || ops::dense_tc(&g_mixed, &mix_t_tc))?,
        flop: mix_flop,
        bytes: mix_bytes,
    });
    for (label, x) in [("phi MLP F>F>3F", s), ("context MLP 2F>F>3F", ctx)] {
        let (n, k) = x.dims2()?;
        let (w1, b1, w2) = (r(&[f, k])?, r(&[f])?, r(&[3 * f, f])?);
        let padded_t = |w: &Tensor| ops::tc_weights(&w.t()?.contiguous()?);
        let (w1s, w2s) = (ops::tc_weights(&w1)?, ops::tc_weights(&w2)?);
        let (w1t, w2t) = (padded_t(&w1)?, padded_t(&w2)?);
        let g = r(&[n, 3 * f])?;
        let pre = x.matmul(&w1.t()?)?;
        let flop = 2.0 * (n * (k * f + f * 3 * f)) as f64;
        let bytes = 4.0 * (n * (k + 2 * f + 3 * f)) as f64;
        let timed: [(&str, &dyn Fn() -> candle_core::Result<Tensor>); 4] = [
            ("forward, matmul + bias/SiLU", &|| {
                let pre = x.matmul(&w1.t()?)?;
                ops::bias_silu(&pre, &b1)?.matmul(&w2.t()?)
            }),
            ("forward, tensor cores", &|| {
                Ok(ops::mlp_tc(x, &w1s, &b1, &w2s)?.1)
            }),
            ("adjoint, matmul + bias/SiLU", &|| {
                let g_h = g.matmul(&w2)?;
                ops::bias_silu_adjoint(&pre, &b1, &g_h)?.matmul(&w1)
            }),
            ("adjoint, tensor cores", &|| {
                ops::mlp_tc_adjoint(&g, &pre, &b1, &w2t, &w1t)
            }),
        ];
        for (what, op) in timed {
            out.push(Row {
                name: format!("{label} {what}"),
                micros: time(dev, op)?,
                flop,
                bytes,
            });
        }
    }
    Ok(out)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let dev = match args.get(1).map(String::as_str) {
        Some("cpu") => Device::Cpu,
        _ => Device::new_cuda(0)?,
    };
    let systems = args
        .get(2)
        .map(String::as_str)
        .unwrap_or("aspirin,water-10000");
    let arg = |k: usize, d: f64| -> Result<f64> {
        args.get(k).map_or(Ok(d), |v| {
            v.parse()
                .map_err(|_| anyhow::anyhow!("argument {k}: `{v}` is not a number"))
        })
    };
    let (tflops, tbs) = (arg(3, 67.0)?, arg(4, 3.35)?);
    for name in systems.split(',') {
        let batch = system(name)?;
        let nl = batch_neighbor_list(&batch, CUTOFF)?;
        println!(
            "\n### {name}: {} atoms, {} edges, F = {F}, R = {R}, f32\n",
            batch.n_atoms(),
            nl.len()
        );
        println!("| op | µs | GFLOP | MB | floor µs (FLOP) | floor µs (bytes) | % of floor |");
        println!("|---|---:|---:|---:|---:|---:|---:|");
        for r in rows(&dev, &batch)? {
            let (tf, tb) = (r.flop / (tflops * 1e6), r.bytes / (tbs * 1e6));
            println!(
                "| {} | {:.1} | {:.4} | {:.2} | {:.2} | {:.2} | {:.0} |",
                r.name,
                r.micros,
                r.flop / 1e9,
                r.bytes / 1e6,
                tf,
                tb,
                100.0 * tf.max(tb) / r.micros
            );
        }
    }
    Ok(())
}
