"""bench.harness.results_io: the writers of every result file a benchmark leaves (JSON, pages, CSV, logs, figures)."""
from __future__ import annotations

import json
from pathlib import Path

from bench.harness.results_io import command_line, out_folder, write_json, write_report, write_results


def test_write_json_keeps_each_benchmarks_trailing_newline(tmp_path: Path) -> None:
    obj = {"a": [1, 2], "b": {"c": 0.5}}
    assert write_json(tmp_path / "x.json", obj).read_text(encoding="utf-8") == json.dumps(obj, indent=1) + "\n"
    bare = write_json(tmp_path / "y.json", obj, newline=False).read_text(encoding="utf-8")
    assert bare == json.dumps(obj, indent=1)
    odd = write_json(tmp_path / "z.json", {"p": tmp_path}, default=str)
    assert json.loads(odd.read_text(encoding="utf-8")) == {"p": str(tmp_path)}


def test_write_results_creates_the_folder_and_both_files(tmp_path: Path) -> None:
    out = tmp_path / "new" / "folder"
    json_path, md_path = write_results(out, "bench_x", {"k": 1}, "# page\n", newline=False)
    assert (json_path, md_path) == (out / "bench_x.json", out / "bench_x.md")
    assert json_path.read_text(encoding="utf-8") == '{\n "k": 1\n}'
    assert md_path.read_text(encoding="utf-8") == "# page\n"


def test_command_line_quotes_the_arguments_given() -> None:
    assert command_line("bench.x", ["--quick", "--out", "d"]) == "python -m bench.x --quick --out d"
    assert command_line("bench.x", []) == "python -m bench.x"


def test_write_report_names_the_files_after_the_module_and_quotes_the_command(tmp_path: Path, capsys) -> None:
    write_report(tmp_path, "bench.some_bench", ["--quick"], {"k": 1}, lambda r, cmd: f"`{cmd}`: {r['k']}\n")
    assert (tmp_path / "some_bench.json").read_text(encoding="utf-8") == '{\n "k": 1\n}\n'
    assert (tmp_path / "some_bench.md").read_text(encoding="utf-8") == "`python -m bench.some_bench --quick`: 1\n"
    assert capsys.readouterr().out == f"wrote {tmp_path}/some_bench.{{json,md}}\n"


def test_out_folder_refuses_a_file_before_anything_runs(tmp_path: Path, capsys) -> None:
    import argparse

    import pytest

    parser = argparse.ArgumentParser(prog="bench.x")
    assert out_folder(parser, None, str(tmp_path / "d")) == tmp_path / "d"
    assert out_folder(parser, tmp_path, "unused") == tmp_path
    (tmp_path / "f").write_text("", encoding="utf-8")
    with pytest.raises(SystemExit) as info:
        out_folder(parser, tmp_path / "f", "unused")
    assert info.value.code == 2 and "exists and is not a directory" in capsys.readouterr().err


def test_the_other_writers_keep_each_files_format(tmp_path: Path) -> None:
    """One line of JSON (a run's machine.json), sorted and indented by two (qat.json), a page, a CSV with None
    as an empty cell (replaced whole when atomic), a JSON-lines log that grows, and a figure saved and closed."""
    from bench.harness.results_io import append_json_line, save_figure, write_csv, write_json_sorted, write_text

    obj = {"b": 1, "a": [0.5, None]}
    assert write_json(tmp_path / "m.json", obj, newline=False, indent=None).read_text(encoding="utf-8") == \
        json.dumps(obj)
    assert write_json_sorted(tmp_path / "s.json", obj).read_text(encoding="utf-8") == \
        json.dumps(obj, indent=2, sort_keys=True) + "\n"
    assert write_text(tmp_path / "p.md", "# é\n").read_text(encoding="utf-8") == "# é\n"
    rows = [{"x": 1, "y": None}, {"x": 2, "y": "b"}]
    assert write_csv(tmp_path / "t.csv", rows).read_bytes() == b"x,y\r\n1,\r\n2,b\r\n"  # csv's own line ends
    assert write_csv(tmp_path / "t.csv", rows[1:], ("y", "x"), atomic=True).read_bytes() == b"y,x\r\nb,2\r\n"
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    append_json_line(tmp_path / "log.jsonl", {"p": tmp_path})
    append_json_line(tmp_path / "log.jsonl", {"k": 2})
    assert [json.loads(x) for x in (tmp_path / "log.jsonl").read_text(encoding="utf-8").splitlines()] == \
        [{"p": str(tmp_path)}, {"k": 2}]

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, _ = plt.subplots()
    assert save_figure(fig, tmp_path / "f.png", dpi=50).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not plt.fignum_exists(fig.number)  # closed: a long benchmark does not keep its figures open
