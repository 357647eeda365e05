#!/usr/bin/env bash
# Command (2) of the README, and what CI runs: install what is missing, then
# build and run every test in two configurations:
#   build-test/  warnings as errors, the CUDA backend compiled when nvcc is
#                found (GPU tests skip, saying why, when no GPU is present);
#   build-asan/  the CPU backend under AddressSanitizer + UndefinedBehaviorSanitizer;
#   build-fuzz/  the parsers' libFuzzer harnesses, 12 s each (scripts/fuzz.sh; it
#                skips, saying why, where clang's libFuzzer could not be installed).
# Pass --no-asan to run the first configuration only.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
[ -d /usr/local/cuda/bin ] && export PATH="$PATH:/usr/local/cuda/bin"
jobs=$(nproc)

run_config() {
  local dir=$1
  shift
  echo "== $dir: $*"
  cmake -S . -B "$dir" -DTF_WERROR=ON "$@"
  cmake --build "$dir" -j"$jobs"
  (cd "$dir" && ctest --output-on-failure -j"$jobs")
}

# The external conformance vectors live beside the checkout (../shared); where
# they are, their test must run: a skip is then a failure.
if [ -f "${TF_SHARED_DIR:-../shared}/conformance/cs336_a1_vectors.safetensors" ]; then
  export TF_REQUIRE_CONFORMANCE=1
  echo "test: conformance vectors found: lua_test_conformance must run"
fi

start=$(date +%s)
run_config build-test -DCMAKE_BUILD_TYPE=RelWithDebInfo
if [ "${1:-}" != "--no-asan" ]; then
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    run_config build-asan -DCMAKE_BUILD_TYPE=Debug -DTF_CUDA=OFF -DTF_SANITIZE=ON
  echo "== build-fuzz: scripts/fuzz.sh"
  scripts/fuzz.sh
fi
echo "test: all configurations passed in $(( $(date +%s) - start )) s"
