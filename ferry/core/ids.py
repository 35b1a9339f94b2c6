"""Task ids and claim tokens (pure: the caller passes the time and the entropy).

A task id is 16 lowercase characters of Crockford base32: 10 for the creation time in
milliseconds since the Unix epoch (50 bits: good until the year 37648), then 6 for 30
bits of entropy. Ids therefore sort by creation time as plain strings, are printable,
safe in file names and shells, and have a fixed length. Two ids created in the same
millisecond sort in entropy order, not creation order: the queue orders by journal
sequence number, never by id.
"""

from __future__ import annotations

from collections.abc import Iterable

from ferry.core.errors import AmbiguousIdError, NotFoundError, UsageError

ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford: no i, l, o, u
TIME_CHARS = 10
ENTROPY_CHARS = 6
ID_LENGTH = TIME_CHARS + ENTROPY_CHARS
ENTROPY_BYTES_MIN = 4  # 30 bits are used
AMBIGUOUS_LISTED_MAX = 10
_TIME_MS_MAX = 32**TIME_CHARS - 1


def _encode(number: int, width: int) -> str:
    chars = []
    for _ in range(width):
        number, digit = divmod(number, 32)
        chars.append(ALPHABET[digit])
    return "".join(reversed(chars))


def new_task_id(now_ns: int, entropy: bytes) -> str:
    """A new id for a task created at ``now_ns`` (Unix nanoseconds).

    ``entropy`` must hold at least 4 random bytes (``os.urandom(4)`` in the caller).
    """
    if now_ns < 0 or now_ns // 1_000_000 > _TIME_MS_MAX:
        raise ValueError(f"task id time out of range: {now_ns} ns")
    if len(entropy) < ENTROPY_BYTES_MIN:
        raise ValueError(f"task id needs at least {ENTROPY_BYTES_MIN} bytes of entropy")
    random_bits = int.from_bytes(entropy[:ENTROPY_BYTES_MIN], "big") >> 2  # keep 30 bits
    return _encode(now_ns // 1_000_000, TIME_CHARS) + _encode(random_bits, ENTROPY_CHARS)


def new_claim_token(entropy: bytes) -> str:
    """A claim token: 16 lowercase base32 characters from at least 10 bytes of entropy."""
    if len(entropy) < 10:
        raise ValueError("a claim token needs at least 10 bytes of entropy")
    return _encode(int.from_bytes(entropy[:10], "big"), 16)


def id_time_ms(task_id: str) -> int:
    """The creation time (Unix milliseconds) encoded in a task id."""
    if not is_task_id(task_id):
        raise ValueError(f"not a task id: {task_id!r}")
    number = 0
    for char in task_id[:TIME_CHARS]:
        number = number * 32 + ALPHABET.index(char)
    return number


def is_task_id(text: str) -> bool:
    return len(text) == ID_LENGTH and all(char in ALPHABET for char in text)


LAST = "last"  # names the task submitted most recently


def task_number(text: str) -> int | None:
    """The task number ``text`` names: a decimal without a leading zero (ids start with
    a zero for centuries yet, so a number is never an id prefix). None: not a number
    (nor one of more than 19 digits, which names no task: ``int`` refuses thousands)."""
    if text.isascii() and text.isdigit() and text[0] != "0" and len(text) <= 19:
        return int(text)
    return None


def shown(text: str, limit: int = 40) -> str:
    """A user's text as an error message may echo it: bytes that are not UTF-8 as
    ``\\xff`` (not Python's surrogates), and at most ``limit`` characters of it."""
    raw = text.encode("utf-8", "surrogateescape")
    decoded = raw.decode("utf-8", "backslashreplace")
    body = decoded[:limit] + ("..." if len(decoded) > limit else "")
    return "'" + body.replace("'", "\\'") + "'"


def resolve_prefix(prefix: str, ids: Iterable[str], *, count: int = 0) -> str:
    """The one id among ``ids`` that starts with ``prefix`` (case-insensitive).

    Never "the first match": no match raises NotFoundError, several raise
    AmbiguousIdError naming up to 10 of them (sorted) and how many more there are
    (``count``: how many match in all, when ``ids`` holds only the first of them).
    """
    wanted = prefix.strip().lower()
    if not wanted:
        raise UsageError("empty task id", code="usage.bad_id", details={"prefix": prefix})
    matches = sorted({task_id for task_id in ids if task_id.startswith(wanted)})
    if not matches:
        raise NotFoundError(f"no task matches {shown(prefix)}", details={"prefix": prefix})
    if len(matches) == 1:
        return matches[0]
    listed = matches[:AMBIGUOUS_LISTED_MAX]
    total = max(count, len(matches))
    text = ", ".join(listed)
    if total > len(listed):
        text += f" and {total - len(listed)} more"
    raise AmbiguousIdError(
        f"task id prefix {shown(prefix)} is ambiguous: {text}",
        details={"prefix": prefix, "matches": listed, "count": total},
    )
