"""What ``work`` and ``wait`` print, as pure functions: the settled-task line, the
summary, the progress line and its ETA (issue 17)."""

from __future__ import annotations

from typing import Any

from ferry.app.tally import Progress, Tally, WaitReport, WorkReport
from ferry.cli import render
from ferry.core.model import Reason, State, Task, replace
from ferry.core.spec import TaskSpec

SPEC = TaskSpec(argv=("/bin/sh", "-c", "exit 3"), cwd="/")


def task(**fields: Any) -> Task:
    return replace(Task(id="01m8t1qmfxw2b61d", spec=SPEC), **fields)


def test_a_settled_line_says_id_state_exit_duration_and_command() -> None:
    line = render.settled_line(
        task(
            state=State.FAILED,
            reason=Reason.EXIT_NONZERO,
            exit_code=3,
            started_at=100.0,
            ended_at=112.5,
        )
    )
    assert line.split() == ["#-", "01m8t1qmfxw2b61d", "FAILED", "exit", "3", "12.5s",
                            "/bin/sh", "-c", "exit", "3"]  # fmt: skip


def test_a_settled_line_names_the_reason_the_exit_does_not_tell() -> None:
    never_ran = render.settled_line(task(state=State.FAILED, reason=Reason.SPAWN_FAILED))
    assert never_ran.split()[2:5] == ["FAILED", "SPAWN_FAILED", "-"]
    halted = render.settled_line(
        task(
            state=State.CANCELLED,
            reason=Reason.CANCELLED_BY_USER,
            signal=15,
            spec=replace(SPEC, name="nightly"),
        )
    )
    assert "signal 15, CANCELLED_BY_USER" in halted and halted.endswith("  nightly")


def test_durations_read_at_a_glance() -> None:
    assert [render.duration(s) for s in (0.004, 9.994, 42.04, 65, 3600 * 2 + 61)] == [
        "0.00s",
        "9.99s",
        "42.0s",
        "1m05s",
        "2h01m",
    ]


def test_the_summary_names_only_what_happened_beyond_success() -> None:
    assert render.summary(WorkReport(4, 0, 0, 1.26)) == "4 succeeded in 1.3 s"
    assert render.summary(WorkReport(1, 3, 0, 0.2)) == "1 succeeded, 3 failed in 0.2 s"
    assert render.summary(WorkReport(0, 1, 2, 9.0)) == "0 succeeded, 1 failed, 2 cancelled in 9.0 s"


def test_progress_and_its_eta_at_the_pace_so_far() -> None:
    early = Progress(0, 0, 0, running=2, queued=198, elapsed_s=3.0)
    assert (early.done, early.total, early.eta_s) == (0, 200, None)
    assert render.progress_text(early) == "0/200 done, 2 running, 0 failed, ETA ?"
    later = Progress(45, 4, 1, running=2, queued=148, elapsed_s=10.0)  # 5 a second
    assert (later.total, later.eta_s) == (200, 30.0)
    assert render.progress_text(later) == "50/200 done, 2 running, 4 failed, ETA 30.0s"


def test_only_success_is_success() -> None:
    tally = Tally()
    for state in (State.SUCCEEDED, State.FAILED, State.CANCELLED):
        tally.add(task(state=state))
    assert (tally.succeeded, tally.failed, tally.cancelled, tally.all_succeeded) == (1, 1, 1, False)
    assert WorkReport(3, 0, 0, 1.0).all_succeeded
    assert not WorkReport(3, 0, 1, 1.0).all_succeeded
    waited = WaitReport([task(state=State.SUCCEEDED), task(state=State.CANCELLED)], [], 1.0)
    assert (waited.succeeded, waited.cancelled, waited.all_succeeded) == (1, 1, False)
    assert WaitReport([], [], 0.0).all_succeeded and not WaitReport([], [], 0.0).timed_out
