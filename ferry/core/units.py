"""Durations and byte sizes as users write them (pure): ``gc --older-than 7d``,
``--log-max 1M``. A bad value is a coded usage error (exit 2), never a traceback."""

from __future__ import annotations

import re

from ferry.core.errors import UsageError
from ferry.core.ids import shown

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_SECONDS_PER = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
# (At most 19 digits: int() refuses thousands of them, and no size has so many.)
_SIZE = re.compile(r"([0-9]{1,19})(?:([kmgt])(?:i?b)?|b)?", re.IGNORECASE)
_BYTES_PER = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
# Ten years: beyond any sane age, far below float trouble.
DURATION_S_MAX = 10 * 365 * 86400.0
BYTES_MAX = 1 << 50


def parse_duration(text: str, *, option: str = "--older-than") -> float:
    """``90s``, ``30m``, ``12h``, ``7d``, ``2w`` (a number, then its unit; ``0s`` is
    zero) as seconds. Anything else: ``usage.bad_duration``."""
    match = _DURATION.fullmatch(text.strip())
    seconds = None if match is None else float(match.group(1)) * _SECONDS_PER[match.group(2)]
    if seconds is None or seconds > DURATION_S_MAX:
        raise UsageError(
            f"{option} {shown(text)}: expected a number with a unit, s, m, h, d or w"
            " (90s, 30m, 12h, 7d), at most ten years",
            code="usage.bad_duration",
            details={"value": text},
        )
    return seconds


def parse_bytes(text: str, *, option: str = "--log-max", minimum: int = 0) -> int:
    """``65536``, ``64K``, ``1M``, ``2G`` (binary units: K is 1024; ``KiB``, ``MB`` are
    read alike) as a number of bytes, at least ``minimum``: else ``usage.bad_size``."""
    match = _SIZE.fullmatch(text.strip())
    size = None
    if match is not None:
        size = int(match.group(1)) * _BYTES_PER.get((match.group(2) or "").lower(), 1)
    if size is None or size < minimum or size > BYTES_MAX:
        raise UsageError(
            f"{option} {shown(text)}: expected a number of bytes, optionally with a unit K, M,"
            f" G (1024-based: 64K, 1M), at least {minimum}",
            code="usage.bad_size",
            details={"value": text},
        )
    return size


def human_bytes(size: int) -> str:
    """``1.5 MiB``, ``312 B``: for a person's eyes (output, never parsed back)."""
    value, unit = float(size), "B"
    for bigger in ("KiB", "MiB", "GiB", "TiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
