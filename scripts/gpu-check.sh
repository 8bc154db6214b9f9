#!/usr/bin/env bash
# make gpu-check: install the wheels `make gpu-wheels` put into .whl/ (only those whose module this
# Python lacks), then run scripts/gpu_check.py with the arguments given here.
#
# Made for a lent GPU machine without network: nothing is downloaded, torch is never installed or
# upgraded (the check runs with the torch it finds), and the wheels go to a folder outside the
# repository that is put first on PYTHONPATH. Without CUDA the same run is the CPU dry run.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
SITE="${GPU_CHECK_SITE:-${TMPDIR:-/tmp}/inferix-gpu-check-site}"

wanted=$("$PYTHON" scripts/gpu_check.py --missing-wheels)
read -r -a missing <<<"$wanted"
if ((${#missing[@]})); then
    if [ -d .whl ]; then
        echo "gpu-check: installing ${missing[*]} from .whl/ into $SITE"
        "$PYTHON" -m pip install --quiet --no-index --find-links .whl --no-deps --no-compile --no-cache-dir \
            --upgrade --target "$SITE" "${missing[@]}" ||
            echo "gpu-check: pip could not install them; the stages that import them will fail" >&2
    else
        echo "gpu-check: ${missing[*]} missing and no .whl/ here: run 'make gpu-wheels' where PyPI is" \
            "reachable and carry .whl; the stages that import them will fail" >&2
    fi
fi
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export GPU_CHECK_COMMAND="bash scripts/gpu-check.sh"
exec "$PYTHON" scripts/gpu_check.py "$@"
