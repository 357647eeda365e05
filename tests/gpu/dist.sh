#!/usr/bin/env bash
# tf.dist and data-parallel training on a machine with two GPUs or more,
# beside torch.distributed, in one call: the collectives' and DDP's tests as
# 2 GPU ranks (NCCL), then the all-reduce benchmark and the data-parallel
# step (XL, context 512, batch 4 per GPU, f32) on each side, one after the
# other. Logs and JSON go to $OUT (or ./gpu-out); `tfhost compare` tables are
# printed last. NVLink multicast (NVLS) stays off: shared GPU hosts can be
# put out of service by it.
#   tests/gpu/dist.sh build/bundle [nproc]
set -uo pipefail
dir=$(realpath "${1:?usage: tests/gpu/dist.sh path/to/bundle [nproc]}")
n=${2:-2}
bin=$dir/tfhost
out=${OUT:-gpu-out}
mkdir -p "$out" && out=$(realpath "$out")
: > "$out/dist_summary.txt"
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# mpirun refuses root unless told; the GPU machines run commands as root
[ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
failed=0
step() { # name, timeout in seconds, command...
  local name=$1 limit=$2 start rc
  shift 2
  start=$(date +%s)
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  rc=$?
  printf '%-14s rc=%-3s %4d s\n' "$name" "$rc" "$(( $(date +%s) - start ))" | tee -a "$out/dist_summary.txt" >&2
  [ $rc -eq 0 ] || [ $rc -eq 77 ] || failed=1
}

nvidia-smi topo -m > "$out/topology.txt" 2>&1
step test_dist 120 env TF_DIST_TIMEOUT=60 tests/lua/on_gpus.sh "$bin" "$n" tests/lua/test_dist.lua
step test_ddp 180 env TF_DIST_TIMEOUT=60 TF_DDP_DEVICE=default tests/lua/on_gpus.sh "$bin" "$n" tests/lua/test_ddp.lua
step ar_tfhost 300 "$bin" --nproc "$n" experiments/allreduce.lua --json "$out/allreduce_tf.json"
step ar_torch 300 python3 tests/reference/torch_allreduce.py --nproc "$n" --json "$out/allreduce_torch.json"
step ddp_tfhost 600 "$bin" --nproc "$n" experiments/ddp.lua --json "$out/ddp_tf.json"
step ddp_torch 900 python3 tests/reference/torch_ddp.py --nproc "$n" --json "$out/ddp_torch.json"

for t in test_dist test_ddp; do echo "== $t"; grep -v '^\[rank' "$out/$t.log" | grep -E 'FAIL|SKIP|tests,' ; done
echo "== all-reduce"
"$bin" compare "$out/allreduce_tf.json" "$out/allreduce_torch.json" | sed -n '/^### Results/,$p'
echo "== data-parallel step"
"$bin" compare "$out/ddp_tf.json" "$out/ddp_torch.json" | sed -n '/^### Results/,$p'
cat "$out/dist_summary.txt"
exit $failed
