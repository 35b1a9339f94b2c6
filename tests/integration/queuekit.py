"""Tasks that stamp their own start and end, for the queue control tests: what ran
when, as the tasks themselves saw it (the order of starts, how many of a group ran at
once, whether a task started after its dependencies ended or its time came).

Each task appends ``start NAME ATTEMPT TIME`` and ``end NAME ATTEMPT TIME`` lines
(``TIME``: Unix seconds from ``date +%s.%N``; a line is one small O_APPEND write, so
lines from tasks running at once do not mix). The stamps lie inside the task's life,
so an overlap they show is real (a limit they show kept may still have been broken
between the stamps and the task's claim or end: the tests also check the journal).
"""

from __future__ import annotations

import shlex
from pathlib import Path


class Stamps:
    def __init__(self, path: Path) -> None:
        self.path = path

    def lines(self) -> list[tuple[str, str, int, float]]:
        """(kind, name, attempt, time) in the order written."""
        if not self.path.exists():
            return []
        found = []
        for line in self.path.read_text().splitlines():
            kind, name, attempt, when = line.split()
            found.append((kind, name, int(attempt), float(when)))
        return found

    def starts(self) -> list[str]:
        return [name for kind, name, _, _ in self.lines() if kind == "start"]

    def started(self, name: str) -> int:
        """How many times ``name`` started (attempts)."""
        return self.starts().count(name)

    def intervals(self) -> dict[tuple[str, int], tuple[float, float]]:
        """(name, attempt) -> (start, end) of each attempt that ended."""
        began: dict[tuple[str, int], float] = {}
        found: dict[tuple[str, int], tuple[float, float]] = {}
        for kind, name, attempt, when in self.lines():
            if kind == "start":
                began[(name, attempt)] = when
            else:
                found[(name, attempt)] = (began[(name, attempt)], when)
        return found

    def most_at_once(self, names: set[str]) -> int:
        """The most tasks among ``names`` running at once (by their stamps)."""
        points = []
        for (name, _), (start, end) in self.intervals().items():
            if name in names:
                points += [(start, 1), (end, -1)]
        running = most = 0
        for _, change in sorted(points, key=lambda point: (point[0], point[1])):
            running += change
            most = max(most, running)
        return most


def stamped(
    stamps: Stamps,
    name: str,
    *,
    gate: Path | None = None,
    sleep_s: float = 0.0,
    fail_attempts: int = 0,
    exit_code: int = 0,
) -> list[str]:
    """argv of a task that stamps its start and end: waits for ``gate`` (a file) if
    given, sleeps ``sleep_s``, fails (exit 3) its first ``fail_attempts`` attempts, then
    exits ``exit_code``."""
    where = shlex.quote(str(stamps.path))
    stamp = f'echo "%s {name} $FERRY_ATTEMPT $(date +%%s.%%N)" >> {where}'
    steps = [stamp % "start"]
    if gate is not None:
        steps.append(f"while [ ! -e {shlex.quote(str(gate))} ]; do sleep 0.02; done")
    if sleep_s:
        steps.append(f"sleep {sleep_s}")
    steps.append(stamp % "end")
    if fail_attempts:
        steps.append(f'[ "$FERRY_ATTEMPT" -gt {fail_attempts} ] || exit 3')
    steps.append(f"exit {exit_code}")
    return ["sh", "-c", "; ".join(steps)]


def gated(stamps: Stamps, name: str, gate: Path) -> list[str]:
    return stamped(stamps, name, gate=gate)
