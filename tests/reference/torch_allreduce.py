#!/usr/bin/env python3
"""torch.distributed's all-reduce, timed as experiments/allreduce.lua times tf.dist's, for
`tfhost compare`: the same sizes (MB of 10^6 bytes), dtypes, warmup and iterations, the same row
columns (dtype, size_mb, world_size, time_ms = the slowest rank's median per call, algbw_gbs,
busbw_gbs = 2 (n - 1) / n * bytes / time) and the same key and metrics.

    python3 tests/reference/torch_allreduce.py --nproc 2 --json torch_ar.json          # NCCL on GPUs
    python3 tests/reference/torch_allreduce.py --nproc 2 --device cpu --json t.json    # gloo on the CPU
    tfhost --nproc 2 experiments/allreduce.lua --json tf_ar.json
    tfhost compare tf_ar.json torch_ar.json

Starts its own ranks (torch.multiprocessing) unless RANK/WORLD_SIZE are set (torchrun)."""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_ranks import Ranks, launch  # noqa: E402

BYTES = {"f32": 4, "bf16": 2, "f16": 2, "f64": 8}


def rank_main(rank, world, a):
    ranks = Ranks(rank, world, a)
    torch, dist, gpu, dev, sync, slowest = ranks.torch, ranks.dist, ranks.gpu, ranks.dev, ranks.sync, ranks.slowest
    dtypes = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "f64": torch.float64}
    op = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[a.op]

    rows = []
    for name in a.dtypes.split(","):
        for mb in [int(s) for s in a.sizes.split(",")]:
            n = mb * 1000000 // BYTES[name]
            t = torch.randn(n, dtype=dtypes[name], device=dev)
            samples = []
            for i in range(a.warmup + a.iters):
                dist.barrier()
                sync()
                t0 = time.perf_counter()
                dist.all_reduce(t, op=op)
                sync()
                if i >= a.warmup:
                    samples.append((time.perf_counter() - t0) * 1e3)
            ms = slowest(statistics.median(samples))
            nbytes = n * BYTES[name]
            rows.append(dict(dtype=name, size_mb=mb, bytes=nbytes, world_size=world, device=str(dev),
                             engine="torch.distributed " + dist.get_backend(), impl="torch", time_ms=ms,
                             min_ms=slowest(min(samples)), algbw_gbs=nbytes / (ms / 1e3) / 1e9,
                             busbw_gbs=2 * (world - 1) / world * nbytes / (ms / 1e3) / 1e9))
            del t
    if rank == 0:
        for r in rows:
            print(f"{r['dtype']:5} {r['size_mb']:6} MB  {r['time_ms']:9.3f} ms  busbw {r['busbw_gbs']:8.2f} GB/s")
    ranks.write(a, rows, ["dtype", "size_mb", "world_size"], ["time_ms", "busbw_gbs"], op=a.op)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--sizes", default=None, help="MB, comma-separated (default as allreduce.lua)")
    p.add_argument("--dtypes", default="f32,bf16")
    p.add_argument("--op", default="sum", choices=["sum", "avg", "max", "min"])
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--port", type=int, default=29511)
    p.add_argument("--json")
    a = p.parse_args()
    if a.sizes is None:
        a.sizes = "1,4,16,64,256,1024" if a.device == "cuda" else "1,4,16,64"
    launch(rank_main, a)

if __name__ == "__main__":
    main()
