#!/usr/bin/env bash
# Runs the whole test suite against a built tfhost on a GPU machine that has
# no build tools (the bundle), and the hello experiment beside PyTorch's
# figure for the same matrix product. Logs go to $OUT (or ./gpu-out).
#   tests/gpu/run.sh build/bundle/tfhost
set -uo pipefail
bin=$(realpath "${1:?usage: tests/gpu/run.sh path/to/tfhost}")
out=${OUT:-gpu-out}
mkdir -p "$out"
cd "$(dirname "$0")/../.."
failed=0

echo "== device"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
"$bin" -v
"$bin" -e 'print(tf.device()); for k, v in pairs(tf.device_info()) do print(k, v) end'

echo "== Lua tests"
for t in tests/lua/test_*.lua; do
  name=$(basename "$t" .lua)
  if "$bin" "$t" > "$out/$name.log" 2>&1; then
    echo "pass  $name ($(tail -1 "$out/$name.log"))"
  else
    echo "FAIL  $name"; tail -30 "$out/$name.log"; failed=1
  fi
done

echo "== CLI tests"
if python3 tests/cli/test_cli.py "$bin" > "$out/cli.log" 2>&1; then
  echo "pass  cli ($(grep -E '^(OK|Ran)' "$out/cli.log" | tr '\n' ' '))"
else
  echo "FAIL  cli"; tail -40 "$out/cli.log"; failed=1
fi

echo "== hello experiment, and PyTorch on the same product"
for dtype in f32 bf16; do
  "$bin" experiments/hello.lua --size 8192 --dtype "$dtype" --iters 20 --json "$out/hello_$dtype.json" | tail -3
done
python3 - <<'PY'
import torch
for dt in (torch.float32, torch.bfloat16):
    a = torch.randn(8192, 8192, device="cuda", dtype=dt); b = torch.randn(8192, 8192, device="cuda", dtype=dt)
    for _ in range(3): a @ b
    torch.cuda.synchronize()
    ts = []
    for _ in range(20):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); a @ b; e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
    ts.sort(); med = ts[len(ts) // 2]
    print(f"torch {torch.__version__} {dt}: median {med:.3f} ms, {2 * 8192**3 / med / 1e9:.1f} TFLOP/s")
PY
exit $failed
