"""The scan for a task's processes by the alive-lock they hold (``ferry.proc.process``,
``holding=``) finds them by the file's inode, whatever path names it: a process holds
its heartbeat file through the path its runner opened, and a cancel may name the same
file by another path (a bind mount; another link). Each case: a process holds the
file (read-write, inheritable, flock'ed, as a task's processes do), and the scan names
it by another path. (From an adversarial review: a check of the name that /proc shows,
tried for the heartbeat file given on to the next task, lost both.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

HOLD_AND_SCAN = textwrap.dedent(
    """
    import fcntl, os, signal, subprocess, sys
    from ferry.proc import process
    opened, scanned = sys.argv[1], sys.argv[2]
    fd = os.open(opened, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)"],
        pass_fds=(fd,), start_new_session=True, env={},
    )
    os.close(fd)
    try:
        scan = process.scan_processes(None, holding=scanned)
        print("found" if child.pid in [p.pid for p in scan.alive] else "lost")
        sent = process.signal_task(None, "no-such-marker:", signal.SIGTERM, holding=scanned)
        print("signalled", sent)
    finally:
        child.kill()
        child.wait()
    """
)


def _hold_and_scan(opened: Path, scanned: Path, *prefix: str) -> list[str]:
    out = subprocess.run(
        [*prefix, sys.executable, "-c", HOLD_AND_SCAN, str(opened), str(scanned)],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.split("\n")


def test_a_home_reached_through_a_bind_mount_is_still_scanned(tmp_path: Path) -> None:
    """The worker's FERRY_HOME is /x/b (a bind mount of /x/a), the cancel's /x/a: same
    file (st_dev and st_ino), but /proc shows /x/b/... and realpath gives /x/a/...
    (No symlink to resolve: realpath cannot see a bind mount.) Also what a scanner in
    another mount namespace sees (a container mounting the home elsewhere)."""
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        pytest.skip("no unshare/mount")
    if subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=10).returncode:
        pytest.skip("cannot make a mount namespace here")
    a, b = tmp_path / "a", tmp_path / "b"
    (a / "heartbeats").mkdir(parents=True)
    b.mkdir()
    script = f'mount --bind {a} {b} && exec "$@"'
    lines = _hold_and_scan(
        b / "heartbeats" / "T.1",
        a / "heartbeats" / "T.1",
        "unshare",
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        script,
        "sh",
    )
    assert lines[:2] == ["found", "signalled 1"], lines


def test_a_file_still_named_by_another_link_is_still_scanned(tmp_path: Path) -> None:
    """Opened as N1, N1 unlinked while a second link N2 remains: /proc shows
    "N1 (deleted)", the scan asks for N2 (minor: ferry itself never links these)."""
    d = tmp_path / "heartbeats"
    d.mkdir()
    n1, n2 = d / "T.1", d / "T.1.alias"
    n1.touch()
    os.link(n1, n2)
    script = HOLD_AND_SCAN.replace("os.close(fd)\n", "os.close(fd)\nos.unlink(opened)\n", 1)
    out = subprocess.run(
        [sys.executable, "-c", script, str(n1), str(n2)],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["found", "signalled 1"], out.stdout
