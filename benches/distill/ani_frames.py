"""Issue 46: experiments on the ANI-2x loop's committed frames (data/ani2x-organic/loop/).

  train: students trained from scratch, side by side on one device, on every frame the loop
         labelled (the teacher MD of seed 0 and each iteration's choice), validated on seed 1,
         with the loop's training settings; each scored on test.extxyz (seed 2) per molecule
         and temperature. NAME=JSON gives a student's model config (e.g. a cutoff or a shape).
  refine: the second stage again from a student (MODEL), side by side, with the example config's
         `refine` settings, on every frame the loop labelled plus each student's extra files
         (NAME=FILE,FILE...; NAME= adds none): which extra frames lower which rows?
  fit:   one student's force MAE per molecule and temperature on the frames it was trained on
         (the teacher MD of seed 0 alone, then every labelled frame), on seed 1 and on seed 2:
         does a row miss for want of fit or of coverage?

    python3 benches/distill/ani_frames.py train MLFF WORK NAME=JSON [NAME=JSON ...]
        [--epochs 250] [--max-minutes M] [--device cuda] [--every K]
    python3 benches/distill/ani_frames.py refine MLFF MODEL WORK NAME=FILE,... [NAME=...]
        [--max-minutes M] [--device cuda]
    python3 benches/distill/ani_frames.py fit MLFF MODEL WORK [--device cpu]

Only the standard library; MLFF is an `mlff` binary. bench-log 80.
"""

import argparse
import json
import lzma
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data" / "ani2x-organic"
ROWS = ["aspirin", "trialanine", "water8", "water12", "water20"]


def frames(text):
    """(header, lines) of every frame of an extended XYZ text."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        n = int(lines[i])
        yield lines[i + 1], lines[i : i + 2 + n]
        i += 2 + n


def info(header, key):
    m = re.search(rf"\b{key}=(\S+)", header)
    return m.group(1) if m else None


def read(path):
    p = Path(path)
    return lzma.open(p, "rt").read() if p.suffix == ".xz" else p.read_text()


def write(path, texts, every=1):
    out = []
    for text in texts:
        for k, (_, lines) in enumerate(frames(text)):
            if k % every == 0:
                out.extend(lines)
    Path(path).write_text("\n".join(out) + "\n")


def split_by_temperature(src, work, tag):
    """src's frames into one file per temperature_K: {temperature: path}."""
    by = {}
    for header, lines in frames(read(src)):
        by.setdefault(int(float(info(header, "temperature_K"))), []).extend(lines)
    out = {}
    for t, lines in sorted(by.items()):
        out[t] = Path(work) / f"{tag}-{t}.extxyz"
        out[t].write_text("\n".join(lines) + "\n")
    return out


def force_mae(mlff, model, path, device):
    """{molecule: F MAE meV/Å} and the overall one ("all") of `model` on `path`."""
    js = Path(str(path) + f".{Path(model).parent.name}.json")
    subprocess.run([mlff, "eval", str(model), str(path), "--device", device, "--json", str(js),
                    "--overwrite"], check=True, capture_output=True)
    r = json.loads(js.read_text())["report"]
    out = {m: e["force_mae"] * 1e3 for m, e in r["per_molecule"].items()}
    out["all"] = r["overall"]["force_mae"] * 1e3
    return out


def loop_files():
    return [DATA / "loop" / "train.extxyz.xz"] + sorted((DATA / "loop").glob("iter-*.extxyz.xz"))


def run_side_by_side(a, work, runs):
    """Starts `mlff train` for each (name, args) at once, waits, and prints every student's
    force MAE on test.extxyz per molecule and temperature."""
    procs = []
    for name, args in runs:
        cmd = [a.mlff, "train", "--val", str(work / "val.extxyz"), "--device", a.device,
               "--out", str(work / name), "--overwrite"] + args
        if a.max_minutes:
            cmd += ["--max-minutes", str(a.max_minutes)]
        log = open(work / f"{name}.log", "w")
        procs.append((name, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)))
    for name, p in procs:
        if p.wait() != 0:
            sys.exit(f"{name}: mlff train exited {p.returncode} ({work / name}.log)")
    tests = split_by_temperature(DATA / "test.extxyz", work, "test")
    cols = [(m, t) for t in tests for m in ["all"] + ROWS]
    print("| student | " + " | ".join(f"{m} {t} K" for m, t in cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for name, _ in procs:
        tail = (work / f"{name}.log").read_text().strip().splitlines()[-2]
        scores = {t: force_mae(a.mlff, work / name / "best.safetensors", p, a.eval_device)
                  for t, p in tests.items()}
        print(f"| {name} | " + " | ".join(f"{scores[t][m]:.2f}" for m, t in cols) + f" |  {tail}")


def loop_split(a, work):
    write(work / "train.extxyz", [read(p) for p in loop_files()], a.every)
    write(work / "val.extxyz", [read(DATA / "loop" / "val.extxyz.xz")], a.every)


def train(a):
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    loop_split(a, work)
    runs = []
    for spec in a.students:
        name, cfg = spec.split("=", 1)
        (work / f"{name}.json").write_text(cfg)
        runs.append((name, ["--train", str(work / "train.extxyz"), "--config",
                            str(work / f"{name}.json"), "--epochs", str(a.epochs),
                            "--batch-size", "32", "--lr", "0.001", "--lr-min", "1e-5",
                            "--patience", "30", "--val-every", "10", "--seed", "0"]))
    run_side_by_side(a, work, runs)


def refine(a):
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    loop_split(a, work)
    example = ROOT / "examples" / "distill" / "ani2x-organic.json"
    (work / "refine.json").write_text(json.dumps(json.loads(example.read_text())["refine"]))
    runs = []
    for spec in a.students:
        name, files = spec.split("=", 1)
        extra = []
        for k, f in enumerate(x for x in files.split(",") if x):
            extra.append(work / f"{name}.extra{k}.extxyz")
            write(extra[-1], [read(f)], a.every)
        runs.append((name, ["--train", str(work / "train.extxyz")] + [str(p) for p in extra]
                     + ["--train-config", str(work / "refine.json"), "--init", a.model]))
    run_side_by_side(a, work, runs)


def fit(a):
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    write(work / "seed0.extxyz", [read(DATA / "loop" / "train.extxyz.xz")])
    write(work / "labelled.extxyz", [read(p) for p in loop_files()])
    write(work / "seed1.extxyz", [read(DATA / "loop" / "val.extxyz.xz")])
    sets = [("teacher MD seed 0 (trained on)", "seed0"),
            ("every labelled frame (trained on)", "labelled"),
            ("teacher MD seed 1 (validation)", "seed1")]
    print("| frames | molecule | T K | frames | F MAE meV/Å |")
    print("|---|---|---:|---:|---:|")
    for label, tag in sets + [("teacher MD seed 2 (test.extxyz)", None)]:
        src = DATA / "test.extxyz" if tag is None else work / f"{tag}.extxyz"
        for t, p in split_by_temperature(src, work, tag or "test").items():
            n = {}
            for header, _ in frames(p.read_text()):
                n[info(header, "molecule")] = n.get(info(header, "molecule"), 0) + 1
            scores = force_mae(a.mlff, a.model, p, a.device)
            for m in ROWS:
                if m in scores:
                    print(f"| {label} | {m} | {t} | {n[m]} | {scores[m]:.2f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    # `train` and `refine` both train students side by side and score them.
    side = argparse.ArgumentParser(add_help=False)
    side.add_argument("--max-minutes", type=float)
    side.add_argument("--device", default="cuda")
    side.add_argument("--eval-device", default="cpu")
    side.add_argument("--every", type=int, default=1, help="every K-th frame (a smoke test)")
    t = sub.add_parser("train", parents=[side])
    t.add_argument("mlff")
    t.add_argument("work")
    t.add_argument("students", nargs="+", help="NAME=model config JSON")
    t.add_argument("--epochs", type=int, default=250)
    r = sub.add_parser("refine", parents=[side])
    r.add_argument("mlff")
    r.add_argument("model")
    r.add_argument("work")
    r.add_argument("students", nargs="+", help="NAME=extra training files, comma-separated")
    f = sub.add_parser("fit")
    f.add_argument("mlff")
    f.add_argument("model")
    f.add_argument("work")
    f.add_argument("--device", default="cpu")
    a = ap.parse_args()
    {"train": train, "refine": refine, "fit": fit}[a.cmd](a)


if __name__ == "__main__":
    main()
