#!/usr/bin/env bash
# Command (1) of the README: install what is missing, build tfhost (with the
# CUDA backend when the CUDA Toolkit is present), and run the main job on
# whatever device this machine has.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
[ -d /usr/local/cuda/bin ] && export PATH="$PATH:/usr/local/cuda/bin"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)"
main_job=experiments/mixed_precision.lua
[ -f "$main_job" ] || main_job=experiments/hello.lua
echo "setup: running build/tfhost $main_job"
build/tfhost "$main_job"
