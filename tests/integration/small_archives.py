"""Run the ferry command with ``ferry.storage.local.store.ARCHIVES_MAX`` lowered: a test-only knob, so
that a test reaches an archive merge (and the prune one compaction after it) in a few
compactions instead of 160; after a comma, ``LOOP_MERGE_RECORDS_MAX`` (what ``work``
may merge between its turns); after another, ``SNAPSHOT_TAIL_RECORDS`` (compactions due
every few records). Production ferry has no such knob. An empty field keeps its value.

Usage: python small_archives.py ARCHIVES_MAX[,LOOP_MERGE_RECORDS_MAX[,SNAPSHOT_TAIL_RECORDS]]
FERRY-ARGS...
"""

from __future__ import annotations

import sys

from ferry.cli import main
from ferry.storage.local import store

if __name__ == "__main__":
    archives_max, loop_merge, tail = [*sys.argv[1].split(","), "", ""][:3]
    store.ARCHIVES_MAX = int(archives_max)
    if loop_merge:
        store.LOOP_MERGE_RECORDS_MAX = int(loop_merge)
    if tail:
        store.SNAPSHOT_TAIL_RECORDS = int(tail)
    sys.exit(main(sys.argv[2:]))
