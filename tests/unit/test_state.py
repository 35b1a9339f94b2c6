"""The fold: validate before writing, apply after; anomalies; keys; queue; snapshots."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from ferry.core import events as ev
from ferry.core import state as state_module
from ferry.core.errors import (
    FerryError,
    IllegalTransitionError,
    JournalIntegrityError,
    KeyInFlightError,
    KeyUnsafeError,
    NotFoundError,
    RefusedError,
)
from ferry.core.ids import new_task_id
from ferry.core.model import Reason, State
from ferry.core.spec import TaskSpec
from ferry.core.state import Table

RUNNER = {"pid": 7, "start_time": 100.0, "boot_id": "boot", "host": "h"}


class Harness:
    """A journal stand-in: validate, then apply with the next seq (what the store does)."""

    def __init__(self, table: Table | None = None) -> None:
        self.table = table or Table()
        self.seq = self.table.last_seq
        self.ts = 1000.0
        self.counter = 0 if table is None else 1000  # ids unique across harnesses

    def write(self, *events: ev.Event) -> None:
        batch = [event.encode() for event in events]
        self.table.validate_batch(batch)
        for record_type, data in batch:
            self.force(record_type, data)

    def force(self, record_type: str, data: Mapping[str, Any]) -> None:
        """Append without validation (a journal written by a buggy version)."""
        self.seq += 1
        self.ts += 1.0
        self.table.apply(record_type, data, self.seq, self.ts)

    def new_id(self) -> str:
        self.counter += 1
        return new_task_id(1_715_000_000_000_000_000 + self.counter * 1_000_000, b"\0\0\0\0")

    def submit(self, **spec: Any) -> str:
        task_id = self.new_id()
        self.write(ev.Submitted(task_id, TaskSpec(argv=("true",), cwd="/", **spec), 5.0))
        return task_id

    def start(self, task_id: str, token: str = "tok") -> None:
        attempt = self.get(task_id).attempt
        self.write(ev.Claimed(task_id, attempt, token, RUNNER, "work"))
        self.write(ev.Dispatching(task_id, attempt, token, f"{task_id}:{attempt}:{token}"))
        self.write(ev.Spawned(task_id, attempt, token, 4242, 4242, 99.5))

    def get(self, task_id: str) -> Any:
        task = self.table.get(task_id)
        assert task is not None
        return task


@pytest.fixture
def h() -> Harness:
    return Harness()


def refused(h: Harness, event: ev.Event, error: type[FerryError], code: str) -> None:
    before = h.table.to_snapshot()
    with pytest.raises(error) as caught:
        h.write(event)
    assert caught.value.code == code, caught.value.message
    assert h.table.to_snapshot() == before  # validation changes nothing


# ---- a task's life ---------------------------------------------------------------


def test_run_journals_submitted_and_claimed_together_then_runs(h: Harness) -> None:
    task_id = h.new_id()
    spec = TaskSpec(argv=("make",), cwd="/src")
    h.write(ev.Submitted(task_id, spec, 5.0), ev.Claimed(task_id, 1, "tok", RUNNER, "run"))
    task = h.get(task_id)
    assert (task.state, task.claim_token, task.claimed_by, task.runner) == (
        State.CLAIMED, "tok", "run", RUNNER,
    )  # fmt: skip
    h.write(ev.Dispatching(task_id, 1, "tok", "m", {"patch_mode": "NONE"}))
    assert h.get(task_id).marker == "m"
    h.write(ev.Spawned(task_id, 1, "tok", 50, 50, 3.5))
    task = h.get(task_id)
    assert (task.state, task.pid, task.pgid, task.start_time) == (State.RUNNING, 50, 50, 3.5)
    assert task.started_at == task.heartbeat_at == h.ts
    h.write(ev.Settled(task_id, 1, "tok", State.SUCCEEDED, None, 0))
    task = h.get(task_id)
    assert (task.state, task.reason, task.exit_code, task.ended_at) == (
        State.SUCCEEDED, None, 0, h.ts,
    )  # fmt: skip
    assert task.claim_token is None and task.evidence == {"patch_mode": "NONE"}
    assert task.created_at == 5.0 and task.terminal and h.table.live() == []


def test_queue_is_fifo_by_submission_and_release_keeps_the_place(h: Harness) -> None:
    a, b, c = h.submit(idempotent=True), h.submit(), h.submit()
    assert h.table.oldest_queued().id == a  # type: ignore[union-attr]
    h.start(a)
    assert h.table.oldest_queued().id == b  # type: ignore[union-attr]
    assert [t.id for t in h.table.in_flight()] == [a]
    h.write(ev.Released(a, 1, "tok", Reason.RELEASED_TO_QUEUE, True))
    assert [t.id for t in h.table.queued()] == [a, b, c]
    assert h.table.oldest_queued().id == a  # type: ignore[union-attr]
    task = h.get(a)
    assert (task.state, task.reason, task.releases, task.pid, task.claim_token) == (
        State.QUEUED, Reason.RELEASED_TO_QUEUE, 1, None, None,
    )  # fmt: skip
    h.write(ev.Settled(b, 1, None, State.CANCELLED, Reason.CANCELLED_BY_USER))
    assert [t.id for t in h.table.queued()] == [a, c]
    assert [t.id for t in h.table.live()] == [a, c]


def test_uncounted_release_does_not_count(h: Harness) -> None:
    a = h.submit()
    h.write(ev.Claimed(a, 1, "tok", RUNNER, "claim"))
    h.write(ev.Released(a, 1, "tok", Reason.RELEASED_TO_QUEUE, False))
    assert h.get(a).releases == 0


def test_empty_queue(h: Harness) -> None:
    assert h.table.oldest_queued() is None
    a = h.submit()
    h.start(a)
    assert h.table.oldest_queued() is None and h.table.queued() == []


def test_retry_is_a_new_attempt_at_the_back_of_the_queue(h: Harness) -> None:
    a, b = h.submit(idempotent=True), h.submit()
    h.start(a)
    h.write(ev.Released(a, 1, "tok", Reason.RELEASED_TO_QUEUE, True))
    h.start(a, token="tok2")
    h.write(ev.Settled(a, 1, "tok2", State.FAILED, Reason.EXIT_NONZERO, 3, None, {"k": 1}))
    h.write(ev.Retried(a, 2))
    task = h.get(a)
    assert (task.state, task.attempt, task.releases, task.reason, task.exit_code) == (
        State.QUEUED, 2, 0, None, None,
    )  # fmt: skip
    assert task.ended_at is None and task.pid is None
    assert task.evidence["previous_attempt"]["exit_code"] == 3
    assert task.evidence["previous_attempt"]["evidence"] == {"k": 1}
    assert [t.id for t in h.table.queued()] == [b, a]
    h.start(a, token="tok3")
    assert h.get(a).attempt == 2


def test_stale_and_resumed(h: Harness) -> None:
    a = h.submit()
    h.start(a)
    h.write(ev.Stale(a, 1, "tok", {"recovery": {"decision": "MARK_STALE"}}))
    task = h.get(a)
    assert (task.state, task.reason) == (State.STALE, Reason.HEARTBEAT_STALE)
    h.write(ev.Resumed(a, 1, "tok"))
    task = h.get(a)
    assert (task.state, task.reason, task.heartbeat_at) == (State.RUNNING, None, h.ts)
    h.write(ev.Stale(a, 1, "tok"))
    h.write(ev.Settled(a, 1, "tok", State.SUCCEEDED, None, 0))  # a STALE runner may settle


def test_cancel_request_then_the_runner_settles_cancelled(h: Harness) -> None:
    a = h.submit()
    h.start(a)
    h.write(ev.CancelRequested(a, 1, "tok"))
    assert h.get(a).cancel_requested
    h.write(ev.CancelRequested(a, 1, "tok"))  # asking twice is harmless
    h.write(ev.Settled(a, 1, "tok", State.CANCELLED, Reason.CANCELLED_BY_USER, None, 15))
    assert h.get(a).state is State.CANCELLED


def test_orphan_signals_accumulate_in_evidence(h: Harness) -> None:
    a = h.submit()
    h.start(a)
    h.write(ev.Settled(a, 1, "tok", State.FAILED, Reason.QUARANTINED_ORPHAN_ALIVE))
    h.write(ev.OrphanSignalled(a, 1, 4242, 4242, 99.5, 15))
    h.write(ev.OrphanSignalled(a, 1, 4242, 4242, 99.5, 9))
    assert [s["signal"] for s in h.get(a).evidence["signals"]] == [15, 9]


def test_lease_events_are_tracked(h: Harness) -> None:
    h.write(ev.LeaseAcquired(4, RUNNER))
    assert h.table.lease is not None and h.table.lease["epoch"] == 4 and h.table.lease["held"]
    h.write(ev.LeaseReleased(4, RUNNER))
    assert h.table.lease["held"] is False


# ---- refusals --------------------------------------------------------------------


def test_late_runner_cannot_settle_after_recovery_decided(h: Harness) -> None:
    a = h.submit()
    h.start(a)
    h.write(ev.Settled(a, 1, "tok", State.FAILED, Reason.MARKED_FAILED_MUTATION_UNSAFE))
    refused(h, ev.Settled(a, 1, "tok", State.SUCCEEDED, None, 0), RefusedError, "task.stale_claim")


def test_old_claim_cannot_act_after_release_and_reclaim(h: Harness) -> None:
    a = h.submit(idempotent=True)
    h.write(ev.Claimed(a, 1, "old", RUNNER, "work"))
    h.write(ev.Released(a, 1, "old", Reason.RELEASED_TO_QUEUE, False))
    h.write(ev.Claimed(a, 1, "new", RUNNER, "work"))
    refused(h, ev.Dispatching(a, 1, "old", "m"), RefusedError, "task.stale_claim")
    h.write(ev.Dispatching(a, 1, "new", "m"))
    refused(h, ev.Spawned(a, 1, "old", 5, 5, 1.0), RefusedError, "task.stale_claim")


def test_claim_of_an_old_attempt_is_stale(h: Harness) -> None:
    a = h.submit()
    h.write(ev.Settled(a, 1, None, State.FAILED, Reason.POINTER_STALE))
    h.write(ev.Retried(a, 2))
    refused(h, ev.Claimed(a, 1, "t", RUNNER, "work"), RefusedError, "task.stale_attempt")
    refused(h, ev.Retried(a, 2), IllegalTransitionError, "task.illegal_transition")


def test_two_claims_of_one_task_only_one_wins(h: Harness) -> None:
    a = h.submit()
    h.write(ev.Claimed(a, 1, "one", RUNNER, "work"))
    refused(h, ev.Claimed(a, 1, "two", RUNNER, "work"), IllegalTransitionError,
            "task.illegal_transition")  # fmt: skip


@pytest.mark.parametrize(
    ("setup", "event", "code"),
    [
        ("succeeded", ev.Retried("A", 2), "task.illegal_transition"),
        ("succeeded", ev.Settled("A", 1, None, State.FAILED, Reason.TIMEOUT), "task.illegal_transition"),
        ("failed", ev.Released("A", 1, None, Reason.RELEASED_TO_QUEUE, False), "task.illegal_transition"),
        ("failed", ev.Retried("A", 3), "task.stale_attempt"),
        ("running", ev.Spawned("A", 1, "tok", 1, 1, 1.0), "task.illegal_transition"),
        ("stale", ev.Spawned("A", 1, "tok", 1, 1, 1.0), "task.illegal_transition"),
        ("running", ev.Resumed("A", 1, "tok"), "task.illegal_transition"),
        ("queued", ev.Dispatching("A", 1, "tok", "m"), "task.stale_claim"),
        ("queued", ev.Stale("A", 1), "task.illegal_transition"),
        ("queued", ev.CancelRequested("A", 1), "task.not_in_flight"),
        ("running", ev.Settled("A", 2, "tok", State.SUCCEEDED, None, 0), "task.stale_claim"),
        ("running", ev.Settled("A", 2, None, State.FAILED, Reason.TIMEOUT), "task.stale_attempt"),
        ("running", ev.Stale("A", 2), "task.stale_attempt"),
        ("running", ev.Released("A", 1, "bad", Reason.RELEASED_TO_QUEUE, True), "task.stale_claim"),
        ("queued", ev.Submitted("A", TaskSpec(argv=("x",), cwd="/"), 1.0), "task.duplicate_id"),
    ],
)  # fmt: skip
def test_refusals(h: Harness, setup: str, event: Any, code: str) -> None:
    a = h.submit()
    if setup != "queued":
        h.start(a)
    if setup == "succeeded":
        h.write(ev.Settled(a, 1, "tok", State.SUCCEEDED, None, 0))
    elif setup == "failed":
        h.write(ev.Settled(a, 1, "tok", State.FAILED, Reason.EXIT_NONZERO, 1))
    elif setup == "stale":
        h.write(ev.Stale(a, 1, "tok"))
    type_, data = event.encode()
    data = {**data, "task": a}
    before = h.table.to_snapshot()
    with pytest.raises(FerryError) as caught:
        h.table.validate(type_, data)
    assert caught.value.code == code, caught.value.message
    assert h.table.to_snapshot() == before


def test_counted_release_beyond_the_limit_is_refused(h: Harness) -> None:
    a = h.submit(idempotent=True, max_releases=1)
    h.start(a)
    h.write(ev.Released(a, 1, "tok", Reason.RELEASED_TO_QUEUE, True))
    h.start(a, "t2")
    refused(h, ev.Released(a, 1, "t2", Reason.RELEASED_TO_QUEUE, True), RefusedError,
            "task.release_limit")  # fmt: skip
    h.write(ev.Released(a, 1, "t2", Reason.RELEASED_TO_QUEUE, False))  # uncounted is fine


def test_unknown_task_and_unknown_type(h: Harness) -> None:
    refused(h, ev.CancelRequested("nope", 1), NotFoundError, "task.not_found")
    with pytest.raises(ev.MalformedEventError):
        h.table.validate("FROM_THE_FUTURE", {})
    with pytest.raises(ev.MalformedEventError):
        h.table.validate("SETTLED", {"task": "x"})


# ---- keys ------------------------------------------------------------------------


def test_key_in_flight_refuses_a_second_task(h: Harness) -> None:
    a = h.submit(key="build-1")
    with pytest.raises(KeyInFlightError) as caught:
        h.submit(key="build-1")
    assert caught.value.exit_code == 75 and caught.value.details["task"] == a
    h.start(a)
    with pytest.raises(KeyInFlightError):
        h.submit(key="build-1")
    h.submit(key="build-2")


def test_key_that_succeeded_is_not_run_again_but_failed_may_be(h: Harness) -> None:
    a = h.submit(key="k")
    h.start(a)
    h.write(ev.Settled(a, 1, "tok", State.FAILED, Reason.EXIT_NONZERO, 2))
    b = h.submit(key="k")
    h.start(b)
    h.write(ev.Settled(b, 1, "tok", State.SUCCEEDED, None, 0))
    with pytest.raises(RefusedError) as caught:
        h.submit(key="k")
    assert caught.value.code == "task.key_succeeded" and caught.value.details["task"] == b
    refused(h, ev.Retried(a, 2), RefusedError, "task.key_succeeded")
    assert h.table.by_key("k") == [a, b]
    assert h.table.succeeded_with_key("k") == b


def test_retry_refused_while_same_key_in_flight(h: Harness) -> None:
    a = h.submit(key="k")
    h.write(ev.Settled(a, 1, None, State.CANCELLED, Reason.CANCELLED_BY_USER))
    b = h.submit(key="k")
    refused(h, ev.Retried(a, 2), KeyInFlightError, "task.key_in_flight")
    h.write(ev.Settled(b, 1, None, State.CANCELLED, Reason.CANCELLED_BY_USER))
    h.write(ev.Retried(a, 2))


def test_batch_with_a_duplicate_key_is_refused_whole(h: Harness) -> None:
    spec = TaskSpec(argv=("x",), cwd="/", key="same")
    first, second = h.new_id(), h.new_id()
    with pytest.raises(KeyInFlightError):
        h.write(ev.Submitted(first, spec, 1.0), ev.Submitted(second, spec, 1.0))
    assert h.table.get(first) is None and h.table.get(second) is None


def test_a_large_keyed_batch_is_checked_in_linear_time(h: Harness) -> None:
    """20,000 keyed SUBMITTED in one batch (a ``submit --from``): the key check of each
    looks up the batch's tasks of its key, not all of them (quadratic, it took 11 s
    here, 38 of 61 s of such a submit on PostgreSQL, inside its transaction); a key
    twice in the batch is still refused, a forgotten task's key freed."""
    import time

    specs = [TaskSpec(argv=("x",), cwd="/", key=f"k{n}") for n in range(20_000)]
    batch = [ev.Submitted(h.new_id(), spec, 1.0).encode() for spec in specs]
    started = time.perf_counter()
    h.table.validate_batch(batch)
    assert time.perf_counter() - started < 4.0
    with pytest.raises(KeyInFlightError):
        h.table.validate_batch([*batch, ev.Submitted(h.new_id(), specs[-1], 1.0).encode()])


def test_batch_validates_against_its_own_earlier_events(h: Harness) -> None:
    a = h.new_id()
    spec = TaskSpec(argv=("x",), cwd="/")
    with pytest.raises(IllegalTransitionError):
        h.table.validate_batch([
            ev.Submitted(a, spec, 1.0).encode(),
            ev.Claimed(a, 1, "t", RUNNER, "run").encode(),
            ev.Claimed(a, 1, "u", RUNNER, "run").encode(),
        ])  # fmt: skip
    assert h.table.get(a) is None


# ---- the write rule: decided under the lock, with the claim it is about ------------


def test_a_token_less_settle_of_a_task_in_flight_is_refused(h: Harness) -> None:
    """Bug 2: a ``cancel`` read the task QUEUED, a runner claimed and started it, then the
    cancel's token-less SETTLED came: refused, so the journal never says CANCELLED of a
    task that runs (the cancel reads again and asks the runner instead)."""
    a = h.submit()
    cancel = ev.Settled(a, 1, None, State.CANCELLED, Reason.CANCELLED_BY_USER)
    h.table.validate(*cancel.encode())  # (legal while it is QUEUED)
    h.start(a)
    refused(h, cancel, RefusedError, "task.stale_claim")
    for event in (
        ev.Released(a, 1, None, Reason.RELEASED_TO_QUEUE, False),
        ev.Stale(a, 1),
        ev.CancelRequested(a, 1),
        ev.OrphanSignalled(a, 1, 4242, 4242, 99.5, 9),
    ):
        refused(h, event, RefusedError, "task.stale_claim")
    h.write(ev.CancelRequested(a, 1, "tok"))
    h.write(ev.Settled(a, 1, "tok", State.CANCELLED, Reason.CANCELLED_BY_USER))


def test_a_decision_about_an_older_claim_of_the_task_is_refused(h: Harness) -> None:
    a = h.submit(idempotent=True)
    h.start(a, token="old")
    h.write(ev.Released(a, 1, "old", Reason.RELEASED_TO_QUEUE, True))
    h.start(a, token="new")
    refused(h, ev.Settled(a, 1, "old", State.FAILED, Reason.MARKED_FAILED_MUTATION_UNSAFE),
            RefusedError, "task.stale_claim")  # fmt: skip


def test_a_task_whose_cancel_was_requested_is_not_released(h: Harness) -> None:
    """A ``recover`` that observed the task just before CANCEL_REQUESTED decided to
    release it: refused; it decides again, and cancels."""
    a = h.submit(idempotent=True)
    h.start(a)
    release = ev.Released(a, 1, "tok", Reason.RELEASED_TO_QUEUE, True)
    h.table.validate(*release.encode())
    h.write(ev.CancelRequested(a, 1, "tok"))
    refused(h, release, RefusedError, "task.cancel_requested")
    h.write(ev.Settled(a, 1, "tok", State.CANCELLED, Reason.CANCELLED_BY_USER))


def test_replay_folds_what_the_write_rule_now_refuses() -> None:
    """A journal written before the rule (recovery's token-less decisions) reads back
    as written: the rule is checked at write time only."""
    h = Harness()
    a = h.submit()
    h.start(a)
    h.force(*ev.Settled(a, 1, None, State.FAILED, Reason.MARKED_FAILED_MUTATION_UNSAFE).encode())
    assert h.get(a).reason is Reason.MARKED_FAILED_MUTATION_UNSAFE and not h.table.anomalies


# ---- keys after an unsafe end, and resolve ---------------------------------------


@pytest.mark.parametrize(
    "reason", [Reason.MARKED_FAILED_MUTATION_UNSAFE, Reason.QUARANTINED_ORPHAN_ALIVE]
)
def test_a_key_whose_latest_task_ended_unsafe_is_refused_until_retried(
    h: Harness, reason: Reason
) -> None:
    a = h.submit(key="deploy")
    h.start(a)
    h.write(ev.Settled(a, 1, "tok", State.FAILED, reason))
    with pytest.raises(KeyUnsafeError) as caught:
        h.submit(key="deploy")
    error = caught.value
    assert (error.code, error.exit_code, error.details["task"]) == ("task.key_unsafe", 3, a)
    assert f"ferry retry {a}" in error.message and f"ferry resolve {a}" in error.message
    assert h.table.unsafe_with_key("deploy") == a
    h.submit(key="other")  # other keys are free
    h.write(ev.Retried(a, 2))  # the operator's way out: run it again
    assert h.table.unsafe_with_key("deploy") is None
    with pytest.raises(KeyInFlightError):
        h.submit(key="deploy")


def test_resolve_as_succeeded_skips_the_key_and_as_failed_frees_it(h: Harness) -> None:
    a, b = h.submit(key="one"), h.submit(key="two")
    for task_id in (a, b):
        h.start(task_id)
        h.write(ev.Settled(task_id, 1, "tok", State.FAILED, Reason.MARKED_FAILED_MUTATION_UNSAFE))
    h.write(ev.Resolved(a, 1, "succeeded"))
    h.write(ev.Resolved(b, 1, "failed"))
    task = h.get(a)
    assert task.state is State.FAILED and task.evidence["resolution"]["verdict"] == "succeeded"
    assert task.evidence["resolution"]["at"].endswith("Z")
    with pytest.raises(RefusedError) as caught:
        h.submit(key="one")
    assert caught.value.code == "task.key_succeeded" and caught.value.details["task"] == a
    assert h.table.succeeded_with_key("one") == a
    h.submit(key="two")  # resolved as failed: the key runs again
    refused(h, ev.Resolved(a, 1, "failed"), RefusedError, "task.already_resolved")
    # retried after all: the verdict goes with the old attempt, and the key is its again
    h.write(ev.Retried(a, 2))
    assert h.table.succeeded_with_key("one") is None
    assert h.get(a).evidence["previous_attempt"]["evidence"]["resolution"]["verdict"] == "succeeded"


@pytest.mark.parametrize("state", ["queued", "running", "succeeded"])
def test_only_a_failed_or_cancelled_task_is_resolved(h: Harness, state: str) -> None:
    a = h.submit()
    if state != "queued":
        h.start(a)
    if state == "succeeded":
        h.write(ev.Settled(a, 1, "tok", State.SUCCEEDED, None, 0))
    with pytest.raises(FerryError):
        h.write(ev.Resolved(a, 1, "succeeded"))


def test_the_unsafe_key_index_survives_snapshots_and_is_rebuilt_from_an_old_one() -> None:
    h = Harness()
    a = h.submit(key="k")
    h.start(a)
    h.write(ev.Settled(a, 1, "tok", State.FAILED, Reason.MARKED_FAILED_MUTATION_UNSAFE))
    snapshot = h.table.to_snapshot()
    assert snapshot["unsafe_keys"] == {"k": a}
    settled = snapshot.pop("settled")
    lazy = Table.from_snapshot(snapshot, load_settled=lambda _seq: settled)
    assert lazy.unsafe_with_key("k") == a
    old = {k: v for k, v in snapshot.items() if k != "unsafe_keys"}  # before the index
    calls: list[int] = []

    def load(_seq: int) -> Iterable[Mapping[str, Any]]:
        calls.append(1)
        return settled

    rebuilt = Harness(Table.from_snapshot(old, load_settled=load))
    with pytest.raises(KeyUnsafeError):
        rebuilt.submit(key="k")
    assert calls == [1]


# ---- replay of a bad journal -----------------------------------------------------


def test_illegal_records_in_the_journal_are_skipped_as_anomalies(h: Harness) -> None:
    a = h.submit()
    h.start(a)
    h.write(ev.Settled(a, 1, "tok", State.FAILED, Reason.MARKED_FAILED_MUTATION_UNSAFE))
    before = h.get(a)
    late = ev.Settled(a, 1, "tok", State.SUCCEEDED, None, 0).encode()
    h.force(*late)  # an older buggy version wrote this
    h.force("SETTLED", {"task": a, "attempt": "one"})  # malformed
    h.force("SPAWNED", {"task": "ghost", "attempt": 1, "token": "t", "pid": 1, "pgid": 1,
                        "start_time": 1.0})  # fmt: skip
    h.force("FROM_THE_FUTURE", {"task": a})  # ignored, not an anomaly
    assert h.get(a) == before
    assert [(x.seq, x.code) for x in h.table.anomalies] == [
        (h.seq - 3, "task.stale_claim"), (h.seq - 2, "event.malformed"),
        (h.seq - 1, "task.not_found"),
    ]  # fmt: skip
    assert h.table.anomalies[0].task == a and h.table.last_seq == h.seq


def test_apply_of_non_object_data_is_an_anomaly_not_a_crash(h: Harness) -> None:
    h.table.apply("SUBMITTED", [1, 2], 1, 1.0)  # type: ignore[arg-type]
    assert h.table.anomalies[0].code == "event.malformed"


def test_records_at_or_below_last_seq_are_already_folded(h: Harness) -> None:
    a = h.submit()
    h.table.apply(*ev.Settled(a, 1, None, State.CANCELLED, Reason.CANCELLED_BY_USER).encode(),
                  h.seq, 1.0)  # fmt: skip
    assert h.get(a).state is State.QUEUED and not h.table.anomalies


@dataclass(frozen=True)
class Rec:
    seq: int
    ts: float
    type: str
    data: Mapping[str, Any]


def test_apply_record_takes_a_journal_record(h: Harness) -> None:
    record_type, data = ev.Submitted("t1", TaskSpec(argv=("x",), cwd="/"), 2.0).encode()
    h.table.apply_record(Rec(1, 3.0, record_type, data))
    assert h.table.get("t1") is not None and h.table.last_seq == 1


# ---- snapshots -------------------------------------------------------------------


def busy_harness() -> tuple[Harness, dict[str, str]]:
    h = Harness()
    ids = {}
    ids["done"] = h.submit(key="done")
    h.start(ids["done"])
    h.write(ev.Settled(ids["done"], 1, "tok", State.SUCCEEDED, None, 0, None, {"e": [1]}))
    ids["failed"] = h.submit(key="f")
    h.write(ev.Settled(ids["failed"], 1, None, State.FAILED, Reason.POINTER_STALE))
    ids["running"] = h.submit(env={"A": "1"})
    h.start(ids["running"])
    ids["queued"] = h.submit(key="q")
    h.write(ev.LeaseAcquired(2, RUNNER))
    h.force("SETTLED", {"task": "ghost"})
    return h, ids


def test_snapshot_round_trip_reproduces_the_table() -> None:
    h, ids = busy_harness()
    snapshot = h.table.to_snapshot()
    again = Table.from_snapshot(snapshot)
    assert again.to_snapshot() == snapshot
    for task_id in ids.values():
        assert again.get(task_id) == h.table.get(task_id)
    assert again.oldest_queued() == h.table.oldest_queued()
    assert again.last_seq == h.table.last_seq and again.lease == h.table.lease
    assert again.anomalies == h.table.anomalies
    assert {t["id"] for t in snapshot["live"]} == {ids["running"], ids["queued"]}
    # and the table keeps folding from where the snapshot ends
    h2 = Harness(again)
    h2.write(ev.Settled(ids["running"], 1, "tok", State.SUCCEEDED, None, 0))


def test_snapshot_without_settled_loads_history_only_when_needed() -> None:
    h, ids = busy_harness()
    snapshot = h.table.to_snapshot()
    settled = snapshot.pop("settled")
    calls: list[int] = []

    def load(_seq: int) -> Iterable[Mapping[str, Any]]:
        calls.append(1)
        return settled

    lazy = Harness(Table.from_snapshot(snapshot, load_settled=load))
    assert [t.id for t in lazy.table.live()] == [ids["running"], ids["queued"]]
    assert [t.id for t in lazy.table.in_flight()] == [ids["running"]]
    assert lazy.table.oldest_queued().id == ids["queued"]  # type: ignore[union-attr]
    lazy.submit()  # a new task without a key
    with pytest.raises(RefusedError):  # the succeeded key is known without history
        lazy.submit(key="done")
    with pytest.raises(KeyInFlightError):
        lazy.submit(key="q")
    lazy.submit(key="f")  # failed keys do not block
    lazy.write(ev.Settled(ids["running"], 1, "tok", State.FAILED, Reason.EXIT_NONZERO, 1))
    assert calls == []
    assert lazy.table.get(ids["done"]) == h.table.get(ids["done"])
    assert calls == [1]
    assert lazy.table.by_key("f") == [ids["failed"], lazy.table.by_key("f")[1]]
    assert calls == [1]


@pytest.mark.parametrize("trigger", ["ids", "by_key", "retry", "to_snapshot", "tasks"])
def test_lazy_history_is_loaded_once_by_whatever_needs_it(trigger: str) -> None:
    h, ids = busy_harness()
    snapshot = h.table.to_snapshot()
    settled = snapshot.pop("settled")
    calls: list[int] = []

    def load(_seq: int) -> Iterable[Mapping[str, Any]]:
        calls.append(1)
        return settled

    lazy = Harness(Table.from_snapshot(snapshot, load_settled=load))
    if trigger == "ids":
        assert lazy.table.ids() == sorted(ids.values())
    elif trigger == "by_key":
        assert lazy.table.by_key("done") == [ids["done"]]
    elif trigger == "retry":
        lazy.write(ev.Retried(ids["failed"], 2))
        assert lazy.table.oldest_queued().id == ids["queued"]  # type: ignore[union-attr]
    elif trigger == "tasks":
        assert len(list(lazy.table.tasks())) == 4
    else:
        assert lazy.table.to_snapshot()["settled"] == settled
    lazy.table.ids()
    assert calls == [1]


def test_snapshot_of_an_unknown_format_is_refused() -> None:
    with pytest.raises(FerryError) as caught:
        Table.from_snapshot({"format": 99})
    assert caught.value.code == "snapshot.format"


def test_duplicate_id_of_an_unloaded_settled_task_is_still_refused() -> None:
    h, ids = busy_harness()
    snapshot = h.table.to_snapshot()
    settled = snapshot.pop("settled")
    calls: list[int] = []

    def load(_seq: int) -> Iterable[Mapping[str, Any]]:
        calls.append(1)
        return settled

    lazy = Harness(Table.from_snapshot(snapshot, load_settled=load))
    lazy.submit()  # a newer id: no history needed
    assert calls == []
    again = ev.Submitted(ids["done"], TaskSpec(argv=("x",), cwd="/"), 1.0)
    with pytest.raises(RefusedError) as caught:
        lazy.write(again)
    assert caught.value.code == "task.duplicate_id" and calls == [1]


def test_settled_archives_may_overlap_the_newest_record_wins() -> None:
    h, ids = busy_harness()
    old = h.table.to_snapshot()["settled"]
    h.write(ev.Retried(ids["failed"], 2))
    h.write(ev.Settled(ids["failed"], 2, None, State.CANCELLED, Reason.CANCELLED_BY_USER))
    snapshot = h.table.to_snapshot()
    newer = snapshot.pop("settled")
    # the store may hand over several archive deltas, oldest first or not
    for chunks in ([*old, *newer], [*newer, *old]):
        lazy = Table.from_snapshot(snapshot, load_settled=lambda _seq, c=chunks: c)
        assert lazy.get(ids["failed"]) == h.table.get(ids["failed"])
        assert lazy.by_key("f") == [ids["failed"]]
        assert lazy.to_snapshot()["settled"] == newer


def test_a_task_retried_after_archiving_stays_live_when_history_loads() -> None:
    h, ids = busy_harness()
    snapshot = h.table.to_snapshot()
    archived = snapshot.pop("settled")
    lazy = Harness(Table.from_snapshot(snapshot, load_settled=lambda _seq: archived))
    lazy.write(ev.Retried(ids["failed"], 2))  # loads history, then the retry applies
    task = lazy.get(ids["failed"])
    assert (task.state, task.attempt) == (State.QUEUED, 2)
    assert ids["failed"] in {t.id for t in lazy.table.live()}


def test_a_history_load_that_fails_raises_and_skips_nothing() -> None:
    """The rule: a record that needs history which cannot be loaded stops the fold with
    the loader's coded error; it is never an anomaly (a RETRIED skipped so was lost:
    the task stayed QUEUED under an idle leader, then a snapshot dropped it)."""
    h, ids = busy_harness()
    snapshot = h.table.to_snapshot()
    archived = snapshot.pop("settled")
    gone = [True]

    def load(_seq: int) -> Iterable[Mapping[str, Any]]:
        if gone[0]:
            raise JournalIntegrityError("archive missing", code="journal.snapshot_mismatch")
        return archived

    lazy = Table.from_snapshot(snapshot, load_settled=load)
    retried = ev.Retried(ids["failed"], 2).encode()
    with pytest.raises(JournalIntegrityError):
        lazy.apply(*retried, snapshot["last_seq"] + 1, 1.0)
    assert lazy.anomalies == h.table.anomalies and lazy.last_seq == snapshot["last_seq"]
    with pytest.raises(JournalIntegrityError):  # before a write too
        lazy.validate(*retried)
    with pytest.raises(JournalIntegrityError):  # and the loader is kept: not "no history"
        lazy.get(ids["done"])
    gone[0] = False
    lazy.apply(*retried, snapshot["last_seq"] + 1, 1.0)
    assert lazy.get(ids["failed"]).state is State.QUEUED  # type: ignore[union-attr]
    assert lazy.anomalies == h.table.anomalies


def test_a_history_load_may_move_the_table_on_to_a_newer_snapshot() -> None:
    """When the history as of the table's seq is gone and the newest snapshot is past
    the table, the loader hands that snapshot's table: the table becomes it, and the
    records it covers are skipped (folded already)."""
    h, ids = busy_harness()
    old = h.table.to_snapshot()
    old.pop("settled")
    h.write(ev.Retried(ids["failed"], 2))
    retried_at = h.seq
    h.write(ev.Settled(ids["failed"], 2, None, State.CANCELLED, Reason.CANCELLED_BY_USER))
    newer = h.table.to_snapshot()
    newer_settled = newer.pop("settled")
    asked: list[int] = []

    def load(table_seq: int) -> Iterable[Mapping[str, Any]] | Table:
        asked.append(table_seq)
        if table_seq < newer["last_seq"]:
            return Table.from_snapshot(newer, load_settled=load)
        return newer_settled

    lazy = Table.from_snapshot(old, load_settled=load)
    lazy.apply(*ev.Retried(ids["failed"], 2).encode(), retried_at, 1.0)
    assert asked == [old["last_seq"], newer["last_seq"]]
    assert lazy.last_seq == newer["last_seq"]
    ended = ev.Settled(ids["failed"], 2, None, State.CANCELLED, Reason.CANCELLED_BY_USER)
    lazy.apply(*ended.encode(), retried_at + 1, 1.0)  # covered: skipped, no anomaly
    assert lazy.to_snapshot() == h.table.to_snapshot()


def test_newest_decodes_only_the_tasks_it_returns(monkeypatch: pytest.MonkeyPatch) -> None:
    h, _ = busy_harness()
    for _ in range(6):  # more settled history: queued tasks cancelled
        task_id = h.submit()
        h.write(ev.Settled(task_id, 1, None, State.CANCELLED, Reason.CANCELLED_BY_USER))
    snapshot = h.table.to_snapshot()
    archived = snapshot.pop("settled")
    lazy = Table.from_snapshot(snapshot, load_settled=lambda _seq: archived)
    decoded: list[str] = []
    real = state_module.task_from_record

    def counting(record: Mapping[str, Any]) -> Any:
        decoded.append(record["id"])
        return real(record)

    monkeypatch.setattr(state_module, "task_from_record", counting)
    every = list(h.table.tasks())
    for limit, state in [(2, None), (0, "CANCELLED"), (1, "SUCCEEDED"), (3, "QUEUED")]:
        want = [t for t in every if state is None or t.state.value == state]
        want = want[-limit:] if limit else want
        decoded.clear()
        assert lazy.newest(limit, state) == want
        settled_returned = {t.id for t in want if t.terminal}
        assert set(decoded) <= settled_returned  # nothing else decoded (some already were)
    assert len(lazy.newest(0)) == len(every)


def test_snapshot_records_leave_defaults_out() -> None:
    h, ids = busy_harness()
    record = next(r for r in h.table.to_snapshot()["live"] if r["id"] == ids["queued"])
    assert "pid" not in record and "reason" not in record and "env" not in record["spec"]
    assert record["spec"]["key"] == "q" and record["state"] == "QUEUED"


# ---- late results ----------------------------------------------------------------

LATE = {"token": "tok", "state": "SUCCEEDED", "reason": None, "exit_code": 0, "ended_at": 7.0}


def test_a_late_result_is_kept_as_evidence_and_changes_no_state(h: Harness) -> None:
    a = h.submit()
    h.start(a)
    h.write(ev.Settled(a, 1, "tok", State.FAILED, Reason.HOST_LOST))  # (recovery)
    before = h.get(a)
    h.write(ev.LateResult(a, 1, LATE))
    after = h.get(a)
    assert (after.state, after.reason, after.exit_code) == (before.state, before.reason, None)
    [late] = after.evidence["late_results"]
    assert late["exit_code"] == 0 and late["token"] == "tok" and late["attempt"] == 1
    # of an earlier attempt, after a retry ran the task again (under another claim)
    h.write(ev.Retried(a, 2))
    h.start(a, token="tok2")
    h.write(ev.LateResult(a, 1, {**LATE, "exit_code": 3}))
    assert h.get(a).state is State.RUNNING
    assert [r["attempt"] for r in h.get(a).evidence["late_results"]] == [1]


def test_a_late_result_from_the_claim_that_still_owns_the_task_is_refused(h: Harness) -> None:
    a = h.submit()
    h.start(a)
    refused(h, ev.LateResult(a, 1, LATE), RefusedError, "task.not_late")
    refused(h, ev.LateResult(a, 2, {**LATE, "token": "x"}), RefusedError, "task.stale_attempt")
    refused(h, ev.LateResult("nope", 1, LATE), NotFoundError, "task.not_found")


def test_late_results_are_bounded(h: Harness) -> None:
    a = h.submit()
    h.write(ev.Settled(a, 1, None, State.CANCELLED, Reason.CANCELLED_BY_USER))
    for n in range(15):
        h.write(ev.LateResult(a, 1, {**LATE, "token": f"t{n}", "exit_code": n}))
    kept = h.get(a).evidence["late_results"]
    assert [r["exit_code"] for r in kept] == list(range(5, 15))


def test_a_late_result_is_kept_once(h: Harness) -> None:
    a = h.submit()
    h.write(ev.Settled(a, 1, None, State.CANCELLED, Reason.CANCELLED_BY_USER))
    h.write(ev.LateResult(a, 1, LATE))
    refused(h, ev.LateResult(a, 1, LATE), RefusedError, "task.stale_claim")
