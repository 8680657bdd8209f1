"""QuaRL in JAX: ActorQ — full-precision learners, quantized actors."""
from setuptools import find_packages, setup

setup(
    name="quarl",
    version="0.1.0",
    description="ActorQ: distributed RL with quantized (int8 and lower) actors, in JAX.",
    # Tested: Python 3.11 with jax 0.10.2 (requirements.lock, CI) and Python 3.12 with jax 0.11.2
    # (requirements-py312.lock; the GPU machine's Python and JAX). jax 0.11 needs Python >= 3.12.
    python_requires=">=3.11,<3.13",
    packages=find_packages(include=["quarl", "quarl.*", "agents", "agents.*", "launch", "launch.*", "analysis", "analysis.*"]),
    # Exact versions live in requirements.lock / requirements-py312.lock; these are the direct dependencies,
    # JAX at the version tested for each Python.
    install_requires=[
        "jax==0.10.2; python_version < '3.12'", "jaxlib==0.10.2; python_version < '3.12'",
        "jax==0.11.2; python_version >= '3.12'", "jaxlib==0.11.2; python_version >= '3.12'",
        "dm-haiku==0.0.17", "optax==0.2.8", "rlax==0.1.9", "chex==0.1.92", "aqtp==0.9.0", "mujoco==3.17.0", "dm-control==1.0.50", "dm-env==1.6",
        "gymnasium==1.4.0", "ray==2.60.0", "onnxruntime", "onnx", "orbax-checkpoint",
        "codecarbon==3.3.2", "rich", "tqdm", "matplotlib", "msgpack", "tensorboardX", "pandas",
        "MinAtar==1.0.15", "ale-py==0.12.1",
    ],
    extras_require={
        # GPU learner: install a CUDA jaxlib on a machine with an NVIDIA driver. CPU stays the default.
        "cuda": ["jax[cuda12]==0.10.2; python_version < '3.12'", "jax[cuda13]==0.11.2; python_version >= '3.12'"],
        # C++ DM Control tasks for vectorized actors (used for the tasks quarl.envs.envpool verified; optional).
        "envpool": ["envpool==1.2.5; python_version < '3.12'"],
        "test": ["pytest", "pytest-timeout", "pytest-xdist", "hypothesis", "nbclient", "nbformat", "ipykernel"],
    },
)
