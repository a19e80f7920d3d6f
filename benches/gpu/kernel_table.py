#!/usr/bin/env python3
"""Per-kernel table of one energy+forces call from Nsight Compute's raw CSV
(benches/kernel-profile.sh), with each kernel's FLOP and byte floors.

    python3 benches/kernel_table.py PROFILE.csv [--anchor NAME] [--device h100|h200]

The CSV holds every kernel of an `mlff bench` run; the last complete call is the run of
kernels between the last two launches whose name contains --anchor (the call's first kernel,
the edge basis). Kernels of one name are summed (count, time, counters). Floors, from the
counters: FP32 operations (2 per FFMA, 1 per FADD/FMUL) at the FP32 peak, tensor-core
operations (TF32 at the dense TF32 peak plus f16 with f32 sums at the dense f16 peak, twice
it; the table's column is their sum) at those peaks, DRAM bytes at the DRAM bandwidth and L2
bytes at the L2 rate measured by benches/micro/stream.cu; a kernel's floor is the largest of
the four, and "% of floor" is floor / time. The tensor counts are what ran: split TF32 or
split f16 (three products per value pair) and padding included, about three times the model's
arithmetic.
"""
import argparse
import csv
import sys
from collections import OrderedDict

# Peaks, per second: FP32 FLOP, dense TF32 tensor FLOP, DRAM bytes, L2 bytes (stream.cu, 132
# blocks: 12.8 TB/s on an H100); dense f16 tensor FLOP (f32 sums) are twice TF32's.
PEAKS = {
    "h100": (67e12, 495e12, 3.35e12, 12.8e12),
    "h200": (67e12, 495e12, 4.8e12, 12.8e12),
}
F16_OVER_TF32 = 2.0

TIME = "gpu__time_duration.sum"
COUNTERS = {
    "ffma": "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum",
    "fadd": "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum",
    "fmul": "smsp__sass_thread_inst_executed_op_fmul_pred_on.sum",
    "tensor": "sm__ops_path_tensor_src_tf32_dst_fp32.sum",
    "tensor_f16": "sm__ops_path_tensor_op_hmma_src_fp16_dst_fp32.sum",
    "dram_read": "dram__bytes_read.sum",
    "dram_write": "dram__bytes_write.sum",
    "l2": "lts__t_bytes.sum",
    "inst": "smsp__inst_executed.sum",
}
# Units Nsight Compute reports the counters in (it picks one per run: Kbyte in one, Mbyte in
# another), to seconds / bytes / plain counts.
SCALE = {
    "ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0,
    "nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3, "second": 1.0,
    "byte": 1.0, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9,
    "kibyte": 1024.0, "mibyte": 1024.0**2, "gibyte": 1024.0**3,
    "": 1.0, "inst": 1.0,
}


def number(text, unit, column):
    text = text.replace(",", "").strip()
    if text in ("", "n/a"):
        return 0.0
    scale = SCALE.get(unit.strip().lower())
    if scale is None:  # a guess would put the table off by powers of ten
        sys.exit(f"column {column}: unknown unit {unit!r}")
    return float(text) * scale


def read_rows(path):
    """Kernel launches in order: (name, {metric: value in SI units})."""
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]  # ncu's own log lines are not CSV
    table = list(csv.reader(lines))
    if len(table) < 3:
        sys.exit(f"{path}: no kernel rows (is it `ncu --csv --page raw` output?)")
    header, units = table[0], table[1]
    if "Kernel Name" not in header or TIME not in header:
        sys.exit(f"{path}: no 'Kernel Name' or {TIME} column")
    name_col = header.index("Kernel Name")
    rows = []
    for cells in table[2:]:
        values = {
            h: number(c, u, h)
            for h, u, c in zip(header, units, cells)
            if h == TIME or h in COUNTERS.values()
        }
        rows.append((cells[name_col].split("(")[0].strip(), values))
    return rows


def last_call(rows, anchor):
    starts = [i for i, (name, _) in enumerate(rows) if anchor in name]
    if len(starts) < 2:
        sys.exit(f"fewer than two launches named like {anchor!r}: no complete call to take")
    return rows[starts[-2]:starts[-1]]


def summarise(call, peaks):
    fp32_peak, tensor_peak, dram_peak, l2_peak = peaks
    kernels = OrderedDict()
    for name, v in call:
        k = kernels.setdefault(name, {"count": 0, **{m: 0.0 for m in [TIME, *COUNTERS]}})
        k["count"] += 1
        k[TIME] += v.get(TIME, 0.0)
        for short, metric in COUNTERS.items():
            k[short] += v.get(metric, 0.0)
    out = []
    for name, k in kernels.items():
        fp32 = 2 * k["ffma"] + k["fadd"] + k["fmul"]
        dram = k["dram_read"] + k["dram_write"]
        floors = {
            "FP32": fp32 / fp32_peak,
            "tensor": (k["tensor"] + k["tensor_f16"] / F16_OVER_TF32) / tensor_peak,
            "DRAM": dram / dram_peak,
            "L2": k["l2"] / l2_peak,
        }
        bound = max(floors, key=floors.get)
        out.append((name, k, fp32, dram, floors, bound))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("csv")
    p.add_argument("--anchor", default="edge_basis_fwd")
    p.add_argument("--device", default="h100", choices=sorted(PEAKS))
    a = p.parse_args()
    rows = summarise(last_call(read_rows(a.csv), a.anchor), PEAKS[a.device])
    print("| kernel | launches | µs | GFLOP FP32 | GFLOP tensor | DRAM MB | L2 MB "
          "| warp inst. M | floor µs (by) | % of floor |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    total = {"us": 0.0, "floor": 0.0, "n": 0}
    for name, k, fp32, dram, floors, bound in sorted(rows, key=lambda r: -r[1][TIME]):
        us, floor_us = k[TIME] * 1e6, floors[bound] * 1e6
        total["us"] += us
        total["floor"] += floor_us
        total["n"] += k["count"]
        print(f"| `{name}` | {k['count']} | {us:.1f} | {fp32 / 1e9:.3f} | "
              f"{(k['tensor'] + k['tensor_f16']) / 1e9:.3f} | {dram / 1e6:.1f} | {k['l2'] / 1e6:.1f} | "
              f"{k['inst'] / 1e6:.2f} | {floor_us:.1f} ({bound}) | "
              f"{100 * floor_us / us if us else 0:.0f} |")
    print(f"| **call** | {total['n']} | **{total['us']:.1f}** | | | | | | "
          f"{total['floor']:.1f} | {100 * total['floor'] / total['us']:.0f} |")


if __name__ == "__main__":
    main()
