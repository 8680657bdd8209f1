"""The form every learner's SGD loop compiles to: `lax.scan`, or the same steps unrolled in one jit.

Two loops are affected: the K SGD steps a distributed learner runs per call (`JaxLearner.run_block`) and PPO/A2C's
epochs x minibatches inside one update (`agents.ppo.learning`). The third form, one jit call per SGD step, is
`DistributedConfig.learner_steps_per_call = 1` for the first and does not apply to the second.

Why it is a setting: XLA:CPU once ran a conv gradient 2-20x slower inside a scan than unrolled (its
`ConvCanonicalization` pass skips loop bodies). `quarl.nets.conv` removed that cause, so "auto" picks the scan:
on the measured nets the scan runs within noise of the unrolled form and compiles several times faster (PPO on
MinAtar: 6 s against 23 s; results/bench/conv_update.md). `unroll` stays for measurements and for devices where a
loop body costs more than its steps.

The form is read when a learner's update is traced, so a runner sets it (`use_loop_form`) before it builds the
learner, in the learner's own process, and records `loop_form_record()` in summary.json.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, TypeVar

if TYPE_CHECKING:
    import jax

LOOP_FORMS = ("auto", "scan", "unroll")
AUTO_REASON = ("auto: conv gradients are canonical (quarl.nets.conv), so the scan runs as fast as unrolled steps "
               "and compiles several times faster (results/bench/conv_update.md)")

Carry = TypeVar("Carry")
_requested = "auto"


def check_loop_form(form: object) -> str:
    """`form` if it names a loop form, else a one-line ValueError listing them."""
    if form not in LOOP_FORMS:
        raise ValueError(f"{form!r} is not a learner loop form; valid: {', '.join(LOOP_FORMS)}")
    return str(form)


def use_loop_form(form: str) -> None:
    """Sets the form of every learner update traced from now on in this process."""
    global _requested  # pylint: disable=global-statement  (a process setting, as the learner device is)
    _requested = check_loop_form(form)


def loop_form() -> str:
    """The form updates compile to now: "scan" or "unroll"."""
    return "unroll" if _requested == "unroll" else "scan"


def loop_form_record() -> dict[str, str]:
    """What summary.json records: the form that ran, what was asked for, and why that form."""
    why = AUTO_REASON if _requested == "auto" else "forced by --learner-loop"
    return {"form": loop_form(), "requested": _requested, "why": why}


def sgd_loop(step: Callable[[Carry, jax.Array], tuple[Carry, jax.Array]], carry: Carry, xs: object,
             ) -> tuple[Carry, object]:
    """`lax.scan(step, carry, xs)` in this process's loop form (unrolled: no while loop in the compiled program)."""
    import jax  # pylint: disable=import-outside-toplevel  (configs check forms without importing JAX)
    return jax.lax.scan(step, carry, xs, unroll=loop_form() == "unroll")
