#!/usr/bin/env bash
# The observation experiments on a GPU machine, side by side with PyTorch
# where it has a figure: the cost of tf.mem.record and tf.prof on a training
# step, the memory profile (peaks beside torch.cuda.max_memory_allocated for
# the same configurations, and the snapshot read back by torch's own
# _memory_viz), and the kernel profile. Logs and JSON go to $OUT.
#   tests/gpu/observe.sh build/bundle memory|overhead|kernels [sizes] [contexts] [precision (kernels)]
set -uo pipefail
bin=$(realpath "${1:?usage: tests/gpu/observe.sh path/to/bundle memory|overhead|kernels [sizes] [contexts]}")/tfhost
what=${2:?memory, overhead or kernels}
out=${OUT:-gpu-out}
mkdir -p "$out"
cd "$(dirname "$0")/../.."

case $what in
overhead)
  sizes=${3:-small,2.7B}
  "$bin" experiments/overhead.lua --size "$sizes" --context 256 --precision bf16 \
    --json "$out/overhead_bf16.json" 2> "$out/overhead_bf16.err" | tee "$out/overhead_bf16.md"
  ;;
memory)
  sizes=${3:-2.7B}
  contexts=${4:-128,256,512}
  "$bin" experiments/memory_profile.lua --size "$sizes" --context "$contexts" --out "$out/memory" \
    --json "$out/memory_tf.json" 2> "$out/memory_tf.err" > "$out/memory_tf.md"
  tail -n +1 "$out/memory_tf.err" | grep -v "^$"
  python3 tests/reference/torch_benchmark.py --size "$sizes" --context "$contexts" --precision f32,bf16 \
    --mode fwd,step --warmup 1 --steps 2 --json "$out/memory_torch.json" > "$out/memory_torch.md" 2> "$out/memory_torch.err"
  python3 - "$out/memory_tf.json" "$out/memory_torch.json" <<'PY'
import json, sys
tf = json.load(open(sys.argv[1]))["results"]
torch = json.load(open(sys.argv[2]))["results"]
mode = {"forward": "fwd", "step": "step"}
ref = {(r["size"], r["context"], r["precision"], r["mode"]): r for r in torch}
print("| size | ctx | prec | mode | tfhost peak GiB | PyTorch peak GiB | ratio |")
print("|---|---|---|---|---|---|---|")
for r in tf:
    t = ref.get((r["size"], r["context"], r["precision"], mode[r["mode"]])) or \
        ref.get((r["size"], r["context"], r["precision"], "all"))
    mine = "OOM" if r.get("oom") else "%.2f" % r["peak_gib"]
    theirs = "-" if not t else ("OOM" if t.get("oom") else "%.2f" % t["peak_gib"])
    ratio = "%.3f" % (r["peak_gib"] / t["peak_gib"]) if t and not t.get("oom") and not r.get("oom") else "-"
    print(f"| {r['size']} | {r['context']} | {r['precision']} | {r['mode']} | {mine} | {theirs} | {ratio} |")
PY
  # PyTorch's own viewer code reads tfhost's snapshots
  python3 - "$out"/memory/*.pickle <<'PY'
import pickle, sys, time
from torch.cuda import _memory_viz as mv
for path in sys.argv[1:]:
    t0 = time.time()
    snap = pickle.load(open(path, "rb"))
    trace, seg = mv.trace_plot(snap), mv.segment_plot(snap)
    print(f"torch _memory_viz: {path.split('/')[-1]}: trace_plot {len(trace)} chars, segment_plot {len(seg)} chars, "
          f"{sum(len(t) for t in snap['device_traces'])} trace entries, {time.time() - t0:.1f} s")
PY
  ;;
kernels)
  sizes=${3:-small,medium,large,xl,2.7B}
  contexts=${4:-128,256,512,1024}
  precision=${5:-bf16}
  name=kernels_${sizes//,/-}_$precision
  "$bin" experiments/profile_kernels.lua --size "$sizes" --context "$contexts" --precision "$precision" \
    --warmup 2 --passes 2 --trace "$out/traces" --json "$out/$name.json" 2> "$out/kernels.err" \
    | tee "$out/$name.md"
  # the GEMM share beside PyTorch's profiler on the CS336 model (section d)
  python3 tests/reference/torch_profile_kernels.py --size "$sizes" --context "$contexts" --precision "$precision" \
    --json "$out/torch_$name.json" --compare "$out/$name.json" 2> "$out/torch_kernels.err" \
    | tee "$out/torch_$name.md"
  ;;
*)
  echo "observe.sh: unknown part '$what'" >&2
  exit 2
  ;;
esac
