"""Which settled-task archives a compaction merges: size tiers, as a log-structured
merge tree does (pure; ``Store._compact_locked`` reads and writes the files).

Each compaction writes the tasks settled since the previous one into a new archive
(about 12 with a compaction every 60 records), and every command reads the list of
archives the snapshot names. Merging them all into one, when there were 160, rewrote
all history: for seconds with a long one, so never between ``work``'s turns, so a
``work`` service added archives without limit (about 2,200 an hour at 30 tasks a
second; ``ls --limit 5`` took 181 ms over 12,000 of them against 61 over one), and
the merge landed on whichever ``run`` came next (4.63 s with 72,000 settled tasks in
174 archives: a review).

Tiers instead: an archive of ``n`` records is in tier ``floor(log8(n))``. Once the
newest archives hold FANOUT of one tier (and none above it), they are merged into one
(of the tier above, as a rule). A record is so rewritten about once per tier, ``log8`` of the
history's size in all, not once per merge of everything; at most FANOUT - 1 archives
wait in each tier; and the merges a compaction does cost what its newest tiers hold,
which a bound (``records_max``) can cap: ``work`` merges between its turns only what
is cheap, and leaves a bigger merge to a compaction outside its loop.

Only the newest archives are ever merged together (a suffix of the snapshot's list):
a task in two archives is the newer one's, and the merged archive takes their place.
"""

from __future__ import annotations

from collections.abc import Sequence

FANOUT = 8


def tier(count: int) -> int:
    """0 for up to 7 records, 1 for 8 to 63, 2 for 64 to 511, ..."""
    level = 0
    while count >= FANOUT:
        count //= FANOUT
        level += 1
    return level


def next_merge(counts: Sequence[int], records_max: int | None = None) -> int:
    """How many of the newest archives to merge into one (0: none), given each
    archive's record count, oldest first; none if they hold more than
    ``records_max`` records (None: no bound).

    An archive's place is its tier, or the highest tier of any newer archive if that
    is higher (a small archive older than a big one is merged with it, never left
    behind it). For the lowest place ``t`` held by FANOUT archives: the newest
    archives up to and with the FANOUT-th in place ``t`` (all those after it are in
    lower places). Counting only the archives in place ``t`` matters: counting the
    lower ones too, eight archives of eight tiers would merge everything at every
    eighth compaction."""
    total = in_place = place = 0
    for run, count in enumerate(reversed(counts), 1):  # (newest first)
        higher = max(place, tier(count))
        in_place = in_place + 1 if higher == place else 1
        place = higher
        total += count
        if in_place == FANOUT:
            return run if records_max is None or total <= records_max else 0
    return 0
