"""``ferry work`` as a user watches it (issue 17): one line per settled task on stderr,
a summary when it ends, a live progress line on a terminal, JSON Lines with ``--json``;
``--drain`` exits 1 unless every task it settled SUCCEEDED; ``--halt soon|now``.

Before this, ``ferry work -j 2 --drain`` over four tasks of which three failed printed
nothing and exited 0.
"""

from __future__ import annotations

import contextlib
import os
import pty
import re
import select
import signal
import subprocess
from pathlib import Path

import orjson
import pytest
from clikit import Ferry, finish, read_until, wait_until
from crashkit import counting_task, runs, wait_task_gone

from ferry.storage.local.store import SNAPSHOT_TAIL_RECORDS

pytestmark = pytest.mark.timeout(120)

SUMMARY = re.compile(r"^(\d+) succeeded(?:, (\d+) failed)?(?:, (\d+) cancelled)? in \d+\.\d s$")


def submit(ferry: Ferry, *argv: str, options: tuple[str, ...] = ()) -> str:
    task: dict[str, str] = orjson.loads(ferry.ok("--json", "submit", *options, "--", *argv).text)
    return task["id"]


def four_tasks_three_fail(ferry: Ferry) -> dict[str, str]:
    """Task id -> the state it ends in: one succeeds, three fail (an exit status of 1,
    of 3, a command that cannot be found)."""
    return {
        submit(ferry, "true"): "SUCCEEDED",
        submit(ferry, "false"): "FAILED",
        submit(ferry, "/bin/sh", "-c", "exit 3"): "FAILED",
        submit(ferry, "/nonexistent/command"): "FAILED",
    }


def gated(gate: Path) -> tuple[str, ...]:
    """argv of a task that runs until ``gate`` exists, then succeeds."""
    return ("/bin/sh", "-c", f'while [ ! -e "{gate}" ]; do sleep 0.02; done')


def test_drain_exits_1_says_what_each_task_did_and_sums_up(ferry: Ferry) -> None:
    expected = four_tasks_three_fail(ferry)
    result = ferry("work", "-j", "2", "--drain")
    assert result.code == 1, result
    assert result.out == b""
    lines = result.err.splitlines()
    assert len(lines) == 5, result.err  # one per task, then the summary; nothing else
    by_task = {line.split()[1]: line for line in lines[:4]}  # (#number, id, state, ...)
    assert sorted(by_task) == sorted(expected)
    for task_id, state in expected.items():
        assert by_task[task_id].split()[2] == state, by_task[task_id]
    assert sorted(line.split()[0] for line in lines[:4]) == ["#1", "#2", "#3", "#4"]
    exits = {task_id: ferry.task(task_id)["exit_code"] for task_id in expected}
    for task_id, code in exits.items():
        if code is not None:
            assert f"exit {code}" in by_task[task_id]
    assert "SPAWN_FAILED" in by_task[next(t for t, c in exits.items() if c is None)]
    assert "/bin/sh -c exit 3" in "\n".join(lines)  # the command, for want of a name
    match = SUMMARY.match(lines[-1])
    assert match is not None, lines[-1]
    assert match.groups() == ("1", "3", None)


def test_drain_exits_0_when_every_task_succeeded(ferry: Ferry) -> None:
    named = submit(ferry, "true", options=("--name", "the first"))
    submit(ferry, "true")
    result = ferry.ok("work", "--drain")
    lines = result.err.splitlines()
    assert len(lines) == 3, result.err
    assert lines[0].split()[:2] == ["#1", named] and lines[0].endswith("the first")
    match = SUMMARY.match(lines[-1])
    assert match is not None and match.groups() == ("2", None, None), lines[-1]


def test_quiet_prints_nothing_and_the_exit_status_still_tells(ferry: Ferry) -> None:
    four_tasks_three_fail(ferry)
    result = ferry("-q", "work", "-j", "2", "--drain")
    assert (result.code, result.out, result.err) == (1, b"", ""), result


def test_json_prints_each_settled_task_s_object_as_a_json_line(ferry: Ferry) -> None:
    expected = four_tasks_three_fail(ferry)
    result = ferry("--json", "work", "-j", "2", "--drain")
    assert result.code == 1, result
    objects = [orjson.loads(line) for line in result.out.splitlines()]
    assert sorted(obj["id"] for obj in objects) == sorted(expected)
    for obj in objects:
        assert obj == ferry.task(obj["id"])  # the object `ferry show --json` prints
    assert {obj["id"]: obj["state"] for obj in objects} == expected


def test_a_worker_without_drain_prints_each_end_and_exits_0_when_stopped(ferry: Ferry) -> None:
    failing = submit(ferry, "false")
    proc = ferry.start("work", "--poll", "0.05")
    seen = read_until(proc, failing)
    proc.send_signal(signal.SIGTERM)
    code, rest = finish(proc)
    assert code == 0, seen + rest
    line = next(line for line in (seen + rest).splitlines() if failing in line.split())
    assert line.split()[2:5] == ["FAILED", "exit", "1"], line
    assert "\x1b[K" not in seen + rest  # no progress line: stderr is not a terminal


def test_a_long_lived_worker_compacts_so_that_commands_beside_it_stay_cheap(
    ferry: Ferry, tmp_path: Path
) -> None:
    """Every command folds the journal's records after its last snapshot at start-up.
    ``work`` compacted only when it ended, so beside a worker that had run 2,000 tasks
    an ``ls`` took 205 ms (49 ms once it had exited), growing with every task. Now it
    compacts between its turns when due, as ``run`` does after its task."""
    tasks = tmp_path / "tasks.jsonl"
    count = SNAPSHOT_TAIL_RECORDS // 4  # five records each once run: past the threshold
    tasks.write_text('{"argv": ["true"]}\n' * count)
    ferry.ok("submit", "--from", str(tasks))
    proc = ferry.start("-q", "work", "-j", "2", "--poll", "0.05")
    journal_dir = ferry.home / "journal"
    done = lambda: ferry.json("ls", "--state", "SUCCEEDED", "--limit", "0")  # noqa: E731
    wait_until(lambda: len(done()) == count, what="every task to succeed", timeout_s=120)
    wait_until(lambda: list(journal_dir.glob("snapshot-*")), what="work to compact")
    assert proc.poll() is None  # (while it runs on)
    proc.send_signal(signal.SIGTERM)
    code, err = finish(proc)
    assert code == 0, err


def test_halt_soon_stops_claiming_after_the_first_failure_and_lets_running_tasks_end(
    ferry: Ferry, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    running = submit(ferry, *gated(gate))
    failing = submit(ferry, "false")
    later = submit(ferry, *counting_task(tmp_path / "later"))
    proc = ferry.start("work", "-j", "2", "--drain", "--halt", "soon", "--poll", "0.05")
    try:
        wait_until(lambda: ferry.task(failing)["state"] == "FAILED", what="the failure")
    finally:
        gate.touch()  # the running task may now finish: --halt soon lets it
    code, err = finish(proc)
    assert code == 1, err
    states = {t["id"]: t["state"] for t in ferry.tasks()}
    assert states == {running: "SUCCEEDED", failing: "FAILED", later: "QUEUED"}
    assert runs(tmp_path / "later") == 0  # never started
    match = SUMMARY.match(err.splitlines()[-1])
    assert match is not None and match.groups() == ("1", "1", None), err
    ferry.verify_clean()


def test_halt_now_also_cancels_the_running_tasks(ferry: Ferry, tmp_path: Path) -> None:
    """At once (not at the running task's next heartbeat, 600 s away): CANCELLED, for
    the user asked for it; its evidence names the failure that halted the worker."""
    running = submit(ferry, "sleep", "600", options=("--heartbeat", "600"))
    failing = submit(ferry, "false")
    later = submit(ferry, *counting_task(tmp_path / "later"))
    result = ferry("work", "-j", "2", "--drain", "--halt", "now", "--poll", "0.05")
    assert result.code == 1, result
    stopped = ferry.task(running)
    assert (stopped["state"], stopped["reason"], stopped["signal"]) == (
        "CANCELLED",
        "CANCELLED_BY_USER",
        15,
    )
    assert stopped["evidence"]["halted_after"] == failing
    assert ferry.task(failing)["state"] == "FAILED"
    assert ferry.task(later)["state"] == "QUEUED" and runs(tmp_path / "later") == 0
    wait_task_gone(running)
    match = SUMMARY.match(result.err.splitlines()[-1])
    assert match is not None and match.groups() == ("0", "1", "1"), result.err
    ferry.verify_clean()


def test_a_terminal_gets_a_live_progress_line_redrawn_in_place(
    ferry: Ferry, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    ids = [submit(ferry, *gated(gate)), submit(ferry, "false"), submit(ferry, "true")]
    primary, secondary = pty.openpty()
    proc = subprocess.Popen(
        [*ferry.command, "work", "-j", "1", "--drain", "--poll", "0.05"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=secondary,
        env={**ferry.env, "TERM": "xterm"},
        start_new_session=True,
    )
    ferry.background.append(proc)
    os.close(secondary)
    seen = bytearray()

    def read_some() -> bool:
        """Whatever the terminal has now; True once the other side is closed."""
        ready, _, _ = select.select([primary], [], [], 0.05)
        if not ready:
            return False
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # EIO: every writer closed the terminal
            return True
        seen.extend(chunk)
        return not chunk

    try:
        wait_until(lambda: read_some() or b"0/3 done" in seen, what="the progress line")
        assert b"0/3 done" in seen, bytes(seen)
        gate.touch()
        wait_until(lambda: read_some() and proc.poll() is not None, what="the worker's end")
    finally:
        gate.touch()  # (a failed test leaves no task running: the drain ends them all)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=60)
        os.close(primary)
    assert proc.wait(timeout=30) == 1
    text = bytes(seen).decode()
    assert re.search(r"0/3 done, \d running", text), text
    # Redrawn in place: each redraw returns to the line's start and clears it.
    assert text.count("\r\x1b[K") >= 2, text
    for task_id in ids:
        assert task_id in text
    # The progress line is cleared for good before the summary, the last thing said.
    after_last_clear = text[text.rindex("\x1b[K") + len("\x1b[K") :]
    assert SUMMARY.match(after_last_clear.strip()) is not None, text
