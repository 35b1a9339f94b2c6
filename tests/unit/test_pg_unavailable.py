"""What ``db.unavailable`` says, by the server's error (pure: no server). A lock wait cut
by ferry's own bound was reported as "cannot be reached", which sent operators to look
at the network (found by a review)."""

from __future__ import annotations

import pytest

from ferry.storage.postgres.connect import unavailable

URL = "postgresql://ferry:secret@db.example/ferry"


class _ServerError(Exception):
    def __init__(self, message: str, sqlstate: str | None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


@pytest.mark.parametrize(
    ("sqlstate", "says"),
    [
        (None, "cannot be reached"),
        ("08006", "cannot be reached"),
        ("25006", "takes no writes now"),
        ("55P03", "a lock it needs is held by another session"),
        ("57014", "cancelled a statement (past ferry's bound, or by an administrator)"),
        ("25P03", "ended this session, idle inside a transaction"),
    ],
)
def test_the_message_says_what_the_server_said(sqlstate: str | None, says: str) -> None:
    error = unavailable(_ServerError("the server's own words", sqlstate), URL)
    assert error.code == "db.unavailable"
    assert error.message == (
        f"the database postgresql://ferry@db.example/ferry {says}: the server's own words"
    )
