"""Task ids: sortable by creation time, printable, fixed length; prefix resolution never
picks "the first match"."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferry.core.errors import AmbiguousIdError, NotFoundError, UsageError
from ferry.core.ids import (
    ALPHABET,
    ID_LENGTH,
    id_time_ms,
    is_task_id,
    new_claim_token,
    new_task_id,
    resolve_prefix,
)

MS = 1_000_000
NOW_NS = 1_715_000_000_123 * MS


def test_id_shape() -> None:
    task_id = new_task_id(NOW_NS, b"\x00\x01\x02\x03")
    assert len(task_id) == ID_LENGTH == 16
    assert task_id == task_id.lower() and task_id.isalnum() and task_id.isprintable()
    assert is_task_id(task_id)
    assert id_time_ms(task_id) == 1_715_000_000_123


def test_ids_of_the_same_millisecond_differ_by_entropy() -> None:
    a, b = new_task_id(NOW_NS, b"\x00" * 4), new_task_id(NOW_NS + 999, b"\xff" * 4)
    assert a[:10] == b[:10] and a != b


@given(
    st.integers(0, 2**50 - 1), st.integers(0, 2**50 - 1),
    st.binary(min_size=4, max_size=8), st.binary(min_size=4, max_size=8),
)  # fmt: skip
def test_ids_sort_by_creation_millisecond(ms_a: int, ms_b: int, e_a: bytes, e_b: bytes) -> None:
    a, b = new_task_id(ms_a * MS, e_a), new_task_id(ms_b * MS, e_b)
    if ms_a < ms_b:
        assert a < b
    assert id_time_ms(a) == ms_a
    assert set(a) <= set(ALPHABET)


def test_id_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        new_task_id(NOW_NS, b"abc")
    with pytest.raises(ValueError):
        new_task_id(-1, b"abcd")
    with pytest.raises(ValueError):
        new_task_id(2**50 * MS, b"abcd")
    with pytest.raises(ValueError):
        id_time_ms("not-an-id")
    assert not is_task_id("0123456789ABCDEF")  # upper case is not an id
    assert not is_task_id("0123456789abcdei")  # i is not Crockford


def test_claim_token() -> None:
    token = new_claim_token(bytes(range(10)))
    assert len(token) == 16 and set(token) <= set(ALPHABET)
    assert new_claim_token(b"\x01" * 10) != new_claim_token(b"\x02" * 10)
    with pytest.raises(ValueError):
        new_claim_token(b"short")


IDS = [f"01hf7yat00{suffix}" for suffix in ("aaaaaa", "aaaaab", "bbbbbb", "cccccc")]


def test_unique_prefix_resolves() -> None:
    assert resolve_prefix("01hf7yat00b", IDS) == "01hf7yat00bbbbbb"
    assert resolve_prefix("01HF7YAT00C", IDS) == "01hf7yat00cccccc"  # case-insensitive
    assert resolve_prefix(IDS[0], IDS) == IDS[0]  # a full id is always unique


def test_no_match_is_not_found_exit_5() -> None:
    with pytest.raises(NotFoundError) as caught:
        resolve_prefix("zz", IDS)
    assert caught.value.code == "task.not_found" and caught.value.exit_code == 5


def test_ambiguous_prefix_names_the_matches() -> None:
    with pytest.raises(AmbiguousIdError) as caught:
        resolve_prefix("01hf7yat00aaaaa", IDS)
    error = caught.value
    assert error.code == "task.ambiguous" and error.exit_code == 5
    assert "01hf7yat00aaaaaa, 01hf7yat00aaaaab" in error.message
    assert "more" not in error.message and "\n" not in error.message
    assert error.details["count"] == 2


def test_ambiguous_prefix_lists_ten_then_a_count() -> None:
    many = [new_task_id(NOW_NS, i.to_bytes(4, "big")) for i in range(0, 25 * 4, 4)]
    with pytest.raises(AmbiguousIdError) as caught:
        resolve_prefix(many[0][:10], reversed(many))
    error = caught.value
    assert error.details["matches"] == sorted(many)[:10]
    assert error.message.endswith("and 15 more")
    assert error.details["count"] == 25


def test_empty_prefix_is_a_usage_error() -> None:
    with pytest.raises(UsageError) as caught:
        resolve_prefix("  ", IDS)
    assert caught.value.code == "usage.bad_id"
