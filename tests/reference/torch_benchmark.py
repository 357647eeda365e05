"""PyTorch's side of experiments/benchmark.lua, and the comparison of the two.

Times the eager PyTorch reference model (torch_lm.py's TransformerLM; naive attention, as the
CS336 reference) on the same configurations as tfhost's benchmark: batch 4, vocab 10000, the
presets, forward / forward+backward / step with torch.optim.AdamW, f32 or bf16 autocast (or fp8: the
layers' linear layers through torch._scaled_mm, torch_fp8_linear.py), CUDA
events around each step after warm-up, peak memory from torch.cuda.max_memory_allocated.

    python3 tests/reference/torch_benchmark.py --size small --context 128,256 --precision f32,bf16 \
        --json torch.json [--compare tfhost.json]

With --compare, prints tfhost / PyTorch ratios of time (lower is better for tfhost) and peak memory
for every configuration both files have.
"""
import argparse
import json
import math
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import results_file  # noqa: E402
from torch_lm import TransformerLM  # noqa: E402

PRESETS = {
    "small": dict(d_model=768, d_ff=3072, num_layers=12, num_heads=12),
    "medium": dict(d_model=1024, d_ff=4096, num_layers=24, num_heads=16),
    "large": dict(d_model=1280, d_ff=5120, num_layers=36, num_heads=20),
    "xl": dict(d_model=1600, d_ff=6400, num_layers=48, num_heads=25),
    "2.7B": dict(d_model=2560, d_ff=10240, num_layers=32, num_heads=32),
}


def setup(size, ctx, precision, batch, vocab, impl="eager"):
    """The model of a configuration (seed 0), its AdamW, random ids and targets, and the autocast
    context of the precision: cfg, model, opt, ids, targets, autocast. impl "eager" is CS336's
    reference (naive attention, torch.optim.AdamW); "compiled" is what a speed-minded PyTorch user
    runs: scaled_dot_product_attention with its default backend, torch.compile, AdamW(fused=True)."""
    cfg = dict(PRESETS[size], vocab_size=vocab, context_length=ctx, rope_theta=10000.0, sdpa=impl == "compiled")
    torch.manual_seed(0)
    model = TransformerLM(cfg).cuda()
    if precision == "fp8":  # the layers' linear layers by torch._scaled_mm, the rest in bf16 autocast
        from torch_fp8_linear import use_fp8
        use_fp8(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=impl == "compiled")
    if impl == "compiled":
        # a fresh compilation per configuration: with one process running many shapes, dynamo
        # would otherwise recompile with the sequence length dynamic, and past its cache limit
        # fall back to eager, neither what a user training one shape runs
        torch._dynamo.reset()
        model = torch.compile(model)
    ids = torch.randint(0, vocab, (batch, ctx), device="cuda")
    targets = torch.randint(0, vocab, (batch, ctx), device="cuda")
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision in ("bf16", "fp8"))
    return cfg, model, opt, ids, targets, autocast


def bench(size, ctx, precision, modes, batch, vocab, warmup, steps, impl="eager"):
    cfg, model, opt, ids, targets, autocast = setup(size, ctx, precision, batch, vocab, impl)
    params = sum(p.numel() for p in model.parameters())
    flops = 6 * params * batch * ctx + 12 * cfg["num_layers"] * batch * ctx * ctx * cfg["d_model"]

    def loss_of():
        with autocast:
            logits = model(ids)
            return torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))

    def run(mode):
        if mode == "fwd":
            with autocast:
                model(ids)
            return
        loss_of().backward()
        if mode == "step":
            opt.step()
        opt.zero_grad(set_to_none=True)

    rows = []
    for mode in modes:
        for _ in range(warmup):
            run(mode)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(steps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run(mode)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        f = flops / 3 if mode == "fwd" else flops
        rows.append(results_file.benchmark_row(size, ctx, precision, mode, impl, warmup, batch, times, f,
                                               torch.cuda.max_memory_allocated(), params))
    del model, opt
    torch.cuda.empty_cache()
    return rows


def compare(tf_rows, torch_rows):
    key = lambda r: (r["size"], r["context"], r["precision"], r["mode"])
    ours = {key(r): r for r in tf_rows if r.get("warmup", 5) == max(x.get("warmup", 5) for x in tf_rows)}
    print("| size | ctx | prec | mode | PyTorch | tfhost ms | PyTorch ms | time ratio | tfhost GiB | PyTorch GiB | "
          "memory ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in torch_rows:
        o = ours.get(key(r))
        if not o:
            continue
        if o.get("oom"):
            print(f"| {r['size']} | {r['context']} | {r['precision']} | {r['mode']} | {r.get('impl', 'eager')} | OOM | "
                  f"{r['mean_ms']:.2f} | | | | |")
            continue
        print(f"| {r['size']} | {r['context']} | {r['precision']} | {r['mode']} | {r.get('impl', 'eager')} | {o['mean_ms']:.2f} | "
              f"{r['mean_ms']:.2f} | {o['mean_ms'] / r['mean_ms']:.2f} | {o['peak_gib']:.2f} | "
              f"{r['peak_gib']:.2f} | {o['peak_gib'] / r['peak_gib']:.2f} |")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--size", default="small")
    p.add_argument("--context", default="128,256,512,1024")
    p.add_argument("--precision", default="f32,bf16")
    p.add_argument("--mode", default="fwd,fwdbwd,step")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--vocab", type=int, default=10000)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--impl", default="eager", help="eager (CS336's reference), compiled (torch.compile + SDPA + "
                   "fused AdamW), or both: eager,compiled")
    p.add_argument("--tf32", action="store_true", help="f32 runs with TF32 matmuls (rows say f32+tf32)")
    p.add_argument("--json")
    p.add_argument("--compare")
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    torch.backends.cudnn.allow_tf32 = a.tf32
    rows = []
    for size in a.size.split(","):
        for ctx in map(int, a.context.split(",")):
            for precision in a.precision.split(","):
                label = "f32+tf32" if precision == "f32" and a.tf32 else precision
                for impl in a.impl.split(","):
                    try:
                        new = bench(size, ctx, precision, a.mode.split(","), a.batch, a.vocab, a.warmup, a.steps, impl)
                    except torch.cuda.OutOfMemoryError:
                        new = results_file.benchmark_oom_rows(size, ctx, precision, a.mode.split(","), impl, a.warmup,
                                                              a.batch)
                        torch.cuda.empty_cache()
                    for r in new:
                        r["precision"] = label
                    rows += new
                    # each configuration's figures as soon as they exist: a run cut short keeps them
                    done = [f"{r['mode']} {r['mean_ms']:.2f} ms {r['peak_gib']:.2f} GiB"
                            for r in rows if (r["size"], r["context"], r["precision"], r.get("impl")) ==
                            (size, ctx, label, impl) and not r.get("oom")]
                    print(f"torch {size} ctx {ctx} {label} {impl} done: {', '.join(done) or 'out of memory'}",
                          file=sys.stderr)
    if a.json:
        env = results_file.env(device=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda,
                               options={k: v for k, v in vars(a).items() if k not in ("json", "compare")})
        results_file.write(a.json, rows, results_file.BENCHMARK_KEY, results_file.BENCHMARK_METRICS, env)
    for r in rows:
        if not r.get("oom"):
            print(f"{r['size']:>6} {r['context']:>5} {r['precision']:>5} {r['mode']:>7} {r['impl']:>8} {r['mean_ms']:9.2f} ms "
                  f"{r['tflops']:7.1f} TFLOP/s {r['peak_gib']:6.2f} GiB")
    if a.compare:
        with open(a.compare) as f:
            compare(json.load(f)["results"], rows)


if __name__ == "__main__":
    main()
