"""Results files of the PyTorch reference scripts, in tfhost's shape, so that
`tfhost compare tfhost.json torch.json` matches their rows: the same column
names as tfhost's experiments (size, context, precision, mode, warmup, batch,
mean_ms, tokens_per_s, peak_gib; dtype, d, seq, impl, fwd_ms, ...), the
same "key" and "metrics" declarations, and an "env" that says where the
numbers came from (script and its SHA-256, command line, start and duration,
device, library versions).

No torch here: the scripts pass what they know of their environment, and the
tests write fixtures with these functions on made-up rows."""
import datetime
import hashlib
import json
import os
import platform
import sys
import time

_STARTED = time.time()

# The configuration and headline columns of each experiment, as tfhost's experiments declare them.
BENCHMARK_KEY = ["size", "context", "precision", "impl", "mode", "warmup", "batch"]
BENCHMARK_METRICS = ["mean_ms", "tokens_per_s", "peak_gib"]
SWEEP_KEY = ["dtype", "d", "seq", "impl", "batch", "causal"]
SWEEP_METRICS = ["fwd_ms", "bwd_ms", "mem_mib"]
FLASH_KEY = ["dtype", "d", "seq", "impl", "batch", "heads", "causal"]
FLASH_METRICS = ["fwd_ms", "bwd_ms", "fwdbwd_ms", "fwdbwd_tflops"]
KERNELS_KEY = ["size", "context", "impl"]
KERNELS_METRICS = ["fwd_kernel_ms", "step_kernel_ms", "fwd_gemm_pct", "step_gemm_pct"]


def benchmark_row(size, context, precision, mode, impl, warmup, batch, times_ms, flops, peak_bytes, params):
    """One row of torch_benchmark.py, named as experiments/benchmark.lua names its rows."""
    n = len(times_ms)
    mean = sum(times_ms) / n
    std = (sum((t - mean) ** 2 for t in times_ms) / (n - 1)) ** 0.5 if n > 1 else 0.0
    ordered = sorted(times_ms)
    median = ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2
    return dict(size=size, context=context, precision=precision, mode=mode, impl=impl, warmup=warmup, batch=batch,
                mean_ms=mean, std_ms=std, median_ms=median, tokens_per_s=batch * context / (mean * 1e-3),
                tflops=flops / (mean * 1e-3) / 1e12, peak_gib=peak_bytes / 2 ** 30, params=params)


def benchmark_oom_rows(size, context, precision, modes, impl, warmup, batch):
    """The rows of a configuration that ran out of memory: one per mode, marked as tfhost marks them."""
    return [dict(size=size, context=context, precision=precision, mode=mode, impl=impl, warmup=warmup, batch=batch,
                 oom=True, mean_ms="OOM") for mode in modes]


def env(**known):
    """The environment of this run: what the script knows (device, torch, cuda, options, ...) plus the
    script's path and SHA-256, the command line, the start time and the duration so far."""
    script = os.path.abspath(sys.argv[0])
    try:
        with open(script, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
    except OSError:
        digest = None
    stamp = "%Y-%m-%dT%H:%M:%SZ"
    out = dict(script=os.path.relpath(script), script_sha256=digest, command=[sys.executable, *sys.argv],
               argv=sys.argv[1:], started=datetime.datetime.fromtimestamp(_STARTED, datetime.timezone.utc).strftime(stamp),
               date=datetime.datetime.now(datetime.timezone.utc).strftime(stamp),
               duration_s=time.time() - _STARTED, python=platform.python_version(), host=dict(hostname=platform.node()))
    out.update(known)
    return out


def write(path, rows, key, metrics, environment, **extra):
    """Writes {env, results, key, metrics, ...extra} as tfhost's tf.results.write does."""
    doc = dict(env=environment, results=rows, key=key, metrics=metrics, **extra)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    return doc
