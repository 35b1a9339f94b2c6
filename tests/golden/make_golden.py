"""Generate the golden v1 journal in tests/golden/journal-v1/ (run once; the files are
checked in and must stay readable forever: tests/unit/test_journal_golden.py).

    python tests/golden/make_golden.py [--force]

The bytes are deterministic (fixed timestamps), built from the v1 codec and snapshot
encoder.  Never regenerate to make a failing golden test pass: a failure means the
format changed.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path
from typing import Any

from journal._codec import encode_record
from journal._segment import segment_name
from journal._snapshot import encode_snapshot, snapshot_name

HERE = Path(__file__).resolve().parent / "journal-v1"

# (epoch, ts, type, data); seqs are 1..N in this order.
RECORDS: list[tuple[int, float, str, dict[str, Any]]] = [
    (0, 1700000000.0, "JOURNAL_CREATED", {}),
    (
        0,
        1700000000.5,
        "SUBMITTED",
        {"task": "t-0001", "argv": ["make", "test"], "idempotent": False},
    ),
    (1, 1700000001.25, "LEASE_TAKEN", {"epoch": 1, "holder": {"pid": 4242, "boot": "b00t-1d"}}),
    (
        1,
        1700000002.125,
        "UNICODE",
        {
            "latin": "caf\u00e9 na\u00efve",
            "check": "\u2713",
            "rocket": "\U0001f680",
            "cjk": "\u4e2d\u6587",
            "rtl": "\u05e9\u05dc\u05d5\u05dd",
        },
    ),
    (
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
    (
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
    (
        1,
        1700000005.0,
        "NESTED",
        {
            "a": [1, [2, [3, {"b": None}]]],
            "flags": [True, False, None],
            "empty": {"list": [], "obj": {}},
        },
    ),
    (2, 1700000006.75, "LEASE_TAKEN", {"epoch": 2, "holder": {"pid": 4343, "boot": "b00t-1d"}}),
    (
        2,
        1700000007.0,
        "SETTLED",
        {"task": "t-0001", "state": "SUCCEEDED", "exit_code": 0, "signal": None},
    ),
    (
        0,
        1700000008.0,
        "T\u00dcPE \u2713",
        {"keys with spaces": 1, "": "empty key", "\u00e9": "unicode key"},
    ),
    (2, 1700000009.5, "LONG", {"text": "0123456789abcdef" * 64}),
    (2, 1700000010.0, "LAST", {"ok": True}),
]
SEGMENT_FIRST_SEQS = [1, 5, 9]  # three segments: 1-4, 5-8, 9-12
SNAPSHOT_SEQ = 6
SNAPSHOT_DATA = b'{"tasks":{"t-0001":"QUEUED"},"binary":"\x00\xff"}\n\x00\xff\xfe'
SNAPSHOT_EPOCH_MAX = 1
BROKEN_LEFTOVER = b'{"v":1,"seq":13,"epoch":2,"ts":17000\x00\x00\x00'


def main(force: bool) -> None:
    if HERE.exists() and any(HERE.iterdir()) and not force:
        sys.exit(
            f"{HERE} exists: the golden journal is never regenerated (use --force deliberately)"
        )
    HERE.mkdir(parents=True, exist_ok=True)
    bounds = [*SEGMENT_FIRST_SEQS, len(RECORDS) + 1]
    for first, end in itertools.pairwise(bounds):
        lines = [
            encode_record(seq, *RECORDS[seq - 1][:3], RECORDS[seq - 1][3])
            for seq in range(first, end)
        ]
        (HERE / segment_name(first)).write_bytes(b"".join(lines))
    (HERE / snapshot_name(SNAPSHOT_SEQ)).write_bytes(
        encode_snapshot(SNAPSHOT_SEQ, SNAPSHOT_DATA, SNAPSHOT_EPOCH_MAX)
    )
    # A leftover from an old repair: readers must ignore it.
    (HERE / (segment_name(SEGMENT_FIRST_SEQS[-1]) + ".broken")).write_bytes(BROKEN_LEFTOVER)


if __name__ == "__main__":
    main("--force" in sys.argv[1:])
