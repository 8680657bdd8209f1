"""quarl.quant.precision: the one parser of precision names, the roles' name lists, and (structurally) that no
other module parses a precision name itself."""
from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from quarl.quant.precision import (
    ALL_PRECISIONS, Precision, find_precision, int_precision, is_int_name, parse_bit_list, parse_precision,
    parse_precision_list, precision_arg, precision_bits, precision_list_arg, precision_names, valid_text,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ALL_PRECISIONS)
def test_every_valid_name_round_trips_and_carries_kind_and_bits(name):
    prec = parse_precision(name)
    assert prec.name == name == str(prec) and find_precision(name) is prec
    assert parse_precision(prec) is prec and parse_precision(name.upper()) is prec
    assert prec.kind == ("int" if name.startswith("int") else "float") and prec.bits == int(name[-2:].lstrip("tp"))
    assert prec.is_int != prec.is_float and is_int_name(name) == prec.is_int
    assert prec.has_int_kernel == (prec.is_int and prec.bits <= 8)
    assert prec.simulated == (prec.is_int and prec.bits >= 9)
    if prec.is_int:
        assert int_precision(prec.bits) is prec


@pytest.mark.parametrize("text", ["int1", "int17", "fp8", "fp64", "", "int", "8bit", "qat-int4"])
def test_a_bad_name_is_one_line_listing_the_valid_names(text):
    with pytest.raises(ValueError) as info:
        parse_precision(text)
    message = str(info.value)
    assert message.startswith("unknown precision") and "\n" not in message and "fp32, bf16, fp16, int16" in message


def test_roles_list_only_their_names_and_refuse_the_others():
    assert precision_names("actor") == ("fp32", "bf16", "fp16", "int8", "int7", "int6", "int5", "int4", "int3",
                                        "int2", "int16")
    assert precision_names("kernel") == tuple(f"int{b}" for b in range(8, 1, -1))
    assert precision_bits("kernel") == tuple(range(2, 9)) and precision_bits() == tuple(range(2, 17))
    assert set(precision_names("actor")) <= set(ALL_PRECISIONS) and precision_names() == ALL_PRECISIONS
    assert valid_text("actor") == "fp32, bf16, fp16, int2..int8, int16 (shorthands 32, 16, 8..2)"
    assert parse_precision("8", "actor") is parse_precision("int8")
    with pytest.raises(ValueError, match=r"^precision int12 is not an actor precision.*int2\.\.int8, int16"):
        parse_precision("int12", "actor")
    with pytest.raises(ValueError, match=r"^unknown precision 'int99': valid are fp32, bf16, fp16, int2\.\.int8, int16"):
        parse_precision("int99", "actor")  # an actor CLI lists what actors run, not int9..int15
    with pytest.raises(ValueError, match="unknown precision role"):
        precision_names("learner")


def test_sort_key_is_the_table_order():
    shuffled = ["int2", "fp16", "int16", "fp32", "int8", "bf16", "int4"]
    assert sorted(shuffled, key=lambda n: parse_precision(n).sort_key) == \
        ["fp32", "bf16", "fp16", "int16", "int8", "int4", "int2"]


def test_records_name_precisions_exactly_so_analysis_finds_only_canonical_names():
    assert find_precision("int8") == Precision("int8", "int", 8)
    for recorded in ("8", "INT8", "qat-int4", None, 8, "int99"):
        assert find_precision(recorded) is None and not is_int_name(recorded)


def test_lists_and_bit_widths_parse_with_one_line_errors():
    assert parse_precision_list("32, int8,8,fp16") == (parse_precision("fp32"), parse_precision("int8"),
                                                       parse_precision("fp16"))
    assert parse_bit_list("8,2,4,2") == (2, 4, 8)
    for text, role, message in (("", "any", "at least one"), ("4,x", "any", "'x' is not an integer"),
                                ("4,16", "kernel", "16 is outside 2..8"), ("1", "any", "outside 2..16")):
        with pytest.raises(ValueError, match=message):
            parse_bit_list(text, role)
    with pytest.raises(ValueError, match="at least one precision"):
        parse_precision_list(" , ", "actor")
    with pytest.raises(ValueError, match="no integer precision has 17 bits"):
        int_precision(17)


def test_argparse_types_give_exit_2_with_one_line(capsys):
    parser = argparse.ArgumentParser(prog="p")
    parser.add_argument("--precision", type=precision_arg("actor"), default="int8")
    parser.add_argument("--precisions", type=precision_list_arg("actor"), default="fp32,int8")
    args = parser.parse_args([])
    assert args.precision is parse_precision("int8") and args.precisions == ["fp32", "int8"]
    assert parser.parse_args(["--precisions", "32,4"]).precisions == ["fp32", "int4"]
    with pytest.raises(SystemExit) as info:
        parser.parse_args(["--precision", "int12"])
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and "argument --precision: precision int12 is not an actor precision" in err[-1]


# Ways a module could read a precision name itself instead of asking `quarl.quant.precision`.
_PARSING = re.compile(
    r"""int\(\\d|int\\d|startswith\(\s*["']int["']\)|(removeprefix|lstrip)\(\s*["'](qat-)?int["']\)"""
    r"""|["'](fp32|bf16|fp16)["'],\s*["'](fp32|bf16|fp16)["'],\s*["'](fp32|bf16|fp16)["']""")


def test_no_module_outside_quarl_quant_precision_parses_a_precision_name():
    offenders = []
    for package in ("quarl", "agents", "launch", "analysis", "bench"):
        for path in sorted((REPO / package).rglob("*.py")):
            if path == REPO / "quarl" / "quant" / "precision.py":
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if _PARSING.search(line):
                    offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not offenders, "parse precision names with quarl.quant.precision:\n" + "\n".join(offenders)


def test_the_structural_pattern_catches_the_forms_it_names():
    for line in ('re.fullmatch(r"int(\\d+)", name)', 'str(p).startswith("int")', 'name.removeprefix("int")',
                 'x.removeprefix("qat-int")', 'NAMES = ("fp32", "bf16", "fp16")', '("fp32", "fp16", "bf16")'):
        assert _PARSING.search(line), line
    assert not _PARSING.search('parse_precision(name).is_int') and not _PARSING.search('"int8"')
