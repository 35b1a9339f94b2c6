"""Run the ferry command with ``ferry.storage.local.store.ARCHIVES_MAX`` lowered: a test-only knob, so
that a test reaches an archive merge (and the prune one compaction after it) in a few
compactions instead of 160. Production ferry has no such knob.

Usage: python small_archives.py ARCHIVES_MAX FERRY-ARGS...
"""

from __future__ import annotations

import sys

from ferry.cli import main
from ferry.storage.local import store

if __name__ == "__main__":
    store.ARCHIVES_MAX = int(sys.argv[1])
    sys.exit(main(sys.argv[2:]))
