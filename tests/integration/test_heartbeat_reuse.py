"""A supervisor gives its next task the heartbeat file of its last one, once nothing
holds that file's lock: no file is made (an inode allocated) nor pruned (one freed)
per task of ``work``.

On this machine's ext4 each allocation searched past the inodes freed in the last
minutes (``recently_deleted``): a few hundred microseconds of every short task's
spawn, on its slot's path (``bench/run.py work-throughput``). A file still held by a
process the last task left (a daemon that kept its descriptor) is its alive-lock, and
is never given to another task: that task gets a new file.

Each task prints the inode and the name of the heartbeat file it inherited (its
alive-lock descriptor, found in ``/proc/$$/fd``).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from clikit import Ferry, wait_until

import ferry.proc.process as process
from ferry.app.recoverer import signal_all
from ferry.app.session import open_store
from ferry.proc import alivelock

pytestmark = pytest.mark.timeout(120)

HEARTBEAT = (
    'for f in /proc/$$/fd/*; do case "$(readlink "$f")" in'
    ' */heartbeats/*) echo "$(stat -L -c %i "$f") $(basename "$(readlink "$f")")";; esac; done'
)


def _submit(ferry: Ferry, script: str) -> str:
    return ferry.ok("submit", "--", "/bin/sh", "-c", script).text.strip()


def _heartbeat(ferry: Ferry, task_id: str) -> tuple[str, str]:
    """The inode and the name of the heartbeat file the task held."""
    lines = (ferry.home / "logs" / task_id / "1.stdout").read_text().split("\n")
    inode, name = lines[0].split()
    return inode, name


def test_work_gives_each_next_task_the_heartbeat_file_of_the_last(ferry: Ferry) -> None:
    ids = [_submit(ferry, HEARTBEAT) for _ in range(6)]
    ferry.ok("-q", "work", "--drain", "-j", "1")
    assert {ferry.task(i)["state"] for i in ids} == {"SUCCEEDED"}
    files = [_heartbeat(ferry, i) for i in ids]
    assert [name for _, name in files] == [f"{i}.1" for i in ids]  # (each under its name)
    # Two supervisors serve one slot (the next task goes to the idle one while the
    # last one's end is written): each makes one file, and gives it on.
    assert len({inode for inode, _ in files}) <= 2, files


def test_a_heartbeat_file_a_daemon_still_holds_is_never_given_on(ferry: Ferry) -> None:
    # (The task ends once its daemon has left its group: before, the supervisor's end
    # of the group's leftovers could stop it before its setsid.)
    daemon = (
        "setsid sleep 60 </dev/null >/dev/null 2>&1 & pid=$!; echo $pid;"
        ' until [ "$(cut -d" " -f6 /proc/$pid/stat)" = "$pid" ]; do :; done'
    )
    first = _submit(ferry, f"{HEARTBEAT}; {daemon}")
    rest = [_submit(ferry, HEARTBEAT) for _ in range(5)]
    ferry.ok("-q", "work", "--drain", "-j", "1")
    assert {ferry.task(i)["state"] for i in [first, *rest]} == {"SUCCEEDED"}
    held, _ = _heartbeat(ferry, first)
    pid = int((ferry.home / "logs" / first / "1.stdout").read_text().split("\n")[1])
    ferry.end_at_close(pid)  # (the daemon: it holds the first task's lock until then)
    assert f"/heartbeats/{first}.1" in _open_files(pid)
    assert held not in {_heartbeat(ferry, i)[0] for i in rest}


def _open_files(pid: int) -> str:
    fds = f"/proc/{pid}/fd"
    return " ".join(os.readlink(f"{fds}/{fd}") for fd in os.listdir(fds))


def test_a_scan_for_an_ended_tasks_processes_never_finds_the_next_tasks(
    ferry: Ferry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ferry cancel X`` (or recovery's kill) scans /proc for the processes holding X's
    file, which it stat'ed first. X ends meanwhile and its supervisor gives the file to
    Z: the scan must not take Z's processes for X's. The preemption between the stat
    and the walk of /proc is made certain: the first stat is taken while X runs. (From
    an adversarial review: before the scan looked at the name again after its walk,
    it signalled Z.)"""
    x = _submit(ferry, "sleep 1")
    y = _submit(ferry, "true")  # (to the spare supervisor, while X's end is written)
    z = _submit(ferry, "sleep 30")  # (to X's supervisor: given X's file)
    ferry.start("work", "-j", "1")
    wait_until(lambda: ferry.task(x)["state"] == "RUNNING", what="X running")
    key = process._file_key(ferry.home / "heartbeats" / f"{x}.1")
    store = open_store(ferry.home)
    task_x = store.get(x)  # (the cancel read X in flight)
    store.close()
    assert task_x is not None
    wait_until(lambda: ferry.task(z)["state"] == "RUNNING", what="Z running")
    assert ferry.task(y)["state"] == "SUCCEEDED"
    assert (ferry.home / "heartbeats" / f"{z}.1").stat().st_ino == key[1]  # (given on)
    real, calls = process._file_key, []

    def stat_before(path: object) -> object:  # (the scan's first stat: taken before)
        calls.append(path)
        return key if len(calls) == 1 else real(path)  # type: ignore[arg-type]

    monkeypatch.setattr(process, "_file_key", stat_before)
    assert signal_all(task_x, ferry.home, signal.SIGTERM) == 0
    assert len(calls) >= 2  # (it looked at the name again after its walk)
    assert alivelock.held(ferry.home / "heartbeats" / f"{x}.1") is None
    assert ferry.task(z)["state"] == "RUNNING"
    ferry.ok("cancel", z)
    wait_until(lambda: ferry.task(z)["state"] == "CANCELLED", what="Z cancelled")


def test_the_new_name_never_shows_the_last_tasks_beat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Until its first beat, a file given on would say the last task's (hours old, after
    an idle while): ``show``'s heartbeat_at and recovery's age of the new task. The
    beat is written before the rename. (From an adversarial review.)"""
    old, new = tmp_path / "X.1", tmp_path / "Y.1"
    alivelock.release(alivelock.hold(old))
    os.utime(old, (1_000_000, 1_000_000))  # (X's last beat, long ago)
    seen = []
    real = alivelock._write_beat

    def spy(fd: int) -> None:
        found = alivelock.read_beat(new)  # (a `ferry show Y` now)
        seen.append(None if found is None else found[1])
        real(fd)

    monkeypatch.setattr(alivelock, "_write_beat", spy)
    fd = alivelock.hold(new, old)
    assert os.fstat(fd).st_ino == os.stat(new).st_ino and not old.exists()  # (given on)
    alivelock.release(fd)
    assert seen == [None]
    assert os.stat(new).st_mtime > 1_000_000
