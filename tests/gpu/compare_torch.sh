#!/usr/bin/env bash
# tfhost's experiments/benchmark.lua and PyTorch on the same configurations,
# in one run on one GPU, then the ratio table: PyTorch as CS336's eager
# reference (naive attention) and at its best (torch.compile, SDPA with its
# default backend, fused AdamW); TORCH_IMPL=eager (or compiled) runs one.
# CONTEXTS (default 128,256,512,1024), PRECISIONS (default f32,bf16) and
# STEPS (timed steps, default 5) narrow or lengthen the grid; compiling takes
# PyTorch 70-130 s a configuration, so a grid of many runs as several calls.
#   tests/gpu/compare_torch.sh build/bundle small,medium [extra benchmark options]
#   PRECISIONS=bf16 TORCH_IMPL=compiled CONTEXTS=1024,512 STEPS=20 tests/gpu/compare_torch.sh build/bundle 2.7B
set -uo pipefail
bin=$(realpath "${1:?usage: tests/gpu/compare_torch.sh path/to/bundle sizes [options]}")/tfhost
sizes=${2:?sizes}
shift 2
out=${OUT:-gpu-out}
mkdir -p "$out"
cd "$(dirname "$0")/../.."
tag=${sizes//,/-}
contexts=${CONTEXTS:-128,256,512,1024}
precisions=${PRECISIONS:-f32,bf16}
steps=${STEPS:-5}
common=(--size "$sizes" --context "$contexts" --precision "$precisions" --mode step --warmup 3 --steps "$steps")
"$bin" experiments/benchmark.lua "${common[@]}" "$@" --json "$out/tf_$tag.json" > "$out/tf_$tag.md" 2> "$out/tf_$tag.err"
"$bin" experiments/benchmark.lua --size small --context 128 --precision bf16 --mode fwd --warmup 5 --steps 10 \
  --json "$out/tf_fwd.json" > /dev/null 2>&1
python3 tests/reference/torch_benchmark.py --size "$sizes" --context "$contexts" --precision "$precisions" \
  --impl "${TORCH_IMPL:-eager,compiled}" --mode step --warmup 3 --steps "$steps" --json "$out/torch_$tag.json" --compare "$out/tf_$tag.json" 2> "$out/torch_$tag.err" \
  | tee "$out/compare_$tag.md" | grep "^|"
python3 tests/reference/torch_benchmark.py --size small --context 128 --precision bf16 --mode fwd --warmup 5 --steps 10 \
  --impl "${TORCH_IMPL:-eager,compiled}" --compare "$out/tf_fwd.json" 2>/dev/null | grep "^|"
# The same two files through tfhost compare (rows matched by configuration,
# ratios to PyTorch, the environments' differences, a plot), where PyTorch ran
# one implementation: with both, its impl column names configurations tfhost's
# file lacks.
if [[ "${TORCH_IMPL:-eager,compiled}" != *,* ]]; then
  "$bin" compare "$out/torch_$tag.json" "$out/tf_$tag.json" --plot "$out/compare_$tag.html" \
    > "$out/compare_tfhost_$tag.md"
  echo "tfhost compare: exit $? ($out/compare_tfhost_$tag.md, $out/compare_$tag.html)"
fi
