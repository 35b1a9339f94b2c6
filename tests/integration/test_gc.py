"""``ferry gc`` end to end, through the real command: what it forgets and frees, what it
keeps (tasks in flight, a quarantined task whose orphan lives, an unsafe key's task, a
key that succeeded), its dry run, and crashes at every step of it: the journal verifies,
``ls``/``show`` tell the truth, and a second ``gc`` finishes the job."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest
from clikit import Ferry, wait_until

from ferry.core.ids import new_task_id

pytestmark = pytest.mark.timeout(600)


def run_tasks(ferry: Ferry, count: int, *, fail: bool = False) -> list[str]:
    """``count`` tasks run to their end (queued in one write, run by one worker), each
    writing to both streams; their ids, in submission order."""
    end = "; exit 3" if fail else ""
    lines = "".join(f"echo out {n}; echo err {n} >&2{end}\n" for n in range(count))
    ids = ferry.ok("submit", "--lines", "-", stdin=lines.encode()).text.split()
    ferry.ok("work", "--drain", "--poll", "0.05", codes=(1,) if fail else (0,))
    return ids


def log_dirs(ferry: Ferry) -> set[str]:
    directory = ferry.home / "logs"
    return set(os.listdir(directory)) if directory.is_dir() else set()


def archived_ids(ferry: Ferry) -> str:
    """Every archive's bytes, as text (task ids are plain in them)."""
    directory = ferry.home / "archive"
    return "".join(p.read_text() for p in directory.iterdir()) if directory.is_dir() else ""


def ids_listed(ferry: Ferry) -> list[str]:
    return [str(task["id"]) for task in ferry.tasks()]


def test_gc_forgets_settled_tasks_and_frees_their_logs_and_history(ferry: Ferry) -> None:
    old = run_tasks(ferry, 3)
    failed = run_tasks(ferry, 2, fail=True)
    ferry.ok("journal", "compact")  # their records go to an archive
    assert all(task_id in archived_ids(ferry) for task_id in old + failed)
    queued = ferry.ok("submit", "--", "true").text.strip()

    # The default cut-off (7 days) forgets none of them.
    report = ferry.json("gc")
    assert report["forgotten"] == [] and ids_listed(ferry) == [*old, *failed, queued]

    report = ferry.json("gc", "--older-than", "0s", "--state", "succeeded")
    assert [t["id"] for t in report["forgotten"]] == old
    assert all(t["state"] == "SUCCEEDED" and t["bytes"] > 0 for t in report["forgotten"])
    assert all(t["ended_at"].endswith("Z") for t in report["forgotten"])  # (RFC 3339)
    assert report["ended_before"].endswith("Z")
    assert report["log_bytes"] == sum(t["bytes"] for t in report["forgotten"]) > 0
    assert report["compacted"] is True
    assert ids_listed(ferry) == [*failed, queued]
    assert log_dirs(ferry) == set(failed)
    assert not any(task_id in archived_ids(ferry) for task_id in old)
    for task_id in old:
        ferry.refused(5, "task.not_found", "show", task_id)
    ferry.refused(5, "task.not_found", "show", "1")  # its number is not reused
    assert ferry.task("6")["id"] == queued
    ferry.verify_clean()

    # The human summary, then nothing left to do.
    text = ferry.ok("gc", "--older-than", "0s").text
    assert text.startswith("forgot 2 tasks (2 FAILED) that ended before "), text
    assert "of logs and " in text and "of history" in text, text
    assert ids_listed(ferry) == [queued] and log_dirs(ferry) == set()
    assert ferry.ok("gc", "--older-than", "0s").text.startswith("nothing to forget")
    assert ferry.ok("-q", "gc", "--older-than", "0s").text == ""
    # A new process, from the snapshot and archives alone, agrees.
    assert [t["id"] for t in ferry.tasks()] == [queued]
    ferry.verify_clean()


def test_dry_run_prints_the_plan_and_changes_nothing(ferry: Ferry) -> None:
    ids = run_tasks(ferry, 2)
    records = len(ferry.records())
    plan = ferry.json("gc", "--older-than", "0s", "--dry-run")
    assert plan["dry_run"] is True and [t["id"] for t in plan["forgotten"]] == ids
    assert all(t["bytes"] > 0 for t in plan["forgotten"])
    text = ferry.ok("gc", "--older-than", "0s", "--dry-run").text
    assert text.startswith("would forget 2 tasks (2 SUCCEEDED)"), text
    assert len(ferry.records()) == records and ids_listed(ferry) == ids
    assert log_dirs(ferry) == set(ids)
    done = ferry.json("gc", "--older-than", "0s")
    assert [t["id"] for t in done["forgotten"]] == ids


def test_gc_never_touches_a_task_in_flight(ferry: Ferry) -> None:
    done = run_tasks(ferry, 1)
    worker = ferry.start("run", "--", "sh", "-c", "echo started; exec sleep 300")
    running = wait_until(
        lambda: next((t for t in ferry.tasks() if t["state"] == "RUNNING"), None),
        what="the task to run",
    )
    wait_until(lambda: running["id"] in log_dirs(ferry), what="its log (made at its first byte)")
    report = ferry.json("gc", "--older-than", "0s")
    assert [t["id"] for t in report["forgotten"]] == done
    assert ferry.task(running["id"])["state"] == "RUNNING"
    assert running["id"] in log_dirs(ferry)
    worker.send_signal(signal.SIGTERM)
    worker.wait(timeout=30)


def test_a_key_that_succeeded_is_not_run_again_after_gc(ferry: Ferry, tmp_path: Path) -> None:
    """The key's guarantee outlives its task: gc keeps a tombstone in the key index, so a
    forgotten success still skips the key (exit 0, nothing run)."""
    mark = tmp_path / "ran"
    ferry.ok("run", "--key", "deploy-1", "--", "true")
    first = ids_listed(ferry)[0]
    assert [t["id"] for t in ferry.json("gc", "--older-than", "0s")["forgotten"]] == [first]
    again = ferry.ok("run", "--key", "deploy-1", "--", "touch", str(mark))
    assert "already succeeded" in again.err and first in again.err
    assert not mark.exists() and ids_listed(ferry) == []
    shown = ferry.json("run", "--key", "deploy-1", "--", "touch", str(mark))
    assert (
        shown["id"] == first and shown["state"] == "SUCCEEDED" and "forgotten" in shown["evidence"]
    )
    assert ferry.ok("submit", "--key", "deploy-1", "--", "true").text.strip() == first
    ferry.ok("journal", "compact")  # the tombstone survives a snapshot
    ferry.ok("run", "--key", "deploy-1", "--", "touch", str(mark))
    assert not mark.exists() and ids_listed(ferry) == []
    # A key whose task FAILED is forgotten with it: the key runs again.
    ferry.ok("run", "--key", "lint", "--", "false", codes=(1,))
    ferry.json("gc", "--older-than", "0s")
    ferry.ok("run", "--key", "lint", "--", "touch", str(mark))
    assert mark.exists()


def test_an_unsafe_keys_task_and_a_live_orphans_task_are_kept(ferry: Ferry) -> None:
    argv = ["/bin/sh", "-c", "[ -e /nonexistent ] || exec sleep 300"]
    assert ferry("run", "--key", "K", "--", *argv, failpoints="after:SPAWNED").code == -9
    orphan = ferry.tasks()[-1]
    ferry.end_at_close(int(orphan["pid"]))
    assert ferry.recover()[0] == 3
    assert ferry.task(orphan["id"])["reason"] == "QUARANTINED_ORPHAN_ALIVE"
    done = run_tasks(ferry, 1)

    report = ferry.json("gc", "--older-than", "0s")
    assert [t["id"] for t in report["forgotten"]] == done
    assert [(k["id"], k["why"][:11]) for k in report["kept"]] == [(orphan["id"], "quarantined")]
    text = ferry.ok("gc", "--older-than", "0s").text
    assert "kept 1 task:" in text and orphan["id"] in text and "ferry kill" in text, text
    heartbeats = ferry.home / "heartbeats"
    assert any(name.startswith(orphan["id"]) for name in os.listdir(heartbeats))

    # Its orphan killed: still kept, for its key waits for an operator.
    ferry.ok("kill", orphan["id"], "--signal", "KILL")
    report = ferry.json("gc", "--older-than", "0s")
    assert report["forgotten"] == [] and "'K' waits for an operator" in report["kept"][0]["why"]
    ferry.ok("resolve", orphan["id"], "--as", "failed")
    report = ferry.json("gc", "--older-than", "0s")
    assert [t["id"] for t in report["forgotten"]] == [orphan["id"]]
    assert not any(name.startswith(orphan["id"]) for name in os.listdir(heartbeats))
    assert log_dirs(ferry) == set()
    ferry.verify_clean()


def test_gc_removes_only_the_files_of_tasks_it_forgot(ferry: Ferry) -> None:
    """A log directory the journal does not know (a state directory shared with another
    backend, a journal salvaged: logs a person may want) is not gc's to remove: only the
    files of tasks the journal says were forgotten are."""
    [done] = run_tasks(ferry, 1)
    logs = ferry.home / "logs"
    stranger = new_task_id(1_000_000 * 1_000_000, os.urandom(4))  # (1970: long before)
    (logs / stranger).mkdir()
    (logs / stranger / "1.stdout").write_bytes(b"x" * 5000)
    (ferry.home / "heartbeats" / f"{stranger}.1").write_bytes(b"")
    report = ferry.json("gc", "--older-than", "0s")
    assert [t["id"] for t in report["forgotten"]] == [done] and report["earlier"] == []
    assert log_dirs(ferry) == {stranger}
    assert (ferry.home / "heartbeats" / f"{stranger}.1").exists()


def test_files_a_killed_gc_left_go_with_the_next_gc_or_compaction(ferry: Ferry) -> None:
    first, second = run_tasks(ferry, 2)
    killed = ferry("gc", "--older-than", "0s", failpoints="after:FORGOTTEN")
    assert killed.code == -signal.SIGKILL
    assert ids_listed(ferry) == [] and log_dirs(ferry) == {first, second}
    plan = ferry.json("gc", "--older-than", "0s", "--dry-run")
    assert sorted(e["id"] for e in plan["earlier"]) == sorted([first, second])
    assert log_dirs(ferry) == {first, second}
    # Any compaction that stops naming them (here the explicit one) removes them first.
    ferry.ok("journal", "compact")
    assert log_dirs(ferry) == set()
    assert ferry.json("gc", "--older-than", "0s")["earlier"] == []
    ferry.verify_clean()


@pytest.mark.skipif(not shutil.which("strace"), reason="needs strace")
def test_a_gc_whose_compaction_finds_the_disk_full_says_what_it_did(ferry: Ferry) -> None:
    """The disk full at gc's compaction (ENOSPC on its first write(), injected with
    strace): the tasks are forgotten and their logs freed all the same. gc said only
    ``error[io.no_space]`` (125), no summary, as if it had done nothing (found by a
    review); now its summary, a warning that the history waits for the next compaction,
    exit 0, and no temporary file left behind."""
    run_tasks(ferry, 2)
    strace = ("strace", "-f", "-qq", "-o", os.devnull, "-e", "trace=write",
              "-e", "inject=write:error=ENOSPC:when=1")  # fmt: skip
    result = ferry("gc", "--older-than", "0s", command=(*strace, *ferry.command))
    assert result.code == 0, result
    assert "forgot 2 tasks" in result.text and "history goes at the next compaction" in result.text
    assert "No space left on device" in result.text, result
    assert ids_listed(ferry) == [] and log_dirs(ferry) == set()
    assert not [p for p in (ferry.home / "journal").iterdir() if p.name.endswith(".tmp")]
    ferry.ok("journal", "compact")
    ferry.verify_clean()


def test_bad_arguments_are_usage_errors(ferry: Ferry) -> None:
    ferry.refused(2, "usage.bad_duration", "gc", "--older-than", "7 days")
    ferry.refused(2, "usage.bad_duration", "gc", "--older-than", "-1d")
    ferry.refused(2, "usage.invalid", "gc", "--state", "RUNNING")


# ---- crashes in the middle of a gc -------------------------------------------------------


def state_of_things(ferry: Ferry) -> tuple[list[str], set[str]]:
    """The tasks ``ls`` lists and the log directories there are."""
    return ids_listed(ferry), log_dirs(ferry)


@pytest.mark.crash
@pytest.mark.parametrize(
    "point",
    [
        "before:FORGOTTEN",  # nothing journaled
        "after:FORGOTTEN",  # journaled, no file removed
        "after:gc_remove=2",  # journaled, some files removed
        "before:snapshot_write",  # files removed, the archives being rewritten
        "after:snapshot_write",  # the snapshot written, old archives not pruned
        "after:snapshot_write=2",  # the second compaction's snapshot written
    ],
)
def test_a_gc_killed_at_any_step_leaves_the_truth_and_a_second_gc_finishes(
    ferry: Ferry, point: str
) -> None:
    old = run_tasks(ferry, 3)
    ferry.ok("journal", "compact")
    kept = run_tasks(ferry, 1, fail=True)
    killed = ferry("gc", "--older-than", "0s", "--state", "SUCCEEDED", failpoints=point)
    assert killed.code == -signal.SIGKILL, killed
    ferry.verify_clean()
    listed, dirs = state_of_things(ferry)
    forgotten = [task_id for task_id in old if task_id not in listed]
    assert forgotten in ([], old), "FORGOTTEN is one write: all of them or none"
    assert kept[0] in listed and kept[0] in dirs
    assert set(listed) <= dirs, "a task ls shows has its logs"
    for task_id in old:
        if task_id in listed:
            assert ferry.task(task_id)["state"] == "SUCCEEDED"
        else:
            ferry.refused(5, "task.not_found", "show", task_id)

    second = ferry.json("gc", "--older-than", "0s", "--state", "SUCCEEDED")
    again = {t["id"] for t in second["forgotten"]} | {e["id"] for e in second["earlier"]}
    assert set(old) - set(forgotten) <= again
    assert state_of_things(ferry) == (kept, set(kept))
    assert not any(task_id in archived_ids(ferry) for task_id in old)
    ferry.verify_clean()
    assert ferry.json("gc", "--older-than", "0s", "--state", "SUCCEEDED")["earlier"] == []


def test_a_task_a_queued_task_comes_after_is_kept_until_that_one_ran(ferry: Ferry) -> None:
    """gc must not doom a dependant: a task queued ``--after`` a settled one needs its
    SUCCEEDED when it is claimed (here its group is paused while gc runs)."""
    [first] = run_tasks(ferry, 1)
    then = ferry.ok("submit", "--group", "later", "--after", first, "--", "true").text.strip()
    ferry.ok("pause", "later")
    report = ferry.json("gc", "--older-than", "0s")
    assert report["forgotten"] == [] and [k["id"] for k in report["kept"]] == [first]
    assert then in report["kept"][0]["why"]
    ferry.ok("resume", "later")
    ferry.ok("work", "--drain", "--poll", "0.05")
    assert ferry.task(then)["state"] == "SUCCEEDED"
    report = ferry.json("gc", "--older-than", "0s")
    assert sorted(t["id"] for t in report["forgotten"]) == sorted([first, then])
    ferry.verify_clean()


def test_a_task_a_failed_task_comes_after_is_kept_for_its_retry(ferry: Ferry) -> None:
    """A FAILED (or CANCELLED) task may be retried, and its retry needs its dependency's
    SUCCEEDED when it is claimed. Before, gc forgot the dependency and ``retry`` of the
    task cancelled it at once as DEPENDENCY_FAILED (``{"state": null}``), though the
    dependency had succeeded. Both go in one gc once neither is needed (the failed
    task first)."""
    [first] = run_tasks(ferry, 1)
    then = ferry.ok("submit", "--after", first, "--", "false").text.strip()
    assert ferry("work", "--drain", "--poll", "0.05").code == 1  # (a task failed)
    assert ferry.task(then)["state"] == "FAILED"
    report = ferry.json("gc", "--state", "succeeded", "--older-than", "0s")
    assert report["forgotten"] == [] and [k["id"] for k in report["kept"]] == [first]
    assert then in report["kept"][0]["why"]
    ferry.ok("retry", then)
    assert ferry("work", "--drain", "--poll", "0.05").code == 1
    retried = ferry.task(then)
    assert (retried["state"], retried["attempt"], retried["reason"]) == (
        "FAILED",
        2,
        "EXIT_NONZERO",
    )
    report = ferry.json("gc", "--older-than", "0s")
    assert sorted(t["id"] for t in report["forgotten"]) == sorted([first, then])
    assert report["kept"] == [] and ids_listed(ferry) == []
    ferry.verify_clean()
