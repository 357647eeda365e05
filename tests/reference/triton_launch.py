"""The host time of launching a small kernel from Python with Triton, the figure tfhost's launch of a
script's kernel is compared with (experiments/own_kernel.lua --part launch measures tfhost's; the
two run in one call of tests/gpu/own_kernel_compare.sh). The kernel does nothing a launch can see
(n is never negative), so the time is the launch path: Triton's argument handling and cache lookup,
the driver call. Also times torch's own smallest launch (x.add_(0) on one element) for scale.

    python3 tests/reference/triton_launch.py [--json out.json]
"""
import argparse
import json
import time

import torch
import triton
import triton.language as tl


@triton.jit
def noop(x_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if n < 0:
        tl.store(x_ptr + offsets, 1.0)


def host_us(fn, bursts=200, burst=256, repeats=5):
    """The median over repeats of the host time of one call of fn, in microseconds: bursts of calls
    shorter than the device's launch queue, each timed on the host and followed by a wait, so that
    the time is the host's and never the GPU's rate of starting kernels (as own_kernel.lua does)."""
    start = time.perf_counter()  # half a second of calls first: the host's clocks settle
    while time.perf_counter() - start < 0.5:
        for _ in range(burst):
            fn()
        torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        host = 0.0
        for _ in range(bursts):
            t0 = time.perf_counter()
            for _ in range(burst):
                fn()
            host += time.perf_counter() - t0
            torch.cuda.synchronize()
        samples.append(host * 1e6 / (bursts * burst))
    samples.sort()
    return samples[len(samples) // 2], samples


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    args = ap.parse_args()
    x = torch.zeros(32, device="cuda")
    grid = (1,)
    triton_us, triton_samples = host_us(lambda: noop[grid](x, 1, BLOCK=32))
    torch_us, torch_samples = host_us(lambda: x.add_(0))
    rows = [
        {"what": "Triton kernel launch from Python", "host_us": triton_us, "samples": triton_samples},
        {"what": "torch x.add_(0) from Python", "host_us": torch_us, "samples": torch_samples},
    ]
    for r in rows:
        print(f"{r['what']:40s} {r['host_us']:8.2f} us")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "torch": torch.__version__, "triton": triton.__version__,
                       "device": torch.cuda.get_device_name(), "bursts": "5 x 200 x 256"}, f, indent=1)


if __name__ == "__main__":
    main()
