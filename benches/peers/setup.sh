#!/usr/bin/env bash
# Makes the Python environment of the peer programs that `cohort bench ... --peers` runs beside
# cohort in the same invocation (benches/peers/*.py): a virtual environment at
# target/peers-venv (or $COHORT_PEERS_VENV) with the peers' packages, pinned.
#
#   bash benches/peers/setup.sh                          # TensorFlow and PyTorch
#   COHORT_PEERS=tensorflow bash benches/peers/setup.sh  # one of them
#   cohort bench mwms --peers          # finds target/peers-venv/bin/python, or --python PATH
#
# TensorFlow 2.15 (the last release whose tf.keras is Keras 2, the API of TensorFlow's own
# MultiWorkerMirroredStrategy tutorials), CPU build, for Python 3.9 to 3.11: tf_mwms.py,
# tf_ps.py. PyTorch 2.5.1 from PyPI (its Linux build brings its CUDA libraries: about 3 GB to
# download, 5 GB installed; the peers use its CPU ops, gloo and TensorPipe): torch_ddp.py,
# torch_ps.py, gloo_allreduce.py; with it cohort's own Python package (./python) for
# cohort_python_ps.py.
set -euo pipefail
cd "$(dirname "$0")/../.."
venv="${COHORT_PEERS_VENV:-target/peers-venv}"
peers=",${COHORT_PEERS:-tensorflow,pytorch},"
python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir)
if [[ "$peers" == *,tensorflow,* ]]; then
  "${pip[@]}" "tensorflow-cpu==2.15.1"
  "$venv/bin/python" -c 'import tensorflow as tf; print("peers: tensorflow", tf.__version__)'
fi
if [[ "$peers" == *,pytorch,* ]]; then
  "${pip[@]}" "torch==2.5.1"
  "$venv/bin/python" -c 'import torch, torch.distributed as d; assert d.is_gloo_available(); print("peers: torch", torch.__version__)'
  # cohort from Python (cohort_python_ps.py runs its job with PyTorch steps): the package as a
  # user installs it (maturin, release build of the native module).
  "${pip[@]}" ./python
  "$venv/bin/python" -c 'import cohort; print("peers: cohort (Python)", cohort.__version__)'
fi
