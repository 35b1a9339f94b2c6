"""A cancel that lands after the claim but before the spawn: the task never starts."""

from __future__ import annotations

import os
import time
from pathlib import Path

from ferry.app.launch import run_foreground
from ferry.core import events as ev
from ferry.core.ids import new_claim_token, new_task_id
from ferry.core.model import Reason, State, replace
from ferry.core.spec import TaskSpec
from ferry.proc.process import self_identity
from ferry.storage.local.statedir import ensure_home
from ferry.storage.local.store import Store


def test_a_cancel_between_claim_and_spawn_settles_cancelled_without_running(
    tmp_path: Path,
) -> None:
    home = Path(ensure_home(tmp_path / "home"))
    marker = tmp_path / "ran"
    store = Store.open(home)
    spec = TaskSpec(argv=("/bin/sh", "-c", f"touch {marker}"), cwd=str(tmp_path))
    task_id = new_task_id(time.time_ns(), os.urandom(4))
    token = new_claim_token(os.urandom(10))
    me = self_identity().to_json()
    store.commit(
        ev.Submitted(task_id, spec, time.time()), ev.Claimed(task_id, 1, token, me, "claim")
    )
    store.commit(ev.CancelRequested(task_id, 1, token))  # as `ferry cancel` would, meanwhile
    task = store.get(task_id)
    assert task is not None and task.state is State.CLAIMED

    result = run_foreground(lambda: store, home, replace(task, claim_token=token), token)

    assert (result.task.state, result.task.reason) == (State.CANCELLED, Reason.CANCELLED_BY_USER)
    assert not marker.exists(), "the cancelled task was started"
    store.close()
