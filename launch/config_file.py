"""Running an experiment from a file, for both launchers: `--config FILE` takes an ExperimentConfig JSON file or a
run's summary.json (its `experiment` object, so any recorded run can be rerun as it was), and only --logdir and
--seed may change it. Also where a run goes without --logdir."""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Sequence

from launch.cli import RUN_FILES, UsageError, check_seed
from launch.experiments.config import ExperimentConfig
from quarl.ops.checks import ConfigError
from quarl.quant.precision import Precision


def default_logdir(runner: str, agent: str, task: str, precision: Precision) -> str:
    """runs/<runner>/<agent>-<task>-<precision>-<time>: where a run goes without --logdir (runs/ is gitignored)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return os.path.join("runs", runner, f"{agent}-{task.replace(':', '-')}-{precision}-{stamp}")


def load_config(path: str) -> ExperimentConfig:
    """The experiment in a JSON file: an ExperimentConfig (`to_dict`), or a run's summary.json, whose
    `experiment` object is that run's config. Validated like the flags (UsageError, one line)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise UsageError(f"--config {path!r}: {' '.join(str(e).split())}") from None
    if isinstance(data, dict) and "runner" in data and "status" in data:  # a summary.json
        data = data.get("experiment")
        if not isinstance(data, dict):
            raise UsageError(f"--config {path!r} is a summary.json without an `experiment` object (written before "
                             "runs recorded their config): pass the flags instead")
    try:
        return ExperimentConfig.from_dict(data)
    except ConfigError as e:
        raise UsageError(f"--config {path!r}: {e}") from None


CONFIG_OVERRIDES = ("logdir", "seed")  # what may be given with --config (a rerun elsewhere, or another seed)


def config_with_overrides(path: str, logdir: str | None, seed: int | None) -> ExperimentConfig:
    """`load_config(path)` with --logdir/--seed applied; a config naming a folder that already holds a run (a
    summary.json's own) must be given a new --logdir."""
    config = load_config(path)
    changes: dict[str, object] = {}
    if logdir is not None:
        changes["logdir"] = logdir
    if seed is not None:
        changes["seed"] = check_seed(seed)
    config = config.replace(**changes) if changes else config
    if logdir is None and config.distributed.resume is None and any((Path(config.logdir) / f).exists() for f in RUN_FILES):
        raise UsageError(f"--config {path!r} names the folder {config.logdir!r}, which already holds a run: "
                         "pass --logdir for the new one")
    return config


def reject_with_config(args: argparse.Namespace, parser: argparse.ArgumentParser, allowed: Sequence[str]) -> None:
    """With --config the file is the experiment: any other flag left from its default is a usage error."""
    given = sorted(k for k, v in vars(args).items() if k not in ("config", *allowed, *CONFIG_OVERRIDES)
                   and v != parser.get_default(k))
    if given:
        raise UsageError(f"--config describes the whole experiment: drop --{given[0].replace('_', '-')} (only "
                         "--logdir and --seed may change it)")
