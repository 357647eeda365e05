"""PyTorch's matrix products beside experiments/gemm_benchmark.lua, and the oracle of tf.scaled_matmul.

Benchmark: for each shape (M, N, K), C = A B^T with A (M, K) and B (N, K) row-major, in the kinds
gemm_benchmark.lua times: bf16 (torch.matmul), fp8 (torch._scaled_mm, e4m3 operands, bf16 out,
tensorwise scales), fp8_rowwise (scales (M, 1) and (1, N)) and fp8_fast (use_fast_accum=True).
Timing as tfhost's: warm-up products, then rounds of back-to-back products between two CUDA events,
the fastest round's mean. torch._scaled_mm is PyTorch's own FP8 product on cuBLASLt (torchao is
not needed for it).

Oracle (--oracle PATH, a safetensors file): small e4m3 and e5m2 operands, their scales and
torch._scaled_mm's outputs (f32 and bf16 out, tensorwise; bf16 out rowwise; e4m3 x e5m2), which
tests/lua/test_scaled_matmul.lua holds tfhost's CPU product to.

    python3 tests/reference/torch_gemm.py --json torch_gemm.json [--shapes 8192x8192x8192,...]
    python3 tests/reference/torch_gemm.py --oracle tests/reference/oracles/scaled_mm.safetensors
"""
import argparse
import json
import sys

import torch

E4M3 = torch.float8_e4m3fn
SHAPES = "8192x8192x8192,4096x10240x2560,4096x2560x10240,4096x7680x2560"


def product(m, n, k, kind):
    """The product of one kind on fresh operands, scaled as current scaling scales them."""
    a = torch.randn(m, k, device="cuda")
    w = torch.randn(n, k, device="cuda")
    if kind == "bf16":
        a, w = a.bfloat16(), w.bfloat16()
        return lambda: torch.matmul(a, w.t())
    top = torch.finfo(E4M3).max
    if kind == "fp8_rowwise":
        sa = a.abs().amax(dim=1, keepdim=True) / top
        sw = w.abs().amax(dim=1, keepdim=True) / top
        a8 = (a / sa).clamp(-top, top).to(E4M3)
        w8t = (w / sw).clamp(-top, top).to(E4M3).t()
        sw = sw.t().contiguous()
    else:
        sa = (a.abs().max() / top).reshape(())
        sw = (w.abs().max() / top).reshape(())
        a8 = (a / sa).clamp(-top, top).to(E4M3)
        w8t = (w / sw).clamp(-top, top).to(E4M3).t()
    fast = kind == "fp8_fast"
    return lambda: torch._scaled_mm(a8, w8t, scale_a=sa, scale_b=sw, out_dtype=torch.bfloat16, use_fast_accum=fast)


def bench(run, warmup, iters, repeats):
    for _ in range(warmup):
        run()
    best = None
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(repeats):
        torch.cuda.synchronize()
        start.record()
        for _ in range(iters):
            run()
        stop.record()
        stop.synchronize()
        ms = start.elapsed_time(stop) / iters
        best = ms if best is None else min(best, ms)
    return best


def oracle(path):
    from safetensors.torch import save_file

    torch.manual_seed(0)
    m, n, k = 64, 48, 128
    a = (torch.randn(m, k) * 40).clamp(-448, 448).to(E4M3).cuda()
    w = (torch.randn(n, k) * 40).clamp(-448, 448).to(E4M3).cuda()
    w5 = (torch.randn(n, k) * 40).to(torch.float8_e5m2).cuda()
    sa = torch.tensor(0.5, device="cuda")
    sb = torch.tensor(0.25, device="cuda")
    ra = (torch.rand(m, 1) + 0.5).cuda()
    rb = (torch.rand(1, n) + 0.5).cuda()
    out = {"a": a, "w": w, "w5": w5, "scale_a": sa.reshape(1), "scale_b": sb.reshape(1), "row_a": ra, "row_b": rb}
    out["tensorwise_f32"] = torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sb, out_dtype=torch.float32)
    out["tensorwise_bf16"] = torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    out["rowwise_bf16"] = torch._scaled_mm(a, w.t(), scale_a=ra, scale_b=rb, out_dtype=torch.bfloat16)
    try:
        out["e4m3_e5m2_f32"] = torch._scaled_mm(a, w5.t(), scale_a=sa, scale_b=sb, out_dtype=torch.float32)
    except RuntimeError as e:
        print(f"e4m3 x e5m2 left out: {e}", file=sys.stderr)
    save_file({name: t.contiguous().cpu() for name, t in out.items()}, path,
              metadata={"torch": torch.__version__, "device": torch.cuda.get_device_name()})
    print(f"wrote {path}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--kinds", default="bf16,fp8,fp8_rowwise,fp8_fast")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json")
    ap.add_argument("--oracle")
    args = ap.parse_args()
    if args.oracle:
        oracle(args.oracle)
        if not args.json:
            return
    rows = []
    for s in args.shapes.split(","):
        m, n, k = (int(v) for v in s.split("x"))
        for kind in args.kinds.split(","):
            try:
                ms = bench(product(m, n, k, kind), args.warmup, args.iters, args.repeats)
            except RuntimeError as e:
                print(f"{s} {kind}: {e}", file=sys.stderr)
                continue
            rows.append({"m": m, "n": n, "k": k, "kind": kind, "ms": ms, "tflops": 2 * m * n * k / (ms * 1e-3) / 1e12})
            print(f"{s} {kind}: {ms:.4f} ms, {rows[-1]['tflops']:.1f} TFLOP/s", file=sys.stderr)
            torch.cuda.empty_cache()
    doc = {"torch": torch.__version__, "device": torch.cuda.get_device_name(), "cuda": torch.version.cuda,
           "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
