"""Failpoints kill the process with SIGKILL exactly at the named point, and nowhere else."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ferry.failpoints import ENV, FAILPOINTS
from ferry.proc.liveness import Liveness, probe
from ferry.proc.process import self_identity
from ferry.storage.local.lease import LeaseStore
from ferry.storage.local.statedir import ensure_home

pytestmark = pytest.mark.timeout(60)

STEPS = """
    import sys
    from ferry.failpoints import failpoint
    for step in ("before:spawn", "after:spawn", "before:SPAWNED", "after:SPAWNED"):
        for _ in range(3):
            print("reached", step, flush=True)
            failpoint(step)
    print("done", flush=True)
"""


def run_steps(failpoints: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != ENV}
    if failpoints is not None:
        env[ENV] = failpoints
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(STEPS)],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_off_by_default_nothing_happens() -> None:
    result = run_steps(None)
    assert result.returncode == 0
    assert result.stdout.splitlines()[-1] == "done"


@pytest.mark.parametrize("point", ["before:spawn", "after:spawn", "after:SPAWNED"])
def test_the_process_dies_by_sigkill_at_the_named_point(point: str) -> None:
    result = run_steps(point)
    assert result.returncode == -signal.SIGKILL
    lines = result.stdout.splitlines()
    assert lines[-1] == f"reached {point}", "it died at the first hit of that point"
    assert lines.count(f"reached {point}") == 1


def test_the_nth_hit() -> None:
    result = run_steps("after:spawn=3")
    assert result.returncode == -signal.SIGKILL
    assert result.stdout.splitlines().count("reached after:spawn") == 3
    assert "reached before:SPAWNED" not in result.stdout


def test_an_unknown_or_unreached_name_never_fires() -> None:
    result = run_steps("before:SETTLED,no-such-point,after:spawn=4")
    assert result.returncode == 0
    assert result.stdout.splitlines()[-1] == "done"


def test_the_registry_names_the_side_effects_and_both_sides_of_each_event() -> None:
    for point in ("before:spawn", "after:signal", "before:lease_write", "after:lease_write"):
        assert point in FAILPOINTS
    for point in FAILPOINTS:
        when, _, what = point.partition(":")
        assert when in ("before", "after") and what
        other = ("after:" if when == "before" else "before:") + what
        assert other in FAILPOINTS


LEASE_WRITER = """
    import sys
    from pathlib import Path
    from ferry.storage.local.lease import LeaseStore
    from ferry.proc.process import self_identity
    print(self_identity().pid, flush=True)
    LeaseStore(Path(sys.argv[1]), ttl_s=3600.0).acquire(self_identity())
    print("written", flush=True)
"""


@pytest.mark.parametrize("point", ["before:lease_write", "after:lease_write"])
def test_a_crash_around_the_lease_write_leaves_a_usable_lease(point: str, tmp_path: Path) -> None:
    lease_path = Path(ensure_home(tmp_path / "home")) / "lease.json"
    env = {k: v for k, v in os.environ.items() if k != ENV}
    env[ENV] = point
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(LEASE_WRITER), str(lease_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == -signal.SIGKILL
    assert "written" not in result.stdout
    store = LeaseStore(lease_path, 60.0)
    lease = store.read()
    if point == "before:lease_write":
        assert lease is None, "nothing was written"
    else:
        assert lease is not None and lease.epoch == 1 and lease.holder is not None
        assert probe(lease.holder) is Liveness.DEAD
    # The crashed holder is dead: the lease is taken at once, with the next epoch.
    assert store.acquire(self_identity()).epoch == (1 if lease is None else 2)
