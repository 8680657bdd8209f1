"""Run logging: append-only CSV (flushed on every row), optional TensorBoard, and atomic JSON files.

A run's numbers must survive a crash, so every CSV row is flushed as soon as it is written, and JSON files
(configs, results) are written to a temporary file and renamed over the target so a reader never sees half
a file. Loggers write only the values they are given: nothing from the environment (variables, hostnames,
credentials) is ever added.
"""
from __future__ import annotations

import csv
import math
import numbers
import os
from pathlib import Path
from typing import Mapping, Sequence, TextIO

import numpy as np

from quarl.ops.io import write_json_atomic  # noqa: F401 - re-exported: the logging API's JSON writer


def _scalar(value: object) -> bool | int | float | str | None:
    """A plain Python scalar for `value`, or None if it is not a scalar (arrays, lists, dicts...)."""
    if isinstance(value, np.generic) or (isinstance(value, np.ndarray) and value.ndim == 0):
        return value.item()  # before the float check: np.float64 subclasses float
    if isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, numbers.Real):  # e.g. a 0-d jax array is not Real, but Fraction/Decimal-likes are
        return float(value)
    if hasattr(value, "shape") and tuple(getattr(value, "shape")) == () and hasattr(value, "item"):
        return value.item()  # 0-d arrays of other libraries (jax)
    return None


def scalar_items(values: Mapping[str, object]) -> dict[str, bool | int | float | str]:
    """The scalar entries of `values` (drops arrays such as per-item priorities), as plain Python values."""
    out = {}
    for key, value in values.items():
        s = _scalar(value)
        if s is not None:
            out[key] = s
    return out


def _format(value: bool | int | float | str) -> str:
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)  # 'nan', 'inf', '-inf'
    return str(value)


class CSVLogger:
    """Appends rows to a CSV file, one flush per row.

    The columns are `fieldnames`, or else the existing file's header, or else the keys of the first row.
    A row with a key outside the columns is refused (the header of an append-only file cannot grow);
    missing keys are left empty. NaN and inf are written as 'nan' / 'inf' / '-inf'.
    A file on disk always starts with its header: with known columns it is written at once (a run stopped before
    its first row leaves a header-only CSV, never a 0-byte one); without them the file is created at the first row.
    """

    def __init__(self, path: str | os.PathLike, fieldnames: Sequence[str] | None = None):
        self.path = Path(path)
        if self.path.exists() and self.path.is_dir():
            raise ValueError(f"CSV log path {self.path} is a directory")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        existing = self._existing_header()
        if fieldnames is not None:
            fieldnames = list(fieldnames)
            if len(set(fieldnames)) != len(fieldnames) or not fieldnames:
                raise ValueError(f"fieldnames must be non-empty and unique, got {fieldnames}")
            if existing is not None and existing != fieldnames:
                raise ValueError(f"{self.path} already has columns {existing}, not {fieldnames}")
        self._fieldnames: list[str] | None = existing if fieldnames is None else fieldnames
        self._header_written = existing is not None
        self._closed = False
        self._file: TextIO | None = None
        if self._fieldnames is not None:
            self._open()

    @property
    def fieldnames(self) -> list[str] | None:
        return None if self._fieldnames is None else list(self._fieldnames)

    def _existing_header(self) -> list[str] | None:
        if not self.path.exists() or self.path.stat().st_size == 0:
            return None
        with open(self.path, newline="", encoding="utf-8") as f:
            header = next(csv.reader(f), None)
        return header or None

    def _open(self) -> TextIO:
        """The file, opened for appending, its header written first if it has none yet."""
        if self._file is None:
            self._file = open(self.path, "a", newline="", encoding="utf-8")  # pylint: disable=consider-using-with
            if not self._header_written and self._fieldnames is not None:
                csv.writer(self._file).writerow(self._fieldnames)
                self._file.flush()
                self._header_written = True
        return self._file

    def write(self, values: Mapping[str, object]) -> None:
        """Appends one row; values must be scalars or None (use `scalar_items` to drop arrays)."""
        if self._closed:
            raise ValueError(f"CSV logger for {self.path} is closed")
        row = {}
        for key, value in values.items():
            if value is None:
                row[str(key)] = ""
                continue
            s = _scalar(value)
            if s is None:
                raise ValueError(f"CSV value for {key!r} is not a scalar ({type(value).__name__})")
            row[str(key)] = _format(s)
        if self._fieldnames is None:
            self._fieldnames = list(row)
        unknown = [k for k in row if k not in self._fieldnames]
        if unknown:
            raise ValueError(f"keys {unknown} are not columns of {self.path} ({self._fieldnames})")
        file = self._open()
        csv.writer(file).writerow([row.get(k, "") for k in self._fieldnames])
        file.flush()

    def close(self) -> None:
        self._closed = True
        if self._file is not None:
            self._file.close()


class TensorBoardLogger:
    """Scalars to TensorBoard event files under `logdir/name` (tensorboardX); strings are skipped."""

    def __init__(self, logdir: str | os.PathLike, name: str = "", step_key: str = "step"):
        try:
            from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
        except ImportError as err:
            raise ValueError(f"TensorBoard logging needs tensorboardX: {err}") from None
        self.logdir = Path(logdir) / name if name else Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        self._writer = SummaryWriter(logdir=str(self.logdir))
        self._step_key = step_key
        self._count = 0

    def write(self, values: Mapping[str, object]) -> None:
        """Adds every numeric scalar at step `values[step_key]` (or the number of writes so far)."""
        scalars = scalar_items(values)
        step = scalars.get(self._step_key, self._count)
        self._count += 1
        for key, value in scalars.items():
            if key == self._step_key or isinstance(value, str) or not math.isfinite(float(value)):
                continue  # NaN means "does not apply" (a discrete actor's exploration std): no point to plot
            self._writer.add_scalar(key, float(value), global_step=int(step))
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class Logger:
    """Fans one `write(dict)` out to a CSV file and/or TensorBoard.

    Array values (e.g. per-item priorities) are dropped first, since neither sink can hold them.
    """

    def __init__(self, csv_path: str | os.PathLike | None = None, tensorboard_dir: str | os.PathLike | None = None,
                 name: str = "", fieldnames: Sequence[str] | None = None, step_key: str = "step"):
        self._sinks: list[CSVLogger | TensorBoardLogger] = []
        if csv_path is not None:
            self._sinks.append(CSVLogger(csv_path, fieldnames))
        if tensorboard_dir is not None:
            self._sinks.append(TensorBoardLogger(tensorboard_dir, name, step_key=step_key))

    def write(self, values: Mapping[str, object]) -> None:
        scalars = scalar_items(values)
        for sink in self._sinks:
            sink.write(scalars)

    def close(self) -> None:
        for sink in self._sinks:
            sink.close()

    def __enter__(self) -> "Logger":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

