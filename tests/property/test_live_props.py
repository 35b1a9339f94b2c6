"""A snapshot record that ``check_record`` passes always decodes.

A table reads a snapshot's records of live tasks when it is loaded, and decodes each
the first time it is asked for (``ferry.core.live``). So the check at load must refuse
everything decoding would (the command then says ``journal.snapshot_mismatch`` at
once, as when every record was decoded at load), or a damaged record would fail
later, in the middle of a command that already acted. Records are made by
``task_to_record`` and then damaged at random: a field set to any JSON value, or
removed, in the record or its spec.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ferry.core.fold import task_from_record, task_to_record
from ferry.core.live import check_record
from ferry.core.model import Reason, State, Task
from ferry.core.spec import TaskSpec

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
SPEC_FIELDS = ["argv", "cwd", "name", "key", "env", "pointers", "patch", "after", "group",
               "priority", "not_before", "retries", "pty", "log_max_bytes"]  # fmt: skip
RECORD_FIELDS = ["id", "state", "reason", "runner", "evidence", "number", "attempt",
                 "submit_seq", "queue_seq", "spec", "claim_token", "marker"]  # fmt: skip
# Values of the right shape too, so that damage also lands past the first check.
SHAPED = {
    "pointers": st.lists(st.fixed_dictionaries({"path": st.text(max_size=3)}), max_size=2),
    "patch": st.fixed_dictionaries({"path": st.text(max_size=3)}),
    "state": st.sampled_from([s.value for s in State]),
    "reason": st.sampled_from([r.value for r in Reason]),
}


def _record() -> dict[str, Any]:
    spec = TaskSpec(argv=("true",), cwd="/", key="k", env={"A": "1"}, after=("01hx6zefg1000000",),
                    pointers=(("p", "0" * 64),))  # fmt: skip
    task = Task(id="01hx6zefg2000000", spec=spec, state=State.RUNNING, number=3,
                runner={"pid": 7}, evidence={"why": "x"})  # fmt: skip
    return task_to_record(task)


DAMAGE = st.lists(
    st.tuples(
        st.sampled_from(["record", "spec"]),
        st.sampled_from(sorted({*SPEC_FIELDS, *RECORD_FIELDS})),
        st.one_of(st.just("<removed>"), JSON, *SHAPED.values()),
    ),
    min_size=1,
    max_size=3,
)


@settings(max_examples=1000, deadline=None)
@given(DAMAGE)
def test_a_record_that_passes_the_check_decodes(damage: list[tuple[str, str, Any]]) -> None:
    record = copy.deepcopy(_record())
    for where, name, value in damage:
        target = (
            record
            if where == "record" or not isinstance(record.get("spec"), dict)
            else record["spec"]
        )
        if value == "<removed>":
            target.pop(name, None)
        else:
            target[name] = value
    try:
        check_record(record)
    except (ValueError, TypeError, KeyError):
        return
    task_from_record(record)  # (must not raise)


def test_an_undamaged_record_passes() -> None:
    record = _record()
    assert check_record(record) == ("01hx6zefg2000000", "RUNNING", "k", 3)
    assert task_to_record(task_from_record(record)) == record
