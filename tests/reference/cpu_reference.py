#!/usr/bin/env python3
"""The CPU backend beside numpy and PyTorch's CPU build, in one run on one machine.

    python3 tests/reference/cpu_reference.py path/to/tfhost [--sizes 1024,2048,4096] [--models tiny,small]
        [--context 128] [--threads N] [--json out.json]

1. Matrix products, f32, N x N times N x N: tfhost (experiments/hello.lua, median of its timed calls)
   and numpy's `a @ b` (median of as many calls), in GFLOP/s.
2. Training steps (forward, backward, AdamW) of the CS336 model in f32 at batch 4: tfhost's fused
   engine on the CPU (experiments/benchmark.lua --device cpu) and, where PyTorch is installed, the
   CS336 reference model (tests/reference/torch_lm.py) with torch.optim.AdamW on the CPU, both the
   mean of the timed steps after warm-up.
All sides use the same thread count (--threads, default every core). Prints a Markdown table and
writes the rows with the environment as JSON."""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

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
    p.add_argument("--json")
    a = p.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(a.threads)  # numpy's OpenBLAS and PyTorch read it at import
    try:
        import torch
        torch.set_num_threads(a.threads)
        have_torch = torch.__version__
    except ImportError:
        have_torch = None

    rows = []
    tf_env = None
    for n in (int(x) for x in a.sizes.split(",")):
        print(f"matmul {n} ...", file=sys.stderr, flush=True)
        r, tf_env = tfhost(a.tfhost, a.threads, "experiments/hello.lua", "--size", str(n), "--iters", str(a.iters))
        tf_ms, np_ms = r[0]["median_ms"], numpy_matmul(n, a.iters)
        flops = 2 * n ** 3
        rows.append(dict(what="matmul f32", config=f"{n} x {n} x {n}", tfhost_ms=tf_ms, numpy_ms=np_ms,
                         tfhost_gflops=flops / tf_ms / 1e6, numpy_gflops=flops / np_ms / 1e6,
                         ratio=np_ms / tf_ms))
    for size in a.models.split(","):
        print(f"{size} step ...", file=sys.stderr, flush=True)
        r, _ = tfhost(a.tfhost, a.threads, "experiments/benchmark.lua", "--size", size, "--context", str(a.context),
                      "--batch", str(a.batch), "--precision", "f32", "--mode", "step", "--warmup", str(a.warmup),
                      "--steps", str(a.steps))
        row = dict(what="training step f32", config=f"{size}, ctx {a.context}, batch {a.batch}",
                   tfhost_ms=r[0]["mean_ms"])
        if have_torch:
            row["torch_ms"] = torch_step(size, a.context, a.batch, a.vocab, a.warmup, a.steps)
            row["ratio"] = row["torch_ms"] / row["tfhost_ms"]
        rows.append(row)

    def f(v, spec=".2f"):
        return "-" if v is None else format(v, spec)
    print(f"\nCPU backend, {a.threads} threads ({platform.processor() or platform.machine()}); "
          f"numpy {np.__version__}, PyTorch {have_torch or 'not installed'}; "
          f"tfhost BLAS: {(tf_env or {}).get('host', {}).get('blas', '?')}\n")
    print("| what | configuration | tfhost ms | numpy ms | PyTorch CPU ms | tfhost GFLOP/s | numpy GFLOP/s "
          "| tfhost speed / other's |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['what']} | {r['config']} | {f(r.get('tfhost_ms'))} | {f(r.get('numpy_ms'))} | "
              f"{f(r.get('torch_ms'))} | {f(r.get('tfhost_gflops'), '.1f')} | {f(r.get('numpy_gflops'), '.1f')} | "
              f"{f(r.get('ratio'))}x |")
    if a.json:
        env = dict(numpy=np.__version__, torch=have_torch, threads=a.threads, cpu_count=os.cpu_count(),
                   machine=platform.machine(), host=platform.node(), tfhost=tf_env)
        with open(a.json, "w") as fh:
            json.dump(dict(env=env, results=rows), fh, indent=1)
        print(f"\nwrote {a.json}")


if __name__ == "__main__":
    main()
