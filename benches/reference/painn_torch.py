#!/usr/bin/env python3
"""PyTorch reference of the mlff-distiller PaiNN: same maths, same weights, same inputs.

Loads our safetensors checkpoint and the per-system inputs that `mlff bench --export DIR`
writes (positions, species, edges, image offsets and our energies/forces), checks that PyTorch
gives the same energies and forces, and times energy+forces in three forms:

  eager    the model as written, forces by torch.autograd.grad of the energy;
  graph    the same call captured once as a CUDA graph and replayed;
  compile  the form a PyTorch user reaches for first: the whole energy+forces function through
           torch.compile (inductor, dynamic=False, fullgraph), captured as a CUDA graph and
           replayed (--compile-mode reduce-overhead: inductor's own CUDA graphs instead).

    python3 benches/reference/painn_torch.py MODEL.safetensors DIR [--json OUT.json]
        [--device cuda|cpu] [--forms eager,graph,compile] [--no-compile]
        [--compile-variant auto|whole|forward] [--compile-mode default|reduce-overhead|...]
        [--compile-budget 90] [--compile-systems aspirin,aspirin-x64,water-10000]

The compiled form is compiled afresh for each system (torch._dynamo.reset(): static shapes, and
no system runs into dynamo's recompile limit); its first call is timed apart as compile_s and
never counted in the timings. Its energies and forces must agree with ours within
|dF| <= F_TOL and |dE| <= E_TOL_ABS + E_TOL_REL * |E|; otherwise the table says FAIL, the
form is not timed, and the script exits 1 once every system has run. A compilation that raises
(an inductor error, say) is recorded in the JSON (compile_error) and printed as n/a.
--compile-variant: `whole` traces torch.autograd.grad into the one compiled graph
(torch._dynamo.config.trace_autograd_ops, PyTorch >= 2.11); `forward` compiles the energy and
lets autograd run the backward that AOTAutograd compiled with it; `auto` (default) tries whole,
then forward. --compile-budget caps the wall seconds the compiled form takes over all systems
(compilation, capture and timing; 0 for none): later systems are recorded as skipped, so that a
caller's timeout still finds every eager and graph row (rows and the JSON are written as each
system finishes).

On --device cpu there are no CUDA graphs: the graph column is nan and the compiled column times
the compiled function itself (an agreement check, not a benchmark).

Needs torch and safetensors. Prints a markdown table. Without cargo, make_test_export.py
beside this file writes a smoke-test DIR (its energies and forces are PyTorch's, not ours).
"""
import argparse
import json
import math
import pathlib
import sys
import time

import torch
from safetensors import safe_open
from safetensors.torch import load_file

F_TOL = 1e-3  # eV/Å, as md_torch.py checks its forces against the exported ones
# eV, and a fraction of |E|: PyTorch's f32 totals differ from ours by ~1e-6 |E| (0.56 eV of
# 4.6e5 eV at 10,000 atoms), the molecules' by ~1e-4 eV.
E_TOL_ABS, E_TOL_REL = 1e-3, 1e-5
FORMS = ("eager", "graph", "compile")


class PaiNN(torch.nn.Module):
    """The model of src/model/*.rs, written with plain tensor ops (index_add for scatters)."""

    def __init__(self, path, device, dtype):
        super().__init__()
        with safe_open(path, "pt") as f:
            self.cfg = json.loads(f.metadata()["config"])
        w = {k: v.to(device=device, dtype=dtype) for k, v in load_file(path).items()}
        self.w = w
        self.F = self.cfg["hidden"]

    def lin(self, x, name, bias=True):
        y = x @ self.w[name + ".weight"].T
        return y + self.w[name + ".bias"] if bias else y

    def forward(self, species, pos, centers, neighbors, offsets, atom_structure, n_structures):
        F, c = self.F, self.cfg
        n = pos.shape[0]
        r = pos[neighbors] - pos[centers] + offsets
        d = torch.sqrt((r * r).sum(1))
        direction = r / d[:, None]
        width = c["cutoff"] / (c["n_rbf"] - 1)
        mu = torch.arange(c["n_rbf"], device=pos.device, dtype=pos.dtype) * width
        rbf = torch.exp(-0.5 / width**2 * (d[:, None] - mu) ** 2)
        fcut = 0.5 * (torch.cos(math.pi * d / c["cutoff"]) + 1.0) * (d < c["cutoff"]).to(pos.dtype)
        filters = self.lin(rbf, "filter") * fcut[:, None]
        s = self.w["embedding.weight"][species]
        v = torch.zeros(n, 3, F, device=pos.device, dtype=pos.dtype)
        for k in range(c["n_blocks"]):
            p = f"blocks.{k}."
            phi = self.lin(torch.nn.functional.silu(self.lin(s, p + "message.context1")), p + "message.context2")
            x = phi[neighbors] * filters[:, 3 * F * k: 3 * F * (k + 1)]
            ds, dv_dir, dv_v = torch.split(x, F, dim=1)
            dv = dv_dir[:, None, :] * direction[:, :, None] + dv_v[:, None, :] * v[neighbors]
            s = s + torch.zeros_like(s).index_add(0, centers, ds)
            v = v + torch.zeros_like(v).index_add(0, centers, dv)
            mixed = self.lin(v, p + "update.mix", bias=False)
            v_u, v_v = torch.split(mixed, F, dim=2)
            v_v_norm = torch.sqrt((v_v * v_v).sum(1) + 1e-8)
            a = self.lin(torch.nn.functional.silu(self.lin(torch.cat([s, v_v_norm], 1), p + "update.context1")),
                         p + "update.context2")
            a_ss, a_vv, a_sv = torch.split(a, F, dim=1)
            s = s + a_ss + a_sv * (v_u * v_v).sum(1)
            v = v + a_vv[:, None, :] * v_u
        y = self.lin(torch.nn.functional.silu(self.lin(s, "readout.hidden")), "readout.out").squeeze(1)
        e_atom = y * self.w["readout.scale"] + self.w["readout.shift"] + self.w["readout.atom_ref"][species]
        return torch.zeros(n_structures, device=pos.device, dtype=pos.dtype).index_add(0, atom_structure, e_atom)


def energy_forces(model, x, pos):
    pos = pos.detach().requires_grad_(True)
    e = model(x["species"], pos, x["centers"], x["neighbors"], x["offsets"], x["atom_structure"], x["n"])
    (g,) = torch.autograd.grad(e.sum(), pos)
    return e.detach(), -g


def compiled_energy_forces(model, n_structures, variant, mode=None):
    """energy_forces through torch.compile (inductor, static shapes, fullgraph), as
    fn(x, pos) -> (energies, forces). `whole` compiles the energy and its torch.autograd.grad
    as one graph (dynamo traces autograd ops where torch._dynamo.config.trace_autograd_ops
    exists, PyTorch >= 2.11); `forward` compiles the energy, and autograd runs the backward
    that AOTAutograd compiled with it (two graphs). Compilation happens at the first call. The positions are made a leaf
    that requires grad outside the compiled function, as the eager form does inside it."""
    def energy(species, p, centers, neighbors, offsets, atom_structure):
        return model(species, p, centers, neighbors, offsets, atom_structure, n_structures)

    def args(x, pos):
        return (x["species"], pos.detach().requires_grad_(True), x["centers"], x["neighbors"],
                x["offsets"], x["atom_structure"])

    opts = dict(backend="inductor", dynamic=False, fullgraph=True)
    if mode not in (None, "default"):
        opts["mode"] = mode
    if variant == "whole":
        if not hasattr(torch._dynamo.config, "trace_autograd_ops"):
            raise RuntimeError(f"PyTorch {torch.__version__} cannot trace torch.autograd.grad "
                               "(no torch._dynamo.config.trace_autograd_ops)")
        torch._dynamo.config.trace_autograd_ops = True

        def whole(species, p, centers, neighbors, offsets, atom_structure):
            e = energy(species, p, centers, neighbors, offsets, atom_structure)
            (g,) = torch.autograd.grad(e.sum(), p)
            return e.detach(), -g
        compiled = torch.compile(whole, **opts)
        return lambda x, pos: compiled(*args(x, pos))
    if variant == "forward":
        compiled = torch.compile(energy, **opts)

        def forward(x, pos):
            a = args(x, pos)
            e = compiled(*a)
            (g,) = torch.autograd.grad(e.sum(), a[1])
            return e.detach(), -g
        return forward
    raise ValueError(f"compile variant {variant!r}: whole or forward")


def inductor_graphs(mode):
    """Whether torch.compile's `mode` replays CUDA graphs of its own (then we capture none)."""
    return mode in ("reduce-overhead", "max-autotune")


def compile_first(model, x, pos, variant, mode, cuda):
    """The compiled form of `variant` (auto: whole, then forward where whole raises) after its
    first call: (fn, the variant that compiled, seconds of the first call, that call's output,
    errors of the variants that failed). With inductor's CUDA graphs fn marks a new step first."""
    errors = []
    for v in (("whole", "forward") if variant == "auto" else (variant,)):
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        try:
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            compiled = compiled_energy_forces(model, x["n"], v, mode)
            if inductor_graphs(mode):
                def fn(x, pos, compiled=compiled):
                    torch.compiler.cudagraph_mark_step_begin()
                    return compiled(x, pos)
            else:
                fn = compiled
            e, f = fn(x, pos)
            e, f = e.clone(), f.clone()  # inductor's graphs overwrite their outputs at the next call
            if cuda:
                torch.cuda.synchronize()
            return fn, v, time.perf_counter() - t0, (e, f), errors
        except Exception as err:  # noqa: BLE001 -- an inductor error must not end the run
            first = (str(err).strip().splitlines() or [""])[0]
            errors.append(f"{v}: {type(err).__name__}: {first[:300]}")
    raise RuntimeError("; ".join(errors))


def time_ms(fn, warmup, repeats, cuda):
    """Median and minimum wall time of fn() in ms (CUDA events on the GPU)."""
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2], times[0]


def capture(ef, pos, warmups=3):
    """energy+forces `ef(pos)` on static inputs as a CUDA graph, warmed up on a side stream:
    (graph, its energies, its forces)."""
    static_pos = pos.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmups):
            ef(static_pos)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_e, static_f = ef(static_pos)
    graph.replay()
    torch.cuda.synchronize()
    return graph, static_e, static_f


def graph_replay(model, x, pos, f_eager, warmup, repeats):
    """Captures energy+forces on static inputs as a CUDA graph; returns (timing, max |dF|)."""
    graph, _, static_f = capture(lambda p: energy_forces(model, x, p), pos)
    return time_ms(graph.replay, warmup, repeats, True), (static_f - f_eager).abs().max().item()


def disagreement(e, f, e_ref, f_ref, e_rel=E_TOL_REL):
    """(max |dE|, max |dF|, what exceeds the tolerance or None); `e_rel`: the energies'
    tolerance as a fraction of |E| (beside E_TOL_ABS)."""
    de, df = (e - e_ref).abs(), (f - f_ref).abs().max().item()
    bad = []
    if not df <= F_TOL:  # also catches nan
        bad.append(f"max |dF| {df:.2e} > {F_TOL:g} eV/Å")
    if not bool((de <= E_TOL_ABS + e_rel * e_ref.abs()).all()):
        bad.append(f"max |dE| {de.max().item():.2e} eV beyond {E_TOL_ABS:g} + {e_rel:g}|E|")
    return de.max().item(), df, "; ".join(bad) or None


def compiled_form(model, x, pos, ref, f_eager, a, cuda):
    """The compiled form's keys of one system's row: compile_status (ok, FAIL: why, error, or
    skipped: why), the variant and mode, compile_s (the first call), the compiled function's
    own time (compile_median_ms: on the GPU without our graph, or with inductor's under
    reduce-overhead), the replayed graph's (compile_graph_median_ms), the agreement with ours
    (of the first call and of the replayed graph, the worse) and with eager, and the number of
    graphs dynamo compiled (1 unless something recompiled)."""
    r = dict(compile_status="error", compile_variant=None, compile_mode=a.compile_mode,
             compile_s=math.nan, compile_median_ms=math.nan, compile_min_ms=math.nan,
             compile_graph_median_ms=math.nan, compile_graph_min_ms=math.nan,
             compile_max_de_vs_mlff=math.nan, compile_max_df_vs_mlff=math.nan,
             compile_max_df_vs_eager=math.nan, compile_graphs=None, compile_error=None)
    graph = None
    try:
        fn, r["compile_variant"], r["compile_s"], (e, f), errors = compile_first(
            model, x, pos, a.compile_variant, a.compile_mode, cuda)
        r["compile_error"] = "; ".join(errors) or None  # a variant that failed before one compiled
        r["compile_max_df_vs_eager"] = (f - f_eager).abs().max().item()
        de, df, bad = disagreement(e, f, *ref, e_rel=a.compile_energy_rel)
        if not bad and cuda and not inductor_graphs(a.compile_mode):  # ours: capture, check replay
            graph, ge, gf = capture(lambda p: fn(x, p), pos, warmups=max(3, a.compile_warmup))
            gde, gdf, bad = disagreement(ge, gf, *ref, e_rel=a.compile_energy_rel)
            de, df = max(de, gde), max(df, gdf)
        elif not bad:  # warm up (inductor's graphs record on a later call), then check again
            for _ in range(a.compile_warmup):
                fn(x, pos)
            ge, gf = fn(x, pos)
            gde, gdf, bad = disagreement(ge, gf, *ref, e_rel=a.compile_energy_rel)
            de, df = max(de, gde), max(df, gdf)
        r["compile_max_de_vs_mlff"], r["compile_max_df_vs_mlff"] = de, df
        if bad:
            r["compile_status"] = f"FAIL: {bad}"
            return r
        r["compile_median_ms"], r["compile_min_ms"] = time_ms(lambda: fn(x, pos), a.compile_warmup,
                                                              a.repeats, cuda)
        if graph is not None:
            r["compile_graph_median_ms"], r["compile_graph_min_ms"] = time_ms(graph.replay, a.warmup,
                                                                              a.repeats, True)
        elif cuda:  # inductor's CUDA graphs: the call replays them
            r["compile_graph_median_ms"], r["compile_graph_min_ms"] = r["compile_median_ms"], r["compile_min_ms"]
        r["compile_graphs"] = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        r["compile_status"] = "ok"
    except Exception as err:  # noqa: BLE001 -- recorded, the other systems still run
        r["compile_error"] = f"{type(err).__name__}: {str(err).strip()[:2000]}"
    finally:
        del graph
        torch._dynamo.reset()
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    return r


def model_on(path, device, script, cpu_hint):
    """The checkpoint's model in f32 on `device` (cuda or cpu), the torch device, and whether it
    is CUDA; exits naming `script` where CUDA is asked for and absent."""
    cuda = device == "cuda"
    if cuda and not torch.cuda.is_available():
        sys.exit(f"{script}: no CUDA device (use --device cpu {cpu_hint})")
    dev = torch.device(device)
    return PaiNN(path, dev, torch.float32), dev, cuda


def cell(r, key, fmt=".3f"):
    v = r[key]
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)


def compile_cells(r):
    """The table's compiled columns of row r: time, compile seconds, max |dF| vs mlff."""
    status = r.get("compile_status")
    if status == "ok":
        timed = "compile_median_ms" if math.isnan(r["compile_graph_median_ms"]) else "compile_graph_median_ms"
        return [cell(r, timed), cell(r, "compile_s", ".1f"), cell(r, "compile_max_df_vs_mlff", ".1e")]
    if status and status.startswith("FAIL"):
        return ["**FAIL**", cell(r, "compile_s", ".1f"), f"**{cell(r, 'compile_max_df_vs_mlff', '.1e')}**"]
    if status == "error":
        return ["n/a (error)", "n/a", "n/a"]
    return ["n/a (skipped)" if status else "n/a", "n/a", "n/a"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("systems", help="directory written by `mlff bench --export`")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--json")
    ap.add_argument("--device", default="cuda", help="cuda (timings + graphs) or cpu (agreement check)")
    ap.add_argument("--forms", default=",".join(FORMS),
                    help="forms to time, comma-separated, of eager,graph,compile (agreement with "
                         "ours is checked for eager always)")
    ap.add_argument("--no-compile", action="store_true", help="leave the compiled form out")
    ap.add_argument("--compile-variant", default="auto", choices=("auto", "whole", "forward"))
    ap.add_argument("--compile-mode", default="default",
                    choices=("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"),
                    help="torch.compile mode; reduce-overhead and max-autotune replay inductor's "
                         "own CUDA graphs instead of ours")
    ap.add_argument("--compile-warmup", type=int, default=10,
                    help="calls of the compiled form after its first (the compilation) and before "
                         "capture and timing")
    ap.add_argument("--compile-budget", type=float, default=90.0,
                    help="wall seconds the compiled form may take over all systems; later systems "
                         "are skipped (0: no limit)")
    ap.add_argument("--compile-energy-rel", type=float, default=E_TOL_REL,
                    help="the compiled form's energy tolerance as a fraction of |E| (its forces keep "
                         "the common tolerance); the table and JSON give its max |dE| either way")
    ap.add_argument("--compile-systems", help="systems (file stems) to compile, comma-separated; default all")
    a = ap.parse_args()
    forms = {f.strip() for f in a.forms.split(",") if f.strip()}
    if forms - set(FORMS):
        ap.error(f"--forms: unknown {sorted(forms - set(FORMS))}; of {','.join(FORMS)}")
    if a.no_compile:
        forms.discard("compile")
    only = set(a.compile_systems.split(",")) if a.compile_systems else None
    model, dev, cuda = model_on(a.model, a.device, "painn_torch.py", "for the agreement check only")
    device_name = torch.cuda.get_device_name() if cuda else "cpu"
    print(f"PyTorch {torch.__version__}, {device_name}, float32")
    head = "| system | atoms | edges | eager median ms | CUDA graph median ms | max dE vs mlff eV | max dF vs mlff eV/Å |"
    rule = "|---|---:|---:|---:|---:|---:|---:|"
    if "compile" in forms:
        what = "compile+graph" if cuda else "compiled"
        if a.compile_mode != "default":
            what += f" ({a.compile_mode})"
        head += f" {what} median ms | compile s | compiled max dF vs mlff eV/Å |"
        rule += "---:|---:|---:|"
    print(head)
    print(rule, flush=True)
    rows, spent, failed = [], 0.0, False
    for path in sorted(pathlib.Path(a.systems).glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            n_structures = int(f.metadata()["n_structures"])
        t = {k: v.to(dev) for k, v in load_file(str(path)).items()}
        x = {k: t[k].long() for k in ("species", "centers", "neighbors", "atom_structure")}
        x["offsets"], x["n"] = t["offsets"].float(), n_structures
        pos = t["positions"].float().clone()
        ref = (t["energies"].float(), t["forces"].float())
        e, f = energy_forces(model, x, pos)
        de = (e - t["energies"]).abs().max().item()
        df = (f - t["forces"]).abs().max().item()
        nan2 = (math.nan,) * 2
        eager = time_ms(lambda: energy_forces(model, x, pos), a.warmup, a.repeats, cuda) if "eager" in forms else nan2
        replay, dg = (graph_replay(model, x, pos, f, a.warmup, a.repeats) if cuda and "graph" in forms
                      else (nan2, math.nan))
        row = dict(system=path.stem, atoms=pos.shape[0], edges=x["centers"].shape[0],
                   eager_median_ms=eager[0], eager_min_ms=eager[1],
                   graph_median_ms=replay[0], graph_min_ms=replay[1],
                   max_de_vs_mlff=de, max_df_vs_mlff=df, max_df_graph_vs_eager=dg)
        if "compile" in forms:
            if only is not None and path.stem not in only:
                row["compile_status"] = "skipped: not in --compile-systems"
            elif a.compile_budget > 0 and spent >= a.compile_budget:
                row["compile_status"] = f"skipped: --compile-budget {a.compile_budget:g} s spent"
            else:
                t0 = time.perf_counter()
                row.update(compiled_form(model, x, pos, ref, f, a, cuda))
                spent += time.perf_counter() - t0
                failed |= row["compile_status"].startswith("FAIL")
        print(json.dumps(row), file=sys.stderr, flush=True)
        rows.append(row)
        line = (f"| {row['system']} | {row['atoms']} | {row['edges']} | {row['eager_median_ms']:.3f} | "
                f"{row['graph_median_ms']:.3f} | {row['max_de_vs_mlff']:.1e} | {row['max_df_vs_mlff']:.1e} |")
        if "compile" in forms:
            line += " " + " | ".join(compile_cells(row)) + " |"
        print(line, flush=True)
        if a.json:  # after every system, so that a caller's timeout keeps the rows so far
            pathlib.Path(a.json).write_text(json.dumps(dict(
                torch=torch.__version__, device=device_name, forms=sorted(forms),
                tolerance=dict(max_df=F_TOL, max_de_abs=E_TOL_ABS, max_de_rel=E_TOL_REL),
                cases=rows), indent=1))
    if failed:
        sys.exit("painn_torch.py: the compiled form disagrees with mlff (FAIL rows above)")


if __name__ == "__main__":
    main()
