"""Writing a benchmark's results: every file a benchmark leaves in its results folder goes through here.

Most benchmarks in bench/ end the same way: record the load at the end, write the result (machine record
included) as JSON with indent 1, write the markdown page beside it, and print where they went. Tests and
notebooks read these files, so each benchmark's format stays as it always was: the JSON is indented by one
space (or as that benchmark wrote it: `indent`, `write_json_sorted`), and ends in a newline or not as that
benchmark wrote it before (`newline`), so that a rerun does not rewrite every committed result file for one
byte. The other kinds of result file have one writer each too: a page or other text (`write_text`), a table
(`write_csv`), a record appended to a JSON-lines log (`append_json_line`) and a figure (`save_figure`).
Also here: the command line a page quotes (`command_line`) and the `--out` folder check made before anything
is measured (`out_folder`).
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence


def command_line(module: str, argv: Sequence[str] | None) -> str:
    """The command a report quotes: `python -m <module>` and its arguments (sys.argv's when `argv` is None)."""
    return " ".join([f"python -m {module}", *(sys.argv[1:] if argv is None else argv)])


def out_folder(parser: argparse.ArgumentParser, out: Path | None, default: str) -> Path:
    """The results folder: `--out` when given, else `default`. One that exists as a file ends the program
    (one line on stderr, exit code 2) before anything is measured, not after."""
    folder = out or Path(default)
    if folder.exists() and not folder.is_dir():
        parser.exit(2, f"{parser.prog}: error: --out {folder} exists and is not a directory\n")
    return folder


def write_json(path: Path, obj: Any, *, newline: bool = True, default: Callable[[Any], Any] | None = None,
               indent: int | None = 1) -> Path:
    """Writes `obj` to `path` as JSON indented by one space (`indent`; None: one line), with a trailing newline
    unless `newline` is False; `default` as json.dumps's, for values JSON has no type for. Returns `path`."""
    return write_text(path, json.dumps(obj, indent=indent, default=default) + ("\n" if newline else ""))


def write_json_sorted(path: Path, obj: Any) -> Path:
    """Writes `obj` to `path` atomically as JSON indented by two spaces with sorted keys and a trailing newline
    (`quarl.ops.io.write_json_atomic`: NumPy values converted), the format of the results that always had it
    (bench.learning.qat's). Returns `path`."""
    from quarl.ops.io import write_json_atomic  # pylint: disable=import-outside-toplevel

    write_json_atomic(path, obj)
    return Path(path)


def write_text(path: Path, text: str) -> Path:
    """Writes a markdown page (or any text result) to `path` as UTF-8. Returns `path`."""
    path = Path(path)
    path.write_text(text, encoding="utf-8")
    return path


def write_csv(path: Path, rows: Iterable[Mapping[str, Any]], fields: Sequence[str] | None = None, *,
              atomic: bool = False) -> Path:
    """Writes `rows` to `path` as CSV with a header: columns `fields`, or the first row's keys; None is an empty
    cell. `atomic`: written beside it first (`<name>.tmp`) and moved into place, so a reader (or a run stopped
    midway) never sees half a table. Returns `path`."""
    path = Path(path)
    rows = list(rows)
    columns = list(fields) if fields is not None else list(rows[0])
    target = path.with_name(path.name + ".tmp") if atomic else path
    with open(target, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    if atomic:
        target.replace(path)
    return path


def append_json_line(path: Path, obj: Any, *, default: Callable[[Any], Any] | None = str) -> Path:
    """Appends `obj` as one JSON line to `path` (a log a long sweep grows run by run). Returns `path`."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(obj, default=default) + "\n")
    return Path(path)


def save_figure(fig: Any, path: Path, *, dpi: int = 110) -> Path:
    """Saves a matplotlib figure to `path` at `dpi` and closes it (the whole figure: a legend placed outside the
    panels is kept, not cut off at the canvas's edge). Returns `path`."""
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return Path(path)


def write_results(out: Path, name: str, result: Any, page: str, *, newline: bool = True,
                  default: Callable[[Any], Any] | None = None) -> tuple[Path, Path]:
    """Writes `out/<name>.json` (`write_json`'s format) and the markdown `page` to `out/<name>.md`, creating
    `out` if needed; returns both paths, for the caller's "wrote ..." line."""
    out.mkdir(parents=True, exist_ok=True)
    json_path = write_json(out / f"{name}.json", result, newline=newline, default=default)
    return json_path, write_text(out / f"{name}.md", page)


def write_report(out: Path, module: str, argv: Sequence[str] | None, result: Any,
                 markdown: Callable[[Any, str], str], *, newline: bool = True) -> None:
    """The whole tail of a benchmark whose page quotes its command: writes `out/<name>.json` and
    `out/<name>.md` (`markdown(result, command)`), `<name>` being the last part of `module`, and prints where."""
    name = module.rsplit(".", 1)[-1]
    write_results(out, name, result, markdown(result, command_line(module, argv)), newline=newline)
    print(f"wrote {out}/{name}.{{json,md}}")


def write_and_print(out: Path, module: str, argv: Sequence[str] | None, result: dict[str, Any],
                    markdown: Callable[[dict[str, Any]], str]) -> int:
    """The tail of a benchmark whose page reads the command from its result: records the command line in
    `result["command"]`, writes `out/<name>.json` and `.md` (`<name>` the last part of `module`) and prints the
    page. Returns 0, the benchmark's exit code."""
    result["command"] = command_line(module, argv)
    page = markdown(result)
    write_results(out, module.rsplit(".", 1)[-1], result, page)
    print(page)
    return 0
