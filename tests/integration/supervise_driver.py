"""Run ferry.proc.supervise.supervise in a process of its own, for tests that need to signal
the supervisor or capture its fd 1/fd 2.

Usage: python supervise_driver.py CONFIG.json
CONFIG: the SuperviseSpec fields (paths as strings) plus "result" (where the Outcome
goes, as JSON), "spawned" (written with "pid pgid" from on_spawned) and optionally
"no_pidfd" (run as if the system had no pidfd_open) and "ignore_sighup" (as nohup).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from ferry.core._value import as_dict
from ferry.proc.supervise import SpawnFailed, SuperviseSpec, supervise


def main() -> int:
    config = json.loads(Path(sys.argv[1]).read_text())
    # A test runner started in the background may hand us SIGINT ignored; the tests
    # want the ordinary terminal situation.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    result = Path(config.pop("result"))
    spawned = Path(config.pop("spawned"))
    if config.pop("ignore_sighup", False):
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
    if config.pop("no_pidfd", False):
        del os.pidfd_open  # the code path of kernels and systems without pidfds
    for key in ("stdout_log", "stderr_log", "heartbeat_path"):
        config[key] = Path(config[key])
    spec = SuperviseSpec(**config)

    def on_spawned(pid: int, pgid: int) -> None:
        tmp = spawned.with_suffix(".tmp")
        tmp.write_text(f"{pid} {pgid}")
        os.replace(tmp, spawned)

    try:
        outcome = supervise(spec, on_spawned=on_spawned)
    except SpawnFailed as e:
        result.write_text(json.dumps({"spawn_failed": e.kind}))
        return 0
    result.write_text(json.dumps(as_dict(outcome)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
