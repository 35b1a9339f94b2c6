"""Concurrent compactions (cron's `ferry journal compact`, a leader's, `run`'s own) never
leave a snapshot that names a pruned archive: they are serialised by a lock."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(240)


def ferry(home: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    env = dict(os.environ, FERRY_HOME=str(home))
    return subprocess.run(
        [sys.executable, "-m", "ferry.cli", *args], env=env, capture_output=True, timeout=120
    )


def test_concurrent_compactions_keep_every_archive_a_snapshot_names(tmp_path: Path) -> None:
    home = tmp_path / "home"
    for round_no in range(4):
        lines = "".join('{"argv": ["true"]}\n' for _ in range(15)).encode()
        env = dict(os.environ, FERRY_HOME=str(home))
        subprocess.run(
            [sys.executable, "-m", "ferry.cli", "submit", "--from", "-"],
            env=env, input=lines, check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        worker = subprocess.Popen(
            [sys.executable, "-m", "ferry.cli", "work", "--drain", "-j", "2", "--poll", "0.05"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        compactors = [
            subprocess.Popen(
                [sys.executable, "-m", "ferry.cli", "journal", "compact"],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            for _ in range(4)
        ]
        for proc in [worker, *compactors]:
            assert proc.wait(timeout=120) == 0, f"round {round_no}: {proc.args}"
    assert ferry(home, "journal", "verify").returncode == 0
    listed = ferry(home, "--json", "ls", "--limit", "0")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.count(b'"SUCCEEDED"') == 60


def test_a_compaction_waits_for_the_one_in_progress(tmp_path: Path) -> None:
    """The serialisation itself: while another compaction holds the lock, a second one
    does not start its snapshot (it would prune what the first is about to name)."""
    import fcntl
    import time

    home = tmp_path / "home"
    assert ferry(home, "run", "--", "true").returncode == 0
    lock_path = home / "compact.lock"
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)  # "another compaction is in progress"
    env = dict(os.environ, FERRY_HOME=str(home))
    second = subprocess.Popen(
        [sys.executable, "-m", "ferry.cli", "journal", "compact"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:  # it must still be waiting all this while
            assert second.poll() is None, "compacted while another compaction held the lock"
            assert not list((home / "journal").glob("snapshot-*"))
            time.sleep(0.05)
    finally:
        os.close(fd)  # releases the lock
    assert second.wait(timeout=60) == 0
    assert list((home / "journal").glob("snapshot-*"))


def test_a_runner_left_behind_by_a_compaction_still_settles_its_task(tmp_path: Path) -> None:
    """A `run` in flight reads the journal only at its heartbeats and its commits. Other
    commands write several segments and compact meanwhile: its SETTLED must still land.
    (It went into the runner's removed segment, reported committed: the task stayed
    RUNNING, and recover then failed it, or requeued it to run twice if idempotent.)"""
    import json
    import time

    home = tmp_path / "home"
    go = tmp_path / "go"
    env = dict(os.environ, FERRY_HOME=str(home))
    wait_for_go = f"while [ ! -e {go} ]; do sleep 0.05; done"
    runner = subprocess.Popen(
        [sys.executable, "-m", "ferry.cli", "run", "--heartbeat", "1000", "--", "sh", "-c",
         wait_for_go],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while b'"RUNNING"' not in ferry(home, "--json", "ls").stdout:
            assert time.monotonic() < deadline, "the task never ran"
            time.sleep(0.05)
        big = tmp_path / "big.jsonl"
        env = [f"V{i}=" + "x" * (100 << 10) for i in range(30)]  # 3 MiB (never run)
        big.write_text(json.dumps({"argv": ["true"], "env": env}) + "\n")
        for _ in range(8):  # ~24 MiB: the runner's segment is sealed, and two after it
            assert ferry(home, "submit", "--from", str(big)).returncode == 0
        compacted = ferry(home, "--json", "journal", "compact")
        assert compacted.returncode == 0, compacted.stderr
        go.touch()
        assert runner.wait(timeout=60) == 0
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait(timeout=10)
    states = [t["state"] for t in json.loads(ferry(home, "--json", "ls").stdout)]
    assert states.count("SUCCEEDED") == 1 and "RUNNING" not in states, states
    assert ferry(home, "journal", "verify").returncode == 0
    removed = json.loads(ferry(home, "--json", "journal", "compact").stdout)["removed"]
    assert removed, "with nobody behind, the sealed segments go"
