"""The use cases over the in-memory store (``ferry.storage.memory``): what they write,
what they refuse, and how they decide when the state moves under them, without a
journal on disk. The processes they probe are real (a dead runner is a real identity
of a process that no longer exists)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from ferry.app.leader import recover
from ferry.app.service import Service
from ferry.app.session import Session
from ferry.core import events as ev
from ferry.core.errors import KeyInFlightError, LeaseHeldError, RefusedError
from ferry.core.ids import new_claim_token
from ferry.core.model import Reason, State
from ferry.proc.process import self_identity
from ferry.storage.memory import MemoryStore

pytestmark = pytest.mark.timeout(30)


def dead_runner() -> dict[str, Any]:
    """The identity of a process that no longer exists: ours, started a tick later."""
    return {**self_identity().to_json(), "start_time": self_identity().start_time + 1}


def service_over(store: MemoryStore, home: Path) -> Service:
    return Service(Session(home, store=store))


def opts(**overrides: Any) -> dict[str, Any]:
    base = {"argv": ["true"], "name": None, "key": None, "idempotent": False,
            "max_releases": 3, "timeout_s": None, "kill_grace_s": 0.1, "heartbeat_s": 5.0,
            "cwd": None, "env": [], "pointers": [], "patch_file": None, "shell": False}  # fmt: skip
    return {**base, **overrides}


def claim(store: MemoryStore, task_id: str, runner: dict[str, Any]) -> str:
    token = new_claim_token(os.urandom(10))
    store.commit(ev.Claimed(task_id, 1, token, runner, "claim"))
    return token


def succeed(store: MemoryStore, task_id: str) -> None:
    token = claim(store, task_id, dead_runner())
    store.commit(
        ev.Dispatching(task_id, 1, token, f"ferry-{task_id}", {}),
        ev.Spawned(task_id, 1, token, 4242, 4242, 1, time.time()),
        ev.Settled(task_id, 1, token, State.SUCCEEDED, None, exit_code=0),
    )


def test_submit_queues_and_a_key_that_succeeded_is_not_queued_again(tmp_path: Path) -> None:
    store = MemoryStore()
    service = service_over(store, tmp_path)
    [first] = service.submit([opts(key="build-1")])
    assert first.state is State.QUEUED
    succeed(store, first.id)
    [again] = service.submit([opts(key="build-1")])
    assert again.id == first.id and again.state is State.SUCCEEDED
    assert [r[2] for r in store.records].count("SUBMITTED") == 1


def test_a_key_in_flight_is_refused(tmp_path: Path) -> None:
    store = MemoryStore()
    service = service_over(store, tmp_path)
    [task] = service.submit([opts(key="k")])
    claim(store, task.id, dead_runner())
    with pytest.raises(KeyInFlightError) as refused:
        service.submit([opts(key="k")])
    assert refused.value.code == "task.key_in_flight"


def test_cancel_of_a_queued_task_settles_it_cancelled(tmp_path: Path) -> None:
    store = MemoryStore()
    service = service_over(store, tmp_path)
    [task] = service.submit([opts()])
    cancelled = service.cancel(task.id)
    assert (cancelled.state, cancelled.reason) == (State.CANCELLED, Reason.CANCELLED_BY_USER)


class ClaimsFirst(MemoryStore):
    """A runner claims the task between the use case's read and its first write."""

    def __init__(self, runner: dict[str, Any]) -> None:
        super().__init__()
        self.runner, self.armed = runner, False

    def commit(self, *events: Any, epoch: int = 0) -> list[Any]:
        if self.armed:
            self.armed = False
            queued = self.queued(1)
            self.token = claim(self, queued[0].id, self.runner)
        return super().commit(*events, epoch=epoch)


def test_cancel_racing_a_claim_asks_the_claim_and_never_overwrites_it(tmp_path: Path) -> None:
    """Bug 2 of issue 13 at the use case: the token-less SETTLED of a QUEUED task is
    refused once a runner claimed it; cancel reads again and goes through the claim
    (CANCEL_REQUESTED with its token); the runner being dead, it settles it itself."""
    store = ClaimsFirst(dead_runner())
    service = service_over(store, tmp_path)
    [task] = service.submit([opts()])
    store.armed = True
    cancelled = service.cancel(task.id)
    assert cancelled.state is State.CANCELLED
    types = [(r[2], r[3].get("token")) for r in store.records]
    assert types[1:] == [
        ("CLAIMED", store.token), ("CANCEL_REQUESTED", store.token), ("SETTLED", store.token)
    ]  # fmt: skip


def test_retry_and_resolve_follow_the_rules(tmp_path: Path) -> None:
    store = MemoryStore()
    service = service_over(store, tmp_path)
    [task] = service.submit([opts(key="deploy")])
    with pytest.raises(RefusedError):
        service.retry(task.id, force=False)  # QUEUED: nothing to retry
    token = claim(store, task.id, dead_runner())
    store.commit(ev.Settled(task.id, 1, token, State.FAILED, Reason.EXIT_NONZERO, exit_code=1))
    retried = service.retry(task.id, force=False)
    assert (retried.state, retried.attempt) == (State.QUEUED, 2)
    token = new_claim_token(os.urandom(10))
    store.commit(ev.Claimed(task.id, 2, token, dead_runner(), "claim"))
    store.commit(ev.Settled(task.id, 2, token, State.FAILED, Reason.EXIT_NONZERO, exit_code=1))
    resolved = service.resolve(task.id, verdict="succeeded", force=False)
    assert resolved.state is State.FAILED
    assert store.succeeded_with_key("deploy") == task.id  # the key follows the verdict


def test_recover_requeues_a_claim_whose_runner_died_and_fails_an_unsafe_dispatch(
    tmp_path: Path,
) -> None:
    store = MemoryStore()
    session = Session(tmp_path, store=store)
    service = Service(session)
    [claimed, dispatched] = service.submit([opts(), opts()])
    claim(store, claimed.id, dead_runner())
    token = claim(store, dispatched.id, dead_runner())
    store.commit(ev.Dispatching(dispatched.id, 1, token, f"ferry-{dispatched.id}", {}))

    report = recover(session, dry_run=False, stale_after_s=None, lease_ttl_s=30.0)

    assert store.get(claimed.id).state is State.QUEUED  # type: ignore[union-attr]
    failed = store.get(dispatched.id)
    assert failed is not None and failed.state is State.FAILED
    assert failed.reason is Reason.MARKED_FAILED_MUTATION_UNSAFE
    assert report.exit_code == 3 and report.epoch == store.highest_epoch > 0
    assert store.records[-3][2] == "LEASE_ACQUIRED"  # announced in its first write


def test_a_leader_write_under_an_older_epoch_is_fenced() -> None:
    store = MemoryStore()
    store.commit(ev.LeaseAcquired(2, self_identity().to_json()), epoch=2)
    with pytest.raises(LeaseHeldError) as fenced:
        store.commit(ev.LeaseAcquired(1, self_identity().to_json()), epoch=1)
    assert fenced.value.code == "journal.fenced"
    with pytest.raises(LeaseHeldError):  # one holder per epoch
        store.commit(ev.LeaseAcquired(2, self_identity().to_json()), epoch=2)
