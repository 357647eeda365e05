"""PyTorch's side of experiments/attention_sweep.lua and experiments/flash_benchmark.lua, for
side-by-side comparisons on a GPU machine (torch with CUDA).

    python3 tests/reference/torch_attention.py --sweep [--json sweep_torch.json] [--compare sweep_tfhost.json]
    python3 tests/reference/torch_attention.py --flash [--json flash_torch.json] [--compare flash_tfhost.json]
    python3 tests/reference/torch_attention.py --leaderboard [--json leaderboard_torch.json]

--sweep (CS336 pytorch_attention): naive attention exactly as the CS336 reference writes it
(scores = Q K^T / sqrt(d), torch.where(mask, scores, -inf), CS336's own softmax, weights @ V)
beside torch.nn.functional.scaled_dot_product_attention; batch 8, one head, head dims 16..128,
lengths 256..16384, f32, causal. The mask is built inside each call (torch.tril of ones), as
tfhost's naive attention builds its own. CS336's softmax keeps exp(x - max) as well as the
probabilities for its backward pass, so its memory before backward is about two seq^2 matrices
where tfhost's fused softmax keeps one; --torch_softmax uses torch.softmax instead, which keeps one,
for a like-for-like memory comparison.

--flash (CS336 flash_benchmarking): batch 1, heads 1, causal, lengths 128..65536, head dims 16..128,
bf16 and f32: naive (as above) against scaled_dot_product_attention with the FlashAttention backend
forced (torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION)) for bf16/f16. PyTorch has no
flash kernel for f32, so f32 rows use the memory-efficient backend (EFFICIENT_ATTENTION; MATH if that
refuses the shape); the row's "backend" field and a note under the table say which.

--leaderboard: the CS336 leaderboard shape, q, k, v of (1, 16, 16384, 64) bf16, causal, forward +
backward with the flash backend (tfhost's counterpart: experiments/flash_benchmark.lua --seq 16384
--d 64 --heads 16 --dtype bf16 --impl flash).

Timing is tfhost's: `warmup` untimed calls, then `iters` timed calls, each between two
torch.cuda.synchronize() calls (wall clock). The sweep reports the mean, the flash benchmark and the
leaderboard the median. A backward pass is timed alone: each follows a fresh untimed forward pass and
runs out.backward(dout) with a fixed random dout; gradients are dropped between calls, untimed. The
memory before backward is torch.cuda.memory_allocated() after one forward pass minus before it (the
inputs excluded). FLOPs: 4 * batch * heads * seq^2 * d per forward pass, halved when causal; the
backward counts 2.5 times that. Out of memory marks a row "OOM" and the sweep goes on. f32 matmuls are
true f32 (TF32 off), as tfhost's default.
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import results_file  # noqa: E402

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
MIB = 2 ** 20


# ---- the implementations ---------------------------------------------------------------------------

def cs336_softmax(x, dim=-1):
    """cs336_basics.nn_utils.softmax."""
    rescaled_input = x - torch.max(x, dim=dim, keepdim=True)[0]
    exponentiated_rescaled_input = torch.exp(rescaled_input)
    return exponentiated_rescaled_input / torch.sum(exponentiated_rescaled_input, dim=dim, keepdim=True)


def cs336_attention(Q, K, V, mask=None, softmax=cs336_softmax):
    """cs336_basics.model.scaled_dot_product_attention (einsum written as matmul)."""
    d_k = K.shape[-1]
    attention_scores = Q @ K.transpose(-2, -1) / math.sqrt(d_k)
    if mask is not None:
        attention_scores = torch.where(mask, attention_scores, float("-inf"))
    attention_weights = softmax(attention_scores, dim=-1)
    return attention_weights @ V


def naive(causal, torch_softmax):
    softmax = (lambda x, dim: torch.softmax(x, dim=dim)) if torch_softmax else cs336_softmax

    def run(q, k, v):
        mask = None
        if causal:  # query i sees key j iff j <= i (top-left aligned, as tf.attention)
            mask = torch.tril(torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device))
        return cs336_attention(q, k, v, mask, softmax)

    return run, "cs336"


def sdpa(dtype, causal):
    """scaled_dot_product_attention with the flash backend (bf16/f16) or, for f32, which has no
    flash kernel, the memory-efficient backend, else math. Inputs must be 4-D (batch, heads, seq, d)."""
    if dtype in (torch.float16, torch.bfloat16):
        choices = [("flash", SDPBackend.FLASH_ATTENTION)]
    else:
        choices = [("efficient", SDPBackend.EFFICIENT_ATTENTION), ("math", SDPBackend.MATH)]
    state = {"index": 0}

    def run(q, k, v):
        while True:
            name, backend = choices[state["index"]]
            try:
                with sdpa_kernel([backend]):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            except torch.cuda.OutOfMemoryError:
                raise
            except RuntimeError:
                if state["index"] + 1 == len(choices):
                    raise
                print(f"  sdpa backend {name} refused this shape; trying {choices[state['index'] + 1][0]}",
                      file=sys.stderr)
                state["index"] += 1

    return run, lambda: choices[state["index"]][0]


BACKEND_NAMES = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}


def sdpa_default(causal):
    """scaled_dot_product_attention as a PyTorch user calls it: no backend chosen, PyTorch picks (on
    Hopper in bf16/f16 that is cuDNN's attention). The backend it picked is read once, by PyTorch's own
    selection function where this PyTorch has it."""
    state = {"name": "default"}

    def run(q, k, v):
        if state["name"] == "default":
            try:
                choice = torch._fused_sdp_choice(q, k, v, is_causal=causal)
                state["name"] = "default (" + BACKEND_NAMES.get(int(choice), str(choice)) + ")"
            except (AttributeError, RuntimeError, TypeError):
                state["name"] = "default (unknown)"
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return run, lambda: state["name"]


# ---- timing ------------------------------------------------------------------------------------------

def sync():
    torch.cuda.synchronize()


def bench(fn, warmup, iters):
    """tf.bench: wall time of each call between two synchronisations, in ms."""
    for _ in range(warmup):
        fn()
        sync()
    samples = []
    for _ in range(iters):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        samples.append((time.perf_counter() - t0) * 1e3)
    return samples


def bench_backward(attn, q, k, v, dout, warmup, iters):
    """Backward passes alone, each after a fresh untimed forward pass."""
    samples = []
    for i in range(warmup + iters):
        out = attn(q, k, v)
        sync()
        t0 = time.perf_counter()
        out.backward(dout)
        sync()
        ms = (time.perf_counter() - t0) * 1e3
        del out
        q.grad = k.grad = v.grad = None
        if i >= warmup:
            samples.append(ms)
    return samples


def inputs(shape, dtype):
    torch.manual_seed(0)
    make = lambda: torch.randn(shape, device="cuda", dtype=dtype)
    q, k, v = (make().requires_grad_(True) for _ in range(3))
    return q, k, v, make()


def fwdbwd(attn, q, k, v, dout):
    def run():
        out = attn(q, k, v)
        out.backward(dout)
        q.grad = k.grad = v.grad = None
    return run


def release():
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


# ---- --sweep -----------------------------------------------------------------------------------------

def sweep_config(a, dtype_name, d, seq, impl):
    row = dict(dtype=dtype_name, d=d, seq=seq, impl=impl, batch=a.batch, causal=a.causal)
    dtype = DTYPES[dtype_name]
    if impl == "naive":
        attn, backend = naive(a.causal, a.torch_softmax)
        shape = (a.batch, seq, d)
    else:
        attn, backend = sdpa(dtype, a.causal)
        shape = (a.batch, 1, seq, d)  # sdpa's fused kernels want (batch, heads, seq, d)
    stage = "inputs"
    try:
        q, k, v, dout = inputs(shape, dtype)
        stage = "forward"
        t = bench(lambda: attn(q, k, v), a.warmup, a.iters)
        row["fwd_ms"], row["fwd_std_ms"] = statistics.mean(t), statistics.stdev(t) if len(t) > 1 else 0.0
        sync()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        out = attn(q, k, v)
        sync()
        row["mem_mib"] = (torch.cuda.memory_allocated() - before) / MIB
        row["fwd_peak_mib"] = (torch.cuda.max_memory_allocated() - before) / MIB
        stage = "backward"
        torch.cuda.reset_peak_memory_stats()
        out.backward(dout)
        sync()
        row["bwd_peak_mib"] = (torch.cuda.max_memory_allocated() - before) / MIB
        del out
        q.grad = k.grad = v.grad = None
        t = bench_backward(attn, q, k, v, dout, a.warmup, a.iters)
        row["bwd_ms"], row["bwd_std_ms"] = statistics.mean(t), statistics.stdev(t) if len(t) > 1 else 0.0
    except torch.cuda.OutOfMemoryError:
        row["oom"] = stage
        if stage != "backward":
            row["fwd_ms"] = row["mem_mib"] = "OOM"
        row["bwd_ms"] = "OOM"
    row["backend"] = backend if isinstance(backend, str) else backend()
    q = k = v = dout = out = None  # noqa: F841
    release()
    return row


def fmt(v, spec):
    return format(v, spec) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)


def markdown(title, header, lines):
    print(f"### {title}\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for cells in lines:
        print("| " + " | ".join(cells) + " |")
    print()


def sweep(a):
    rows = []
    configs = [(t, d, s, i) for t in a.dtype for d in a.d for s in a.seq for i in a.impl]
    for n, (dtype, d, seq, impl) in enumerate(configs, 1):
        print(f"[{n}/{len(configs)}] {dtype} d {d} seq {seq} {impl} ...", end="", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        row = sweep_config(a, dtype, d, seq, impl)
        rows.append(row)
        status = ("OOM in " + row["oom"]) if row.get("oom") else "done"
        print(f" {status} ({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    side = {}
    for r in rows:
        line = side.setdefault((r["dtype"], r["d"], r["seq"]), {})
        for f in ("fwd_ms", "bwd_ms", "mem_mib"):
            line[r["impl"] + "_" + f] = r.get(f)
    header = ["dtype", "d", "seq"]
    specs = []
    for what, title, spec in (("fwd_ms", "fwd ms", ".3f"), ("bwd_ms", "bwd ms", ".3f"),
                              ("mem_mib", "mem before bwd MiB", ".2f")):
        for impl in a.impl:
            header.append(f"{impl} {title}")
            specs.append((f"{impl}_{what}", spec))
    lines = [[dtype, str(d), str(seq)] + [fmt(line.get(key), spec) for key, spec in specs]
             for (dtype, d, seq), line in side.items()]
    markdown(f"PyTorch attention, batch {a.batch}, {'causal' if a.causal else 'not causal'}", header, lines)
    backends = sorted({(r["dtype"], r["backend"]) for r in rows if r["impl"] == "flash"})
    if backends:
        print("flash = scaled_dot_product_attention with backend " +
              ", ".join(f"{b} for {t}" for t, b in backends) + "; naive = CS336's reference" +
              (" with torch.softmax" if a.torch_softmax else "") + "\n")
    return rows


# ---- --flash and --leaderboard -------------------------------------------------------------------------

def flash_config(a, dtype_name, d, seq, impl, heads=None):
    heads = heads or a.heads
    row = dict(dtype=dtype_name, d=d, seq=seq, impl=impl, batch=a.batch, heads=heads, causal=a.causal)
    dtype = DTYPES[dtype_name]
    flops = 4 * a.batch * heads * seq * seq * d * (0.5 if a.causal else 1)
    if impl == "naive":
        attn, backend = naive(a.causal, a.torch_softmax)
    elif impl == "default":
        attn, backend = sdpa_default(a.causal)
    else:
        attn, backend = sdpa(dtype, a.causal)
    try:
        q, k, v, dout = inputs((a.batch, heads, seq, d), dtype)
        runs = (("fwd", 1.0, lambda: bench(lambda: attn(q, k, v), a.warmup, a.iters)),
                ("bwd", 2.5, lambda: bench_backward(attn, q, k, v, dout, a.warmup, a.iters)),
                ("fwdbwd", 3.5, lambda: bench(fwdbwd(attn, q, k, v, dout), a.warmup, a.iters)))
        for name, factor, run in runs:
            ms = statistics.median(run())
            row[name + "_ms"] = ms
            row[name + "_tflops"] = factor * flops / (ms * 1e-3) / 1e12
    except torch.cuda.OutOfMemoryError:
        row["oom"] = True
        for name in ("fwd", "bwd", "fwdbwd"):
            row.setdefault(name + "_ms", "OOM")
    row["backend"] = backend if isinstance(backend, str) else backend()
    q = k = v = dout = None  # noqa: F841
    release()
    return row


def flash_table(a, rows, title):
    header = ["dtype", "d", "seq", "impl", "fwd ms", "bwd ms", "fwd+bwd ms", "fwd TFLOP/s", "bwd TFLOP/s",
              "fwd+bwd TFLOP/s", "fwd+bwd speedup vs naive"]
    lines = []
    for r in rows:
        lines.append([r["dtype"], str(r["d"]), str(r["seq"]), r["impl"]] +
                     [fmt(r.get(k), ".3f") for k in ("fwd_ms", "bwd_ms", "fwdbwd_ms")] +
                     [fmt(r.get(k), ".3g") for k in ("fwd_tflops", "bwd_tflops", "fwdbwd_tflops")] +
                     [fmt(r["speedup"], ".2f") + "x" if "speedup" in r else ""])
    markdown(title, header, lines)
    backends = sorted({(r["dtype"], r["backend"]) for r in rows if r["impl"] == "flash"})
    if backends:
        print("flash = scaled_dot_product_attention with backend " +
              ", ".join(f"{b} for {t}" for t, b in backends) + " (PyTorch has no flash kernel for f32)\n")
    picked = sorted({(r["dtype"], r["backend"]) for r in rows if r["impl"] == "default"})
    if picked:
        print("default = scaled_dot_product_attention as PyTorch chooses: " +
              ", ".join(f"{b} for {t}" for t, b in picked) + "\n")


def flash(a):
    rows, naive_of = [], {}
    configs = [(t, d, s, i) for t in a.dtype for d in a.d for s in a.seq for i in a.impl]
    for n, (dtype, d, seq, impl) in enumerate(configs, 1):
        print(f"[{n}/{len(configs)}] {dtype} d {d} seq {seq} {impl} ...", end="", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        row = flash_config(a, dtype, d, seq, impl)
        if impl == "naive":
            naive_of[(dtype, d, seq)] = row
        base = naive_of.get((dtype, d, seq))
        if impl == "flash" and base and isinstance(base.get("fwdbwd_ms"), float) and isinstance(row.get("fwdbwd_ms"),
                                                                                                 float):
            row["speedup"] = base["fwdbwd_ms"] / row["fwdbwd_ms"]
        rows.append(row)
        print(f" {'OOM' if row.get('oom') else 'done'} ({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    flash_table(a, rows, f"PyTorch attention latency, batch {a.batch}, heads {a.heads}, "
                         f"{'causal' if a.causal else 'not causal'}")
    return rows


def leaderboard(a):
    a.batch, a.causal = 1, True
    row = flash_config(a, "bf16", 64, 16384, "flash", heads=16)
    flash_table(a, [row], "Leaderboard shape: q, k, v (1, 16, 16384, 64) bf16, causal")
    return [row]


# ---- comparison with tfhost's results ------------------------------------------------------------------

def compare(path, rows, mode):
    with open(path) as f:
        ours = {(r["dtype"], r["d"], r["seq"], r["impl"]): r for r in json.load(f)["results"]}
    keys = ("fwd_ms", "bwd_ms", "mem_mib") if mode == "sweep" else ("fwd_ms", "bwd_ms", "fwdbwd_ms")
    header = ["dtype", "d", "seq", "impl"]
    for k in keys:
        header += [f"tfhost {k}", f"torch {k}", "ratio"]
    lines = []
    for r in rows:
        o = ours.get((r["dtype"], r["d"], r["seq"], r["impl"]))
        if not o:
            continue
        cells = [r["dtype"], str(r["d"]), str(r["seq"]), r["impl"]]
        for k in keys:
            x, y = o.get(k), r.get(k)
            both = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (x, y)) and y
            cells += [fmt(x, ".3f"), fmt(y, ".3f"), f"{x / y:.2f}" if both else ""]
        lines.append(cells)
    markdown(f"tfhost / PyTorch ({path}; ratio < 1: tfhost faster or smaller)", header, lines)


# ---- main ------------------------------------------------------------------------------------------------

def ints(text):
    return [int(x) for x in text.split(",") if x.strip()]


def names(choices):
    def parse(text):
        out = [x.strip() for x in text.split(",") if x.strip()]
        for x in out:
            if x not in choices:
                raise argparse.ArgumentTypeError(f"{x} is not one of {', '.join(choices)}")
        return out
    return parse


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--sweep", action="store_true", help="experiments/attention_sweep.lua's sweep")
    mode.add_argument("--flash", action="store_true", help="experiments/flash_benchmark.lua's benchmark")
    mode.add_argument("--leaderboard", action="store_true", help="(1, 16, 16384, 64) bf16 causal fwd+bwd")
    p.add_argument("--batch", type=int, help="batch size (sweep 8, flash 1)")
    p.add_argument("--heads", type=int, default=1, help="heads per problem (flash)")
    p.add_argument("--d", type=ints, default=[16, 32, 64, 128], help="head dims")
    p.add_argument("--seq", type=ints, help="sequence lengths (sweep 256..16384, flash 128..65536)")
    p.add_argument("--impl", type=names(["naive", "flash", "default"]), default=["naive", "flash"],
                   help="naive (CS336), flash (SDPA's FLASH_ATTENTION backend), default (SDPA, PyTorch's choice)")
    p.add_argument("--dtype", type=names(list(DTYPES)), help="dtypes (sweep f32, flash bf16,f32)")
    p.add_argument("--no-causal", dest="causal", action="store_false", help="full attention")
    p.add_argument("--iters", type=int, help="timed calls (sweep 100, flash 20)")
    p.add_argument("--warmup", type=int, help="untimed calls first (sweep 10, flash 5)")
    p.add_argument("--torch_softmax", action="store_true", help="naive attention with torch.softmax")
    p.add_argument("--json", help="write the rows and the environment here")
    p.add_argument("--compare", help="a tfhost results file of the same experiment: print time ratios")
    a = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("torch_attention.py: needs a CUDA GPU")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if a.sweep:
        defaults = dict(batch=8, seq=[256, 1024, 4096, 8192, 16384], dtype=["f32"], iters=100, warmup=10)
    else:
        defaults = dict(batch=1, seq=[128 << i for i in range(10)], dtype=["bf16", "f32"], iters=20, warmup=5)
    for k, v in defaults.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), device {torch.cuda.get_device_name()}")
    if a.sweep:
        rows, name = sweep(a), "sweep"
    elif a.flash:
        rows, name = flash(a), "flash"
    else:
        rows, name = leaderboard(a), "leaderboard"
    if a.json:
        env = results_file.env(torch=torch.__version__, cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version(),
                               device=torch.cuda.get_device_name(),
                               options={k: v for k, v in vars(a).items() if k not in ("json", "compare")})
        key, metrics = ((results_file.SWEEP_KEY, results_file.SWEEP_METRICS) if name == "sweep"
                        else (results_file.FLASH_KEY, results_file.FLASH_METRICS))
        results_file.write(a.json, rows, key, metrics, env, experiment=name)
        print(f"wrote {a.json}")
    if a.compare and name != "leaderboard":
        compare(a.compare, rows, name)


if __name__ == "__main__":
    main()
