#!/usr/bin/env bash
# The GPU machine's install, rehearsed here on the CPU: a Python 3.12 venv holding only what that machine has
# (bench/gpu/machine-packages.txt, at the versions its notes give, else requirements-py312.lock's; the CPU
# jaxlib 0.11.2 in place of the CUDA one; installed --no-deps, so nothing else creeps in), then the carry pack
# (pack.sh, built if missing) installed as e2e.sh installs it, then a tiny end-to-end run through e2e.sh.
#   bash bench/gpu/smoke.sh [OUT]     # exit 0: passed; 77: skipped (no Python 3.12, or no package index)
# On a pass it writes bench/gpu/rehearsed.sha256 (bench/gpu/inputs.sh's digest of what it rehearsed): commit it.
# The venv is kept in $VENV312 (default /tmp/quarl-py312-machine) and rebuilt when its package list changes.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-runs/bench/gpu-smoke}
VENV=${VENV312:-/tmp/quarl-py312-machine}
skip() { echo "smoke.sh: skipped: $*"; exit 77; }

is312() { [ -n "$1" ] && "$1" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; }
if ! is312 "${PY312:-}"; then  # the first that runs as 3.12 (a pyenv shim may exist and refuse to run)
  PY312=
  for candidate in $(command -v python3.12) /usr/bin/python3.12 /usr/local/bin/python3.12 \
      $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12 2>/dev/null); do
    if is312 "$candidate"; then PY312=$candidate; break; fi
  done
fi
is312 "$PY312" || skip "no Python 3.12 here (python3.12 on PATH, pyenv's 3.12, or PY312=...)"

# name==version for every machine package the 3.12 lock knows (jax-cuda13-*: the CPU jaxlib stands in).
SPECS=$("$PY312" - <<'PY'
import re
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
lock = {norm(n): v for n, _, v in (l.strip().partition("==") for l in open("requirements-py312.lock"))
        if v and not n.startswith("#")}
for line in open("bench/gpu/machine-packages.txt"):
    name, _, version = line.strip().partition("==")
    if not name or name.startswith("#") or name.startswith("jax-cuda"):
        continue
    version = version or lock.get(norm(name))
    if version:
        print(f"{name}=={version}")
PY
)
STAMP="$VENV/.machine-$(echo "$SPECS" | sha256sum | cut -c1-16)"
if [ ! -f "$STAMP" ]; then
  rm -rf "$VENV"
  "$PY312" -m venv "$VENV"
  # shellcheck disable=SC2086
  timeout 1800 "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps $SPECS \
    || { rm -rf "$VENV"; skip "could not install the machine's packages (no package index?)"; }
  touch "$STAMP"
fi
if [ ! -f bench/gpu/pack/MANIFEST.txt ]; then  # pack.sh writes it last
  PIP="$VENV/bin/pip" timeout 1800 bash bench/gpu/pack.sh || skip "could not build the pack (no package index?)"
fi
rm -rf "$OUT"
SITE=${SITE:-/tmp/quarl-py312-site} PYTHON="$VENV/bin/python" LEARNER_DEVICE=auto OUT="$OUT" \
  bash bench/gpu/e2e.sh --tiny
"$VENV/bin/python" - "$OUT/e2e.json" <<'PY'
import json, sys
result = json.load(open(sys.argv[1]))
assert result["machine"]["python"].startswith("3.12"), result["machine"]["python"]
assert result["machine"]["packages"]["jax"] == "0.11.2", result["machine"]["packages"]
for arm in result["arms"]:
    assert arm["status"] == "completed" and arm["learner_steps"] > 0 and arm["env_steps_per_s"] > 0, arm
print(f"smoke.sh: passed: Python {result['machine']['python']}, jax {result['machine']['packages']['jax']}, "
      f"{len(result['arms'])} arms completed")
PY
# Passed: stamp the inputs it passed on (commit the stamp: CI rehearses again only when they change).
bash bench/gpu/inputs.sh > bench/gpu/rehearsed.sha256
