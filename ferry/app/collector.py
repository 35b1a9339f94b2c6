"""The garbage collector's pace: slower while a ``ferry`` process starts, Python's own
once it has started its long life.

Start-up makes tens of thousands of objects that live as long as the process (the
modules it imports: their functions, classes, constants), and nothing else much: every
collection while it does finds no garbage, and each full one walks all of them again.
With the youngest generation collected every START_UP_YOUNG new objects instead of
Python's 700, none of the older ones is collected during start-up: ``ferry run --
true`` 41.2 -> 39.3 ms and 47.7 -> 46.2 (medians of 150 and 200 interleaved runs,
2026-12-05), ``submit-loop`` 3.95 and 4.47 -> 3.58 and 3.91.

A process that goes on to a long life (a launcher and its supervisor, at the fork that
makes the supervisor) goes back to Python's pace (``settle``): a ``work`` losing its
database for a while raises and keeps exceptions in cycles (their tracebacks), which
start-up's pace left for later (5.6 MB in an outage's first seconds, measured). Other
commands end soon after they start; the collector is on throughout.
"""

from __future__ import annotations

import gc

START_UP_YOUNG = 20_000
_USUAL = gc.get_threshold()  # (read at import: before start_up)


def start_up() -> None:
    gc.set_threshold(START_UP_YOUNG, *_USUAL[1:])


def settle() -> None:
    gc.set_threshold(*_USUAL)
