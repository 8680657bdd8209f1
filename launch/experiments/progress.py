"""Progress of a run and the summary table printed when it ends: one habit for both launchers.

On a terminal, `launch.actorq` shows a live view (rich, rebuilt from a `Snapshot` twice a second) and
`launch.train` a progress bar. When stdout is not a terminal (logs, CI, pipes) both print one plain line every
`LINE_EVERY_S` seconds instead (`progress_line`: no carriage returns or other control characters, so a log file
reads as text), and --no-progress turns either off. Both end with `print_summary`'s table and the run folder.
"""
from __future__ import annotations

import dataclasses
import sys
import time
from types import TracebackType
from typing import TextIO

from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from tqdm import tqdm

REFRESH_PER_S = 2.0
LINE_EVERY_S = 10.0  # one progress line this often when stdout is not a terminal


@dataclasses.dataclass
class Snapshot:
    """What the driver knows at one poll."""

    actor_steps: int = 0
    max_actor_steps: int = 1
    learner_steps: int = 0
    episodes: int | None = 0  # None: not counted by this runner's progress (launch.train's loop)
    replay_size: int | None = 0  # None: a run without replay (on-policy), no replay row
    eval_return: float | None = None
    eval_at: int | None = None
    elapsed_s: float = 0.0


class Rates:
    """Steps per second over a sliding window of polls (smooths the jumpy batched counter updates)."""

    def __init__(self, window_s: float = 5.0):
        self._window_s = window_s
        self._points: list[tuple[float, int, int]] = []

    def update(self, actor_steps: int, learner_steps: int, now: float | None = None) -> tuple[float, float]:
        now = time.monotonic() if now is None else now
        self._points.append((now, actor_steps, learner_steps))
        while len(self._points) > 2 and now - self._points[0][0] > self._window_s:
            self._points.pop(0)
        t0, a0, l0 = self._points[0]
        dt = now - t0
        if dt <= 0:
            return 0.0, 0.0
        return (actor_steps - a0) / dt, (learner_steps - l0) / dt


def progress_line(prog: str, snap: Snapshot, actor_rate: float, learner_rate: float) -> str:
    """One plain progress line (no control characters): what a log file gets every LINE_EVERY_S seconds."""
    total = max(snap.max_actor_steps, 1)
    text = (f"{prog}: {snap.elapsed_s:,.0f} s  actor steps {snap.actor_steps:,} / {total:,} "
            f"({100.0 * min(snap.actor_steps, total) / total:.0f}%, {actor_rate:,.0f}/s)  learner steps "
            f"{snap.learner_steps:,} ({learner_rate:,.1f}/s)")
    if snap.episodes is not None:
        text += f"  episodes {snap.episodes:,}"
    if snap.eval_return is not None:
        text += f"  eval return {snap.eval_return:,.1f} at {snap.eval_at or 0:,} steps"
    return text


class LineProgress:
    """Prints `progress_line` at most every `every_s` seconds (and once at the end) to `stream`."""

    def __init__(self, prog: str, every_s: float = LINE_EVERY_S, stream: TextIO | None = None):
        self._prog, self._every_s = prog, float(every_s)
        self._stream = sys.stdout if stream is None else stream
        self._last: float | None = None
        self._pending: str | None = None

    def update(self, snap: Snapshot, actor_rate: float, learner_rate: float, *, force: bool = False) -> None:
        now = time.monotonic()
        line = progress_line(self._prog, snap, actor_rate, learner_rate)
        if force or self._last is None or now - self._last >= self._every_s:
            self._stream.write(line + "\n")
            self._stream.flush()
            self._last, self._pending = now, None
        else:
            self._pending = line

    def close(self) -> None:
        """The last state, if it was not printed yet."""
        if self._pending is not None:
            self._stream.write(self._pending + "\n")
            self._stream.flush()
            self._pending = None


class ProgressView:
    """`with ProgressView(enabled, title) as view: view.update(snapshot)`: a live view on a terminal, a
    `LineProgress` otherwise; no-op when disabled. Nothing is drawn before the first snapshot (so no frame
    shows a placeholder step budget)."""

    def __init__(self, enabled: bool, title: str, *, prog: str = "launch.actorq", line_every_s: float = LINE_EVERY_S,
                 tty: bool | None = None):
        self.enabled = bool(enabled)
        self._tty = sys.stdout.isatty() if tty is None else bool(tty)
        self._title = title
        self._rates = Rates()
        self._live: Live | None = None
        self._lines = LineProgress(prog, line_every_s) if self.enabled and not self._tty else None

    def __enter__(self) -> "ProgressView":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._live is not None:
            self._live.__exit__(exc_type, exc, tb)
            self._live = None
        if self._lines is not None:
            self._lines.close()

    def update(self, snap: Snapshot) -> None:
        actor_rate, learner_rate = self._rates.update(snap.actor_steps, snap.learner_steps)
        if self._lines is not None:
            self._lines.update(snap, actor_rate, learner_rate)
        elif self.enabled and self._live is None:
            self._live = Live(self._render(snap, actor_rate, learner_rate), refresh_per_second=REFRESH_PER_S,
                              transient=False, redirect_stdout=False, redirect_stderr=False)
            self._live.__enter__()
        elif self._live is not None:
            self._live.update(self._render(snap, actor_rate, learner_rate))

    def _render(self, snap: Snapshot, actor_rate: float, learner_rate: float) -> "Table":
        table = Table(title=self._title, show_header=False, box=None, padding=(0, 2))
        table.add_column(style="bold")
        table.add_column()
        done = min(snap.actor_steps, snap.max_actor_steps)
        table.add_row("actor steps", f"{snap.actor_steps:,} / {snap.max_actor_steps:,}")
        table.add_row("", ProgressBar(total=max(snap.max_actor_steps, 1), completed=done, width=40))
        table.add_row("actor steps/s", f"{actor_rate:,.0f}")
        table.add_row("learner steps/s", f"{learner_rate:,.1f}  ({snap.learner_steps:,} total)")
        eval_text = "—" if snap.eval_return is None else f"{snap.eval_return:,.1f} (at {snap.eval_at:,} steps)"
        table.add_row("latest eval return", eval_text)
        if snap.replay_size is not None:
            table.add_row("replay size", f"{snap.replay_size:,}")
        table.add_row("episodes", "—" if snap.episodes is None else f"{snap.episodes:,}")
        table.add_row("elapsed", f"{snap.elapsed_s:,.1f} s")
        return table


class StepProgress:
    """`launch.train`'s progress with tqdm's interface (`update(delta)`, `set_postfix(**kw)`, `n`, `close()`):
    a tqdm bar on a terminal, `LineProgress` lines otherwise, nothing when disabled."""

    def __init__(self, total: int, enabled: bool, *, prog: str = "launch.train", line_every_s: float = LINE_EVERY_S,
                 tty: bool | None = None, stream: TextIO | None = None):
        self.n, self.total = 0, int(total)
        self._t0 = time.monotonic()
        self._rates = Rates()
        self._postfix: dict[str, str | int | float] = {}
        self._eval_at: int | None = None
        tty = sys.stdout.isatty() if tty is None else bool(tty)
        self._bar: tqdm | None = None
        self._lines: LineProgress | None = None
        if enabled and tty:
            self._bar = tqdm(total=total, unit="step", mininterval=1.0, dynamic_ncols=True, file=sys.stdout)
        elif enabled:
            self._lines = LineProgress(prog, line_every_s, stream)

    def set_postfix(self, refresh: bool = False, **values: str | int | float) -> None:
        self._postfix.update(values)
        if "eval_return" in values:
            self._eval_at = self.n
        if self._bar is not None:
            self._bar.set_postfix(refresh=refresh, **self._postfix)

    def update(self, delta: int, learner_steps: int | None = None) -> None:
        """`delta` more actor steps; `learner_steps`, the learner's count now (else the last one given), so the
        line shows the learner's progress between evaluations too."""
        self.n += int(delta)
        if learner_steps is not None:
            self._postfix["learner_steps"] = int(learner_steps)
            if self._bar is not None:
                self._bar.set_postfix(refresh=False, **self._postfix)
        if self._bar is not None:
            self._bar.update(delta)
        elif self._lines is not None:
            learner = int(self._postfix.get("learner_steps") or 0)
            actor_rate, learner_rate = self._rates.update(self.n, learner)
            ret = self._postfix.get("eval_return")
            snap = Snapshot(actor_steps=self.n, max_actor_steps=self.total, learner_steps=learner, episodes=None,
                            eval_return=None if ret is None else float(ret), eval_at=self._eval_at,
                            elapsed_s=time.monotonic() - self._t0)
            self._lines.update(snap, actor_rate, learner_rate)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._lines is not None:
            self._lines.close()


class ItemProgress:
    """Progress over a count of items (a PTQ sweep's precisions, a grid's runs) with the part of tqdm's interface
    the CLIs use (`set_postfix_str`, `update`, `write`): a tqdm bar on `stream` when it is a terminal, else one
    plain line per item done (what it was, n / total, seconds so far), never a carriage return; nothing when
    disabled (`write` still prints)."""

    def __init__(self, total: int, enabled: bool, *, prog: str, unit: str, initial: int = 0,
                 stream: TextIO | None = None, tty: bool | None = None):
        self._stream = sys.stderr if stream is None else stream
        self._prog, self._unit, self.total, self.n = prog, unit, int(total), int(initial)
        self._label = ""
        self._t0 = time.monotonic()
        tty = self._stream.isatty() if tty is None else bool(tty)
        self._bar: tqdm | None = None
        self._lines = enabled and not tty
        if enabled and tty:
            self._bar = tqdm(total=total, initial=initial, unit=unit, desc=prog.rsplit(".", 1)[-1],
                             dynamic_ncols=True, file=self._stream)

    def __enter__(self) -> "ItemProgress":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.close()

    def set_postfix_str(self, label: str, refresh: bool = True) -> None:
        self._label = label
        if self._bar is not None:
            self._bar.set_postfix_str(label, refresh=refresh)

    def update(self, delta: int = 1) -> None:
        self.n += int(delta)
        if self._bar is not None:
            self._bar.update(delta)
        elif self._lines:
            self._stream.write(f"{self._prog}: {self.n:,} / {self.total:,} {self._unit}s done"
                               f"{f' ({self._label})' if self._label else ''}, "
                               f"{time.monotonic() - self._t0:,.0f} s\n")
            self._stream.flush()

    def write(self, text: str, file: TextIO | None = None) -> None:
        """A message that does not break the bar."""
        if self._bar is not None:
            self._bar.write(text, file=file or self._stream)
        else:
            out = file or self._stream
            out.write(text + "\n")
            out.flush()

