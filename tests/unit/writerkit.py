"""What the journal writer's concurrency tests share: polling with a deadline, and a
fence hook that holds a leader inside its commit so that other threads queue behind it
(group commit made deterministic)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

JOIN_S = float(os.environ.get("TEST_JOIN_S", "10"))  # any wait of these tests, at most


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = JOIN_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.001)


class Gate:
    """A fence hook that holds the next leader inside its commit (under the lock) until
    released, so that other threads queue behind it."""

    def __init__(self) -> None:
        self.armed = False
        self.entered = threading.Event()
        self.release = threading.Event()

    def fence(self, epoch: int) -> None:
        if self.armed:
            self.armed = False
            self.entered.set()
            assert self.release.wait(JOIN_S)
