#!/usr/bin/env bash
# Sourced by e2e.sh and run.sh on the GPU machine: installs the carried pack (bench/gpu/pack/, built here by
# pack.sh) without network into $SITE (default /tmp/quarl-site) and puts it first on PYTHONPATH, with the
# repository after it. Not a venv: that machine's python3 is itself a venv, and a venv made from it does not
# see the machine's JAX (CUDA); a --target folder on PYTHONPATH does. $PYTHON is the interpreter (python3).
PYTHON=${PYTHON:-python3}
SITE=${SITE:-/tmp/quarl-site}
PACK=${PACK:-bench/gpu/pack}
if [ ! -f "$PACK/trimmed.tar.xz" ]; then
  echo "install.sh: no pack at $PACK (build it with bash bench/gpu/pack.sh and carry bench/gpu/pack)" >&2
  exit 2
fi
rm -rf "$SITE" && mkdir -p "$SITE"
"$PYTHON" -m pip install --quiet --no-index --no-deps --no-compile --disable-pip-version-check --target "$SITE" \
  "$PACK"/wheels/*.whl
tar -xJf "$PACK/trimmed.tar.xz" -C "$SITE"
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
