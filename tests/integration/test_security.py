"""Security properties, through the ``ferry`` command: everything ferry creates is
private (0700/0600) even under umask 000; --env values never appear in ``ls``/``show``
output (human or --json) unless ``show --show-env``; nothing runs through a shell
unless --shell; nothing a task spec names makes ferry write outside the state directory.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from clikit import Ferry
from hardkit import cli_in

SECRET = "s3cr3t-Value-4711"


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[Ferry]:
    with cli_in(tmp_path) as driver:
        yield driver


def no_umask() -> None:
    os.umask(0)  # the most permissive umask: ferry must still create private files


def modes(home: Path) -> dict[str, int]:
    out = {}
    for root, dirs, files in os.walk(home):
        for name in dirs + files:
            path = Path(root, name)
            out[str(path.relative_to(home))] = path.lstat().st_mode
    return out


def test_everything_ferry_creates_is_private(cli: Ferry) -> None:
    data = cli.workdir / "data.txt"
    data.write_text("old\n")
    patch = cli.workdir / "fix.patch"
    patch.write_text("--- a/data.txt\n+++ b/data.txt\n@@ -1 +1 @@\n-old\n+new\n")

    def ferry(*args: str) -> None:
        result = cli(*args, preexec=no_umask)
        assert result.code in (0, 1), (args, result)

    ferry("run", "--", "echo", "out")  # run: journal, logs, heartbeat
    ferry(
        "submit", "--idempotent", "--pointer", "data.txt", "--patch-file", str(patch), "--", "true"
    )  # fmt: skip  (a patch: the patches/ copy)
    data.write_text("changed\n")  # the pointer goes stale: the task runs self-contained
    ferry("submit", "--", "false")
    ferry("work", "--drain")  # the lease, its lock, work's logs
    failed = [t["id"] for t in cli.tasks() if t["state"] == "FAILED"]
    ferry("retry", failed[0])
    ferry("recover")
    ferry("journal", "compact")  # a snapshot and a settled-task archive
    with (cli.home / "journal" / "00000000000000000001.jsonl").open("ab") as torn:
        torn.write(b'{"v":1,"seq":999,')
    ferry("journal", "repair")  # a .broken copy
    seen = modes(cli.home)
    assert stat.S_IMODE(cli.home.stat().st_mode) == 0o700
    kinds = {"patches", "archive", "heartbeats", "lease.json", "lease.json.lock"}
    for name in kinds:
        assert any(path == name or path.startswith(name + "/") for path in seen), name
    assert any(path.endswith(".broken") for path in seen)
    assert any(path.startswith("journal/snapshot-") for path in seen)
    for path, mode in seen.items():
        assert not stat.S_ISLNK(mode), path
        want = 0o700 if stat.S_ISDIR(mode) else 0o600
        assert stat.S_IMODE(mode) == want, (path, oct(stat.S_IMODE(mode)))


def test_env_values_are_shown_only_with_show_env(cli: Ferry) -> None:
    seen = cli.workdir / "seen"
    result = cli("--json", "run", "--env", f"API_TOKEN={SECRET}", "--", "sh", "-c",
                 'printf %s "$API_TOKEN" > "$0"', str(seen))  # fmt: skip
    assert result.code == 0
    assert seen.read_text() == SECRET, "the task got the value"
    assert SECRET not in result.text, "run --json prints the keys only"
    queued = cli.json("submit", "--env", f"API_TOKEN={SECRET}", "--", "true")
    assert queued["env"] == ["API_TOKEN"]
    task_id = queued["id"]
    outputs = {
        "ls": cli.ok("ls").text,
        "ls -v": cli.ok("-v", "ls", "--limit", "0").text,
        "ls --json": cli.ok("--json", "ls").text,
        "show": cli.ok("show", task_id).text,
        "show --json": cli.ok("--json", "show", task_id).text,
        "cancel --json": cli.ok("--json", "cancel", task_id).text,
        "retry --json": cli.ok("--json", "retry", task_id).text,
    }
    for what, text in outputs.items():
        assert SECRET not in text, what
        if what not in ("ls", "ls -v"):  # the human table has no env column
            assert "API_TOKEN" in text, what  # the keys are shown
    assert json.loads(cli.ok("--json", "show", "--show-env", task_id).out)["env"] == {
        "API_TOKEN": SECRET
    }
    assert SECRET in cli.ok("show", "--show-env", task_id).text
    # Documented: the journal stores the values (the state directory is private).
    assert SECRET in cli.ok("journal", "dump").text


INJECTIONS = ["$(touch pwned-1)", "`touch pwned-2`", "x; touch pwned-3", "x | touch pwned-4",
              "x && touch pwned-5", "$HOME"]  # fmt: skip


def test_no_shell_unless_asked(cli: Ferry) -> None:
    result = cli("run", "--", "printf", "%s\\n", *INJECTIONS)
    assert result.code == 0
    assert result.out.decode().splitlines() == INJECTIONS, "every argument reached printf as is"
    whole = cli("run", "--", "echo hi; touch pwned-6")
    assert whole.code == 127  # one program name, not a command line
    assert not list(cli.workdir.glob("pwned-*"))
    assert [t["shell"] for t in cli.tasks()] == [False, False]
    assert cli("run", "--shell", "--", "touch pwned-7").code == 0  # only when asked
    assert [p.name for p in cli.workdir.glob("pwned-*")] == ["pwned-7"]


HOSTILE_TEXT = ["../../../escape", "/etc/passwd", "logs/../../x", ".", "..", "a/b"]


def test_task_names_and_keys_never_become_paths(cli: Ferry, tmp_path: Path) -> None:
    cli.ok("ls")  # (a reader makes no home: the first run does)
    outside_before = sorted({*(p.name for p in tmp_path.iterdir()), cli.home.name})
    for text in HOSTILE_TEXT:
        result = cli("run", "--name", text, "--key", text, "--", "echo", "ok")
        assert result.code == 0, result.err  # harmless: names and keys are only labels
    for task in cli.tasks():
        assert task["name"] in HOSTILE_TEXT
        assert (cli.home / "logs" / task["id"] / "1.stdout").read_bytes() == b"ok\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == outside_before
    assert sorted(os.listdir(cli.home / "logs")) == sorted(t["id"] for t in cli.tasks())


def test_nul_and_control_characters_in_names_are_refused(cli: Ferry) -> None:
    for text in ("a\0b", "line\nbreak", "\x1b[2J"):
        line = json.dumps({"argv": ["true"], "name": text}).encode()
        result = cli.refused(2, "usage.bad_name", "submit", "--from", "-", stdin=line)
        assert "\x1b" not in result.err, "no terminal escapes echoed"
    assert cli.tasks() == []


def test_control_characters_in_a_command_never_reach_the_terminal(cli: Ferry) -> None:
    """argv may hold any character but NUL: an escape sequence (setting the terminal's
    title, colours), a CR or a newline splitting a line. ``ls``, ``work`` and ``wait``
    show them escaped, as ``run -v`` did (found by a review: only ``run -v`` did)."""
    hostile = ["printf", "\x1b]0;pwned\x07\x1b[31m", "a\nb\rc"]
    task_id = cli.ok("submit", "--", *hostile).text.strip()
    outputs = [
        (result.text + result.err)
        for result in (cli.ok("ls"), cli.ok("work", "--drain"), cli.ok("wait", task_id))
    ]
    for text in outputs:
        line = next(line for line in text.splitlines() if task_id in line)
        assert "\\x1b]0;pwned\\x07\\x1b[31m a\\nb\\rc" in line, line
        assert not any(c in text for c in "\x1b\x07\r"), text
    # (a review of that fix: show's text fields, a spawn error's program name)
    odd = cli.home.parent / "dir\x1b[41mred\x07"
    odd.mkdir()
    cli.ok("run", "--cwd", str(odd), "--", "printf", "\x9b\u202e\x7f")
    shown = cli.ok("show", "last").text
    assert "dir\\x1b[41mred\\x07" in shown and "\\x9b\\u202e\\x7f" in shown, shown
    failed = cli("run", "--", "no\x1b[7msuch")
    assert failed.code == 127 and "no\\x1b[7msuch" in failed.err, failed
    for text in (shown, failed.err):
        assert not any(c in text for c in "\x1b\x07\x9b\u202e\x7f"), text


def test_ids_that_look_like_paths_match_nothing(cli: Ferry) -> None:
    cli.ok("run", "--", "echo", "logged")
    for command in ("show", "logs", "cancel", "retry", "kill"):
        for text in ("../../etc/passwd", "/etc/passwd"):
            result = cli(command, text)
            assert result.code in (2, 5), (command, text, result)
            assert result.error_code() in ("task.not_found", "usage.bad_id")
    assert sorted(os.listdir(cli.home / "logs")) == [cli.tasks()[0]["id"]]
