"""docs/events.md lists exactly the event types and payload fields the code writes."""

from __future__ import annotations

import re
from pathlib import Path

from ferry.core import events as ev
from ferry.core.model import Reason, State
from ferry.core.spec import TaskSpec

DOC = Path(__file__).resolve().parents[2] / "docs" / "events.md"

ONE_OF_EACH: list[ev.Event] = [
    ev.Submitted("t", TaskSpec(argv=("x",), cwd="/"), 1.0),
    ev.Claimed("t", 1, "k", {}, "run"),
    ev.Dispatching("t", 1, "k", "m"),
    ev.Spawned("t", 1, "k", 1, 1, 1.0),
    ev.Settled("t", 1, None, State.FAILED, Reason.TIMEOUT),
    ev.Released("t", 1, None, Reason.RELEASED_TO_QUEUE, True),
    ev.Stale("t", 1),
    ev.Resumed("t", 1),
    ev.CancelRequested("t", 1),
    ev.Retried("t", 2),
    ev.Resolved("t", 1, "failed"),
    ev.OrphanSignalled("t", 1, 1, 1, 1.0, 9),
    ev.Forgotten("t", 1),
    ev.LeaseAcquired(1, {}),
    ev.LeaseReleased(1, {}),
    ev.GroupSet("g", 2),
    ev.GroupPaused(None),
    ev.GroupResumed("g"),
]


def doc_table() -> dict[str, list[str]]:
    rows = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| ") and cells[0].isupper() and cells[0] != "type":
            rows[cells[0]] = re.findall(r"`([a-z_]+)`", cells[1])
    return rows


def test_every_type_is_documented_with_its_fields_in_order() -> None:
    table = doc_table()
    assert set(table) == {kind.value for kind in ev.EventType}
    for event in ONE_OF_EACH:
        record_type, data = event.encode()
        assert table[record_type] == list(data), record_type
