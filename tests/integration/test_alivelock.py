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


# A child that opens the lock file itself and says so: read-write and close-on-exec (as
# the runner's own descriptor is), or read-only and inheritable (as no task holds it).
OPEN_AND_WAIT = (
    "import os, sys; fd = os.open(sys.argv[1], getattr(os, sys.argv[2])); "
    "os.set_inheritable(fd, sys.argv[3] == 'inheritable'); print('ready', flush=True); "
    "sys.stdin.read()"
)


def test_the_holder_scan_finds_the_processes_that_inherited_the_lock_only(
    tmp_path: Path,
) -> None:
    """``ferry kill`` finds an orphan that left the task's session and cleared its
    environment by the lock it inherited. Not every process with the file open is the
    task's: the runner's own descriptor is close-on-exec, ferry's probes open it
    read-only; neither may be taken for the task (and signalled)."""
    import os

    from ferry.process import scan_processes

    path = tmp_path / "t.1"
    fd = alivelock.hold(path)
    heir = subprocess.Popen([sys.executable, "-c", SETSID_AND_CLEAR_ENV], pass_fds=(fd,))
    os.close(fd)
    others = [
        subprocess.Popen(
            [sys.executable, "-c", OPEN_AND_WAIT, str(path), *how],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for how in (("O_RDWR", "close-on-exec"), ("O_RDONLY", "inheritable"))
    ]
    try:
        for other in others:
            assert other.stdout is not None and other.stdout.readline() == "ready\n"
        found = {ident.pid for ident in scan_processes(None, holding=path).alive}
        assert found == {heir.pid}
        assert not scan_processes(None, holding=tmp_path / "missing").alive
    finally:
        for child in (heir, *others):
            child.kill()
            child.communicate(timeout=10)
