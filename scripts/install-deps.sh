#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages tfhost builds and tests with, skipping
# those already present. The CUDA Toolkit is optional and not installed here:
# when nvcc is found (on PATH or in /usr/local/cuda/bin) the CUDA backend is
# built, otherwise tfhost is CPU-only.
set -euo pipefail

packages=(
  build-essential cmake pkg-config  # compiler and build system
  liblua5.4-dev                     # Lua 5.4, linked statically
  libcjson-dev                      # JSON
  libedit-dev                       # line editing and history in the REPL
  libopenblas-openmp-dev            # the CPU backend's matrix products (OpenBLAS on OpenMP threads)
  libopenmpi-dev openmpi-bin        # tf.dist: CPU tensors between ranks (MPI), and mpirun for tfhost --nproc
  python3                           # the command-line tests
  python3-numpy                     # the safetensors interoperability test
  chromium                          # for the memory-plot test (renders tf.memviz's page)
)

# The Python packages tests/cli/test_safetensors_python.py reads and writes
# files with, for the python3 on PATH (which may not be Debian's): safetensors
# is not a Debian package, so pip installs what is missing for the user when
# it can. A failure is not an error: that test then skips and says why.
install_python_packages() {
  local need=()
  python3 -c "import numpy" 2>/dev/null || need+=(numpy)
  python3 -c "import safetensors" 2>/dev/null || need+=(safetensors)
  [ ${#need[@]} -eq 0 ] && return 0
  if python3 -m pip install --user --quiet --disable-pip-version-check "${need[@]}" >/dev/null 2>&1; then
    echo "install-deps: pip installed ${need[*]}"
  else
    echo "install-deps: could not pip install ${need[*]}; the safetensors Python test will be skipped"
  fi
}

# clang with libFuzzer, for scripts/fuzz.sh. Optional: where it cannot be
# installed, the fuzzing step of scripts/test.sh skips and says why.
optional=(clang libclang-rt-dev)

not_installed() {
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
  done
}
mapfile -t missing < <(not_installed "${packages[@]}")
mapfile -t missing_optional < <(not_installed "${optional[@]}")

if [ ${#missing[@]} -eq 0 ] && [ ${#missing_optional[@]} -eq 0 ]; then
  echo "install-deps: all packages present"
  install_python_packages
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null; then
    if [ ${#missing[@]} -gt 0 ]; then
      echo "install-deps: need root or sudo to install ${missing[*]}" >&2
      exit 1
    fi
    echo "install-deps: cannot install ${missing_optional[*]} (no root or sudo); scripts/fuzz.sh will skip"
    install_python_packages
    exit 0
  fi
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if [ ${#missing_optional[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing_optional[*]} (optional, for fuzzing)"
  $sudo apt-get install -y -qq --no-install-recommends "${missing_optional[@]}" ||
    echo "install-deps: could not install ${missing_optional[*]}; scripts/fuzz.sh will skip"
fi
install_python_packages
