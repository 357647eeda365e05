#!/usr/bin/env bash
# FlashAttention beside PyTorch's scaled_dot_product_attention (flash
# backend) in one call on a GPU machine:
#   1. the CS336 leaderboard shape, q/k/v of (1, 16, 16384, 64) bf16 causal,
#      forward + backward: experiments/flash_benchmark.lua and
#      tests/reference/torch_attention.py --leaderboard, timed the same way
#      (wall clock between synchronisations, median);
#   2. batch 1, causal, bf16, head dims 64 and 128, lengths 4096..65536:
#      flash_benchmark.lua and torch_attention.py --flash;
#   3. the kernels alone (CUDA events): test_flash_cuda with TF_FLASH_BENCH=1,
#      which also checks them against the CPU first, and PyTorch at the same
#      (16, 16384, d) shapes.
# Logs, JSON and a summary table go to $OUT (or ./gpu-out).
#   tests/gpu/flash.sh build/bundle
set -uo pipefail
dir=$(realpath "${1:?usage: tests/gpu/flash.sh path/to/bundle}")
bin=$dir/tfhost
out=${OUT:-gpu-out}
mkdir -p "$out"
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1

"$bin" experiments/flash_benchmark.lua --seq 16384 --d 64 --heads 16 --dtype bf16 --impl flash \
  --json "$out/leaderboard_tf.json" > "$out/leaderboard_tf.md" 2>&1
python3 tests/reference/torch_attention.py --leaderboard --json "$out/leaderboard_torch.json" \
  > "$out/leaderboard_torch.md" 2>&1
"$bin" experiments/flash_benchmark.lua --seq 4096,16384,65536 --d 64,128 --dtype bf16 --impl flash \
  --json "$out/flash_tf.json" > "$out/flash_tf.md" 2>&1
python3 tests/reference/torch_attention.py --flash --seq 4096,16384,65536 --d 64,128 --dtype bf16 --impl flash \
  --json "$out/flash_torch.json" > "$out/flash_torch.md" 2>&1
if [ -x "$dir/test_flash_cuda" ]; then
  TF_FLASH_BENCH=1 "$dir/test_flash_cuda" > "$out/kernels_tf.log" 2>&1
  echo "test_flash_cuda rc=$?" >> "$out/kernels_tf.log"
fi
python3 tests/reference/torch_attention.py --flash --batch 16 --seq 16384 --d 64,128 --dtype bf16 --impl flash \
  > "$out/kernels_torch.md" 2>&1

python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
def rows(name):
    try:
        return json.load(open(os.path.join(out, name)))["results"]
    except (OSError, ValueError, KeyError) as e:
        print(f"({name}: {e})")
        return []
def key(r):
    return (int(r["d"]), int(r["seq"]))
def ms(r, what):
    v = r.get(what)
    return float(v) if isinstance(v, (int, float)) else float("nan")
for title, tf_name, torch_name in (("leaderboard (1, 16, 16384, 64)", "leaderboard_tf.json", "leaderboard_torch.json"),
                                   ("batch 1, one head", "flash_tf.json", "flash_torch.json")):
    ref = {key(r): r for r in rows(torch_name) if r.get("impl") == "flash"}
    print(f"\n### {title}, bf16, causal: tfhost vs PyTorch (ms)\n")
    print("| d | seq | fwd | PyTorch fwd | bwd | PyTorch bwd | fwd+bwd | PyTorch fwd+bwd | ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows(tf_name):
        if r.get("impl") != "flash" or key(r) not in ref:
            continue
        t = ref[key(r)]
        a, b = ms(r, "fwdbwd_ms"), ms(t, "fwdbwd_ms")
        print(f"| {r['d']} | {r['seq']} | {ms(r, 'fwd_ms'):.3f} | {ms(t, 'fwd_ms'):.3f} | {ms(r, 'bwd_ms'):.3f} | "
              f"{ms(t, 'bwd_ms'):.3f} | {a:.3f} | {b:.3f} | {a / b:.2f} |")
PY
echo
grep -E "checks|rc=" "$out/kernels_tf.log" 2>/dev/null
sed -n '/^timings/,$p' "$out/kernels_tf.log" 2>/dev/null | grep -E "causal|deterministic|mma.sync"
grep "| bf16" "$out/kernels_torch.md"
