"""Several tasks per command (contract.md, "Daily use": "Many at once"): ``show``,
``logs``, ``cancel``, ``retry`` and ``kill`` take several ids, ``cancel`` and ``retry``
also ``--state``; each task on its own, one failure reported without stopping the
others."""

from __future__ import annotations

import pytest
from clikit import Ferry

pytestmark = pytest.mark.timeout(120)


def three(ferry: Ferry) -> list[str]:
    """#1 succeeds, #2 fails, #3 writes a line to each stream; all settled."""
    ids = [
        ferry.ok("submit", "--", *argv).out.decode().strip()
        for argv in (["true"], ["false"], ["sh", "-c", "echo out; echo err >&2"])
    ]
    ferry.ok("-q", "work", "--drain", codes=(1,))
    return ids


def test_show_takes_several_ids_numbers_and_last(ferry: Ferry) -> None:
    ids = three(ferry)
    shown = ferry.json("show", "1", ids[1], "last")
    assert [task["id"] for task in shown] == ids
    assert ferry.json("show", "2")["id"] == ids[1]  # one id: one object, as before
    text = ferry.ok("show", "1", "2").out.decode()
    assert text.count("number:") == 2 and "\n\nid:" in text


def test_logs_of_several_tasks_one_after_the_other_with_a_header_each(ferry: Ferry) -> None:
    ids = three(ferry)
    result = ferry.ok("logs", "3", "1")
    assert result.out.decode() == f"==> #3 {ids[2]} <==\nout\n==> #1 {ids[0]} <==\n"
    assert result.err == "err\n"
    lines = [line for line in ferry.ok("--json", "logs", "3", "1").out.splitlines() if line]
    assert [line.count(ids[2].encode()) for line in lines] == [1, 1]  # each names its task
    # -f: each to its end; 1 if one did not succeed; an unknown id reported, the rest shown
    assert ferry("logs", "-f", "1", "3").code == 0
    assert ferry("logs", "-f", "1", "2").code == 1
    missing = ferry("logs", "1", "99", "3")
    assert missing.code == 5 and "task.not_found" in missing.err and b"out\n" in missing.out


def test_cancel_several_goes_on_past_one_that_cannot_be_cancelled(ferry: Ferry) -> None:
    done = ferry.ok("run", "--", "true")
    assert done.code == 0
    queued = [ferry.ok("submit", "--", "true").out.decode().strip() for _ in range(2)]
    result = ferry("cancel", queued[0], "1", queued[1])
    assert result.code == 1 and "task.not_cancellable" in result.err
    assert result.out.decode().split() == [queued[0], "CANCELLED", queued[1], "CANCELLED"]
    assert {ferry.task(i)["state"] for i in queued} == {"CANCELLED"}
    assert ferry.task("1")["state"] == "SUCCEEDED"
    failed = ferry.json("cancel", "1", "99", codes=(1, 5))
    assert [sorted(item) for item in failed] == [["error", "id"], ["error", "id"]]


def test_cancel_and_retry_by_state(ferry: Ferry) -> None:
    ids = three(ferry)
    queued = [ferry.ok("submit", "--", "true").out.decode().strip() for _ in range(3)]
    cancelled = ferry.json("cancel", "--state", "queued")
    assert [task["id"] for task in cancelled] == queued  # in submission order
    assert ferry.json("cancel", "--state", "QUEUED") == []  # nothing left: still an array
    retried = ferry.json("retry", "--state", "FAILED")
    assert [(task["id"], task["attempt"]) for task in retried] == [(ids[1], 2)]
    assert {ferry.task(i)["state"] for i in queued} == {"CANCELLED"}


def test_ids_and_state_are_one_or_the_other(ferry: Ferry) -> None:
    ferry.ok("submit", "--", "true")
    ferry.refused(2, "usage.invalid", "cancel", "1", "--state", "QUEUED")
    ferry.refused(2, "usage.missing_id", "retry")
    ferry.refused(2, "usage.", "cancel", "--state", "WAITING")
    assert ferry.task("1")["state"] == "QUEUED"


def test_kill_several_reports_each(ferry: Ferry) -> None:
    ids = three(ferry)
    result = ferry("kill", "1", "99", "2")
    assert result.code == 5 and result.err.count("error[task.not_found]") == 1
    said = result.out.decode().splitlines()
    assert [line.split(":")[0] for line in said] == [ids[0], ids[1]]  # (nothing alive)
