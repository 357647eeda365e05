"""tfhost's generation against Hugging Face transformers' LlamaForCausalLM with the same weights.

1. The check: tfhost writes a model (its own initialisation), a prompt, its greedy continuation through
   the KV cache and each step's logits (tests/reference/generate_dump.lua); the weights go into a
   LlamaForCausalLM of the same configuration (no biases, rms_norm_eps 1e-5 as tfhost's RMSNorm,
   rope_theta, untied lm_head, intermediate_size = d_ff, num_key_value_heads = num_heads), and HF's
   logits over the same tokens must be tfhost's within the precision's tolerance, and HF's greedy
   tokens tfhost's.
   The RoPE pairing differs: tfhost turns interleaved pairs (x[2i], x[2i+1]) of each head, HF's
   rotate_half pairs (x[i], x[i + d/2]). Both turn pair i by the angle pos * theta^(-2i/d), so
   permuting the rows of q_proj and k_proj within each head (HF row i <- tfhost row 2i, HF row
   i + d/2 <- tfhost row 2i + 1) makes HF's rotation of the permuted q and k tfhost's rotation of the
   originals, permuted alike; q.k is unchanged by a permutation applied to both, v and the output are
   untouched.
2. The timing: HF's fastest generation (static KV cache, the forward compiled by torch.compile,
   greedy, random weights of each size), prefill and decode tokens/s, written as a results file;
   then tfhost's experiments/decode_benchmark.lua in the same call with --hf pointing at it, so its
   table has HF's tokens/s and the ratio beside its own.

    python3 tests/reference/hf_generate.py                           (GPU: check small bf16 and f32, time small..2.7B)
    python3 tests/reference/hf_generate.py --check-size 2.7B --sizes 2.7B --batch 1
    python3 tests/reference/hf_generate.py --device cpu --check-size tiny --sizes none   (CPU, transformers needed)
    python3 tests/reference/hf_generate.py --numpy-only --check-size tiny   (no torch: the mapping checked by a
                                                                             NumPy Llama forward, f32)
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)


def load_safetensors(path):
    from safetensors.numpy import load_file
    from safetensors import safe_open
    with safe_open(path, "np") as f:
        meta = f.metadata() or {}
    return load_file(path), meta


def tfhost_config(meta):
    c = {k: int(meta[k]) for k in ("vocab_size", "context_length", "d_model", "num_layers", "num_heads", "d_ff")}
    c["rope_theta"] = float(meta.get("rope_theta", 10000.0))
    return c


def rope_permutation(d_model, heads):
    """HF row r of q_proj/k_proj <- tfhost row perm[r]: within each head, the even rows then the odd ones."""
    hd = d_model // heads
    within = np.concatenate([np.arange(0, hd, 2), np.arange(1, hd, 2)])
    return np.concatenate([h * hd + within for h in range(heads)])


def hf_state_dict(w, cfg):
    """tfhost's (CS336) names -> LlamaForCausalLM's, q and k rows permuted per head."""
    perm = rope_permutation(cfg["d_model"], cfg["num_heads"])
    sd = {"model.embed_tokens.weight": w["token_embeddings.weight"], "model.norm.weight": w["ln_final.weight"],
          "lm_head.weight": w["lm_head.weight"]}
    for i in range(cfg["num_layers"]):
        p, q = f"layers.{i}.", f"model.layers.{i}."
        sd[q + "self_attn.q_proj.weight"] = w[p + "attn.q_proj.weight"][perm]
        sd[q + "self_attn.k_proj.weight"] = w[p + "attn.k_proj.weight"][perm]
        sd[q + "self_attn.v_proj.weight"] = w[p + "attn.v_proj.weight"]
        sd[q + "self_attn.o_proj.weight"] = w[p + "attn.output_proj.weight"]
        sd[q + "mlp.gate_proj.weight"] = w[p + "ffn.w1.weight"]
        sd[q + "mlp.up_proj.weight"] = w[p + "ffn.w3.weight"]
        sd[q + "mlp.down_proj.weight"] = w[p + "ffn.w2.weight"]
        sd[q + "input_layernorm.weight"] = w[p + "ln1.weight"]
        sd[q + "post_attention_layernorm.weight"] = w[p + "ln2.weight"]
    return sd


def numpy_llama_logits(sd, cfg, ids):
    """HF Llama's forward (rotate_half RoPE) in NumPy f32 over ids (B, T): logits (B, T, V)."""
    d, H, L = cfg["d_model"], cfg["num_heads"], cfg["num_layers"]
    hd, T = d // H, ids.shape[1]

    def rms(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * g

    inv = cfg["rope_theta"] ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = np.arange(T)[:, None] * inv[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))

    def rope(x):  # (B, H, T, hd)
        rot = np.concatenate([-x[..., hd // 2:], x[..., :hd // 2]], -1)
        return x * cos + rot * sin

    x = sd["model.embed_tokens.weight"][ids].astype(np.float64)
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(L):
        q = f"model.layers.{i}."
        h = rms(x, sd[q + "input_layernorm.weight"])
        heads = lambda w: (h @ w.T).reshape(ids.shape[0], T, H, hd).transpose(0, 2, 1, 3)
        Q, K, V = rope(heads(sd[q + "self_attn.q_proj.weight"])), rope(heads(sd[q + "self_attn.k_proj.weight"])), \
            heads(sd[q + "self_attn.v_proj.weight"])
        s = Q @ K.transpose(0, 1, 3, 2) / np.sqrt(hd) + mask
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        o = (p @ V).transpose(0, 2, 1, 3).reshape(ids.shape[0], T, d)
        x = x + o @ sd[q + "self_attn.o_proj.weight"].T
        h = rms(x, sd[q + "post_attention_layernorm.weight"])
        a, b = h @ sd[q + "mlp.gate_proj.weight"].T, h @ sd[q + "mlp.up_proj.weight"].T
        x = x + (a / (1 + np.exp(-a)) * b) @ sd[q + "mlp.down_proj.weight"].T
    return rms(x, sd["model.norm.weight"]) @ sd["lm_head.weight"].T


def run_tfhost(a, size, precision, out):
    cmd = [a.tfhost, os.path.join(ROOT, "tests/reference/generate_dump.lua"), "--size", size, "--precision", precision,
           "--batch", str(a.check_batch), "--prompt", str(a.check_prompt), "--new_tokens", str(a.check_new_tokens),
           "--out", out]
    if a.device == "cpu":
        cmd[1:1] = ["--device", "cpu"]
    subprocess.run(cmd, check=True)
    w, meta = load_safetensors(os.path.join(out, "weights.safetensors"))
    o, _ = load_safetensors(os.path.join(out, "outputs.safetensors"))
    n = o["tokens"].shape[1]
    steps = np.stack([o[f"logits.{s}"] for s in range(n)], 1)  # (B, n, V): the logits that chose token s
    return w, tfhost_config(meta), o["prompt"], o["tokens"], steps


def compare_logits(name, got, want, rtol, atol):
    err = np.abs(got - want)
    worst = float((err / (atol + rtol * np.abs(want))).max())
    rel = float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))
    ok = worst <= 1.0
    print(f"  {name}: max |diff| {err.max():.3g}, relative (norm) {rel:.3g}, worst/allowed {worst:.3g}: "
          f"{'ok' if ok else 'FAIL'}")
    return ok


TOL = {"f32": (1e-3, 1e-3), "bf16": (5e-2, 5e-2), "f16": (1e-2, 1e-2)}


def check(a, size, precision):
    """tfhost's decode logits and greedy tokens against HF's (or the NumPy Llama's) on the same weights."""
    print(f"check {size} {precision}:")
    with tempfile.TemporaryDirectory() as tmp:
        w, cfg, prompt, tokens, steps = run_tfhost(a, size, precision, tmp)
    sd = hf_state_dict(w, cfg)
    T, n = prompt.shape[1], tokens.shape[1]
    full = np.concatenate([prompt, tokens[:, :-1]], 1)  # teacher-forced on tfhost's tokens
    rtol, atol = TOL[precision]
    if a.numpy_only:
        ref = numpy_llama_logits(sd, cfg, full)[:, T - 1:]
        ok = compare_logits("logits (NumPy Llama, f64)", steps, ref, *TOL["f32" if precision == "f32" else precision])
        same = np.array_equal(ref.argmax(-1), tokens)
        print(f"  greedy tokens (argmax of the teacher-forced logits): {'identical' if same else 'DIFFER'}")
        return ok and (same or precision != "f32")
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[precision]
    model = make_hf(cfg, dtype, a.device)
    model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()}, strict=True)
    with torch.no_grad():
        ids = torch.from_numpy(full).to(a.device)
        ref = model(ids).logits[:, T - 1:].float().cpu().numpy()
        ok = compare_logits("logits (HF, teacher-forced on tfhost's tokens)", steps, ref, rtol, atol)
        gen = model.generate(torch.from_numpy(prompt).to(a.device), max_new_tokens=n, min_new_tokens=n,
                             do_sample=False, pad_token_id=0, eos_token_id=None)[:, T:].cpu().numpy()
    same = np.array_equal(gen, tokens)
    if same:
        print("  greedy tokens: identical")
    else:
        # a row may part at a tie of the precision's resolution (bf16: 8 bits, a step of 2^-7 of the value),
        # which has no right answer: two correct products rounded differently pick either token, and the
        # row goes its own way after it; anywhere else a differing token is a failure
        same = True
        for b in range(gen.shape[0]):
            diff = np.nonzero(gen[b] != tokens[b])[0]
            if len(diff) == 0:
                continue
            s = int(diff[0])
            top2 = np.sort(steps[b, s])[-2:]
            gap = top2[1] - top2[0]
            tie = precision != "f32" and gap <= 2.0 ** -7 * max(abs(top2[1]), 1.0)
            same = same and bool(tie)
            print(f"  greedy tokens of row {b}: {'identical up to a tie' if tie else 'DIFFER'} at token {s} "
                  f"(tfhost {tokens[b, s]}, HF {gen[b, s]}; tfhost's top-2 logits {top2[1]:.4f} and {top2[0]:.4f}: "
                  f"a gap of {gap:.3g}{', within one ' + precision + ' step' if tie else ''})")
    return ok and same


def make_hf(cfg, dtype, device):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    hc = LlamaConfig(vocab_size=cfg["vocab_size"], hidden_size=cfg["d_model"], intermediate_size=cfg["d_ff"],
                     num_hidden_layers=cfg["num_layers"], num_attention_heads=cfg["num_heads"],
                     num_key_value_heads=cfg["num_heads"], max_position_embeddings=cfg["context_length"],
                     rms_norm_eps=1e-5, rope_theta=cfg["rope_theta"], tie_word_embeddings=False,
                     attention_bias=False, mlp_bias=False, hidden_act="silu", torch_dtype=dtype)
    with torch.device(device):
        model = LlamaForCausalLM(hc).to(dtype)
    return model.eval()


PRESETS = {"tiny": (64, 256, 2, 4), "small": (768, 3072, 12, 12), "medium": (1024, 4096, 24, 16),
           "large": (1280, 5120, 36, 20), "xl": (1600, 6400, 48, 25), "2.7B": (2560, 10240, 32, 32)}


def time_hf(a, size, batch):
    """HF's fastest greedy generation: static cache, the forward compiled; the best of a.repeats."""
    import torch
    d, f, L, H = PRESETS[size]
    cfg = dict(vocab_size=10000, context_length=a.prompt + a.new_tokens, d_model=d, d_ff=f, num_layers=L,
               num_heads=H, rope_theta=10000.0)
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[a.precision]
    model = make_hf(cfg, dtype, a.device)
    # transformers compiles the decoding step itself when the cache is static (its compile_config:
    # torch.compile with CUDA graphs, marking each step for them); compiling model.forward by hand
    # with mode="reduce-overhead" instead fails in transformers 5 (a CUDA graph's output read after
    # the next replay overwrote it), so the by-hand compile without CUDA graphs is only the fallback.
    model.generation_config.cache_implementation = "static"
    impl = "hf_static_compiled_by_generate"
    ids = torch.randint(0, 10000, (batch, a.prompt), device=a.device)

    def gen(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0,
                           eos_token_id=None)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    try:
        for _ in range(2):  # compile, capture
            gen(a.new_tokens), gen(1)
    except RuntimeError as e:
        print(f"  HF {size} batch {batch}: generate's own compile failed ({str(e)[:120]}); "
              "compiling the forward without CUDA graphs", file=sys.stderr)
        torch._dynamo.reset()
        model.generation_config.compile_config = None
        model.forward = torch.compile(model.forward, mode="max-autotune-no-cudagraphs", fullgraph=True)
        impl = "hf_static_compiled_no_cudagraphs"
        for _ in range(2):
            gen(a.new_tokens), gen(1)
    prefill = min(gen(1) for _ in range(a.repeats))
    total = min(gen(a.new_tokens) for _ in range(a.repeats))
    decode = max(total - prefill, 1e-9)
    row = dict(size=size, batch=batch, precision=a.precision, prompt=a.prompt, new_tokens=a.new_tokens,
               impl=impl, prefill_ms=prefill * 1e3, total_ms=total * 1e3,
               tokens_per_s=batch * (a.new_tokens - 1) / decode)
    print(f"  HF {size} batch {batch} ({impl}): prefill {row['prefill_ms']:.2f} ms, "
          f"decode {row['tokens_per_s']:.1f} tokens/s")
    del model
    torch.cuda.empty_cache()
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tfhost", default=os.path.join(ROOT, "build-cuda", "tfhost"))
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--check-size", default="small", help="the preset of the logits and tokens check ('none': skip)")
    p.add_argument("--check-precisions", default="f32,bf16")
    p.add_argument("--check-batch", type=int, default=2)
    p.add_argument("--check-prompt", type=int, default=16)
    p.add_argument("--check-new-tokens", type=int, default=32)
    p.add_argument("--numpy-only", action="store_true", help="check against a NumPy Llama forward (no torch)")
    p.add_argument("--sizes", default="small,medium,large,xl,2.7B", help="the timed sizes ('none': no timing)")
    p.add_argument("--batch", default="1,16")
    p.add_argument("--precision", default="bf16")
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default="hf_generate.json", help="HF's timings (the --hf file of decode_benchmark.lua)")
    p.add_argument("--tfhost-json", default="decode_benchmark.json")
    a = p.parse_args()
    ok = True
    if a.check_size != "none":
        for prec in a.check_precisions.split(","):
            ok = check(a, a.check_size, prec) and ok
    if a.sizes != "none" and not a.numpy_only:
        import torch
        import transformers
        rows = [time_hf(a, s, int(b)) for s in a.sizes.split(",") for b in a.batch.split(",")]
        import results_file
        env = results_file.env(device=torch.cuda.get_device_name(), torch=torch.__version__,
                               cuda=torch.version.cuda, transformers=transformers.__version__)
        results_file.write(a.json, rows, ["size", "batch", "precision", "impl"], ["prefill_ms", "tokens_per_s"], env)
        print(f"wrote {a.json}; tfhost's decode benchmark in the same call:")
        subprocess.run([a.tfhost, os.path.join(ROOT, "experiments/decode_benchmark.lua"), "--size", a.sizes,
                        "--batch", a.batch, "--precision", a.precision, "--prompt", str(a.prompt), "--new_tokens",
                        str(a.new_tokens), "--repeats", str(a.repeats), "--hf", a.json, "--json", a.tfhost_json],
                       check=True)
    print("all checks passed" if ok else "CHECKS FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
