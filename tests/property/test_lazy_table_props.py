"""A table loaded lazily from a snapshot (``ferry.core.live``: a record decoded when
first asked for, the queue ordered when first asked for) answers every question as one
that decoded every task and ordered its queue at load, whatever it folds first and
whenever it is first asked. The writer drives valid events (test_queue_props' Queue,
plus cancels, forgets, keys); at a random point a snapshot is taken (its settled tasks
kept whole, or moved to a history read a task at a time); the records after it are
folded into an eager copy and a lazy copy, with random questions asked of both between
the folds. (Written by an adversarial review of the change.)"""

from __future__ import annotations

import contextlib
import copy
import math
from typing import Any

from historykit import ListHistory
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from test_queue_props import ACTIONS, RUNNER, Queue

from ferry.core import events as ev
from ferry.core.errors import FerryError
from ferry.core.ids import new_task_id
from ferry.core.model import Reason, State, Task
from ferry.core.spec import TaskSpec
from ferry.core.state import Table

STATES = [s.value for s in State]


class _NoTask(Exception):
    pass


class Writer(Queue):
    def __init__(self) -> None:
        super().__init__()
        self.gone: list[str] = []

    def task(self, pick: int) -> Task:
        for step in range(len(self.ids)):
            task = self.table.get(self.ids[(pick + step) % len(self.ids)])
            if task is not None:
                return task
        raise _NoTask

    def act(self, action: tuple[Any, ...]) -> None:
        with contextlib.suppress(_NoTask, FerryError):  # (refused: nothing written)
            self._act(action)

    def _act(self, action: tuple[Any, ...]) -> None:
        kind = action[0]
        if kind == "submit":
            try:
                super().act(action)
            except FerryError as error:
                assert error.code == "task.unknown_dependency", error
            return
        if kind == "cancel" and self.ids:
            task = self.task(action[1])
            if task.state is State.QUEUED:
                self.write(ev.Settled(task.id, task.attempt, None, State.CANCELLED,
                                      Reason.CANCELLED_BY_USER))  # fmt: skip
        elif kind == "forget" and self.ids:
            task = self.table.get(self.ids[action[1] % len(self.ids)])
            if task is not None and task.terminal:
                try:
                    self.write(ev.Forgotten(task.id, task.attempt))
                except FerryError:
                    return
                self.gone.append(task.id)
        elif kind == "keyed":
            task_id = new_task_id(1_715_000_000_000_000_000 + len(self.ids) * 10**6, b"\1" * 4)
            spec = TaskSpec(argv=("true",), cwd="/", key=f"k{action[1]}", group="a")
            try:
                self.write(ev.Submitted(task_id, spec, 1.0))
            except FerryError:
                return
            self.ids.append(task_id)
        elif kind in ("cancel", "forget"):
            return
        else:
            with contextlib.suppress(_NoTask):
                super().act(action)


WRITER_ACTIONS = st.one_of(
    ACTIONS,
    st.tuples(
        st.just("submit"),
        st.sampled_from(("a", "b")),
        st.integers(-1, 1),
        st.lists(st.integers(0, 50), max_size=2),
        st.none(),
    ),
    st.tuples(st.just("end"), st.integers(0, 50), st.booleans(), st.booleans()),
    st.tuples(st.just("claim"), st.integers(1, 3)),
    st.tuples(st.just("cancel"), st.integers(0, 50)),
    st.tuples(st.just("forget"), st.integers(0, 50)),
    st.tuples(st.just("keyed"), st.integers(0, 2)),
)


def load(snapshot: dict[str, Any], settled: list[dict[str, Any]] | None, eager: bool) -> Table:
    data = copy.deepcopy(snapshot)
    if settled is None:
        table = Table.from_snapshot(data)
    else:
        records = copy.deepcopy(settled)
        table = Table.from_snapshot(
            data, load_settled=lambda seq: copy.deepcopy(records),
            history=ListHistory([copy.deepcopy(records)]),
        )  # fmt: skip
    if eager:
        table.live()
        table.queue  # noqa: B018 (ordered now, as before the change)
    return table


def outcome(call: Any) -> Any:
    try:
        return ("ok", call())
    except FerryError as error:
        return ("refused", error.code, error.message, error.details)


def ask(table: Table, question: tuple[Any, ...], ids: list[str], now: float) -> Any:
    kind = question[0]
    pick = ids[question[1] % len(ids)] if ids else "x"
    if kind == "live":
        return [t.id for t in table.live()]
    if kind == "in_flight":
        return [t.id for t in table.in_flight()]
    if kind == "queued":
        return [t.id for t in table.queued()]
    if kind == "count":
        return [table.count(s) for s in (None, *STATES)], table.count_live()
    if kind == "newest":
        return [t.id for t in table.newest(question[1] % 5)]
    if kind == "candidates":
        return [t.id for t in table.candidates(question[1] % 6 + 1, now=now)]
    if kind == "far":
        return [t.id for t in table.candidates(100, now=math.inf)]
    if kind == "groups":
        return table.groups()
    if kind == "doomed":
        return [(t.id, cause) for t, cause in table.doomed()]
    if kind == "state_of":
        return [table.state_of(i) for i in ids]
    if kind == "get":
        found = table.get(pick)
        return None if found is None else repr(found)
    if kind == "by_number":
        found = table.by_number(question[1] % 8)
        return None if found is None else found.id
    if kind == "resolve":
        return outcome(lambda: table.resolve(pick[: 2 + question[1] % 12]).id)
    if kind == "by_key":
        return table.by_key(f"k{question[1] % 3}")
    if kind == "live_snapshot":
        return table.live_snapshot()
    if kind == "settled_counts":
        return table.settled_counts()
    if kind == "claim":
        found = table.get(pick)
        attempt = 1 if found is None else found.attempt
        batch = [ev.Claimed(pick, attempt, "t", RUNNER, "work").encode()]
        return outcome(lambda: table.validate_batch(batch, now=now))
    if kind == "forget":
        found = table.get(pick)
        attempt = 1 if found is None else found.attempt
        batch = [ev.Forgotten(pick, attempt).encode()]
        return outcome(lambda: table.validate_batch(batch, now=now))
    if kind == "doom":
        found = table.get(pick)
        attempt = 1 if found is None else found.attempt
        batch = [ev.Settled(pick, attempt, None, State.CANCELLED,
                            Reason.DEPENDENCY_FAILED).encode()]  # fmt: skip
        return outcome(lambda: table.validate_batch(batch, now=now))
    if kind == "submit_after":
        spec = TaskSpec(argv=("x",), cwd="/", after=(pick,), key="k0")
        batch = [ev.Submitted("zz" + pick, spec, 1.0).encode()]
        return outcome(lambda: table.validate_batch(batch, now=now))
    raise AssertionError(kind)


QUESTIONS = st.tuples(
    st.sampled_from(
        [
            "live",
            "in_flight",
            "queued",
            "count",
            "newest",
            "candidates",
            "far",
            "groups",
            "doomed",
            "state_of",
            "get",
            "by_number",
            "resolve",
            "by_key",
            "live_snapshot",
            "settled_counts",
            "claim",
            "forget",
            "doom",
            "submit_after",
        ]
    ),
    st.integers(0, 50),
)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.lists(WRITER_ACTIONS, min_size=3, max_size=40),
    st.lists(WRITER_ACTIONS, min_size=2, max_size=30),
    st.booleans(),
    st.lists(st.tuples(st.integers(0, 30), QUESTIONS), max_size=12),
)
def test_a_lazy_table_answers_as_an_eager_one(
    before: list[Any], after: list[Any], with_history: bool, questions: list[Any]
) -> None:
    writer = Writer()
    for action in before:
        writer.act(action)
    full = writer.table.to_snapshot()
    if with_history:
        settled = full.pop("settled")
        full = {**writer.table.live_snapshot()}
        full.pop("settled", None)
    else:
        settled = None
    writer.since = []
    for action in after:
        writer.act(action)
    records = writer.since
    event(
        f"live at snapshot {min(len(full['live']), 5)}; records after {min(len(records) // 5 * 5, 20)}"
    )
    eager, lazy = load(full, settled, True), load(full, settled, False)
    asked = sorted(questions, key=lambda q: q[0])
    for index, record in enumerate([*records, None]):
        while asked and asked[0][0] <= index:
            _, question = asked.pop(0)
            ids = writer.ids
            want = ask(eager, question, ids, writer.now)
            got = ask(lazy, question, ids, writer.now)
            assert got == want, question
        if record is not None:
            eager.apply(*record)
            lazy.apply(*record)
    assert lazy.anomalies == eager.anomalies
    assert lazy.live_snapshot() == eager.live_snapshot()
    assert lazy.to_snapshot() == eager.to_snapshot()
    assert [t.id for t in lazy.candidates(100, now=writer.now)] == [
        t.id for t in eager.candidates(100, now=writer.now)
    ]
    assert [(t.id, c) for t, c in lazy.doomed()] == [(t.id, c) for t, c in eager.doomed()]
