"""Bad input on the command line, through the real ``ferry`` command: each case exits
with the contract's code, prints one coded error line and no traceback, and leaves the
state directory as it was (byte for byte) or still valid (``journal verify`` clean).

The state directory, lease and journal cases are in test_bad_input_state.py.
Decisions these tests pin (docs/reliability.md):
* argv, --env values and working directories must be valid UTF-8: other bytes are
  refused (``usage.bad_argv`` / ``bad_env`` / ``bad_cwd``), never altered;
* any command the kernel can exec can be journaled: records may take 16 MiB, which
  holds Linux's 6 MiB argv+env ceiling; a bigger spec is ``usage.too_large``; one that
  is journaled but that exec refuses (E2BIG) fails ``SPAWN_FAILED`` (``spawn.other``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from clikit import Ferry
from crashkit import kill_when
from hardkit import cli_in, make_template, tree


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_template(tmp_path_factory)


@pytest.fixture
def cli(tmp_path: Path, template: Path) -> Iterator[Ferry]:
    with cli_in(tmp_path, template) as driver:
        yield driver


def unchanged(cli: Ferry, exit_code: int, code: str, *args: str | bytes, **kw: object) -> None:
    """The command is refused as stated and the state directory is byte-identical."""
    before = tree(cli.home)
    cli.refused(exit_code, code, *args, **kw)
    assert tree(cli.home) == before


# ---- the command line -----------------------------------------------------------------


# Each test below tries several spellings of one kind of bad input against one copy of
# the state directory (a subprocess per spelling; one copy keeps the suite fast).

UNKNOWN = [
    ["run", "--bogus", "--", "true"],
    ["--bogus", "ls"],
    ["submit", "--nmae", "x", "--", "true"],
    ["journal", "shrink"],
    ["frobnicate"],
]


def test_unknown_options_and_commands_exit_2(cli: Ferry) -> None:
    for args in UNKNOWN:
        unchanged(cli, 2, "usage.invalid", *args)


def test_a_missing_command_exits_2(cli: Ferry) -> None:
    for args in (["run"], ["run", "--"], ["submit"], ["submit", "--"]):
        unchanged(cli, 2, "usage.", *args)


BAD_NUMBERS = [
    ["run", "--timeout", "-1", "--", "true"],
    ["run", "--timeout", "0", "--", "true"],
    ["run", "--timeout", "1e100", "--", "true"],
    ["run", "--timeout", "400000000", "--", "true"],  # past the 10-year spec limit
    ["run", "--timeout", "nan", "--", "true"],
    ["run", "--timeout", "soon", "--", "true"],
    ["run", "--kill-grace", "-1", "--", "true"],
    ["run", "--heartbeat", "0", "--", "true"],
    ["submit", "--max-releases", "-1", "--", "true"],
    ["submit", "--max-releases", "99999999999999999999", "--", "true"],
    ["work", "-j", "0"],
    ["work", "-j", "100000"],
    ["work", "--poll", "0"],
    ["claim", "--lease-ttl", "0"],
    ["recover", "--stale-after", "-1"],
    ["ls", "--limit", "-1"],
    ["logs", "x", "--tail", "-3"],
    ["logs", "x", "--attempt", "0"],
    ["journal", "dump", "--from", "0"],
]


def test_bad_numbers_exit_2_and_queue_nothing(cli: Ferry) -> None:
    for args in BAD_NUMBERS:
        unchanged(cli, 2, "usage.", *args)


HUGE = "1" * 5000  # (Python's int() refuses a decimal of more than 4,300 digits)


def test_a_number_of_thousands_of_digits_is_bad_input_not_an_internal_error(cli: Ferry) -> None:
    """int() raises ValueError past 4,300 digits: every number ferry read itself, on the
    fast path and the full one, was an internal error (125) where a usage error (2) or
    a task not found (5) was due; a signal in digits other than ASCII's too."""
    for args in (
        ["ls", "--limit", HUGE],
        ["work", "-j", HUGE],
        ["submit", "--max-releases", HUGE, "--", "true"],
        ["run", "--max-releases", HUGE, "--", "true"],
        ["submit", "--priority", HUGE, "--", "true"],
        ["submit", "--retries", HUGE, "--", "true"],
        ["submit", "--log-max", HUGE, "--", "true"],
        ["run", "--log-max", HUGE, "--", "true"],
        ["submit", "--after", HUGE, "--", "true"],
        ["kill", "--signal", HUGE, "1"],
        ["kill", "--signal", "\u0663", "1"],
        ["kill", "--signal", "\u00b2", "1"],
    ):
        if "--after" in args:
            unchanged(cli, 5, "task.unknown_dependency", *args)
        else:
            unchanged(cli, 2, "usage.", *args)
    for command in ("show", "cancel", "logs", "wait"):
        unchanged(cli, 5, "task.not_found", command, HUGE)
    unchanged(cli, 5, "task.not_found", "--json", "show", HUGE)
    for args in (
        ["submit", "--log-max", HUGE, "--", "true"],
        ["submit", "--not-before", "+" + HUGE, "--", "true"],
        ["report", "--since", HUGE],
    ):  # (said in one line of a few words, not echoed whole)
        refused = cli(*args)
        assert refused.code == 2 and len(refused.err) < 400, refused.err[:200]
    cli.env["COLUMNS"] = HUGE  # (a width that says nothing: as if unset)
    cli.ok("ls")


# NaN passes any range check (every comparison with it is false): click's FloatRange let
# it through to the lease, the poll and the wait, which failed ``internal`` or waited
# forever (``wait --timeout nan``).
NAN_SECONDS = [
    ["claim", "--lease-ttl", "nan"],
    ["work", "--drain", "--lease-ttl", "NaN"],
    ["work", "--drain", "--poll", "nan"],
    ["work", "--drain", "--stale-after", "nan"],
    ["recover", "--lease-ttl", "nan"],
    ["recover", "--stale-after", "nan"],
    ["wait", "x", "--timeout", "nan"],
    ["submit", "--retry-delay", "nan", "--", "true"],
]


def test_nan_seconds_are_a_usage_error(cli: Ferry) -> None:
    for args in NAN_SECONDS:
        unchanged(cli, 2, "usage.", *args)


def test_conflicting_options_exit_2(cli: Ferry, tmp_path: Path) -> None:
    batch = tmp_path / "batch.jsonl"
    batch.write_text('{"argv": ["true"]}\n')
    unchanged(cli, 2, "usage.invalid", "submit", "--from", str(batch), "--", "true")
    patch = tmp_path / "fix.patch"
    patch.write_text("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n")
    # A patch stands in only for pinned files: without --pointer it is a usage error,
    # for run as for submit (it is not a patch that failed a gate: that would be 125).
    for command in ("run", "submit"):
        unchanged(cli, 2, "usage.patch_without_pointer", command, "--patch-file", str(patch),
                  "--", "true")  # fmt: skip


ID_COMMANDS = ["show", "logs", "cancel", "retry", "kill"]


def test_an_id_that_matches_nothing_exits_5(cli: Ferry) -> None:
    for command in ID_COMMANDS:
        unchanged(cli, 5, "task.not_found", command, "zzzzzzzz")


def test_an_id_that_matches_several_tasks_exits_5_and_names_them(cli: Ferry) -> None:
    ids = [t["id"] for t in cli.tasks()]
    common = ids[0]
    for other in ids[1:]:
        while not other.startswith(common):
            common = common[:-1]
    assert common, ids
    before = tree(cli.home)
    for command in ID_COMMANDS:
        result = cli.refused(5, "task.ambiguous", command, common)
        assert all(task_id in result.err for task_id in ids)  # one line naming the matches
    assert tree(cli.home) == before


# ---- the command --------------------------------------------------------------------


@pytest.mark.parametrize("command", ["ferry-no-such-command", "/nonexistent/bin/tool"])
def test_a_command_not_found_exits_127_and_settles_spawn_failed(cli: Ferry, command: str) -> None:
    cli.refused(127, "spawn.not_found", "run", "--", command)
    task = cli.tasks()[-1]
    assert (task["state"], task["reason"]) == ("FAILED", "SPAWN_FAILED")
    cli.verify_clean()


def test_a_file_that_is_not_executable_exits_126(cli: Ferry, tmp_path: Path) -> None:
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\necho never\n")
    script.chmod(0o644)
    result = cli.refused(126, "spawn.not_executable", "run", "--", str(script))
    assert result.out == b""
    assert cli.tasks()[-1]["reason"] == "SPAWN_FAILED"
    cli.verify_clean()


def test_a_directory_as_the_command_exits_126(cli: Ferry, tmp_path: Path) -> None:
    cli.refused(126, "spawn.not_executable", "run", "--", str(tmp_path))
    cli.verify_clean()


NOT_UTF8 = [
    ([b"run", b"--", b"echo", b"caf\xe9"], "usage.bad_argv"),
    ([b"submit", b"--", b"\xff\xfe"], "usage.bad_argv"),
    ([b"run", b"--env", b"TOKEN=\xff", b"--", b"true"], "usage.bad_env"),
    ([b"submit", b"--cwd", b"/tmp/\xff", b"--", b"true"], "usage.bad_cwd"),
]


def test_bytes_that_are_not_utf8_are_refused_never_altered(cli: Ferry) -> None:
    for args, code in NOT_UTF8:
        unchanged(cli, 2, code, *args)


def test_a_current_directory_that_is_not_utf8_is_refused(cli: Ferry, tmp_path: Path) -> None:
    odd = Path(bytes(tmp_path).decode("utf-8", "surrogateescape") + "/dir-\udcff")
    odd.mkdir()
    before = tree(cli.home)
    cli.workdir = odd
    cli.refused(2, "usage.bad_cwd", "run", "--", "true")
    assert tree(cli.home) == before
    cli.ok("run", "--cwd", str(tmp_path), "--", "true")  # an explicit --cwd is the way out


def test_an_empty_string_as_the_command_exits_2(cli: Ferry) -> None:
    unchanged(cli, 2, "usage.missing_command", "run", "--", "")
    unchanged(cli, 2, "usage.missing_command", "submit", "--", "")


def test_empty_string_arguments_after_the_command_are_kept(cli: Ferry) -> None:
    result = cli("run", "--", "sh", "-c", 'printf "[%s]" "$@"', "sh", "", "x", "")
    assert (result.code, result.out) == (0, b"[][x][]")
    assert cli.tasks()[-1]["argv"][-3:] == ["", "x", ""]


def test_100000_arguments_run_and_are_journaled_exactly(cli: Ferry) -> None:
    args = [str(n) for n in range(100_000)]
    count = "import sys; print(len(sys.argv) - 1, sys.argv[-1])"
    result = cli("run", "--", sys.executable, "-c", count, *args)
    assert result.code == 0, result.err
    assert result.out == b"100000 99999\n"
    task = cli.tasks()[-1]
    assert task["argv"][3:] == args
    cli.verify_clean()


def test_a_spec_larger_than_the_journal_takes_is_refused_whole(cli: Ferry) -> None:
    # 18 MB of environment (argv that large is refused before: exec could not take it)
    line = json.dumps({"argv": ["true"], "env": [f"V{i}=" + "y" * 100_000 for i in range(180)]})
    line = line.encode()
    before = tree(cli.home)
    cli.refused(2, "usage.too_large", "submit", "--from", "-", stdin=b'{"argv": ["true"]}\n' + line)
    assert tree(cli.home) == before


def test_an_argv_that_exec_refuses_fails_spawn_failed_at_dispatch(cli: Ferry) -> None:
    # 3 MB of environment: over exec's limit here (a quarter of the 8 MiB stack), well
    # under the journal's; arguments that large are refused at submit already. Only
    # --from can carry it: ferry itself could not be exec'd.
    line = json.dumps({"argv": ["true"], "env": [f"V{i}=" + "y" * 100_000 for i in range(30)]})
    line = line.encode()
    task_id = cli("submit", "--from", "-", stdin=line).text.strip()
    assert cli("work", "--drain").code == 1  # (a task it settled FAILED)
    task = cli.task(task_id)
    assert (task["state"], task["reason"]) == ("FAILED", "SPAWN_FAILED")
    assert task["evidence"]["error"]["code"] == "spawn.other"
    assert task["evidence"]["error"]["details"]["errno"] == 7  # E2BIG
    cli.verify_clean()


# ---- task options -----------------------------------------------------------------------


@pytest.mark.parametrize("value", ["abc", "nan", "-1"])
def test_a_bad_outbox_patience_is_a_usage_error_before_anything_is_written(
    cli: Ferry, value: str
) -> None:
    """FERRY_OUTBOX_PATIENCE_S (docs/postgres.md) is read by every supervisor; a bad
    value is refused by the launcher before it forks one and before it writes. Before,
    it was parsed when the forked supervisor imported its module: ``run`` exited 125
    (``supervisor.died``), ``work`` with an internal error."""
    queued = cli.ok("submit", "--", "true").text.strip()
    cli.env["FERRY_OUTBOX_PATIENCE_S"] = value
    for args in (["run", "--", "true"], ["work", "--drain"], ["claim"]):
        unchanged(cli, 2, "usage.bad_setting", *args)
    assert cli.task(queued)["state"] == "QUEUED"


def test_env_without_a_name_and_equals_exits_2(cli: Ferry) -> None:
    for item in ("NOEQUALS", "=value"):
        unchanged(cli, 2, "usage.bad_env", "run", "--env", item, "--", "true")
    # A NUL cannot reach argv: only --from can carry one.
    line = json.dumps({"argv": ["true"], "env": ["A\0B=c"]}).encode()
    unchanged(cli, 2, "usage.bad_env", "submit", "--from", "-", stdin=line)


def test_a_cwd_that_does_not_exist_or_is_a_file_exits_2(cli: Ferry, tmp_path: Path) -> None:
    unchanged(cli, 2, "usage.bad_cwd", "run", "--cwd", str(tmp_path / "missing"), "--", "true")
    afile = tmp_path / "afile"
    afile.write_text("")
    unchanged(cli, 2, "usage.bad_cwd", "submit", "--cwd", str(afile), "--", "true")


def test_a_pointer_to_a_missing_file_exits_2(cli: Ferry, tmp_path: Path) -> None:
    for command in ("run", "submit"):
        unchanged(cli, 2, "usage.pointer_missing", command, "--pointer",
                  str(tmp_path / "gone.txt"), "--", "true")  # fmt: skip


BAD_LINES = [
    b"{not json",
    b'{"argv": ["true"], "colour": "red"}',
    b'{"argv": ["true"], "idempotent": "yes"}',
    b'{"argv": ["true"], "max_releases": 1.5}',
    b'{"argv": ["true"], "env": {"A": 1}}',
    b'{"argv": "true"}',
    b'["true"]',
    b'{"argv": ["\\ud800"]}',
    # (a number beyond 64 bits reads as a float, as orjson reads it; nesting too deep
    # for the parser: not JSON. Both were an internal error, exit 125 or a traceback.)
    b'{"argv": ["true"], "priority": 99999999999999999999999999}',
    b'{"argv": ["true"], "after": ' + b"[" * 1000 + b"]" * 1000 + b"}",
    # (A name twice: both parsers kept the last, and queued "false". A line number in
    # digits other than ASCII's read as that number.)
    b'{"argv": ["true"], "argv": ["false"]}',
    b'{"argv": ["true"], "env": {"A": "1", "A": "2"}}',
    b'{"argv": ["true"], "after": ["line:\\u0663"]}',
    b'{"argv": ["true"], "after": ["line:' + b"1" * 5000 + b'"]}',  # (int() refuses it)
]


def test_a_bad_from_line_is_one_json_error_document_under_json(cli: Ferry) -> None:
    line = b'{"argv": ["true"], "retries": 99999999999999999999999999}\n'
    result = cli("--json", "submit", "--from", "-", stdin=line)
    assert result.code == 2, result
    assert result.json()["error"]["code"] == "usage.bad_from_line", result


def test_a_bad_from_line_leaves_the_journal_byte_identical(cli: Ferry) -> None:
    good = b'{"argv": ["echo", "fine"]}\n'
    before = tree(cli.home)
    for bad_line in BAD_LINES:
        result = cli.refused(2, "usage.", "submit", "--from", "-", stdin=good * 300 + bad_line)
        assert "301" in result.err, (bad_line, result.err)  # names the line
    assert tree(cli.home) == before, "nothing half-queued"


def test_an_empty_from_file_exits_2(cli: Ferry) -> None:
    unchanged(cli, 2, "usage.bad_from_line", "submit", "--from", "-", stdin=b"\n\n")


def test_a_from_batch_follows_the_key_rules_of_a_single_submit(cli: Ferry) -> None:
    """Two lines with one key can never both be queued: a usage error naming both lines
    (it was exit 75, naming a task that never existed). A line whose key SUCCEEDED is
    not queued, as for ``submit --key``: its line prints the id of the task that did it,
    and the rest of the batch is queued."""
    twice = (
        b'{"argv": ["true"], "key": "k1"}\n{"argv": ["true"]}\n{"argv": ["true"], "key": "k1"}\n'
    )
    result = cli.refused(2, "usage.duplicate_key", "submit", "--from", "-", stdin=twice)
    assert "lines 1 and 3 of <stdin>" in result.err, result.err
    done = cli("run", "--key", "k2", "--", "true")
    assert done.code == 0
    done_id = cli.tasks()[-1]["id"]
    before = len(cli.tasks())
    batch = b'{"argv": ["true"], "key": "k2"}\n{"argv": ["true"], "key": "k3"}\n'
    result = cli("submit", "--from", "-", stdin=batch)
    assert result.code == 0, result
    ids = result.text.split()
    assert ids[0] == done_id and len(ids) == 2 and "already succeeded" in result.err
    after = cli.tasks()
    assert len(after) == before + 1, "only the k3 task was queued"
    assert (after[-1]["id"], after[-1]["key"], after[-1]["state"]) == (ids[1], "k3", "QUEUED")


def test_a_key_with_white_space_around_it_is_refused(cli: Ferry) -> None:
    """A key is the task's identity for ``--key``'s rules: ``' build'`` (a shell quote
    gone wrong) and ``'build'`` would be two keys that look one, and a blank key names
    nothing. Refused at submit, run and in a ``--from`` line; a journal that holds such
    a key (written before) still reads."""
    for key in (" ", "  ", " build", "build ", "\u3000build"):
        unchanged(cli, 2, "usage.bad_key", "submit", "--key", key, "--", "true")
        unchanged(cli, 2, "usage.bad_key", "run", "--key", key, "--", "true")
    line = b'{"argv": ["true"], "key": "build "}\n'
    result = cli.refused(2, "usage.bad_key", "submit", "--from", "-", stdin=line)
    assert "must not begin or end with white space" in result.err, result.err
    assert cli("submit", "--key", "build x", "--", "true").code == 0


@pytest.mark.parametrize("args", [["run"], ["run", "--"], ["submit"], ["submit", "--"]])
def test_a_missing_command_has_one_code_however_it_is_missing(cli: Ferry, args: list[str]) -> None:
    """``run -- ''`` said usage.missing_command; ``run`` and ``run --`` said usage.invalid."""
    unchanged(cli, 2, "usage.missing_command", *args)


def test_task_options_beside_from_are_refused_not_ignored(cli: Ferry) -> None:
    """``submit --from FILE --name X`` queued the file's tasks without X, in silence:
    with --from, every task's options are in its own line."""
    line = b'{"argv": ["true"]}\n'
    refused = cli.refused(2, "usage.invalid", "submit", "--from", "-", "--name", "x", stdin=line)
    assert "--name" in refused.err


def test_an_argument_the_kernel_cannot_exec_is_refused_at_submit(cli: Ferry) -> None:
    """execve refuses any single argument over 128 KiB (E2BIG): a task with one was
    queued and failed only when claimed (spawn.other). Refused at once, naming why."""
    import json

    def line(size: int) -> bytes:  # (through --from: ferry itself could not be exec'd)
        return json.dumps({"argv": ["echo", "x" * size]}).encode() + b"\n"

    refused = cli.refused(2, "usage.bad_argv", "submit", "--from", "-", stdin=line(200 << 10))
    assert "E2BIG" in refused.err
    cli.ok("submit", "--from", "-", stdin=line(100 << 10))  # within the limit: queued


# ---- a sixteenth-session review of bad input ---------------------------------------------


def _to_full(cli: Ferry, *args: str | bytes, **kw: Any) -> Any:
    """The command with its stdout on /dev/full (ENOSPC at its first write)."""
    with open("/dev/full", "wb") as full:
        return cli(*args, stdout=full, **kw)


def test_a_stdout_that_cannot_be_written_is_said_and_changes_no_other_status(cli: Ferry) -> None:
    """With --json and stdout on a full disk, every command ended in a traceback, exit 1:
    its output's ENOSPC, then again the error document's. Now a data command whose
    output is lost says so (``io.no_space``, as ``ls > /dev/full`` did), an error is
    its own (``show 99``: 5), and ``run`` passes its task's status through."""
    for args in (("--json", "show", "99"), ("show", "99")):
        missing = _to_full(cli, *args)
        assert (missing.code, missing.error_code()) == (5, "task.not_found"), missing
    for args in (
        ("--json", "show", "1"),
        ("--json", "ls"),
        ("ls",),
        ("group",),
        ("--json", "lease"),
    ):
        lost = _to_full(cli, *args)
        assert (lost.code, lost.error_code()) == (125, "io.no_space"), (args, lost)
        assert "stdout" in lost.err, lost.err
    for as_json in ((), ("--json",)):
        ran = _to_full(cli, *as_json, "run", "--", "sh", "-c", "exit 3")
        assert ran.code == 3, ran
        assert "error[" not in ran.err, ran.err
        assert cli.tasks()[-1]["exit_code"] == 3
    ran = _to_full(cli, "--json", "run", "--", "true")
    assert ran.code == 0 and "stdout" in ran.err, ran
    drained = _to_full(cli, "--json", "work", "--drain")  # (its lines lost, its queue run)
    assert drained.code == 0 and "stdout" in drained.err, drained
    assert "QUEUED" not in {task["state"] for task in cli.tasks()}
    cli.verify_clean()


def test_a_submit_whose_id_cannot_be_written_says_its_task_was_queued(cli: Ferry) -> None:
    """``submit > /dev/full`` exited 125 io.no_space, and nothing said the task was
    queued all the same: a script that submits again on failure queued it twice. The
    error line names what was queued (its id); the status stays a failure (the ids the
    caller asked for are lost), and with ``--key`` a second submit queues nothing."""
    before = len(cli.tasks())
    for as_json in ((), ("--json",)):
        lost = _to_full(cli, *as_json, "submit", "--", "true")
        assert (lost.code, lost.error_code()) == (125, "io.no_space"), lost
        queued = cli.tasks()[-1]
        assert queued["state"] == "QUEUED" and "queued all the same" in lost.err, lost.err
        assert queued["id"] in lost.err
    lines = b'{"argv": ["true"]}\n{"argv": ["false"]}\n'
    lost = _to_full(cli, "submit", "--from", "-", stdin=lines)
    assert lost.code == 125, lost
    assert all(task["id"] in lost.err for task in cli.tasks()[-2:]), lost.err
    assert len(cli.tasks()) == before + 4
    _to_full(cli, "submit", "--key", "once", "--", "true")
    again = cli("submit", "--key", "once", "--", "true")
    assert again.code == 75 and len(cli.tasks()) == before + 5, again


def _submit_from_killed_in_its_write(cli: Ferry, lines: Path) -> bool:
    """``submit --from -`` of ``lines``, SIGKILLed once the journal grew by 2 MB (its
    one write of the batch under way); True if the kill landed in that write (the
    batch's last task is not in the journal)."""
    journal_dir = cli.home / "journal"

    def size() -> int:
        return sum(p.stat().st_size for p in journal_dir.glob("*.jsonl"))

    before = size()
    with open(lines, "rb") as source:
        proc = subprocess.Popen(
            [*cli.command, "submit", "--from", "-"],
            stdin=source,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=cli.env,
            cwd=cli.workdir,
        )
    kill_when(proc, lambda: size() >= before + (2 << 20), 120)
    last = b'"argv":["echo","39999"'
    return not any(last in p.read_bytes() for p in journal_dir.glob("*.jsonl"))


@pytest.mark.crash  # (about 15 s)
@pytest.mark.timeout(600)
def test_a_large_submit_from_killed_in_its_write_queues_none_of_it(
    tmp_path: Path, template: Path
) -> None:
    """``submit --from`` of 40,000 tasks (1.1 KB each) writes them with one write;
    SIGKILLed in it (Linux stops a large write between pages on a fatal signal), it
    left a prefix of whole records: 1,420 of the 40,000 tasks queued and run, though
    ``submit`` printed nothing and a batch is committed together. Now the records of
    a batch that did not land whole are a torn tail: none of them is queued, and the
    next write cuts them."""
    pad = "x" * 1100
    lines = tmp_path / "batch.jsonl"
    lines.write_bytes(
        b"".join(
            json.dumps({"argv": ["echo", str(i), pad]}).encode() + b"\n" for i in range(40_000)
        )
    )
    for attempt in range(3):
        with cli_in(tmp_path / f"try{attempt}", template) as cli:
            before = cli.tasks()
            if not _submit_from_killed_in_its_write(cli, lines):
                continue  # (killed after its write: try again)
            assert [t["id"] for t in cli.tasks()] == [t["id"] for t in before]
            report = cli.json("journal", "verify")
            assert report["status"] == "torn", report  # (what a crash in a write leaves)
            claimed = cli.json("claim")  # the one task queued before it, and no other
            assert claimed["name"] == "queued", claimed
            assert cli.json("claim") == {"task": None}
            assert len(cli.tasks()) == len(before)
            cli.verify_clean()  # (the claim cut the batch)
            return
    pytest.fail("the kill never landed in the batch's write")


BAD_URL_VALUES = [
    "postgresql://127.0.0.1:99999/db",
    "postgresql://127.0.0.1:abc/db",
    "postgresql://127.0.0.1/db?sslmode=bogus",
    "postgresql://127.0.0.1/db?target_session_attrs=bogus",
]


@pytest.mark.parametrize("url", BAD_URL_VALUES)
def test_a_database_url_with_a_value_libpq_refuses_is_a_usage_error(cli: Ferry, url: str) -> None:
    """A port out of range or not a number, an sslmode libpq does not know: was
    ``db.unavailable`` (75, "cannot be reached": try again later, for ever). The URL
    is bad input: ``usage.bad_database`` (2, ``run`` too), nothing changed."""
    pytest.importorskip("psycopg")
    for args in (("ls",), ("run", "--", "true"), ("db", "init")):
        refused = cli.refused(2, "usage.bad_database", "--database", url, *args)
        assert "invalid" in refused.err, refused.err
    cli.verify_clean()


def test_a_bad_database_url_in_the_environment_is_named_as_such(cli: Ferry) -> None:
    """``FERRY_DATABASE_URL=nonsense`` said '--database must be a postgresql:// URL',
    naming an option the user never gave."""
    cli.env["FERRY_DATABASE_URL"] = "nonsense"
    refused = cli.refused(2, "usage.bad_database", "ls")
    assert "FERRY_DATABASE_URL must be a postgresql:// URL" in refused.err, refused.err
    refused = cli.refused(2, "usage.bad_database", "--database", "mysql://x", "ls")
    assert "--database must be" in refused.err, refused.err


def _memory_bound() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))  # (unbounded, it took GBs)


def test_a_batch_past_its_bounds_is_refused_before_it_is_read_whole(cli: Ferry) -> None:
    """``submit --lines /dev/zero`` (or ``--from``) read its whole input, without limit:
    5 GB resident in seconds. Now at most 64 MiB are read (as a ``--patch-file``) and at
    most 50,000 tasks taken in one submit: ``usage.batch_too_large`` (2), nothing
    queued (the queue byte-identical)."""
    for option in ("--lines", "--from"):
        refused = cli("submit", option, "/dev/zero", preexec=_memory_bound)
        assert (refused.code, refused.error_code()) == (2, "usage.batch_too_large"), refused
        assert "64 MiB" in refused.err, refused.err
    many = b"true\n" * 50_001
    unchanged(cli, 2, "usage.batch_too_large", "submit", "--lines", "-", stdin=many)
    unchanged(cli, 2, "usage.batch_too_large", "submit", "--from", "-",
              stdin=b'{"argv": ["true"]}\n' * 50_001)  # fmt: skip
    cli.ok("submit", "--lines", "-", stdin=b"\n\n" + b"true\n" * 3)  # (blank lines: no task)


@pytest.mark.parametrize("zone", ["Europe/Paris", "UTC", "America/New_York"])
def test_report_since_the_first_or_the_last_day_a_date_can_name(
    cli: Ferry, tmp_path: Path, zone: str
) -> None:
    """``report --since 0001-01-01`` (a local time: its UTC is before year 1) and
    ``--since 9999-12-31T23:59:59`` west of Greenwich (after year 9999) were an internal
    error, ValueError (125). Now every task, and the unsettled one alone."""
    cli.env["TZ"] = zone
    page = tmp_path / "page.html"
    for since, count in (("0001-01-01", 3), ("0001-01-01T00:00:00", 3),
                         ("9999-12-31T23:59:59", 1), ("9999-12-31", 1)):  # fmt: skip
        done = cli.json("report", "--html", str(page), "--since", since)
        assert done["tasks"] == count, (since, done)


@pytest.mark.parametrize("step", ["abc", "nan", "inf", "1e999"])
def test_a_bad_test_clock_step_in_the_environment_changes_nothing(cli: Ferry, step: str) -> None:
    """``FERRY_TEST_WALL_STEP_S`` (the tests' step of recovery's wall clock) was parsed
    at import: a value that is not a number made every command an internal error (125),
    and ``nan`` or ``inf`` would have made every age unknowable. Such a value is
    ignored: the clock is not stepped."""
    cli.env["FERRY_TEST_WALL_STEP_S"] = step
    cli.ok("ls")
    cli.ok("run", "--", "true")
    code, _ = cli.recover()
    assert code == 0
    assert [task["state"] for task in cli.tasks()][-1] == "SUCCEEDED"


def test_exec_errors_on_a_path_are_126_as_a_shell_says(cli: Ferry, tmp_path: Path) -> None:
    """A symlink loop (ELOOP) and a name too long (ENAMETOOLONG) as the command were
    ``spawn.other`` (125, "ferry failed"): exec's errors on a path are 126, as bash
    gives. A bare name that no place on PATH can hold is not found (127), as bash."""
    loop = tmp_path / "loop1"
    loop.symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(loop)
    for command in (str(loop), str(tmp_path / ("x" * 300))):
        refused = cli.refused(126, "spawn.not_executable", "run", "--", command)
        assert ("symbolic links" in refused.err) or ("too long" in refused.err), refused.err
        assert cli.tasks()[-1]["reason"] == "SPAWN_FAILED"
    cli.refused(127, "spawn.not_found", "run", "--", "x" * 300)
    cli.verify_clean()


def test_a_script_whose_interpreter_is_missing_says_bad_interpreter(
    cli: Ferry, tmp_path: Path
) -> None:
    """``#!/nonexistent/interp``: exec's ENOENT was reported as "command not found",
    naming a file that is there. It names the interpreter (127 still, as bash gives);
    also for a bare name found on PATH (was: passed over, "command not found")."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "job.sh"
    script.write_text("#!/nonexistent/interp\necho never\n")
    script.chmod(0o755)
    refused = cli.refused(127, "spawn.not_found", "run", "--", str(script))
    assert "bad interpreter: /nonexistent/interp" in refused.err, refused.err
    assert "command not found" not in refused.err
    path = f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    refused = cli.refused(127, "spawn.not_found", "run", "--env", f"PATH={path}", "--", "job.sh")
    assert "bad interpreter: /nonexistent/interp" in refused.err, refused.err
