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

import pytest
from clikit import Ferry

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
    daemon = "setsid sleep 60 </dev/null >/dev/null 2>&1 & echo $!"
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
    import os

    fds = f"/proc/{pid}/fd"
    return " ".join(os.readlink(f"{fds}/{fd}") for fd in os.listdir(fds))
