"""``GoneRunners`` (``wait``, ``logs -f``): a task's runner found dead is said only if
the task is still in flight when read again: a runner exits once its task's end is
durable, and that end may have come after the caller read the task. (Found by a
review: "its runner is gone" printed just before "SUCCEEDED".)"""

from __future__ import annotations

import time

from ferry.app.runner_state import GoneRunners
from ferry.core import events as ev
from ferry.core.model import State
from ferry.core.spec import TaskSpec
from ferry.storage.memory import MemoryStore

# A runner no process is: pid 1 with a start time and boot that are not its own.
DEAD = {"pid": 1, "start_time": 1, "boot_id": "another-boot", "host": "h"}


def claimed(store: MemoryStore, name: str) -> None:
    store.commit(ev.Submitted(name, TaskSpec(argv=("true",), cwd="/"), time.time()))
    store.commit(ev.Claimed(name, 1, f"tok-{name}", DEAD, "work"))
    store.commit(ev.Dispatching(name, 1, f"tok-{name}", f"{name}:1:tok-{name}"))
    store.commit(ev.Spawned(name, 1, f"tok-{name}", 2, 2, 1.0))


def test_a_dead_runner_is_said_once_and_only_of_a_task_still_in_flight(tmp_path: object) -> None:
    store = MemoryStore()
    claimed(store, "ended")
    claimed(store, "stuck")
    stale = [store.get("ended"), store.get("stuck")]
    store.commit(ev.Settled("ended", 1, "tok-ended", State.SUCCEEDED, None, 0))
    said: list[str] = []
    gone = GoneRunners(str(tmp_path), store, said.append)
    gone.look(task for task in stale if task is not None)
    assert [line.split(":")[0] for line in said] == ["task stuck"]
    gone.next_look = 0.0
    gone.look(task for task in stale if task is not None)
    assert len(said) == 1
