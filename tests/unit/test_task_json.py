"""task_to_json: the contract's task object."""

from __future__ import annotations

import orjson

from ferry.core.model import Reason, State, Task, rfc3339, task_to_json
from ferry.core.spec import TaskSpec

CONTRACT_FIELDS = {
    "id", "name", "key", "argv", "cwd", "idempotent", "state", "reason", "attempt",
    "releases", "max_releases", "exit_code", "signal", "created_at", "started_at",
    "ended_at", "heartbeat_at", "pid", "evidence", "runner",
}  # fmt: skip

TASK = Task(
    id="01hf7yat00c5h66s",
    spec=TaskSpec(argv=("make",), cwd="/src", name="n", env={"SECRET": "hunter2", "A": "1"}),
    state=State.FAILED,
    reason=Reason.SIGNALLED,
    attempt=2,
    releases=1,
    exit_code=None,
    signal=9,
    created_at=1_715_000_000.123456,
    started_at=1_715_000_001.0,
    ended_at=1_715_000_002.9999,
    heartbeat_at=None,
    pid=42,
    evidence={"recovery": {"decision": "FAIL_UNSAFE"}},
)


def test_every_contract_field_is_present_and_json_ready() -> None:
    data = task_to_json(TASK)
    assert set(data) >= CONTRACT_FIELDS
    assert orjson.loads(orjson.dumps(data)) == data
    assert data["state"] == "FAILED" and data["reason"] == "SIGNALLED"
    assert (data["attempt"], data["releases"], data["max_releases"]) == (2, 1, 3)
    assert (data["signal"], data["exit_code"], data["pid"], data["key"]) == (9, None, 42, None)
    assert data["argv"] == ["make"]
    assert data["evidence"] == {"recovery": {"decision": "FAIL_UNSAFE"}}


def test_times_are_rfc3339_utc_with_milliseconds() -> None:
    data = task_to_json(TASK)
    assert data["created_at"] == "2024-05-06T12:53:20.123Z"
    assert data["ended_at"] == "2024-05-06T12:53:22.999Z"  # truncated, never rounded up
    assert data["heartbeat_at"] is None
    assert rfc3339(0) == "1970-01-01T00:00:00.000Z"
    assert rfc3339(None) is None


def test_env_values_hidden_unless_asked() -> None:
    assert task_to_json(TASK)["env"] == ["A", "SECRET"]
    assert "hunter2" not in orjson.dumps(task_to_json(TASK)).decode()
    assert task_to_json(TASK, show_env_values=True)["env"] == {"SECRET": "hunter2", "A": "1"}


def test_a_fresh_task_has_nulls_not_missing_fields() -> None:
    data = task_to_json(Task(id="x", spec=TaskSpec(argv=("true",), cwd="/")))
    assert data["state"] == "QUEUED" and data["reason"] is None
    assert data["started_at"] is None and data["ended_at"] is None and data["pid"] is None


def test_the_runner_is_its_pid_start_time_and_liveness_as_last_proven() -> None:
    """The task's runner (its supervisor): who it was, and ``alive`` as whoever probed it
    last said (null: not proven either way, or never probed)."""
    runner = {"pid": 7, "start_time": 123, "boot_id": "b", "host": "h"}
    task = Task(id="x", spec=TaskSpec(argv=("true",), cwd="/"), runner=runner)
    assert task_to_json(task)["runner"] == {"pid": 7, "start_time": 123, "alive": None}
    probed = Task(id="x", spec=TaskSpec(argv=("true",), cwd="/"), runner={**runner, "alive": True})
    assert task_to_json(probed)["runner"]["alive"] is True
    assert task_to_json(Task(id="x", spec=TaskSpec(argv=("true",), cwd="/")))["runner"] is None


def test_times_in_the_evidence_are_rfc3339_too() -> None:
    """The contract's "RFC 3339 strings everywhere in JSON": the evidence's times (kept as Unix seconds
    in the journal) too (found by a review: started_at, ended_at, signals[].at were
    numbers beside the task's own strings of the same names)."""
    from ferry.core._value import replace
    from ferry.core.model import times_as_rfc3339

    evidence = {
        "started_at": 1_715_000_001.5, "ended_at": 1_715_000_002,
        "signals": [{"signal": 15, "at": 1_715_000_001.75}],
        "recovery": {"decided_at": "2024-05-06T12:53:21.000Z", "heartbeat_age_s": 3.5},
        "escapees_stopped": True, "log_bytes": {"stdout": 3},
    }  # fmt: skip
    shown = task_to_json(replace(TASK, evidence=evidence))["evidence"]
    assert shown == {
        "started_at": rfc3339(1_715_000_001.5), "ended_at": rfc3339(1_715_000_002),
        "signals": [{"signal": 15, "at": rfc3339(1_715_000_001.75)}],
        "recovery": {"decided_at": "2024-05-06T12:53:21.000Z", "heartbeat_age_s": 3.5},
        "escapees_stopped": True, "log_bytes": {"stdout": 3},
    }  # fmt: skip
    assert times_as_rfc3339({"at_least": 3, "flag_at": True}) == {"at_least": 3, "flag_at": True}
