#!/usr/bin/env bash
# Two builds of tfhost side by side on one GPU, in one call: the eager ops
# whose kernels the fused engine shares (tests/gpu/ops_bench.lua) and the
# fused engine's steps (experiments/benchmark.lua), each workload run by
# one build and then the other, twice, the better of the two runs kept.
# For checking that a change to shared kernels leaves both paths' speed as
# it was. Logs and JSON go to $OUT (or ./gpu-out); a table is printed last.
#   tests/gpu/ops_compare.sh path/to/old/bundle path/to/new/bundle [sizes] [contexts] [precisions]
set -uo pipefail
old=$(realpath "${1:?usage: tests/gpu/ops_compare.sh OLD_BUNDLE NEW_BUNDLE [sizes] [contexts]}")/tfhost
new=$(realpath "${2:?usage: tests/gpu/ops_compare.sh OLD_BUNDLE NEW_BUNDLE [sizes] [contexts]}")/tfhost
sizes=${3:-small,xl}
contexts=${4:-128,1024}
precisions=${5:-bf16,f32}
out=${OUT:-gpu-out}/compare
mkdir -p "$out"
cd "$(dirname "$0")/../.."

for round in 1 2; do
  for which in old new; do
    bin=$old; [ $which = new ] && bin=$new
    for dt in bf16 f32; do
      "$bin" tests/gpu/ops_bench.lua --dtype $dt --json "$out/ops_${which}_${dt}_$round.json" \
        > "$out/ops_${which}_${dt}_$round.log" 2>&1 || echo "ops_bench $which $dt failed: see $out"
    done
    "$bin" experiments/benchmark.lua --size "$sizes" --context "$contexts" --precision "$precisions" --mode fwd,step \
      --json "$out/step_${which}_$round.json" > "$out/step_${which}_$round.log" 2>&1 \
      || echo "benchmark $which failed: see $out"
  done
done

python3 - "$out" <<'PY'
import glob, json, os, sys
out = sys.argv[1]

def best(pattern, key, value):
    rows = {}
    for path in sorted(glob.glob(os.path.join(out, pattern))):
        for r in json.load(open(path))["results"]:
            if r.get(value) is None:
                continue
            k = key(r)
            rows[k] = min(rows.get(k, float("inf")), r[value])
    return rows

print("\n| eager op | dtype | old fwd+bwd ms | new fwd+bwd ms | new/old |")
print("|---|---|---|---|---|")
o = best("ops_old_*.json", lambda r: (r["op"], r["dtype"]), "fwdbwd_ms")
n = best("ops_new_*.json", lambda r: (r["op"], r["dtype"]), "fwdbwd_ms")
for k in sorted(o):
    if k in n:
        print(f"| {k[0]} | {k[1]} | {o[k]:.3f} | {n[k]:.3f} | {n[k] / o[k]:.3f} |")
print("\n| fused engine | old ms | new ms | new/old |")
print("|---|---|---|---|")
key = lambda r: (r["size"], r["context"], r["precision"], r["mode"])
o = best("step_old_*.json", key, "median_ms")
n = best("step_new_*.json", key, "median_ms")
for k in sorted(o):
    if k in n:
        print(f"| {k[0]} ctx {k[1]} {k[2]} {k[3]} | {o[k]:.3f} | {n[k]:.3f} | {n[k] / o[k]:.3f} |")
PY
