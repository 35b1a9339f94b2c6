"""Properties of the fold over random event sequences (hypothesis):

* apply never raises, whatever the journal holds; an event is folded exactly when
  validate accepts it (admission rules aside: keys, a claim token for a task in flight,
  no release after a cancel request: checked only before a write, since a journal
  written under looser rules must read back as written), otherwise it becomes an
  anomaly and changes nothing;
* the table's invariants hold after every record;
* a snapshot taken at any point, with or without its settled part, reproduces the table,
  and replaying the rest of the journal on top of it gives the same table as a full
  replay; asked a task at a time (``ferry.core.history``), its history not loaded
  answers what ``ls`` and ``show`` ask as the loaded one does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from historykit import ListHistory
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ferry.core import events as ev
from ferry.core.errors import FerryError
from ferry.core.model import IN_FLIGHT_STATES, Liveness, Reason, State
from ferry.core.recovery import Observation, Policy, decide
from ferry.core.spec import TaskSpec
from ferry.core.state import Table

IDS = ["01hf7yat00aaaaaa", "01hf7yat00bbbbbb", "01hf7yat00cccccc"]
TOKENS = ["t1", "t2", "t3"]
RUNNER = {"pid": 1, "start_time": 2.0, "boot_id": "b", "host": "h"}
Record = tuple[str, dict[str, Any]]
E = ev.EventType
# Refusals that only a new write gets (ferry.core.fold.check_write, the key rules).
ADMISSION_CODES = frozenset({"task.stale_claim", "task.cancel_requested"})
# A FORGOTTEN is checked in full only before it is written: replay forgets any task that
# is not live without loading its history (ferry.core.fold), whatever its attempt.
FORGET_ADMISSION_CODES = frozenset({"task.stale_attempt", "task.not_found"})
# What usually comes next for a task in each state, so random runs reach deep states.
NATURAL: dict[State | None, list[ev.EventType]] = {
    None: [E.SUBMITTED],
    State.QUEUED: [E.CLAIMED, E.CLAIMED, E.SETTLED],
    State.CLAIMED: [E.DISPATCHING, E.DISPATCHING, E.RELEASED, E.SETTLED],
    State.DISPATCHING: [E.SPAWNED, E.SPAWNED, E.RELEASED, E.SETTLED],
    State.RUNNING: [E.SETTLED, E.STALE, E.RELEASED, E.CANCEL_REQUESTED],
    State.STALE: [E.RESUMED, E.SETTLED, E.RELEASED],
    State.FAILED: [E.RETRIED, E.ORPHAN_SIGNALLED, E.RESOLVED, E.FORGOTTEN],
    State.CANCELLED: [E.RETRIED, E.RESOLVED, E.FORGOTTEN],
    State.SUCCEEDED: [E.FORGOTTEN],
}
# The strategies, made once: hypothesis checks each new one as it is first drawn from,
# which cost this suite more than the fold it tests. (A tuple argument is hashable: the
# strategy made from it is cached too.)
_ANYTHING = st.sampled_from([*ev.EventType, "FROM_THE_FUTURE"])
_KINDS = {state: st.sampled_from(kinds) | _ANYTHING for state, kinds in NATURAL.items()}
_IDS, _TOKENS = st.sampled_from(IDS), st.sampled_from(TOKENS)
_SETTLED_STATES = st.sampled_from((State.SUCCEEDED, State.FAILED, State.CANCELLED))


@st.composite
def plausible_event(draw: st.DrawFn, table: Table) -> Record:
    """An event aimed at the current table: often legal, often subtly not."""
    task_id = draw(_IDS)
    task = table.get(task_id)
    current = task.attempt if task is not None else 1
    attempt = draw(st.sampled_from((current, current, current, current + 1, max(1, current - 1))))
    own = task.claim_token if task is not None and task.claim_token else draw(_TOKENS)
    token = draw(st.sampled_from((own, own, own, "stranger")))
    kind = draw(_KINDS[None if task is None else task.state])
    if kind == ev.EventType.RETRIED and draw(st.booleans()):
        attempt = current + 1
    event: ev.Event
    if kind == "FROM_THE_FUTURE":
        return "FROM_THE_FUTURE", {"task": task_id}
    if kind == ev.EventType.SUBMITTED:
        spec = TaskSpec(argv=("x",), cwd="/", idempotent=draw(st.booleans()),
                        max_releases=draw(st.integers(0, 2)))  # fmt: skip
        event = ev.Submitted(task_id, spec, 1.0)
    elif kind == ev.EventType.CLAIMED:
        event = ev.Claimed(task_id, attempt, draw(_TOKENS), RUNNER, "work")
    elif kind == ev.EventType.DISPATCHING:
        event = ev.Dispatching(task_id, attempt, token, "marker")
    elif kind == ev.EventType.SPAWNED:
        event = ev.Spawned(task_id, attempt, token, 10, 10, 3.0)
    elif kind == ev.EventType.SETTLED:
        state = draw(_SETTLED_STATES)
        reason = None if state is State.SUCCEEDED else Reason.EXIT_NONZERO
        settle_token = draw(st.sampled_from((token, None)))
        event = ev.Settled(task_id, attempt, settle_token, state, reason, 0)
    elif kind == ev.EventType.RELEASED:
        event = ev.Released(task_id, attempt, draw(st.sampled_from((token, None))),
                            Reason.RELEASED_TO_QUEUE, draw(st.booleans()))  # fmt: skip
    elif kind == ev.EventType.STALE:
        event = ev.Stale(task_id, attempt, draw(st.sampled_from((token, None))))
    elif kind == ev.EventType.RESUMED:
        event = ev.Resumed(task_id, attempt, draw(st.sampled_from((token, None))))
    elif kind == ev.EventType.CANCEL_REQUESTED:
        event = ev.CancelRequested(task_id, attempt, draw(st.sampled_from((token, None))))
    elif kind == ev.EventType.RETRIED:
        event = ev.Retried(task_id, attempt)
    elif kind == ev.EventType.RESOLVED:
        event = ev.Resolved(task_id, attempt, draw(st.sampled_from(ev.RESOLVED_AS)))
    elif kind == ev.EventType.ORPHAN_SIGNALLED:
        token_or_none = draw(st.sampled_from((token, None)))
        event = ev.OrphanSignalled(task_id, attempt, 10, 10, 3.0, 9, token_or_none)
    elif kind == ev.EventType.FORGOTTEN:
        event = ev.Forgotten(task_id, attempt)
    elif kind == ev.EventType.LEASE_ACQUIRED:
        event = ev.LeaseAcquired(draw(st.integers(0, 5)), RUNNER)
    else:
        event = ev.LeaseReleased(draw(st.integers(0, 5)), RUNNER)
    return event.encode()


def check_invariants(table: Table) -> None:
    live_ids = {task.id for task in table.live()}
    for task_id in table.ids():
        task = table.get(task_id)
        assert task is not None and task.attempt >= 1
        assert (task_id in live_ids) is (not task.terminal)
        assert 0 <= task.releases <= task.spec.max_releases
        assert (task.claim_token is not None) is (task.state in IN_FLIGHT_STATES)
        if task.state is State.RUNNING:
            assert task.pid is not None
    queued = table.queued()
    oldest = table.oldest_queued()
    assert (oldest is None) if not queued else (oldest == queued[0])
    # what a compaction asks, kept as the tasks change: as counted from them
    settled = [task for task in table.tasks() if task.terminal]
    counted: dict[str, int] = {}
    for task in settled:
        counted[task.state.value] = counted.get(task.state.value, 0) + 1
    assert table.settled_counts() == dict(sorted(counted.items()))


def replay(records: list[tuple[str, Mapping[str, Any], int]], table: Table | None = None) -> Table:
    table = table or Table()
    for record_type, data, seq in records:
        table.apply(record_type, data, seq, float(seq))
    return table


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_apply_folds_exactly_what_validate_accepts(data: st.DataObject) -> None:
    table = Table()
    journal: list[tuple[str, Mapping[str, Any], int]] = []
    for seq in range(1, data.draw(st.integers(1, 60)) + 1):
        record_type, payload = data.draw(plausible_event(table))
        before = table.to_snapshot()
        anomalies_before = len(table.anomalies)
        try:
            table.validate(record_type, payload)
            refused = None
        except FerryError as error:
            refused = error.code
        assert table.to_snapshot() == before  # validate writes nothing
        table.apply(record_type, payload, seq, float(seq))
        journal.append((record_type, payload, seq))
        if data.draw(st.integers(0, 9)) == 0:
            table.archived(data.draw(st.integers(0, seq)))  # (a compaction's snapshot)
        since = data.draw(st.integers(0, seq))
        expected = sorted(t.id for t in table.tasks() if t.terminal and t.updated_seq > since)
        assert sorted(r["id"] for r in table.settled_since(since)) == expected
        became_anomaly = len(table.anomalies) > anomalies_before
        if record_type == "FROM_THE_FUTURE":
            assert refused is not None and not became_anomaly
        elif refused is None:
            assert not became_anomaly, (record_type, payload)
        elif not became_anomaly:  # refused at write time, folded on replay
            admitted = ADMISSION_CODES
            if record_type == E.FORGOTTEN:
                admitted = admitted | FORGET_ADMISSION_CODES
            assert refused in admitted, (refused, record_type, payload)
        if became_anomaly:
            after = table.to_snapshot()
            after.pop("anomalies"), before.pop("anomalies")
            after.pop("last_seq"), before.pop("last_seq")
            assert after == before
        check_invariants(table)

    # recovery's decision about any in-flight task is always a legal record
    for task in table.live():
        if task.state not in IN_FLIGHT_STATES:
            continue
        seen = Observation(
            data.draw(st.sampled_from(Liveness)),
            data.draw(st.sampled_from(Liveness)),
            data.draw(st.none() | st.floats(-10, 100)),
        )
        decision = decide(task, seen, Policy(stale_after_s=10.0), now=0.0)
        if decision.event is not None:
            table.validate(*decision.event)

    # a full replay is deterministic
    assert replay(journal).to_snapshot() == table.to_snapshot()
    # a snapshot at any cut plus the rest of the journal gives the same table
    cut = data.draw(st.integers(0, len(journal)))
    prefix = replay(journal[:cut]).to_snapshot()
    resumed = replay(journal[cut:], Table.from_snapshot(prefix))
    assert resumed.to_snapshot() == table.to_snapshot()
    # ... also when the settled part is loaded lazily
    settled = prefix.pop("settled")
    lazy = replay(journal[cut:], Table.from_snapshot(prefix, load_settled=lambda _seq: settled))
    assert lazy.to_snapshot() == table.to_snapshot()
    # ... and when that history is gone, by a later snapshot's (what the store falls
    # back to once compactions merged and pruned the archives): its archives when the
    # table is past it (the old ones kept beside, or merged away), else that snapshot
    later = data.draw(st.integers(cut, len(journal)))
    newer = replay(journal[:later]).to_snapshot()
    merged = newer.pop("settled")
    archives = merged if data.draw(st.booleans()) else [*settled, *merged]

    def fallback(table_seq: int) -> Iterable[Mapping[str, Any]] | Table:
        if table_seq >= later:
            return archives
        return Table.from_snapshot(newer, load_settled=lambda _seq: archives)

    moved = replay(journal[cut:], Table.from_snapshot(prefix, load_settled=fallback))
    assert moved.to_snapshot() == table.to_snapshot()

    # ... and when a history not loaded is asked a task at a time (archives with an
    # index: two of them, as two compactions leave them, the later one newer), every
    # question asked before, during and after the rest is folded gets the answer of
    # the table that loaded it all
    early = data.draw(st.integers(0, cut))
    first = replay(journal[:early]).to_snapshot()["settled"]
    archives = [first, replay(journal[:cut]).settled_since(early)]
    history = ListHistory(archives)
    partial = Table.from_snapshot(prefix, load_settled=lambda _seq: settled, history=history)
    full = Table.from_snapshot(prefix, load_settled=lambda _seq: settled)
    full.ids()  # (loaded)
    if data.draw(st.booleans()):
        ask_alike(data, partial, full)
    for record_type, payload, seq in journal[cut:]:
        partial.apply(record_type, payload, seq, float(seq))
        full.apply(record_type, payload, seq, float(seq))
        if data.draw(st.integers(0, 4)) == 0:
            ask_alike(data, partial, full)
    counts = partial.settled_counts()
    assert counts is None or counts == table.settled_counts()
    ask_alike(data, partial, full)
    assert partial.to_snapshot() == table.to_snapshot()


def ask_alike(data: st.DataObject, partial: Table, full: Table) -> None:
    """The questions ``ls`` and ``show`` ask, to both tables: the same answers."""
    limit = data.draw(st.integers(0, 4))
    state = data.draw(st.none() | st.sampled_from([s.value for s in State]))
    assert partial.newest(limit, state) == full.newest(limit, state)
    assert partial.count(state) == full.count(state)
    reference = data.draw(st.sampled_from([*IDS, IDS[0][:-1], "01hf7yat00", "1", "2", "4"]))
    try:
        expected: object = full.resolve(reference)
    except FerryError as error:
        expected = error.code
    try:
        got: object = partial.resolve(reference)
    except FerryError as error:
        got = error.code
    assert got == expected


@settings(max_examples=200, deadline=None)
@given(
    st.text(max_size=20),
    st.dictionaries(st.text(max_size=8), st.none() | st.integers() | st.text(max_size=5) | st.booleans(), max_size=6),
)  # fmt: skip
def test_apply_of_arbitrary_garbage_never_raises(record_type: str, payload: dict[str, Any]) -> None:
    table = Table()
    table.apply(record_type, payload, 1, 1.0)
    for known in ev.EventType:
        table.apply(known.value, payload, table.last_seq + 1, 1.0)
    assert table.last_seq == 1 + len(ev.EventType)
