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
