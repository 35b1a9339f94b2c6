"""What the ferry command benchmarks share: the command, its environment, byte-compiled
packages, and homes with a history written through the real store."""

from __future__ import annotations

import compileall
import os
import subprocess
import sys
import time
from pathlib import Path

from benchkit import REPO

PY = sys.executable


def ferry_cmd() -> list[str]:
    script = Path(PY).parent / "ferry"
    return [str(script)] if script.exists() else [PY, "-m", "ferry.cli"]


def compile_packages() -> None:
    """Byte-compiled, as `pip install` leaves them: no side pays for compiling source."""
    for package in ("ferry", "journal"):
        compileall.compile_dir(str(REPO / package), quiet=1)


def env_for(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["FERRY_HOME"] = str(home)
    env.pop("FERRY_FAILPOINTS", None)
    return env


def run(cmd: list[str], env: dict[str, str] | None = None, **kw: object) -> None:
    if "input" not in kw:
        kw["stdin"] = subprocess.DEVNULL
    kw.setdefault("check", True)
    subprocess.run(cmd, env=env, **kw)  # type: ignore[call-overload]


_last_id_ms = 0


def _next_id_ms() -> int:
    """Creation times 1 ms apart, in the past (room for a million tasks), so that ids
    sort in creation order and before any task made after the build, as in a real
    history. (Ids made in one millisecond sort at random, and an id that sorts before
    a settled one makes the table look through history for a duplicate.)"""
    global _last_id_ms
    _last_id_ms = max(_last_id_ms + 1, time.time_ns() // 1_000_000 - 1_000_000)
    return _last_id_ms


def journal_with(home: Path, settled_tasks: int, in_flight: int) -> None:
    """A state directory whose journal holds ``settled_tasks`` finished tasks (five
    records each: SUBMITTED, CLAIMED, DISPATCHING, SPAWNED, SETTLED) and ``in_flight``
    RUNNING tasks of a dead runner. Written through the real store (validated), in
    large batches."""
    from ferry.core import events as ev
    from ferry.core.ids import new_claim_token, new_task_id
    from ferry.core.model import State
    from ferry.core.spec import TaskSpec
    from ferry.storage.local.statedir import ensure_home
    from ferry.storage.local.store import Store

    ensure_home(home)
    store = Store.open(home)
    spec = TaskSpec(argv=("true",), cwd="/")
    dead_runner = {"pid": 999_999, "start_time": 1, "boot_id": "gone", "host": "bench"}
    now = time.time()
    batch: list[ev.Event] = []
    for i in range(settled_tasks + in_flight):
        task_id = new_task_id(_next_id_ms() * 1_000_000, os.urandom(4))
        token = new_claim_token(os.urandom(10))
        batch.append(ev.Submitted(task_id, spec, now))
        batch.append(ev.Claimed(task_id, 1, token, dead_runner, "work"))
        batch.append(ev.Dispatching(task_id, 1, token, f"{task_id}:1:{token}"))
        batch.append(ev.Spawned(task_id, 1, token, 999_998, 999_998, 1))
        if i < settled_tasks:
            batch.append(ev.Settled(task_id, 1, token, State.SUCCEEDED, None, 0))
        if len(batch) >= 3000:
            store.commit(*batch)
            batch = []
    if batch:
        store.commit(*batch)
    store.close()
