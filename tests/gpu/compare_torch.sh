#!/usr/bin/env bash
# tfhost's experiments/benchmark.lua and PyTorch on the same configurations,
# in one run on one GPU, then the ratio table: PyTorch as CS336's eager
# reference (naive attention) and at its best (torch.compile, SDPA with its
# default backend, fused AdamW); TORCH_IMPL=eager (or compiled) runs one.
#   tests/gpu/compare_torch.sh build/bundle small,medium [extra benchmark options]
set -uo pipefail
bin=$(realpath "${1:?usage: tests/gpu/compare_torch.sh path/to/bundle sizes [options]}")/tfhost
sizes=${2:?sizes}
shift 2
out=${OUT:-gpu-out}
mkdir -p "$out"
cd "$(dirname "$0")/../.."
tag=${sizes//,/-}
contexts=${CONTEXTS:-128,256,512,1024}
common=(--size "$sizes" --context "$contexts" --precision f32,bf16 --mode step --warmup 2 --steps 5)
"$bin" experiments/benchmark.lua "${common[@]}" "$@" --json "$out/tf_$tag.json" > "$out/tf_$tag.md" 2> "$out/tf_$tag.err"
"$bin" experiments/benchmark.lua --size small --context 128 --precision bf16 --mode fwd --warmup 5 --steps 10 \
  --json "$out/tf_fwd.json" > /dev/null 2>&1
python3 tests/reference/torch_benchmark.py --size "$sizes" --context "$contexts" --precision f32,bf16 \
  --impl "${TORCH_IMPL:-eager,compiled}" --mode step --warmup 3 --steps 5 --json "$out/torch_$tag.json" --compare "$out/tf_$tag.json" 2> "$out/torch_$tag.err" \
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
