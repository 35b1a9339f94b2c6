"""The checked-in golden v1 journal (tests/golden/journal-v1/) must read to exactly these
records forever.  The expected values are written out here, not imported from the
generator: if this test fails, the format changed; fix the code, never the golden files.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from journal import FORMAT_VERSION, Journal, Record, Snapshot, read_records, verify
from journal._codec import encode_record
from journal._snapshot import encode_snapshot

# What JSON the journal writes and reads: in both modes of journal._json.
pytestmark = pytest.mark.usefixtures("json_mode")

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "journal-v1"

EXPECTED = [
    Record(1, 0, 1700000000.0, "JOURNAL_CREATED", {}),
    Record(
        2,
        0,
        1700000000.5,
        "SUBMITTED",
        {"task": "t-0001", "argv": ["make", "test"], "idempotent": False},
    ),
    Record(
        3, 1, 1700000001.25, "LEASE_TAKEN", {"epoch": 1, "holder": {"pid": 4242, "boot": "b00t-1d"}}
    ),
    Record(
        4,
        1,
        1700000002.125,
        "UNICODE",
        {
            "latin": "café naïve",
            "check": "✓",
            "rocket": "🚀",
            "cjk": "中文",
            "rtl": "שלום",
        },
    ),
    Record(
        5,
        1,
        1700000003.0,
        "ESCAPES",
        {
            "nl": "a\nb",
            "tab": "\t",
            "quote": '"',
            "backslash": "\\",
            "nul": "\x00",
            "ctrl": "\x1b[0m",
        },
    ),
    Record(
        6,
        1,
        1700000004.0,
        "NUMBERS",
        {
            "zero": 0,
            "neg": -17,
            "i64max": 9223372036854775807,
            "i64min": -9223372036854775808,
            "u64max": 18446744073709551615,
            "tenth": 0.1,
            "tiny": -1.5e-10,
            "huge": 1e300,
        },
    ),
    Record(
        7,
        1,
        1700000005.0,
        "NESTED",
        {
            "a": [1, [2, [3, {"b": None}]]],
            "flags": [True, False, None],
            "empty": {"list": [], "obj": {}},
        },
    ),
    Record(
        8, 2, 1700000006.75, "LEASE_TAKEN", {"epoch": 2, "holder": {"pid": 4343, "boot": "b00t-1d"}}
    ),
    Record(
        9,
        2,
        1700000007.0,
        "SETTLED",
        {"task": "t-0001", "state": "SUCCEEDED", "exit_code": 0, "signal": None},
    ),
    Record(
        10, 0, 1700000008.0, "TÜPE ✓", {"keys with spaces": 1, "": "empty key", "é": "unicode key"}
    ),
    Record(11, 2, 1700000009.5, "LONG", {"text": "0123456789abcdef" * 64}),
    Record(12, 2, 1700000010.0, "LAST", {"ok": True}),
]
SNAPSHOT = Snapshot(6, b'{"tasks":{"t-0001":"QUEUED"},"binary":"\x00\xff"}\n\x00\xff\xfe')
FILES = {
    "00000000000000000001.jsonl": (558, "first four records"),
    "00000000000000000005.jsonl": (720, "records 5-8"),
    "00000000000000000009.jsonl": (1510, "records 9-12"),
    "00000000000000000009.jsonl.broken": (39, "leftover of an old repair: ignored"),
    "snapshot-00000000000000000006.snap": (128, "snapshot at seq 6"),
}


def test_golden_files_are_all_there() -> None:
    assert FORMAT_VERSION == 1
    assert {p.name: p.stat().st_size for p in GOLDEN.iterdir()} == {
        k: v[0] for k, v in FILES.items()
    }


def test_golden_reads_to_exactly_the_expected_records() -> None:
    assert list(read_records(GOLDEN)) == EXPECTED
    assert list(read_records(GOLDEN, 7)) == EXPECTED[6:]


def test_golden_verifies_clean_with_its_snapshot() -> None:
    report = verify(GOLDEN)
    assert report.status == "clean"
    assert (report.first_seq, report.last_seq, report.snapshot_seq) == (1, 12, 6)
    assert report.damaged_snapshots == ()


def test_golden_opens_and_accepts_appends(tmp_path: Path) -> None:
    copy = tmp_path / "journal"
    shutil.copytree(GOLDEN, copy)  # never write into the checked-in files
    with Journal.open(copy) as j:
        assert (j.first_seq, j.last_seq, j.max_epoch) == (1, 12, 2)
        assert j.latest_snapshot() == SNAPSHOT
        seen: list[Record] = []
        j.subscribe(seen.append, after_seq=SNAPSHOT.seq)
        assert seen == EXPECTED[6:]
        assert j.append("NEXT", {}, epoch=2).seq == 13
    assert [r.seq for r in read_records(copy)] == list(range(1, 14))


def test_the_encoder_still_writes_v1_byte_for_byte() -> None:
    segments = [(1, 5), (5, 9), (9, 13)]
    for first, end in segments:
        expected = b"".join(
            encode_record(r.seq, r.epoch, r.ts, r.type, r.data)
            for r in EXPECTED[first - 1 : end - 1]
        )
        assert (GOLDEN / f"{first:020d}.jsonl").read_bytes() == expected
    assert (GOLDEN / "snapshot-00000000000000000006.snap").read_bytes() == encode_snapshot(
        SNAPSHOT.seq, SNAPSHOT.data, 1
    )


def test_golden_bytes_are_pinned() -> None:
    digest = hashlib.sha256()
    for name in sorted(FILES):
        digest.update(name.encode() + b"\0" + (GOLDEN / name).read_bytes())
    assert digest.hexdigest() == GOLDEN_SHA256


GOLDEN_SHA256 = "7ca606aedfae3e5417a3111fb11a5e7fce59694ed4f0d2c1b2d8971d05a3d43e"
