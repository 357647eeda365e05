"""PyTorch's own 8-bit float conversions, for tests/cli/test_fp8_oracle.py.

Run where torch is (the GPU machines have it): it writes tests/reference/oracles/fp8.json with
  - every code of torch.float8_e4m3fn and torch.float8_e5m2 decoded to float32, float16, bfloat16
    (the bits, NaN payloads included);
  - float32 inputs (the edges and ties of both formats, a float32 ulp either side, NaNs,
    infinities, zeros, subnormals, and 20000 random bit patterns) and their codes in both formats,
    by x.to(fp8) and saturating by x.clamp(-max, max).to(fp8) (the scaled-training cast);
  - every float16 and every bfloat16 bit pattern cast to both formats;
all on the CPU, and on the GPU too when one is present (with whether it agrees with the CPU).
Arrays are hex strings of little-endian bytes. Where the safetensors package is installed it also
writes tests/reference/oracles/fp8_torch.safetensors through safetensors.torch (both formats' 256
codes as 16x16 tensors, and the float32 inputs cast to each), which tfhost must read as written.

    python3 tests/reference/torch_fp8.py [out.json]
"""
import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "cli"))
import fp8_formats  # noqa: E402

FORMATS = {"f8e4m3": torch.float8_e4m3fn, "f8e5m2": torch.float8_e5m2}
MAX = {"f8e4m3": 448.0, "f8e5m2": 57344.0}


def hexbytes(t):
    """A tensor's bytes as hex, through a same-size integer view."""
    t = t.contiguous().cpu()
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.view(view).numpy().tobytes().hex()


def conversions(device):
    out = {"decode": {}, "from_f32": {}, "from_f16": {}, "from_bf16": {}}
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    for name, dt in FORMATS.items():
        c = codes.view(dt).to(device)
        out["decode"][name] = {d: hexbytes(c.to(t)) for d, t in
                               (("f32", torch.float32), ("f16", torch.float16), ("bf16", torch.bfloat16))}
    x32 = torch.from_numpy(INPUTS.view(np.int32).copy()).view(torch.float32).to(device)
    pat16 = torch.arange(65536, dtype=torch.int32).to(torch.int16)
    x16, xb16 = pat16.view(torch.float16).to(device), pat16.view(torch.bfloat16).to(device)
    for name, dt in FORMATS.items():
        out["from_f32"][name] = hexbytes(x32.to(dt))
        out["from_f32"][name + "_sat"] = hexbytes(x32.clamp(-MAX[name], MAX[name]).to(dt))
        out["from_f16"][name] = hexbytes(x16.to(dt))
        out["from_bf16"][name] = hexbytes(xb16.to(dt))
    return out


INPUTS = fp8_formats.f32_inputs(seed=20261202, random_count=20000, with_f16=False)  # f16 values: from_f16


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "oracles", "fp8.json")
    oracle = {"torch": torch.__version__, "f32_inputs": INPUTS.astype("<u4").tobytes().hex(),
              "cpu": conversions("cpu")}
    if torch.cuda.is_available():
        oracle["cuda"] = conversions("cuda")
        oracle["cuda_device"] = torch.cuda.get_device_name()
        oracle["cuda_matches_cpu"] = oracle["cuda"] == oracle["cpu"]
    with open(path, "w") as f:
        json.dump(oracle, f)
    try:
        from safetensors.torch import save_file
    except ImportError:
        save_file = None
    if save_file:
        codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).reshape(16, 16)
        x32 = torch.from_numpy(INPUTS.view(np.int32).copy()).view(torch.float32)
        save_file({"codes." + name: codes.view(dt).clone() for name, dt in FORMATS.items()}
                  | {"x32." + name: x32.to(dt) for name, dt in FORMATS.items()},
                  os.path.join(os.path.dirname(path), "fp8_torch.safetensors"))
    print(f"wrote {path}: {len(INPUTS)} float32 inputs; "
          + (f"cuda matches cpu: {oracle['cuda_matches_cpu']}" if "cuda" in oracle else "no GPU"))


if __name__ == "__main__":
    main()
