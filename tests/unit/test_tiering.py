"""The size tiers that choose which settled-task archives a compaction merges
(``ferry.storage.local.tiering``): pure, checked against a model of compactions."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ferry.storage.local.tiering import FANOUT, next_merge, tier

pytestmark = pytest.mark.timeout(60)


def test_tiers_are_powers_of_the_fanout() -> None:
    assert [tier(n) for n in (0, 1, 7, 8, 63, 64, 511, 512, 32_767, 32_768)] == [
        0, 0, 0, 1, 1, 2, 2, 3, 4, 5,
    ]  # fmt: skip


def test_the_newest_eight_of_one_tier_are_merged() -> None:
    assert next_merge([50] * (FANOUT - 1)) == 0
    assert next_merge([50] * FANOUT) == FANOUT
    assert next_merge([25_600, 3_200, 400, *[50] * FANOUT]) == FANOUT


def test_smaller_ones_between_them_go_with_them() -> None:
    # Seven of tier 2, then a small one, then the eighth of tier 2 (a compaction with
    # many tasks settled): the small one counts as one of them.
    assert next_merge([100_000, *[400] * 7, 5, 400]) == FANOUT
    assert next_merge([100_000, *[400] * 8, 5]) == FANOUT + 1


def test_smaller_ones_older_than_a_bigger_one_count_as_its_tier() -> None:
    # (Else they are left behind it, and pile up in every gap between bigger ones.)
    assert next_merge([1] * 7 + [8]) == FANOUT
    assert next_merge([400] * 7 + [3_200] + [400]) == FANOUT + 1
    assert next_merge([3_200] * 6 + [400] * 7 + [50] * 7) == 0


def test_archives_of_many_tiers_are_not_merged_for_their_number() -> None:
    assert next_merge([300_000, 40_000, 5_000, 600, 70, 9, 1, 2]) == 0


def test_a_bound_refuses_a_merge_that_would_read_more() -> None:
    counts = [3_200] * FANOUT
    assert next_merge(counts, records_max=25_600) == FANOUT
    assert next_merge(counts, records_max=25_599) == 0


def merged(counts: list[int], records_max: int | None) -> tuple[list[int], int]:
    """``counts`` after the compaction's merges (a merge keeps every record: no task
    in two archives), and the records read."""
    read = 0
    while run := next_merge(counts, None if records_max is None else records_max - read):
        read += sum(counts[-run:])
        counts = [*counts[:-run], sum(counts[-run:])]
    return counts, read


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 3_000), min_size=1, max_size=400))
def test_archives_stay_few_and_each_record_is_written_about_once_per_tier(
    sizes: list[int],
) -> None:
    counts: list[int] = []
    written = 0
    for size in sizes:  # each compaction writes the tasks settled since the last
        counts, read = merged([*counts, size], None)
        written += size + read
        assert len(counts) < FANOUT * (tier(sum(counts)) + 1)
    total = sum(sizes)
    assert written <= total * (tier(total) + 2)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=600), st.integers(1_000, 40_000))
def test_a_bounded_compaction_reads_at_most_its_bound(sizes: list[int], bound: int) -> None:
    counts: list[int] = []
    for size in sizes:
        counts, read = merged([*counts, size], bound)
        assert read <= bound
    assert sum(counts) == sum(sizes)
