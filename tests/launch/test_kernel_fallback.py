"""A run on a CPU whose preferred int8 kernel is not exact: the actors fall back, keep acting, and the run
says so in summary.json and events.log. The "preferred" kernel is a registered form that saturates like
MLAS's AVX2 u8 x s8 path (see tests/quarl/test_kernel_forms.py), ranked first on every CPU."""
from __future__ import annotations

import pytest

from launch.distributed.supervisor import run_program
from launch.program.local_runner import LocalRunner
from quarl.runtimes.kernel_forms import KernelForm, exact_int_reference, register_form, unregister_form
from tests.launch.tiny import tiny_config
from tests.quarl.test_kernel_forms import _emit_saturating, _pair_codes

NAME = "test_saturating_first"


@pytest.fixture
def saturating_form_preferred():
    register_form(KernelForm(NAME, "pmaddubsw emulation, preferred everywhere", 8, _pair_codes, _emit_saturating,
                             lambda cpu, bits: -1, exact_int_reference))
    yield NAME
    unregister_form(NAME)


def test_a_refused_kernel_form_is_reported_and_the_run_completes(tmp_path, saturating_form_preferred):
    config = tiny_config(tmp_path / "run", num_actors=1, max_actor_steps=300)
    summary, code = run_program(config, LocalRunner())
    assert code == 0 and summary["status"] == "completed", summary["error"]
    assert summary["kernel_fallback"] is True and NAME not in summary["kernel_form"]
    (actor,) = summary["actors"]
    first, *_, used = actor["kernel"]["checks"]
    assert first["form"] == NAME and not first["ok"] and first["max_rel_err"] > 1e-2
    assert used["ok"] and used["form"] == actor["kernel"]["form"] == summary["kernel_form"][0]
    assert f"integer kernel self-check refused ['{NAME}']" in (tmp_path / "run" / "events.log").read_text()
