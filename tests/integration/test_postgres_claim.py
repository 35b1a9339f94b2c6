"""A claim on PostgreSQL in one round trip (``PgStore.claim_next``: the ``ferry_claim``
function of schema version 4): each of the queue's rules that the commit path checks
(``ferry.core.state.Table.validate_batch``), checked by the function on the rows as they
are; the lease's epoch; and what it writes: the same events and the same row as the
commit path, against a real server (``pg_url``: a database of its own per test).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import psycopg
import pytest
from clikit import wait_until
from pgserver import schema_at

from ferry.app.runner import as_cancelled
from ferry.core import events as ev
from ferry.core.errors import DatabaseUnavailableError, LeaseHeldError
from ferry.core.ids import new_claim_token, new_task_id
from ferry.core.model import Reason, State, Task
from ferry.core.spec import TaskSpec
from ferry.proc.process import self_identity
from ferry.storage.claiming import claim_events
from ferry.storage.postgres import schema
from ferry.storage.postgres.connect import application_name
from ferry.storage.postgres.lease import PgLeases
from ferry.storage.postgres.store import PgStore

pytestmark = pytest.mark.timeout(120)

RUNNER = self_identity().to_json()


class Host:
    """A host's store with its lease (the epoch its claims carry)."""

    def __init__(self, url: str, name: str) -> None:
        self.store = PgStore.open(url, name)
        self.leases = PgLeases(self.store.db, name, ttl_s=600)
        self.lease = self.leases.acquire(self_identity())

    @property
    def epoch(self) -> int:
        return self.lease.epoch

    def claim(self, token: str | None = None) -> Task | None:
        return self.store.claim_next(
            RUNNER, token or new_claim_token(os.urandom(10)), by="work", epoch=self.epoch
        )

    def claim_ids(self) -> list[str]:
        """Claim until nothing is left; the ids in claim order."""
        found = []
        while (task := self.claim()) is not None:
            found.append(task.id)
        return found


@pytest.fixture
def url(pg_url: str) -> str:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        schema.migrate(conn)
    return pg_url


@pytest.fixture
def host(url: str) -> Iterator[Host]:
    made = Host(url, "a")
    yield made
    made.store.close()


def submit(store: PgStore, count: int = 1, **spec: Any) -> list[str]:
    specs = TaskSpec(argv=("true",), cwd="/", **spec)
    batch = [ev.Submitted(new_task_id(time.time_ns(), os.urandom(4)), specs, time.time())
             for _ in range(count)]  # fmt: skip
    store.commit(*batch)
    return [e.task for e in batch]


def settle(store: PgStore, task: Task, state: State = State.SUCCEEDED) -> None:
    store.commit(*_ended(task, state))


def _ended(task: Task, state: State = State.SUCCEEDED) -> list[ev.Event]:
    """A claimed task's SPAWNED and SETTLED (exit 0, or 3 with EXIT_NONZERO)."""
    token = str(task.claim_token)
    failed = state is not State.SUCCEEDED
    reason, code = (Reason.EXIT_NONZERO, 3) if failed else (None, 0)
    return [ev.Spawned(task.id, task.attempt, token, 4242, 4242, 1),
            ev.Settled(task.id, task.attempt, token, state, reason, code)]  # fmt: skip


def rows(url: str, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(sql, params).fetchall()


# ---- the queue's rules, one each --------------------------------------------------------


def test_priority_first_then_queue_order(host: Host) -> None:
    low = submit(host.store, 2)
    high = submit(host.store, 2, priority=5)
    negative = submit(host.store, 1, priority=-1)
    assert host.claim_ids() == [*high, *low, *negative]


def test_a_task_is_not_claimed_before_its_not_before(host: Host) -> None:
    later = submit(host.store, 1, priority=9, not_before=time.time() + 3600)
    due = submit(host.store, 1, not_before=time.time() - 1)
    assert host.claim_ids() == due
    assert host.store.get(later[0]).state is State.QUEUED


def test_a_paused_group_is_not_claimed(host: Host) -> None:
    paused = submit(host.store, 2, group="g", priority=9)
    other = submit(host.store, 1)
    host.store.commit(ev.GroupPaused("g"))
    assert host.claim_ids() == other
    host.store.commit(ev.GroupResumed("g"), ev.GroupPaused(None))  # every group paused
    assert host.claim_ids() == []
    host.store.commit(ev.GroupResumed(None))
    assert host.claim_ids() == paused


def test_a_group_limit_is_never_passed(host: Host) -> None:
    limited = submit(host.store, 3, group="g", priority=9)
    other = submit(host.store, 1)
    host.store.commit(ev.GroupSet("g", 1))
    first = host.claim()
    assert first is not None and first.id == limited[0]
    assert host.claim_ids() == other  # g is full: its next task waits
    settle(host.store, first)
    assert host.claim_ids() == [limited[1]]


def test_a_group_limit_holds_under_concurrent_claimers(url: str, host: Host) -> None:
    """Eight claimers (eight hosts, a connection each) at once over a group limited to
    2: each claim counts the group's tasks in flight under the group's count lock, read
    after the lock is granted (a claim that waited for it sees the claims committed
    meanwhile)."""
    submit(host.store, 40, group="g")
    host.store.commit(ev.GroupSet("g", 2))
    claimers = [Host(url, f"c{i}") for i in range(8)]
    claimed: list[Task] = []
    start = threading.Barrier(len(claimers))

    def claim(one: Host) -> None:
        start.wait()
        task = one.claim()
        if task is not None:
            claimed.append(task)

    try:
        threads = [threading.Thread(target=claim, args=(one,)) for one in claimers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    finally:
        for one in claimers:
            one.store.close()
    assert len(claimed) == 2
    in_flight = rows(url, "SELECT count(*) FROM ferry_tasks WHERE state = 'DISPATCHING'")
    assert in_flight == [(2,)]


def test_a_task_waits_until_every_dependency_succeeded(host: Host) -> None:
    first, second = submit(host.store, 2)
    after = submit(host.store, 1, after=(first, second), priority=9)
    assert host.claim_ids() == [first, second]  # (not `after`: its dependencies run)
    settle(host.store, host.store.get(first))
    assert host.claim_ids() == []  # one dependency still in flight
    settle(host.store, host.store.get(second), State.FAILED)
    assert host.claim_ids() == []  # one failed (DEPENDENCY_FAILED is recovery's to write)
    failed = host.store.get(second)
    host.store.commit(ev.Retried(second, failed.attempt + 1))
    retried = host.claim()
    assert retried is not None and retried.id == second
    settle(host.store, retried)
    assert host.claim_ids() == after


def test_a_missing_dependency_is_not_met(url: str, host: Host) -> None:
    gone = submit(host.store, 1)[0]
    waiting = submit(host.store, 1, after=(gone,))
    with psycopg.connect(url) as conn:  # (as if gc forgot it: the commit path refuses)
        conn.execute("DELETE FROM ferry_tasks WHERE id = %s", (gone,))
    assert host.claim_ids() == []
    assert host.store.get(waiting[0]).state is State.QUEUED


def test_a_stale_epoch_is_refused_with_nothing_written(url: str, host: Host) -> None:
    (task_id,) = submit(host.store, 1)
    before = rows(url, "SELECT body, updated_at FROM ferry_tasks")
    events = rows(url, "SELECT count(*) FROM ferry_events")
    stale = host.epoch
    host.lease = host.leases.acquire(self_identity())  # (a new holder: a newer epoch)
    with pytest.raises(LeaseHeldError) as fenced:
        host.store.claim_next(RUNNER, "tok", by="work", epoch=stale)
    assert fenced.value.code == "journal.fenced"
    assert fenced.value.details["current_epoch"] == host.epoch
    assert rows(url, "SELECT body, updated_at FROM ferry_tasks") == before
    assert rows(url, "SELECT count(*) FROM ferry_events") == events
    claimed = host.claim()  # (the row was let go)
    assert claimed is not None and claimed.id == task_id


def test_an_expired_lease_is_refused_with_nothing_written(url: str, host: Host) -> None:
    submit(host.store, 1)
    with psycopg.connect(url) as conn:
        conn.execute("UPDATE ferry_hosts SET expires_at = now() - interval '1 s'")
    events = rows(url, "SELECT count(*) FROM ferry_events")
    with pytest.raises(LeaseHeldError):
        host.claim()
    assert rows(url, "SELECT count(*) FROM ferry_events") == events
    assert rows(url, "SELECT state FROM ferry_tasks") == [("QUEUED",)]


# ---- what it writes ---------------------------------------------------------------------


def _comparable(body: dict[str, Any], task_id: str, token: str) -> dict[str, Any]:
    """A task row's body with what differs between two tasks claimed the same way
    (ids, tokens, seqs, times, numbers) put aside."""
    text = repr(body).replace(task_id, "<id>").replace(token, "<token>")
    kept = eval(text)  # (a repr of JSON values: dicts, lists, strings, numbers, bools)
    for name in ("submit_seq", "queue_seq", "updated_seq", "number", "created_at"):
        kept.pop(name, None)
    return dict(kept)


@pytest.mark.parametrize("pointers", [False, True])
def test_the_claim_writes_what_the_commit_path_writes(url: str, host: Host, pointers: bool) -> None:
    """Two tasks alike, each claimed, released (a reason and a count to clear), claimed
    again: one by commit (the events ``claiming.claim_events`` makes, validated by the
    fold), one by ``claim_next``. The same events, the same row (a task with pinned
    inputs: CLAIMED alone)."""
    spec: dict[str, Any] = {}
    if pointers:
        spec["pointers"] = (("input", "ab" * 32),)
    by_commit, by_call = submit(host.store, 2, **spec)
    tokens = {}
    for round_ in (1, 2):
        for task_id in (by_commit, by_call):
            token = tokens[task_id] = new_claim_token(os.urandom(10))
            task = host.store.get(task_id)
            assert task is not None and task.state is State.QUEUED
            if task_id == by_commit:
                host.store.commit(*claim_events(task, RUNNER, token, "work"), epoch=host.epoch)
            else:
                claimed = host.store.claim_next(RUNNER, token, by="work", epoch=host.epoch)
                assert claimed is not None and claimed.id == by_call
                assert claimed == host.store.get(by_call)
        for task_id in (by_commit, by_call) if round_ == 1 else ():
            host.store.commit(ev.Released(task_id, 1, tokens[task_id],
                                          Reason.RELEASED_TO_QUEUE, True, {"why": "a test"}))  # fmt: skip
    found = {
        task_id: rows(
            url,
            "SELECT body, state, reason, host, claimed_by, heartbeat_at"
            " FROM ferry_tasks WHERE id = %s",
            (task_id,),
        )[0]
        for task_id in (by_commit, by_call)
    }
    bodies = [_comparable(found[t][0], t, tokens[t]) for t in (by_commit, by_call)]
    assert bodies[0] == bodies[1]
    assert bodies[0]["state"] == ("CLAIMED" if pointers else "DISPATCHING")
    assert bodies[0]["releases"] == 1 and "reason" not in bodies[0]
    assert found[by_commit][1:] == found[by_call][1:]
    events = {
        task_id: [
            (kind, epoch, where, _comparable(data, task_id, tokens[task_id]))
            for kind, epoch, where, data in rows(
                url, "SELECT type, epoch, host, data FROM ferry_events WHERE task = %s"
                " AND seq > (SELECT max(seq) FROM ferry_events WHERE task = %s"
                " AND type = 'RELEASED') ORDER BY seq", (task_id, task_id))
        ]
        for task_id in (by_commit, by_call)
    }  # fmt: skip
    assert events[by_commit] == events[by_call]
    assert [kind for kind, *_ in events[by_call]] == (
        ["CLAIMED"] if pointers else ["CLAIMED", "DISPATCHING"]
    )


def test_a_retried_task_is_claimed_as_its_new_attempt(url: str, host: Host) -> None:
    (task_id,) = submit(host.store, 1)
    first = host.claim()
    assert first is not None
    settle(host.store, first, State.FAILED)
    host.store.commit(ev.Retried(task_id, 2))
    token = new_claim_token(os.urandom(10))
    second = host.claim(token)
    assert second is not None and (second.attempt, second.state) == (2, State.DISPATCHING)
    assert second.marker == f"{task_id}:2:{token}"
    assert rows(url, "SELECT type, (data->>'attempt')::int FROM ferry_events WHERE task = %s"
                " AND data->>'token' = %s ORDER BY seq", (task_id, token)) == [
        ("CLAIMED", 2), ("DISPATCHING", 2)]  # fmt: skip
    assert second.evidence["previous_attempt"]["attempt"] == 1


def test_an_end_and_the_next_claims_are_one_transaction(url: str, host: Host) -> None:
    """A worker's write: a task's end and the claims of its free slots
    (``commit_against`` with ``claims``), in one transaction, the claims in the order
    asked; the place the end frees in its group (limited to 1) goes to a claim of that
    same write (the function counts the group's tasks in flight after the end)."""
    limited = submit(host.store, 2, group="g", priority=9)
    plain = submit(host.store, 1)
    host.store.commit(ev.GroupSet("g", 1))
    first = host.claim()
    assert first is not None and first.id == limited[0]
    (last_seq,) = rows(url, "SELECT max(seq) FROM ferry_events")[0]
    token = str(first.claim_token)

    def end(current: Any) -> list[ev.Event]:
        assert current[first.id].claim_token == token  # (the row as locked for the write)
        return [ev.Spawned(first.id, 1, token, 4242, 4242, 1),
                ev.Settled(first.id, 1, token, State.SUCCEEDED, None, 0)]  # fmt: skip

    tokens = [new_claim_token(os.urandom(10)) for _ in range(3)]
    written = host.store.commit_against(
        [first.id], end, epoch=host.epoch, claims=[(RUNNER, t) for t in tokens]
    )
    assert written.tasks[first.id].state is State.SUCCEEDED
    assert [(t.id, t.claim_token) for t in written.claimed] == [
        (limited[1], tokens[0]), (plain[0], tokens[1])]  # fmt: skip
    transactions = rows(url, "SELECT count(DISTINCT xmin::text) FROM ferry_events"
                        " WHERE seq > %s", (last_seq,))  # fmt: skip
    assert transactions == [(1,)]


def test_an_end_is_decided_on_the_row_as_it_is_when_written(url: str, host: Host) -> None:
    """A worker's end is decided on the task's row as locked for the write
    (``commit_against``), not on a read before it: a cancel asked for after the worker
    last read the task makes the end CANCELLED (``outbox.end_writes``). (Decided on the
    earlier read, as ``work`` did, it was SUCCEEDED.)"""
    from ferry.app.outbox import end_writes

    submit(host.store, 1)
    task = host.claim()
    assert task is not None
    token = str(task.claim_token)
    records = [ev.Spawned(task.id, 1, token, 4242, 4242, 1),
               ev.Settled(task.id, 1, token, State.SUCCEEDED, None, 0)]  # fmt: skip
    earlier = host.store.get(task.id)  # (the worker's last read)
    other = PgStore.open(url, "b")
    try:
        other.commit(ev.CancelRequested(task.id, 1, token))
    finally:
        other.close()
    assert end_writes(earlier, records)[1][-1].state is State.SUCCEEDED  # (the old way)
    written = host.store.commit_against(
        [task.id], lambda current: end_writes(current[task.id], records)[1]
    )
    assert written.tasks[task.id] is not None
    assert written.tasks[task.id].state is State.CANCELLED  # type: ignore[union-attr]


# ---- a worker's write in one call (ferry_write) -----------------------------------------


def test_a_row_that_moved_after_the_decision_is_decided_again_on_the_row_locked(
    url: str, host: Host
) -> None:
    """The point: between the decision, made on the row as the claim left it, and the
    one call that writes it, another host asks for a cancel. The call writes nothing
    (the row's version moved); the end is decided again on the row locked: CANCELLED,
    after the cancel's record. (Without the version check, SUCCEEDED was written over
    the cancel.)"""
    from ferry.app.outbox import end_writes

    submit(host.store, 1)
    task = host.claim()
    assert task is not None
    other = PgStore.open(url, "b")
    # (The decision is made on the rows locked by the commit path: there the cancel
    # would wait for this write, and the test fail on its lock timeout, not hang.)
    other.db.execute("SET lock_timeout = '5s'")
    seen: list[Task | None] = []

    def decide(current: Any) -> list[ev.Event]:
        seen.append(current[task.id])
        if len(seen) == 1:  # after the decision, before the write
            other.commit(ev.CancelRequested(task.id, 1, str(task.claim_token)))
        return end_writes(current[task.id], _ended(task))[1]

    try:
        written = host.store.commit_against([task.id], decide, epoch=host.epoch)
    finally:
        other.close()
    assert [t.cancel_requested for t in seen if t is not None] == [False, True]
    after = written.tasks[task.id]
    assert after is not None and after.state is State.CANCELLED
    assert after == host.store.get(task.id)
    assert [kind for (kind,) in rows(url, "SELECT type FROM ferry_events WHERE task = %s"
                                     " ORDER BY seq", (task.id,))] == [
        "SUBMITTED", "CLAIMED", "DISPATCHING", "CANCEL_REQUESTED", "SPAWNED", "SETTLED"]  # fmt: skip


def test_a_write_decided_again_passes_each_failpoint_once(
    url: str, host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write whose row moved (tried in one call, then by the commit path) is one
    write to the failpoints: each ``before:`` once (a ``before:SETTLED=2`` armed for a
    second end must not fire at the first one's), then each ``after:`` once."""
    import ferry.storage.postgres.store as store_module

    submit(host.store, 1)
    task = host.claim()
    assert task is not None
    other = PgStore.open(url, "b")
    try:
        other.commit(ev.CancelRequested(task.id, 1, str(task.claim_token)))
    finally:
        other.close()
    passed: list[str] = []
    monkeypatch.setattr(store_module, "failpoint", passed.append)

    def decide(current: Mapping[str, Task | None]) -> list[ev.Event]:
        spawned, settled = _ended(task)
        moved = current[task.id]
        if moved is not None and moved.cancel_requested:  # (the end a cancel decides)
            assert isinstance(settled, ev.Settled)
            settled = as_cancelled(settled)
        return [spawned, settled]

    written = host.store.commit_against(
        [task.id], decide, epoch=host.epoch, claims=[(RUNNER, new_claim_token(os.urandom(10)))]
    )
    assert written.tasks[task.id].state is State.CANCELLED  # type: ignore[union-attr]
    assert passed == ["before:SPAWNED", "before:SETTLED", "before:CLAIMED",
                      "after:SPAWNED", "after:SETTLED"]  # fmt: skip


def test_a_write_in_one_call_under_a_stale_epoch_writes_nothing(url: str, host: Host) -> None:
    submit(host.store, 2)
    task = host.claim()
    assert task is not None
    before = rows(url, "SELECT id, body, updated_at FROM ferry_tasks ORDER BY id")
    events = rows(url, "SELECT count(*) FROM ferry_events")
    stale = host.epoch
    host.lease = host.leases.acquire(self_identity())  # (a new holder: a newer epoch)
    with pytest.raises(LeaseHeldError) as fenced:
        host.store.commit_against([task.id], lambda current: _ended(task), epoch=stale,
                                  claims=[(RUNNER, new_claim_token(os.urandom(10)))])  # fmt: skip
    assert fenced.value.details["current_epoch"] == host.epoch
    assert rows(url, "SELECT id, body, updated_at FROM ferry_tasks ORDER BY id") == before
    assert rows(url, "SELECT count(*) FROM ferry_events") == events


def test_a_write_in_one_call_writes_what_the_commit_path_writes(url: str, host: Host) -> None:
    """Two tasks alike, each claimed, then ended with the claim of one more task: one in
    one call (its row known from the claim), one by the commit path (the row forgotten
    first). The same events, the same rows, the same claims; each a transaction."""
    one_call, by_commit = submit(host.store, 2)
    submit(host.store, 2)
    tokens: dict[str, str] = {}
    for task_id in (one_call, by_commit):
        claimed = host.claim()
        assert claimed is not None and claimed.id == task_id
        tokens[task_id] = str(claimed.claim_token)
    host.store.known.forget([by_commit])
    next_claims = {}
    for task_id in (one_call, by_commit):
        task = host.store.get(task_id)
        assert task is not None
        (last_seq,) = rows(url, "SELECT max(seq) FROM ferry_events")[0]
        token = new_claim_token(os.urandom(10))
        written = host.store.commit_against(
            [task_id], lambda current, task=task: _ended(task, State.FAILED),
            epoch=host.epoch, claims=[(RUNNER, token)],
        )  # fmt: skip
        assert written.tasks[task_id] == host.store.get(task_id)
        (claimed,) = written.claimed
        assert claimed == host.store.get(claimed.id) and claimed.claim_token == token
        next_claims[task_id] = (claimed.id, token)
        assert rows(url, "SELECT count(DISTINCT xmin::text) FROM ferry_events"
                    " WHERE seq > %s", (last_seq,)) == [(1,)]  # fmt: skip
    found = {
        task_id: rows(url, "SELECT body, state, reason, host, claimed_by, heartbeat_at,"
                      " updated_seq = (body->>'updated_seq')::bigint,"
                      " updated_seq = (SELECT max(seq) FROM ferry_events WHERE task = id)"
                      " FROM ferry_tasks WHERE id = %s", (task_id,))[0]
        for task_id in (one_call, by_commit)
    }  # fmt: skip
    bodies = [_comparable(found[t][0], t, tokens[t]) for t in (one_call, by_commit)]
    for body in bodies:  # (the times of each write's own records)
        assert body.pop("started_at") == body.pop("ended_at") == body.pop("heartbeat_at")
    assert bodies[0] == bodies[1]
    assert bodies[0]["state"] == "FAILED" and bodies[0]["exit_code"] == 3
    assert found[one_call][1:] == found[by_commit][1:]
    assert found[one_call][-2:] == (True, True)
    events = {
        task_id: [(kind, epoch, where, _comparable(data, task_id, tokens[task_id]))
                  for kind, epoch, where, data in rows(
                      url, "SELECT type, epoch, host, data FROM ferry_events WHERE task = %s"
                      " AND type IN ('SPAWNED', 'SETTLED') ORDER BY seq", (task_id,))]
        for task_id in (one_call, by_commit)
    }  # fmt: skip
    assert events[one_call] == events[by_commit]
    assert [kind for kind, *_ in events[one_call]] == ["SPAWNED", "SETTLED"]
    claimed_rows = [
        _comparable(rows(url, "SELECT body FROM ferry_tasks WHERE id = %s", (i,))[0][0], i, t)
        for i, t in next_claims.values()
    ]
    assert claimed_rows[0] == claimed_rows[1]


# ---- many claimers; an answer lost ------------------------------------------------------


def claim_until_empty(url: str, name: str, claimed: list[str]) -> None:
    one = Host(url, name)
    try:
        claimed.extend(one.claim_ids())
    finally:
        one.store.close()


def exclusive(url: str, claimers: int, tasks: int) -> None:
    store = PgStore.open(url, "submitter")
    try:
        ids = [i for _ in range(0, tasks, 500) for i in submit(store, min(500, tasks))][:tasks]
    finally:
        store.close()
    results: list[list[str]] = [[] for _ in range(claimers)]
    threads = [
        threading.Thread(target=claim_until_empty, args=(url, f"h{i}", results[i]))
        for i in range(claimers)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    claimed = [task_id for found in results for task_id in found]
    assert sorted(claimed) == sorted(ids)  # each once, none left
    dispatched = rows(url, "SELECT task, (data->>'attempt')::int FROM ferry_events"
                      " WHERE type = 'DISPATCHING'")  # fmt: skip
    assert len(dispatched) == len(set(dispatched)) == tasks


def test_eight_claimers_claim_each_task_exactly_once(url: str) -> None:
    exclusive(url, claimers=8, tasks=400)


@pytest.mark.soak
@pytest.mark.timeout(900)
def test_sixteen_claimers_over_twenty_thousand_tasks_by_the_function(url: str) -> None:
    exclusive(url, claimers=16, tasks=20_000)


def test_a_claim_is_found_by_its_token(url: str, host: Host) -> None:
    submit(host.store, 1)
    token = new_claim_token(os.urandom(10))
    assert host.store.claimed_with(token) is None
    claimed = host.claim(token)
    assert claimed is not None
    assert host.store.claimed_with(token, writer_pid=os.getpid()) == claimed


def test_an_unknown_claim_is_unknown_while_its_writer_s_connection_is_open(
    url: str, host: Host
) -> None:
    """A claim whose answer was lost: not found is no answer while another connection of
    the writer (the claim's statement may still run there) is open."""
    writer = 424242
    name = application_name(writer, "a")
    with psycopg.connect(url, application_name=name) as other:
        other.execute("SELECT 1")
        with pytest.raises(DatabaseUnavailableError):
            host.store.claimed_with("tok", writer_pid=writer)
    wait_until(lambda: not rows(url, "SELECT 1 FROM pg_stat_activity WHERE application_name"
                                " = %s", (name,)), what="the connection to end")  # fmt: skip
    assert host.store.claimed_with("tok", writer_pid=writer) is None


def test_a_version_3_database_is_refused_until_db_init_upgrades_it(
    pg_url: str, tmp_path: Any
) -> None:
    """Version 4 adds the claim's function: a command on a version 3 database says to run
    ``db init`` (db.version, 125) instead of failing at its first claim; ``db init``
    upgrades it and the queued task runs."""
    from clikit import Ferry

    schema_at(pg_url, 3)
    ferry = Ferry(tmp_path / "h")
    ferry.env.update(FERRY_DATABASE_URL=pg_url, FERRY_HOST_ID="h")
    try:
        ferry.refused(125, "db.version", "ls")
        assert ferry.json("db", "init")["previous_version"] == 3
        ferry.ok("submit", "--", "true")
        ferry.ok("work", "--drain")
        assert [t["state"] for t in ferry.tasks()] == ["SUCCEEDED"]
    finally:
        ferry.close()
