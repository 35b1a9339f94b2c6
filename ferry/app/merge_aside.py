"""What work's loop leaves undone of a compaction, done beside it.

Between its turns, ``work`` merges archives only within a bound (a merge holds its
single-threaded loop: no lease renewal, no answer to a supervisor, for as long as it
reads and writes; ``ferry.storage.local.tiering``), and never rewrites history. When
its compaction says more is due (``merges_waiting``: a bigger merge, or history to
rewrite because a ``gc``'s own compaction was skipped), it starts ``ferry journal
compact --no-wait`` for its state directory, a process of its own that merges without
a bound, and carries on. Compactions are serialised by ``compact.lock``: the loop's
next ones are skipped while that one runs, and the snapshot it writes is another
process's, which work builds on (or takes as its table's base: ``Store._adopt``).

* A new process, not a fork of work's: a child of work would share its journal
  handle's open file descriptions, and with them the journal's append lock (an
  ``flock`` belongs to the description, not the process), so the two would not
  exclude each other. The interpreter's start (some 30 ms) is nothing beside a merge
  this size.
* In a session of its own: a Ctrl-C or a signal to work's process group stops work
  (which drains), not a merge half done.
* ``--no-wait``: a compaction that holds the lock (one stopped with Ctrl-Z, say) does
  the work; waiting for it would leave this one blocked, and work's exit waiting.
* At most one a minute (START_EVERY_S): one that found the lock held exits 0 having
  done nothing, and work, still stuck, would start another at every look (a review:
  20 in 20 s). A merge that failed (a damaged archive) is not started again for
  RETRY_AFTER_FAILURE_S, and work says so once, naming ``journal verify``.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable

# work waits this long for a merge beside it when it ends; then lets it finish alone.
FINISH_WAIT_S = 30.0
START_EVERY_S = 60.0
RETRY_AFTER_FAILURE_S = 600.0


class MergeAside:
    """At most one ``ferry journal compact`` at a time, started and reaped by ``work``;
    ``notice``: how work tells the user of one that failed."""

    def __init__(self, home: str, notice: Callable[[str], None]) -> None:
        self.home = home
        self.notice = notice
        self.process: subprocess.Popen[bytes] | None = None
        self.not_before = 0.0  # time.monotonic() before which none is started

    def start(self) -> bool:
        """Start one unless one runs, or started or failed lately: True if started."""
        if self.poll() or time.monotonic() < self.not_before:
            return False
        self.not_before = time.monotonic() + START_EVERY_S
        command = ["journal", "compact", "--no-wait"]
        self.process = subprocess.Popen(  # (stderr: work's, where its warnings belong)
            [sys.executable, "-m", "ferry.cli", "--home", self.home, "-q", *command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        return True

    def poll(self) -> bool:
        """One still runs (one that ended is reaped, and told of if it failed)."""
        if self.process is not None and self.process.poll() is not None:
            self._ended(self.process.returncode)
        return self.process is not None

    def finish(self, timeout_s: float = FINISH_WAIT_S) -> bool:
        """Wait for the one that runs, at most ``timeout_s``: True if none runs now."""
        if self.process is None:
            return True
        try:
            code = self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        self._ended(code)
        return True

    def _ended(self, code: int) -> None:
        self.process = None
        if code != 0:
            self.not_before = time.monotonic() + RETRY_AFTER_FAILURE_S
            self.notice(
                f"warning: the merge of the archives beside work failed (exit {code});"
                f" tried again in {RETRY_AFTER_FAILURE_S / 60:.0f} minutes ('ferry journal"
                " verify' says whether history is damaged)"
            )
