#!/usr/bin/env bash
# Packs the wheels bench.learner_throughput needs on the GPU machine into bench/gpu/wheels/ (git-ignored; carried
# to the machine, well under its 64 MiB limit). That machine has Python 3.12 with JAX (CUDA), NumPy, SciPy and
# ONNX Runtime but no pip access: everything else the learner imports comes from here, at the versions of
# requirements.lock, as Python 3.12 manylinux wheels (pure-Python ones where the package is pure).
set -euo pipefail
cd "$(dirname "$0")"
PIP=${PIP:-$(cd ../.. && pwd)/.venv/bin/pip}  # the project venv (PIP=... to use another)
# What `import bench.learner_throughput, agents.d4pg.learning` loads beyond the standard library, JAX and its
# own dependencies (numpy, scipy, ml_dtypes, opt_einsum), which the machine has.
PACKAGES="absl-py aqtp chex cloudpickle decorator distrax dm-env dm-haiku dm-tree etils flatbuffers flax gast jmp
  markdown-it-py mdurl msgpack optax Pygments PyYAML rich rlax six tabulate tfp-nightly toolz treescope
  typing_extensions wcwidth wrapt"
rm -rf wheels && mkdir wheels
for name in $PACKAGES; do
  pin=$(grep -i -m1 "^${name}==" ../../requirements.lock) || { echo "pack.sh: $name is not in requirements.lock" >&2; exit 2; }
  "$PIP" download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    --platform any --dest wheels "$pin"
done
du -sh wheels
