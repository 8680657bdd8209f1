#!/usr/bin/env bash
# On the GPU machine, from the repository root, with bench/gpu/pack carried there (built here by pack.sh):
#   bash bench/gpu/e2e.sh [bench.system.e2e flags]    # e.g. --seeds 0 --max-seconds 240
# Installs the pack without network (install.sh), checks that JAX sees the GPU, then runs the end-to-end
# benchmark (fp32 vs int8 actors, 2048x3, walker:stand, the learner on the GPU). Results go to $OUT
# (default runs/bench/gpu) as e2e.{json,md}; commit them under results/bench/gpu/. LEARNER_DEVICE=auto (or
# cpu) runs it on a machine without a GPU (the 3.12 smoke test: LEARNER_DEVICE=auto ... --tiny).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/bench/gpu}
LEARNER_DEVICE=${LEARNER_DEVICE:-gpu}
source bench/gpu/install.sh
"$PYTHON" -c "import jax, sys; b = jax.default_backend(); print('jax', jax.__version__, b, jax.devices());
sys.exit(0 if b == 'gpu' or '$LEARNER_DEVICE' != 'gpu' else 'bench/gpu/e2e.sh: JAX does not see a GPU (backend ' + b + ')')"
mkdir -p "$OUT"
# --allow-busy: a 16-core machine's load average says little about a GPU learner; the record keeps it anyway.
"$PYTHON" -m bench.system.e2e --learner-device "$LEARNER_DEVICE" --out "$OUT" --allow-busy "$@"
