"""Bad state on disk, through the real ``ferry`` command: an unusable state directory,
a planted symlink, a filesystem without locks, a bad lease file, a damaged journal.
Each: the contract's exit code, one coded error line, no traceback, and nothing of the
state directory changed by the refusal (``journal verify`` clean once the damage is
undone, where the damage was not in the journal itself).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from clikit import Ferry
from hardkit import cli_in, make_template, read_only_bind, tree

from ferry.storage.local.lease import Lease


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_template(tmp_path_factory)


@pytest.fixture
def cli(tmp_path: Path, template: Path) -> Iterator[Ferry]:
    with cli_in(tmp_path, template) as driver:
        yield driver


def without_lease_lock(home: Path) -> dict[str, tuple[int, str]]:
    """The tree, less the lease's lock file: taking the short lock creates it (empty),
    which is all a refused leader may leave behind."""
    found = tree(home)
    lock = found.pop("lease.json.lock", None)
    assert lock is None or lock[1] == tree_empty_hash()
    return found


def tree_empty_hash() -> str:
    return hashlib.sha256(b"").hexdigest()


def journal_dir(cli: Ferry) -> Path:
    return cli.home / "journal"


def only_segment(cli: Ferry) -> Path:
    segments = sorted(journal_dir(cli).glob("*.jsonl"))
    assert len(segments) == 1, segments
    return segments[0]


def with_crc(line: bytes) -> bytes:
    """A record line re-checksummed after an edit (the crc covers the bytes before it)."""
    body = line[: line.rindex(b',"crc":"')]
    return body + b',"crc":"%08x"}\n' % zlib.crc32(body)


def record_lines(segment: Path) -> list[bytes]:
    """A segment's record lines (without the zero tail the writer preallocates)."""
    return segment.read_bytes().rstrip(b"\0").splitlines(keepends=True)


def split_segment(cli: Ferry, cuts: list[int]) -> list[Path]:
    """Split the one segment into several at the given record indexes (as rotation
    would have made them: each named by the seq of its first record, and a batch's
    lines in one segment: a cut inside a batch moves to its end)."""
    segment = only_segment(cli)
    lines = record_lines(segment)
    marked = [re.match(rb'\{"v":1,"seq":\d+,"more":', line) is not None for line in lines]
    for index, cut in enumerate(cuts):
        while 0 < cut < len(lines) and marked[cut - 1]:
            cut += 1
        cuts[index] = cut
    segment.unlink()
    paths = []
    for start, end in zip([0, *cuts], [*cuts, len(lines)], strict=True):
        path = journal_dir(cli) / f"{start + 1:020d}.jsonl"
        path.write_bytes(b"".join(lines[start:end]))
        path.chmod(0o600)
        paths.append(path)
    return paths


# ---- the state directory --------------------------------------------------------------


def test_a_read_only_home_is_refused_by_writers_and_left_alone(cli: Ferry) -> None:
    before = tree(cli.home)
    with read_only_bind(cli.home):
        for args in (["run", "--", "true"], ["submit", "--", "true"], ["recover"]):
            cli.refused(125, "state_dir.not_writable", *args)
        assert "read-only" in cli.ok("ls").err  # a reader shows it (test_readonly_state)
    assert tree(cli.home) == before
    cli.ok("run", "--", "true")
    cli.verify_clean()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving the home to another user needs root")
def test_a_home_owned_by_another_user_is_refused(cli: Ferry) -> None:
    before = tree(cli.home)
    os.chown(cli.home, 65534, 65534)
    try:
        for args in (["ls"], ["run", "--", "true"], ["journal", "verify"]):
            cli.refused(125, "state_dir.not_owned", *args)
    finally:
        os.chown(cli.home, os.geteuid(), os.getegid())
    assert tree(cli.home) == before


@pytest.mark.parametrize("where", [".", "journal"])
def test_a_world_writable_home_or_subdirectory_is_refused(cli: Ferry, where: str) -> None:
    target = cli.home / where
    target.chmod(0o777)
    before = tree(cli.home)
    for args in (["ls"], ["run", "--", "true"], ["submit", "--", "true"]):
        cli.refused(125, "state_dir.permissions", *args)
    assert tree(cli.home) == before
    target.chmod(0o700)
    cli.verify_clean()


def _retried_failed_task(cli: Ferry) -> str:
    failed = next(t for t in cli.tasks() if t["state"] == "FAILED")
    cli.ok("retry", failed["id"])
    task_id: str = failed["id"]
    return task_id


# name -> (the link, relative to the home; what it points at; the command; exit; code).
# "{next}" is the name of the segment a rotation would create next; "{retried}" the id
# of a task just retried (its logs/<id>/ and heartbeat names are predictable).
PLANTS: dict[str, tuple[str, str, list[str], int, str]] = {
    "the lease file": ("lease.json", "file", ["recover"], 125, "state_dir.symlink"),
    "the lease temp file": ("lease.json.tmp", "file", ["recover"], 125, "state_dir.symlink"),
    "the lease lock": ("lease.json.lock", "file", ["claim"], 125, "state_dir.symlink"),
    "the journal lock": ("journal/.lock", "file", ["submit", "--", "true"], 125,
                         "state_dir.symlink"),
    "the next segment": ("journal/{next}", "file", ["run", "--", "true"], 125,
                         "state_dir.symlink"),
    "the archive directory": ("archive", "dir", ["journal", "compact"], 125,
                              "state_dir.symlink"),
    "the log directory": ("logs/{retried}", "dir", ["work", "--drain"], 1, ""),
    "the heartbeat file": ("heartbeats/{retried}.2", "file", ["work", "--drain"], 1, ""),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(PLANTS))
def test_a_planted_symlink_is_never_followed(cli: Ferry, tmp_path: Path, name: str) -> None:
    relative, kind, args, exit_code, code = PLANTS[name]
    retried = _retried_failed_task(cli) if "{retried}" in relative else ""
    following = f"{len(cli.records()) + 1:020d}.jsonl"
    link = cli.home / relative.format(next=following, retried=retried)
    target = tmp_path / "target"
    target.mkdir()
    (target / "bait").write_text("untouched\n")
    if link.is_dir() and not link.is_symlink():
        shutil.rmtree(link)
    elif link.exists():
        link.unlink()
    link.symlink_to(target if kind == "dir" else target / "bait")
    if code:
        cli.refused(exit_code, code, *args)
    else:  # the runner refuses the link: the attempt fails (so work --drain exits 1)
        assert cli(*args).code == exit_code
        task = cli.task(retried)
        assert (task["state"], task["reason"], task["attempt"]) == ("FAILED", "SPAWN_FAILED", 2)
    assert sorted(os.listdir(target)) == ["bait"]
    assert (target / "bait").read_text() == "untouched\n"
    link.unlink()
    cli.verify_clean()


def test_a_symlinked_home_is_refused(tmp_path: Path, template: Path) -> None:
    real = tmp_path / "real"
    shutil.copytree(template, real, symlinks=True)
    with cli_in(tmp_path) as cli:
        cli.home.symlink_to(real)
        cli.refused(125, "state_dir.symlink", "ls")


NO_FLOCK = """
import errno, fcntl, sys
def no_flock(fd, op):
    raise OSError(errno.ENOLCK, "No locks available")
fcntl.flock = no_flock  # as on a filesystem whose locks do not work
from ferry.cli import main
sys.exit(main())
"""


def test_a_filesystem_without_working_locks_is_refused(cli: Ferry) -> None:
    without_locks = [sys.executable, "-c", NO_FLOCK]
    before = tree(cli.home)
    for args in (["submit", "--", "true"], ["run", "--", "true"], ["recover"]):
        cli.refused(125, "state_dir.no_locks", *args, command=without_locks)
    assert without_lease_lock(cli.home) == before
    assert cli("ls", command=without_locks).code == 0  # reading takes no lock


# ---- the lease file ---------------------------------------------------------------------

BAD_LEASES = {
    "truncated": (b'{"v": 1, "epoch": 3, "holder": nu', "lease.unreadable"),
    "empty": (b"", "lease.unreadable"),
    "not JSON": (b"\x00\x01 lease? \xff", "lease.unreadable"),
    "from a newer version": (b'{"v": 2, "epoch": 3, "holder": null}', "lease.version"),
}


@pytest.mark.parametrize("case", sorted(BAD_LEASES))
def test_a_bad_lease_file_stops_leaders_and_is_never_overwritten(cli: Ferry, case: str) -> None:
    content, code = BAD_LEASES[case]
    lease_path = cli.home / "lease.json"
    lease_path.write_bytes(content)
    lease_path.chmod(0o600)
    before = tree(cli.home)
    for args in (["recover"], ["claim"], ["work", "--drain"], ["lease"]):
        result = cli.refused(125, code, *args)
        assert "lease --reset" in result.err or code == "lease.version"  # the way out
    assert without_lease_lock(cli.home) == before
    cli.ok("run", "--", "true")  # run takes no lease: it still works
    assert lease_path.read_bytes() == content
    cli.ok("lease", "--reset")  # the operator's way out: moved aside, epochs kept
    assert lease_path.read_bytes() != content
    assert [p.read_bytes() for p in cli.home.glob("lease.json.bad.*")] == [content]
    cli.ok("work", "--drain")
    assert cli.json("lease")["epoch"] >= 1
    cli.verify_clean()


def lease_epochs(cli: Ferry) -> list[int]:
    return [r["epoch"] for r in cli.records() if r["type"] == "LEASE_ACQUIRED"]


def test_a_lease_epoch_that_went_backwards_never_reissues_an_epoch(cli: Ferry) -> None:
    cli.ok("work", "--drain")
    cli.ok("work", "--drain")
    assert lease_epochs(cli) == [1, 2]
    old = Lease(epoch=0, holder=None, acquired_at=1.0, renewed_at=1.0, expires_at=1.0,
                expires_boot_s=0.0)  # fmt: skip
    (cli.home / "lease.json").write_bytes(json.dumps(old.to_json()).encode())
    cli.ok("work", "--drain")
    assert lease_epochs(cli) == [1, 2, 3], "counts on from the journal, not from the file"
    assert cli.json("lease")["epoch"] == 3
    cli.verify_clean()


# ---- the journal ------------------------------------------------------------------------


def _refused_everywhere(cli: Ferry, code: str) -> None:
    """Every command that reads the journal refuses it (4; run 125), and repair does
    not call it repaired (there is no torn tail to cut); nothing changes."""
    before = tree(cli.home)
    cli.refused(4, code, "ls")
    cli.refused(4, code, "journal", "verify")
    cli.refused(4, code, "journal", "repair")
    cli.refused(4, code, "recover")
    cli.refused(125, code, "run", "--", "true")
    assert tree(cli.home) == before


def test_a_record_from_a_newer_format_version_is_refused(cli: Ferry) -> None:
    segment = only_segment(cli)
    lines = record_lines(segment)
    lines[-1] = with_crc(lines[-1].replace(b'{"v":1,', b'{"v":2,', 1))
    segment.write_bytes(b"".join(lines))
    _refused_everywhere(cli, "journal.format_version")
    cli.refused(4, "journal.format_version", "journal", "repair")


def test_a_sealed_segment_missing_in_the_middle_is_corruption(cli: Ferry) -> None:
    count = len(cli.records())
    middle = split_segment(cli, [count // 3, 2 * count // 3])[1]
    cli.verify_clean()  # split as rotation would have: still one valid journal
    middle.unlink()
    _refused_everywhere(cli, "journal.corrupt")
    cli.refused(4, "journal.corrupt", "journal", "repair")  # never "repaired" by cutting


@pytest.mark.parametrize("where", ["state", "checksum", "newline"])
def test_a_flipped_bit_in_the_last_committed_record_is_corruption_never_cut(
    cli: Ferry, where: str
) -> None:
    """A committed SETTLED, the journal's newest record, with one bit flipped (in its
    body, its checksum, its newline): every command calls it corrupt (verify 4, run
    125), repair refuses, and the next ``ferry run`` neither cuts it nor reuses its seq.
    (It was taken for a torn tail: cut at the next append, and the task it settled then
    marked unsafe by recovery.)"""
    cli.ok("run", "--name", "settled", "--", "true")
    segment = only_segment(cli)
    lines = record_lines(segment)
    settled = lines[-1]
    assert b'"type":"SETTLED"' in settled and b'"SUCCEEDED"' in settled
    at = {
        "state": settled.index(b'"SUCCEEDED"') + 3,
        "checksum": settled.rindex(b'"crc":"') + 9,
        "newline": len(settled) - 1,
    }[where]
    offset = sum(map(len, lines[:-1])) + at
    with segment.open("r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x08]))
    _refused_everywhere(cli, "journal.corrupt")
    report = cli("--json", "journal", "verify").json()
    assert report["status"] == "corrupt", report
    assert report["error"]["details"]["offset"] == sum(map(len, lines[:-1])), report
    assert not list(journal_dir(cli).glob("*.broken*")), "nothing was cut"


def _snapshot(cli: Ferry) -> Path:
    cli.ok("journal", "compact")
    (path,) = journal_dir(cli).glob("snapshot-*.snap")
    return path


def _rewrite_snapshot(path: Path, *, seq: int | None = None, data: bytes | None = None) -> Path:
    head, _, body = path.read_bytes().partition(b"\n")
    header = head[: head.rindex(b',"crc":"')]
    if data is not None:
        body = data
        header = header[: header.rindex(b',"length"')]
        header += b',"length":%d,"data_crc":"%08x"' % (len(body), zlib.crc32(body))
    if seq is not None:
        header = re.sub(rb'"seq":\d+', b'"seq":%d' % seq, header)
        path = path.with_name(f"snapshot-{seq:020d}.snap")
    path.write_bytes(header + b',"crc":"%08x"}\n' % zlib.crc32(header) + body)
    path.chmod(0o600)
    return path


def test_a_snapshot_beyond_the_end_of_its_segments_is_corruption(cli: Ferry) -> None:
    _rewrite_snapshot(_snapshot(cli), seq=10_000)
    _refused_everywhere(cli, "journal.corrupt")


def test_a_snapshot_that_is_not_a_task_table_is_a_mismatch(cli: Ferry) -> None:
    _rewrite_snapshot(_snapshot(cli), data=b'{"a": "table from some other tool"}')
    _refused_everywhere(cli, "journal.snapshot_mismatch")


def test_a_snapshot_whose_settled_archive_is_gone_is_a_mismatch(cli: Ferry) -> None:
    _snapshot(cli)
    for archive in (cli.home / "archive").iterdir():
        archive.unlink()
    before = tree(cli.home)
    cli.refused(4, "journal.snapshot_mismatch", "ls")
    cli.refused(4, "journal.snapshot_mismatch", "journal", "verify")
    assert tree(cli.home) == before


def test_a_damaged_snapshot_with_its_segments_falls_back_to_a_full_replay(cli: Ferry) -> None:
    tasks = cli.tasks()
    snapshot = _snapshot(cli)
    data = bytearray(snapshot.read_bytes())
    data[-2] ^= 0x01
    snapshot.write_bytes(bytes(data))
    assert cli.tasks() == tasks
    report = cli.verify_clean()
    assert [d["path"] for d in report["damaged_snapshots"]] == [str(snapshot)]
    # (It said "journal clean" and nothing more; the next compaction replaces the file,
    # and the damage was never said: a review.)
    said = cli.ok("journal", "verify").text
    assert said.startswith("journal clean") and f"{snapshot.name} is damaged" in said, said
    segment = sorted(journal_dir(cli).glob("*.jsonl"))[-1]  # (and a torn tail: said too)
    end = len(segment.read_bytes().rstrip(b"\0"))
    with segment.open("r+b") as f:
        f.seek(end)
        f.write(b'{"v":1,"seq":')
    said = cli.ok("journal", "verify").text
    assert said.startswith("journal torn") and f"{snapshot.name} is damaged" in said, said


def test_a_damaged_snapshot_whose_segments_were_compacted_is_corruption(cli: Ferry) -> None:
    split_segment(cli, [2, 4])
    snapshot = _snapshot(cli)
    assert len(list(journal_dir(cli).glob("*.jsonl"))) == 1, "sealed segments dropped"
    data = bytearray(snapshot.read_bytes())
    data[-2] ^= 0x01
    snapshot.write_bytes(bytes(data))
    _refused_everywhere(cli, "journal.corrupt")


def test_broken_files_left_by_earlier_repairs_are_kept_and_ignored(cli: Ferry) -> None:
    segment = only_segment(cli)
    for _ in range(2):
        with segment.open("ab") as torn:
            torn.write(b'{"v":1,"seq":99,"epo')  # a torn tail, as a crash mid-append leaves
        assert cli.json("journal", "verify")["status"] == "torn"
        cli.ok("journal", "repair")
    broken = sorted(p.name for p in journal_dir(cli).glob("*.broken*"))
    assert broken == [segment.name + ".broken", segment.name + ".broken.1"]
    copies = {name: (journal_dir(cli) / name).read_bytes() for name in broken}
    cli.verify_clean()
    cli.ok("run", "--", "true")
    cli.ok("journal", "compact")
    assert {n: (journal_dir(cli) / n).read_bytes() for n in broken} == copies


def test_a_directory_where_a_file_should_be_is_named(cli: Ferry) -> None:
    """A directory in lease.json's place is an unreadable lease (reset moves it aside);
    in a segment's place, the error names the segment (it named nothing)."""
    lease = cli.home / "lease.json"
    lease.mkdir()
    refused = cli.refused(125, "lease.unreadable", "recover")
    assert str(lease) in refused.err
    cli.ok("lease", "--reset")
    assert lease.is_file()  # a released lease, epochs kept
    segment = only_segment(cli)
    saved = segment.with_name("saved")
    segment.rename(saved)
    segment.mkdir()
    refused = cli.refused(4, "journal.corrupt", "ls")
    assert segment.name in refused.err and "not a regular file" in refused.err
    cli.refused(4, "journal.corrupt", "journal", "verify")
    segment.rmdir()
    saved.rename(segment)
    cli.verify_clean()


def test_a_held_journal_lock_is_waited_for_and_said_so(cli: Ferry) -> None:
    """A process stopped while it held the journal's append lock holds it until it is
    continued or killed: a writer waits (it must), but not in silence (it said
    nothing, for ever)."""
    import fcntl
    import select

    lock_fd = os.open(journal_dir(cli) / ".lock", os.O_RDWR)
    fcntl.flock(lock_fd, fcntl.LOCK_EX)
    run = cli.start("run", "--", "true")
    try:
        assert run.stderr is not None
        deadline = time.monotonic() + 30
        said = b""
        while b"append lock" not in said:
            assert time.monotonic() < deadline, said
            if select.select([run.stderr], [], [], 0.1)[0]:
                said += os.read(run.stderr.fileno(), 4096)
        assert run.poll() is None, "still waiting"
    finally:
        fcntl.flock(lock_fd, fcntl.LOCK_UN)
        os.close(lock_fd)
    assert run.wait(timeout=60) == 0
    assert cli.tasks()[-1]["state"] == "SUCCEEDED"


def test_verify_lists_the_records_the_fold_skipped(cli: Ferry) -> None:
    """A record whose checksum is right but whose content breaks the rules (written by a
    buggy or foreign writer) is skipped by every command, which is safe, but must not
    be skipped in silence: verify names it (the journal's bytes are sound: clean)."""
    import journal as journal_lib

    with journal_lib.Journal.open(journal_dir(cli)) as wal:
        bad = wal.append("SUBMITTED", {"task": "01zzzzzzzzzzzzzz", "spec": "not an object"})
    report = cli.json("journal", "verify")
    assert report["status"] == "clean"
    (anomaly,) = report["anomalies"]
    assert (anomaly["seq"], anomaly["type"]) == (bad.seq, "SUBMITTED")
    said = cli.ok("journal", "verify")
    assert "1 record skipped" in said.text and str(bad.seq) in said.text
    cli.ok("ls")  # every other command goes on without it


# ---- a snapshot whose live task cannot be decoded ------------------------------
# A snapshot whose one live (QUEUED) record has a field that cannot be decoded (its
# checksums made good again: written so by a bug, or by another tool) is refused when it
# is read, by every command, with ``journal.snapshot_mismatch``: never an internal error,
# never a usage error, and never after a command already acted on it. Since a snapshot's
# records are decoded when first asked for (``ferry.core.live``), each is checked when
# read for what decoding needs (``check_record``). (From an adversarial review.)


def _edit_live_record(cli: Ferry, edit) -> str:
    cli.ok("journal", "compact")
    (path,) = (cli.home / "journal").glob("snapshot-*.snap")
    head, _, body = path.read_bytes().partition(b"\n")
    data = json.loads(body)
    (record,) = data["live"]
    edit(record)
    body = json.dumps(data).encode()
    header = head[: head.rindex(b',"crc":"')]
    header = header[: header.rindex(b',"length"')]
    header += b',"length":%d,"data_crc":"%08x"' % (len(body), zlib.crc32(body))
    path.write_bytes(header + b',"crc":"%08x"}\n' % zlib.crc32(header) + body)
    path.chmod(0o600)
    return record["id"]


EDITS = {
    "bad_reason": lambda r: r.update(reason="no-such-reason"),
    "runner_not_object": lambda r: r.update(runner=7),
}
COMMANDS = [
    ("ls",),
    ("show", "{id}"),
    ("cancel", "{id}"),
    ("submit", "--", "true"),
    ("run", "--", "true"),
    ("claim",),
    ("journal", "compact"),
    ("gc",),
]


@pytest.mark.parametrize("edit", sorted(EDITS))
@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: "-".join(a).replace("{id}", "ID"))
def test_a_bad_live_record_is_a_mismatch_for_every_command(
    cli: Ferry, edit: str, args: tuple[str, ...]
) -> None:
    task_id = _edit_live_record(cli, EDITS[edit])
    argv = [a.replace("{id}", task_id) for a in args]
    result = cli(*argv)
    assert result.error_code() == "journal.snapshot_mismatch", (result.code, result.err)
    assert result.code in (4, 125)


def test_a_live_record_whose_spec_lacks_argv_is_not_a_usage_error(cli: Ferry) -> None:
    """(Before, TaskSpec.from_json's UsageError blamed the damage on the command line.)"""
    _edit_live_record(cli, lambda r: r["spec"].pop("argv"))
    result = cli("ls")
    assert result.error_code() == "journal.snapshot_mismatch", (result.code, result.err)


def test_a_run_whose_compaction_meets_the_bad_record_is_not_an_internal_error(cli: Ferry) -> None:
    """Were submit and run let write on top of the bad snapshot, ``run`` (which
    compacts after its task settled, once one is due) would meet the record in its
    snapshot's live tasks: its task run and succeeded, and ferry saying
    error[internal], exit 125."""
    _edit_live_record(cli, EDITS["bad_reason"])
    lines = b"".join(b'{"argv": ["true"], "name": "t%d"}\n' % i for i in range(260))
    cli("submit", "--from", "-", stdin=lines)  # (refused: the snapshot is read first)
    result = cli("run", "--name", "after", "--", "true")
    assert result.error_code() in (None, "journal.snapshot_mismatch"), result.err


@pytest.mark.parametrize("args", [["--home", ""], ["--home="]], ids=["--home ''", "--home="])
@pytest.mark.parametrize("command", [["submit", "--", "true"], ["ls"], ["run", "--", "true"]])
def test_an_empty_home_is_a_usage_error_never_the_default_home(
    tmp_path: Path, args: list[str], command: list[str]
) -> None:
    """``ferry --home "$UNSET" ...`` names no directory: it must not fall back to
    ``$FERRY_HOME`` or the default home (``~/.local/state/ferry``), which may be
    another's queue; nothing is created there."""
    env = {"HOME": str(tmp_path), "FERRY_HOME": str(tmp_path / "env-home"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "ferry.cli", *args, *command],
        capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2, done
    assert "usage.bad_home" in done.stderr and "Traceback" not in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("where", ["--home", "FERRY_HOME"])
def test_a_home_of_a_user_that_does_not_exist_is_a_usage_error(tmp_path: Path, where: str) -> None:
    """``~nosuchuser/q``: no home directory to expand it to. Was an internal error
    (``RuntimeError: Could not determine home directory``, exit 125)."""
    home = "~ferry-no-such-user-x/q"
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    args = ["--home", home] if where == "--home" else []
    if where == "FERRY_HOME":
        env["FERRY_HOME"] = home
    done = subprocess.run(
        [sys.executable, "-m", "ferry.cli", *args, "ls"],
        capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2, done
    assert "usage.bad_home" in done.stderr and "Traceback" not in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_work_runs_in_a_home_whose_path_is_not_utf8(tmp_path: Path) -> None:
    """``work`` in a state directory whose path is not UTF-8 failed every claim
    (``journal.invalid_record``, exit 2: its claims name their home, ``runner.home``,
    which JSON cannot hold), while ``run``, ``claim`` and ``submit`` worked there. The
    claim names it losslessly; a restarted work counts the survivors of this home."""
    home = Path(os.fsdecode(os.fsencode(tmp_path) + b"/home-\xff"))
    cli = Ferry(home, tmp_path, start_stdout=subprocess.DEVNULL)
    try:
        for n in range(2):
            cli.ok("submit", "--", "sh", "-c", f"echo {n}")
        drained = cli("work", "--drain")
        assert drained.code == 0, drained
        assert [task["state"] for task in cli.tasks()] == ["SUCCEEDED"] * 2
        assert cli.ok("logs", "1").out == b"0\n"
        cli.verify_clean()
    finally:
        cli.close()
