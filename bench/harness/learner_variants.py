"""The learner variants the pixel-speed benchmarks set side by side (`bench.micro.conv_update`,
`bench.system.pixel_train`): what ships, the same arithmetic unrolled, and the conv learner before `quarl.nets.conv`.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

VARIANTS = ("program", "unrolled", "before")


@contextlib.contextmanager
def variant(name: str) -> Iterator[None]:
    """Learners built inside trace as `name`: the loop form, and which conv gradient (`quarl.nets.haiku`'s layer)."""
    import haiku as hk  # pylint: disable=import-outside-toplevel
    from agents.loops import loop_form_record, use_loop_form  # pylint: disable=import-outside-toplevel
    from quarl.nets import haiku as nets  # pylint: disable=import-outside-toplevel

    layer, requested = nets.FastConv2D, loop_form_record()["requested"]
    use_loop_form("unroll" if name == "unrolled" else "scan")
    if name == "before":
        nets.FastConv2D = hk.Conv2D
    try:
        yield
    finally:
        nets.FastConv2D = layer
        use_loop_form(requested)  # the process's own setting, whatever it was
