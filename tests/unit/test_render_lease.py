"""``ferry lease``'s human output: times as RFC 3339, like every task time."""

from __future__ import annotations

from ferry.cli.render import lease_text


def test_lease_times_are_shown_as_rfc3339() -> None:
    info = {
        "epoch": 4,
        "holder": {"pid": 42, "host": "vm"},
        "holder_alive": True,
        "acquired_at": 1796068397.2641587,
        "expires_at": 1796068427.5,
    }
    assert lease_text(info) == (
        "leader pid 42 on vm (alive), epoch 4\n"
        "since   2026-11-30T19:53:17.264Z\n"
        "expires 2026-11-30T19:53:47.500Z"
    )
    assert lease_text({"epoch": 3, "holder": None}) == "no leader (epoch 3)"
