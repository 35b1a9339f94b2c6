"""The garbage collector's pace: slower while a ``ferry`` process starts, Python's own
once it has started its long life.

Start-up makes tens of thousands of objects that live as long as the process (the
modules it imports: their functions, classes, constants), and nothing else much: every
collection while it does finds no garbage, and each full one walks all of them again.
With the youngest generation collected every START_UP_YOUNG new objects instead of
Python's 700, none of the older ones is collected during start-up: ``ferry run --
true`` 41.2 -> 39.3 ms and 47.7 -> 46.2 (medians of 150 and 200 interleaved runs,
2026-12-05), ``submit-loop`` 3.95 and 4.47 -> 3.58 and 3.91.

A process that goes on to a long life goes back to Python's pace (``settle``): a
launcher at the fork that makes its supervisor; a supervisor once it has planned its
task and imported what spawns it (its own start-up, after the fork). A ``work`` that
lost its database for a while and kept start-up's pace held 5.6 MB more in the
outage's first seconds (its exceptions' cycles: their tracebacks). Other commands end
soon after they start; the collector is on throughout.
"""

from __future__ import annotations

import gc

START_UP_YOUNG = 20_000
_USUAL = gc.get_threshold()  # (read at import: before start_up)


def start_up() -> None:
    gc.set_threshold(START_UP_YOUNG, *_USUAL[1:])


def settle() -> None:
    """Python's pace from now on, start-up's objects frozen first: they live as long as
    the process, and the first young collection at Python's pace would otherwise walk
    all of them (up to START_UP_YOUNG objects: 1 ms of ``run``). Once: a process at
    Python's pace already (a supervisor's next task, ``work``'s next fork) has nothing
    to freeze, and a freeze then would keep its garbage for ever."""
    if gc.get_threshold() != _USUAL:
        gc.freeze()
        gc.set_threshold(*_USUAL)
