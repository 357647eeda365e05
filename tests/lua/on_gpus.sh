#!/bin/sh
# Runs a tf.dist test file as N ranks, one per GPU (tfhost --nproc N), or
# skips (exit 77, saying why) on a machine with fewer GPUs. ctest's
# dist_2_gpus and ddp_2_gpus; tests/gpu/run.sh.
#   tests/lua/on_gpus.sh path/to/tfhost N tests/lua/test_dist.lua
bin=$1 n=$2
shift 2
have=$("$bin" -e 'io.write(tf.cuda.device_count())') || exit 1
if [ "$have" -lt "$n" ]; then
  echo "SKIP: needs $n GPUs (one a rank, through NCCL); this machine has $have"
  exit 77
fi
exec "$bin" --nproc "$n" "$@"
