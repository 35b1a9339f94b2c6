"""A merge of settled-task archives too big for ``work``'s loop, done beside it.

Between its turns, ``work`` merges archives only within a bound (a merge holds its
single-threaded loop: no lease renewal, no answer to a supervisor, for as long as it
reads and writes; ``ferry.storage.local.tiering``). When its compaction says a bigger
merge waits, it starts ``ferry journal compact`` for its state directory, a process of
its own that merges without a bound, and carries on. Compactions are serialised by
``compact.lock``, so the loop's next ones are skipped while that one runs; the
snapshot it writes is just another process's, which work's next compaction builds on.

Why a new process, not a fork of work's: a child of work would share its journal
handle's open file descriptions, and with them the journal's append lock (an ``flock``
belongs to the description, not the process), so the two would not exclude each other.
The interpreter's start (some 30 ms) is nothing beside a merge this size.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# work waits this long for a merge beside it when it ends; then lets it finish alone.
FINISH_WAIT_S = 30.0


class MergeAside:
    """At most one ``ferry journal compact`` at a time, started and reaped by ``work``."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.process: subprocess.Popen[bytes] | None = None
        self.started = 0  # (how many, for tests and -v)

    def start(self) -> bool:
        """Start one unless one runs: True if started."""
        if self.poll():
            return False
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ferry.cli",
                "--home",
                str(self.home),
                "-q",
                "journal",
                "compact",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )  # fmt: skip  (stderr: work's, where its warnings belong)
        self.started += 1
        return True

    def poll(self) -> bool:
        """One still runs (one that ended is reaped)."""
        if self.process is not None and self.process.poll() is not None:
            self.process = None
        return self.process is not None

    def finish(self, timeout_s: float = FINISH_WAIT_S) -> bool:
        """Wait for the one that runs, at most ``timeout_s``: True if none runs now."""
        if self.process is None:
            return True
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        self.process = None
        return True
