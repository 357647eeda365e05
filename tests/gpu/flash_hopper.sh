#!/usr/bin/env bash
# tfhost's FlashAttention beside PyTorch's scaled_dot_product_attention, in
# one call on a GPU machine, at the shapes that matter on Hopper: causal,
# bf16, forward + backward, (batch, heads, seq, head dim) =
#   (1, 16, 16384, 64)   the CS336 leaderboard shape
#   (1, 16, 16384, 128)  the forward-rate shape
#   (1, 16, 16384, 96)
#   (4, 32, 4096, 80)    the 2.7B model's head dim
#   (4, 32, 1024, 80)    the 2.7B model's training context
# PyTorch twice: with its default backend selection (what its users run; on
# Hopper that is cuDNN's attention) and with the FLASH_ATTENTION backend
# (FlashAttention-2). Timed the same way on both sides: synchronise, time,
# median of 20 after 5 warm-up calls. Logs and JSON go to $OUT (or ./gpu-out);
# the table is printed last and written to $OUT/flash_hopper.md.
#   tests/gpu/flash_hopper.sh build/bundle
set -uo pipefail
dir=$(realpath "${1:?usage: tests/gpu/flash_hopper.sh path/to/bundle}")
bin=$dir/tfhost
out=${OUT:-gpu-out}
mkdir -p "$out"
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1

shapes="1,16,16384,64 1,16,16384,128 1,16,16384,96 4,32,4096,80 4,32,1024,80"
for s in $shapes; do
  IFS=, read -r b h n d <<< "$s"
  tag=b${b}_h${h}_s${n}_d${d}
  echo "== $tag" >&2
  "$bin" experiments/flash_benchmark.lua --batch "$b" --heads "$h" --seq "$n" --d "$d" --dtype bf16 --impl flash \
    --json "$out/hopper_tf_$tag.json" > "$out/hopper_tf_$tag.md" 2>&1 || echo "tfhost failed at $tag" >&2
  python3 tests/reference/torch_attention.py --flash --batch "$b" --heads "$h" --seq "$n" --d "$d" --dtype bf16 \
    --impl default,flash --json "$out/hopper_torch_$tag.json" > "$out/hopper_torch_$tag.md" 2>&1 ||
    echo "PyTorch failed at $tag" >&2
done

python3 - "$out" $shapes <<'PY'
import json, os, sys
out, shapes = sys.argv[1], sys.argv[2:]
def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
def ms(row, key):
    v = row.get(key) if row else None
    return v if isinstance(v, (int, float)) else None
def f(v, spec=".3f"):
    return "-" if v is None else format(v, spec)
lines = ["| shape (batch, heads, seq, d) | tfhost fwd ms | tfhost fwd TFLOP/s | tfhost fwd+bwd ms "
         "| PyTorch default fwd ms | PyTorch default fwd+bwd ms | PyTorch FLASH_ATTENTION fwd+bwd ms "
         "| tfhost / default (fwd+bwd) | default backend |",
         "|---|---|---|---|---|---|---|---|---|"]
env = None
for s in shapes:
    b, h, n, d = s.split(",")
    tag = f"b{b}_h{h}_s{n}_d{d}"
    tf = load(os.path.join(out, f"hopper_tf_{tag}.json"))
    th = load(os.path.join(out, f"hopper_torch_{tag}.json"))
    tfr = next((r for r in (tf or {}).get("results", []) if r.get("impl") == "flash"), None)
    rows = (th or {}).get("results", [])
    dflt = next((r for r in rows if r.get("impl") == "default"), None)
    fl = next((r for r in rows if r.get("impl") == "flash"), None)
    env = env or (th or {}).get("env")
    a, c = ms(tfr, "fwdbwd_ms"), ms(dflt, "fwdbwd_ms")
    ratio = f"{a / c:.2f}x" if a and c else "-"
    lines.append(f"| ({b}, {h}, {n}, {d}) | {f(ms(tfr, 'fwd_ms'))} | {f(ms(tfr, 'fwd_tflops'), '.0f')} | {f(a)} "
                 f"| {f(ms(dflt, 'fwd_ms'))} | {f(c)} | {f(ms(fl, 'fwdbwd_ms'))} | {ratio} "
                 f"| {(dflt or {}).get('backend', '-')} |")
head = "FlashAttention, causal bf16, tfhost against PyTorch's scaled_dot_product_attention"
if env:
    head += f" (torch {env.get('torch')}, cuDNN {env.get('cudnn')}, {env.get('device')})"
text = head + "\n\n" + "\n".join(lines) + "\n"
with open(os.path.join(out, "flash_hopper.md"), "w") as fh:
    fh.write(text)
print(text)
PY
