"""The write-ahead order, proven on a real run by tracing its system calls.

``strace -f`` follows ferry and the task it spawns and writes one line per system call
event, in the order it sees them: a call that another process interrupts is split into
``name(args <unfinished ...>`` and ``<... name resumed>) = ret``. A ptrace stop at a
syscall's exit holds that thread until strace has printed it, so when thread A's fsync
returns before the clone that creates the child (whichever thread makes it), the
fsync's completion line comes first in the file. That is the property checked here:

* the fsync/fdatasync of the journal descriptor that follows the ``write`` of the
  record batch holding ``DISPATCHING`` has *returned 0* before the task is cloned, and
  so before the task's ``execve``;
* the ``SETTLED`` record is written after the task exited and its fsync has returned
  before ferry itself exits.

A ``kill -9`` test cannot see a missing fsync (the page cache survives the process);
the trace can.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

STRACE = shutil.which("strace")
FERRY = str(Path(sys.executable).parent / "ferry")
SYSCALLS = "write,pwrite64,writev,fsync,fdatasync,execve,clone,clone3,fork,vfork"
TIMEOUT_S = 120.0
_SPAWNING = {"clone", "clone3", "fork", "vfork"}

_LINE = re.compile(r"^(?P<pid>\d+)\s+\S+\s+(?P<body>.*)$")
_RESUMED = re.compile(r"^<\.\.\. (?P<name>\w+) resumed>(?P<rest>.*)$")
_CALL = re.compile(r"^(?P<name>\w+)\((?P<rest>.*)$")
_RETURN = re.compile(r"\)\s+=\s+(?P<ret>-?\d+)")
_EXITED = re.compile(r"^\+\+\+ (exited with|killed by) ")


@dataclass(frozen=True)
class Event:
    index: int  # line number in the trace: the order strace saw things in
    pid: int
    name: str  # syscall name, or "+++exit" for a process's end
    entry: bool  # this line shows the call's arguments
    done: bool  # this line shows the call's return value
    text: str  # the arguments (entry) and/or the result
    ret: int | None


def parse(trace: str) -> list[Event]:
    events = []
    for index, line in enumerate(trace.splitlines()):
        match = _LINE.match(line)
        if match is None:
            continue
        pid, body = int(match["pid"]), match["body"]
        if _EXITED.match(body):
            events.append(Event(index, pid, "+++exit", False, True, body, None))
            continue
        resumed = _RESUMED.match(body)
        call = _CALL.match(body)
        if resumed is not None:
            name, rest, entry = resumed["name"], resumed["rest"], False
        elif call is not None:
            name, rest, entry = call["name"], call["rest"], True
        else:
            continue  # signals ("--- SIGCHLD ...") and strace's own notes
        done = not rest.endswith("<unfinished ...>")
        returned = _RETURN.search(rest) if done else None
        ret = int(returned["ret"]) if returned else None
        events.append(Event(index, pid, name, entry, done, rest, ret))
    return events


def fd_of(event: Event) -> int:
    match = re.match(r"\s*(\d+)", event.text)
    assert match is not None, event
    return int(match[1])


def completion(events: list[Event], start: Event) -> Event:
    """The line that shows the return value of the call ``start`` shows the arguments
    of: the same line, or (the call interrupted in the trace by another process's)
    its ``<... resumed>`` line."""
    return next(e for e in events if e.index >= start.index and e.pid == start.pid and e.done)


def sync_done_after(events: list[Event], write: Event, not_pid: int) -> Event:
    """The completion of the first fsync/fdatasync of ``write``'s descriptor that ferry
    (any traced process but the task) starts after that write."""
    fd = fd_of(write)
    starts = [
        e for e in events
        if e.index > write.index and e.entry and e.pid != not_pid
        and e.name in ("fsync", "fdatasync") and fd_of(e) == fd
    ]  # fmt: skip
    assert starts, f"no fsync of fd {fd} after the write at line {write.index}"
    start = starts[0]
    done = completion(events, start)
    assert done.name == start.name and done.ret == 0, done
    return done


def only(events: list[Event], what: str) -> Event:
    assert len(events) == 1, (what, events)
    return events[0]


def _strace_works(tmp_path: Path) -> str | None:
    if STRACE is None:
        return "strace is not installed (apt-get install strace)"
    probe = subprocess.run(
        [STRACE, "-f", "-o", str(tmp_path / "probe.trace"), "/bin/true"],
        capture_output=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    if probe.returncode != 0:
        return f"strace cannot trace here (ptrace refused?): {probe.stderr.decode()[:200]}"
    return None


def traced(
    tmp_path: Path, home: Path, *args: str, syscalls: str = SYSCALLS
) -> tuple[list[Event], subprocess.CompletedProcess[bytes]]:
    trace = tmp_path / f"ferry-{uuid.uuid4().hex[:8]}.trace"
    env = {k: v for k, v in os.environ.items() if k != "FERRY_FAILPOINTS"}
    env["FERRY_HOME"] = str(home)
    proc = subprocess.run(
        [STRACE or "strace", "-f", "-tt", "-s", "65536", "-e", f"trace={syscalls}",
         "-o", str(trace), FERRY, *args],
        capture_output=True, env=env, timeout=TIMEOUT_S, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert "Traceback" not in proc.stderr.decode("utf-8", "replace")
    return parse(trace.read_text(errors="replace")), proc


def check_order(events: list[Event], probe: str) -> None:
    ferry_pid = events[0].pid  # the first line is ferry's own execve
    # The first execve of the probe by another process (ferry's own argv may hold it).
    task_exec = next(
        e for e in events
        if e.name == "execve" and e.entry and e.pid != ferry_pid and probe in e.text
    )  # fmt: skip
    task_pid = task_exec.pid
    spawn = only(
        [e for e in events if e.name in _SPAWNING and e.done and e.ret == task_pid],
        "the clone that made the task",
    )
    # A thread is in one call at a time: its last entry line up to here is this call's.
    spawn_entry = max(
        (e for e in events if e.pid == spawn.pid and e.entry and e.index <= spawn.index),
        key=lambda e: e.index,
    )
    assert spawn_entry.name == spawn.name

    journal_writes = [
        e for e in events if e.name in ("write", "pwrite64", "writev") and e.entry
        and e.pid != task_pid and '\\"type\\":\\"' in e.text
    ]  # fmt: skip
    dispatching = only(
        [e for e in journal_writes if '\\"type\\":\\"DISPATCHING\\"' in e.text],
        "the write holding DISPATCHING",
    )
    synced = sync_done_after(events, dispatching, task_pid)
    assert synced.index < spawn_entry.index < task_exec.index, (
        f"DISPATCHING synced at line {synced.index}, task cloned at line "
        f"{spawn_entry.index}, exec'd at line {task_exec.index}"
    )
    # SPAWNED is written only once the child exists.
    spawned = only([e for e in journal_writes if '\\"type\\":\\"SPAWNED\\"' in e.text], "SPAWNED")
    assert spawned.index > spawn.index

    task_exit = only(
        [e for e in events if e.name == "+++exit" and e.pid == task_pid], "the task's end"
    )
    ferry_exit = only(
        [e for e in events if e.name == "+++exit" and e.pid == ferry_pid], "ferry's end"
    )
    settled = only([e for e in journal_writes if '\\"type\\":\\"SETTLED\\"' in e.text], "SETTLED")
    settled_sync = sync_done_after(events, settled, task_pid)
    assert task_exit.index < settled.index < settled_sync.index < ferry_exit.index


@pytest.fixture
def strace_ok(tmp_path: Path) -> None:
    reason = _strace_works(tmp_path)
    if reason is not None:
        pytest.skip(reason)


def test_parse_understands_split_calls() -> None:
    trace = (
        "10 09:00:00.000001 vfork( <unfinished ...>\n"
        '11 09:00:00.000002 execve("/bin/echo", ["/bin/echo", "x"], 0x1 /* 3 vars */ <unfinished ...>\n'
        "10 09:00:00.000003 <... vfork resumed>) = 11\n"
        "11 09:00:00.000004 <... execve resumed>) = 0\n"
        "10 09:00:00.000005 fdatasync(4)      = 0\n"
        "11 09:00:00.000006 +++ exited with 0 +++\n"
    )
    events = parse(trace)
    assert [(e.pid, e.name, e.entry, e.done, e.ret) for e in events] == [
        (10, "vfork", True, False, None),
        (11, "execve", True, False, None),
        (10, "vfork", False, True, 11),
        (11, "execve", False, True, 0),
        (10, "fdatasync", True, True, 0),
        (11, "+++exit", False, True, None),
    ]


def test_dispatching_is_fsynced_before_the_task_is_exec_d(
    strace_ok: None, tmp_path: Path, ferry_home: Path
) -> None:
    probe = f"WAL-ORDER-PROBE-{uuid.uuid4().hex}"
    events, proc = traced(tmp_path, ferry_home, "run", "--", "/bin/echo", probe)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{probe}\n".encode()
    check_order(events, probe)


def test_the_same_order_when_a_queued_task_is_claimed(
    strace_ok: None, tmp_path: Path, ferry_home: Path
) -> None:
    probe = f"WAL-ORDER-PROBE-{uuid.uuid4().hex}"
    env = {**os.environ, "FERRY_HOME": str(ferry_home)}
    subprocess.run(
        [FERRY, "submit", "--", "/bin/echo", probe], env=env, check=True,
        capture_output=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    events, proc = traced(tmp_path, ferry_home, "claim")
    assert proc.returncode == 0, proc.stderr
    check_order(events, probe)


def _synthetic(sync_first: bool) -> str:
    """A minimal trace of a run; ``sync_first=False`` spawns before the fsync returns."""
    batch = 'write(4, "{\\"type\\":\\"SUBMITTED\\"}\\n{\\"type\\":\\"DISPATCHING\\"}\\n", 60) = 60'
    sync = "fdatasync(4)      = 0"
    spawn = ["vfork( <unfinished ...>",
             '@execve("/bin/echo", ["/bin/echo", "PROBE"], 0x1 /* 3 vars */) = 0',
             "<... vfork resumed>) = 11"]  # fmt: skip
    ferry_lines = [batch, *([sync, *spawn] if sync_first else [*spawn, sync])]
    ferry_lines += [
        'write(4, "{\\"type\\":\\"SPAWNED\\"}\\n", 20) = 20',
        "fdatasync(4)      = 0",
        "@+++ exited with 0 +++",
        'write(4, "{\\"type\\":\\"SETTLED\\"}\\n", 20) = 20',
        "fdatasync(4)      = 0",
        "+++ exited with 0 +++",
    ]
    lines = ['10 09:00:00.000000 execve("/ferry", ["/ferry", "run", "PROBE"], 0x1) = 0']
    for n, line in enumerate(ferry_lines, start=1):
        pid, text = (11, line[1:]) if line.startswith("@") else (10, line)
        lines.append(f"{pid} 09:00:00.{n:06d} {text}")
    return "\n".join(lines) + "\n"


def test_the_checker_accepts_the_right_order_and_rejects_a_spawn_before_the_sync() -> None:
    check_order(parse(_synthetic(sync_first=True)), "PROBE")
    with pytest.raises(AssertionError, match="DISPATCHING synced at line"):
        check_order(parse(_synthetic(sync_first=False)), "PROBE")


def test_a_new_log_directory_is_synced_before_settled(
    strace_ok: None, tmp_path: Path, ferry_home: Path
) -> None:
    """A task that printed keeps its logs through a power cut once SETTLED is durable:
    the entry of its new logs/<id>/ in logs/ is fsynced before SETTLED is written."""
    probe = f"LOG-DIR-PROBE-{uuid.uuid4().hex}"
    events, proc = traced(
        tmp_path, ferry_home, "run", "--", "/bin/echo", probe, syscalls=SYSCALLS + ",openat"
    )
    assert proc.returncode == 0, proc.stderr
    logs = f'"{ferry_home / "logs"}"'
    # (A call's arguments and its result may be two lines: the supervisor runs beside
    # the launcher, and strace splits a call another process's call interrupts.)
    opened = [
        completion(events, e) for e in events
        if e.name == "openat" and e.entry and logs in e.text and "O_DIRECTORY" in e.text
    ]  # fmt: skip
    settled = only(
        [
            e
            for e in events
            if e.name in ("write", "pwrite64") and e.entry and '\\"type\\":\\"SETTLED\\"' in e.text
        ],
        "SETTLED",
    )
    synced = [
        done for e in events
        if e.name == "fsync" and e.entry
        and any(o.ret == fd_of(e) and o.index < e.index for o in opened)
        and (done := completion(events, e)).ret == 0 and done.index < settled.index
    ]  # fmt: skip
    assert synced, "logs/ was not fsynced before SETTLED was written"
