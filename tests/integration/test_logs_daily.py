"""``ferry logs`` in daily use (contract.md, "Daily use"): the order the task wrote its
stdout and stderr in (the order index beside the logs, ``ferry.proc.logorder``), through
crashes and torn files; ``logs -f`` exits by the task's outcome; Ctrl-C ends it quietly.

The tasks here write one stream, then wait until that write is in its log before they
write the next: the order in which the supervisor reads two pipes is the only order any
two-pipe capture can know, and writes to both streams within one of its wake-ups (a
shell's ``echo a; echo b >&2``, microseconds apart) reach it together.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from clikit import Ferry, wait_until

from ferry.app.logs import print_logs
from ferry.proc.logorder import order_path
from ferry.proc.supervise import SuperviseSpec, supervise

pytestmark = pytest.mark.timeout(120)

# argv: words; one starting with "e" goes to stderr, any other to stdout, each followed
# by "\n", each written once the one before is in its log. "gate:PATH" waits for PATH.
ALTERNATE = r"""
import os, sys, time
home, task, attempt = os.environ["FERRY_HOME"], os.environ["FERRY_TASK_ID"], os.environ["FERRY_ATTEMPT"]
for word in sys.argv[1:]:
    if word.startswith("gate:"):
        while not os.path.exists(word[5:]):
            time.sleep(0.01)
        continue
    fd = 2 if word.startswith("e") else 1
    log = os.path.join(home, "logs", task, attempt + (".stderr" if fd == 2 else ".stdout"))
    size = os.path.getsize(log) if os.path.exists(log) else 0  # (made at its first byte)
    os.write(fd, word.encode() + b"\n")
    while not os.path.exists(log) or os.path.getsize(log) < size + len(word) + 1:
        time.sleep(0.002)
"""


def alternate(*words: str) -> list[str]:
    return [sys.executable, "-c", ALTERNATE, *words]


def logs_to_one_file(ferry: Ferry, tmp_path: Path, *args: str) -> tuple[int, bytes]:
    """``ferry logs ARGS`` with its stdout and stderr both appending to one file: what a
    terminal would show, in the order ferry wrote it."""
    both = tmp_path / "both"
    both.unlink(missing_ok=True)
    with both.open("ab") as sink:
        done = subprocess.run(
            [*ferry.command, "logs", *args], stdout=sink, stderr=sink, stdin=subprocess.DEVNULL,
            env=ferry.env, timeout=ferry.timeout_s, check=False,
        )  # fmt: skip
    return done.returncode, both.read_bytes()


def ran(ferry: Ferry, *words: str) -> str:
    result = ferry.ok("run", "--", *alternate(*words))
    task_id: str = ferry.tasks()[-1]["id"]
    assert result.code == 0
    return task_id


def test_logs_replay_both_streams_in_the_order_the_task_wrote_them(
    ferry: Ferry, tmp_path: Path
) -> None:
    """Before: all of stdout, then all of stderr (o1 o2 o3 e1 e2); --merged did not exist."""
    task_id = ran(ferry, "o1", "e1", "o2", "e2", "o3")
    assert ferry.ok("logs", task_id, "--merged").out == b"o1\ne1\no2\ne2\no3\n"
    # Each stream to its own descriptor, in that order (here both go to one file).
    assert logs_to_one_file(ferry, tmp_path, task_id) == (0, b"o1\ne1\no2\ne2\no3\n")
    plain = ferry.ok("logs", task_id)
    assert (plain.out, plain.err) == (b"o1\no2\no3\n", "e1\ne2\n")
    # --stream still gives one stream, whole.
    assert ferry.ok("logs", task_id, "--stream", "stderr").out == b"e1\ne2\n"
    # --json: the chunks in write order.
    chunks = [json.loads(line) for line in ferry.ok("--json", "logs", task_id).out.splitlines()]
    assert [(c["stream"], c["text"]) for c in chunks] == [
        ("stdout", "o1\n"), ("stderr", "e1\n"), ("stdout", "o2\n"), ("stderr", "e2\n"),
        ("stdout", "o3\n"),
    ]  # fmt: skip
    assert [c["offset"] for c in chunks] == [0, 0, 3, 3, 6]
    # --tail N: the last N lines of each stream, in order.
    assert ferry.ok("logs", task_id, "--tail", "1", "--merged").out == b"e2\no3\n"
    assert ferry.ok("logs", task_id, "--tail", "2", "--merged").out == b"e1\no2\ne2\no3\n"
    ferry.refused(2, "usage.invalid", "logs", task_id, "--merged", "--stream", "stdout")


def test_logs_follow_replays_in_order_and_exits_by_the_outcome(
    ferry: Ferry, tmp_path: Path
) -> None:
    """Before: -f printed stdout's lines as they came and stderr's apart, and exited 0
    whatever the task did."""
    gate = tmp_path / "gate"
    for status, exit_code in ((0, 0), (3, 1)):
        gate.unlink(missing_ok=True)
        argv = alternate("o1", "e1", f"gate:{gate}", "o2", "e2")
        if status:
            argv = ["/bin/sh", "-c", '"$@"; exit 3', "sh", *argv]
        ferry.ok("submit", "--", *argv)
        task_id = ferry.tasks()[-1]["id"]
        worker = ferry.start("work", "--drain", "--poll", "0.05")
        follower = ferry.start("logs", "-f", "--merged", task_id)
        assert follower.stdout is not None
        seen = b""
        while seen != b"o1\ne1\n":  # (before the gate: it is still running)
            seen += os.read(follower.stdout.fileno(), 100)
            assert seen and b"o1\ne1\n".startswith(seen), seen
        gate.touch()
        rest, err = follower.communicate(timeout=60)
        assert (follower.returncode, seen + rest, err) == (exit_code, b"o1\ne1\no2\ne2\n", b"")
        worker.communicate(timeout=60)
        assert ferry.task(task_id)["state"] == ("FAILED" if status else "SUCCEEDED")
    # A settled task: at once, by its outcome; without -f, 0 as before.
    failed = ferry.tasks()[-1]["id"]
    assert ferry("logs", "-f", failed).code == 1
    assert ferry("logs", failed).code == 0


@pytest.mark.parametrize("as_json", [False, True])
def test_logs_follow_goes_on_through_each_retry_and_exits_by_the_last_attempt(
    ferry: Ferry, tmp_path: Path, as_json: bool
) -> None:
    """``--retries 2``: the first two attempts fail, the third succeeds. ``logs -f``
    follows the task to its end, as ``wait`` does, each attempt's output in turn, and
    exits 0 (was: 1 as soon as the first attempt ended; found by a review). The
    follower stopped until the third attempt is done: it still shows the second (a
    review of that fix: it jumped to the latest, and an attempt's output was never
    shown). With ``--json`` each line names its attempt."""
    count = tmp_path / "count"
    script = (
        f"n=$(($(cat {count} 2>/dev/null || echo 0) + 1)); echo $n > {count};"
        ' echo "attempt $n"; [ $n -ge 3 ]'
    )
    gate = tmp_path / "gate"
    script = f"while [ ! -e {gate} ]; do sleep 0.02; done; {script}"
    task_id = ferry.ok(
        "submit", "--retries", "2", "--retry-delay", "0.1", "--", "sh", "-c", script
    ).text.strip()
    follower = ferry.start(*(["--json"] if as_json else []), "logs", "-f", task_id)
    assert follower.stdout is not None
    worker = ferry.start("work", "--drain", "--poll", "0.05")
    wait_until(lambda: ferry.task(task_id)["state"] == "RUNNING", what="the first attempt")
    gate.touch()
    first = os.read(follower.stdout.fileno(), 1000)  # (the first attempt's output, shown)
    os.kill(follower.pid, signal.SIGSTOP)  # (until the last attempt is done)
    try:
        assert worker.wait(timeout=60) == 0
    finally:
        os.kill(follower.pid, signal.SIGCONT)
    rest, err = follower.communicate(timeout=60)
    out = first + rest
    assert follower.returncode == 0, err
    if as_json:
        lines = [json.loads(line) for line in out.splitlines()]
        assert [(c["attempt"], c["text"]) for c in lines] == [
            (1, "attempt 1\n"), (2, "attempt 2\n"), (3, "attempt 3\n")
        ]  # fmt: skip
    else:
        assert out == b"attempt 1\nattempt 2\nattempt 3\n", err
    assert err.decode().count(f"task {task_id} is retried: attempt") == 2
    assert ferry.task(task_id)["state"] == "SUCCEEDED"
    # --attempt 1: that attempt alone, by its end
    assert ferry("logs", "-f", "--attempt", "1", task_id).code == 1


# argv: "o:HEX" or "e:HEX": those bytes to stdout or stderr, each once the one before is
# in its log.
PIECES = r"""
import os, sys, time
home, task, attempt = os.environ["FERRY_HOME"], os.environ["FERRY_TASK_ID"], os.environ["FERRY_ATTEMPT"]
for piece in sys.argv[1:]:
    fd, data = (2 if piece[0] == "e" else 1), bytes.fromhex(piece[2:])
    log = os.path.join(home, "logs", task, attempt + (".stderr" if fd == 2 else ".stdout"))
    size = os.path.getsize(log) if os.path.exists(log) else 0
    os.write(fd, data)
    while not os.path.exists(log) or os.path.getsize(log) < size + len(data):
        time.sleep(0.002)
"""


def test_logs_json_is_byte_exact_whatever_the_chunks(ferry: Ferry) -> None:
    """A character split between two chunks (a write to the other stream between its
    bytes) is one character in ``text``, not two escapes; bytes that are not UTF-8 come
    with ``b64``, the chunk's exact bytes (their ``text`` alone reads like the text
    ``\\xff``: found by a review)."""
    stdout = "price: €".encode(), b" ok\n", b"\xff raw\n"
    pieces = [
        "o:" + stdout[0][:-1].hex(), "e:" + b"between\n".hex(),
        "o:" + (stdout[0][-1:] + stdout[1]).hex(), "e:" + b"again\n".hex(), "o:" + stdout[2].hex(),
    ]  # fmt: skip
    ferry.ok("run", "--", sys.executable, "-c", PIECES, *pieces)
    task_id = ferry.tasks()[-1]["id"]
    chunks = [json.loads(line) for line in ferry.ok("--json", "logs", task_id).out.splitlines()]
    out = [c for c in chunks if c["stream"] == "stdout"]
    assert "".join(c["text"] for c in out[:-1]) == "price: € ok\n"
    assert all("b64" not in c for c in out[:-1])
    assert base64.b64decode(out[-1]["b64"]) == stdout[2] and out[-1]["text"] == "\\xff raw\n"
    exact = b"".join(base64.b64decode(c["b64"]) if "b64" in c else c["text"].encode() for c in out)
    assert exact == b"".join(stdout)
    assert [c["offset"] for c in out] == [0, *(
        sum(len(c["text"].encode()) for c in out[:i]) for i in range(1, len(out))
    )]  # fmt: skip


def test_ctrl_c_on_logs_follow_exits_130_quietly(ferry: Ferry, tmp_path: Path) -> None:
    """Before: 'ferry: error[interrupted]: interrupted' on stderr (exit 130)."""
    gate = tmp_path / "gate"
    runner = ferry.start("run", "--", *alternate("o1", f"gate:{gate}"))
    task_id = wait_until(lambda: ferry.tasks() and ferry.tasks()[-1]["id"], what="the task")
    follower = ferry.start("logs", "-f", task_id)
    assert follower.stdout is not None
    assert os.read(follower.stdout.fileno(), 100) == b"o1\n"  # following now
    follower.send_signal(signal.SIGINT)
    out, err = follower.communicate(timeout=60)
    assert (follower.returncode, out, err) == (130, b"", b"")
    gate.touch()
    assert runner.wait(timeout=60) == 0


# ---- crashes and damaged files -------------------------------------------------------


def order_file(ferry: Ferry, task_id: str) -> Path:
    return ferry.home / "logs" / task_id / "1.order"


def test_a_torn_or_damaged_index_costs_order_never_bytes(ferry: Ferry, tmp_path: Path) -> None:
    """Real logs and index of a task, then damaged as a crash or a bad disk leaves them."""
    task_id = ran(ferry, "o1", "e1", "o2", "e2", "o3")
    index = order_file(ferry, task_id)
    whole = index.read_bytes()
    assert len(whole) == 4 * 16  # o1|e1, e1|o2, o2|e2, e2|o3 (o3: the last run, no entry)
    everything = b"o1\ne1\no2\ne2\no3\n"
    # A torn last entry (a power cut mid-write): ignored.
    index.write_bytes(whole + b"\x00\x07\x00")
    assert ferry.ok("logs", task_id, "--merged").out == everything
    # The index lags the logs (its tail lost): what it orders, then each stream's rest.
    index.write_bytes(whole[:16])
    assert ferry.ok("logs", task_id, "--merged").out == b"o1\no2\no3\ne1\ne2\n"
    assert logs_to_one_file(ferry, tmp_path, task_id)[1] == b"o1\no2\no3\ne1\ne2\n"
    # A flipped bit in the middle entry: that entry is skipped, the others kept.
    damaged = bytearray(whole)
    damaged[16 + 4] ^= 0x01
    index.write_bytes(bytes(damaged))
    assert ferry.ok("logs", task_id, "--merged").out == b"o1\no2\ne1\ne2\no3\n"
    # Entries past the logs' ends (bytes a power cut took): as much as the logs hold.
    index.write_bytes(whole)
    log = ferry.home / "logs" / task_id / "1.stdout"
    log.write_bytes(b"o1\n")
    assert ferry.ok("logs", task_id, "--merged").out == b"o1\ne1\ne2\n"
    # No index (logs written before it existed): stdout, then stderr, as before.
    log.write_bytes(b"o1\no2\no3\n")
    index.unlink()
    assert ferry.ok("logs", task_id, "--merged").out == b"o1\no2\no3\ne1\ne2\n"
    result = ferry.ok("logs", task_id)
    assert (result.out, result.err) == (b"o1\no2\no3\n", "e1\ne2\n")


@pytest.mark.parametrize("point", ["before:log_order", "after:log_order"])
def test_a_supervisor_killed_between_a_chunk_and_its_index_entry_loses_nothing(
    ferry: Ferry, point: str
) -> None:
    """kill -9 of the supervisor at the third switch between the streams (o2 is logged;
    before: its entry not written; after: written, e2 not yet logged): every logged
    byte is shown, in the order written."""
    runner = ferry.start(
        "run", "--", *alternate("o1", "e1", "o2", "e2", "o3"),
        failpoints=f"supervisor:{point}=3=self",
    )  # fmt: skip
    _, err = runner.communicate(timeout=60)
    assert runner.returncode == 3 and "supervisor.died" in err.decode(), err
    task_id = ferry.tasks()[-1]["id"]
    assert ferry.ok("logs", task_id, "--merged").out == b"o1\ne1\no2\n"
    result = ferry.ok("logs", task_id)
    assert (result.out, result.err) == (b"o1\no2\n", "e1\n")
    entries = 2 if point.startswith("before") else 3
    assert len(order_file(ferry, task_id).read_bytes()) == entries * 16


def test_a_task_run_again_under_the_same_attempt_keeps_the_earlier_run_first(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    """A task released and run again keeps its attempt, and its logs are appended to.
    The first run ends in a run of stdout (o2) that no entry names; the second starts
    with stderr: its bytes must still come after o2 (before: e3 came before o2)."""
    logs = tmp_path / "logs" / "t"
    logs.mkdir(parents=True)
    env = {**os.environ, "FERRY_HOME": str(tmp_path), "FERRY_TASK_ID": "t", "FERRY_ATTEMPT": "1"}
    stdout_log, stderr_log = logs / "1.stdout", logs / "1.stderr"
    for words in (("o1", "e1", "o2"), ("e3", "o4")):
        spec = SuperviseSpec(
            argv=alternate(*words), cwd=str(tmp_path), env=env, timeout_s=None,
            kill_grace_s=5.0, heartbeat_s=5.0, stdout_log=stdout_log, stderr_log=stderr_log,
            heartbeat_path=tmp_path / "hb", passthrough=False, order_log=order_path(stdout_log),
        )  # fmt: skip
        assert supervise(spec, on_spawned=lambda pid, pgid: None).exit_code == 0
    print_logs((stdout_log, stderr_log), stream=None, tail=None, follow=False,
               settled=lambda: True, as_json=False, merged=True)  # fmt: skip
    assert capsysbinary.readouterr().out == b"o1\ne1\no2\ne3\no4\n"


def test_read_tails_keeps_the_last_bytes_of_each_stream_and_its_size(tmp_path: Path) -> None:
    """What a shared database keeps of a log for other hosts (ferry.app.logs.read_tails):
    the last bytes of data of each stream that exists, and the log's whole size."""
    from ferry.app.logs import read_tails

    out, err = tmp_path / "1.stdout", tmp_path / "1.stderr"
    out.write_bytes(b"0123456789" * 10)
    assert read_tails((out, err), 16) == {"stdout": (b"4567890123456789", 100)}
    err.write_bytes(b"short\n")
    assert read_tails((out, err), 16)["stderr"] == (b"short\n", 6)
    with out.open("r+b") as f:  # a hole (as --log-max leaves one), then more data
        f.seek(1 << 20)
        f.write(b"end\n")
    data, size = read_tails((out, err), 1 << 16)["stdout"]
    assert size == (1 << 20) + 4 and data.endswith(b"end\n") and len(data) <= 1 << 16


def test_a_stream_that_wrote_nothing_has_no_file_and_is_not_called_missing(ferry: Ferry) -> None:
    """A log is made at its stream's first byte: a silent task leaves no file (nor a
    directory), and ``logs`` does not call that loss. The evidence (``log_bytes``) says
    which streams wrote, so a log that did write and is gone is still reported."""
    silent = ferry.json("run", "--", "true")
    assert silent["evidence"]["log_bytes"] == {"stdout": 0, "stderr": 0}
    assert not (ferry.home / "logs" / silent["id"]).exists()
    shown = ferry("logs", silent["id"])
    assert (shown.code, shown.out, shown.err) == (0, b"", "")
    noisy = ferry.json("run", "--", "sh", "-c", "echo only-stderr >&2")
    assert noisy["evidence"]["log_bytes"] == {"stdout": 0, "stderr": 12}
    assert os.listdir(ferry.home / "logs" / noisy["id"]) == ["1.stderr"]
    shown = ferry("logs", noisy["id"])
    assert (shown.code, shown.out, shown.err) == (0, b"", "only-stderr\n")
    (ferry.home / "logs" / noisy["id"] / "1.stderr").unlink()  # lost by hand
    shown = ferry("logs", noisy["id"])
    assert "missing: 1.stderr" in shown.err and "1.stdout" not in shown.err


def test_a_silent_task_settled_by_recovery_is_not_called_missing(
    ferry: Ferry, tmp_path: Path
) -> None:
    """Recovery's SETTLED has no ``log_bytes``; what its evidence salvaged says which
    logs were there (found by a review: a silent task failed by recovery was warned
    about two missing logs)."""
    killed = ferry("run", "--", "sh", "-c", "exec sleep 300", failpoints="after:SPAWNED")
    assert killed.code == -9
    [task] = ferry.tasks()
    os.kill(int(task["pid"]), signal.SIGKILL)
    wait_until(lambda: ferry.json("show", task["id"])["runner"]["alive"] is False, what="dead")
    ferry("recover")
    decided = ferry.task(task["id"])
    assert decided["state"] == "FAILED" and "log_bytes" not in decided["evidence"]
    shown = ferry("logs", task["id"])
    assert (shown.out, shown.err) == (b"", "")
