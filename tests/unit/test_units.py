"""Durations and sizes as users write them (``gc --older-than``, ``--log-max``): every
bad value is a coded usage error."""

from __future__ import annotations

import pytest

from ferry.core.errors import UsageError
from ferry.core.spec import LOG_MAX_BYTES_MIN, TaskSpec
from ferry.core.units import human_bytes, parse_bytes, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("0s", 0.0), ("90s", 90.0), ("30m", 1800.0), ("12h", 43200.0), ("7d", 604800.0),
     ("2w", 1209600.0), ("1.5h", 5400.0), (" 7d ", 604800.0)],
)  # fmt: skip
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "7", "d", "-1d", "7 d", "7days", "1e3s", "7D", "99999w"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_duration(text)
    assert caught.value.code == "usage.bad_duration"


@pytest.mark.parametrize(
    ("text", "size"),
    [("65536", 65536), ("64K", 65536), ("64k", 65536), ("1M", 1 << 20), ("1MiB", 1 << 20),
     ("1MB", 1 << 20), ("2G", 2 << 30), ("100b", 100)],
)  # fmt: skip
def test_sizes(text: str, size: int) -> None:
    assert parse_bytes(text) == size


@pytest.mark.parametrize("text", ["", "1X", "-5", "1.5M", "K", "1 M", "16383"])
def test_bad_sizes(text: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_bytes(text, minimum=LOG_MAX_BYTES_MIN)
    assert caught.value.code == "usage.bad_size"


def test_human_bytes() -> None:
    assert [human_bytes(n) for n in (0, 1023, 1024, 1536 << 10, 3 << 30)] == [
        "0 B", "1023 B", "1.0 KiB", "1.5 MiB", "3.0 GiB",
    ]  # fmt: skip


def test_a_spec_log_max_is_checked_and_kept_only_when_set() -> None:
    assert "log_max_bytes" not in TaskSpec(argv=("x",), cwd="/").to_json()
    spec = TaskSpec.from_json({"argv": ["x"], "cwd": "/", "log_max_bytes": 1 << 20})
    assert spec.log_max_bytes == 1 << 20 and spec.to_json()["log_max_bytes"] == 1 << 20
    for bad in (100, "1M", True, -1):
        with pytest.raises(UsageError) as caught:
            TaskSpec.from_json({"argv": ["x"], "cwd": "/", "log_max_bytes": bad})
        assert caught.value.code == "usage.bad_size"
