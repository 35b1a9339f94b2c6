"""Fuzz the readers of untrusted bytes: any byte string as a journal segment (through
``journal.verify``, ``Journal.open`` + ``read`` and ferry's ``Store.open``), as
``lease.json`` (read from a real file) and as a patch (the three gates) yields a value
or a coded error (JournalError / FerryError), never another exception and never a hang.

Besides raw bytes, the journal is fed lines that pass the checksum but carry anything
in their fields, and valid records cut or spliced with garbage, so the fuzzing reaches
the parsing behind the checksum. Runtime is kept modest (a few hundred examples each);
pytest-timeout turns a hang into a failure.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import journal
from ferry.core import events as ev
from ferry.core.errors import FerryError, PatchGateError
from ferry.core.model import Reason, State
from ferry.core.patch import PatchInfo, check_gates
from ferry.core.spec import TaskSpec
from ferry.storage.local.lease import Lease, LeaseStore
from ferry.storage.local.store import Store

SEGMENT = "00000000000000000001.jsonl"
FUZZ = settings(
    max_examples=100,
    deadline=None,  # a slow example is not a bug; a hang is caught by the timeout below
    suppress_health_check=[HealthCheck.too_slow],
)
# (and in both modes of journal._json: what JSON the journal reads)
pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("json_mode")]

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
DATA_KEYS = ["attempt", "token", "spec", "state", "reason", "epoch", "pid", "start_time",
             "evidence", "marker", "runner", "exit_code", "signal", "counted"]  # fmt: skip
EVENT_TYPES = ["SUBMITTED", "CLAIMED", "DISPATCHING", "SPAWNED", "SETTLED", "RELEASED",
               "LEASE_ACQUIRED", "CANCEL_REQUESTED", "RETRIED", "STALE", "RESUMED", "X"]  # fmt: skip


def compact(value: Any) -> bytes:
    """JSON as a writer would make it (json, not orjson: integers past 64 bits too)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def checked_line(obj: dict[str, Any]) -> bytes:
    """``obj`` as a journal line whose checksum is right, whatever its fields hold."""
    body = compact(obj)[:-1]
    return body + b',"crc":"%08x"}\n' % zlib.crc32(body)


@st.composite
def record_like(draw: st.DrawFn, seq: int) -> bytes:
    """A checksummed line: a valid header with fuzzed data (half the time, to reach the
    fold behind the journal's checks), or odd values in any field."""
    data = draw(
        st.fixed_dictionaries(
            {"task": st.sampled_from(["t1", "t2", "01m8nx0000000000"]) | json_values},
            optional={key: json_values for key in DATA_KEYS},
        )
        | json_values
    )
    if draw(st.booleans()):
        return checked_line({"v": 1, "seq": seq, "epoch": 0, "ts": 1.5,
                             "type": draw(st.sampled_from(EVENT_TYPES)), "data": data})  # fmt: skip
    obj: dict[str, Any] = {
        "v": draw(st.sampled_from([1, 1, 1, 0, 2, "1", None])),
        "seq": draw(st.sampled_from([seq, seq, seq, seq + 1, 0, -1, "x"])),
        "epoch": draw(st.sampled_from([0, 0, 1, -1, 2**70, None])),
        "ts": draw(st.sampled_from([1.5, 0, -1.0, "now", None])),
        "type": draw(st.sampled_from(EVENT_TYPES) | st.text(max_size=6)),
        "data": data,
    }
    for key in draw(st.lists(st.sampled_from(list(obj)), max_size=2, unique=True)):
        del obj[key]
    return checked_line(obj)


def real_history() -> list[tuple[str, dict[str, Any]]]:
    """One task's true life as ferry journals it: the seed the mutations start from."""
    spec = TaskSpec(argv=("true",), cwd="/")
    runner = {"pid": 1, "start_time": 1, "boot_id": "b", "host": "h"}
    events = [
        ev.Submitted("t1", spec, 1.0),
        ev.Claimed("t1", 1, "tok", runner, "run"),
        ev.Dispatching("t1", 1, "tok", "t1:1:tok"),
        ev.Spawned("t1", 1, "tok", 10, 10, 5.0),
        ev.Settled("t1", 1, "tok", State.FAILED, Reason.EXIT_NONZERO, 1, None),
        ev.Retried("t1", 2),
    ]
    return [event.encode() for event in events]


REAL = real_history()


@st.composite
def mutated_history(draw: st.DrawFn) -> bytes:
    """The real history with one data field of one record replaced by anything."""
    records = [(kind, dict(data)) for kind, data in REAL]
    _, data = records[draw(st.integers(0, len(records) - 1))]
    key = draw(st.sampled_from(sorted(data)))
    data[key] = draw(json_values)
    return b"".join(
        checked_line({"v": 1, "seq": seq, "epoch": 0, "ts": 1.5, "type": kind, "data": data})
        for seq, (kind, data) in enumerate(records, start=1)
    )


@st.composite
def segments(draw: st.DrawFn) -> bytes:
    """Raw bytes, checksummed odd records, a real history with one field mutated, or
    valid-looking records cut and spliced."""
    kind = draw(st.sampled_from(["raw", "records", "mutated", "spliced"]))
    if kind == "raw":
        return draw(st.binary(max_size=600))
    if kind == "mutated":
        return draw(mutated_history())
    lines = [draw(record_like(seq)) for seq in range(1, draw(st.integers(1, 6)) + 1)]
    data = b"".join(lines)
    if kind == "spliced" and data:
        at = draw(st.integers(0, len(data)))
        cut = draw(st.integers(0, 40))
        data = data[:at] + draw(st.binary(max_size=30)) + data[at + cut :]
    return data


@contextlib.contextmanager
def journal_dir(segment: bytes) -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "home" / "journal"
        directory.mkdir(parents=True, mode=0o700)
        (directory / SEGMENT).write_bytes(segment)
        yield directory


def read_everything(directory: Path) -> int:
    """verify, then open and read it all: the number of records read, or -1 if refused
    with a JournalError. Anything else propagates (and fails the test)."""
    try:
        report = journal.verify(directory)
        assert report.status in ("clean", "torn_tail", "corrupt")
    except journal.JournalError:
        pass
    try:
        with journal.Journal.open(directory) as wal:
            return sum(1 for _ in wal.read())
    except journal.JournalError:
        return -1


@FUZZ
@given(segments())
def test_any_segment_bytes_read_or_give_a_journal_error(segment: bytes) -> None:
    with journal_dir(segment) as directory:
        read_everything(directory)


@FUZZ
@given(segments())
def test_any_segment_bytes_open_in_ferry_or_give_a_coded_error(segment: bytes) -> None:
    with journal_dir(segment) as directory:
        try:
            store = Store.open(directory.parent)
        except FerryError as error:
            assert error.code and error.message
            return
        try:
            for task in store.newest(0):
                assert task.id
        finally:
            store.close()


@FUZZ
@given(st.binary(max_size=400) | json_values.map(compact))
def test_any_lease_file_reads_or_gives_a_coded_error(raw: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "lease.json"
        path.write_bytes(raw)
        try:
            lease = LeaseStore(path, ttl_s=30.0).read()
        except FerryError as error:
            assert error.code in ("lease.unreadable", "lease.version"), error.code
            assert error.exit_code == 125
            return
        assert isinstance(lease, Lease)


diff_lines = st.sampled_from(
    [
        "diff --git a/f b/f",
        "--- a/f",
        "+++ b/f",
        "--- /dev/null",
        "+++ /dev/null",
        "@@ -1 +1 @@",
        "@@ -0,0 +1,2 @@",
        "@@ -1,3 +1,0 @@",
        "-old",
        "+new",
        " same",
        "\\ No newline at end of file",
        "rename from f",
        "rename to g",
        "Binary files differ",
        '--- a/"q\\\\x"',
        "@@ garbage @@",
        "",
    ]
) | st.text(max_size=20)


@FUZZ
@given(
    st.binary(max_size=500)
    | st.lists(diff_lines, max_size=14).map(lambda lines: "\n".join(lines).encode()),
    st.lists(
        st.sampled_from(["f", "g", "a/f", "../f", "", "/abs"]) | st.text(max_size=6), max_size=3
    ),
)
def test_any_patch_passes_the_gates_or_gives_a_gate_error(raw: bytes, pointers: list[str]) -> None:
    try:
        info = check_gates(raw, pointers)
    except PatchGateError as error:
        assert error.code.startswith("patch."), error.code
        return
    assert isinstance(info, PatchInfo)
