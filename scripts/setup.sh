#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks to build and test Perseus, then builds it into
# build/. Safe to run again: it installs only what is missing and rebuilds incrementally.
#   scripts/setup.sh            install and build
#   scripts/setup.sh --no-build install only
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  # build
  build-essential cmake ninja-build pkg-config git
  # quality gates: clang for libFuzzer and the sanitizers, clang-format
  clang clang-format libclang-rt-14-dev
  # libraries
  libcli11-dev libspdlog-dev nlohmann-json3-dev libssh2-1-dev libgloo-dev doctest-dev
  openmpi-bin libopenmpi-dev
  # tests and the main job; python3-venv and python3-pip for the install tests (tests/install)
  python3 python3-venv python3-pip python3-pytest python3-numpy python3-torch procps iproute2 openssh-server
  openssh-client iputils-ping passwd
  # a real Slurm for tests/blackbox/test_slurm.py (slurmcluster.py): controller, node daemon,
  # commands, munge, and the PMI2 and PMIx client libraries libperseus loads under srun
  slurmctld slurmd slurm-client munge libpmi2-0 libpmix2
  # benchmarks
  hyperfine
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

scripts/setup_mxnet.sh  # .venv-mxnet: MXNet 1.9.1 (needs numpy < 1.24) for perseus.mxnet

# scikit-build-core (not packaged in Debian 12) for `pip install .`, as wheels in a folder that
# the install tests install from into their own throw-away venvs: nothing is installed here.
if ! ls build/wheelhouse/scikit_build_core-*.whl >/dev/null 2>&1; then
  /usr/bin/python3 -m pip download -q -d build/wheelhouse "scikit-build-core>=0.10"
fi

[ "${1:-}" = "--no-build" ] && exit 0
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build
echo "setup: built build/apps/perseusrun/perseusrun"
