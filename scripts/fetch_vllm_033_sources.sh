#!/usr/bin/env bash
# Unpack the pure-Python sources of the vllm==0.33.0 (CUDA) wheel into .cache/vllm-0.33.0, so the plugin's
# registration/validation tests run against 0.33's own code on a CPU machine (compiled extensions are left out).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PY:-$ROOT/.venv/bin/python}"
DEST="$ROOT/.cache/vllm-0.33.0"
[ -d "$DEST/vllm" ] && { echo "$DEST"; exit 0; }
mkdir -p "$ROOT/.cache/wheels"
"$PY" -m pip download -q --no-deps -d "$ROOT/.cache/wheels" vllm==0.33.0 >&2
rm -rf "$DEST.tmp"
"$PY" -c "import glob, sys; from glm5lib.vllm_plugin.compat import unpack_wheel_sources as u; \
print(u(glob.glob(sys.argv[1] + '/vllm-0.33.0-*.whl')[0], sys.argv[2]), 'files', file=sys.stderr)" \
    "$ROOT/.cache/wheels" "$DEST.tmp"
mv "$DEST.tmp" "$DEST"
echo "$DEST"
