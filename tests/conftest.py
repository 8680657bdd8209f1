"""Suite-wide set-up: one persistent JAX compilation cache for every process the suite starts.

Why: most of a small test's time is XLA compiling a learner or a policy whose HLO another test, or another process of
a distributed run (each Ray node compiles its own), compiled already; the in-memory cache dies with each haiku
transform and each process, the persistent one does not. It lives in .pytest_cache/jax/ (what `make clean` and a
fresh clone start without: a first run fills it), is set through the environment so Ray workers and CLI
subprocesses inherit it, and is never used under an emulated CPU (`bench.harness.emulation` marks those processes:
an executable compiled for this CPU must not run on another). QUARL_JAX_CACHE=0 turns it off."""
from __future__ import annotations

import os
import sys
from pathlib import Path

EMULATED_ENV = "QUARL_EMULATED_CPU"  # set by bench.harness.emulation for processes under qemu


def pytest_configure(config) -> None:
    if os.environ.get("QUARL_JAX_CACHE", "1") == "0" or os.environ.get(EMULATED_ENV):
        return
    cache = Path(config.rootpath) / ".pytest_cache" / "jax"
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(cache))
    # Cache every compile worth a file read (the default keeps only those over 1 s: most of ours take 0.1-1 s).
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.1")
    if "jax" in sys.modules:  # imported by a plugin before us: tell it directly
        import jax  # pylint: disable=import-outside-toplevel

        jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
        jax.config.update("jax_persistent_cache_min_compile_time_secs",
                          float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]))
