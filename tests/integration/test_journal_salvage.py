"""A damaged journal, through the real ``ferry`` command: what the readers show (the
tasks as of the last record before the damage, one coded line naming it, exit 4), and
``ferry journal salvage``, the operator's way out: the damaged journal moved aside
whole, a new one from every record before the damage, and exactly what was lost.

The oracle for "as of the last record before the damage" is the same home with its
journal cut right before the damaged line (a clean journal of the records before it),
read by ``ls``. Damage is one flipped bit inside a record (in a digit of its ``ts``: the
line no longer checks, and stays a whole line, so it is corruption, never a torn tail).
Salvage is also killed (failpoints, SIGKILL) at each of its steps: the journal left
behind is either the damaged one, whole and in place, or the new one, complete.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from clikit import Ferry, wait_until
from hardkit import cli_in, holds_open, tree

from ferry.failpoints import FAILPOINTS

pytestmark = pytest.mark.timeout(300)

SALVAGE_POINTS = sorted(p for p in FAILPOINTS if "salvage" in p)


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """a SUCCEEDED (with output), b FAILED, c and d SUCCEEDED by a worker, e QUEUED."""
    base = tmp_path_factory.mktemp("template")
    with cli_in(base) as cli:
        cli.ok("run", "--name", "a", "--", "echo", "out-a")
        assert cli("run", "--name", "b", "--", "false").code == 1
        cli.ok("submit", "--name", "c", "--", "true")
        cli.ok("submit", "--name", "d", "--", "true")
        cli.ok("work", "--drain")
        cli.ok("submit", "--name", "e", "--", "true")
        return cli.home


@pytest.fixture
def cli(tmp_path: Path, template: Path) -> Iterator[Ferry]:
    with cli_in(tmp_path, template) as driver:
        yield driver


# ---- damage and its oracle ----------------------------------------------------------------


def journal_dir(home: Path) -> Path:
    return home / "journal"


def segments(home: Path) -> list[Path]:
    return sorted(journal_dir(home).glob("*.jsonl"))


def record_lines(segment: Path) -> list[bytes]:
    return segment.read_bytes().rstrip(b"\0").splitlines(keepends=True)


def split_at(home: Path, seq: int) -> None:
    """The one segment split in two (as rotation makes them): records before ``seq``,
    then the rest (in a segment named ``seq``).  Never inside a batch (rotation never
    splits one): ``seq`` moves on to the next batch's first record."""
    (segment,) = segments(home)
    lines = record_lines(segment)
    while b',"more":' in lines[seq - 2][:40]:  # (the record before it is not its batch's last)
        seq += 1
    segment.write_bytes(b"".join(lines[: seq - 1]))
    second = journal_dir(home) / f"{seq:020d}.jsonl"
    second.write_bytes(b"".join(lines[seq - 1 :]))
    second.chmod(0o600)


def locate(home: Path, seq: int) -> tuple[Path, int]:
    """The segment holding record ``seq`` and the offset of its line."""
    for segment in segments(home):
        offset = 0
        for line in record_lines(segment):
            if line.startswith(b'{"v":1,"seq":%d,' % seq):
                return segment, offset
            offset += len(line)
    raise AssertionError(f"no record {seq}")


def flip(home: Path, seq: int) -> tuple[Path, int]:
    """One bit of record ``seq`` flipped, in a digit of its ts (it still parses)."""
    segment, offset = locate(home, seq)
    data = bytearray(segment.read_bytes())
    at = data.index(b'"ts":', offset) + 6
    data[at] ^= 0x01  # '0' <-> '1', ..., '8' <-> '9': a digit stays a digit
    segment.write_bytes(bytes(data))
    return segment, offset


def oracle(home: Path, seq: int, where: Path) -> Path:
    """A copy of ``home`` whose journal holds exactly the records before ``seq``."""
    shutil.copytree(home, where, symlinks=True)
    segment, offset = locate(where, seq)
    with segment.open("r+b") as f:
        f.truncate(offset)
    for later in segments(where):
        if later.name > segment.name:
            later.unlink()
    for snapshot in journal_dir(where).glob("snapshot-*.snap"):
        if int(snapshot.name[9:29]) >= seq:
            snapshot.unlink()
    return where


def tasks_in(cli: Ferry, home: Path) -> list[dict[str, Any]]:
    tasks: list[dict[str, Any]] = cli.json("--home", str(home), "ls", "--limit", "0")
    return tasks


def settled_seq(cli: Ferry, name: str) -> int:
    """The seq of the first record of the write that holds the SETTLED record of the task
    named ``name`` (SPAWNED rides in it for a short task): damage to any record of a
    batch takes the whole batch (docs/journal-format.md, "Batches"), so the records
    before that one are what is kept."""
    task_id = next(t["id"] for t in cli.tasks() if t["name"] == name)
    seq = max(
        r["seq"] for r in cli.records() if r["type"] == "SETTLED" and r["data"]["task"] == task_id
    )
    segment, offset = locate(cli.home, seq)
    before = segment.read_bytes()[:offset].splitlines()
    while before and b',"more":' in before[-1][:40]:  # (a record of the same batch)
        before.pop()
        seq -= 1
    return seq


def files(directory: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in directory.iterdir()
        if p.is_file()
    }


def damaged_copies(home: Path) -> list[Path]:
    return sorted(home.glob("journal.damaged-*"))


def leftovers(home: Path) -> list[Path]:
    return sorted(home.glob(".journal.salvage-*"))


def damaged(cli: Ferry, tmp_path: Path, where: str) -> tuple[int, Path]:
    """Damage the write that settled task c, in its first record (``where``: in a
    sealed segment, or in the middle of the last one); returns its seq and the oracle
    home."""
    seq = settled_seq(cli, "c")
    if where == "sealed":
        split_at(cli.home, seq + 2)
        cli.verify_clean()  # (split as rotation would have: still one valid journal)
    expect = oracle(cli.home, seq, tmp_path / "oracle")
    flip(cli.home, seq)
    return seq, expect


# ---- readers ------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["sealed", "last"])
def test_readers_show_the_tasks_before_the_damage_name_it_and_exit_4(
    cli: Ferry, tmp_path: Path, where: str
) -> None:
    seq, expect = damaged(cli, tmp_path, where)
    segment, offset = locate(cli.home, seq)
    before = tree(cli.home)
    shown = cli("--json", "ls", "--limit", "0")
    assert shown.code == 4 and shown.error_code() == "journal.corrupt", shown
    assert shown.json() == tasks_in(cli, expect)
    assert segment.name in shown.err and f"offset {offset}" in shown.err and str(seq) in shown.err
    # (c's SPAWNED rode in the damaged write of its SETTLED: none of that batch is read)
    assert {t["name"]: t["state"] for t in shown.json()} == {
        "a": "SUCCEEDED", "b": "FAILED", "c": "DISPATCHING", "d": "QUEUED"}  # fmt: skip
    human = cli("ls")
    assert human.code == 4 and "DISPATCHING" in human.text, human
    show = cli("--json", "show", "1")
    assert show.code == 4 and show.json()["name"] == "a", show
    logs = cli("logs", "1")
    assert (logs.code, logs.out) == (4, b"out-a\n"), logs
    assert logs.error_code() == "journal.corrupt"
    dump = cli("journal", "dump")
    assert dump.code == 4 and len(dump.out.splitlines()) == seq - 1, dump
    assert cli("lease").code in (0, 4)
    cli.refused(4, "journal.corrupt", "journal", "verify")
    cli.refused(125, "journal.corrupt", "run", "--", "true")
    cli.refused(4, "journal.corrupt", "submit", "--", "true")
    cli.refused(4, "journal.corrupt", "work", "--drain")
    assert tree(cli.home) == before


@pytest.mark.parametrize("where", ["sealed", "last"])
def test_submit_on_a_damaged_journal_says_the_damage_once(
    cli: Ferry, tmp_path: Path, where: str
) -> None:
    """``submit`` on a damaged journal printed the damage twice: "warning: compaction
    skipped: <the damage>" (the compaction it attempts before its write opened the
    store, and ``Session.compact_if_due`` took the refusal to open it for a failed
    compaction), then the same damage as its error. Now once, as its error line
    (exit 4, ``journal.corrupt``), and nothing is changed."""
    seq, _ = damaged(cli, tmp_path, where)
    segment, offset = locate(cli.home, seq)
    damage = f"(segment {segment.name}, offset {offset}, seq {seq})"
    before = tree(cli.home)
    result = cli.refused(4, "journal.corrupt", "submit", "--", "true")
    assert result.err.count(damage) == 1 and "warning" not in result.err, result.err
    as_json = cli("--json", "submit", "--", "true")
    assert as_json.code == 4 and as_json.json()["error"]["code"] == "journal.corrupt", as_json
    assert damage in as_json.json()["error"]["message"], as_json
    assert as_json.err.count(damage) <= 1 and "warning" not in as_json.err, as_json.err
    assert tree(cli.home) == before


def test_a_task_the_damage_hides_is_not_found_and_the_damage_is_said(
    cli: Ferry, tmp_path: Path
) -> None:
    seq, _ = damaged(cli, tmp_path, "last")
    result = cli.refused(5, "task.not_found", "show", "5")  # e: submitted after the damage
    assert "warning: the journal is damaged" in result.err and str(seq) in result.err


# ---- salvage ------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["sealed", "last"])
def test_salvage_keeps_every_record_before_the_damage_and_says_what_was_lost(
    cli: Ferry, tmp_path: Path, where: str
) -> None:
    full = {t["id"]: t for t in cli.tasks()}
    records = len(cli.records())
    seq, expect = damaged(cli, tmp_path, where)
    kept = {t["id"]: t for t in tasks_in(cli, expect)}
    original = files(journal_dir(cli.home))
    before = tree(cli.home)

    dry = cli.json("journal", "salvage", "--dry-run")
    assert tree(cli.home) == before, "a dry run changes nothing"
    report = cli.json("journal", "salvage")
    assert report["salvaged"] and not dry["salvaged"]
    for key in ("kept", "lost_records", "lost_readable", "tasks", "damage"):
        assert report[key] == dry[key], key
    assert report["kept"]["last_seq"] == seq - 1
    assert report["lost_records"] == records - (seq - 1)
    assert report["lost_readable"] == records - seq  # (all but the damaged line)
    assert report["lost_guessed"] == [seq], "the damaged line still parses"
    assert report["damage"][0]["code"] == "journal.corrupt"
    expected = {
        (task_id, task["state"], kept[task_id]["state"] if task_id in kept else None)
        for task_id, task in full.items()
        if task_id not in kept
        or (task["state"], task["attempt"]) != (kept[task_id]["state"], kept[task_id]["attempt"])
    }
    assert {(t["task"], t["before"], t["after"]) for t in report["tasks"]} == expected
    assert len(expected) == 3  # c SUCCEEDED -> RUNNING, d -> QUEUED, e gone

    (copy,) = damaged_copies(cli.home)
    assert str(copy) == report["damaged_copy"]
    assert files(copy) == original, "the damaged journal is kept whole, unchanged"
    assert not leftovers(cli.home)
    cli.verify_clean()
    assert cli.tasks() == tasks_in(cli, expect)  # and exit 0 now
    said = cli.ok("journal", "salvage", "--dry-run", codes=(1,))
    assert "not damaged" in said.err
    # Ferry goes on from there: recovery decides c (its runner is long gone), d runs.
    cli.recover()
    cli.ok("work", "--drain")
    cli.ok("run", "--", "true")
    cli.verify_clean()
    assert files(copy) == original


def test_salvage_refuses_a_torn_tail_and_a_healthy_journal(cli: Ferry) -> None:
    tasks = cli.tasks()
    before = tree(cli.home)
    refused = cli.refused(1, "salvage.not_damaged", "journal", "salvage")
    assert "nothing to salvage" in refused.err
    before.pop("compact.lock", None)
    after = tree(cli.home)
    after.pop("compact.lock", None)
    assert after == before
    (segment,) = segments(cli.home)
    with segment.open("r+b") as f:
        f.seek(len(b"".join(record_lines(segment))))
        f.write(b'{"v":1,"seq":99,"epo')  # a torn tail, as a crash mid-append leaves
    torn = tree(cli.home)
    refused = cli.refused(1, "salvage.torn_tail", "journal", "salvage")
    assert "ferry journal repair" in refused.err
    cli.refused(1, "salvage.torn_tail", "journal", "salvage", "--dry-run")
    assert tree(cli.home) == torn
    cli.ok("journal", "repair")
    cli.verify_clean()
    assert not damaged_copies(cli.home) and not leftovers(cli.home)
    assert cli.tasks() == tasks


def test_salvage_refuses_while_a_worker_has_the_journal_open(cli: Ferry, tmp_path: Path) -> None:
    """A damaged sealed segment under a running worker (it read it long ago): moving the
    journal away under it would lose its writes. Refused (75); then, once it stopped,
    done."""
    seq = settled_seq(cli, "c")
    split_at(cli.home, seq + 2)
    worker = cli.start("work")
    # It has the journal open for good once it ran the queued task (e): opening, it
    # also reads segments for a moment, before it pins its own.
    wait_until(lambda: cli.tasks()[-1]["state"] == "SUCCEEDED", what="the worker to run e")
    sealed, _ = flip(cli.home, seq)
    before = sealed.read_bytes()
    refused = cli.refused(75, "salvage.in_use", "journal", "salvage")
    assert "stop it" in refused.err
    assert sealed.read_bytes() == before, "(the worker may write: the active segment)"
    assert not damaged_copies(cli.home) and not leftovers(cli.home)
    os.kill(worker.pid, signal.SIGTERM)
    assert worker.wait(timeout=60) in (0, 4, 143)
    assert cli.json("journal", "salvage")["salvaged"]
    cli.verify_clean()


@pytest.mark.parametrize(
    "point",
    [p if p == "after:salvage_swap" else pytest.param(p, marks=pytest.mark.crash)
     for p in SALVAGE_POINTS],
)  # fmt: skip
def test_a_salvage_killed_at_each_step_leaves_one_whole_journal(
    cli: Ferry, tmp_path: Path, point: str
) -> None:
    seq, expect = damaged(cli, tmp_path, "last")
    original = files(journal_dir(cli.home))
    killed = cli("journal", "salvage", failpoints=point)
    assert killed.code == -signal.SIGKILL, killed
    swapped = point == "after:salvage_swap"
    report = cli("--json", "journal", "verify").json()
    if swapped:  # the new journal is in use, complete; the damaged one beside it
        assert report["status"] == "clean", report
        assert cli.tasks() == tasks_in(cli, expect)
        (leftover,) = leftovers(cli.home)
        assert files(leftover) == original
    else:  # the damaged journal is in place, whole; the build is not in use
        assert report["status"] == "corrupt", report
        assert files(journal_dir(cli.home)) == original
        shown = cli("--json", "ls", "--limit", "0")
        assert shown.code == 4 and shown.json() == tasks_in(cli, expect)
        cli.refused(125, "journal.corrupt", "run", "--", "true")
    again = cli.ok("journal", "salvage")  # finishes it, or salvages (again)
    if swapped:
        assert "renamed" in again.text and "journal.damaged-" in again.text
    (copy,) = damaged_copies(cli.home)
    assert files(copy) == original
    assert not leftovers(cli.home)
    cli.verify_clean()
    assert cli.tasks() == tasks_in(cli, expect)
    assert seq - 1 == len(cli.records())
    cli.ok("run", "--", "true")
    cli.verify_clean()


def test_a_writer_that_opens_the_journal_during_a_salvage_writes_into_the_new_one(
    cli: Ferry,
) -> None:
    """Damage that the snapshot covers (in the first record): ``run`` does not read
    there and goes on; salvage moves it aside, losing nothing. A ``run`` that opened
    the old journal while salvage swapped it waits, then writes into the new one (it
    would have written into the damaged copy, lost)."""
    for _ in range(3):  # (a segment larger than one bisection probe: 8 KiB)
        cli.ok("submit", "--env", "PAD=" + "n" * 1500, "--", "true")
    cli.ok("journal", "compact")
    flip(cli.home, 1)
    assert cli("--json", "journal", "verify").json()["status"] == "corrupt"
    cli.ok("run", "--name", "before", "--", "true")  # it does not read record 1
    tasks = cli.tasks()
    salvage = cli.start_stopped("journal", "salvage", at="before:salvage_swap")
    (segment,) = segments(cli.home)
    late = cli.start("run", "--name", "late", "--", "true")
    wait_until(lambda: holds_open(late.pid, segment), what="run to open the old journal")
    os.kill(salvage.pid, signal.SIGCONT)
    assert salvage.wait(timeout=60) == 0
    assert late.wait(timeout=60) == 0
    (copy,) = damaged_copies(cli.home)
    assert not any(b'"name":"late"' in p.read_bytes() for p in copy.glob("*.jsonl"))
    after = cli.tasks()
    assert after[:-1] == tasks, "nothing lost: the snapshot covered the damage"
    assert (after[-1]["name"], after[-1]["state"]) == ("late", "SUCCEEDED")
    cli.verify_clean()


# ---- a damaged snapshot or archive --------------------------------------------------------


def _compacted(cli: Ferry, *, drop_segments: bool) -> None:
    if drop_segments:  # the records the snapshot covers go: nothing older to read again
        split_at(cli.home, len(cli.records()))
    cli.ok("journal", "compact")
    assert len(segments(cli.home)) == 1


def _rewrite_snapshot_data(path: Path, data: bytes) -> None:
    head, _, _ = path.read_bytes().partition(b"\n")
    header = head[: head.rindex(b',"length"')]
    header += b',"length":%d,"data_crc":"%08x"' % (len(data), zlib.crc32(data))
    path.write_bytes(header + b',"crc":"%08x"}\n' % zlib.crc32(header) + data)


@pytest.mark.parametrize("damage", ["archive", "snapshot"])
def test_a_damaged_snapshot_or_archive_with_the_records_still_there_loses_nothing(
    cli: Ferry, damage: str
) -> None:
    full = cli.tasks()
    _compacted(cli, drop_segments=False)
    (archive,) = (cli.home / "archive").glob("settled-*.jsonl")  # (and its index)
    if damage == "archive":
        data = bytearray(archive.read_bytes())
        data[len(data) // 2] ^= 0x01
        archive.write_bytes(bytes(data))
    else:
        (snapshot,) = journal_dir(cli.home).glob("snapshot-*.snap")
        _rewrite_snapshot_data(snapshot, b'{"a": "table from some other tool"}')
    code = "journal.snapshot_mismatch"
    shown = cli("--json", "ls", "--limit", "0")
    assert shown.code == 4 and shown.error_code() == code, shown
    if damage == "snapshot":
        assert shown.json() == full  # read from seq 1 instead
    report = cli.json("journal", "salvage")
    assert (report["lost_records"], report["tasks"]) == (0, [])
    # (its archive holds nothing the records do not say: not kept aside, not named)
    assert (report["archives"], report["tasks_unknown"]) == ([], [])
    assert not [p for p in (cli.home / "archive").iterdir() if p.name.startswith("kept-")]
    assert report["kept"]["snapshot_seq"] is None, "from seq 1: the records were there"
    assert cli.tasks() == full
    cli.verify_clean()


def test_a_damaged_archive_whose_records_are_gone_loses_its_settled_tasks(cli: Ferry) -> None:
    full = cli.tasks()
    _compacted(cli, drop_segments=True)
    (archive,) = (cli.home / "archive").glob("settled-*.jsonl")  # (and its index)
    data = bytearray(archive.read_bytes())
    data[data.rindex(b'"exit_code":') + 12] ^= 0x01  # (a digit: every line still parses)
    archive.write_bytes(bytes(data))
    shown = cli("--json", "ls", "--limit", "0")
    assert shown.code == 4 and shown.error_code() == "journal.snapshot_mismatch", shown
    assert archive.name in shown.err
    assert [t["name"] for t in shown.json()] == ["e"], "the live task; the settled are lost"
    damaged_bytes = archive.read_bytes()
    report = cli.json("journal", "salvage")
    assert report["dropped_archives"] == [archive.name]
    (entry,) = report["archives"]
    assert (entry["name"], entry["status"], entry["checked_by"]) == (archive.name, "damaged",
                                                                    "sha256")  # fmt: skip
    assert entry["kept_as"] == f"archive/damaged-{archive.name}"
    kept = cli.home / "archive" / f"damaged-{archive.name}"
    assert kept.read_bytes() == damaged_bytes, "the damaged archive is kept"
    gone = {(t["task"], t["before"], t["after"]) for t in report["tasks"]}
    assert gone == {(t["id"], t["state"], None) for t in full if t["name"] != "e"}
    assert [t["name"] for t in cli.tasks()] == ["e"]
    cli.verify_clean()
    cli.ok("work", "--drain")
    cli.ok("journal", "compact")  # (prunes the archives no snapshot names: not that one)
    cli.verify_clean()
    assert kept.read_bytes() == damaged_bytes


def test_the_journal_commands_of_a_shared_database_are_not_local(cli: Ferry) -> None:
    cli.env["FERRY_DATABASE_URL"] = "postgresql://nobody@127.0.0.1:9/none"  # (discard port)
    for args in (["journal", "salvage"], ["journal", "dump"]):
        cli.refused(2, "usage.not_local", *args)


# ---- archives the salvaged journal no longer names -----------------------------------------
#
# A sixteenth-session review: with no usable snapshot left (the only one halved, the
# records it covers compacted away), salvage reported 1 task gone of 121, and the intact
# settled-task archive, which the new journal does not name, was neither kept nor named:
# the next two compactions pruned it. With the archive itself lost, salvage said "kept
# as archive/damaged-..." (no such file) and "no task's state changed".


def _all_compacted(cli: Ferry) -> None:
    """A compaction that took every record: what happened before it is only in its
    snapshot and its archive (the journal goes on in an empty segment)."""
    records = len(cli.records())
    split_at(cli.home, records + 1)
    cli.ok("journal", "compact")
    assert [p.name for p in segments(cli.home)] == [f"{records + 1:020d}.jsonl"]


def _halve(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _archive_files(home: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in (home / "archive").iterdir()}


def _compact_twice(cli: Ferry) -> None:
    """What prunes every ``settled-*``/``index-*`` file the last two snapshots do not name."""
    for _ in range(2):
        cli.ok("submit", "--", "true")
        cli.ok("journal", "compact")


def _unusable_snapshot_home(cli: Ferry) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
    """The first reproducer: a..d settled and e queued, all compacted away; then ``late``
    submitted; then the only snapshot halved. Returns the tasks before the damage and
    the archive files (one archive and its index, intact)."""
    _all_compacted(cli)
    cli.ok("submit", "--name", "late", "--not-before", "+100000", "--", "true")
    full = cli.tasks()
    archives = _archive_files(cli.home)
    assert sorted(name.split("-")[0] for name in archives) == ["index", "settled"]
    (snapshot,) = journal_dir(cli.home).glob("snapshot-*.snap")
    _halve(snapshot)
    return full, archives


def test_salvage_with_no_usable_snapshot_keeps_the_intact_archive_and_names_every_task_lost(
    cli: Ferry,
) -> None:
    full, archives = _unusable_snapshot_home(cli)
    by_name = {t["name"]: t for t in full}
    (name,) = (n for n in archives if n.startswith("settled-"))
    (index,) = (n for n in archives if n.startswith("index-"))
    before = tree(cli.home)
    report = cli.json("journal", "salvage", "--dry-run")  # (as JSON: the next test)
    assert tree(cli.home) == before, "a dry run changes nothing"
    text = cli.ok("journal", "salvage").text
    assert report["archives"] == [
        {
            "name": name,
            "status": "whole",
            "checked_by": "index",
            "tasks": 4,
            "lost": 4,
            "kept_as": f"archive/kept-{name}",
            "index_kept_as": f"archive/kept-{index}",
        }
    ]
    # Every task is gone but e, which only the halved snapshot knew: said, not counted.
    gone = {(t["task"], t["before"], t["after"]) for t in report["tasks"]}
    assert gone == {(t["id"], t["state"], None) for t in full if t["name"] != "e"}, (
        "a..d (from the archive) and late (from a readable record)"
    )
    assert by_name["e"]["id"] not in text
    # (The records before the segments left were compacted, not of the damage's batch:
    # it said "seq 1 to N, before the damage, go with it: they are of its batch".)
    assert report["dropped_with_the_damage"] is None and "of its batch" not in text, text
    (unknown,) = report["tasks_unknown"]
    assert "snapshot-" in unknown and "not known" in unknown
    assert f"tasks now gone ({len(full) - 1}):" in text
    assert f"kept as archive/kept-{name}" in text and "not known" in text
    assert "no task's state changed" not in text
    kept = cli.home / "archive" / f"kept-{name}"
    assert kept.read_bytes() == archives[name]
    assert (cli.home / "archive" / f"kept-{index}").read_bytes() == archives[index]
    cli.verify_clean()
    assert cli.tasks() == []
    _compact_twice(cli)
    left = _archive_files(cli.home)
    assert name not in left, "(the new journal does not name it: pruned)"
    assert left[f"kept-{name}"] == archives[name] and left[f"kept-{index}"] == archives[index]
    cli.verify_clean()


def test_the_salvage_report_as_json_is_what_its_dry_run_said(cli: Ferry) -> None:
    full, archives = _unusable_snapshot_home(cli)
    dry = cli.json("journal", "salvage", "--dry-run")
    report = cli.json("journal", "salvage")
    assert report["salvaged"] and not dry["salvaged"]
    for key in ("kept", "lost_records", "tasks", "archives", "tasks_unknown", "damage"):
        assert report[key] == dry[key], key
    assert len(report["tasks"]) == len(full) - 1
    for entry in report["archives"]:
        for key in ("kept_as", "index_kept_as"):
            assert (cli.home / entry[key]).read_bytes() == archives[entry[key][13:]]


def test_a_task_whose_submission_is_lost_but_whose_later_records_read_is_named_gone(
    cli: Ferry,
) -> None:
    """e was queued when its submission was compacted away; a worker ran it since.
    With the snapshot halved, its end still reads, but nothing can fold it: e is named
    gone, in a state not known (it was counted nowhere)."""
    full = {t["name"]: t for t in cli.tasks()}
    _all_compacted(cli)
    cli.ok("work", "--drain")
    (snapshot,) = journal_dir(cli.home).glob("snapshot-*.snap")
    _halve(snapshot)
    report = cli.json("journal", "salvage", "--dry-run")
    rows = {t["task"]: (t["before"], t["attempt_before"], t["after"]) for t in report["tasks"]}
    assert rows == {
        task["id"]: (None, None, None) if name == "e" else (task["state"], 1, None)
        for name, task in full.items()
    }
    text = cli.ok("journal", "salvage").text
    assert f"  {full['e']['id']}  was in a state not known" in text, text
    assert f"tasks now gone ({len(full)}):" in text
    cli.verify_clean()


@pytest.mark.parametrize("index", ["index kept", "index lost too"])
def test_salvage_of_a_lost_archive_names_its_tasks_and_keeps_only_what_is_there(
    cli: Ferry, index: str
) -> None:
    """The second reproducer: the archive lost after compaction took its records."""
    full = cli.tasks()
    _compacted(cli, drop_segments=True)
    (archive,) = (cli.home / "archive").glob("settled-*.jsonl")
    (index_file,) = (cli.home / "archive").glob("index-*.idx")
    index_bytes = index_file.read_bytes()
    archive.unlink()
    if index == "index lost too":
        index_file.unlink()
    result = cli.ok("journal", "salvage")
    text = result.text
    assert "damaged-settled-" not in text, "no file it did not keep"
    assert not (cli.home / "archive" / f"damaged-{archive.name}").exists()
    assert "no task's state changed" not in text
    assert [t["name"] for t in cli.tasks()] == ["e"]
    settled = [t for t in full if t["name"] != "e"]
    kept_index = cli.home / "archive" / f"damaged-{index_file.name}"
    if index == "index kept":
        # Its index still names each task: each is named, and the index is kept.
        assert f"tasks now gone ({len(settled)}):" in text
        assert all(f"  {t['id']}  was {t['state']}" in text for t in settled), text
        assert f"index kept as archive/damaged-{index_file.name}" in text
        assert "not known" not in text
        assert kept_index.read_bytes() == index_bytes
    else:
        # Nothing names its tasks but the snapshot's count: said, never "nothing lost".
        assert f"{len(settled)} settled task(s)" in text and "not known" in text, text
        assert not kept_index.exists()
    cli.verify_clean()
    _compact_twice(cli)
    if index == "index kept":
        assert kept_index.read_bytes() == index_bytes
    cli.verify_clean()


def test_an_archive_newer_than_what_salvage_keeps_is_kept_and_its_tasks_counted(
    cli: Ferry,
) -> None:
    """An older snapshot is usable, the newer one is halved, and the damage is in a
    record between them: the newer snapshot's archive holds f's end, which the kept
    records no longer reach. The archive is kept (checked by its index) and f named."""
    cli.ok("journal", "compact")
    (older,) = journal_dir(cli.home).glob("snapshot-*.snap")
    older_bytes = older.read_bytes()
    cli.ok("run", "--name", "f", "--", "true")
    cli.ok("journal", "compact")  # (removes the older snapshot: a crash could have not)
    older.write_bytes(older_bytes)
    newer = max(journal_dir(cli.home).glob("snapshot-*.snap"))
    assert newer != older
    fresh = set(_archive_files(cli.home)) - set(_compacted_names(older_bytes))
    (name,) = (n for n in fresh if n.startswith("settled-"))
    archive_bytes = (cli.home / "archive" / name).read_bytes()
    f_id = next(t["id"] for t in cli.tasks() if t["name"] == "f")
    seq = settled_seq(cli, "f")
    flip(cli.home, seq)
    _halve(newer)
    report = cli.json("journal", "salvage")
    assert report["kept"]["snapshot_seq"] == int(older.name[9:29])
    assert report["kept"]["last_seq"] == seq - 1
    (entry,) = report["archives"]
    assert (entry["name"], entry["status"], entry["checked_by"]) == (name, "whole", "index")
    assert (cli.home / entry["kept_as"]).read_bytes() == archive_bytes
    rows = {t["task"]: (t["before"], t["after"]) for t in report["tasks"]}
    assert rows[f_id][0] == "SUCCEEDED" and rows[f_id][1] in ("DISPATCHING", "RUNNING")
    cli.verify_clean()
    _compact_twice(cli)
    assert (cli.home / entry["kept_as"]).read_bytes() == archive_bytes


def _compacted_names(snapshot: bytes) -> list[str]:
    """The archive files (and indexes) a snapshot file's data names."""
    import orjson

    data = orjson.loads(snapshot.partition(b"\n")[2])
    refs = data.get("settled_archives", [])
    return [r["name"] for r in refs] + [r["index"] for r in refs if "index" in r]


@pytest.mark.parametrize(
    "point",
    [p if p == "after:salvage_swap" else pytest.param(p, marks=pytest.mark.crash)
     for p in SALVAGE_POINTS],
)  # fmt: skip
def test_a_salvage_killed_at_each_step_never_loses_the_archive_it_left_out(
    cli: Ferry, point: str
) -> None:
    full, archives = _unusable_snapshot_home(cli)
    (name,) = (n for n in archives if n.startswith("settled-"))
    killed = cli("journal", "salvage", failpoints=point)
    assert killed.code == -signal.SIGKILL, killed
    swapped = point == "after:salvage_swap"
    if swapped:  # the new journal is in use: compactions prune what it does not name
        _compact_twice(cli)
        assert name not in _archive_files(cli.home)
    again = cli.ok("journal", "salvage")
    assert f"archive/kept-{name}" in again.text, again.text
    if not swapped:
        assert f"tasks now gone ({len(full) - 1}):" in again.text
    _compact_twice(cli)
    assert _archive_files(cli.home)[f"kept-{name}"] == archives[name]
    cli.verify_clean()


def test_a_second_salvage_does_not_count_again_what_the_first_kept_aside(cli: Ferry) -> None:
    # (Found by a review: the first salvage, with no usable snapshot, starts the journal
    # again at seq 1; the older archives it kept aside have higher numbers than any new
    # record, and the second salvage counted their 4 tasks as lost again.)
    _unusable_snapshot_home(cli)
    cli.ok("journal", "salvage")  # (a second one within the same second: named "...-2")
    for n in range(3):
        cli.ok("run", "--name", f"new{n}", "--", "true")
    new = {t["id"] for t in cli.tasks()}
    flip(cli.home, 4)
    report = cli.json("journal", "salvage")
    assert report["archives"] == [] and report["tasks_unknown"] == []
    assert report["tasks"] and {t["task"] for t in report["tasks"]} <= new


def test_salvage_says_why_records_before_the_damage_in_its_batch_are_not_kept(
    tmp_path: Path,
) -> None:
    """A bit flipped in record 20 of a ``submit --from`` of 30 (one batch): the records
    of the batch before it are readable, and dropped with it (a batch is kept whole or
    not at all); the report said 'lost: seq 2 to 31' and named the damage at seq 21,
    not why 2 to 20 went too (a review)."""
    with cli_in(tmp_path) as cli:
        cli.ok("submit", "--", "true")
        batch = tmp_path / "batch.jsonl"
        batch.write_text("".join('{"argv": ["true"]}\n' for _ in range(30)))
        cli.ok("submit", "--from", str(batch))
        flip(cli.home, 21)
        report = cli.json("journal", "salvage", "--dry-run")
        assert report["kept"]["last_seq"] == 1
        assert report["dropped_with_the_damage"] == [2, 20]
        said = cli.ok("journal", "salvage", "--dry-run").text
        assert "seq 2 to 20, before the damage, go with it: they are of its batch" in said
