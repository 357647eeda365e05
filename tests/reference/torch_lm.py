"""The CS336 "basics" Transformer LM in PyTorch: the reference tfhost's models are checked against.

Writes tests/reference/oracles/lm_tiny.safetensors: a tiny model's weights (CS336 state-dict names),
the config in the header metadata, a batch (ids, targets), and what PyTorch computes from them in
f32: logits, loss, every gradient ("grad.<name>"), every parameter after one torch.optim.AdamW step
with the defaults tfhost uses ("adamw.<name>"), and the logits under bf16 autocast
("logits_bf16", on a GPU). Run it where torch is (a GPU machine); commit the file it writes.

    python3 tests/reference/torch_lm.py [out.safetensors]
"""
import math
import os
import sys

import torch
import torch.nn as nn
from safetensors.torch import save_file

CONFIG = dict(vocab_size=64, context_length=16, d_model=32, num_layers=2, num_heads=4, d_ff=64, rope_theta=10000.0)
BATCH, SEQ, SEED = 2, 12, 1234


class Linear(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        std = math.sqrt(2.0 / (d_in + d_out))
        self.weight = nn.Parameter(nn.init.trunc_normal_(torch.empty(d_out, d_in), std=std, a=-3 * std, b=3 * std))

    def forward(self, x):
        return x @ self.weight.t()


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        dtype = x.dtype
        x = x.to(torch.float32)
        rms = torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x / rms * self.weight).to(dtype)


def rope(x, theta):
    """Interleaved pairs (x[2k], x[2k+1]) rotated by pos * theta^(-2k/d); positions 0..T-1 on dim -2."""
    d, t = x.shape[-1], x.shape[-2]
    freqs = theta ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    angles = torch.arange(t, device=x.device, dtype=torch.float32)[:, None] * freqs[None, :]
    cos, sin = angles.cos(), angles.sin()
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x0 * cos - x1 * sin
    out[..., 1::2] = x0 * sin + x1 * cos
    return out


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg["d_model"]
        self.h, self.dh, self.theta = cfg["num_heads"], d // cfg["num_heads"], cfg["rope_theta"]
        self.sdpa = cfg.get("sdpa", False)  # PyTorch's own attention (default backend) instead of CS336's
        self.q_proj, self.k_proj, self.v_proj, self.output_proj = (Linear(d, d) for _ in range(4))

    def forward(self, x):
        b, t, d = x.shape
        split = lambda y: y.view(b, t, self.h, self.dh).transpose(1, 2)
        q, k, v = rope(split(self.q_proj(x)), self.theta), rope(split(self.k_proj(x)), self.theta), split(self.v_proj(x))
        if self.sdpa:
            out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.output_proj(out.transpose(1, 2).reshape(b, t, d))
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.dh)
        future = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), diagonal=1)
        probs = scores.masked_fill(future, float("-inf")).softmax(-1)
        return self.output_proj((probs @ v).transpose(1, 2).reshape(b, t, d))


class SwiGLU(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, f = cfg["d_model"], cfg["d_ff"]
        self.w1, self.w2, self.w3 = Linear(d, f), Linear(f, d), Linear(d, f)

    def forward(self, x):
        return self.w2(nn.functional.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln1, self.attn = RMSNorm(cfg["d_model"]), Attention(cfg)
        self.ln2, self.ffn = RMSNorm(cfg["d_model"]), SwiGLU(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.ffn(self.ln2(x))


class TransformerLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.token_embeddings = nn.Embedding(cfg["vocab_size"], cfg["d_model"])
        nn.init.trunc_normal_(self.token_embeddings.weight, std=1.0, a=-3.0, b=3.0)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg["num_layers"]))
        self.ln_final = RMSNorm(cfg["d_model"])
        self.lm_head = Linear(cfg["d_model"], cfg["vocab_size"])

    def forward(self, ids):
        x = self.token_embeddings(ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.ln_final(x))


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "oracles", "lm_tiny.safetensors")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(SEED)
    torch.backends.cuda.matmul.allow_tf32 = False
    model = TransformerLM(CONFIG).to(device)
    ids = torch.randint(0, CONFIG["vocab_size"], (BATCH, SEQ), device=device)
    targets = torch.randint(0, CONFIG["vocab_size"], (BATCH, SEQ), device=device)
    out = {name: p.detach().clone() for name, p in model.named_parameters()}
    logits = model(ids)
    loss = nn.functional.cross_entropy(logits.reshape(-1, CONFIG["vocab_size"]), targets.reshape(-1))
    loss.backward()
    out.update(ids=ids, targets=targets, logits=logits.detach(), loss=loss.detach().reshape(()))
    out.update({"grad." + n: p.grad.detach().clone() for n, p in model.named_parameters()})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    opt.step()
    out.update({"adamw." + n: p.detach().clone() for n, p in model.named_parameters()})
    if device == "cuda":
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            out["logits_bf16"] = model_with(out, CONFIG, device)(ids).float()
    meta = {k: str(v) for k, v in CONFIG.items()}
    meta.update(torch_version=torch.__version__, device=torch.cuda.get_device_name() if device == "cuda" else "cpu",
                seed=str(SEED))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    save_file({k: v.contiguous().cpu() for k, v in out.items()}, path, metadata=meta)
    print(f"wrote {path}: loss {loss.item():.6f}, {len(out)} tensors, on {meta['device']}")


def model_with(tensors, cfg, device):
    """A fresh model holding the original (pre-step) weights."""
    m = TransformerLM(cfg).to(device)
    m.load_state_dict({n: tensors[n] for n, _ in m.named_parameters()})
    return m


if __name__ == "__main__":
    main()
