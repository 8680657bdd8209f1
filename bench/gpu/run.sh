#!/usr/bin/env bash
# On the GPU machine, from the repository root (bench/gpu/pack carried there, see pack.sh):
#   bash bench/gpu/run.sh            # writes $OUT/learner_throughput.{json,md} (OUT defaults to runs/bench/gpu)
# Installs the pack without network (install.sh: a --target folder on PYTHONPATH, since a venv made from the
# machine's python3, itself a venv, would not see its JAX), refuses to run unless JAX's backend is the GPU,
# then runs the learner benchmark; the JSON records the device (machine.jax_devices).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/bench/gpu}
source bench/gpu/install.sh
"$PYTHON" -c "import jax, sys; b = jax.default_backend(); print('jax', jax.__version__, b, jax.devices());
sys.exit(0 if b == 'gpu' else 'bench/gpu/run.sh: JAX does not see a GPU (backend ' + b + ')')"
mkdir -p "$OUT"
# --allow-busy: the load average of a 16-core machine says nothing about a GPU learner's timing.
"$PYTHON" -m bench.micro.learner_throughput --out "$OUT" --allow-busy "$@"
