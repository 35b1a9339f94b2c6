"""The inherited alive-lock: held while any process that inherited it lives."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ferry import alivelock

SETSID_AND_CLEAR_ENV = (
    "import os, sys, time; os.setsid(); "
    "os.execve('/bin/sleep', ['sleep', '30'], {})"  # a new session and an empty env
)


def test_no_lock_file_means_no_evidence(tmp_path: Path) -> None:
    assert alivelock.held(tmp_path / "missing.alive") is None


def test_the_holder_itself_counts_as_alive_and_release_frees_it(tmp_path: Path) -> None:
    path = tmp_path / "t.1"
    fd = alivelock.hold(path)
    assert alivelock.held(path) is True
    alivelock.release(fd)
    assert alivelock.held(path) is False  # the heartbeat file stays, unlocked


def test_a_child_that_escaped_its_session_and_environment_keeps_it_held(tmp_path: Path) -> None:
    path = tmp_path / "t.1"
    fd = alivelock.hold(path)
    child = subprocess.Popen([sys.executable, "-c", SETSID_AND_CLEAR_ENV], pass_fds=(fd,))
    try:
        import os

        os.close(fd)  # the runner "dies": only the child holds the lock now
        assert alivelock.held(path) is True
    finally:
        child.kill()
        child.wait(timeout=10)
    assert alivelock.held(path) is False  # a dead (reaped) child holds nothing
