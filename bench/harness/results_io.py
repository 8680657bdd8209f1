"""Writing a benchmark's results: the raw `<name>.json` and its `<name>.md` page, in one place.

Most benchmarks in bench/ end the same way: record the load at the end, write the result (machine record
included) as JSON with indent 1, write the markdown page beside it, and print where they went. Tests and
notebooks read these files, so each benchmark's format stays as it always was: the JSON is indented by one
space, and ends in a newline or not as that benchmark wrote it before (`newline`), so that a rerun does not
rewrite every committed result file for one byte. Also here: the command line a page quotes
(`command_line`) and the `--out` folder check made before anything is measured (`out_folder`).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable, Sequence


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


def write_json(path: Path, obj: Any, *, newline: bool = True, default: Callable[[Any], Any] | None = None) -> Path:
    """Writes `obj` to `path` as JSON indented by one space (a trailing newline unless `newline` is False);
    `default` as json.dumps's, for values JSON has no type for. Returns `path`."""
    path.write_text(json.dumps(obj, indent=1, default=default) + ("\n" if newline else ""), encoding="utf-8")
    return path


def write_results(out: Path, name: str, result: Any, page: str, *, newline: bool = True,
                  default: Callable[[Any], Any] | None = None) -> tuple[Path, Path]:
    """Writes `out/<name>.json` (`write_json`'s format) and the markdown `page` to `out/<name>.md`, creating
    `out` if needed; returns both paths, for the caller's "wrote ..." line."""
    out.mkdir(parents=True, exist_ok=True)
    json_path = write_json(out / f"{name}.json", result, newline=newline, default=default)
    md_path = out / f"{name}.md"
    md_path.write_text(page, encoding="utf-8")
    return json_path, md_path


def write_report(out: Path, module: str, argv: Sequence[str] | None, result: Any,
                 markdown: Callable[[Any, str], str], *, newline: bool = True) -> None:
    """The whole tail of a benchmark whose page quotes its command: writes `out/<name>.json` and
    `out/<name>.md` (`markdown(result, command)`), `<name>` being the last part of `module`, and prints where."""
    name = module.rsplit(".", 1)[-1]
    write_results(out, name, result, markdown(result, command_line(module, argv)), newline=newline)
    print(f"wrote {out}/{name}.{{json,md}}")
