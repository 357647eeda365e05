"""PyTorch's side of experiments/profile_kernels.lua, section (d): the GEMM share of GPU kernel time
in a forward pass and in a training step, measured by torch.profiler (CUPTI, as tfhost's collector)
on the CS336 reference model (torch_lm.py: eager, naive attention, torch.optim.AdamW), batch 4,
vocab 10000, after warm-up steps. Kernels are classed GEMM by the same name patterns as
tf.prof.class_patterns' "gemm" entry (cuBLAS, cuBLASLt's nvjet, CUTLASS).

    python3 tests/reference/torch_profile_kernels.py --size small,2.7B --context 256 --precision bf16 \
        --json torch_kernels.json [--compare tfhost_kernels.json]

With --compare (a results file of profile_kernels.lua), prints both GEMM shares side by side for
every configuration both files have, with their difference in percentage points.
"""
import argparse
import json
import re
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import results_file  # noqa: E402
from torch_benchmark import setup  # noqa: E402

GEMM = re.compile(r"gemm|gemv|^nvjet|xmma|cutlass|cublas|wgmma|hmma|tensorop|splitkreduce|^sm\d+_|matmul")
ATTENTION = re.compile(r"flash|attention|attn|fmha|sdpa")


def kernel_times(prof):
    """{kernel name: total ms} of the CUDA kernels a profile recorded."""
    out = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and not e.name.startswith("Memcpy") and \
                not e.name.startswith("Memset"):
            out[e.name] = out.get(e.name, 0.0) + e.device_time / 1e3  # us -> ms
    return out


def gemm_pct(times):
    total = sum(times.values())
    gemm = sum(t for name, t in times.items()
               if GEMM.search(name.lower()) and not ATTENTION.search(name.lower()))
    return 100.0 * gemm / total if total else 0.0, total


def run(size, ctx, precision, batch, vocab, warmup, passes, overhead_rounds=0):
    _, model, opt, ids, targets, autocast = setup(size, ctx, precision, batch, vocab)

    def step():
        with autocast:
            logits = model(ids)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def forward():
        with torch.no_grad(), autocast:
            model(ids)

    for _ in range(warmup):
        step()
    forward()
    torch.cuda.synchronize()
    row = dict(size=size, context=ctx, precision=precision, impl="eager")
    for name, fn in (("fwd", forward), ("step", step)):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(passes):
                fn()
            torch.cuda.synchronize()
        pct, total = gemm_pct(kernel_times(prof))
        row[name + "_gemm_pct"] = pct
        row[name + "_kernel_ms"] = total / passes
    if overhead_rounds:
        # what torch.profiler costs on the same step (CUDA kernel tracing, as tfhost's collector)
        def timed(profiled, n=5):
            torch.cuda.synchronize()
            if profiled:
                prof = profile(activities=[ProfilerActivity.CUDA])
                prof.__enter__()
            t0 = torch.cuda.Event(enable_timing=True)
            t1 = torch.cuda.Event(enable_timing=True)
            t0.record()
            for _ in range(n):
                step()
            t1.record()
            torch.cuda.synchronize()
            if profiled:
                prof.__exit__(None, None, None)
            return t0.elapsed_time(t1) / n
        timed(True)
        plain, prof_ms = [], []
        for _ in range(overhead_rounds):
            plain.append(timed(False))
            prof_ms.append(timed(True))
        ratios = sorted(p / q for p, q in zip(prof_ms, plain))
        row["step_ms"] = sorted(plain)[len(plain) // 2]
        row["profiler_overhead_pct"] = 100 * (ratios[len(ratios) // 2] - 1)
    del model, opt
    torch.cuda.empty_cache()
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="small")
    ap.add_argument("--context", default="256")
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=10000)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--overhead", type=int, default=0, metavar="ROUNDS",
                    help="also time the step with and without torch.profiler, this many rounds")
    ap.add_argument("--json")
    ap.add_argument("--compare", help="a results file of experiments/profile_kernels.lua")
    a = ap.parse_args()
    rows = []
    for size in a.size.split(","):
        for ctx in (int(c) for c in a.context.split(",")):
            for precision in a.precision.split(","):
                try:
                    rows.append(run(size, ctx, precision, a.batch, a.vocab, a.warmup, a.passes, a.overhead))
                except torch.OutOfMemoryError:
                    rows.append(dict(size=size, context=ctx, precision=precision, oom=True))
                    torch.cuda.empty_cache()
                print("torch_profile_kernels:", rows[-1], file=sys.stderr)
    if a.json:
        env = results_file.env(torch=torch.__version__, cuda=torch.version.cuda, device=torch.cuda.get_device_name(),
                               options={k: v for k, v in vars(a).items() if k not in ("json", "compare")})
        results_file.write(a.json, rows, results_file.KERNELS_KEY, results_file.KERNELS_METRICS, env)
    print("| size | ctx | prec | PyTorch fwd GEMM % | PyTorch step GEMM % | PyTorch fwd kernel ms | PyTorch step kernel ms |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if r.get("oom"):
            print(f"| {r['size']} | {r['context']} | {r['precision']} | OOM | OOM | | |")
        else:
            print(f"| {r['size']} | {r['context']} | {r['precision']} | {r['fwd_gemm_pct']:.1f} | "
                  f"{r['step_gemm_pct']:.1f} | {r['fwd_kernel_ms']:.3f} | {r['step_kernel_ms']:.3f} |")
    for r in rows:
        if "profiler_overhead_pct" in r:
            print(f"torch.profiler on the {r['size']} ctx {r['context']} {r['precision']} step: "
                  f"{r['step_ms']:.3f} ms plain, {r['profiler_overhead_pct']:+.2f} %")
    if a.compare:
        doc = json.load(open(a.compare))
        mine = doc["results"]
        prec = doc.get("options", {}).get("precision")
        ref = {(r["size"], r["context"]): r for r in rows if not r.get("oom") and (prec is None or r["precision"] == prec)}
        print("\n| size | ctx | tfhost impl | tfhost fwd GEMM % | PyTorch fwd GEMM % | diff | tfhost step GEMM % | "
              "PyTorch step GEMM % | diff |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in mine:
            t = ref.get((r["size"], r["context"]))
            if not t or r.get("oom"):
                continue
            print(f"| {r['size']} | {r['context']} | {r['impl']} | {r['fwd_gemm_pct']:.1f} | {t['fwd_gemm_pct']:.1f} | "
                  f"{r['fwd_gemm_pct'] - t['fwd_gemm_pct']:+.1f} | {r['step_gemm_pct']:.1f} | "
                  f"{t['step_gemm_pct']:.1f} | {r['step_gemm_pct'] - t['step_gemm_pct']:+.1f} |")


if __name__ == "__main__":
    main()
