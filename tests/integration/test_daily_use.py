"""Daily use (contract.md, "Daily use"): what pueue and GNU parallel users stumbled on."""

from __future__ import annotations

import fcntl
import os
import shlex
import shutil
import subprocess
from typing import Any

import pytest
from clikit import Ferry

pytestmark = pytest.mark.timeout(120)


def test_json_after_the_command_works_like_before_it(ferry: Ferry) -> None:
    ferry.ok("submit", "--", "true")
    assert ferry.ok("ls", "--json").json() == ferry.ok("--json", "ls").json()
    [task] = ferry.ok("ls", "--json").json()
    assert ferry.ok("show", task["id"], "--json").json()["id"] == task["id"]
    # After --, it is the task's own argument.
    out = ferry.ok("run", "--", "echo", "--json").out
    assert out == b"--json\n"


def test_ls_lists_in_submission_order_and_says_when_rows_are_left_out(ferry: Ferry) -> None:
    """Ids made in one millisecond sort at random: a --from batch must still list in
    the order of its lines."""
    lines = b"".join(b'{"argv": ["echo", "%d"]}\n' % n for n in range(30))
    ferry.ok("submit", "--from", "-", stdin=lines)
    listed = [task["argv"][1] for task in ferry.json("ls", "--limit", "0")]
    assert listed == [str(n) for n in range(30)]
    result = ferry.ok("ls", "--limit", "5")
    assert [line.split()[-1] for line in result.out.decode().splitlines()[1:]] == [
        "25", "26", "27", "28", "29",
    ]  # fmt: skip
    assert "5 of 30 shown; --limit 0 for all" in result.err
    assert "shown" not in ferry.ok("ls", "--limit", "0").err
    assert "shown" not in ferry.ok("-q", "ls", "--limit", "5").err


def test_submit_lines_queues_one_shell_command_per_line(ferry: Ferry, tmp_path: Any) -> None:
    out = tmp_path / "out"
    text = f"echo one >> {out}\n\n   \necho two && echo three >> {out}\r\n".encode()
    ids = ferry.ok("submit", "--idempotent", "--lines", "-", stdin=text).out.split()
    assert len(ids) == 2
    tasks = ferry.tasks()
    assert [(t["argv"], t["shell"], t["idempotent"]) for t in tasks] == [
        ([f"echo one >> {out}"], True, True),
        ([f"echo two && echo three >> {out}"], True, True),
    ]
    ferry.ok("work", "--drain")
    assert out.read_text() == "one\nthree\n"


def test_submit_lines_refuses_a_key_and_an_empty_file_queuing_nothing(ferry: Ferry) -> None:
    ferry.refused(2, "usage.key_with_lines", "submit", "--key", "k", "--lines", "-",
                  stdin=b"true\nfalse\n")  # fmt: skip
    ferry.refused(2, "usage.bad_lines", "submit", "--lines", "-", stdin=b"\n  \n")
    ferry.refused(2, "usage.bad_lines", "submit", "--lines", "-", stdin=b"echo \xff\n")
    assert ferry.tasks() == []


def test_a_shell_command_given_as_one_argument_is_refused_with_a_hint(
    ferry: Ferry, tmp_path: Any
) -> None:
    for command in ("make test && make dist", "echo $HOME", "ls | wc -l", "sleep 1"):
        result = ferry.refused(2, "usage.looks_like_shell", "submit", "--", command)
        assert "--shell" in result.err
    assert ferry.tasks() == []
    assert ferry("run", "--", "echo $HOME").code == 127  # run says so at once anyway
    ferry.ok("submit", "--shell", "--", "make test && make dist")
    script = tmp_path / "my script"  # a real file with a space in its name is fine
    script.write_text("#!/bin/sh\necho ok\n")
    script.chmod(0o755)
    assert ferry.ok("submit", "--", str(script)).out


def test_the_small_stumbles(ferry: Ferry) -> None:
    """Each of issue 17's small things, as a user met it."""
    # --from errors name the line (after blank lines too), in JSON's words.
    bad = b'{"argv": ["true"]}\n\n\n{"argv": []}\n'
    result = ferry.refused(2, "usage.missing_command", "submit", "--from", "-", stdin=bad)
    assert "line 4 of <stdin>" in result.err and "after --" not in result.err
    result = ferry.refused(2, "usage.bad_from_line", "submit", "--from", "-",
                           stdin=b'{"argv": ["true"], "max_releases": null}\n')  # fmt: skip
    assert "max_releases must be a number, not null" in result.err and "None" not in result.err
    # A usage error points at the help of the command that refused.
    result = ferry.refused(2, "usage.invalid", "journal", "dump", "--from", "0")
    assert "(see 'ferry journal dump --help')" in result.err
    # --timeout's help states the real limit.
    assert "315360000" in ferry.ok("submit", "--help").out.decode()
    # An id that is not UTF-8, or very long, is echoed readably and briefly.
    result = ferry.refused(5, "task.not_found", "show", b"\xff")
    assert "'\\xff'" in result.err and "udc" not in result.err
    result = ferry.refused(5, "task.not_found", "show", "a" * 100_000)
    assert len(result.err) < 200
    # retry of a task not settled says so.
    task_id = ferry.ok("submit", "--", "true").out.decode().strip()
    result = ferry.refused(1, "task.not_retryable", "retry", task_id)
    assert "QUEUED -> QUEUED" not in result.err
    # ls --state twice lists both states.
    ferry.ok("run", "--", "false", codes=(1,))
    states = {t["state"] for t in ferry.json("ls", "--state", "QUEUED", "--state", "failed")}
    assert states == {"QUEUED", "FAILED"}


def test_task_numbers_and_last_name_tasks_and_survive_compaction(ferry: Ferry) -> None:
    first = ferry.ok("submit", "--", "true").out.decode().strip()
    lines = b'{"argv": ["echo", "x"]}\n' * 3
    ferry.ok("submit", "--from", "-", stdin=lines)
    assert [t["number"] for t in ferry.tasks()] == [1, 2, 3, 4]
    assert ferry.task("1")["id"] == first
    assert ferry.task("last")["number"] == 4
    ferry.ok("work", "--drain")
    ferry.ok("journal", "compact")
    assert ferry.task("1")["id"] == first  # (now from the archive)
    fifth = ferry.ok("submit", "--", "true").out.decode().strip()
    assert ferry.task("last")["id"] == fifth and ferry.task("5")["id"] == fifth
    ferry.refused(5, "task.not_found", "show", "6")
    assert ferry.ok("ls").out.decode().splitlines()[1].split()[0] == "1"


# ---- the audit of issue 17: what still stumbled ---------------------------------------

NOT_UTF8 = b"\xff"


@pytest.mark.parametrize(
    ("args", "exit_code", "code"),
    [
        ((b"submit", b"--after", NOT_UTF8, b"--", b"true"), 5, "task.unknown_dependency"),
        ((b"submit", b"--name", NOT_UTF8, b"--", b"true"), 2, "usage.bad_name"),
        ((b"submit", b"--key", NOT_UTF8, b"--", b"true"), 2, "usage.bad_key"),
        ((b"submit", b"--env", NOT_UTF8, b"--", b"true"), 2, "usage.bad_env"),
        ((b"submit", b"--log-max", NOT_UTF8, b"--", b"true"), 2, "usage.bad_size"),
        ((b"submit", b"--group", NOT_UTF8, b"--", b"true"), 2, "usage.bad_group"),
        ((b"gc", b"--older-than", NOT_UTF8), 2, "usage.bad_duration"),
        ((b"ls", b"--state", NOT_UTF8), 2, "usage.invalid"),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_input_that_is_not_utf8_is_echoed_as_its_bytes_and_never_a_traceback(
    ferry: Ferry, args: tuple[bytes, ...], exit_code: int, code: str
) -> None:
    """``show $'\\xff'`` echoed ``\\udcff``: so did every other message, and under --json
    the error object could not even be written (a traceback, exit 1)."""
    result = ferry.refused(exit_code, code, *args)
    assert "\\xff" in result.err and "udc" not in result.err, result.err
    result = ferry.refused(exit_code, code, b"--json", *args)
    error = result.json()["error"]
    assert error["code"] == code and "udc" not in result.text, result.text
    assert ferry.tasks() == []


def test_a_report_written_to_a_path_that_is_not_utf8_says_so_in_json(
    ferry: Ferry, tmp_path: Any
) -> None:
    page = bytes(tmp_path) + b"/report-\xff.html"
    written = ferry.ok(b"--json", b"report", b"--html", page).json()
    assert written["path"].endswith("report-\\xff.html") and written["tasks"] == 0


def test_an_after_that_names_no_task_is_echoed_briefly(ferry: Ferry) -> None:
    result = ferry.refused(5, "task.unknown_dependency", "submit", "--after", "a" * 100_000,
                           "--", "true")  # fmt: skip
    assert len(result.err) < 300, len(result.err)


def test_from_errors_speak_json_and_name_the_line_the_same_way(ferry: Ferry) -> None:
    cases = [
        (b'{"argv": ["true"], "env": {"A": null}}\n', "usage.bad_env", "null"),
        (b'{"argv": ["true"], "priority": 1.5}\n', "usage.bad_from_line", "an integer"),
        (b'{"argv": ["true"], "max_releases": 2.5}\n', "usage.bad_from_line", "an integer"),
        # (was "not 1000": 1000 is an integer; a review)
        (b'{"argv": ["true"], "priority": 1e3}\n', "usage.bad_from_line", "not 1000.0"),
        (b"\n\nnot json\n", "usage.bad_from_line", "not JSON"),
        (b'{"argv": ["true"]}\n\n[1]\n', "usage.bad_from_line", "a JSON object"),
        (b'{"argv": ["true"], "bogus": 1}\n', "usage.bad_from_line", "bogus"),
    ]
    for lines, code, says in cases:
        line = len(lines.rstrip(b"\n").split(b"\n"))
        result = ferry.refused(2, code, "submit", "--from", "-", stdin=lines)
        assert f": error[{code}]: line {line} of <stdin>: " in result.err, result.err
        assert says in result.err, result.err
        assert "None" not in result.err and "not a number" not in result.err, result.err
        assert "--env" not in result.err, result.err  # (a --from line has no options)
    assert ferry.tasks() == []


def test_retry_of_a_task_that_succeeded_says_so_in_words(ferry: Ferry) -> None:
    ferry.ok("run", "--", "true")
    result = ferry.refused(1, "task.illegal_transition", "retry", "last")
    assert "SUCCEEDED" in result.err and "->" not in result.err, result.err


def test_a_name_is_not_an_id_and_the_error_says_which_task_has_it(ferry: Ferry) -> None:
    ferry.ok("submit", "--", "true")
    ferry.ok("submit", "--name", "item-3", "--", "true")
    result = ferry.refused(5, "task.not_found", "show", "item-3")
    assert "task #2 is named so" in result.err and "give the number" in result.err, result.err
    ferry.ok("submit", "--name", "item-3", "--", "true")
    result = ferry.refused(5, "task.not_found", "logs", "item-3")
    assert "tasks #2, #3 are named so" in result.err, result.err
    result = ferry.refused(5, "task.not_found", "cancel", "item-4")
    assert "#" not in result.err, result.err  # (no task has that name: nothing to add)


def test_claim_on_an_empty_queue_can_exit_as_told_so_a_loop_ends(ferry: Ferry) -> None:
    """``while ferry claim; do :; done`` spun for ever on an empty queue (exit 0, as the
    contract says for cron). ``--empty-exit N`` (flock's ``-E``) makes it N."""
    assert ferry("claim").code == 0
    assert ferry("claim", "--empty-exit", "3").code == 3
    assert ferry.ok("--json", "claim", "--empty-exit", "3", codes=(3,)).json() == {"task": None}
    for argv in (["true"], ["false"]):
        ferry.ok("submit", "--", *argv)
    loop = (
        f'ferry() {{ {shlex.join(ferry.command)} "$@"; }}; n=0; '
        "while ferry claim --empty-exit 100; [ $? -ne 100 ]; do n=$((n+1)); done; echo $n"
    )
    result = subprocess.run(["/bin/sh", "-c", loop], env=ferry.env, capture_output=True,
                            timeout=60, check=False)  # fmt: skip
    assert result.stdout == b"2\n", result
    assert [t["state"] for t in ferry.tasks()] == ["SUCCEEDED", "FAILED"]
    # As run, a line for a task that did not succeed (was none: found by a review).
    failed = ferry.tasks()[-1]["id"]
    assert f"task #2 {failed} failed: EXIT_NONZERO (exit 1)" in result.stderr.decode()


@pytest.mark.parametrize("command", ["verify", "dump"])
def test_verify_or_dump_of_a_home_that_is_not_there_says_so(
    ferry: Ferry, tmp_path: Any, command: str
) -> None:
    """``ferry --home TYPO journal verify || alert`` never alerted: exit 0, silent (found
    by a review). As ``repair`` and ``compact``: state_dir.missing (5), nothing made."""
    typo = tmp_path / "ferry-hmoe"
    result = ferry.refused(5, "state_dir.missing", "--home", str(typo), "journal", command)
    assert str(typo) in result.err
    assert not typo.exists()


@pytest.mark.parametrize(
    "args",
    [("cancel", "1"), ("retry", "1"), ("kill", "1"), ("resolve", "1", "--as", "failed"),
     ("cancel", "1", "2"), ("cancel", "--state", "QUEUED"), ("retry", "--state", "FAILED")],
    ids=" ".join,
)  # fmt: skip
def test_acting_on_tasks_of_a_home_that_is_not_there_makes_no_home(
    ferry: Ferry, tmp_path: Any, args: tuple[str, ...]
) -> None:
    """``--home`` with a typo made the whole state directory, for ls (fixed before)
    and still for cancel, retry, kill and resolve: commands whose tasks cannot be in a
    directory that does not exist."""
    typo = tmp_path / "ferry-hmoe"
    result = ferry("--home", str(typo), *args)
    assert result.code == (0 if "--state" in args else 5), result
    assert not typo.exists()


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [(("recover",), 0, ""), (("--json", "recover"), 0, '"decisions":[]'),
     (("gc", "--older-than", "1d"), 0, "nothing to forget"),
     (("journal", "compact"), 5, "error[state_dir.missing]: no state directory at"),
     (("journal", "repair"), 5, "error[state_dir.missing]: no state directory at")],
    ids=lambda v: " ".join(v) if isinstance(v, tuple) else str(v),
)  # fmt: skip
def test_maintenance_of_a_home_that_is_not_there_makes_no_home(
    ferry: Ferry, tmp_path: Any, args: tuple[str, ...], code: int, says: str
) -> None:
    """``recover``, ``gc`` and ``journal compact``/``repair`` made a mistyped ``--home``
    (an empty state directory, and a journal in it). Cron may run ``recover`` and ``gc``
    before anything was submitted: nothing to do, exit 0, nothing made; the journal
    commands, which an operator types, say that the directory is not there."""
    typo = tmp_path / "ferry-hmoe"
    result = ferry("--home", str(typo), *args)
    assert result.code == code, result
    assert says in result.text + result.err
    assert not typo.exists()


@pytest.mark.skipif(not shutil.which("strace"), reason="needs strace")
@pytest.mark.parametrize(
    "args",
    [("cancel", "--state", "QUEUED"), ("cancel", *map(str, range(1, 31))), ("kill", "1", "2")],
)
def test_acting_on_many_tasks_reads_the_journal_once(
    ferry: Ferry, tmp_path: Any, args: tuple[str, ...]
) -> None:
    """``cancel --state QUEUED`` opened the store, and so read the journal's tail, once
    per task: 1,000 queued tasks took 44 s, 10,000 more than an hour (found by a
    review). One store now serves every task of the command (each write is still
    decided under the lock). Counted as opens of the journal's segment."""
    ferry.ok("submit", "--from", "-", stdin=b'{"argv": ["true"]}\n' * 30)
    trace = tmp_path / "trace"
    command = ("strace", "-f", "-qq", "-e", "trace=openat", "-o", str(trace), *ferry.command)
    ferry(*args, command=command)
    opens = [
        line for line in trace.read_text().splitlines() if '.jsonl"' in line and "= -1" not in line
    ]
    assert len(opens) <= 2, opens
    if args[0] == "cancel":
        assert {t["state"] for t in ferry.tasks()} == {"CANCELLED"}


def test_wait_keeps_its_timeout_while_another_process_holds_the_journal_s_lock(
    ferry: Ferry,
) -> None:
    """``wait`` confirms an end under the journal's lock before it says it; a ferry
    stopped inside its append (Ctrl-Z) holds that lock. ``wait --timeout 1`` waited for
    the lock as long as it was held, for ever if never freed (found by a review). It
    keeps its timeout: 124, the end not confirmed."""
    task_id = ferry.ok("run", "--", "true") and ferry.tasks()[0]["id"]
    lock = os.open(ferry.home / "journal" / ".lock", os.O_RDONLY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        result = ferry("wait", "--timeout", "1", task_id)
        assert result.code == 124, result
    finally:
        os.close(lock)
    assert ferry("wait", "--timeout", "5", task_id).code == 0
