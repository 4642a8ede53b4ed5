#!/usr/bin/env bash
# Makes the Python environment of the peer programs that `cohort bench ... --peers` runs beside
# cohort in the same invocation (benches/peers/*.py): a virtual environment at
# target/peers-venv (or $COHORT_PEERS_VENV) with the peers' packages, pinned.
#
#   bash benches/peers/setup.sh
#   cohort bench mwms --peers          # finds target/peers-venv/bin/python, or --python PATH
#
# TensorFlow 2.15 (the last release whose tf.keras is Keras 2, the API of TensorFlow's own
# MultiWorkerMirroredStrategy tutorials), CPU build, for Python 3.9 to 3.11.
set -euo pipefail
cd "$(dirname "$0")/../.."
venv="${COHORT_PEERS_VENV:-target/peers-venv}"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir \
  "tensorflow-cpu==2.15.1"
"$venv/bin/python" -c 'import tensorflow as tf; print("peers: tensorflow", tf.__version__)'
