"""Segment files: names, listing, ordering, gap checks (no reading of contents).

A segment is named after the seq of its first record: ``{first_seq:020d}.jsonl``, so
names sort in seq order.  Only names of exactly that shape are segments: ``.broken``
copies, snapshots, temp files and the lock file are ignored by listing.
"""

from __future__ import annotations

from collections import namedtuple

from journal import _fsutil
from journal._errors import CorruptionError, JournalError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NamedTuple

SEGMENT_SUFFIX = ".jsonl"
BROKEN_SUFFIX = ".broken"
LOCK_NAME = ".lock"  # the cross-process append lock (flock); its content is irrelevant
# In a journal a salvage built, until that salvage's swap is durable (``_salvage``).
SALVAGE_MARKER = ".salvage-build"


if TYPE_CHECKING:

    class Segment(NamedTuple):
        first_seq: int
        path: str

else:
    Segment = namedtuple("Segment", ("first_seq", "path"))


def segment_name(first_seq: int) -> str:
    if first_seq < 1:
        raise ValueError(f"first_seq must be >= 1, got {first_seq}")
    return f"{first_seq:020d}{SEGMENT_SUFFIX}"


def parse_segment_name(name: str) -> int | None:
    """The first seq named by a segment file name, or None if it is not a segment."""
    first_seq = seq_in_name(name, "", SEGMENT_SUFFIX)
    return first_seq if first_seq is not None and first_seq >= 1 else None


def seq_in_name(name: str, prefix: str, suffix: str) -> int | None:
    """The seq in ``<prefix><20 ASCII digits><suffix>``, if ``name`` is that. (No
    regular expression: compiling one at import cost every command about 0.1 ms.)"""
    digits = name[len(prefix) : -len(suffix)]
    if (
        len(name) != len(prefix) + 20 + len(suffix)
        or not (name.startswith(prefix) and name.endswith(suffix))
        or not (digits.isascii() and digits.isdigit())
    ):
        return None
    return int(digits)


def segments_in(names: list[str], directory: str) -> list[Segment]:
    """The segments among ``names``, in seq order."""
    found = []
    for name in names:
        first_seq = parse_segment_name(name)
        if first_seq is not None:
            found.append(Segment(first_seq, _fsutil.join(directory, name)))
    found.sort()
    return found


def list_segments(directory: str) -> list[Segment]:
    return segments_in(_fsutil.listdir(directory), directory)


def no_journal(directory: str, error: OSError) -> JournalError:
    """The error for ``directory``, which ``error`` says is not there, or not a
    directory."""
    if isinstance(error, FileNotFoundError):
        return JournalError(f"no journal directory at {directory}")
    return JournalError(f"not a journal directory: {directory} ({error.strerror})")


def check_next(previous: Segment, next_seq: int, following: Segment) -> None:
    """``previous`` ended with ``next_seq - 1``: ``following`` must start at ``next_seq``.

    A later start is a gap (a missing segment or lost records); an earlier one overlaps.
    """
    if following.first_seq != next_seq:
        kind = "gap" if following.first_seq > next_seq else "overlap"
        raise CorruptionError(
            f"seq {kind} between segments: {_fsutil.name(previous.path)} ends at seq"
            f" {next_seq - 1}, next segment {_fsutil.name(following.path)} starts at"
            f" {following.first_seq}",
            segment=following.path,
            offset=0,
            seq=next_seq,
        )


def broken_copy_path(segment: str, names: list[str]) -> str:
    """Where to keep the bytes cut from ``segment``: ``<segment>.broken``, or
    ``<segment>.broken.N`` with the first free N if earlier repairs left copies."""
    directory, name = _fsutil.split(segment)
    base = name + BROKEN_SUFFIX
    taken = set(names)
    if base not in taken:
        return _fsutil.join(directory, base)
    number = 1
    while f"{base}.{number}" in taken:
        number += 1
    return _fsutil.join(directory, f"{base}.{number}")
