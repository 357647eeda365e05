#!/usr/bin/env python3
"""The CPU backend beside numpy and PyTorch's CPU build, in one run on one machine.

    python3 tests/reference/cpu_reference.py path/to/tfhost [--sizes 1024,2048,4096] [--models tiny,small]
        [--context 128] [--threads N] [--rounds R] [--json out.json] [--out DIR]

1. Matrix products, f32, N x N times N x N: tfhost (experiments/hello.lua, median of its timed calls)
   and numpy's `a @ b` (median of as many calls), in GFLOP/s.
2. Training steps (forward, backward, AdamW) of the CS336 model in f32 at batch 4: tfhost's fused
   engine on the CPU (experiments/benchmark.lua --device cpu) and, where PyTorch is installed, the
   CS336 reference model (tests/reference/torch_lm.py) with torch.optim.AdamW on the CPU, both the
   mean of the timed steps after warm-up.
All sides use the same thread count (--threads, default every core). On a shared, noisy host,
--rounds R runs the whole comparison R times (each side in turn) and reports each side's median.
Prints a Markdown table and writes the rows with the environment as JSON (--json FILE, or --out DIR:
DIR/cpu_reference.json and DIR/cpu_reference.md)."""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

# numpy's OpenBLAS and PyTorch read the thread count when they load: set it from --threads first
for _i, _a in enumerate(sys.argv):
    if _a == "--threads" and _i + 1 < len(sys.argv):
        os.environ["OMP_NUM_THREADS"] = os.environ["OPENBLAS_NUM_THREADS"] = sys.argv[_i + 1]
    elif _a.startswith("--threads="):
        os.environ["OMP_NUM_THREADS"] = os.environ["OPENBLAS_NUM_THREADS"] = _a.split("=", 1)[1]
os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count()))

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PRESETS = {
    "tiny": dict(d_model=64, d_ff=256, num_layers=2, num_heads=4),
    "small": dict(d_model=768, d_ff=3072, num_layers=12, num_heads=12),
}


def tfhost(binary, threads, script, *args):
    """Runs a tfhost experiment with --json; returns its result rows."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.json")
        cmd = [binary, "--device", "cpu", "--threads", str(threads), os.path.join(ROOT, script), *args, "--json", out]
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"cpu_reference.py: {' '.join(cmd)} failed:\n{run.stdout}{run.stderr}")
        with open(out) as f:
            doc = json.load(f)
    return doc["results"], doc["env"]


def numpy_matmul(n, iters):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    a @ b
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        a @ b
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def torch_step(size, ctx, batch, vocab, warmup, steps):
    import torch
    sys.path.insert(0, HERE)
    from torch_lm import TransformerLM
    cfg = dict(PRESETS[size], vocab_size=vocab, context_length=ctx, rope_theta=10000.0, sdpa=False)
    torch.manual_seed(0)
    model = TransformerLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, vocab, (batch, ctx))
    targets = torch.randint(0, vocab, (batch, ctx))

    def step():
        logits = model(ids)
        torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        step()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.mean(times)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("tfhost")
    p.add_argument("--sizes", default="1024,2048,4096")
    p.add_argument("--models", default="tiny,small")
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--vocab", type=int, default=10000)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--json")
    p.add_argument("--out", help="folder for cpu_reference.json and cpu_reference.md")
    a = p.parse_args()
    try:
        import torch
        torch.set_num_threads(a.threads)
        have_torch = torch.__version__
    except ImportError:
        have_torch = None

    sizes, models = [int(x) for x in a.sizes.split(",")], a.models.split(",")
    rounds = [one_round(a, sizes, models, have_torch, r) for r in range(a.rounds)]
    rows, tf_env = rounds[0]
    for i, row in enumerate(rows):  # each side's median over the rounds
        for key in ("tfhost_ms", "numpy_ms", "torch_ms"):
            if key in row:
                each = [r[0][i][key] for r in rounds]
                row[key], row[key + "_rounds"] = statistics.median(each), each
        if "n" in row:
            row["tfhost_gflops"] = 2 * row["n"] ** 3 / row["tfhost_ms"] / 1e6
            row["numpy_gflops"] = 2 * row["n"] ** 3 / row["numpy_ms"] / 1e6
            row["ratio"] = row["numpy_ms"] / row["tfhost_ms"]
        elif "torch_ms" in row:
            row["ratio"] = row["torch_ms"] / row["tfhost_ms"]
    report(a, rows, tf_env, have_torch)


def one_round(a, sizes, models, have_torch, index):
    """One pass over every row: tfhost's, then numpy's and PyTorch's."""
    if a.rounds > 1:
        print(f"round {index + 1} of {a.rounds}", file=sys.stderr, flush=True)
    # every tfhost run first, then numpy's and PyTorch's: their BLAS threads keep spinning a while
    # after a call and would take the cores from a tfhost run that followed
    rows = []
    tf_env = None
    for n in sizes:
        print(f"tfhost matmul {n} ...", file=sys.stderr, flush=True)
        r, tf_env = tfhost(a.tfhost, a.threads, "experiments/hello.lua", "--size", str(n), "--iters", str(a.iters))
        rows.append(dict(what="matmul f32", config=f"{n} x {n} x {n}", n=n, tfhost_ms=r[0]["median_ms"],
                         tfhost_gflops=2 * n ** 3 / r[0]["median_ms"] / 1e6))
    for size in models:
        print(f"tfhost {size} step ...", file=sys.stderr, flush=True)
        r, _ = tfhost(a.tfhost, a.threads, "experiments/benchmark.lua", "--size", size, "--context", str(a.context),
                      "--batch", str(a.batch), "--precision", "f32", "--mode", "step", "--warmup", str(a.warmup),
                      "--steps", str(a.steps))
        rows.append(dict(what="training step f32", config=f"{size}, ctx {a.context}, batch {a.batch}", size=size,
                         tfhost_ms=r[0]["mean_ms"]))
    for row in rows:
        if "n" in row:
            print(f"numpy matmul {row['n']} ...", file=sys.stderr, flush=True)
            row["numpy_ms"] = numpy_matmul(row["n"], a.iters)
            row["numpy_gflops"] = 2 * row["n"] ** 3 / row["numpy_ms"] / 1e6
            row["ratio"] = row["numpy_ms"] / row["tfhost_ms"]
        elif have_torch:
            print(f"PyTorch {row['size']} step ...", file=sys.stderr, flush=True)
            row["torch_ms"] = torch_step(row["size"], a.context, a.batch, a.vocab, a.warmup, a.steps)
            row["ratio"] = row["torch_ms"] / row["tfhost_ms"]
    return rows, tf_env


def report(a, rows, tf_env, have_torch):
    """The Markdown table on stdout (and in DIR/cpu_reference.md), the rows as JSON."""
    lines = []

    def f(v, spec=".2f"):
        return "-" if v is None else format(v, spec)
    lines.append(f"CPU backend, {a.threads} threads ({platform.processor() or platform.machine()}, "
                 f"{os.cpu_count()} CPUs); numpy {np.__version__}, PyTorch {have_torch or 'not installed'}; "
                 f"tfhost BLAS: {(tf_env or {}).get('host', {}).get('blas', '?')}"
                 + (f"; median of {a.rounds} rounds" if a.rounds > 1 else ""))
    lines.append("")
    lines.append("| what | configuration | tfhost ms | numpy ms | PyTorch CPU ms | tfhost GFLOP/s | numpy GFLOP/s "
                 "| tfhost speed / other's |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for r in rows:
        lines.append(f"| {r['what']} | {r['config']} | {f(r.get('tfhost_ms'))} | {f(r.get('numpy_ms'))} | "
                     f"{f(r.get('torch_ms'))} | {f(r.get('tfhost_gflops'), '.1f')} | "
                     f"{f(r.get('numpy_gflops'), '.1f')} | {f(r.get('ratio'))}x |")
    print("\n" + "\n".join(lines))
    json_path = a.json
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        json_path = json_path or os.path.join(a.out, "cpu_reference.json")
        with open(os.path.join(a.out, "cpu_reference.md"), "w") as fh:
            fh.write("\n".join(lines) + "\n")
    if json_path:
        env = dict(numpy=np.__version__, torch=have_torch, threads=a.threads, cpu_count=os.cpu_count(),
                   machine=platform.machine(), host=platform.node(), rounds=a.rounds, tfhost=tf_env)
        with open(json_path, "w") as fh:
            json.dump(dict(env=env, results=rows), fh, indent=1)
        print(f"\nwrote {json_path}")


if __name__ == "__main__":
    main()
