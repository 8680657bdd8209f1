#!/usr/bin/env bash
# One digest of everything the GPU machine's install depends on: the tracked files of bench/gpu/ (but the stamp
# itself), setup.py and the two lock files. smoke.sh writes it to bench/gpu/rehearsed.sha256 when the rehearsal
# passes; .ci/run rehearses again only when the digest differs from the committed stamp.
#   bash bench/gpu/inputs.sh     # prints the digest
set -euo pipefail
cd "$(dirname "$0")/../.."
git ls-files -z bench/gpu setup.py requirements.lock requirements-py312.lock \
  | tr '\0' '\n' | grep -v '^bench/gpu/rehearsed.sha256$' | LC_ALL=C sort \
  | while IFS= read -r f; do printf '%s  %s\n' "$(sha256sum < "$f" | cut -d' ' -f1)" "$f"; done \
  | sha256sum | cut -d' ' -f1
