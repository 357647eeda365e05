"""PyTorch's answers to sections 1 and 2 of experiments/mixed_precision.lua.

Run on a GPU machine with torch: it writes tests/reference/oracles/mixed_precision.json,
which tests/cli/test_mixed_precision.py compares with tfhost's output. Section 1 is
the CS336 accumulation probe; section 2 the dtypes of CS336's ToyModel under CUDA
autocast, plus the output dtype of each op tfhost's autocast policy names.

    python3 tests/reference/torch_mixed_precision.py [out.json]
"""
import json
import os
import sys

import torch
import torch.nn as nn

NAMES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64"}


def accumulation():
    rows = []
    for case, sum_dtype, inc_dtype, cast in [
        ("f32 sum, f32 increment", torch.float32, torch.float32, False),
        ("f16 sum, f16 increment", torch.float16, torch.float16, False),
        ("f32 sum, f16 increment", torch.float32, torch.float16, False),
        ("f32 sum, f16 increment cast to f32", torch.float32, torch.float16, True),
    ]:
        s = torch.tensor(0, dtype=sum_dtype, device="cuda")
        for _ in range(1000):
            x = torch.tensor(0.01, dtype=inc_dtype, device="cuda")
            if cast:
                x = x.type(torch.float32)
            s += x
        rows.append({"case": case, "dtype": NAMES[s.dtype], "sum": float(s.item())})
    return rows


class ToyModel(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.fc1 = nn.Linear(in_features, 10, bias=False)
        self.ln = nn.LayerNorm(10)
        self.fc2 = nn.Linear(10, out_features, bias=False)
        self.relu = nn.ReLU()

    def forward(self, x, trace):
        h = self.fc1(x)
        trace["fc1"] = NAMES[h.dtype]
        h = self.relu(h)
        trace["relu"] = NAMES[h.dtype]
        h = self.ln(h)
        trace["ln"] = NAMES[h.dtype]
        logits = self.fc2(h)
        trace["logits"] = NAMES[logits.dtype]
        return logits


def autocast_dtypes():
    rows = []
    for name, low in [("f16", torch.float16), ("bf16", torch.bfloat16)]:
        model = ToyModel(20, 5).cuda()
        x = torch.randn(8, 20, device="cuda")
        y = torch.randint(0, 5, (8,), device="cuda")
        trace = {}
        with torch.autocast("cuda", dtype=low):
            loss = nn.functional.cross_entropy(model(x, trace), y)
            trace["loss"] = NAMES[loss.dtype]
        loss.backward()
        trace["autocast"] = name
        trace["parameters"] = ", ".join(f"{n} {NAMES[p.dtype]}" for n, p in model.named_parameters())
        trace["gradients"] = ", ".join(f"{n} {NAMES[p.grad.dtype]}" for n, p in model.named_parameters())
        rows.append(trace)
    return rows


def op_policy():
    """Output dtype of each op under autocast, for f16/bf16 and f32 inputs."""
    out = {}
    F = nn.functional
    for name, low in [("f16", torch.float16), ("bf16", torch.bfloat16)]:
        h = torch.rand(3, 4, device="cuda", dtype=low) + 1
        f = torch.rand(3, 4, device="cuda") + 1
        w = torch.rand(5, 4, device="cuda")
        with torch.autocast("cuda", dtype=low):
            ops = {
                "matmul f32": f @ f.t(), "linear f32": F.linear(f, w, torch.rand(5, device="cuda")),
                "exp": h.exp(), "log": h.log(), "rsqrt": h.rsqrt(), "pow": h ** 2, "sum": h.sum(),
                "softmax": h.softmax(-1), "log_softmax": h.log_softmax(-1), "layer_norm": F.layer_norm(h, (4,)),
                "relu": h.relu(), "sqrt": h.sqrt(), "sigmoid": h.sigmoid(), "mean": h.mean(), "max": h.max(),
                "add mixed": h + f, "mul scalar": h * 2, "silu": F.silu(h), "gelu": F.gelu(h), "tanh": h.tanh(),
            }
        out[name] = {k: NAMES[v.dtype] for k, v in ops.items()}
    return out


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "oracles",
                                                               "mixed_precision.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    doc = {"torch": torch.__version__, "device": torch.cuda.get_device_name(),
           "accumulation": accumulation(), "autocast_dtypes": autocast_dtypes(), "op_policy": op_policy()}
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
    print(json.dumps(doc, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
