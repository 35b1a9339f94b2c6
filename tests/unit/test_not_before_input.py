"""``--not-before``'s text (``queueing.parse_not_before``): what it takes, and what it
refuses with ``usage.bad_time``."""

from __future__ import annotations

import pytest

from ferry.app.queueing import parse_not_before
from ferry.core.errors import UsageError

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("+60", 60.0), ("+0", 0.0), ("+1.5", 1.5), ("+.5", 0.5), ("+90.", 90.0), (" +5 ", 5.0)],
)
def test_seconds_from_now(text: str, seconds: float) -> None:
    assert parse_not_before(text, NOW) == NOW + seconds


@pytest.mark.parametrize(
    "text",
    # (float() takes spaces, underscores, exponents, "inf" and digits of other scripts:
    # none is "a number of seconds", and cli.md names none; found by a review.)
    ["+ 5", "+1_000", "+1e3", "+inf", "+nan", "+-5", "+", "+.", "+0x10", "+\u0663", "+5s"],
)
def test_anything_else_after_the_plus_is_refused(text: str) -> None:
    with pytest.raises(UsageError) as refused:
        parse_not_before(text, NOW)
    assert refused.value.code == "usage.bad_time"


def test_one_past_ten_years_is_refused_saying_the_bound() -> None:
    with pytest.raises(UsageError) as refused:
        parse_not_before("+315360001", NOW)
    assert refused.value.code == "usage.bad_time" and "at most 315360000" in refused.value.message
