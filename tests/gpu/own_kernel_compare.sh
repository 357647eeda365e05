#!/usr/bin/env bash
# A script's own kernels on a GPU machine, in one call: experiments/own_kernel.lua (compile and launch
# costs, the fused softmax, FlashAttention-2 in CUDA C beside tfhost's, the eager model trained with
# it), Triton's launch from Python (tests/reference/triton_launch.py), and the same FlashAttention-2
# and softmax sources built by nvcc (tests/gpu/own_kernel_nvcc.cu, built beside the bundle), so that
# NVRTC's code and nvcc's are timed on one machine in one run, and in one process (own_kernel_nvcc
# --nvrtc: NVRTC's CUBIN as tfhost compiles it, mod.code, beside nvcc's, the same inputs and
# launches). Logs and JSON go to $OUT (or ./gpu-out); the comparison table is printed last.
#   tests/gpu/own_kernel_compare.sh path/to/bundle [path/to/own_kernel_nvcc]
set -uo pipefail
dir=$(realpath "${1:?usage: tests/gpu/own_kernel_compare.sh path/to/bundle [own_kernel_nvcc]}")
nvcc_bin=${2:-$dir/own_kernel_nvcc}
out=${OUT:-gpu-out}
mkdir -p "$out"
out=$(realpath "$out")
cd "$(dirname "$0")/../.."
export TFHOST_KERNEL_CACHE=$out/kernel-cache
status=0
"$dir/tfhost" experiments/own_kernel.lua --json "$out/own_kernel.json" > "$out/own_kernel.log" 2>&1 || status=1
tail -n 60 "$out/own_kernel.log"
if python3 -c "import triton" 2> /dev/null; then
  python3 tests/reference/triton_launch.py --json "$out/triton_launch.json" > "$out/triton_launch.log" 2>&1 || status=1
  cat "$out/triton_launch.log"
else
  echo "own_kernel_compare.sh: no Triton here: its launch is not timed"
fi
if [ -x "$nvcc_bin" ]; then
  "$nvcc_bin" > "$out/own_kernel_nvcc.log" 2>&1 || status=1
  grep -v '^{' "$out/own_kernel_nvcc.log" | tail -n 30
  # both builds in one process: NVRTC's CUBIN as tfhost compiles it (mod.code), loaded beside nvcc's
  CUBIN="$out/flash2_nvrtc.cubin" "$dir/tfhost" -e 'local ex = {}
    for _, d in ipairs {64, 128} do
      for _, k in ipairs {"flash2_fwd<%d, true>", "flash2_bwd_prep<%d>", "flash2_bwd_dkdv<%d, true>",
                          "flash2_bwd_dq<%d, true>"} do ex[#ex + 1] = k:format(d) end
    end
    local m = tf.cuda.compile_file("experiments/kernels/flash2.cu", {instantiate = ex})
    local f = assert(io.open(os.getenv("CUBIN"), "wb")); f:write(m.code); f:close()' || status=1
  "$nvcc_bin" --nvrtc "$out/flash2_nvrtc.cubin" > "$out/own_kernel_ab.log" 2>&1 || status=1
  cat "$out/own_kernel_ab.log"
else
  echo "own_kernel_compare.sh: no $nvcc_bin: nvcc's build of the same sources is not timed"
fi
python3 - "$out" << 'EOF'
import json, os, sys
out = sys.argv[1]
def load(name):
    path = os.path.join(out, name)
    return json.load(open(path)) if os.path.exists(path) else None
own = load("own_kernel.json")
rows = (own or {}).get("results", [])
launch = next((r for r in rows if r.get("part") == "launch" and "us" in r), None)
triton = load("triton_launch.json")
print("\n| measure | tfhost | reference | ratio |\n|---|---|---|---|")
if launch and triton:
    t = triton["rows"][0]["host_us"]
    print(f"| host time of one launch | {launch['us']:.2f} us (Lua) | {t:.2f} us (Triton {triton['triton']}, Python) | {t / launch['us']:.1f}x less |")
for r in rows:
    if r.get("part") == "launch" and "ms" in r:
        print(f"| {r['what']} | {r['ms']:.1f} ms | | |")
nvcc = {}
path = os.path.join(out, "own_kernel_nvcc.log")
if os.path.exists(path):
    for line in open(path):
        if line.startswith("{"):
            j = json.loads(line)
            nvcc[(j["kernel"], tuple(j["shape"]))] = j["ms"]
for r in rows:
    if r.get("part") == "flash" and r.get("impl") == "script flash2":
        shape = tuple(int(x) for x in r["shape"].split("x"))
        d = shape[3]
        for kind, ms in (("flash2_fwd<%d, true>" % d, r["kernels_fwd_ms"]), ("flash2_fwd+bwd<%d, true>" % d, r["kernels_fwd_bwd_ms"])):
            ref = nvcc.get((kind, shape))
            if ref:
                print(f"| {kind} {r['shape']}: NVRTC | {ms:.3f} ms | {ref:.3f} ms (nvcc) | {ref / ms:.3f} |")
# the same two builds timed in one process, the same inputs and launches (own_kernel_nvcc --nvrtc)
path = os.path.join(out, "own_kernel_ab.log")
if os.path.exists(path):
    for line in open(path):
        if line.startswith("{"):
            j = json.loads(line)
            shape = "x".join(str(x) for x in j["shape"])
            print(f"| {j['kernel']} {shape}, one process: NVRTC | {j['nvrtc_ms']:.3f} ms | {j['nvcc_ms']:.3f} ms (nvcc) "
                  f"| {j['ratio']:.3f}{'' if j['equal'] else ' (outputs differ!)'} |")
EOF
exit $status
