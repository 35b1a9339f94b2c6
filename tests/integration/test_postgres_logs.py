"""Logs on a shared database (contract.md, "Many machines"): the whole log stays on the
host that ran the task; the database keeps the last 64 KiB of each stream, written in
the transaction of the task's SETTLED, so that ``ferry logs`` on another host shows
that tail and says on which host the whole log is."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from clikit import Hosts, finish, wait_until

pytestmark = pytest.mark.timeout(120)

TAIL_BYTES = 64 * 1024
# A task writing 200,000 numbered lines (about 1.3 MB) to stdout and two to stderr.
NOISY = ["/bin/sh", "-c", "seq 1 200000; echo first >&2; echo second >&2"]


def _expected_stdout() -> bytes:
    return "".join(f"{n}\n" for n in range(1, 200001)).encode()


def test_logs_on_another_host_show_the_tail_kept_with_the_end(hosts: Hosts) -> None:
    hosts("a").ok("run", "--", *NOISY)
    [task] = hosts("b").tasks()
    result = hosts("b").ok("logs", task["id"])
    assert result.out == _expected_stdout()[-TAIL_BYTES:]
    assert result.err.startswith("first\nsecond\n")
    assert "host a" in result.err  # where the whole log is, and what is shown of it
    assert f"the last {TAIL_BYTES:,} bytes of stdout's {len(_expected_stdout()):,}" in result.err
    assert hosts("a").ok("logs", task["id"]).out == _expected_stdout()  # whole, there


def test_the_tail_on_another_host_takes_the_usual_options(hosts: Hosts) -> None:
    hosts("a").ok("run", "--", *NOISY)
    [task] = hosts("b").tasks()
    b = hosts("b")
    assert b.ok("logs", "--stream", "stderr", task["id"]).out == b"first\nsecond\n"
    assert b.ok("logs", "--tail", "2", task["id"]).out == b"199999\n200000\n"
    lines = [orjson.loads(line) for line in b.ok("--json", "logs", task["id"]).out.splitlines()]
    assert {line["stream"] for line in lines} == {"stdout", "stderr"}
    assert "".join(line["text"] for line in lines if line["stream"] == "stderr") == (
        "first\nsecond\n"
    )


def test_a_small_log_is_kept_whole(hosts: Hosts) -> None:
    hosts("a").ok("run", "--", "echo", "hello")
    [task] = hosts("b").tasks()
    result = hosts("b").ok("logs", task["id"])
    assert result.out == b"hello\n"
    assert "host a" in result.err


def test_a_task_still_running_on_another_host_has_no_tail_yet(hosts: Hosts, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    a = hosts("a")
    waits = f'echo started; while [ ! -e "{gate}" ]; do sleep 0.05; done'
    proc = a.start("run", "--", "/bin/sh", "-c", waits)
    try:
        wait_until(lambda: a.tasks() and a.tasks()[0]["state"] == "RUNNING", what="the task")
        [task] = hosts("b").tasks()
        result = hosts("b").refused(5, "logs.other_host", "logs", task["id"])
        assert "host a" in result.err
    finally:
        gate.touch()
        finish(proc)
    result = hosts("b").ok("logs", task["id"])  # settled: its tail is kept now
    assert result.out == b"started\n"


def test_a_task_that_wrote_nothing_shows_nothing_on_another_host(hosts: Hosts) -> None:
    """A log is made at its stream's first byte: a silent task leaves neither a file on
    its host nor a tail in the database. Its end says it wrote nothing (``log_bytes``),
    so ``logs`` elsewhere shows nothing and exits by its state (found by a review: it
    said 'its log is there', exit 5)."""
    hosts("a").ok("run", "--", "true")
    [task] = hosts("b").tasks()
    result = hosts("b").ok("logs", task["id"])
    assert (result.out, result.err) == (b"", "")


def test_json_chunks_on_another_host_carry_their_offsets_and_say_what_is_not_here(
    hosts: Hosts,
) -> None:
    """``logs --json`` elsewhere (a review): the tail's chunks said offset 0 and no
    attempt, and nothing said the stream's first bytes were missing, so a script that
    places chunks by offset built a wrong stream. Each chunk is at its offset in the
    stream now, with its attempt, after a ``dropped`` line for what only the task's
    host keeps (as ``--log-max``'s hole is said)."""
    hosts("a").ok("run", "--", *NOISY)
    [task] = hosts("b").tasks()
    lines = [
        orjson.loads(line) for line in hosts("b").ok("--json", "logs", task["id"]).out.splitlines()
    ]
    stdout = [line for line in lines if line["stream"] == "stdout"]
    size = len(_expected_stdout())
    assert stdout[0] == {
        "task": task["id"], "attempt": 1, "stream": "stdout", "offset": 0,
        "dropped": size - TAIL_BYTES,
    }  # fmt: skip
    rebuilt = bytearray(size)
    for chunk in stdout[1:]:
        assert chunk["attempt"] == 1 and chunk["task"] == task["id"]
        data = chunk["text"].encode()
        rebuilt[chunk["offset"] : chunk["offset"] + len(data)] = data
    assert bytes(rebuilt[size - TAIL_BYTES :]) == _expected_stdout()[-TAIL_BYTES:]
    assert sum(len(chunk["text"]) for chunk in stdout[1:]) == TAIL_BYTES


def test_the_tail_of_a_log_max_log_kept_elsewhere_is_its_last_bytes_only(hosts: Hosts) -> None:
    """A ``--log-max`` log has a hole between its head and its tail: the database kept
    the last 64 KiB of data across it (head and tail glued, shown as one stretch). It
    keeps the data after the hole: what another host shows is at its true offsets."""
    hosts("a").ok("run", "--log-max", "40K", "--", *NOISY)
    [task] = hosts("b").tasks()
    lines = [
        orjson.loads(line) for line in hosts("b").ok("--json", "logs", task["id"]).out.splitlines()
    ]
    stdout = [line for line in lines if line["stream"] == "stdout"]
    whole = _expected_stdout()
    assert stdout[0]["dropped"] == stdout[1]["offset"] > 0
    for chunk in stdout[1:]:
        data = chunk["text"].encode()
        assert whole[chunk["offset"] : chunk["offset"] + len(data)] == data
    assert stdout[-1]["offset"] + len(stdout[-1]["text"]) == len(whole)
    kept = len(whole) - stdout[0]["dropped"]
    said = hosts("b").ok("logs", task["id"]).err
    assert f"the last {kept:,} bytes of stdout's {len(whole):,}" in said, said
