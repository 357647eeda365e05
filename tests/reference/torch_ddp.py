#!/usr/bin/env python3
"""PyTorch's data-parallel training step, timed as experiments/ddp.lua times tfhost's, for
`tfhost compare`: the same model (the CS336 Transformer LM of tests/reference/torch_lm.py), batch
per rank, context, precision, warm-up and timed steps, and the same rows (variant, bucket_mb,
world_size, size, context, batch, precision; step_ms = the slowest rank's median step, exposed_ms
= step_ms less the no-communication step's, comm_ms = one all-reduce of every gradient alone,
hidden_pct = 1 - exposed / comm, peak_mib, optimizer_mib) under the same key and metrics.

The variants, as the course builds them and as PyTorch ships them:
  none       no communication (the baseline);
  per_param  one all-reduce per parameter after the backward pass;
  flat       the gradients flattened into one all-reduce after it;
  overlap    one asynchronous all-reduce per parameter, started by a hook as its gradient is
             accumulated, waited for before the step;
  bucket     torch.nn.parallel.DistributedDataParallel (buckets of bucket_mb, overlapped);
  zero1      DistributedDataParallel with torch.distributed.optim.ZeroRedundancyOptimizer (AdamW's
             state sharded over the ranks).

    python3 tests/reference/torch_ddp.py --nproc 2 --json torch_ddp.json             # NCCL on GPUs
    python3 tests/reference/torch_ddp.py --nproc 2 --device cpu --size tiny --json t.json  # gloo
    tfhost --nproc 2 experiments/ddp.lua --json tf_ddp.json
    tfhost compare tf_ddp.json torch_ddp.json

Starts its own ranks (torch.multiprocessing) unless RANK/WORLD_SIZE are set (torchrun)."""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_ranks import Ranks, launch  # noqa: E402
from torch_benchmark import PRESETS as LM_PRESETS  # noqa: E402

PRESETS = dict(tiny=dict(d_model=64, d_ff=256, num_layers=2, num_heads=4), **LM_PRESETS)
VARIANTS = ("none", "per_param", "flat", "overlap", "bucket", "zero1")


def rank_main(rank, world, a):
    from torch_lm import TransformerLM
    ranks = Ranks(rank, world, a)
    torch, dist, gpu, dev, sync, slowest = ranks.torch, ranks.dist, ranks.gpu, ranks.dev, ranks.sync, ranks.slowest
    if not gpu:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))

    cfg = dict(PRESETS[a.size], vocab_size=a.vocab, context_length=a.context, rope_theta=10000.0, sdpa=False)
    torch.manual_seed(1000 + rank)  # each rank its own batch, as ddp.lua seeds it
    ids = torch.randint(0, a.vocab, (a.batch, a.context), device=dev)
    targets = torch.randint(0, a.vocab, (a.batch, a.context), device=dev)
    autocast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.precision == "bf16")

    def make(variant, bucket_mb):
        torch.manual_seed(1)
        model = TransformerLM(cfg).to(dev)
        for p in model.parameters():  # the same start on every rank
            dist.broadcast(p.data, 0)
        handles = []
        if variant in ("bucket", "zero1"):
            from torch.nn.parallel import DistributedDataParallel
            model = DistributedDataParallel(model, bucket_cap_mb=bucket_mb)
        if variant == "zero1":
            from torch.distributed.optim import ZeroRedundancyOptimizer
            opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3)
        else:
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        if variant == "overlap":
            def hook(p):
                p.grad.div_(world)
                handles.append(dist.all_reduce(p.grad, async_op=True))
            for p in model.parameters():
                p.register_post_accumulate_grad_hook(hook)
        return model, opt, handles

    def step(model, opt, handles, variant):
        with autocast:
            logits = model(ids)
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, a.vocab), targets.view(-1))
        loss.backward()
        params = [p for p in model.parameters() if p.grad is not None]
        if variant == "per_param":
            for p in params:
                dist.all_reduce(p.grad)
                p.grad.div_(world)
        elif variant == "flat":
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            dist.all_reduce(flat)
            flat.div_(world)
            at = 0
            for p in params:
                p.grad.copy_(flat[at:at + p.numel()].view_as(p.grad))
                at += p.numel()
        elif variant == "overlap":
            for h in handles:
                h.wait()
            handles.clear()
        opt.step()
        opt.zero_grad(set_to_none=True)

    runs = []
    for v in a.variants.split(","):
        if v not in VARIANTS:
            raise SystemExit(f"torch_ddp.py: unknown variant {v!r} ({', '.join(VARIANTS)})")
        if v in ("bucket", "zero1"):
            runs += [(v, float(mb)) for mb in a.bucket_mb.split(",")]
        else:
            runs.append((v, None))

    rows, baseline_ms, comm_ms = [], None, None
    for variant, mb in runs:
        if gpu:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        model, opt, handles = make(variant, mb if mb is not None else 25.0)
        samples = []
        for i in range(a.warmup + a.steps):
            dist.barrier()
            sync()
            t0 = time.perf_counter()
            step(model, opt, handles, variant)
            sync()
            if i >= a.warmup:
                samples.append((time.perf_counter() - t0) * 1e3)
        row = dict(variant=variant, bucket_mb=mb, world_size=world, size=a.size, context=a.context, batch=a.batch,
                   precision=a.precision, impl="torch")
        row["step_ms"] = slowest(statistics.median(samples))
        row["step_min_ms"] = slowest(min(samples))
        opt_bytes = 0
        if variant == "zero1":
            state = opt.optim.state.values()
        else:
            state = opt.state.values()
        for s in state:
            opt_bytes += sum(t.numel() * t.element_size() for t in s.values() if torch.is_tensor(t) and t.dim() > 0)
        row["optimizer_mib"] = opt_bytes / 2 ** 20
        row["peak_mib"] = slowest(torch.cuda.max_memory_allocated() / 2 ** 20) if gpu else None
        if variant == "none":
            baseline_ms = row["step_ms"]
        if comm_ms is None:
            n = sum(p.numel() for p in model.parameters())
            grads = torch.zeros(n, device=dev)
            times = []
            for i in range(1 + a.steps):
                dist.barrier()
                sync()
                t0 = time.perf_counter()
                dist.all_reduce(grads)
                sync()
                if i >= 1:
                    times.append((time.perf_counter() - t0) * 1e3)
            comm_ms = slowest(statistics.median(times))
            del grads
        rows.append(row)
        del model, opt
    for row in rows:
        row["comm_ms"] = comm_ms
        if baseline_ms is not None and row["variant"] != "none":
            row["exposed_ms"] = max(0.0, row["step_ms"] - baseline_ms)
            if world > 1 and comm_ms > 0:
                row["hidden_pct"] = 100 * max(0.0, 1 - row["exposed_ms"] / comm_ms)
    if rank == 0:
        for r in rows:
            mb = "" if r["bucket_mb"] is None else f" {r['bucket_mb']:g} MB"
            print(f"{r['variant']:9}{mb:8}  step {r['step_ms']:9.2f} ms  exposed {r.get('exposed_ms', 0):8.2f} ms  "
                  f"optimizer {r['optimizer_mib']:8.1f} MiB")
    ranks.write(a, rows, ["variant", "bucket_mb", "world_size", "size", "context", "batch", "precision"],
            ["step_ms", "exposed_ms", "hidden_pct", "peak_mib"])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--size", default=None, help="model preset (default xl on GPUs, tiny on the CPU)")
    p.add_argument("--context", type=int, default=None, help="sequence length (default 512 on GPUs, 64 on the CPU)")
    p.add_argument("--batch", type=int, default=4, help="sequences per rank")
    p.add_argument("--vocab", type=int, default=10000)
    p.add_argument("--precision", default="f32", choices=["f32", "bf16"])
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--bucket_mb", default="25")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--port", type=int, default=29521)
    p.add_argument("--json")
    a = p.parse_args()
    gpu = a.device != "cpu"
    a.size = a.size or ("xl" if gpu else "tiny")
    a.context = a.context or (512 if gpu else 64)
    if a.size not in PRESETS:
        raise SystemExit(f"torch_ddp.py: unknown size {a.size!r}")
    launch(rank_main, a)

if __name__ == "__main__":
    main()
