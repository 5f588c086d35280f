#!/usr/bin/env bash
# Makes .venv-mxnet: a virtual environment with MXNet 1.9.1 (the CPU build from PyPI) for
# perseus.mxnet, its tests and examples/mxnet_mnist.py. MXNet 1.9.1 needs numpy older than 1.24
# and Debian 12 ships 1.24, so the environment does not see the system's packages.
# Safe to run again: does nothing when the environment is there and imports MXNet 1.9.1.
#   scripts/setup_mxnet.sh          (PYTHON=/usr/bin/python3 by default; Debian 12: 3.11)
set -euo pipefail
cd "$(dirname "$0")/.."

venv=.venv-mxnet
python=${PYTHON:-/usr/bin/python3}
check='import mxnet, numpy, pytest; assert mxnet.__version__ == "1.9.1", mxnet.__version__; mxnet.nd.ones((1,)).asnumpy()'

if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "$check" 2>/dev/null; then
  echo "setup_mxnet: $venv has mxnet 1.9.1"
  exit 0
fi

# python3 -m venv needs Debian's python3-venv (ensurepip).
if ! "$python" -c 'import ensurepip, venv' 2>/dev/null; then
  echo "setup_mxnet: installing python3-venv"
  sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    python3-venv >/dev/null
fi

rm -rf "$venv"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check \
  "mxnet==1.9.1" "numpy<1.24" pytest
"$venv/bin/python" -c "$check"
echo "setup_mxnet: made $venv with mxnet 1.9.1"
