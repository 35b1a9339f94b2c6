"""A state directory ferry may not write (a disk remounted read-only): every command
that only reads works on it, saying once that it is read-only; every command that
writes refuses it with a coded error, and nothing changes. And a read writes nothing
anywhere: no lock taken, no file created, on a writable directory too, while a writer
appends.

The read-only view is real: each command runs in a mount namespace of its own
(``unshare --mount``) where the state directory is bind-mounted over itself read-only
(``mount -o remount,bind,ro``), while the rest of the machine (and a writer started
by the test) still sees it writable.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from clikit import FERRY, Ferry
from hardkit import cli_in, make_template, tree

pytestmark = pytest.mark.timeout(240)

READ_ONLY_NOTE = "the state directory is read-only"
READERS = (
    ["ls", "--limit", "0"],
    ["show", "last"],
    ["logs", "1"],
    ["lease"],
    ["journal", "verify"],
    ["journal", "dump"],
    ["group"],
)
WRITERS = (
    ["run", "--", "true"],
    ["submit", "--", "true"],
    ["work", "--drain"],
    ["cancel", "3"],
    ["recover"],
    ["journal", "compact"],
    ["journal", "repair"],
    ["journal", "salvage"],
    ["lease", "--reset"],
)


def read_only_command(home: Path) -> tuple[str, ...]:
    """ferry, run in a mount namespace of its own where ``home`` is read-only."""
    script = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'
    return ("unshare", "--mount", "sh", "-c", script, str(home), *FERRY)


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = make_template(tmp_path_factory)
    probe = subprocess.run(
        [*read_only_command(home)[:-3], "true"], capture_output=True, timeout=30, check=False
    )
    if probe.returncode != 0:
        pytest.skip(f"cannot make a read-only bind mount here: {probe.stderr!r}")
    return home


@pytest.fixture
def cli(tmp_path: Path, template: Path) -> Iterator[Ferry]:
    with cli_in(tmp_path, template) as driver:
        driver.ok("--json", "logs", "1")  # (task 1 has a log: `logs` shows something)
        yield driver


def test_every_reading_command_works_on_a_read_only_mount_and_says_so_once(cli: Ferry) -> None:
    writable = {" ".join(args): cli.ok(*args) for args in READERS}
    before = tree(cli.home)
    ro = read_only_command(cli.home)
    for args in READERS:
        result = cli.ok(*args, command=ro)
        assert result.out == writable[" ".join(args)].out, args
        notes = [line for line in result.err.splitlines() if READ_ONLY_NOTE in line]
        assert len(notes) == 1, (args, result.err)
        assert "error[" not in result.err, result.err
    listed = cli.ok("--json", "ls", "--limit", "0", command=ro).json()
    assert [t["state"] for t in listed] == ["SUCCEEDED", "FAILED", "QUEUED"]
    assert "read-only" not in cli.ok("-q", "ls", command=ro).err, "--quiet says only errors"
    assert tree(cli.home) == before


def test_a_compacted_history_is_read_a_task_at_a_time_on_a_read_only_mount(cli: Ferry) -> None:
    """``ls --limit`` and ``show`` of an archived task read through the archive's index
    (issue 19): on a read-only mount too, as on a writable one, nothing written."""
    cli.ok("journal", "compact")
    done = cli.json("ls", "--limit", "0")[0]
    asks = (["--json", "ls", "--limit", "1"], ["--json", "show", done["id"][:10]],
            ["--json", "show", "1"], ["ls", "--state", "failed", "--limit", "1"])  # fmt: skip
    writable = {" ".join(args): cli.ok(*args).out for args in asks}
    before = tree(cli.home)
    ro = read_only_command(cli.home)
    for args in asks:
        assert cli.ok(*args, command=ro).out == writable[" ".join(args)], args
    assert orjson.loads(writable["--json show 1"])["id"] == done["id"]
    assert tree(cli.home) == before


def test_every_writing_command_refuses_a_read_only_mount_and_changes_nothing(
    cli: Ferry,
) -> None:
    before = tree(cli.home)
    ro = read_only_command(cli.home)
    for args in WRITERS:
        exit_code = 125
        result = cli.refused(exit_code, "state_dir.not_writable", *args, command=ro)
        assert str(cli.home) in result.err
    assert tree(cli.home) == before
    cli.ok("work", "--drain")  # writable again outside the namespace
    cli.verify_clean()


def test_a_read_writes_nothing_and_takes_no_lock(cli: Ferry) -> None:
    """On a writable directory too: no lock file made, none taken (a reader never
    waits for the append lock), nothing created (a fresh home is not made either)."""
    (cli.home / "journal" / ".lock").unlink()
    shutil.rmtree(cli.home / "patches")
    before = tree(cli.home)
    for args in READERS:
        cli.ok(*args)
    assert tree(cli.home) == before
    cli.ok("run", "--", "true")  # a writer makes what it needs
    lock_fd = os.open(cli.home / "journal" / ".lock", os.O_RDWR)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)  # as a writer stopped mid-append holds it
        for args in READERS:
            cli.ok(*args)  # (a reader waiting for it would hang: the call times out)
    finally:
        os.close(lock_fd)
    missing = cli.home.parent / "never-made"
    for args in (["ls"], ["lease"]):
        cli.ok("--home", str(missing), *args)
    for args in (["journal", "verify"], ["journal", "dump"]):  # (a typo: say so, 5)
        cli.refused(5, "state_dir.missing", "--home", str(missing), *args)
    assert not missing.exists()


def test_readers_on_a_read_only_mount_while_a_writer_appends(cli: Ferry) -> None:
    """A writer appends through the writable path while readers read the same
    directory read-only, without its lock: a record being written is not damage."""
    cli.ok("submit", "--from", "-", stdin=b'{"argv": ["true"]}\n' * 40)
    worker = cli.start("work", "--drain", "-j", "2")
    ro = read_only_command(cli.home)
    seen = set()
    while worker.poll() is None or not seen:
        for args in (["--json", "ls", "--limit", "0"], ["journal", "dump"]):
            result = cli(*args, command=ro)
            assert result.code == 0, result
        seen.add(len(result.out.splitlines()))
    assert worker.wait(timeout=60) == 0
    final = cli.ok("--json", "ls", "--limit", "0", command=ro).json()
    assert sum(t["state"] == "SUCCEEDED" for t in final) == 42  # (the template's too)
